// SPDX-License-Identifier: MIT
// The allocator's cross-host locks (ALLOC, REMOTE_FREE+node) wait no longer
// than the stripe locks do (CXLKV_LOCK_TIMEOUT_MS): a lock manager that
// died or never ran between two acquisitions of a node -- its stripe grants
// kept (sticky), the allocator's lock not -- makes a put fail within the
// bound with -ETIMEDOUT naming the pool and the allocator lock and saying
// "start cxlkvd", instead of hanging; nothing is left behind (no entry, no
// chunk), and a free that cannot get its lock is deferred, then done once
// a manager runs again, so no space is lost.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cxlkv/alloc.hpp"
#include "cxlkv/kv.hpp"
#include "pool/format.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
constexpr auto kBound = 1000ms;  // CXLKV_LOCK_TIMEOUT_MS of these tests

struct Pool {
  Pool() {
    setenv("CXLKV_LOCK_TIMEOUT_MS", "1000", 1);  // read when a heap or store opens
    uri = "shm:cxlkv-alloclt-" + std::to_string(getpid()) + ":64M";
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    start_manager();
  }
  ~Pool() {
    for (auto& n : nodes) {
      const std::string local = n->local_shm_name();
      n.reset();
      shm_unlink(("/" + local).c_str());
    }
    mgr.reset();
    region.reset();
    shm_unlink(("/cxlkv-alloclt-" + std::to_string(getpid())).c_str());
    unsetenv("CXLKV_LOCK_TIMEOUT_MS");
  }
  void start_manager() {
    mgr = std::move(LockManager::create(*region).value());
    mgr->start();
  }
  // A lock manager that goes away: its lease is freed, the grants nodes
  // keep (sticky) stay theirs; nothing else is ever granted.
  void stop_manager() { mgr.reset(); }
  NodeContext& attach(uint32_t node) {
    NodeOptions no;
    no.node = node;
    nodes.push_back(std::move(NodeContext::attach(*region, no).value()));
    return *nodes.back();
  }
  uint64_t free_chunks() { return ChunkAllocator::open(*nodes.front()).value().free_chunks(); }
  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::vector<std::unique_ptr<NodeContext>> nodes;
};

// fn() on a thread, given up to 60 s (a hang fails the test instead of
// blocking it: `unblock` then starts a manager so the call can return).
// Returns how long fn took.
std::chrono::steady_clock::duration bounded(const std::function<void()>& fn, const std::function<void()>& unblock) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] {
    fn();
    std::lock_guard<std::mutex> g(mu);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(mu);
  const bool in_time = cv.wait_for(lk, 60s, [&] { return done; });
  const auto took = std::chrono::steady_clock::now() - t0;
  lk.unlock();
  if (!in_time) {
    ADD_FAILURE() << "the call still waits after 60 s (the lock wait is unbounded)";
    unblock();
  }
  t.join();
  return took;
}

BlockKey key_of(uint64_t id) {
  std::vector<uint64_t> ids = {id};
  return keys_from_ids(ids)[0];
}

std::string why(const Error& e) { return e.message(); }

}  // namespace

