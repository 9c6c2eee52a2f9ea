// SPDX-License-Identifier: MIT
// Allocator and object store under NonCoherentSim: 4 simulated nodes with
// random evictions allocate, free locally and remotely, and publish roots.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cxlkv/objstore.hpp"
#include "lock_test_pool.hpp"

namespace cxlkv {
namespace {

using testpool::TestPool;

struct Harness {
  explicit Harness(const char* tag, uint32_t nodes, double evict) : p(tag) {
    p.simulate(nodes + 1, evict, 9);
    for (uint32_t n = 0; n < nodes; n++) ctx.push_back(&p.attach(n));
    LockManagerOptions mo;
    mo.node = nodes;
    auto m = LockManager::create(*p.region, p.domain(nodes), mo);
    if (!m) throw std::runtime_error(m.error().message());
    mgr = std::move(m.value());
    mgr->start();
  }
  ~Harness() { mgr->stop(); }
  TestPool p;
  std::vector<NodeContext*> ctx;
  std::unique_ptr<LockManager> mgr;
};

TEST(AllocSim, FourNodesNeverGetOverlappingBlocksAndRemoteFreesComeBack) {
  Harness h("alloc-sim", 4, 0.02);
  std::mutex mu;
  std::map<uint64_t, uint64_t> live;  // offset -> usable end, across all nodes
  std::vector<std::vector<uint64_t>> handoff(4);  // blocks freed by the next node
  bool overlap = false;
  std::vector<std::thread> ts;
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto heap = NodeHeap::open(*h.ctx[n]);
      ASSERT_TRUE(heap.ok()) << heap.error().message();
      std::mt19937_64 rng(n);
      std::vector<uint64_t> mine;
      for (int i = 0; i < 300; i++) {
        uint64_t sz = 64u << (rng() % 7);  // 64 B .. 4 KiB
        auto off = heap.value()->alloc(sz);
        ASSERT_TRUE(off.ok()) << off.error().message();
        uint64_t end = off.value() + heap.value()->usable_size(off.value()).value();
        {
          std::lock_guard<std::mutex> g(mu);
          auto it = live.upper_bound(off.value());
          if (it != live.end() && it->first < end) overlap = true;
          if (it != live.begin() && std::prev(it)->second > off.value()) overlap = true;
          live[off.value()] = end;
        }
        mine.push_back(off.value());
        if (rng() % 3 == 0 && !mine.empty()) {
          uint64_t victim = mine[rng() % mine.size()];
          mine.erase(std::find(mine.begin(), mine.end(), victim));
          {
            std::lock_guard<std::mutex> g(mu);
            live.erase(victim);
          }
          // Every other free goes to a neighbour: a remote free there.
          if (i % 2) {
            std::lock_guard<std::mutex> g(mu);
            handoff[(n + 1) % 4].push_back(victim);
          } else {
            ASSERT_TRUE(heap.value()->free(victim).ok());
          }
        }
        std::vector<uint64_t> theirs;
        {
          std::lock_guard<std::mutex> g(mu);
          theirs.swap(handoff[n]);
        }
        for (uint64_t o : theirs) {
          auto r = heap.value()->free(o);
          ASSERT_TRUE(r.ok()) << r.error().message();
        }
      }
    });
  }
  for (auto& t : ts) t.join();

  EXPECT_FALSE(overlap);
}

TEST(AllocSim, ExhaustionIsACleanEnospc) {
  Harness h("alloc-enospc", 1, 0.0);
  auto heap = NodeHeap::open(*h.ctx[0]);
  ASSERT_TRUE(heap.ok());
  uint64_t kv = h.p.region->carve(CXLKV_CARVE_KV).value().size;

  auto r = heap.value()->alloc(kv * 2);

  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOSPC);
}

TEST(ObjectStoreSim, RootsPutOnOneNodeAreSeenAndDestroyedFromOthers) {
  Harness h("objstore-sim", 4, 0.02);
  std::vector<std::thread> ts;
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto s = ObjectStore::open(*h.ctx[n]);
      ASSERT_TRUE(s.ok()) << s.error().message();
      for (int i = 0; i < 40; i++)
        ASSERT_TRUE(s.value().put("root-" + std::to_string(n) + "-" + std::to_string(i), 4096u * (n * 100 + i)).ok());
    });
  }
  for (auto& t : ts) t.join();
  ts.clear();
  std::atomic<int> wrong{0};
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto s = ObjectStore::open(*h.ctx[n]);
      uint32_t other = (n + 1) % 4;
      for (int i = 0; i < 40; i++) {
        auto v = s.value().get("root-" + std::to_string(other) + "-" + std::to_string(i));
        if (!v || v.value() != 4096u * (other * 100 + i)) wrong++;
      }
      for (int i = 0; i < 20; i++) (void)s.value().destroy("root-" + std::to_string(other) + "-" + std::to_string(i));
    });
  }
  for (auto& t : ts) t.join();
  auto s = ObjectStore::open(*h.ctx[0]);

  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s.value().get("root-2-5").error().code(), -ENOENT);
  EXPECT_EQ(s.value().get("root-2-25").value(), 4096u * (200 + 25));
  EXPECT_EQ(s.value().put(std::string(41, 'x'), 1).error().code(), -ENAMETOOLONG);
}

}  // namespace
}  // namespace cxlkv
