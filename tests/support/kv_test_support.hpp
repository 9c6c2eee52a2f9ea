// SPDX-License-Identifier: MIT
// In-process stand-ins for the index's dependencies, so index protocol tests
// can run many simulated nodes (NonCoherentSim domains) in threads of one
// process: stripe locks as mutexes, a liveness table the test flips (or
// everyone alive), and a first-fit payload space over a range of the
// simulated pool.  The kvstore benchmarks run on the same stand-ins
// (tools/bench/kv_bench_support.hpp).
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "index/prefix_index.hpp"
#include "support/pool_fixture.hpp"  // AlignedPool

namespace cxlkv::test {

// Stripes past n share mutexes (s mod n): coarser, still exclusive.
class MutexStripeLocks final : public StripeLocks {
 public:
  explicit MutexStripeLocks(uint32_t n = 4096) : mu_(n) {}
  Result<void> lock(uint32_t s) override {
    mu_[s % mu_.size()].lock();
    return {};
  }
  void unlock(uint32_t s) override { mu_[s % mu_.size()].unlock(); }

 private:
  std::vector<std::mutex> mu_;
};

class TableLiveness final : public NodeLiveness {
 public:
  bool alive(uint32_t node, uint32_t inc) override {
    std::lock_guard<std::mutex> lk(mu_);
    return !dead_.count(node) && (!inc_.count(node) || inc_[node] == inc);
  }
  bool node_alive(uint32_t node) override {
    std::lock_guard<std::mutex> lk(mu_);
    return !dead_.count(node);
  }
  void kill(uint32_t node) {
    std::lock_guard<std::mutex> lk(mu_);
    dead_.insert(node);
  }
  void set_incarnation(uint32_t node, uint32_t inc) {
    std::lock_guard<std::mutex> lk(mu_);
    inc_[node] = inc;
    dead_.erase(node);
  }

 private:
  std::mutex mu_;
  std::set<uint32_t> dead_;
  std::map<uint32_t, uint32_t> inc_;
};

// Every node alive, with no lock taken (a benchmark's single process).
class AllAlive final : public NodeLiveness {
 public:
  bool alive(uint32_t, uint32_t) override { return true; }
  bool node_alive(uint32_t) override { return true; }
};

// First-fit allocator over [base, base+size) of device 0, in granules of
// `granule` bytes (64 for the tests; the benchmarks take 4 KiB, a page per
// block start as the pool's allocator gives).
class RangeSpace final : public PayloadSpace {
 public:
  RangeSpace(uint64_t base, uint64_t size, uint64_t granule = 64) : granule_(granule) { free_[base] = size; }
  Result<BlockLocation> alloc(uint64_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t need = (bytes + granule_ - 1) / granule_ * granule_;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      uint64_t off = it->first, left = it->second - need;
      free_.erase(it);
      if (left) free_[off + need] = left;
      used_[off] = need;
      return BlockLocation{off, static_cast<uint32_t>(bytes), 0, CXLKV_TIER_MEM};
    }
    return Error(-ENOSPC, "test space full");
  }
  void free(const BlockLocation& loc) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = used_.find(loc.offset);
    if (it == used_.end()) {
      double_frees++;
      return;
    }
    uint64_t off = it->first, len = it->second;
    used_.erase(it);
    auto nx = free_.lower_bound(off);
    if (nx != free_.end() && off + len == nx->first) {
      len += nx->second;
      free_.erase(nx);
    }
    auto pv = free_.lower_bound(off);
    if (pv != free_.begin()) {
      --pv;
      if (pv->first + pv->second == off) {
        pv->second += len;
        return;
      }
    }
    free_[off] = len;
  }
  size_t in_use() {
    std::lock_guard<std::mutex> lk(mu_);
    return used_.size();
  }
  uint64_t double_frees = 0;

 private:
  uint64_t granule_;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> free_, used_;
};

// Deterministic payload bytes of a block: what a test writes and expects.
inline void fill_block(const BlockKey& k, std::byte* p, size_t n) {
  uint64_t x = k.lo ^ (k.hi << 1);
  for (size_t i = 0; i < n; i += 8) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    size_t m = std::min<size_t>(8, n - i);
    std::memcpy(p + i, &x, m);
  }
}

}  // namespace cxlkv::test
