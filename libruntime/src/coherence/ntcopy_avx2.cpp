// SPDX-License-Identifier: MIT
// Whole-line non-temporal copy with AVX2-class streaming stores
// (vmovntdq ymm, 2 x 32 B per line).  Compiled with a target attribute so the
// library still loads on CPUs without AVX; only called when CPUID says so.
#include <immintrin.h>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

__attribute__((target("avx2"))) void nt_lines_avx2(char* dst, const char* src, size_t nlines) {
  size_t i = 0;
  // Two lines per iteration: four loads in flight before the stores.
  for (; i + 2 <= nlines; i += 2, dst += 2 * kLine, src += 2 * kLine) {
    const __m256i* s = reinterpret_cast<const __m256i*>(src);
    __m256i* d = reinterpret_cast<__m256i*>(dst);
    __m256i a = _mm256_loadu_si256(s + 0), b = _mm256_loadu_si256(s + 1);
    __m256i c = _mm256_loadu_si256(s + 2), e = _mm256_loadu_si256(s + 3);
    _mm256_stream_si256(d + 0, a);
    _mm256_stream_si256(d + 1, b);
    _mm256_stream_si256(d + 2, c);
    _mm256_stream_si256(d + 3, e);
  }
  if (i < nlines) {
    const __m256i* s = reinterpret_cast<const __m256i*>(src);
    __m256i* d = reinterpret_cast<__m256i*>(dst);
    __m256i a = _mm256_loadu_si256(s + 0), b = _mm256_loadu_si256(s + 1);
    _mm256_stream_si256(d + 0, a);
    _mm256_stream_si256(d + 1, b);
  }
}

}  // namespace cxlkv::coherence
