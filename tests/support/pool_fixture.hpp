// SPDX-License-Identifier: MIT
// The pools the C++ tests build, in one place (docs/testing.md "Unit tests
// and NonCoherentSim"):
//
//   AlignedPool  zeroed, 4 KiB aligned memory standing in for a pool's bytes,
//                for tests that lay out what they need in it themselves (the
//                index carve of index_sim_pool.hpp, the near-memory pools of
//                pnm_test_support.hpp).
//   ShmPool      a standard pool formatted in /dev/shm for this test and
//                removed at the end, nodes attached on demand, each through
//                the pool's own domain or its own NonCoherentSim cache (the
//                sync tests' TestPool, the RPC tests' RpcPool).
//
// What stays with each test area, on purpose: the index's SimPool has no
// superblock and stands in for the lock manager, liveness and allocator
// (index protocol tests run without the sync layer); the near-memory
// SharedPool opens one Region per simulated host over its memory (a
// near-memory context is opened through a host's Region); RpcPool carries
// the rpc carve by default.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"

namespace cxlkv::test {

// 4 KiB aligned zeroed memory standing in for a pool.
struct AlignedPool {
  explicit AlignedPool(size_t n) : bytes(n) {
    mem = static_cast<std::byte*>(std::aligned_alloc(4096, n));
    std::memset(mem, 0, n);
  }
  ~AlignedPool() { std::free(mem); }
  AlignedPool(AlignedPool&& o) noexcept : mem(std::exchange(o.mem, nullptr)), bytes(o.bytes) {}
  AlignedPool(const AlignedPool&) = delete;
  AlignedPool& operator=(const AlignedPool&) = delete;
  std::byte* mem;
  size_t bytes;
};

// A standard pool (format_pool) named cxlkv-test-TAG-PID in /dev/shm, with
// the fewest locks a pool may have; `extra_carves` are made beside the
// standard ones.  Removed, with the node-local files of the nodes attached
// through it, when it goes.
struct ShmPool {
  explicit ShmPool(const std::string& tag, uint64_t size = 64ull << 20, uint32_t max_nodes = 8,
                   std::vector<std::pair<std::string, uint64_t>> extra_carves = {}) {
    name = "cxlkv-test-" + tag + "-" + std::to_string(getpid());
    uri = "shm:" + name + ":" + std::to_string(size >> 20) + "M";
    PoolFormatOptions o;
    o.max_nodes = max_nodes;
    o.max_locks = CXLKV_MIN_LOCKS;
    o.force = true;
    o.extra_carves = std::move(extra_carves);
    auto r = format_pool(uri, o);
    if (!r) throw std::runtime_error(r.error().message());
    region = std::move(r.value());
  }
  ~ShmPool() {
    nodes.clear();
    for (auto& n : local_names) NodeContext::unlink_local(n);
    region.reset();
    sim.reset();
    ::shm_unlink(("/" + name).c_str());
  }
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;
  // Give every simulated node (0..n-1) its own cache over the pool mapping.
  void simulate(uint32_t n, double evict_probability, uint64_t seed = 1) {
    simulate(n, NonCoherentSimOptions{n, evict_probability, seed});
  }
  void simulate(uint32_t n, NonCoherentSimOptions o) {
    o.nodes = n;
    sim = std::make_unique<NonCoherentSim>(region->base(), region->size(), o);
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

}  // namespace cxlkv::test
