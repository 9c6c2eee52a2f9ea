// SPDX-License-Identifier: MIT
// The batch calls' line cache (index/stripe_lock_set.hpp; docs/api.md "How a batch reads the index"): a StripeLockSet
// reads the lines it holds once, in one invalidation sweep with one fence
// after taking its locks, and serves later reads from its copy until it
// releases.  Each node runs on its own NonCoherentSim domain (a private
// write-back cache of 64 B lines), so a line a node cached before another
// node changed it stays stale until the node invalidates it.
#include <gtest/gtest.h>

#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

// Node 1 caches the key's home line as EMPTY (a miss), then node 0 publishes
// the block: node 1's private cache now holds a stale line.
struct StaleLine {
  SimPool p{2};
  std::unique_ptr<KvStore> a = p.store(0), b = p.store(1);
  std::vector<BlockKey> c = chain(301, 1);
  StaleLine() {
    EXPECT_EQ(b->lookup(c), 0u);
    EXPECT_TRUE(put(*a, c, 0).ok());
  }
  int32_t pin_status() {
    std::vector<PinnedBlock> out(1);
    std::vector<int32_t> st(1, 99);
    auto n = store_index(*b).pin_many(c, out, st);
    EXPECT_TRUE(n.ok());
    if (st[0] == kBlockReserved) {
      std::vector<uint32_t> slots{out[0].slot};
      std::vector<int32_t> ust(1);
      EXPECT_TRUE(store_index(*b).unpin_many(slots, c, ust).ok());
    }
    return st[0];
  }
};

}  // namespace

TEST(IndexLineCache, TheLockSetSweepSeesWhatAnotherNodeWroteAfterThisNodeCachedTheLine) {
  StaleLine s;
  EXPECT_EQ(s.pin_status(), kBlockReserved) << "the sweep invalidated node 1's stale copy: the block is READY";
}

TEST(IndexLineCache, TheCopyDiesWithTheHoldAndWritesReachOtherNodes) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(302, 3);
  // A chain reserved and published in two batch calls: the entry writes of
  // each call are fenced once, at its release; the other node sees them all.
  std::vector<Reservation> res(3);
  std::vector<int32_t> st(3, 99);
  auto n = store_index(*a).reserve_chain(nullptr, c, 4096, res, st);
  ASSERT_TRUE(n.ok() && n.value() == 3u);
  std::vector<uint32_t> slots{res[0].slot, res[1].slot, res[2].slot};
  auto pub = store_index(*a).publish_many(slots, c, st);
  ASSERT_TRUE(pub.ok() && pub.value() == 3u);
  EXPECT_EQ(b->lookup(c), 3u);
  for (uint32_t sl : slots) EXPECT_EQ(store_index(*b).entry(sl).state, uint32_t(CXLKV_ENTRY_READY));
  // Node 1 pins block 2 (its set caches the line READY), unpins; node 0
  // removes the block; node 1's next call reads memory again: a miss.
  std::vector<PinnedBlock> pins(1);
  std::vector<int32_t> ps(1, 99);
  ASSERT_TRUE(store_index(*b).pin_many(std::span(c).subspan(2), pins, ps).ok());
  ASSERT_EQ(ps[0], kBlockReserved);
  std::vector<uint32_t> ps_slots{pins[0].slot};
  ASSERT_TRUE(store_index(*b).unpin_many(ps_slots, std::span(c).subspan(2), ps).ok());
  ASSERT_TRUE(store_index(*a).remove(c[2]).ok());
  ps[0] = 99;
  ASSERT_TRUE(store_index(*b).pin_many(std::span(c).subspan(2), pins, ps).ok());
  EXPECT_EQ(ps[0], kBlockMiss) << "a cached line never outlives the hold that read it";
  EXPECT_EQ(b->lookup(c), 2u);
}

// A probe that runs past the lines of the first sweep (keys sharing a home
// slot) gets the rest of its lines in later sweeps of the same hold
// (PrefixIndex::prefetch_probes, StripeLockSet::prefetch): those are invalidated
// and read fresh too.  Node 1 caches the lines as EMPTY, node 0 fills them;
// a later sweep that served node 1's stale copies would hand node 1 an
// occupied slot as free and overwrite node 0's blocks.
TEST(IndexLineCache, ProbesPastTheFirstSweepReadTheirLinesFreshInTheNextSweeps) {
  SimPool p(2, 0.05);  // random evictions
  auto a = p.store(0), b = p.store(1);
  const uint32_t ns = store_index(*a).header().nstripes, ss = store_index(*a).header().stripe_slots;
  auto key = [&](uint64_t j, uint32_t stripe, uint32_t home) {
    return BlockKey{home + uint64_t(ss) * (j + 1), stripe + uint64_t(ns) * (j + 1)};
  };
  // A chain whose keys after the first have home slot 10 of stripe 1 (the
  // first is elsewhere: reserve_chain's lock-free look at the chain's first
  // uncached block reads its probe fresh before any lock is taken).
  std::vector<BlockKey> mine(4);
  mine[0] = key(100, 2, 5);
  for (size_t j = 1; j < mine.size(); j++) mine[j] = key(100 + j, 1, 10);
  for (uint32_t home = 10; home < 20; home++) {  // node 1 now caches slots 10..19 as EMPTY (misses)
    std::vector<BlockKey> probe{key(200 + home, 1, home)};
    EXPECT_EQ(b->lookup(probe), 0u);
  }
  std::vector<std::vector<BlockKey>> theirs;
  for (uint64_t j = 0; j < 6; j++) {  // node 0: six roots with the same home
    theirs.push_back({key(j, 1, 10)});
    ASSERT_TRUE(put(*a, theirs.back(), 0).ok());
  }
  std::vector<Reservation> res(mine.size());
  std::vector<int32_t> st(mine.size(), 99);
  auto n = store_index(*b).reserve_chain(nullptr, mine, 4096, res, st);
  ASSERT_TRUE(n.ok()) << n.error().message();
  ASSERT_EQ(n.value(), mine.size());
  std::vector<uint32_t> slots;
  for (auto& r : res) slots.push_back(r.slot);
  auto pub = store_index(*b).publish_many(slots, mine, st);
  ASSERT_TRUE(pub.ok() && pub.value() == mine.size());
  for (auto& k : theirs) EXPECT_EQ(a->lookup(k), 1u) << "node 0's block " << to_hex(k[0]) << " was overwritten";
  EXPECT_EQ(a->lookup(mine), mine.size());
  std::string problem;
  EXPECT_EQ(store_index(*a).audit_lists(&problem), 0u) << problem;
}
