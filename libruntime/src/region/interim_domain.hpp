// SPDX-License-Identifier: MIT
// INTERIM, removed once the coherence layer's make_host_domain() lands:
// a conservative flush-mode MemoryDomain (clflush for every flush and
// invalidate, stores followed by clflush instead of non-temporal stores)
// so that Region can be opened before the real one exists.
#pragma once

#include <immintrin.h>

#include <cstring>
#include <memory>

#include "cxlkv/memory_domain.hpp"

namespace cxlkv::region {

class InterimClflushDomain final : public MemoryDomain {
 public:
  DomainMode mode() const override { return DomainMode::flush; }
  std::string describe() const override { return "flush(clflush, interim)"; }
  void load(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void store(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  // Bytes reach memory: store, then write the lines back and drop them.
  void store_nt(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    clflush_range(dst, n);
  }
  void flush(const void* p, size_t n) override { clflush_range(p, n); }
  void flush_bulk(const void* p, size_t n) override { clflush_range(p, n); }
  void invalidate(const void* p, size_t n) override { clflush_range(p, n); }
  void fence() override { _mm_mfence(); }
  void copy_to_pool(void* dst, const void* src, size_t n) override { store_nt(dst, src, n); }
  void copy_from_pool(void* dst, const void* src, size_t n) override {
    clflush_range(src, n);
    _mm_mfence();
    std::memcpy(dst, src, n);
  }
  void publish_line(void* dst64, const void* src64) override { store_nt(dst64, src64, 64); }

 private:
  static void clflush_range(const void* p, size_t n) {
    if (n == 0) return;
    auto a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
    auto end = reinterpret_cast<uintptr_t>(p) + n;
    for (; a < end; a += 64) _mm_clflush(reinterpret_cast<const void*>(a));
  }
};

inline std::unique_ptr<MemoryDomain> make_interim_domain() {
  return std::make_unique<InterimClflushDomain>();
}

}  // namespace cxlkv::region