// The case that hung: the node keeps the grants of its stripe locks (it
// looked the keys up while the manager ran) but never held ALLOC.
TEST(AllocLockTimeout, APutWhoseAllocatorLockNobodyGrantsFailsInTheBoundAndLeavesNothing) {
  Pool p;
  NodeContext& n1 = p.attach(1);
  auto s = open_kv_session(*p.region, n1);
  ASSERT_TRUE(s.ok()) << why(s.error());
  KvStore& kv = s.value()->store();
  std::vector<BlockKey> keys = {key_of(1), key_of(2), key_of(3)};
  std::vector<std::byte> buf(3 * 4096, std::byte{0x5a});
  std::vector<Chunk> chunks = {{buf.data(), 4096}, {buf.data() + 4096, 4096}, {buf.data() + 8192, 4096}};
  std::vector<uint32_t> nch(3, 1);
  std::vector<int32_t> st(3);
  std::vector<KvPin> pins(3);
  auto miss = kv.pin_many(keys, pins, st);  // takes (and keeps) the keys' stripe grants (a get would not)
  ASSERT_TRUE(miss.ok()) << why(miss.error());
  ASSERT_EQ(st[0], CXLKV_KV_MISS);
  const uint64_t free_before = p.free_chunks();

  p.stop_manager();
  Result<size_t> put = Error(-EINPROGRESS, "not run");
  auto took = bounded([&] { put = kv.put_chain(nullptr, keys, 4096, chunks, nch, st); }, [&] { p.start_manager(); });

  ASSERT_TRUE(put.ok()) << why(put.error());
  EXPECT_EQ(put.value(), 0u);
  EXPECT_EQ(st[0], -ETIMEDOUT);
  EXPECT_EQ(st[1], -ECANCELED);
  EXPECT_EQ(st[2], -ECANCELED);
  EXPECT_GE(took, kBound * 9 / 10) << "failed before the bound: not a lock wait";
  EXPECT_LT(took, kBound * 20) << "more than one bound per call";
  const std::string msg = kv.last_block_error();
  EXPECT_NE(msg.find("allocator lock (ALLOC)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pool " + p.uri), std::string::npos) << msg;
  EXPECT_NE(msg.find("start one: `cxlkvd --pool " + p.uri + "`"), std::string::npos) << msg;
  EXPECT_EQ(p.free_chunks(), free_before) << "a chunk was taken by a call that failed";
  EXPECT_EQ(kv.lookup(keys), 0u) << "an entry was left behind";

  // Nothing stuck: with a manager again the same put stores every block.
  p.start_manager();
  ASSERT_TRUE(kv.put_chain(nullptr, keys, 4096, chunks, nch, st).ok());
  EXPECT_EQ(st[0], CXLKV_KV_RESERVED) << kv.last_block_error();
  EXPECT_EQ(st[2], CXLKV_KV_RESERVED) << kv.last_block_error();
}

// The node heap alone: an allocation needing a chunk fails in the bound,
// and the bitmap is as it was.
TEST(AllocLockTimeout, ANodeHeapAllocationWithoutAManagerFailsInTheBound) {
  Pool p;
  NodeContext& n1 = p.attach(1);
  p.stop_manager();
  auto heap = NodeHeap::open(n1);
  ASSERT_TRUE(heap.ok());
  const uint64_t free_before = p.free_chunks();
  for (uint64_t bytes : {uint64_t{256}, uint64_t{8} << 20}) {  // a size class, then a run of whole chunks
    Result<uint64_t> r = Error(-EINPROGRESS, "not run");
    auto took = bounded([&] { r = heap.value()->alloc(bytes); }, [&] { p.start_manager(); });
    ASSERT_FALSE(r.ok()) << bytes;
    EXPECT_EQ(r.error().code(), -ETIMEDOUT) << why(r.error());
    EXPECT_GE(took, kBound * 9 / 10);
    EXPECT_NE(why(r.error()).find("allocator lock (ALLOC), allocating"), std::string::npos) << why(r.error());
    EXPECT_NE(why(r.error()).find("no lock manager holds the pool's lease"), std::string::npos) << why(r.error());
  }
  EXPECT_EQ(p.free_chunks(), free_before);
}

