// SPDX-License-Identifier: MIT
// Streaming loads (movntdqa, SSE4.1) for reading a write-combining (WC)
// mapping of the pool (DomainMode::uncached, rule 6's alternative to
// invalidate-then-load): on WC memory a plain load is an uncached 8- or
// 16-byte read, while movntdqa fetches the whole 64-byte line into a
// streaming buffer once and serves the next loads of that line from it.
// On UC or WB memory it behaves as an ordinary load, so it is always correct.
#include <immintrin.h>

#include <cstring>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

__attribute__((target("sse4.1"))) void stream_load_copy(void* dstv, const void* srcv, size_t n) {
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  size_t head = (16 - (reinterpret_cast<uintptr_t>(src) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  // The four 16-byte pieces of a line back to back: one streaming buffer fill.
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    auto* s = reinterpret_cast<__m128i*>(const_cast<char*>(src));
    __m128i a = _mm_stream_load_si128(s + 0), b = _mm_stream_load_si128(s + 1);
    __m128i c = _mm_stream_load_si128(s + 2), d = _mm_stream_load_si128(s + 3);
    auto* o = reinterpret_cast<__m128i*>(dst);
    _mm_storeu_si128(o + 0, a);
    _mm_storeu_si128(o + 1, b);
    _mm_storeu_si128(o + 2, c);
    _mm_storeu_si128(o + 3, d);
  }
  for (; n >= 16; n -= 16, dst += 16, src += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_stream_load_si128(reinterpret_cast<__m128i*>(const_cast<char*>(src))));
  std::memcpy(dst, src, n);
}

}  // namespace cxlkv::coherence
