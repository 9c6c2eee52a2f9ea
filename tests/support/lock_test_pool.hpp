// SPDX-License-Identifier: MIT
// Test helper for the sync area: a freshly formatted shm pool (removed at
// the end) and, optionally, a NonCoherentSim over its mapping so each
// simulated node gets its own private write-back cache.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/alloc.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"

namespace cxlkv::testpool {

struct TestPool {
  explicit TestPool(const std::string& tag, uint64_t size = 64ull << 20, uint32_t max_nodes = 8) {
    name = "cxlkv-test-" + tag + "-" + std::to_string(getpid());
    uri = "shm:" + name + ":" + std::to_string(size >> 20) + "M";
    PoolFormatOptions o;
    o.max_nodes = max_nodes;
    o.max_locks = CXLKV_MIN_LOCKS;
    o.force = true;
    auto r = format_pool(uri, o);
    if (!r) throw std::runtime_error(r.error().message());
    region = std::move(r.value());
  }
  ~TestPool() {
    nodes.clear();
    for (auto& n : local_names) NodeContext::unlink_local(n);
    region.reset();
    sim.reset();
    ::shm_unlink(("/" + name).c_str());
  }
  // Give every simulated node (0..n-1) its own cache over the pool mapping.
  void simulate(uint32_t n, double evict_probability, uint64_t seed = 1) {
    sim = std::make_unique<NonCoherentSim>(region->base(), region->size(),
                                           NonCoherentSimOptions{n, evict_probability, seed});
  }
  MemoryDomain& domain(uint32_t i) { return sim ? sim->node(i) : region->domain(); }
  NodeContext& attach(uint32_t node, bool heartbeat = false) {
    NodeOptions o;
    o.node = node;
    o.heartbeat = heartbeat;
    o.heartbeat_ms = 20;
    auto r = NodeContext::attach(*region, domain(node), o);
    if (!r) throw std::runtime_error(r.error().message());
    local_names.push_back(r.value()->local_shm_name());
    nodes.push_back(std::move(r.value()));
    return *nodes.back();
  }
  std::string name, uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<NonCoherentSim> sim;
  std::vector<std::unique_ptr<NodeContext>> nodes;
  std::vector<std::string> local_names;
};

}  // namespace cxlkv::testpool
