// SPDX-License-Identifier: MIT
// Cache-line write-back / invalidation loops, one per instruction.  Each
// covers every 64-byte line that [p, p+n) touches.  None of them fences:
// the caller's fence() (mfence) orders them with what follows (rule 3/4).
#include <immintrin.h>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

namespace {
inline uintptr_t first_line(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); }
inline uintptr_t end_of(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) + n; }
}  // namespace

// clflush: write back if dirty and invalidate; ordered with other clflush and
// with stores to the same line without a fence (the metadata instruction).
void flush_clflush(const void* p, size_t n) {
  if (n == 0) return;
  for (uintptr_t a = first_line(p), e = end_of(p, n); a < e; a += kLine)
    _mm_clflush(reinterpret_cast<const void*>(a));
}

// clflushopt: as clflush but weakly ordered, so the lines are flushed in
// parallel; needs mfence/sfence before anything that depends on it.
__attribute__((target("clflushopt"))) void flush_clflushopt(const void* p, size_t n) {
  if (n == 0) return;
  for (uintptr_t a = first_line(p), e = end_of(p, n); a < e; a += kLine)
    _mm_clflushopt(reinterpret_cast<void*>(a));
}

// clwb: write back, may keep the line (clean).  Write-back only: never used
// where rule 4 needs an invalidation.
__attribute__((target("clwb"))) void flush_clwb(const void* p, size_t n) {
  if (n == 0) return;
  for (uintptr_t a = first_line(p), e = end_of(p, n); a < e; a += kLine)
    _mm_clwb(reinterpret_cast<void*>(a));
}

FlushFn flush_fn(FlushInsn insn) {
  switch (insn) {
    case FlushInsn::clflush: return flush_clflush;
    case FlushInsn::clflushopt: return flush_clflushopt;
    case FlushInsn::clwb: return flush_clwb;
  }
  return flush_clflush;
}

}  // namespace cxlkv::coherence
