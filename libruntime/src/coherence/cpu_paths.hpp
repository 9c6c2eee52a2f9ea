// SPDX-License-Identifier: MIT
// Internal to the coherence layer: the instruction paths a HostDomain is
// built from, PMDK style.  CPU features are read once from CPUID; each path
// is a plain function pointer chosen when the domain is made, so the hot
// loops carry no feature tests.
//
// Which instruction serves which rule of the coherence contract (docs/coherence.md):
//   clflush          rule 3 metadata flush (flush()), rule 4 invalidate before
//                    a read (invalidate()): ordered with later stores by
//                    itself, invalidates the line.
//   clflushopt/clwb  rule 3 bulk payload write-back (flush_bulk()), covered by
//                    a later mfence and a clflush-published flag.  clwb keeps
//                    the line, so it is never used to invalidate (rule 4).
//   clflushopt       rule 6 bulk invalidation of payload before a CPU read
//                    (copy_from_pool), followed by mfence.
//   movnti / movntdq / vmovntdq ymm / zmm, maskmovdqu
//                    rule 1 and rule 3: non-temporal stores put bytes in
//                    memory without ever holding a dirty line that a later
//                    write-back could use to clobber another host's bytes.
//   movdir64b        rule 3 single-line publish: one 64-byte store.
//   movntdqa         rule 6 on a WC mapping (uncached mode): whole-line
//                    streaming reads instead of uncached word reads.
//   mfence           rules 3 and 4: orders NT stores, flushes and loads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlkv/memory_domain.hpp"

namespace cxlkv::coherence {

constexpr size_t kLine = 64;

// ---- cache-line maintenance (cache_flush.cpp) -----------------------------
using FlushFn = void (*)(const void* p, size_t n);
void flush_clflush(const void* p, size_t n);
void flush_clflushopt(const void* p, size_t n);  // needs CPUID clflushopt
void flush_clwb(const void* p, size_t n);        // needs CPUID clwb
FlushFn flush_fn(FlushInsn insn);
const char* flush_name(FlushInsn insn);
bool cpu_has(FlushInsn insn, const CpuFeatures& cpu = cpu_features());

// ---- non-temporal copy ------------------------------------------------------
// Copies whole 64-byte lines: dst is 64-byte aligned, src has any alignment.
using NtLinesFn = void (*)(char* dst64, const char* src, size_t nlines);
void nt_lines_sse2(char* dst64, const char* src, size_t nlines);    // ntcopy_sse2.cpp
void nt_lines_avx2(char* dst64, const char* src, size_t nlines);    // ntcopy_avx2.cpp
void nt_lines_avx512(char* dst64, const char* src, size_t nlines);  // ntcopy_avx512.cpp
NtLinesFn nt_lines_fn(NtCopyInsn insn);
const char* ntcopy_name(NtCopyInsn insn);
bool cpu_has(NtCopyInsn insn, const CpuFeatures& cpu = cpu_features());

// Any alignment, any length (ntcopy.cpp): the partial lines at the head and
// tail are written with narrower NT stores (movntdq, movnti, and maskmovdqu
// for the last 1-3 bytes before a 4-byte boundary), the whole lines with
// `lines`.  No byte outside [dst, dst+n) is written and no line of the
// destination is ever dirty in our cache, so a partial line shared with
// another writer is safe (rule 1).  Visible to other hosts after mfence.
void nt_copy(NtLinesFn lines, void* dst, const void* src, size_t n);
// Partial-line NT stores only (used for head, tail and small store_nt()).
void nt_store_small(char* dst, const char* src, size_t n);

// ---- streaming loads for WC mappings (ntload_sse41.cpp) ---------------------
bool cpu_has_sse41();
void stream_load_copy(void* dst, const void* src, size_t n);  // needs SSE4.1

// ---- single-line publish (movdir64b.cpp) -----------------------------------
void publish_movdir64b(void* dst64, const void* src64);  // needs CPUID movdir64b

// Parse a forced path name; throws std::invalid_argument for an unknown name
// or one this CPU lacks.  `origin` names where it came from ("CXLKV_FLUSH").
// `cpu` is the feature set to check against (tests pass a CPU that lacks them).
FlushInsn parse_flush(const char* name, const char* origin, const CpuFeatures& cpu = cpu_features());
NtCopyInsn parse_ntcopy(const char* name, const char* origin,
                        const CpuFeatures& cpu = cpu_features());

}  // namespace cxlkv::coherence
