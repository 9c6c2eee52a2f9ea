// SPDX-License-Identifier: MIT
// Eviction (index_evict.cpp): pool-wide capacity and order, prefix-aware
// victims, O(1) victim cost, crash repair of the lists, and the lists under
// NonCoherentSim with random cache evictions.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

IndexFormatOptions opts(uint32_t stripes, uint32_t slots, uint64_t max_blocks) {
  IndexFormatOptions o;
  o.max_stripes = stripes;
  o.stripe_slots = slots;
  o.max_blocks = max_blocks;
  return o;
}

// Root keys whose home stripe is `stripe`.
std::vector<BlockKey> roots_in_stripe(PrefixIndex& ix, uint32_t stripe, size_t n, uint64_t seed) {
  std::vector<BlockKey> out;
  for (uint64_t id = seed; out.size() < n; id++) {
    auto c = chain(id, 1);
    if (ix.stripe_of(c[0]) == stripe) out.push_back(c[0]);
  }
  return out;
}

Result<KvReservation> put1(KvStore& kv, const BlockKey& k, size_t bytes = 4096) {
  return put(kv, std::span(&k, 1), 0, bytes);
}

void tick() { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }

}  // namespace

TEST(IndexEvict, CapacityIsPoolWideNotSplitOverStripes) {
  SimPool p(1, 0.0, opts(8, 64, 20));
  auto a = p.store(0);
  auto keys = roots_in_stripe(store_index(*a), 3, 21, 1000);
  for (size_t i = 0; i < 20; i++) ASSERT_TRUE(put1(*a, keys[i]).ok()) << i;
  EXPECT_EQ(store_index(*a).counters().evictions, 0u) << "20 blocks fit a 20-block pool even all in one stripe";
  EXPECT_EQ(store_index(*a).usage().used_blocks, 20u);
  ASSERT_TRUE(put1(*a, keys[20]).ok());
  EXPECT_EQ(store_index(*a).counters().evictions, 1u);
  EXPECT_EQ(store_index(*a).usage().used_blocks, 20u);
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, VictimIsTheLeastRecentlyUsedLeafOfTheWholePool) {
  SimPool p(2, 0.0, opts(8, 64, 3));
  auto a = p.store(0), b = p.store(1);
  auto x = roots_in_stripe(store_index(*a), 1, 1, 10)[0];
  auto y = roots_in_stripe(store_index(*a), 5, 1, 10)[0];
  auto z = roots_in_stripe(store_index(*a), 6, 1, 10)[0];
  ASSERT_TRUE(put1(*a, x).ok());
  tick();
  ASSERT_TRUE(put1(*b, y).ok());
  tick();
  ASSERT_TRUE(put1(*a, z).ok());
  tick();
  ASSERT_TRUE(fetch_ok(*b, x)) << "another node uses x: y is now the oldest";
  tick();
  auto w = roots_in_stripe(store_index(*a), 1, 2, 10)[1];  // lands in x's stripe, not y's
  ASSERT_TRUE(put1(*a, w).ok());
  EXPECT_EQ(a->lookup(std::span(&x, 1)), 1u);
  EXPECT_EQ(a->lookup(std::span(&y, 1)), 0u) << "the oldest block pool-wide went, in another stripe";
  EXPECT_EQ(a->lookup(std::span(&z, 1)), 1u);
  EXPECT_GE(store_index(*a).counters().second_chances, 1u) << "x was a tail used since it was linked";
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, AColdSubtreeGoesLeafFirstBeforeAWarmBlock) {
  SimPool p(1, 0.0, opts(4, 64, 6));
  auto a = p.store(0);
  auto cold = chain(30, 4);
  auto warm = chain(31, 1);
  for (size_t i = 0; i < 4; i++) ASSERT_TRUE(put(*a, cold, i).ok());
  tick();
  ASSERT_TRUE(put(*a, warm, 0).ok());
  tick();
  auto fresh = chain(32, 4);
  ASSERT_TRUE(put(*a, fresh, 0).ok());  // 6 of 6
  for (size_t i = 1; i < 4; i++) {
    tick();
    ASSERT_TRUE(fetch_ok(*a, warm[0]));
    ASSERT_TRUE(put(*a, fresh, i).ok());
    EXPECT_EQ(a->lookup(cold), 4 - i) << "the cold chain shrinks from its end";
    EXPECT_EQ(a->lookup(warm), 1u) << "the warm block stays";
  }
  EXPECT_EQ(a->lookup(fresh), 4u);
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, ReserveEvictsWhileAnythingUnpinnedRemainsThenRefuses) {
  SimPool p(1, 0.0, opts(4, 64, 8));
  auto a = p.store(0);
  std::vector<BlockKey> ks;
  for (uint64_t i = 0; i < 8; i++) ks.push_back(chain(40 + i, 1)[0]);
  for (auto& k : ks) ASSERT_TRUE(put1(*a, k).ok());
  std::vector<KvPin> pins;
  for (size_t i = 0; i < 7; i++) pins.push_back(a->pin(ks[i]).value());
  auto extra = chain(60, 1);
  ASSERT_TRUE(put1(*a, extra[0]).ok()) << "the one unpinned block is evicted";
  EXPECT_EQ(a->lookup(std::span(&ks[7], 1)), 0u);
  pins.push_back(a->pin(extra[0]).value());
  auto more = chain(61, 1);
  auto r = a->reserve(more[0], nullptr, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOSPC);
  EXPECT_NE(r.error().message().find("capacity"), std::string::npos) << r.error().message();
  for (auto& pin : pins) ASSERT_TRUE(a->unpin(pin).ok());
  EXPECT_TRUE(put1(*a, more[0]).ok());
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, ChainMeetingAFullCacheStopsCleanlyAndKeepsWhatItHolds) {
  SimPool p(1, 0.0, opts(4, 64, 5));
  auto a = p.store(0);
  auto old = chain(70, 2);
  ASSERT_TRUE(put(*a, old, 0).ok());
  ASSERT_TRUE(put(*a, old, 1).ok());
  auto c = chain(71, 8);
  std::vector<Reservation> res(8);
  std::vector<int32_t> st(8, 99);
  auto n = store_index(*a).reserve_chain(nullptr, c, 4096, res, st);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 5u) << "the old chain is evicted for it, then the pool is full of our own WRITING blocks";
  for (size_t i = 0; i < 5; i++) EXPECT_EQ(st[i], kBlockReserved) << i;
  EXPECT_EQ(st[5], -ENOSPC);
  EXPECT_EQ(st[6], -ECANCELED);
  EXPECT_EQ(a->lookup(old), 0u);
  for (size_t i = 0; i < 5; i++) EXPECT_EQ(store_index(*a).find_state(c[i]), uint32_t(CXLKV_ENTRY_WRITING)) << i;
  // The caller publishes what it holds and continues the chain later.
  std::vector<uint32_t> slots;
  for (size_t i = 0; i < 5; i++) slots.push_back(res[i].slot);
  ASSERT_EQ(store_index(*a).publish_many(slots, std::span(c).first(5), st).value(), 5u);
  EXPECT_EQ(a->lookup(c), 5u);
  EXPECT_EQ(p.space.in_use(), 5u);
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, AVictimCostsAFewEntryReadsHoweverLargeTheTable) {
  SimPool p(1, 0.0, opts(8, 1024, 64));
  auto a = p.store(0);
  for (uint64_t i = 0; i < 400; i++) ASSERT_TRUE(put1(*a, chain(1000 + i, 1)[0], 64).ok()) << i;
  IndexCounters c = store_index(*a).counters();
  ASSERT_EQ(c.evictions, 400u - 64u);
  EXPECT_EQ(c.scan_evictions, 0u) << "every victim came from a list";
  double per = double(c.victim_reads) / double(c.evictions);
  EXPECT_LE(per, 6.0) << "entry reads per eviction in a table of 8192 slots";
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

TEST(IndexEvict, AStripeLeftDirtyByADeadHolderIsRebuilt) {
  SimPool p(2, 0.0, opts(2, 64, 0));
  auto a = p.store(0), b = p.store(1);
  auto keys = roots_in_stripe(store_index(*a), 0, 6, 2000);
  for (auto& k : keys) ASSERT_TRUE(put1(*a, k).ok());
  // A holder died after marking the stripe and scrambling its list and counters.
  auto* st = reinterpret_cast<cxlkv_index_stripe*>(p.pool.mem + store_index(*a).header().stripe_off);
  cxlkv_index_stripe bad{};
  bad.list_dirty = 1;
  bad.lru_head = 7;
  bad.lru_tail = 1234567;
  bad.used_blocks = 99;
  p.sim.node(0).publish_line(st, &bad);
  p.sim.node(0).fence();
  EXPECT_GT(store_index(*b).audit_lists(), 0u);
  ASSERT_TRUE(store_index(*b).evict_one(0).ok());
  EXPECT_EQ(store_index(*b).counters().list_repairs, 1u);
  EXPECT_EQ(store_index(*b).audit_lists(), 0u);
  EXPECT_EQ(store_index(*b).usage().used_blocks, 5u) << "counters recounted from the entries, one evicted";
}

// Four nodes, random cache-line evictions, a small pool-wide capacity,
// random pins held across other nodes' reserves and forced evictions: bytes
// read are always the key's, the lists always agree with the entries.
TEST(IndexEvict, ListsStayConsistentUnderNonCoherentSimWithRandomEvictions) {
  SimPool p(4, 0.05, opts(8, 64, 40));
  std::atomic<uint64_t> bad{0}, hits{0}, published{0};
  std::vector<std::thread> th;
  for (uint32_t n = 0; n < 4; n++) {
    th.emplace_back([&, n] {
      auto kv = p.store(n);
      std::mt19937_64 rng(n + 11);
      for (int it = 0; it < 120; it++) {
        auto c = chain(rng() % 16, 2 + rng() % 6);
        size_t have = kv->lookup(c);
        std::vector<KvPin> held;
        for (size_t i = 0; i < have; i++) {
          auto pin = kv->pin(c[i]);
          if (!pin) break;
          std::vector<std::byte> got(1024), want(1024);
          Chunk ch{got.data(), got.size()};
          if (!kv->fetch(*pin, {&ch, 1})) bad++;
          fill_block(c[i], want.data(), want.size());
          if (got != want) bad++;
          hits++;
          held.push_back(*pin);
        }
        std::vector<Reservation> res(c.size() - have);
        std::vector<int32_t> st(c.size() - have);
        const BlockKey* parent = have ? &c[have - 1] : nullptr;
        auto r = store_index(*kv).reserve_chain(parent, std::span(c).subspan(have), 1024, res, st);
        if (!r) bad++;
        std::vector<uint32_t> slots;
        std::vector<BlockKey> keys;
        for (size_t i = 0; i < res.size() && st[i] >= 0 && st[i] != kBlockBusy; i++) {
          if (st[i] != kBlockReserved) continue;
          std::vector<std::byte> buf(1024);
          fill_block(c[have + i], buf.data(), buf.size());
          KvReservation kr;
          kr.key = c[have + i];
          kr.slot = res[i].slot;
          kr.length = res[i].loc.length;
          kr.loc_off = res[i].loc.offset;
          kr.loc_dev = res[i].loc.device;
          kr.loc_tier = res[i].loc.tier;
          kr.version = res[i].version;
          Chunk ch{buf.data(), buf.size()};
          if (!kv->write(kr, {&ch, 1})) bad++;
          slots.push_back(res[i].slot);
          keys.push_back(c[have + i]);
        }
        std::vector<int32_t> ps(slots.size());
        for (int k = 0; k < 200 && !slots.empty(); k++) {
          auto pn = store_index(*kv).publish_many(slots, keys, ps);
          if (!pn) break;
          published += pn.value();
          std::vector<uint32_t> s2;
          std::vector<BlockKey> k2;
          for (size_t i = 0; i < slots.size(); i++)
            if (ps[i] == -EAGAIN) s2.push_back(slots[i]), k2.push_back(keys[i]);
          slots.swap(s2);
          keys.swap(k2);
          std::this_thread::yield();
        }
        if (!slots.empty()) {
          std::vector<int32_t> as(slots.size());
          (void)store_index(*kv).abort_many(slots, keys, as);
        }
        for (auto& pin : held)
          if (!kv->unpin(pin)) bad++;
        if (rng() % 6 == 0) (void)store_index(*kv).evict_any();
      }
    });
  }
  for (auto& t : th) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 50u);
  EXPECT_GT(published.load(), 50u);
  EXPECT_EQ(p.space.double_frees, 0u);
  auto kv = p.store(0);
  std::string why;
  EXPECT_EQ(store_index(*kv).audit_lists(&why), 0u) << why;
  IndexUsage u = store_index(*kv).usage();
  EXPECT_EQ(u.used_blocks, u.by_state[CXLKV_ENTRY_READY] + u.by_state[CXLKV_ENTRY_WRITING]);
  EXPECT_EQ(p.space.in_use(), u.used_blocks);
  EXPECT_LE(u.used_blocks, 40u);
}

