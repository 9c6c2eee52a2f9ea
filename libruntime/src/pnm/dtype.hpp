// SPDX-License-Identifier: MIT
// Element conversions of the near-memory engine (internal): bf16 and fp16
// to float and back, bit-exact, without depending on compiler half types.
#pragma once

#include <cstdint>
#include <cstring>

#include "cxlkv/pnm.hpp"

namespace cxlkv::pnm::detail {

inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even (NaN kept quiet).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even.
inline uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;          // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;         // overflow to inf
  if (a < 0x38800000u) {                              // subnormal or zero
    if (a < 0x33000000u) return sign;
    const uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;                   // 14 .. 24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return sign | uint16_t(r);
  }
  uint32_t r = a - 0x38000000u;                       // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1);
  return sign | uint16_t(r >> 13);
}

inline float load_elem(Dtype t, const void* base, size_t i) {
  switch (t) {
    case Dtype::f32: {
      float f;
      std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
      return f;
    }
    case Dtype::bf16: {
      uint16_t b;
      std::memcpy(&b, static_cast<const char*>(base) + 2 * i, 2);
      return bf16_to_float(b);
    }
    case Dtype::f16: {
      uint16_t b;
      std::memcpy(&b, static_cast<const char*>(base) + 2 * i, 2);
      return f16_to_float(b);
    }
  }
  return 0.f;
}

inline void store_elem(Dtype t, void* base, size_t i, float v) {
  switch (t) {
    case Dtype::f32: std::memcpy(static_cast<char*>(base) + 4 * i, &v, 4); break;
    case Dtype::bf16: {
      uint16_t b = float_to_bf16(v);
      std::memcpy(static_cast<char*>(base) + 2 * i, &b, 2);
      break;
    }
    case Dtype::f16: {
      uint16_t b = float_to_f16(v);
      std::memcpy(static_cast<char*>(base) + 2 * i, &b, 2);
      break;
    }
  }
}

// Widen the digest d ([2][dim]: min then max) by rows [ntok][dim] (same
// dtype); with fresh, d is first set from the rows.  Exact: min and max of
// values are values, so the stored elements are copied bit for bit.
void digest_rows(Dtype t, const void* rows, uint32_t ntok, uint32_t dim, void* d, bool fresh);

// The q8 row (struct cxlkv_pnm_q8_row + int8 [2][dim]) of a min/max row mm
// ([2][dim] of t) covering `tokens` tokens: one scale with 127 x scale >=
// max |element|, min rounded down and max rounded up to multiples of it,
// so scale x int8 bounds every element the min/max row bounds
// (docs/near-memory.md#digest-kinds).  false when an element is not finite.
bool encode_q8_row(Dtype t, const void* mm, uint32_t dim, uint32_t tokens, void* out);

}  // namespace cxlkv::pnm::detail
