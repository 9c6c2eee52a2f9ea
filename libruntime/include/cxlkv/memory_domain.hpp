// SPDX-License-Identifier: MIT
// MemoryDomain: how this process touches pool memory, chosen once per pool
// mapping.  Every structure in the pool is accessed through it, so that the
// same protocol code runs on real hardware (HostDomain, real instructions)
// and under NonCoherentSim (a simulated private write-back cache per node).
//
// The coherence contract (docs/coherence.md) in terms of this interface:
//   rule 1  a line with several writers is written only with store_nt()
//   rule 3  publish = store data; flush() it (or store_nt()); fence();
//           store the flag (store_nt() or store()+flush()); fence()
//   rule 4  read = invalidate(); fence(); load()  -- read_fresh() does this
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cxlkv {

enum class DomainMode {
  coherent,  // one host or hardware-coherent memory: plain accesses + fences
  flush,     // write-back mapping of non-coherent memory: full contract
  uncached,  // UC/WC mapping: no cache maintenance needed, fences still order
};

const char* to_string(DomainMode m);

class MemoryDomain {
 public:
  virtual ~MemoryDomain() = default;
  virtual DomainMode mode() const = 0;
  virtual std::string describe() const = 0;  // e.g. "flush(clflushopt, avx512-nt)"

  // Plain loads/stores of pool memory (may hit a stale / dirty cache line).
  virtual void load(void* dst, const void* pool_src, size_t n) = 0;
  virtual void store(void* pool_dst, const void* src, size_t n) = 0;
  // Non-temporal stores: bytes go to memory, bypassing (and evicting) the
  // cache.  Aligned 8-byte stores are single-copy atomic.  Ordered by fence().
  virtual void store_nt(void* pool_dst, const void* src, size_t n) = 0;

  // Write back and invalidate the lines covering [p, p+n): clflush strength,
  // ordered with later stores; use for metadata (rule 3).
  virtual void flush(const void* p, size_t n) = 0;
  // Bulk write-back (clflushopt / clwb) for payload covered by a later
  // clflush-published flag; needs fence() before the flag.
  virtual void flush_bulk(const void* p, size_t n) = 0;
  // Drop possibly stale lines before reading data written by another host
  // (rule 4).  clflush: dirty lines of our own are written back first.
  virtual void invalidate(const void* p, size_t n) = 0;
  // Full fence (mfence): orders loads, stores, NT stores and flushes.
  virtual void fence() = 0;

  // Bulk payload copies, the fastest correct path for this mode.
  // copy_to_pool: the bytes are in memory (not merely in our cache) after
  // the next fence().  copy_from_pool: invalidates first where needed.
  virtual void copy_to_pool(void* pool_dst, const void* src, size_t n) = 0;
  virtual void copy_from_pool(void* dst, const void* pool_src, size_t n) = 0;
  // The same split in two, so that a block read as many pieces is
  // invalidated in one sweep with one fence (rules 4/6) instead of a fence
  // per piece: invalidate_payload(block) ; fence() ; load_payload(piece)...
  // invalidate_payload may use the bulk instruction (clflushopt), which the
  // following fence orders before the loads.
  virtual void invalidate_payload(const void* p, size_t n) { invalidate(p, n); }
  // Invalidate metadata lines that this host only ever writes with NT
  // stores or movdir64b (rule 1: index entries, ext records, stripe lines,
  // lock slots, doorbells), as one line of a sweep that the caller ends
  // with one fence() before its loads (rule 4).  Such a line is never dirty
  // here, so dropping it writes nothing back and the bulk instruction
  // (clflushopt, ordered before the loads by the fence) is as strong as
  // clflush; a clflush of a line still in the cache costs ~200 ns, serialised
  // with every other clflush of the sweep.
  virtual void invalidate_clean(const void* p, size_t n) { invalidate(p, n); }
  virtual void load_payload(void* dst, const void* pool_src, size_t n) { load(dst, pool_src, n); }

  // Publish one aligned 64-byte line with a single store where the CPU has
  // movdir64b, else NT stores; visible to other hosts after fence().
  virtual void publish_line(void* pool_dst64, const void* src64) = 0;
  // Does publish_line() reach memory as one indivisible 64-byte write
  // (movdir64b), so that no reader on any host ever sees part of it?  A
  // protocol may then let each line carry its own flag (one fence per
  // batch); otherwise it publishes data, fence, flag (rule 3).
  virtual bool publish_line_whole() const { return false; }

  // ---- typed helpers ------------------------------------------------------
  template <class T>
  T read(const T* p) {
    T v;
    load(&v, p, sizeof v);
    return v;
  }
  // rule 4: invalidate, fence, then load.
  template <class T>
  T read_fresh(const T* p) {
    invalidate(p, sizeof(T));
    fence();
    return read(p);
  }
  template <class T>
  void write(T* p, const T& v) {
    store(p, &v, sizeof v);
  }
  template <class T>
  void write_nt(T* p, const T& v) {
    store_nt(p, &v, sizeof v);
  }
};

// ---- the real CPU ---------------------------------------------------------

// Instruction paths, detected once from CPUID.  CXLKV_FLUSH=clflush|clflushopt|clwb
// and CXLKV_NTCOPY=sse2|avx2|avx512 force a path (tests cover each one the CPU has).
enum class FlushInsn { clflush, clflushopt, clwb };
enum class NtCopyInsn { sse2, avx2, avx512 };

struct CpuFeatures {
  bool clflushopt = false, clwb = false, avx2 = false, avx512f = false, movdir64b = false;
};
const CpuFeatures& cpu_features();

struct HostDomainOptions {
  DomainMode mode = DomainMode::flush;
  // Empty: choose from CPUID / environment.
  const char* force_flush = nullptr;   // "clflush" | "clflushopt" | "clwb"
  const char* force_ntcopy = nullptr;  // "sse2" | "avx2" | "avx512"
};
// Throws std::invalid_argument if a forced path is unknown or unsupported.
std::unique_ptr<MemoryDomain> make_host_domain(const HostDomainOptions& opts = {});

}  // namespace cxlkv
