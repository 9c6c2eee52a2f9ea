// SPDX-License-Identifier: MIT
// The page-digest computation shared by the CUDA kernel (pnm_digest.cu,
// nvcc) and its CPU reference in libcxlkv (g++), so the reference the tests
// compare the kernel against runs the kernel's own per-thread code.
//
// One thread computes one element d of one page's digest: min and max over
// the page's tokens, compared through an order-preserving map of the bit
// pattern (sign-magnitude -> two's complement: x ^ ((x >> 15) & 0x7fff) for
// 16-bit types, the same with 31 for f32), so bf16 / fp16 need no float
// conversion and the stored min / max are the input elements bit for bit.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cxlkv_pnm_abi.h"

#if defined(__CUDACC__)
#define CXLKV_PNM_HD __host__ __device__ __forceinline__
#else
#define CXLKV_PNM_HD inline
#endif

namespace cxlkv::pnmcore {

CXLKV_PNM_HD int16_t key16(int16_t x) { return int16_t(x ^ ((x >> 15) & 0x7fff)); }
CXLKV_PNM_HD int32_t key32(int32_t x) { return int32_t(x ^ ((x >> 31) & 0x7fffffff)); }

CXLKV_PNM_HD uint64_t npages(const cxlkv_pnm_digest_args& a) {
  return (a.ntokens + a.page_tokens - 1) / a.page_tokens;
}

// Element d of the digest of (row, page).
CXLKV_PNM_HD void digest_element(const cxlkv_pnm_digest_args& a, uint32_t row, uint64_t page, uint32_t d) {
  const uint64_t np = npages(a);
  const uint64_t t0 = page * a.page_tokens;
  const uint64_t nt = (a.ntokens - t0) < a.page_tokens ? (a.ntokens - t0) : a.page_tokens;
  const uint64_t first = (uint64_t(row) * a.ntokens + t0) * a.head_dim + d;  // element index
  const uint64_t out = ((uint64_t(row) * np + page) * 2) * a.head_dim + d;
  if (a.dtype == 0) {
    const int32_t* k = reinterpret_cast<const int32_t*>(a.k);
    int32_t lo = key32(k[first]), hi = lo;
    for (uint64_t t = 1; t < nt; t++) {
      const int32_t x = key32(k[first + t * a.head_dim]);
      lo = x < lo ? x : lo;
      hi = x > hi ? x : hi;
    }
    int32_t* o = reinterpret_cast<int32_t*>(a.out);
    o[out] = key32(lo);
    o[out + a.head_dim] = key32(hi);
  } else {
    const int16_t* k = reinterpret_cast<const int16_t*>(a.k);
    int16_t lo = key16(k[first]), hi = lo;
    for (uint64_t t = 1; t < nt; t++) {
      const int16_t x = key16(k[first + t * a.head_dim]);
      lo = x < lo ? x : lo;
      hi = x > hi ? x : hi;
    }
    int16_t* o = reinterpret_cast<int16_t*>(a.out);
    o[out] = key16(lo);
    o[out + a.head_dim] = key16(hi);
  }
}

// -EINVAL reasons, or nullptr when the arguments describe a valid launch.
inline const char* check_args(const cxlkv_pnm_digest_args* a) {
  if (!a) return "arguments are NULL";
  if (!a->k || !a->out) return "K or output pointer is 0";
  if (a->dtype > 2) return "unknown dtype";
  if (!a->rows || !a->head_dim || !a->page_tokens || !a->ntokens) return "empty shape";
  if (a->rows > 65535) return "more than 65535 (layer, head) rows";
  if (npages(*a) > 0x7fffffffull) return "too many pages";
  return nullptr;
}

}  // namespace cxlkv::pnmcore
