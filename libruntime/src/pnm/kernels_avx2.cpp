// SPDX-License-Identifier: MIT
// AVX2 kernels of the near-memory engine (8 floats / 16 16-bit keys per
// register; F16C for fp16, FMA).  Compiled with target attributes; only
// called when CPUID says AVX2, FMA and F16C are usable (isa_supported).
// Dimensions that are not a multiple of 8 finish with a scalar tail.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

#define CXLKV_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace cxlkv::pnm::detail {
namespace {

CXLKV_AVX2 inline __m256 load8(Dtype t, const void* base, uint32_t i) {
  switch (t) {
    case Dtype::f32: return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    case Dtype::bf16: {
      __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    case Dtype::f16: {
      __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      return _mm256_cvtph_ps(x);
    }
  }
  return _mm256_setzero_ps();
}

CXLKV_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

constexpr uint32_t kHeadChunk = 4;

CXLKV_AVX2 void score_avx2(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                           ScoreMode mode, float* out) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 8 * 8;
  for (uint32_t p = 0; p < np; p++) {
    const auto* mn = static_cast<const unsigned char*>(dig) + size_t(p) * 2 * dim * es;
    const auto* mx = mn + dim * es;
    float best = -INFINITY;
    for (uint32_t h0 = 0; h0 < nq; h0 += kHeadChunk) {
      const uint32_t nh = std::min(kHeadChunk, nq - h0);
      __m256 a[kHeadChunk], b[kHeadChunk];
      for (uint32_t h = 0; h < nh; h++) a[h] = b[h] = _mm256_setzero_ps();
      for (uint32_t d = 0; d < vd; d += 8) {
        const __m256 vmn = load8(t, mn, d), vmx = load8(t, mx, d);
        for (uint32_t h = 0; h < nh; h++) {
          const __m256 qv = _mm256_loadu_ps(q + size_t(h0 + h) * dim + d);
          if (mode == ScoreMode::upper_bound) {
            a[h] = _mm256_add_ps(a[h], _mm256_max_ps(_mm256_mul_ps(qv, vmn), _mm256_mul_ps(qv, vmx)));
          } else {
            a[h] = _mm256_fmadd_ps(qv, vmn, a[h]);
            b[h] = _mm256_fmadd_ps(qv, vmx, b[h]);
          }
        }
      }
      for (uint32_t h = 0; h < nh; h++) {
        const float* qh = q + size_t(h0 + h) * dim;
        float s;
        if (mode == ScoreMode::upper_bound) {
          s = hsum(a[h]);
          for (uint32_t d = vd; d < dim; d++)
            s += std::max(qh[d] * load_elem(t, mn, d), qh[d] * load_elem(t, mx, d));
        } else {
          float s0 = hsum(a[h]), s1 = hsum(b[h]);
          for (uint32_t d = vd; d < dim; d++) {
            s0 += qh[d] * load_elem(t, mn, d);
            s1 += qh[d] * load_elem(t, mx, d);
          }
          s = std::max(s0, s1);
        }
        best = std::max(best, s);
      }
    }
    out[p] = best;
  }
}

CXLKV_AVX2 void dot_avx2(Dtype t, const void* k, uint32_t ntok, uint32_t dim, const float* q, float* out) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 8 * 8;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(k) + size_t(i) * dim * es;
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t d = 0; d < vd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(t, r, d), acc);
    float s = hsum(acc);
    for (uint32_t d = vd; d < dim; d++) s += q[d] * load_elem(t, r, d);
    out[i] = s;
  }
}

CXLKV_AVX2 void axpy_avx2(Dtype t, const void* v, uint32_t ntok, uint32_t dim, const float* w, float* acc) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 8 * 8;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(v) + size_t(i) * dim * es;
    const __m256 wv = _mm256_set1_ps(w[i]);
    for (uint32_t d = 0; d < vd; d += 8)
      _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(wv, load8(t, r, d), _mm256_loadu_ps(acc + d)));
    for (uint32_t d = vd; d < dim; d++) acc[d] += w[i] * load_elem(t, r, d);
  }
}

// See kernels_scalar.cpp: x ^ ((x >> 15) & 0x7fff) orders bf16 / fp16 bits.
CXLKV_AVX2 inline __m256i key16x16(__m256i x) {
  return _mm256_xor_si256(x, _mm256_and_si256(_mm256_srai_epi16(x, 15), _mm256_set1_epi16(0x7fff)));
}

CXLKV_AVX2 void minmax16_avx2(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx) {
  const uint32_t vd = dim / 16 * 16;
  for (uint32_t d = 0; d < vd; d += 16) {
    __m256i a = key16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn + d)));
    __m256i b = key16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mx + d)));
    for (uint32_t i = 0; i < ntok; i++) {
      const __m256i k = key16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + size_t(i) * dim + d)));
      a = _mm256_min_epi16(a, k);
      b = _mm256_max_epi16(b, k);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mn + d), key16x16(a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mx + d), key16x16(b));
  }
  for (uint32_t d = vd; d < dim; d++) {
    auto key = [](int16_t x) { return int16_t(x ^ ((x >> 15) & 0x7fff)); };
    int16_t a = key(mn[d]), b = key(mx[d]);
    for (uint32_t i = 0; i < ntok; i++) {
      const int16_t k = key(rows[size_t(i) * dim + d]);
      a = std::min(a, k);
      b = std::max(b, k);
    }
    mn[d] = key(a);
    mx[d] = key(b);
  }
}

const Kernels kAvx2 = {score_avx2, dot_avx2, axpy_avx2, minmax16_avx2};

}  // namespace

const Kernels& avx2_kernels() { return isa_supported(Isa::avx2) ? kAvx2 : kScalarKernels; }

}  // namespace cxlkv::pnm::detail
