// SPDX-License-Identifier: MIT
// Prefix index protocol: visibility, prefix closure, eviction, crash
// recovery and bad input, with every node on its own NonCoherentSim domain.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

TEST(PrefixIndex, UnformattedCarveIsRefusedWithAMessage) {
  AlignedPool pool(kPoolBytes);
  NonCoherentSim sim(pool.mem, pool.bytes, NonCoherentSimOptions{1, 0, 1});
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace space(kIndexBytes, 1 << 20);
  auto ix = PrefixIndex::attach(sim.node(0), pool.mem, kIndexBytes, 0, 1, locks, live, space);
  ASSERT_FALSE(ix.ok());
  EXPECT_EQ(ix.error().code(), -ENODATA);
  EXPECT_NE(ix.error().message().find("not formatted"), std::string::npos) << ix.error().message();
}

TEST(PrefixIndex, PublishedChainIsFoundByBinaryAndLinearSearch) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(1, 150);
  for (size_t i = 0; i < 100; i++) ASSERT_TRUE(put(*a, c, i).ok()) << i;
  EXPECT_EQ(b->lookup(c), 100u);
  EXPECT_EQ(b->lookup_linear(c), 100u);
  EXPECT_EQ(b->lookup(std::span(c).first(37)), 37u);
  EXPECT_EQ(b->lookup(chain(2, 10)), 0u);
  EXPECT_TRUE(fetch_ok(*b, c[99]));
}

TEST(PrefixIndex, BinarySearchProbesLogarithmicallyMany) {
  SimPool p(1, 0.0, [] {
    IndexFormatOptions o;
    o.stripe_slots = 1024;
    o.max_stripes = 8;
    return o;
  }());
  auto a = p.store(0);
  auto c = chain(3, 1024);
  for (size_t i = 0; i < 700; i++) ASSERT_TRUE(put(*a, c, i, 64).ok()) << i;
  uint64_t before = store_index(*a).probes();
  EXPECT_EQ(store_index(*a).longest_prefix(c), 700u);
  uint64_t binary = store_index(*a).probes() - before;
  before = store_index(*a).probes();
  EXPECT_EQ(store_index(*a).longest_prefix_linear(c), 700u);
  uint64_t linear = store_index(*a).probes() - before;
  EXPECT_LE(binary, 11u * 4) << "about log2(1024) lookups of a few probes each";
  EXPECT_GE(linear, 700u);
}

TEST(PrefixIndex, ReservedBlockIsInvisibleAndNeverReservedTwice) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(4, 1);
  auto ra = a->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(ra.ok() && ra->reserved());
  EXPECT_EQ(b->lookup(c), 0u) << "a WRITING block is not a hit";
  EXPECT_FALSE(b->pin(c[0]).ok());
  auto rb = b->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->status, 2u) << "busy: another node writes it";
  std::vector<std::byte> buf(4096);
  fill_block(c[0], buf.data(), buf.size());
  Chunk ch{buf.data(), buf.size()};
  ASSERT_TRUE(a->write(*ra, {&ch, 1}).ok());
  ASSERT_TRUE(a->publish(*ra).ok());
  auto rb2 = b->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(rb2.ok());
  EXPECT_EQ(rb2->status, 1u) << "exists_ready after publish";
  EXPECT_TRUE(fetch_ok(*b, c[0]));
}

TEST(PrefixIndex, ChildIsPublishedOnlyAfterItsParent) {
  SimPool p(1);
  auto a = p.store(0);
  auto c = chain(5, 2);
  auto r0 = a->reserve(c[0], nullptr, 64);
  auto r1 = a->reserve(c[1], &c[0], 64);
  ASSERT_TRUE(r0.ok() && r1.ok());
  auto pub = a->publish(*r1);
  ASSERT_FALSE(pub.ok());
  EXPECT_EQ(pub.error().code(), -EAGAIN);
  EXPECT_TRUE(a->publish(*r0).ok());
  EXPECT_TRUE(a->publish(*r1).ok());
  EXPECT_EQ(a->lookup(c), 2u);
}

