// SPDX-License-Identifier: MIT
// LockSet: several locks of one node in one call (batches), under
// NonCoherentSim with random evictions, the manager on a node of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "lock_test_pool.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using testpool::TestPool;

constexpr uint32_t kBase = CXLKV_LOCK_FIRST_USER;

struct Sim {
  explicit Sim(const std::string& tag, uint32_t nodes, double evict = 0.02) : p(tag) {
    p.simulate(nodes + 1, evict, 11);
    for (uint32_t n = 0; n < nodes; n++) ctx.push_back(&p.attach(n));
    LockManagerOptions mo;
    mo.node = nodes;
    mo.lease_ms = 5000;
    auto m = LockManager::create(*p.region, p.domain(nodes), mo);
    if (!m) throw std::runtime_error(m.error().message());
    mgr = std::move(m.value());
    mgr->start();
  }
  ~Sim() { mgr->stop(); }
  TestPool p;
  std::vector<NodeContext*> ctx;
  std::unique_ptr<LockManager> mgr;
};

TEST(LockSet, TakesTheSetSortedWithoutDuplicatesAndReleasesAll) {
  Sim s("lockset-basic", 2);
  LockSet set(*s.ctx[0]);
  const uint32_t ids[] = {kBase + 5, kBase + 1, kBase + 5, kBase + 3};

  auto r = set.lock(ids);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const std::vector<uint32_t> held(set.held().begin(), set.held().end());
  EXPECT_EQ(held, (std::vector<uint32_t>{kBase + 1, kBase + 3, kBase + 5}));
  EXPECT_TRUE(set.holds(kBase + 3));
  EXPECT_FALSE(set.holds(kBase + 2));
  EXPECT_EQ(set.lock(ids).error().code(), -EBUSY) << "a second lock() on a holding set must be refused";

  // Node 1 cannot take a member while the set holds it, but can take a non-member.
  TwoTierLock member(*s.ctx[1], kBase + 3), other(*s.ctx[1], kBase + 2);
  EXPECT_EQ(member.try_lock_for(100ms).error().code(), -ETIMEDOUT);
  ASSERT_TRUE(other.try_lock_for(5s).ok());
  ASSERT_TRUE(other.unlock().ok());

  ASSERT_TRUE(set.unlock().ok());
  EXPECT_TRUE(set.held().empty());
  auto m = member.try_lock_for(5s);
  ASSERT_TRUE(m.ok()) << m.error().message();
  ASSERT_TRUE(member.unlock().ok());
  // Reusable after unlock.
  ASSERT_TRUE(set.lock(ids).ok());
  EXPECT_EQ(set.held().size(), 3u);
}

TEST(LockSet, IdOutOfRangeIsRejectedAndNothingIsHeld) {
  Sim s("lockset-range", 1);
  LockSet set(*s.ctx[0]);
  const uint32_t ids[] = {kBase, s.ctx[0]->control().max_locks()};

  auto r = set.lock(ids);

  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EINVAL);
  EXPECT_NE(r.error().message().find("out of range"), std::string::npos) << r.error().message();
  EXPECT_TRUE(set.held().empty());
  TwoTierLock l(*s.ctx[0], kBase);
  ASSERT_TRUE(l.try_lock_for(5s).ok()) << "lock " << kBase << " was left held by a failed set";
  ASSERT_TRUE(l.unlock().ok());
}

TEST(LockSet, TimeoutOnOneMemberReleasesTheOthers) {
  Sim s("lockset-timeout", 3);
  TwoTierLock blocker(*s.ctx[1], kBase + 2);
  ASSERT_TRUE(blocker.lock().ok());
  LockSet set(*s.ctx[0]);
  const uint32_t ids[] = {kBase + 1, kBase + 2, kBase + 3};

  auto r = set.try_lock_for(ids, 150ms);

  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ETIMEDOUT);
  EXPECT_TRUE(set.held().empty());
  // kBase + 1 was taken before the wait; it must be free again for node 2.
  TwoTierLock first(*s.ctx[2], kBase + 1);
  auto f = first.try_lock_for(5s);
  EXPECT_TRUE(f.ok()) << "member taken before the timeout was not released: " << (f ? "" : f.error().message());
  if (f) {
    ASSERT_TRUE(first.unlock().ok());
  }
  ASSERT_TRUE(blocker.unlock().ok());
}

TEST(LockSet, OverlappingSetsInOppositeOrdersNeverDeadlockAndCountExactly) {
  // Three nodes take overlapping sets of 3 of 4 locks, each naming them in a
  // different order, and increment one pool counter per lock (plain stores,
  // flushed before release).  Sorted acquisition: no deadlock (every try
  // succeeds within its bound); exclusion: every counter exact in memory.
  constexpr uint32_t kNodes = 3, kLocks = 4;
  constexpr int kIters = 60;
  Sim s("lockset-overlap", kNodes, 0.05);
  auto kv = s.p.region->carve(CXLKV_CARVE_KV).value();
  auto* counters = s.p.region->at<uint64_t>(kv.offset);  // counter i on line i
  std::memset(counters, 0, kLocks * 64);
  std::atomic<int> timeouts{0};
  std::vector<std::thread> th;
  for (uint32_t n = 0; n < kNodes; n++)
    th.emplace_back([&, n] {
      MemoryDomain& d = s.ctx[n]->domain();
      LockSet set(*s.ctx[n]);
      for (int i = 0; i < kIters; i++) {
        // Node n skips lock (n + i) % 4 and names the rest in descending or rotating order.
        std::vector<uint32_t> ids;
        for (uint32_t k = 0; k < kLocks; k++)
          if (k != (n + i) % kLocks) ids.push_back(kBase + (kLocks - 1 - ((k + n) % kLocks)));
        auto r = set.try_lock_for(ids, 20s);
        if (!r) {
          timeouts++;
          continue;
        }
        for (uint32_t id : set.held()) {
          uint64_t* c = counters + (id - kBase) * 8;
          d.invalidate(c, 64);  // rule 4: the last holder's value, not a stale line
          d.fence();
          const uint64_t v = d.read(c);
          std::this_thread::yield();
          d.write(c, v + 1);
          d.flush(c, 64);  // rule 3: in memory before the release
        }
        if (!set.unlock().ok()) ADD_FAILURE() << "unlock failed";
      }
    });
  for (auto& t : th) t.join();

  EXPECT_EQ(timeouts.load(), 0);
  uint64_t total = 0;
  for (uint32_t k = 0; k < kLocks; k++) {
    uint64_t v;
    std::memcpy(&v, counters + k * 8, 8);  // memory, not a node's cache
    total += v;
    EXPECT_EQ(v, kNodes * kIters - kIters * kNodes / kLocks) << "counter of lock " << k;
  }
  EXPECT_EQ(total, uint64_t(kNodes) * kIters * (kLocks - 1));
}

}  // namespace
}  // namespace cxlkv
