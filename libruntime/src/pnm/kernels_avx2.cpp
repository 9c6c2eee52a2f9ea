// SPDX-License-Identifier: MIT
// AVX2 kernels of the near-memory engine (8 floats / 16 16-bit keys per
// register; F16C for fp16, FMA): kernels_template.hpp over these vectors.
// Compiled with target attributes; only called when CPUID says AVX2, FMA
// and F16C are usable (isa_supported).
#include <immintrin.h>

#include <cstdint>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

#define CXLKV_PNM_TARGET __attribute__((target("avx2,fma,f16c")))
#include "pnm/kernels_hsums256.hpp"
#include "pnm/kernels_template.hpp"

namespace cxlkv::pnm::detail {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr uint32_t kF = 8, kI = 16, kHeadChunk = 4, kAcc = 8;

  CXLKV_PNM_TARGET static F zero() { return _mm256_setzero_ps(); }
  CXLKV_PNM_TARGET static F set1(float x) { return _mm256_set1_ps(x); }
  CXLKV_PNM_TARGET static F load(const float* p) { return _mm256_loadu_ps(p); }
  CXLKV_PNM_TARGET static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  CXLKV_PNM_TARGET static F load_elems(Dtype t, const void* base, uint32_t i) {
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
  CXLKV_PNM_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  CXLKV_PNM_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  CXLKV_PNM_TARGET static F max(F a, F b) { return _mm256_max_ps(a, b); }
  CXLKV_PNM_TARGET static F min(F a, F b) { return _mm256_min_ps(a, b); }
  CXLKV_PNM_TARGET static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  CXLKV_PNM_TARGET static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  CXLKV_PNM_TARGET static F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  CXLKV_PNM_TARGET static F pow2i(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  CXLKV_PNM_TARGET static F load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  CXLKV_PNM_TARGET static void hsums(const F* a, uint32_t n, float* out) { hsums256(a, n, out); }
  // Eight sums at once: each level adds the halves of pairs of vectors
  // (128-bit halves, then pairs of lanes twice).  The tree leaves the sum
  // of its input 2j + b in lane 4b + j, so a[4b + j] goes in at 2j + b.
  CXLKV_PNM_TARGET static F reduce(const F* a) {
    F c[4], e[2];
#pragma GCC unroll 8
    for (uint32_t i = 0; i < 4; i++) {
      const F x = a[4 * ((2 * i) % 2) + (2 * i) / 2], y = a[4 * ((2 * i + 1) % 2) + (2 * i + 1) / 2];
      c[i] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    }
#pragma GCC unroll 8
    for (uint32_t i = 0; i < 2; i++)
      e[i] = _mm256_add_ps(_mm256_unpacklo_ps(c[2 * i], c[2 * i + 1]), _mm256_unpackhi_ps(c[2 * i], c[2 * i + 1]));
    return _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], 0x44), _mm256_shuffle_ps(e[0], e[1], 0xee));
  }
  CXLKV_PNM_TARGET static F tile(const float* x, uint32_t n) {
    const __m256i idx = _mm256_and_si256(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(int(n - 1)));
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
    return _mm256_permutevar8x32_ps(_mm256_maskload_ps(x, lanes), idx);
  }

  CXLKV_PNM_TARGET static I load16(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  CXLKV_PNM_TARGET static void store16(int16_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  CXLKV_PNM_TARGET static I min16(I a, I b) { return _mm256_min_epi16(a, b); }
  CXLKV_PNM_TARGET static I max16(I a, I b) { return _mm256_max_epi16(a, b); }
  CXLKV_PNM_TARGET static I key16(I x) {
    return _mm256_xor_si256(x, _mm256_and_si256(_mm256_srai_epi16(x, 15), _mm256_set1_epi16(0x7fff)));
  }
};

constexpr Kernels kAvx2 = kernel_table<Avx2>();

}  // namespace

const Kernels& avx2_kernels() { return isa_supported(Isa::avx2) ? kAvx2 : kScalarKernels; }

}  // namespace cxlkv::pnm::detail
