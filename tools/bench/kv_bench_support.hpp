// SPDX-License-Identifier: MIT
// In-process stand-ins for the index's cross-host dependencies, for the
// kvstore benchmarks (one process: mutex stripe locks, everyone alive, a
// first-fit payload range), and a formatted shm pool to run them on.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "index/prefix_index.hpp"
#include "pool/format.hpp"

namespace bench {

class LocalLocks final : public cxlkv::StripeLocks {
 public:
  cxlkv::Result<void> lock(uint32_t s) override {
    mu_[s % 4096].lock();
    return {};
  }
  void unlock(uint32_t s) override { mu_[s % 4096].unlock(); }

 private:
  std::mutex mu_[4096];
};

class AllAlive final : public cxlkv::NodeLiveness {
 public:
  bool alive(uint32_t, uint32_t) override { return true; }
  bool node_alive(uint32_t) override { return true; }
};

class RangeSpace final : public cxlkv::PayloadSpace {
 public:
  RangeSpace(uint64_t base, uint64_t size) { free_[base] = size; }
  cxlkv::Result<cxlkv::BlockLocation> alloc(uint64_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t need = (bytes + 4095) / 4096 * 4096;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      uint64_t off = it->first, left = it->second - need;
      free_.erase(it);
      if (left) free_[off + need] = left;
      used_[off] = need;
      return cxlkv::BlockLocation{off, static_cast<uint32_t>(bytes), 0, CXLKV_TIER_MEM};
    }
    return cxlkv::Error(-ENOSPC, "bench space full");
  }
  void free(const cxlkv::BlockLocation& loc) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = used_.find(loc.offset);
    if (it == used_.end()) return;
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

 private:
  std::mutex mu_;
  std::map<uint64_t, uint64_t> free_, used_;
};

// A standard-format shm pool (flush-mode domain) with a KvStore over it.
struct BenchPool {
  std::vector<std::unique_ptr<cxlkv::Region>> regions;
  std::vector<std::string> names;
  LocalLocks locks;
  AllAlive live;
  std::unique_ptr<RangeSpace> space;
  std::unique_ptr<cxlkv::KvStore> kv;
  std::string error;

  // ndev pools of `bytes` each; payload interleaved over them when ndev > 1.
  bool open(const std::string& what, uint64_t bytes, uint32_t ndev = 1, uint64_t index_entries = 0,
            uint64_t max_blocks = 0) {
    cxlkv::PoolFormatOptions fo;
    fo.force = true;
    fo.index_entries = index_entries;
    for (uint32_t d = 0; d < ndev; d++) {
      std::string name = shm_name(what + std::to_string(d));
      auto r = cxlkv::format_pool("shm:" + name + ":" + std::to_string(bytes >> 20) + "M", fo);
      if (!r) {
        error = r.error().message();
        return false;
      }
      names.push_back(name);
      regions.push_back(std::move(r.value()));
    }
    auto& r0 = *regions[0];
    auto ic = r0.carve(CXLKV_CARVE_INDEX);
    auto kc = r0.carve(CXLKV_CARVE_KV);
    if (!ic || !kc) {
      error = "no index/kv carve";
      return false;
    }
    cxlkv::IndexPolicy pol;
    pol.ndevices = static_cast<uint8_t>(ndev);
    pol.max_blocks = max_blocks;
    pol.interleave_stripe = 256 << 10;
    auto pr = cxlkv::index_set_policy(r0.domain(), r0.at(ic->offset), pol);
    if (!pr) {
      error = pr.error().message();
      return false;
    }
    space = std::make_unique<RangeSpace>(kc->offset, kc->size);
    cxlkv::KvDeps d;
    d.index_domain = &r0.domain();
    d.index_carve = r0.at(ic->offset);
    d.index_bytes = ic->size;
    d.node = 0;
    d.incarnation = 1;
    d.locks = &locks;
    d.liveness = &live;
    d.space = space.get();
    for (auto& r : regions) d.devices.push_back(cxlkv::PoolDevice{&r->domain(), r->base(), r->size()});
    auto kv_r = cxlkv::KvStore::create(std::move(d));
    if (!kv_r) {
      error = kv_r.error().message();
      return false;
    }
    kv = std::move(kv_r.value());
    return true;
  }
  ~BenchPool() {
    kv.reset();
    regions.clear();
    for (auto& n : names) shm_unlink(("/" + n).c_str());
  }
};

}  // namespace bench