// Frees that need a global lock nobody grants (a run of whole chunks:
// ALLOC, held by another node) return within the bound, later ones at once;
// they are done when a manager runs again: no space is lost.
TEST(AllocLockTimeout, FreesWhoseLockIsOutOfReachAreDeferredAndDoneLater) {
  Pool p;
  NodeContext& n1 = p.attach(1);
  NodeContext& n2 = p.attach(2);
  auto h1 = NodeHeap::open(n1);
  auto h2 = NodeHeap::open(n2);
  ASSERT_TRUE(h1.ok() && h2.ok());
  const uint64_t free_at_start = p.free_chunks();
  auto a = h1.value()->alloc(8 << 20);
  auto b = h1.value()->alloc(8 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(h2.value()->alloc(8 << 20).ok());  // ALLOC's grant moves to node 2
  const uint64_t free_before = p.free_chunks();
  p.stop_manager();

  Result<void> fa = Error(-EINPROGRESS, "not run"), fb = fa;
  auto took = bounded([&] { fa = h1.value()->free(a.value()); }, [&] { p.start_manager(); });
  EXPECT_TRUE(fa.ok()) << why(fa.error());
  EXPECT_GE(took, kBound * 9 / 10);
  EXPECT_EQ(h1.value()->deferred_frees(), 1u);
  took = bounded([&] { fb = h1.value()->free(b.value()); }, [&] { p.start_manager(); });
  EXPECT_TRUE(fb.ok()) << why(fb.error());
  EXPECT_LT(took, kBound / 2) << "a free behind a deferred one waited a whole bound";
  EXPECT_EQ(h1.value()->deferred_frees(), 2u);
  EXPECT_EQ(p.free_chunks(), free_before);

  auto early = h1.value()->retry_deferred_frees(0ns);  // one try: still nobody grants
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code(), -ETIMEDOUT);
  EXPECT_NE(why(early.error()).find("allocator lock (ALLOC), freeing the run"), std::string::npos)
      << why(early.error());
  EXPECT_EQ(h1.value()->deferred_frees(), 2u) << "a deferred free was dropped";

  p.start_manager();
  auto done = h1.value()->retry_deferred_frees(std::chrono::seconds(30));
  ASSERT_TRUE(done.ok()) << why(done.error());
  EXPECT_EQ(done.value(), 2u);
  EXPECT_EQ(h1.value()->deferred_frees(), 0u);
  const uint64_t run = (free_at_start - free_before) / 3;
  EXPECT_EQ(p.free_chunks(), free_before + 2 * run) << "deferred frees did not give the space back";
}

// One convention for lock waits (util/lock_timeout.hpp): nanoseconds::max()
// waits as long as it takes, 0 tries once.  drain_if_posted(0) used to mean
// "wait forever" (it hung without a manager) and max() overflowed the
// deadline (it gave up at once).
TEST(AllocLockTimeout, DrainWithTimeoutZeroTriesOnceAndWithMaxWaitsForTheGrant) {
  Pool p;
  NodeContext& n1 = p.attach(1);
  NodeContext& n2 = p.attach(2);
  auto h1 = NodeHeap::open(n1);
  auto h2 = NodeHeap::open(n2);
  ASSERT_TRUE(h1.ok() && h2.ok());
  std::vector<uint64_t> offs;
  for (int i = 0; i < 4; i++) offs.push_back(h1.value()->alloc(256).value());
  ASSERT_TRUE(h2.value()->free(offs[0]).ok());  // a remote free: node 2 keeps REMOTE_FREE+1's grant
  ASSERT_EQ(h1.value()->remote_frees_posted(1), 1u);

  // With a manager, max(): node 1 waits for the grant to come back from node 2.
  Result<uint64_t> d = Error(-EINPROGRESS, "not run");
  bounded([&] { d = h1.value()->drain_if_posted(std::chrono::nanoseconds::max()); }, [] {});
  ASSERT_TRUE(d.ok()) << why(d.error());
  EXPECT_EQ(d.value(), 1u);
  EXPECT_EQ(h1.value()->remote_frees_posted(1), 0u);

  ASSERT_TRUE(h2.value()->free(offs[1]).ok());  // the grant goes back to node 2
  p.stop_manager();
  auto took = bounded([&] { d = h1.value()->drain_if_posted(0ns); }, [&] { p.start_manager(); });
  ASSERT_FALSE(d.ok()) << "drained without the lock's grant";
  EXPECT_EQ(d.error().code(), -ETIMEDOUT);
  EXPECT_LT(took, kBound / 2) << "0 waited instead of trying once";
  EXPECT_NE(why(d.error()).find("remote-free lock of node 1 (REMOTE_FREE+1)"), std::string::npos) << why(d.error());
  EXPECT_EQ(h1.value()->remote_frees_posted(1), 1u) << "the posted free was lost";
  p.start_manager();
  d = h1.value()->drain_if_posted(std::chrono::seconds(30));
  ASSERT_TRUE(d.ok()) << why(d.error());
  EXPECT_EQ(d.value(), 1u);
}

}  // namespace cxlkv