TEST(PrefixIndex, ReserveNeedsACachedParent) {
  SimPool p(1);
  auto a = p.store(0);
  auto c = chain(6, 2);
  auto r = a->reserve(c[1], &c[0], 64);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOENT);
}

TEST(PrefixIndex, BadKeysAndLengthsAreRejected) {
  SimPool p(1);
  auto a = p.store(0);
  BlockKey zero{};
  auto c = chain(7, 1);
  EXPECT_EQ(a->reserve(zero, nullptr, 64).error().code(), -EINVAL);
  EXPECT_EQ(a->reserve(c[0], nullptr, 0).error().code(), -EINVAL);
  EXPECT_EQ(a->reserve(c[0], &zero, 64).error().code(), -EINVAL);
  EXPECT_EQ(a->reserve(c[0], &c[0], 64).error().code(), -EINVAL);
  EXPECT_EQ(a->reserve(c[0], nullptr, uint64_t(1) << 33).error().code(), -EINVAL);
  EXPECT_FALSE(a->pin(zero).ok());
  EXPECT_EQ(a->lookup(std::span<const BlockKey>()), 0u);
  // A chunk list that does not add up to the block is refused, nothing published.
  auto r = a->reserve(c[0], nullptr, 128);
  ASSERT_TRUE(r.ok());
  std::vector<std::byte> buf(64);
  Chunk ch{buf.data(), buf.size()};
  EXPECT_EQ(a->write(*r, {&ch, 1}).error().code(), -EINVAL);
  EXPECT_TRUE(a->abort(*r).ok());
  EXPECT_EQ(a->lookup(c), 0u);
  // A foreign slot number cannot be published or unpinned.
  KvReservation fake = *r;
  EXPECT_FALSE(a->publish(fake).ok());
  KvPin fp;
  fp.key = c[0];
  fp.slot = 3;
  EXPECT_FALSE(a->unpin(fp).ok());
}

TEST(PrefixIndex, DamagedEntryLineIsSkippedNotTrusted) {
  SimPool p(1);
  auto a = p.store(0);
  auto c = chain(8, 1);
  ASSERT_TRUE(put(*a, c, 0).ok());
  uint32_t slot = store_index(*a).find_ready(c[0]);
  ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
  // Corrupt one byte of the entry behind the protocol's back.
  auto* e = reinterpret_cast<cxlkv_index_entry*>(p.pool.mem + store_index(*a).header().entry_off + slot * 64ull);
  uint8_t bad = 0x5a;
  p.sim.node(0).store_nt(reinterpret_cast<std::byte*>(e) + 20, &bad, 1);
  EXPECT_EQ(a->lookup(c), 0u) << "a line whose checksum fails is not a hit";
}

TEST(PrefixIndex, EvictionTakesOnlyUnpinnedLeaves) {
  IndexFormatOptions o = SimPool::small_index();
  o.max_stripes = 1;  // one stripe: a deterministic capacity of max_blocks
  o.max_blocks = 4;
  SimPool p(1, 0.0, o);
  auto a = p.store(0);
  auto c = chain(9, 4);
  for (size_t i = 0; i < 4; i++) ASSERT_TRUE(put(*a, c, i).ok());
  auto pin = a->pin(c[3]);  // the only leaf is pinned
  ASSERT_TRUE(pin.ok());
  auto d = chain(10, 1);
  auto r = a->reserve(d[0], nullptr, 4096);
  ASSERT_FALSE(r.ok()) << "inner blocks have cached children, the leaf is pinned";
  EXPECT_EQ(r.error().code(), -ENOSPC);
  EXPECT_NE(r.error().message().find("no space"), std::string::npos) << r.error().message();
  EXPECT_EQ(a->lookup(c), 4u) << "nothing lost on ENOSPC";
  ASSERT_TRUE(a->unpin(*pin).ok());
  ASSERT_TRUE(put(*a, d, 0).ok());
  EXPECT_EQ(a->lookup(c), 3u) << "the leaf went, the prefix stays";
  EXPECT_TRUE(fetch_ok(*a, c[2]));
  EXPECT_EQ(store_index(*a).counters().evictions, 1u);
}

