// SPDX-License-Identifier: MIT
// Non-temporal copy of any alignment and length.
//
// Whole 64-byte destination lines go through the instruction-set specific
// loop (ntcopy_{sse2,avx2,avx512}.cpp).  The partial lines at the head and
// tail are written with narrower non-temporal stores, never with plain
// stores + flush: a plain store pulls the line into our cache and its later
// write-back carries the whole line, which would overwrite bytes another
// host wrote to the rest of that line meanwhile (rule 1).  NT stores carry
// only their own bytes, so nothing outside [dst, dst+n) is ever written.
#include <immintrin.h>

#include <cstring>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

namespace {

// 1-3 bytes that do not reach a 4-byte boundary: maskmovdqu, the only
// byte-granular non-temporal store.  It is given the 16-byte aligned window
// that holds the bytes, so the (masked-off) rest of the access never leaves
// the page.  Slow-ish, but used for at most a few bytes per call.
void nt_store_bytes(char* dst, const char* src, size_t k) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  char* window = reinterpret_cast<char*>(a & ~uintptr_t(15));
  const size_t off = a & 15;  // off + k <= 16 (k never crosses a 4-byte boundary)
  alignas(16) char data[16] = {};
  alignas(16) char mask[16] = {};
  std::memcpy(data + off, src, k);
  std::memset(mask + off, 0x80, k);
  _mm_maskmoveu_si128(_mm_load_si128(reinterpret_cast<const __m128i*>(data)),
                      _mm_load_si128(reinterpret_cast<const __m128i*>(mask)), window);
}

}  // namespace

void nt_store_small(char* dst, const char* src, size_t n) {
  while (n != 0) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
    size_t step;
    if ((a & 15) == 0 && n >= 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      step = 16;
    } else if ((a & 7) == 0 && n >= 8) {
      // movnti: an aligned 8-byte NT store is single-copy atomic.
      long long v;
      std::memcpy(&v, src, 8);
      _mm_stream_si64(reinterpret_cast<long long*>(dst), v);
      step = 8;
    } else if ((a & 3) == 0 && n >= 4) {
      int v;
      std::memcpy(&v, src, 4);
      _mm_stream_si32(reinterpret_cast<int*>(dst), v);
      step = 4;
    } else {
      step = 4 - (a & 3);
      if (step > n) step = n;
      nt_store_bytes(dst, src, step);
    }
    dst += step;
    src += step;
    n -= step;
  }
}

void nt_copy(NtLinesFn lines, void* dstv, const void* srcv, size_t n) {
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  size_t head = (kLine - (reinterpret_cast<uintptr_t>(dst) & (kLine - 1))) & (kLine - 1);
  if (head > n) head = n;
  nt_store_small(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t whole = n / kLine;
  if (whole != 0) lines(dst, src, whole);
  dst += whole * kLine;
  src += whole * kLine;
  nt_store_small(dst, src, n - whole * kLine);
}

NtLinesFn nt_lines_fn(NtCopyInsn insn) {
  switch (insn) {
    case NtCopyInsn::sse2: return nt_lines_sse2;
    case NtCopyInsn::avx2: return nt_lines_avx2;
    case NtCopyInsn::avx512: return nt_lines_avx512;
  }
  return nt_lines_sse2;
}

}  // namespace cxlkv::coherence
