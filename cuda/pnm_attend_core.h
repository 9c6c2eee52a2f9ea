// SPDX-License-Identifier: MIT
// The partial-attention computation shared by the CUDA kernel
// (pnm_attend.cu, nvcc) and its CPU reference in libcxlkv (g++), so the
// reference the tests compare against, and the fake GPU library of the
// tests, run the kernel's own per-thread code.
//
// One thread computes one query head: an online softmax over the tokens of
// its KV head's pages (running max m, sum l, accumulator in the output row),
// in float, the same recurrence as the CPU engine's attend_rows.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cxlkv_pnm_abi.h"

#if defined(__CUDACC__)
#define CXLKV_PNM_AHD __host__ __device__ __forceinline__
#else
#define CXLKV_PNM_AHD inline
#endif

namespace cxlkv::pnmcore {

CXLKV_PNM_AHD float bits_float(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

// Element i of a row of dtype (0 f32, 1 bf16, 2 f16) as float, exactly.
CXLKV_PNM_AHD float elem(uint32_t dtype, const void* p, uint64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  const uint32_t h = static_cast<const uint16_t*>(p)[i];
  if (dtype == 1) return bits_float(h << 16);
  const uint32_t sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (ex == 0) {  // zero or subnormal: man * 2^-24
    const float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (ex == 31) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  return bits_float(sign | ((ex + 112u) << 23) | (man << 13));
}

CXLKV_PNM_AHD uint32_t elem_size(uint32_t dtype) { return dtype == 0 ? 4u : 2u; }

// Query head i of a launch.
CXLKV_PNM_AHD void attend_query(const cxlkv_pnm_attend_args& a, uint32_t i) {
  const float* q = reinterpret_cast<const float*>(a.q) + uint64_t(i) * a.head_dim;
  float* out = reinterpret_cast<float*>(a.out) + uint64_t(i) * a.head_dim;
  const uint32_t* start = reinterpret_cast<const uint32_t*>(a.page_start);
  const uint64_t* pk = reinterpret_cast<const uint64_t*>(a.page_k);
  const uint32_t* pn = reinterpret_cast<const uint32_t*>(a.page_ntok);
  const uint32_t kvh = i / a.group;
  const uint64_t row = uint64_t(a.head_dim) * elem_size(a.dtype);
  for (uint32_t d = 0; d < a.head_dim; d++) out[d] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (uint32_t e = start[kvh]; e < start[kvh + 1]; e++) {
    for (uint32_t t = 0; t < pn[e]; t++) {
      const void* k = reinterpret_cast<const void*>(pk[e] + t * row);
      const void* v = reinterpret_cast<const void*>(pk[e] + a.v_offset + t * row);
      float s = 0.f;
      for (uint32_t d = 0; d < a.head_dim; d++) s += q[d] * elem(a.dtype, k, d);
      s *= a.scale;
      const float mn = s > m ? s : m;
      const float c = expf(m - mn);  // 0 while m is -inf
      const float w = expf(s - mn);
      l = l * c + w;
      for (uint32_t d = 0; d < a.head_dim; d++) out[d] = out[d] * c + w * elem(a.dtype, v, d);
      m = mn;
    }
  }
  if (l > 0.f) {
    for (uint32_t d = 0; d < a.head_dim; d++) out[d] /= l;
    reinterpret_cast<float*>(a.lse)[i] = m + logf(l);
  } else {
    reinterpret_cast<float*>(a.lse)[i] = -INFINITY;
  }
}

// -EINVAL reasons, or nullptr when the arguments describe a valid launch.
inline const char* check_attend_args(const cxlkv_pnm_attend_args* a) {
  if (!a) return "arguments are NULL";
  if (!a->q || !a->out || !a->lse || !a->page_start) return "q, out, lse or page_start pointer is 0";
  if (a->dtype > 2) return "unknown dtype";
  if (!a->nq || !a->group || !a->head_dim) return "empty shape";
  if (a->nq % a->group) return "nq is not a multiple of group";
  if (!(a->scale > 0.f)) return "scale is not positive";
  return nullptr;
}

}  // namespace cxlkv::pnmcore
