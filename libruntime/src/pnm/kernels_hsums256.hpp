// SPDX-License-Identifier: MIT
// Horizontal sums of several 256-bit float vectors at once, shared by the
// AVX2 and AVX-512 kernels (the latter folds its 512-bit sums to 256 bits
// first): one horizontal sum per (page, query head) is what the score
// kernel pays besides its multiply-adds, and four at a time cost little
// more than one (docs/near-memory.md#selection-at-the-read-bound).  The
// including file defines CXLKV_PNM_TARGET (an instruction set with AVX2)
// and includes <immintrin.h> first; internal linkage, like
// kernels_template.hpp.
#pragma once

#ifndef CXLKV_PNM_TARGET
#error "define CXLKV_PNM_TARGET before including pnm/kernels_hsums256.hpp"
#endif

#include <cstdint>

namespace cxlkv::pnm::detail {
namespace {

// out[h] = the sum of the lanes of y[h], h < n.
CXLKV_PNM_TARGET inline void hsums256(const __m256* y, uint32_t n, float* out) {
  for (uint32_t h0 = 0; h0 < n; h0 += 4) {
    __m256 v[4];
    for (uint32_t i = 0; i < 4; i++) v[i] = h0 + i < n ? y[h0 + i] : _mm256_setzero_ps();
    // [v0 01, v0 23, v1 01, v1 23 | v0 45, v0 67, v1 45, v1 67], likewise v2, v3.
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    // [s0 s1 s2 s3] of the low and the high half, added.
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    alignas(16) float r[4];
    _mm_store_ps(r, s);
    for (uint32_t i = 0; i < 4 && h0 + i < n; i++) out[h0 + i] = r[i];
  }
}

}  // namespace
}  // namespace cxlkv::pnm::detail
