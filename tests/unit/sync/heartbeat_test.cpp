// SPDX-License-Identifier: MIT
// Node heartbeats and operator eviction (cxlkvctl node list / node evict).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/lock_test_pool.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using testpool::TestPool;

TEST(Heartbeat, AttachedNodeWithHeartbeatIsListedAlive) {
  TestPool p("hb-alive");
  p.attach(2, /*heartbeat=*/true);
  std::this_thread::sleep_for(60ms);

  auto nodes = list_nodes(*p.region, p.region->domain());

  ASSERT_GT(nodes.size(), 2u);
  EXPECT_EQ(nodes[2].state, CXLKV_NODE_ACTIVE);
  EXPECT_TRUE(nodes[2].alive);
  EXPECT_EQ(nodes[1].state, CXLKV_NODE_ABSENT);
}

TEST(Heartbeat, EvictRefusesALiveNodeWithoutForce) {
  TestPool p("hb-refuse");
  p.attach(1, true);

  auto r = evict_node(*p.region, p.region->domain(), 1, false);

  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EBUSY);
}

TEST(Heartbeat, EvictingAHolderLetsTheManagerGrantTheNextNode) {
  TestPool p("hb-evict");
  auto& a = p.attach(0);
  auto& b = p.attach(1);
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok());
  mgr.value()->start();
  // Node 0 "dies" holding the lock: a thread that takes it and ends (its
  // robust node-local mutex is then owner-died, as after a process death;
  // held by this thread it would still be on its robust list when node 0's
  // node-local memory is unmapped at the end of the test).
  std::thread([&] {
    TwoTierLock la(a, CXLKV_LOCK_FIRST_USER);
    ASSERT_TRUE(la.lock().ok());
  }).join();

  auto released = evict_node(*p.region, p.region->domain(), 0, /*force=*/true);
  TwoTierLock lb(b, CXLKV_LOCK_FIRST_USER);
  auto got = lb.try_lock_for(5s);

  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released.value(), 1u);
  EXPECT_TRUE(got.ok());
  EXPECT_EQ(list_nodes(*p.region, p.region->domain())[0].state, CXLKV_NODE_EVICTED);
  (void)lb.unlock();
  mgr.value()->stop();
}

}  // namespace
}  // namespace cxlkv