// The simulator catches list links written with plain stores and no flush
// (a broken rule 1): another node's view of the list disagrees with the entries.
namespace {
}  // namespace

TEST(IndexEvict, SimulatorCatchesListLinksWrittenWithoutNonTemporalStores) {
  SimPool p(2, 0.0, opts(1, 64, 0));
  BrokenStores broken(p.sim.node(0), /*plain_nt=*/true, /*plain_publish=*/false);
  auto a = KvStore::create(p.deps(0, &broken));
  ASSERT_TRUE(a.ok());
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(put1(**a, chain(80 + i, 1)[0]).ok());
  auto b = p.store(1);
  EXPECT_GT(store_index(*b).audit_lists(), 0u) << "node 1 sees list ends whose records never left node 0's cache";
  // The correct protocol on the same simulator: consistent for every node.
  SimPool q(2, 0.0, opts(1, 64, 0));
  auto a2 = q.store(0), b2 = q.store(1);
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(put1(*a2, chain(80 + i, 1)[0]).ok());
  EXPECT_EQ(store_index(*b2).audit_lists(), 0u);
}

// A reserve that must evict costs a few more fences and
// line reads than one that does not (the stripe lines are swept once per
// call, not once per capacity check), in a pool of 48 stripes.
TEST(IndexEvict, AReserveThatEvictsCostsAFewFencesMoreThanOneThatDoesNot) {
  SimPool p(1, 0.0, opts(48, 64, 100));
  auto a = p.store(0);
  auto cost = [&](uint64_t first, int n) {
    SimCounters c0 = p.sim.counters(0);
    for (int i = 0; i < n; i++) EXPECT_TRUE(store_index(*a).reserve(chain(first + i, 1)[0], nullptr, 4096).ok());
    SimCounters c1 = p.sim.counters(0);
    return std::pair<double, double>{double(c1.fences - c0.fences) / n, double(c1.loads - c0.loads) / n};
  };
  auto [f_plain, l_plain] = cost(5000, 50);  // 50 of 100: no eviction
  // Publish them (reserved blocks are not evictable), then fill up.
  for (uint32_t s = 0; s < 48 * 64; s++) {
    IndexEntryView v = store_index(*a).entry(s);
    if (v.state == CXLKV_ENTRY_WRITING) {
      ASSERT_TRUE(store_index(*a).publish(s, v.key).ok());
    }
  }
  for (uint64_t i = 0; i < 50; i++) {
    auto r = store_index(*a).reserve(chain(6000 + i, 1)[0], nullptr, 4096);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(store_index(*a).publish(r->slot, chain(6000 + i, 1)[0]).ok());
  }
  const uint64_t ev0 = store_index(*a).counters().evictions;
  auto [f_evict, l_evict] = cost(7000, 50);
  EXPECT_EQ(store_index(*a).counters().evictions - ev0, 50u) << "each reserve evicted one block";
  RecordProperty("fences_plain", std::to_string(f_plain));
  RecordProperty("fences_evict", std::to_string(f_evict));
  std::printf("reserve: %.1f fences, %.1f loads; evicting reserve: %.1f fences, %.1f loads\n", f_plain, l_plain,
              f_evict, l_evict);
  EXPECT_LE(f_evict, f_plain + 13) << "fences per evicting reserve vs " << f_plain;
  EXPECT_LE(l_evict, l_plain + 12) << "line loads per evicting reserve vs " << l_plain;
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

// Scan resistance (docs/eviction.md "What is evicted first"): an evicted block leaves a ghost (its tombstone
// keeps the key); reserved again, it is marked REUSED and goes on its
// stripe's hot list, so it outlives blocks seen only once.
TEST(IndexEvict, ABlockThatComesBackAfterEvictionOutlivesBlocksSeenOnce) {
  SimPool p(1, 0.0, opts(8, 64, 4));
  auto a = p.store(0);
  std::vector<BlockKey> k;
  for (uint64_t i = 0; i < 9; i++) k.push_back(chain(3000 + i, 1)[0]);
  auto cached = [&](size_t i) { return store_index(*a).find_ready(k[i]) != CXLKV_INDEX_NO_SLOT; };
  for (size_t i = 0; i < 5; i++) {
    ASSERT_TRUE(put1(*a, k[i]).ok()) << i;
    tick();
  }
  ASSERT_FALSE(cached(0)) << "k0, the least recently used, was evicted for k4";
  ASSERT_TRUE(put1(*a, k[0]).ok());  // back: its ghost marks it REUSED
  tick();
  EXPECT_GT(store_index(*a).usage().tombstones, 0u) << "evictions leave ghosts";
  for (size_t i = 5; i < 9; i++) {
    ASSERT_TRUE(put1(*a, k[i]).ok()) << i;
    tick();
  }
  EXPECT_TRUE(cached(0)) << "the block that came back is on the hot list";
  EXPECT_FALSE(cached(5)) << "a block seen once went in its place";
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}

// A block another request reads (leased again, for a second
// consumer, after its producer's handoff) is reused: it goes on the hot list
// and outlives blocks seen once that are newer than it, while a block only
// handed off to its own consumer is not protected.
TEST(IndexEvict, ABlockReadByAnotherRequestOutlivesNewerBlocksSeenOnce) {
  SimPool p(1, 0.0, opts(8, 64, 4));
  auto a = p.store(0);
  std::vector<BlockKey> k;
  for (uint64_t i = 0; i < 7; i++) k.push_back(chain(4000 + i, 1)[0]);
  auto cached = [&](size_t i) { return store_index(*a).find_ready(k[i]) != CXLKV_INDEX_NO_SLOT; };
  auto lease_and_release = [&](size_t i, uint64_t consumer) {
    int32_t st = -1;
    ASSERT_EQ(a->lease(std::span(&k[i], 1), consumer, KvStore::kLeaseNodeAny, 60000, std::span(&st, 1)).value(), 1u);
    ASSERT_EQ(a->lease_release(std::span(&k[i], 1), consumer, std::span(&st, 1)).value(), 1u);
  };
  ASSERT_TRUE(put1(*a, k[0]).ok());
  lease_and_release(0, 1);  // its producer's handoff
  lease_and_release(0, 2);  // another request reads it: reused
  tick();
  for (size_t i = 1; i < 4; i++) {
    ASSERT_TRUE(put1(*a, k[i]).ok()) << i;
    lease_and_release(i, 10 + i);  // handed off once only
  }
  // Blocks seen once live here for a while before the next ones come, so
  // that a hot tail's age bonus clearly exceeds the gap between k0 and k1.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (size_t i = 4; i < 7; i++) ASSERT_TRUE(put1(*a, k[i]).ok()) << i;
  EXPECT_TRUE(cached(0)) << "the reused block stays, though older than k1..k3";
  for (size_t i = 1; i < 4; i++) EXPECT_FALSE(cached(i)) << "k" << i << ", seen once, went first";
  for (size_t i = 4; i < 7; i++) EXPECT_TRUE(cached(i)) << i;
  EXPECT_EQ(store_index(*a).audit_lists(), 0u);
}
