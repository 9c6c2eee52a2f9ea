// SPDX-License-Identifier: MIT
// Waiters and the lock manager back off (spin, then yield, then sleep) so
// that on a machine with fewer cores than pollers the manager still gets the
// CPU (docs/locks.md "The manager's sweeps and sleeps"), and their sleeps are not stretched by the timer slack.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/lock_test_pool.hpp"
#include "sync/backoff.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using testpool::TestPool;

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double wall_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(LockBackoff, SpinsThenYieldsThenSleeps) {
  sync::Backoff b(2, 3, 20us);
  int slept_before = 0;
  for (int i = 0; i < 5; i++) slept_before += b.idle();
  int slept_after = 0;
  for (int i = 0; i < 5; i++) slept_after += b.idle();

  EXPECT_EQ(slept_before, 0) << "slept during the spin or yield phase";
  EXPECT_EQ(slept_after, 5) << "did not sleep after spinning and yielding";
}

TEST(LockBackoff, SleepsRunWithOneNanosecondSlackAndTheThreadsSlackComesBack) {
  // A thread with the default 50 us slack would sleep ~52 us for 2 us.
  std::thread t([] {
    ASSERT_EQ(prctl(PR_SET_TIMERSLACK, 50000ul, 0, 0, 0), 0);
    long during = 0;
    {
      sync::Backoff b(0, 0, 2us);
      EXPECT_TRUE(b.idle());
      during = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    }
    const long after = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);

    EXPECT_EQ(during, 1);
    EXPECT_EQ(after, 50000);
  });
  t.join();
}

TEST(LockBackoff, WaiterWithoutAManagerSleepsInsteadOfSpinning) {
  // Nobody grants: the waiter polls for 300 ms.  Spinning would cost as
  // much CPU as wall time; backing off costs a fraction of it.
  TestPool p("lock-backoff-waiter");
  auto& n0 = p.attach(0);
  TwoTierLock l(n0, CXLKV_LOCK_FIRST_USER);
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_s();

  auto r = l.try_lock_for(300ms);

  const double cpu = thread_cpu_s() - c0, wall = wall_s(t0);
  std::printf("waiter: %.0f ms CPU in %.0f ms\n", cpu * 1e3, wall * 1e3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ETIMEDOUT);
  EXPECT_LT(cpu, 0.5 * wall) << "the waiter spins instead of sleeping";
}

TEST(LockBackoff, IdleManagerSleepsInsteadOfSpinning) {
  TestPool p("lock-backoff-manager");
  p.attach(0);
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  std::atomic<bool> stop{false};
  double cpu = 0, wall = 0;
  std::thread t([&] {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_s();
    auto r = mgr.value()->run(stop);
    cpu = thread_cpu_s() - c0;
    wall = wall_s(t0);
    EXPECT_TRUE(r.ok());
  });

  // The manager first takes the pool's lease (write, settle, check: it
  // sleeps there, not in its idle loop); on a loaded machine that can take
  // longer than the idle time below.  Wait for its first round (bounded).
  // After its last activity it spins a few rounds, then yields for
  // yield_rounds rounds (each yield gives the CPU to whatever else is
  // runnable: on a loaded machine 2000 of them take seconds), then sleeps.
  // (A manager whose nodes are all on its host and can wake it yields only
  // a few rounds, then sleeps until woken.)  Wait (bounded) until it has
  // slept once, then idle 300 ms more.
  for (int i = 0; i < 3000 && mgr.value()->stats().sleeps == 0; i++) std::this_thread::sleep_for(10ms);
  ASSERT_GT(mgr.value()->stats().sleeps, 0u) << "lock manager did not reach its sleep phase within 30 s";
  std::this_thread::sleep_for(300ms);
  stop = true;
  t.join();

  std::printf("idle manager: %.0f ms CPU in %.0f ms, %lu rounds, %lu doorbells, %lu sleeps\n", cpu * 1e3, wall * 1e3, (unsigned long)mgr.value()->stats().rounds, (unsigned long)mgr.value()->stats().doorbells,
              static_cast<unsigned long>(mgr.value()->stats().sleeps));
  EXPECT_GT(mgr.value()->stats().sleeps, 0u);
  EXPECT_LT(cpu, 0.5 * wall) << "the idle manager spins instead of sleeping";
}

TEST(LockBackoff, IdleManagerIsWokenByTheRequestsOfNodesOnItsHost) {
  // Two nodes of this host take a lock in turn, each time only after the
  // manager has gone to sleep again: a request (and a revocation's answer)
  // ends the manager's sleep by a wake, not by its time bound.
  TestPool p("lock-backoff-wake");
  NodeContext* n[2] = {&p.attach(0), &p.attach(1)};
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  auto wait_for_sleep = [&] {
    const uint64_t s0 = mgr.value()->stats().sleeps;
    for (int i = 0; i < 3000 && mgr.value()->stats().sleeps == s0; i++) std::this_thread::sleep_for(1ms);
  };
  for (int i = 0; i < 10; i++) {
    wait_for_sleep();
    TwoTierLock l(*n[i % 2], CXLKV_LOCK_FIRST_USER);
    auto r = l.try_lock_for(10s);
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_TRUE(l.unlock().ok());
  }
  const LockManagerStats st = mgr.value()->stats();
  mgr.value()->stop();
  std::printf("manager: %lu sleeps, %lu ended by a wake, %lu grants, %lu revocations\n", (unsigned long)st.sleeps,
              (unsigned long)st.wakeups, (unsigned long)st.grants, (unsigned long)st.revokes);
  EXPECT_GE(st.grants, 10u);
  // Each request finds the manager asleep; one may land between two sleeps
  // (seen by the manager's check after arming): most, not all, are wakes.
  // A lost wake would show as none (every sleep ending at its 2 ms bound).
  EXPECT_GE(st.wakeups, 5u) << "requests of nodes on the manager's host did not wake it";
}

}  // namespace
}  // namespace cxlkv
