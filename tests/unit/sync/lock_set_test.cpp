// SPDX-License-Identifier: MIT
// LockSet: several locks of one node in one call (batches), under
// NonCoherentSim with random evictions, the manager on a node of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <thread>
#include <vector>

#include "support/lock_test_pool.hpp"
#include "support/proc_util.hpp"
#include "sync/testing.hpp"

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

namespace cxlkv {
namespace {

// Manager doorbell rounds (a node's seq moved) while `f` runs.
template <class F>
uint64_t doorbell_rounds(LockManager& m, F&& f) {
  const uint64_t before = m.stats().doorbells;
  f();
  return m.stats().doorbells - before;
}

TEST(LockSet, AWholeSetIsAskedForInOnePostAndKeptSetsReenterWithoutTheManager) {
  // uapi/cxlkv_ctrl.h "Lock sets": node 1 asks for all 6 locks node 0 keeps
  // in one doorbell post (one at a time would be 6), the manager revokes
  // node 0's six kept grants and grants node 1 the set in ascending order;
  // node 1 then keeps them and re-enters the set on node-local memory only.
  Sim s("lockset-onepost", 2);
  std::vector<uint32_t> ids;
  for (uint32_t k = 0; k < 6; k++) ids.push_back(kBase + 10 + 3 * k);
  LockSet a(*s.ctx[0]), b(*s.ctx[1]);
  ASSERT_TRUE(a.try_lock_for(ids, 10s).ok());
  ASSERT_TRUE(a.unlock().ok());  // node 0 keeps all six

  std::vector<uint32_t> order;
  const uint64_t posts = doorbell_rounds(*s.mgr, [&] {
    auto r = b.try_lock_for(ids, 10s);
    ASSERT_TRUE(r.ok()) << r.error().message();
    order.assign(b.held().begin(), b.held().end());
    ASSERT_TRUE(b.unlock().ok());  // node 1 keeps them now
  });
  const uint64_t again = doorbell_rounds(*s.mgr, [&] {
    ASSERT_TRUE(b.try_lock_for(ids, 10s).ok());
    ASSERT_TRUE(b.unlock().ok());
  });

  EXPECT_EQ(order, ids);
  EXPECT_GE(s.mgr->stats().revokes, 6u) << "node 0's kept grants were not revoked";
  // One post (a re-ring after a second of waiting on a loaded machine at most adds one).
  EXPECT_LE(posts, 2u) << "the set was not asked for in one doorbell post";
  EXPECT_EQ(again, 0u) << "re-entering a kept set went to the manager";
}

// The two hints of TwoTierLock, read without the local mutex.  kept (the
// index's optimistic reads choose by it, docs/coherence.md "Optimistic
// reads"): true only where this process's acquire is the sticky fast path
// -- not before a grant, not for another process of the node that kept it
// (its acquire must check that keeper), not once another node took the
// lock.  node_has_grant (PrefixIndex::lock_ahead skips by it): true where
// any process of the node keeps or holds the grant (no manager round trip
// to take it), false before a grant and once another node took the lock.
// Node 0's watcher releases a kept grant in the pool first and marks it
// idle in node-local memory just after (watcher.cpp), so node 1 may hold
// the lock a moment before node 0's hints turn false: they are waited for
// (bounded), and must turn.
TEST(LockSet, KeptIsTrueOnlyWhereThisProcessReentersAndNodeHasGrantWhereAnyProcessOfTheNodeCould) {
  Sim s("lockset-kept", 2);
  TwoTierLock a(*s.ctx[0], kBase + 7), b(*s.ctx[1], kBase + 7);
  auto turns_false = [](auto hint) {
    for (auto end = std::chrono::steady_clock::now() + 5s; hint() && std::chrono::steady_clock::now() < end;)
      std::this_thread::sleep_for(100us);
    return !hint();
  };
  EXPECT_FALSE(a.kept()) << "no grant yet";
  EXPECT_FALSE(a.node_has_grant()) << "no grant yet";
  ASSERT_TRUE(a.try_lock_for(10s).ok());
  EXPECT_TRUE(a.node_has_grant()) << "held by this process";
  ASSERT_TRUE(a.unlock().ok());
  EXPECT_TRUE(a.kept()) << "node 0 keeps the grant this process released";
  EXPECT_TRUE(a.node_has_grant()) << "kept by this process";
  const pid_t child = fork();
  if (child == 0) _exit((a.kept() ? 1 : 0) | (a.node_has_grant() ? 0 : 2));  // another process of node 0
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st)) << "status " << st;
  EXPECT_EQ(WEXITSTATUS(st) & 1, 0) << "another process of the node reads the grant as kept";
  EXPECT_EQ(WEXITSTATUS(st) & 2, 0) << "another process of the node does not see the node's grant";
  ASSERT_TRUE(b.try_lock_for(10s).ok());  // revokes node 0's kept grant
  EXPECT_TRUE(turns_false([&] { return a.node_has_grant(); })) << "node 1 holds the lock";
  EXPECT_TRUE(turns_false([&] { return a.kept(); })) << "node 1 holds the lock";
  ASSERT_TRUE(b.unlock().ok());
  EXPECT_FALSE(a.kept()) << "node 1 took the lock";
  EXPECT_FALSE(a.node_has_grant()) << "node 1 keeps the lock";
  EXPECT_TRUE(b.kept());
  EXPECT_TRUE(b.node_has_grant());
}

