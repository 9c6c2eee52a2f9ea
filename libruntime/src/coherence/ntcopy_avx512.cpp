// SPDX-License-Identifier: MIT
// Whole-line non-temporal copy with AVX-512F streaming stores
// (vmovntdq zmm: one full line per store, so the write-combining buffer
// leaves the core as one full-line write).  Compiled with a target
// attribute; only called when CPUID and XGETBV say AVX-512 is usable.
#include <immintrin.h>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

__attribute__((target("avx512f"))) void nt_lines_avx512(char* dst, const char* src,
                                                          size_t nlines) {
  size_t i = 0;
  for (; i + 4 <= nlines; i += 4, dst += 4 * kLine, src += 4 * kLine) {
    __m512i a = _mm512_loadu_si512(src + 0 * kLine);
    __m512i b = _mm512_loadu_si512(src + 1 * kLine);
    __m512i c = _mm512_loadu_si512(src + 2 * kLine);
    __m512i e = _mm512_loadu_si512(src + 3 * kLine);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 0 * kLine), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 1 * kLine), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 2 * kLine), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 3 * kLine), e);
  }
  for (; i < nlines; i++, dst += kLine, src += kLine)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_loadu_si512(src));
}

}  // namespace cxlkv::coherence
