// SPDX-License-Identifier: MIT
// Lock sets (uapi/cxlkv_ctrl.h "Lock sets") with real processes as nodes on
// one shm pool: exact counts with overlapping sets, kill -9 of a process
// holding a whole set and of one that holds part of its set and waits for
// the rest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/sync.hpp"
#include "pool/format.hpp"
#include "helper_pool.hpp"
#include "support/proc_util.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using proc_util::kill_and_reap;
using proc_util::spawn;
using proc_util::wait_within;

constexpr uint32_t kLocks = 5;  // lock_set_helper's locks: CXLKV_LOCK_FIRST_USER + 0..4

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/lock_set_helper";
}

// The pool and a running lock manager (node 0), stopped before the pool goes.
struct Pool : testpool::HelperPool {
  explicit Pool(const char* tag) : HelperPool(std::string("set-") + tag) {
    auto m = LockManager::create(*region);
    if (!m) throw std::runtime_error(m.error().message());
    mgr = std::move(m.value());
    mgr->start();
  }
  ~Pool() { mgr.reset(); }
  std::unique_ptr<LockManager> mgr;
};

// Counts lock_set_helper's ITERS mode adds to lock k for `node`.
uint64_t rotating_count(uint32_t node, long iters, uint32_t k) {
  uint64_t c = 0;
  for (long i = 0; i < iters; i++) c += k != (node + i) % kLocks;
  return c;
}

TEST(LockSetMultiproc, OverlappingSetsInBurstsCountExactlyWithKeptGrantsRevoked) {
  Pool p("count");
  const long iters = 300;
  std::vector<pid_t> kids;
  for (uint32_t n = 0; n < 3; n++)
    kids.push_back(spawn({helper(), p.uri, std::to_string(n), std::to_string(iters), "15"}));
  for (pid_t k : kids) EXPECT_EQ(wait_within(k, 60000ms, "a node taking its sets"), 0);
  p.mgr->stop();
  const auto st = p.mgr->stats();

  for (uint32_t k = 0; k < kLocks; k++) {
    uint64_t want = 0;
    for (uint32_t n = 0; n < 3; n++) want += rotating_count(n, iters, k);
    EXPECT_EQ(p.counter(k), want) << "counter of lock " << k;
  }
  EXPECT_GT(st.revokes, 0u) << "no kept grant was revoked";
}

TEST(LockSetMultiproc, KilledHolderOfAWholeSetIsPassedOver) {
  Pool p("kill-holder");
  int fd = -1;
  pid_t holder = spawn({helper(), p.uri, "0", "hold"}, &fd);
  char buf[8] = {};
  ASSERT_GT(read(fd, buf, sizeof buf - 1), 0) << "the holder did not report 'held'";
  close(fd);
  pid_t waiter = spawn({helper(), p.uri, "1", "full:5"});  // waits for all five
  std::this_thread::sleep_for(100ms);
  kill_and_reap(holder);

  // No `node evict`: the manager sees node 0's process gone and passes its set on.
  EXPECT_EQ(wait_within(waiter, 10000ms, "node 1 to get the set of killed node 0"), 0);
  const auto st = p.mgr->stats();
  for (uint32_t k = 0; k < kLocks; k++) EXPECT_EQ(p.counter(k), 1u + 5u) << "counter of lock " << k;
  EXPECT_GE(st.dead_holders, 1u);
}

TEST(LockSetMultiproc, KilledWaiterHoldingPartOfItsSetIsPassedOver) {
  // Node 0 (this process) holds lock 3; node 1 asks for all five, gets 0..2
  // and waits for 3 when it is killed.  Node 2 then asks for all five: it
  // must get the locks node 1 was granted and never released.
  Pool p("kill-waiter");
  NodeOptions no;
  no.node = 0;
  auto n0 = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n0.ok()) << n0.error().message();
  TwoTierLock l3(*n0.value(), CXLKV_LOCK_FIRST_USER + 3);
  ASSERT_TRUE(l3.try_lock_for(10s).ok());
  pid_t mid = spawn({helper(), p.uri, "1", "full:1"});
  // Until node 1 holds lock 2 (the grant names node 1), at most 10 s.
  const cxlkv_lock_grant* g2 = n0.value()->control().grant(CXLKV_LOCK_FIRST_USER + 2);
  const auto t0 = std::chrono::steady_clock::now();
  while (p.region->domain().read_fresh(g2).node != 1 && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(2ms);
  ASSERT_EQ(p.region->domain().read_fresh(g2).node, 1u) << "node 1 was never granted lock 2";
  kill_and_reap(mid);
  pid_t next = spawn({helper(), p.uri, "2", "full:5"});
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(l3.unlock().ok());

  EXPECT_EQ(wait_within(next, 10000ms, "node 2 to get the set past killed node 1"), 0);
  const auto st = p.mgr->stats();
  for (uint32_t k = 0; k < kLocks; k++) EXPECT_EQ(p.counter(k), 5u) << "counter of lock " << k;
  // Node 1's requests for locks 3 and 4 are dropped as dead, the one for 4
  // although it was not yet eligible (node 1 never held 3).
  EXPECT_GE(st.dead_waiters, 2u);
}

}  // namespace
}  // namespace cxlkv
