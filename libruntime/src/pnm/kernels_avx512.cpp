// SPDX-License-Identifier: MIT
// AVX-512 kernels of the near-memory engine (16 floats / 32 16-bit keys per
// register): kernels_template.hpp over these vectors.  Compiled with target
// attributes; only called when CPUID says AVX-512F/BW/VL are usable
// (isa_supported).
// GCC 12 reports the _mm512_undefined_*() inside its own AVX-512 headers as
// "may be used uninitialized" (and, inlined into the score kernel, "is used
// uninitialized"): a known false positive of those headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

#define CXLKV_PNM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#include "pnm/kernels_hsums256.hpp"
#include "pnm/kernels_template.hpp"

namespace cxlkv::pnm::detail {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr uint32_t kF = 16, kI = 32, kHeadChunk = 8, kAcc = 16;

  CXLKV_PNM_TARGET static F zero() { return _mm512_setzero_ps(); }
  CXLKV_PNM_TARGET static F set1(float x) { return _mm512_set1_ps(x); }
  CXLKV_PNM_TARGET static F load(const float* p) { return _mm512_loadu_ps(p); }
  CXLKV_PNM_TARGET static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  CXLKV_PNM_TARGET static F load_elems(Dtype t, const void* base, uint32_t i) {
    switch (t) {
      case Dtype::f32: return _mm512_loadu_ps(static_cast<const float*>(base) + i);
      case Dtype::bf16: {
        __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
      }
      case Dtype::f16: {
        __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
        return _mm512_cvtph_ps(x);
      }
    }
    return _mm512_setzero_ps();
  }
  CXLKV_PNM_TARGET static F add(F a, F b) { return _mm512_add_ps(a, b); }
  CXLKV_PNM_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  CXLKV_PNM_TARGET static F max(F a, F b) { return _mm512_max_ps(a, b); }
  CXLKV_PNM_TARGET static F min(F a, F b) { return _mm512_min_ps(a, b); }
  CXLKV_PNM_TARGET static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  CXLKV_PNM_TARGET static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  CXLKV_PNM_TARGET static F round(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  CXLKV_PNM_TARGET static F pow2i(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  CXLKV_PNM_TARGET static F load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // Each 512-bit sum folded to 256 bits, then the AVX2 four-at-a-time
  // horizontal sums.
  CXLKV_PNM_TARGET static void hsums(const F* a, uint32_t n, float* out) {
    __m256 y[kHeadChunk];
    for (uint32_t h = 0; h < n; h++)
      y[h] = _mm256_add_ps(_mm512_castps512_ps256(a[h]),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h]), 1)));
    hsums256(y, n, out);
  }
  // Sixteen sums at once: each level adds the halves of pairs of vectors
  // (256-bit, then 128-bit blocks, then pairs of lanes), 45 instructions
  // for 16 sums.  The tree leaves the sum of its input 4j + b in lane
  // 4b + j, so a[4b + j] goes in at 4j + b.
  CXLKV_PNM_TARGET static F reduce(const F* a) {
    F c[8], d[4], e[2];
#pragma GCC unroll 8
    for (uint32_t i = 0; i < 8; i++) {
      const F x = a[4 * ((2 * i) % 4) + (2 * i) / 4], y = a[4 * ((2 * i + 1) % 4) + (2 * i + 1) / 4];
      c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
    }
#pragma GCC unroll 8
    for (uint32_t i = 0; i < 4; i++)
      d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xdd));
#pragma GCC unroll 8
    for (uint32_t i = 0; i < 2; i++)
      e[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x44), _mm512_shuffle_ps(e[0], e[1], 0xee));
  }
  CXLKV_PNM_TARGET static F tile(const float* x, uint32_t n) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_and_si512(lane, _mm512_set1_epi32(int(n - 1)));
    return _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), x));
  }

  CXLKV_PNM_TARGET static I load16(const int16_t* p) { return _mm512_loadu_si512(p); }
  CXLKV_PNM_TARGET static void store16(int16_t* p, I v) { _mm512_storeu_si512(p, v); }
  CXLKV_PNM_TARGET static I min16(I a, I b) { return _mm512_min_epi16(a, b); }
  CXLKV_PNM_TARGET static I max16(I a, I b) { return _mm512_max_epi16(a, b); }
  CXLKV_PNM_TARGET static I key16(I x) {
    return _mm512_xor_si512(x, _mm512_and_si512(_mm512_srai_epi16(x, 15), _mm512_set1_epi16(0x7fff)));
  }
};

constexpr Kernels kAvx512 = kernel_table<Avx512>();

}  // namespace

const Kernels& avx512_kernels() { return isa_supported(Isa::avx512) ? kAvx512 : kScalarKernels; }

}  // namespace cxlkv::pnm::detail
