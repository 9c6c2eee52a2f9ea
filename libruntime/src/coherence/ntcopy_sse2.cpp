// SPDX-License-Identifier: MIT
// Whole-line non-temporal copy with SSE2 (movntdq, 4 x 16 B per line).
// Baseline of x86-64: always available.
#include <immintrin.h>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

void nt_lines_sse2(char* dst, const char* src, size_t nlines) {
  for (size_t i = 0; i < nlines; i++, dst += kLine, src += kLine) {
    const __m128i* s = reinterpret_cast<const __m128i*>(src);
    __m128i* d = reinterpret_cast<__m128i*>(dst);
    __m128i a = _mm_loadu_si128(s + 0), b = _mm_loadu_si128(s + 1);
    __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d + 0, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
}

}  // namespace cxlkv::coherence
