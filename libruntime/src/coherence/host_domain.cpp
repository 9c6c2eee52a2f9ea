// SPDX-License-Identifier: MIT
// HostDomain: the real CPU's MemoryDomain.  The instruction paths are chosen
// once when the domain is made (CPUID, then CXLKV_FLUSH / CXLKV_NTCOPY, then
// HostDomainOptions, later ones overriding), so every call below is a plain
// indirect call with no feature test.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "coherence/cpu_paths.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

using namespace coherence;

// In coherent mode small bulk copies stay in the cache (memcpy); large ones
// use NT stores anyway, which do not pollute the cache with data this host
// will not read again.
constexpr size_t kCoherentNtThreshold = 4096;

class HostDomain final : public MemoryDomain {
 public:
  HostDomain(DomainMode mode, FlushInsn flush, NtCopyInsn nt)
      : mode_(mode),
        flush_insn_(flush),
        nt_insn_(nt),
        flush_bulk_(flush_fn(flush)),
        // rule 4/6: bulk invalidation must drop the lines; clwb would not.
        invalidate_bulk_(cpu_has(FlushInsn::clflushopt) && flush != FlushInsn::clflush
                             ? flush_clflushopt
                             : flush_clflush),
        nt_lines_(nt_lines_fn(nt)),
        movdir64b_(cpu_features().movdir64b),
        stream_loads_(mode == DomainMode::uncached && cpu_has_sse41()) {}

  DomainMode mode() const override { return mode_; }
  bool publish_line_whole() const override { return movdir64b_; }  // movdir64b: 64-byte write atomicity

  std::string describe() const override {
    std::string s = std::string(to_string(mode_)) + "(" + flush_name(flush_insn_) + ", " +
                    ntcopy_name(nt_insn_) + "-nt";
    if (movdir64b_) s += ", movdir64b";
    if (stream_loads_) s += ", movntdqa";
    return s + ")";
  }

  void load(void* dst, const void* pool_src, size_t n) override { std::memcpy(dst, pool_src, n); }
  void store(void* pool_dst, const void* src, size_t n) override { std::memcpy(pool_dst, src, n); }

  // NT in every mode: on coherent memory it is as correct as a plain store,
  // on WB non-coherent memory it is what rule 1 requires, on WC it combines.
  void store_nt(void* pool_dst, const void* src, size_t n) override {
    nt_copy(nt_lines_, pool_dst, src, n);
  }

  void flush(const void* p, size_t n) override {
    if (mode_ != DomainMode::flush) return;  // coherent / UC: nothing cached to push out
    flush_clflush(p, n);  // rule 3: metadata uses clflush
  }

  void flush_bulk(const void* p, size_t n) override {
    if (mode_ != DomainMode::flush) return;
    flush_bulk_(p, n);  // rule 3: bulk data; the caller fences before its flag
  }

  void invalidate(const void* p, size_t n) override {
    if (mode_ != DomainMode::flush) return;
    flush_clflush(p, n);  // rule 4: drop possibly stale lines (clflush)
  }

  void fence() override { _mm_mfence(); }  // rules 3/4: orders NT stores, flushes, loads

  void copy_to_pool(void* pool_dst, const void* src, size_t n) override {
    if (mode_ == DomainMode::coherent && n < kCoherentNtThreshold) {
      std::memcpy(pool_dst, src, n);
      return;
    }
    // rule 3: NT stores, so the payload is in memory after the caller's fence.
    nt_copy(nt_lines_, pool_dst, src, n);
  }

  void copy_from_pool(void* dst, const void* pool_src, size_t n) override {
    if (mode_ == DomainMode::flush && n != 0) {
      invalidate_bulk_(pool_src, n);  // rule 6: payload reads invalidate first
      _mm_mfence();                   // rule 4: invalidation done before the loads
    }
    if (stream_loads_) {
      stream_load_copy(dst, pool_src, n);  // rule 6 on WC: whole-line streaming reads
      return;
    }
    std::memcpy(dst, pool_src, n);
  }

  void invalidate_clean(const void* p, size_t n) override {
    if (mode_ == DomainMode::flush && n != 0) invalidate_bulk_(p, n);  // rule 4 (never-dirty lines); the caller fences
  }

  void invalidate_payload(const void* p, size_t n) override {
    if (mode_ == DomainMode::flush && n != 0) invalidate_bulk_(p, n);  // rule 6; the caller fences (rule 4)
  }

  void load_payload(void* dst, const void* pool_src, size_t n) override {
    if (stream_loads_) {
      stream_load_copy(dst, pool_src, n);  // rule 6 on WC: whole-line streaming reads
      return;
    }
    std::memcpy(dst, pool_src, n);
  }

  void publish_line(void* pool_dst64, const void* src64) override {
    if (movdir64b_ && (reinterpret_cast<uintptr_t>(pool_dst64) & (kLine - 1)) == 0) {
      publish_movdir64b(pool_dst64, src64);  // rule 3: the whole line in one store
      return;
    }
    nt_copy(nt_lines_, pool_dst64, src64, kLine);  // rule 1/3: NT, no dirty line
  }

 private:
  DomainMode mode_;
  FlushInsn flush_insn_;
  NtCopyInsn nt_insn_;
  FlushFn flush_bulk_;
  FlushFn invalidate_bulk_;
  NtLinesFn nt_lines_;
  bool movdir64b_;
  bool stream_loads_;
};

FlushInsn default_flush() {
  if (cpu_has(FlushInsn::clflushopt)) return FlushInsn::clflushopt;
  if (cpu_has(FlushInsn::clwb)) return FlushInsn::clwb;
  return FlushInsn::clflush;
}

NtCopyInsn default_ntcopy() {
  if (cpu_has(NtCopyInsn::avx512)) return NtCopyInsn::avx512;
  if (cpu_has(NtCopyInsn::avx2)) return NtCopyInsn::avx2;
  return NtCopyInsn::sse2;
}

bool set(const char* s) { return s != nullptr && *s != '\0'; }

}  // namespace

std::unique_ptr<MemoryDomain> make_host_domain(const HostDomainOptions& opts) {
  FlushInsn flush = default_flush();
  NtCopyInsn nt = default_ntcopy();
  if (const char* e = std::getenv("CXLKV_FLUSH"); set(e)) flush = parse_flush(e, "CXLKV_FLUSH");
  if (const char* e = std::getenv("CXLKV_NTCOPY"); set(e)) nt = parse_ntcopy(e, "CXLKV_NTCOPY");
  if (set(opts.force_flush)) flush = parse_flush(opts.force_flush, "HostDomainOptions.force_flush");
  if (set(opts.force_ntcopy))
    nt = parse_ntcopy(opts.force_ntcopy, "HostDomainOptions.force_ntcopy");
  auto d = std::make_unique<HostDomain>(opts.mode, flush, nt);
  log().debug("memory domain: {}", d->describe());
  return d;
}

}  // namespace cxlkv