TEST(PrefixIndex, LeastRecentlyUsedLeafIsEvictedFirst) {
  IndexFormatOptions o = SimPool::small_index();
  o.max_stripes = 1;
  o.max_blocks = 3;
  SimPool p(1, 0.0, o);
  auto a = p.store(0);
  auto x = chain(11, 1), y = chain(12, 1), z = chain(13, 1);
  ASSERT_TRUE(put(*a, x, 0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(put(*a, y, 0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(fetch_ok(*a, x[0]));  // x used again: y is now the oldest
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(put(*a, z, 0).ok());
  auto w = chain(14, 1);
  ASSERT_TRUE(put(*a, w, 0).ok());
  EXPECT_EQ(a->lookup(x), 1u);
  EXPECT_EQ(a->lookup(y), 0u);
  EXPECT_EQ(a->lookup(z), 1u);
}

TEST(PrefixIndex, DeadWritersBlocksAreNeverVisibleAndAreReclaimed) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(15, 3);
  ASSERT_TRUE(put(*a, c, 0).ok());
  auto r1 = a->reserve(c[1], &c[0], 4096);
  auto r2 = a->reserve(c[2], &c[1], 4096);
  ASSERT_TRUE(r1.ok() && r2.ok());
  p.sim.drop_all(0);
  p.live.kill(0);  // node 0 dies mid-write
  EXPECT_EQ(b->lookup(c), 1u);
  auto reclaimed = b->reclaim_dead();
  ASSERT_TRUE(reclaimed.ok());
  EXPECT_EQ(reclaimed.value(), 2u);
  EXPECT_EQ(p.space.in_use(), 1u) << "payload of the two abandoned blocks freed";
  ASSERT_TRUE(put(*b, c, 1).ok()) << "another node writes them now";
  ASSERT_TRUE(put(*b, c, 2).ok());
  EXPECT_EQ(b->lookup(c), 3u);
  EXPECT_TRUE(fetch_ok(*b, c[2]));
}

TEST(PrefixIndex, ReserveTakesOverADeadWritersBlock) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(16, 1);
  ASSERT_TRUE(a->reserve(c[0], nullptr, 4096).ok());
  p.live.kill(0);
  auto r = put(*b, c, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->reserved());
  EXPECT_TRUE(fetch_ok(*b, c[0]));
}

TEST(PrefixIndex, DeadNodesPinsDoNotBlockEviction) {
  IndexFormatOptions o = SimPool::small_index();
  o.max_stripes = 1;
  o.max_blocks = 1;
  SimPool p(2, 0.0, o);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(17, 1), d = chain(18, 1);
  ASSERT_TRUE(put(*b, c, 0).ok());
  ASSERT_TRUE(a->pin(c[0]).ok());  // reader pins and dies holding it
  EXPECT_EQ(b->reserve(d[0], nullptr, 4096).error().code(), -ENOSPC);
  p.live.kill(0);
  ASSERT_TRUE(put(*b, d, 0).ok()) << "the dead reader's pin is ignored";
  EXPECT_EQ(b->lookup(c), 0u);
}

TEST(PrefixIndex, RestartedNodeWithNewIncarnationReclaimsItsOldReservations) {
  SimPool p(1);
  auto c = chain(19, 1);
  {
    auto a = p.store(0, 500);
    ASSERT_TRUE(a->reserve(c[0], nullptr, 4096).ok());
  }
  p.live.set_incarnation(0, 501);  // node 0 comes back as a new process
  auto a2 = p.store(0, 501);
  auto r = put(*a2, c, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->reserved());
}

// Many nodes at once, random cache evictions, pressure evictions: a block
// read through the index always carries exactly the bytes its key implies.
TEST(PrefixIndex, ConcurrentNodesUnderNonCoherentSimReadOnlyCompleteBlocks) {
  IndexFormatOptions o = SimPool::small_index();
  o.max_blocks = 48;  // far fewer than the blocks the workload touches
  SimPool p(4, 0.02, o);
  std::atomic<uint64_t> bad{0}, hits{0}, published{0};
  std::vector<std::thread> th;
  for (uint32_t n = 0; n < 4; n++) {
    th.emplace_back([&, n] {
      auto kv = p.store(n);
      std::mt19937_64 rng(n + 1);
      for (int it = 0; it < 150; it++) {
        auto c = chain(rng() % 12, 2 + rng() % 6);
        size_t have = kv->lookup(c);
        for (size_t i = 0; i < have; i++) {
          auto pin = kv->pin(c[i]);
          if (!pin) break;  // evicted since the lookup: a miss, fine
          std::vector<std::byte> got(1024), want(1024);
          Chunk ch{got.data(), got.size()};
          if (!kv->fetch(*pin, {&ch, 1})) bad++;
          fill_block(c[i], want.data(), want.size());
          if (got != want) bad++;
          hits++;
          if (!kv->unpin(*pin)) bad++;
        }
        for (size_t i = have; i < c.size(); i++) {
          auto r = kv->reserve(c[i], i ? &c[i - 1] : nullptr, 1024);
          if (!r) break;  // parent evicted / no space: stop this chain
          if (!r->reserved()) {
            if (r->status == 2) kv->wait_ready(c[i], std::chrono::milliseconds(200));
            continue;
          }
          std::vector<std::byte> buf(1024);
          fill_block(c[i], buf.data(), buf.size());
          Chunk ch{buf.data(), buf.size()};
          if (!kv->write(*r, {&ch, 1})) bad++;
          Result<void> pub = kv->publish(*r);
          for (int k = 0; !pub && pub.error().code() == -EAGAIN && k < 2000; k++) {
            std::this_thread::yield();
            pub = kv->publish(*r);
          }
          if (!pub) {
            (void)kv->abort(*r);
            break;
          }
          published++;
        }
        if (rng() % 8 == 0) (void)store_index(*kv).evict_one(rng() % 8);
      }
    });
  }
  for (auto& t : th) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 50u);
  EXPECT_GT(published.load(), 50u);
  EXPECT_EQ(p.space.double_frees, 0u);
  // Accounting matches the table.
  auto kv = p.store(0);
  IndexUsage u = store_index(*kv).usage();
  EXPECT_EQ(u.used_blocks, u.by_state[CXLKV_ENTRY_READY] + u.by_state[CXLKV_ENTRY_WRITING]);
  EXPECT_EQ(p.space.in_use(), u.used_blocks);
  EXPECT_LE(u.used_blocks, 48u);
}

// The simulator catches a protocol that publishes the entry with a plain
// store and no flush (a broken rule 1/3): the other node never sees it.
namespace {
}  // namespace

TEST(PrefixIndex, SimulatorCatchesAPublishWithoutFlush) {
  SimPool p(2);
  BrokenStores broken(p.sim.node(0), /*plain_nt=*/false, /*plain_publish=*/true);
  auto a = KvStore::create(p.deps(0, &broken));
  ASSERT_TRUE(a.ok());
  auto b = p.store(1);
  auto c = chain(20, 1);
  ASSERT_TRUE(put(**a, c, 0).ok());
  EXPECT_EQ((*a)->lookup(c), 1u) << "the writer sees its own cached line";
  EXPECT_EQ(b->lookup(c), 0u) << "without the flush no other node sees the block";
  // The correct protocol on the same simulator: visible at once.
  auto c2 = chain(21, 1);
  auto a2 = p.store(0);
  ASSERT_TRUE(put(*a2, c2, 0).ok());
  EXPECT_EQ(b->lookup(c2), 1u);
}