// A set of grants another live process of the node kept is re-entered
// without the manager, asking about their keeper once (acquire_set: one
// verdict per keeper after all the owner records; docs/locks.md "Lock
// sets"), where one lock at a time asked once per grant.  The sibling is
// forked before the test starts any thread (a fork while the lock
// manager's thread holds a mutex would leave the child waiting for it
// forever) and attaches as node 0 on its own once the parent sends it the
// pool's URI.
TEST(LockSet, GrantsAnotherLiveProcessOfTheNodeKeptAreReenteredWithOneVerdictForTheirKeeper) {
  std::vector<uint32_t> ids;
  for (uint32_t k = 0; k < 8; k++) ids.push_back(kBase + 40 + 5 * k);
  int down[2], up[2];  // parent -> sibling: the URI, then a byte once done; sibling -> parent: its answer
  ASSERT_EQ(pipe(down), 0);
  ASSERT_EQ(pipe(up), 0);
  const pid_t sibling = fork();
  ASSERT_GE(sibling, 0);
  if (sibling == 0) {
    // Another process of node 0: it re-enters the parent's grants and
    // keeps them, then lives on until the parent has re-entered them again
    // (or the parent's end of `down` closes).  'y': one verdict; 'c': more;
    // 'n': the set failed; no answer: the pool could not be attached.
    close(down[1]);
    close(up[0]);
    std::string uri;
    char ch;
    while (read(down[0], &ch, 1) == 1 && ch != '\n') uri += ch;
    auto r = Region::open(uri);
    if (!r) _exit(10);
    NodeOptions no;
    no.node = 0;
    auto n = NodeContext::attach(*r.value(), no);
    if (!n) _exit(11);
    LockSet theirs(*n.value());
    const uint64_t before = sync::testing::keeper_checks();
    const bool ok = theirs.try_lock_for(ids, 10s).ok() && theirs.unlock().ok();
    const char c = ok ? (sync::testing::keeper_checks() - before == 1 ? 'y' : 'c') : 'n';
    if (write(up[1], &c, 1) != 1) _exit(2);
    _exit(read(down[0], &ch, 1) == 1 ? 0 : 3);
  }
  close(down[0]);
  close(up[1]);
  // On every way out: the sibling's reads end (end of file), and it is reaped.
  struct Reap {
    pid_t pid;
    int fds[2];
    ~Reap() {
      for (int fd : fds) close(fd);
      proc_util::wait_within(pid, 30s, "the sibling process to exit");
    }
  } reap{sibling, {down[1], up[0]}};

  Sim s("lockset-sibling", 2);
  LockSet mine(*s.ctx[0]);
  ASSERT_TRUE(mine.try_lock_for(ids, 10s).ok());
  ASSERT_TRUE(mine.unlock().ok());  // node 0 keeps all eight (this process)
  const std::string line = s.p.uri + "\n";
  ASSERT_EQ(write(down[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
  char c = 0;
  ASSERT_EQ(read(up[0], &c, 1), 1) << "the sibling ended without answering";
  EXPECT_EQ(c, 'y') << "the sibling's set: 'n' failed, 'c' asked about its keeper more than once";
  const uint64_t grants = s.mgr->stats().grants;
  const uint64_t before = sync::testing::keeper_checks();
  auto r = mine.try_lock_for(ids, 10s);
  const uint64_t checks = sync::testing::keeper_checks() - before;
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
  if (r.ok()) {
    EXPECT_TRUE(mine.unlock().ok());
  }
  EXPECT_EQ(checks, 1u) << "eight grants of one live keeper: one verdict";
  EXPECT_EQ(s.mgr->stats().grants, grants) << "grants the node kept went to the manager";
  const char x = 'x';
  EXPECT_EQ(write(down[1], &x, 1), 1);
}

TEST(LockSet, SetsAndSingleLocksInBurstsUnderEvictionsCountExactly) {
  // Three nodes take overlapping sets of 3 of 4 locks in bursts (pauses
  // between bursts: grants are kept, entered again, asked for anew when the
  // set must first ask for a lower lock, and revoked), while a fourth node
  // takes lock 2 alone with TwoTierLock.  Under random evictions every
  // counter is exact in memory and nothing times out.
  constexpr uint32_t kNodes = 3, kLocks = 4;
  constexpr int kIters = 60;
  Sim s("lockset-burst", kNodes + 1, 0.05);
  auto kv = s.p.region->carve(CXLKV_CARVE_KV).value();
  auto* counters = s.p.region->at<uint64_t>(kv.offset);  // counter i on line i
  std::memset(counters, 0, kLocks * 64);
  std::atomic<int> timeouts{0};
  auto bump = [&](MemoryDomain& d, uint32_t id) {
    uint64_t* c = counters + (id - kBase) * 8;
    d.invalidate(c, 64);  // rule 4
    d.fence();
    const uint64_t v = d.read(c);
    std::this_thread::yield();
    d.write(c, v + 1);
    d.flush(c, 64);  // rule 3: in memory before the release
  };
  std::vector<std::thread> th;
  for (uint32_t n = 0; n < kNodes; n++)
    th.emplace_back([&, n] {
      MemoryDomain& d = s.ctx[n]->domain();
      LockSet set(*s.ctx[n]);
      for (int i = 0; i < kIters; i++) {
        std::vector<uint32_t> ids;
        for (uint32_t k = 0; k < kLocks; k++)
          if (k != (n + i) % kLocks) ids.push_back(kBase + k);
        if (!set.try_lock_for(ids, 20s).ok()) {
          timeouts++;
          continue;
        }
        for (uint32_t id : set.held()) bump(d, id);
        if (!set.unlock().ok()) ADD_FAILURE() << "unlock failed";
        if (i % 5 == 4) std::this_thread::sleep_for(std::chrono::microseconds(500 + 500 * ((i + n) % 3)));
      }
    });
  th.emplace_back([&] {
    MemoryDomain& d = s.ctx[kNodes]->domain();
    TwoTierLock l(*s.ctx[kNodes], kBase + 2);
    for (int i = 0; i < kIters; i++) {
      if (!l.try_lock_for(20s).ok()) {
        timeouts++;
        continue;
      }
      bump(d, kBase + 2);
      if (!l.unlock().ok()) ADD_FAILURE() << "unlock failed";
      if (i % 5 == 4) std::this_thread::sleep_for(1ms);
    }
  });
  for (auto& t : th) t.join();

  EXPECT_EQ(timeouts.load(), 0);
  for (uint32_t k = 0; k < kLocks; k++) {
    uint64_t v;
    std::memcpy(&v, counters + k * 8, 8);  // memory, not a node's cache
    uint64_t want = k == 2 ? kIters : 0;
    for (uint32_t n = 0; n < kNodes; n++)
      for (int i = 0; i < kIters; i++) want += k != (n + i) % kLocks;
    EXPECT_EQ(v, want) << "counter of lock " << k;
  }
  EXPECT_GT(s.mgr->stats().revokes, 0u) << "no kept grant was revoked: the run did not exercise revocation";
}

TEST(LockSet, GrantLinesPolledWithoutInvalidateAreCaught) {
  // The set's poll with its invalidations removed (test switch): node 0
  // reads lock 1's grant line once (held by node 1), keeps that stale copy
  // in its cache (no evictions; its watcher's periodic sweep, which reads
  // the lines of requested locks fresh, switched off), never sees its own
  // grant after node 1's release, and times out.  Restored, the same set is granted.
  Sim s("lockset-stale-grant", 2, 0.0);
  TwoTierLock other(*s.ctx[1], kBase + 1);
  ASSERT_TRUE(other.try_lock_for(10s).ok());
  LockSet set(*s.ctx[0]);
  const std::vector<uint32_t> ids{kBase, kBase + 1};
  sync::testing::set_break_set_grant_invalidate(true);
  sync::testing::set_watcher_no_resweep(true);  // node 0's watcher would refresh the line for it
  std::thread release([&] {
    std::this_thread::sleep_for(100ms);  // node 0 polls the stale grant meanwhile
    ASSERT_TRUE(other.unlock().ok());
  });
  auto broken = set.try_lock_for(ids, 600ms);
  const bool none_held = set.held().empty();  // all or nothing
  release.join();
  sync::testing::set_break_set_grant_invalidate(false);
  sync::testing::set_watcher_no_resweep(false);
  auto fixed = set.try_lock_for(ids, 10s);

  ASSERT_FALSE(broken.ok()) << "the set saw its grant although it never invalidated the grant line";
  EXPECT_EQ(broken.error().code(), -ETIMEDOUT);
  EXPECT_TRUE(none_held);
  ASSERT_TRUE(fixed.ok()) << fixed.error().message();
  EXPECT_TRUE(set.unlock().ok());
}

}  // namespace
}  // namespace cxlkv
