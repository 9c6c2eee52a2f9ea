// SPDX-License-Identifier: MIT
// AVX-512 kernels of the near-memory engine (16 floats / 32 16-bit keys per
// register).  Compiled with target attributes; only called when CPUID says
// AVX-512F/BW/VL are usable (isa_supported).  Dimensions that are not a
// multiple of 16 finish with a scalar tail.
// GCC 12 reports the _mm512_undefined_*() inside its own AVX-512 headers as
// "may be used uninitialized" (a known false positive of those headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

#define CXLKV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

namespace cxlkv::pnm::detail {
namespace {

CXLKV_AVX512 inline __m512 load16(Dtype t, const void* base, uint32_t i) {
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

constexpr uint32_t kHeadChunk = 8;

CXLKV_AVX512 void score_avx512(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                               ScoreMode mode, float* out) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 16 * 16;
  for (uint32_t p = 0; p < np; p++) {
    const auto* mn = static_cast<const unsigned char*>(dig) + size_t(p) * 2 * dim * es;
    const auto* mx = mn + dim * es;
    float best = -INFINITY;
    for (uint32_t h0 = 0; h0 < nq; h0 += kHeadChunk) {
      const uint32_t nh = std::min(kHeadChunk, nq - h0);
      __m512 a[kHeadChunk], b[kHeadChunk];
      for (uint32_t h = 0; h < nh; h++) a[h] = b[h] = _mm512_setzero_ps();
      for (uint32_t d = 0; d < vd; d += 16) {
        const __m512 vmn = load16(t, mn, d), vmx = load16(t, mx, d);
        for (uint32_t h = 0; h < nh; h++) {
          const __m512 qv = _mm512_loadu_ps(q + size_t(h0 + h) * dim + d);
          if (mode == ScoreMode::upper_bound) {
            a[h] = _mm512_add_ps(a[h], _mm512_max_ps(_mm512_mul_ps(qv, vmn), _mm512_mul_ps(qv, vmx)));
          } else {
            a[h] = _mm512_fmadd_ps(qv, vmn, a[h]);
            b[h] = _mm512_fmadd_ps(qv, vmx, b[h]);
          }
        }
      }
      for (uint32_t h = 0; h < nh; h++) {
        const float* qh = q + size_t(h0 + h) * dim;
        float s;
        if (mode == ScoreMode::upper_bound) {
          s = _mm512_reduce_add_ps(a[h]);
          for (uint32_t d = vd; d < dim; d++)
            s += std::max(qh[d] * load_elem(t, mn, d), qh[d] * load_elem(t, mx, d));
        } else {
          float s0 = _mm512_reduce_add_ps(a[h]), s1 = _mm512_reduce_add_ps(b[h]);
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

CXLKV_AVX512 void dot_avx512(Dtype t, const void* k, uint32_t ntok, uint32_t dim, const float* q, float* out) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 16 * 16;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(k) + size_t(i) * dim * es;
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t d = 0; d < vd; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(t, r, d), acc);
    float s = _mm512_reduce_add_ps(acc);
    for (uint32_t d = vd; d < dim; d++) s += q[d] * load_elem(t, r, d);
    out[i] = s;
  }
}

CXLKV_AVX512 void axpy_avx512(Dtype t, const void* v, uint32_t ntok, uint32_t dim, const float* w, float* acc) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / 16 * 16;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(v) + size_t(i) * dim * es;
    const __m512 wv = _mm512_set1_ps(w[i]);
    for (uint32_t d = 0; d < vd; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(wv, load16(t, r, d), _mm512_loadu_ps(acc + d)));
    for (uint32_t d = vd; d < dim; d++) acc[d] += w[i] * load_elem(t, r, d);
  }
}

// See kernels_scalar.cpp: x ^ ((x >> 15) & 0x7fff) orders bf16 / fp16 bits.
CXLKV_AVX512 inline __m512i key32x16(__m512i x) {
  return _mm512_xor_si512(x, _mm512_and_si512(_mm512_srai_epi16(x, 15), _mm512_set1_epi16(0x7fff)));
}

CXLKV_AVX512 void minmax16_avx512(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx) {
  const uint32_t vd = dim / 32 * 32;
  for (uint32_t d = 0; d < vd; d += 32) {
    __m512i a = key32x16(_mm512_loadu_si512(mn + d)), b = key32x16(_mm512_loadu_si512(mx + d));
    for (uint32_t i = 0; i < ntok; i++) {
      const __m512i k = key32x16(_mm512_loadu_si512(rows + size_t(i) * dim + d));
      a = _mm512_min_epi16(a, k);
      b = _mm512_max_epi16(b, k);
    }
    _mm512_storeu_si512(mn + d, key32x16(a));
    _mm512_storeu_si512(mx + d, key32x16(b));
  }
  if (vd < dim) {
    // Tail columns: the scalar kernel on the remaining columns of each row.
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
}

const Kernels kAvx512 = {score_avx512, dot_avx512, axpy_avx512, minmax16_avx512};

}  // namespace

const Kernels& avx512_kernels() { return isa_supported(Isa::avx512) ? kAvx512 : kScalarKernels; }

}  // namespace cxlkv::pnm::detail
