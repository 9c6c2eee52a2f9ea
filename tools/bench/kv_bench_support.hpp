// SPDX-License-Identifier: MIT
// A formatted shm pool with a KvStore over the tests' in-process stand-ins
// for the index's cross-host dependencies (tests/support/: one process,
// mutex stripe locks, everyone alive, a first-fit payload range), for the
// kvstore benchmarks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "index/prefix_index.hpp"
#include "pool/format.hpp"
#include "support/kv_test_support.hpp"

namespace bench {

// The stand-ins of the tests (tests/support/kv_test_support.hpp): one
// process, so mutex stripe locks and everyone alive.
using LocalLocks = cxlkv::test::MutexStripeLocks;
using AllAlive = cxlkv::test::AllAlive;
using RangeSpace = cxlkv::test::RangeSpace;

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
    space = std::make_unique<RangeSpace>(kc->offset, kc->size, 4096);
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
