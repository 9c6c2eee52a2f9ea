// SPDX-License-Identifier: MIT
// Handoff leases (index_lease.cpp): a leased block is never evicted until its
// consumer releases it, the lease expires, or the consumer's node dies; every
// node on its own NonCoherentSim domain.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

IndexFormatOptions cap(uint64_t blocks) {
  IndexFormatOptions o;
  o.max_stripes = 4;
  o.stripe_slots = 64;
  o.max_blocks = blocks;
  return o;
}

Result<KvReservation> put1(KvStore& kv, const BlockKey& k) { return put(kv, std::span(&k, 1), 0); }
bool cached(KvStore& kv, const BlockKey& k) { return kv.lookup(std::span(&k, 1)) == 1; }
void tick() { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }

}  // namespace

TEST(IndexLease, ALeasedBlockIsNotEvictedUntilItsConsumerReleasesIt) {
  SimPool p(2, 0.0, cap(2));
  auto prod = p.store(0), cons = p.store(1);
  auto x = chain(1, 1)[0], y = chain(2, 1)[0];
  ASSERT_TRUE(put1(*prod, x).ok());
  tick();
  ASSERT_TRUE(put1(*prod, y).ok());
  int32_t st = 99;
  ASSERT_EQ(prod->lease(std::span(&x, 1), 7, 1, 60000, std::span(&st, 1)).value(), 1u);
  EXPECT_EQ(st, 0);
  tick();
  ASSERT_TRUE(put1(*prod, chain(3, 1)[0]).ok());
  EXPECT_TRUE(cached(*cons, x)) << "x is the oldest but leased";
  EXPECT_FALSE(cached(*cons, y));
  EXPECT_TRUE(fetch_ok(*cons, x));
  ASSERT_EQ(cons->lease_release(std::span(&x, 1), 7, std::span(&st, 1)).value(), 1u);
  EXPECT_EQ(st, 0);
  tick();
  ASSERT_TRUE(put1(*prod, chain(4, 1)[0]).ok());
  ASSERT_TRUE(put1(*prod, chain(5, 1)[0]).ok());
  EXPECT_FALSE(cached(*cons, x)) << "released: evictable again";
  EXPECT_EQ(store_index(*prod).usage().lease_expiries, 0u);
}

TEST(IndexLease, AnExpiredLeaseStopsProtectingAndIsCounted) {
  SimPool p(2, 0.0, cap(1));
  auto prod = p.store(0), cons = p.store(1);
  auto x = chain(10, 1)[0];
  ASSERT_TRUE(put1(*prod, x).ok());
  int32_t st = 99;
  ASSERT_EQ(prod->lease(std::span(&x, 1), 8, 1, 5, std::span(&st, 1)).value(), 1u);
  EXPECT_EQ(prod->reserve(chain(11, 1)[0], nullptr, 4096).error().code(), -ENOSPC) << "leased: nothing else can go";
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(put1(*prod, chain(11, 1)[0]).ok());
  EXPECT_FALSE(cached(*cons, x));
  IndexUsage u = store_index(*prod).usage();
  EXPECT_EQ(u.lease_expiries, 1u);
  EXPECT_EQ(u.lease_dead, 0u);
}

TEST(IndexLease, TheConsumerNodesDeathEndsItsLeases) {
  SimPool p(2, 0.0, cap(1));
  auto prod = p.store(0), cons = p.store(1);
  auto x = chain(20, 1)[0];
  ASSERT_TRUE(put1(*prod, x).ok());
  int32_t st = 99;
  ASSERT_EQ(prod->lease(std::span(&x, 1), 9, 1, 600000, std::span(&st, 1)).value(), 1u);
  EXPECT_EQ(prod->reserve(chain(21, 1)[0], nullptr, 4096).error().code(), -ENOSPC);
  p.live.kill(1);
  ASSERT_TRUE(put1(*prod, chain(21, 1)[0]).ok()) << "the dead consumer's lease no longer holds x";
  EXPECT_FALSE(cached(*prod, x));
  IndexUsage u = store_index(*prod).usage();
  EXPECT_EQ(u.lease_expiries, 1u);
  EXPECT_EQ(u.lease_dead, 1u);
}

TEST(IndexLease, ReleaseChecksTheConsumerAndSeveralConsumersShareALease) {
  SimPool p(3, 0.0, cap(0));
  auto prod = p.store(0), c1 = p.store(1), c2 = p.store(2);
  auto k = chain(30, 3);
  for (size_t i = 0; i < 3; i++) ASSERT_TRUE(put(*prod, k, i).ok());
  std::vector<int32_t> st(4, 99);
  auto miss = chain(31, 1)[0];
  std::vector<BlockKey> ks{k[0], k[1], k[2], miss};
  EXPECT_EQ(prod->lease(ks, 100, 1, 60000, st).value(), 3u);
  EXPECT_EQ(st, (std::vector<int32_t>{0, 0, 0, kKvMiss}));
  EXPECT_EQ(prod->lease(std::span(k).first(1), 200, 2, 60000, st).value(), 1u);
  auto views = store_index(*prod).leases();
  ASSERT_EQ(views.size(), 3u);
  for (auto& v : views) {
    EXPECT_EQ(v.consumer, 100u);
    EXPECT_TRUE(v.live);
    EXPECT_GT(v.expires_in_ms, 50000);
    EXPECT_EQ(v.count, v.key == k[0] ? 2u : 1u);
    EXPECT_EQ(v.node, v.key == k[0] ? PrefixIndex::kLeaseNodeAny : 1u) << "consumers on two nodes: any";
  }
  EXPECT_EQ(c2->lease_release(std::span(k).subspan(1, 1), 200, st).value(), 0u);
  EXPECT_EQ(st[0], -ENOENT) << "leased to consumer 100 only";
  EXPECT_NE(c2->last_block_error().find("not leased to consumer 200"), std::string::npos) << c2->last_block_error();
  EXPECT_EQ(c1->lease_release(std::span(k).first(3), 100, st).value(), 3u);
  EXPECT_EQ(c2->lease_release(std::span(k).first(1), 200, st).value(), 1u);
  EXPECT_TRUE(store_index(*prod).leases().empty());
  EXPECT_EQ(c1->lease_release(std::span(k).first(1), 100, st).value(), 0u);
  EXPECT_EQ(st[0], -ENOENT) << "released twice";
  EXPECT_FALSE(prod->lease(std::span(k).first(1), 1, 1, 0, st).ok()) << "ttl 0 refused";
  EXPECT_FALSE(prod->lease(std::span(k).first(1), 1, 99, 10, st).ok()) << "node beyond the pool refused";
}

TEST(IndexLease, ReleasingAnExpiredLeaseSaysSo) {
  SimPool p(2, 0.0, cap(0));
  auto prod = p.store(0), cons = p.store(1);
  auto x = chain(40, 1)[0];
  ASSERT_TRUE(put1(*prod, x).ok());
  int32_t st = 99;
  ASSERT_EQ(prod->lease(std::span(&x, 1), 5, 1, 2, std::span(&st, 1)).value(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cons->lease_release(std::span(&x, 1), 5, std::span(&st, 1)).value(), 0u);
  EXPECT_EQ(st, -ETIMEDOUT);
  EXPECT_EQ(store_index(*prod).usage().lease_expiries, 1u);
  EXPECT_TRUE(store_index(*prod).leases().empty());
}

// Producer publishes and leases for a consumer while another node floods a
// tiny cache; with random cache-line evictions every leased block survives
// until the consumer has read it byte-exact and released it.
TEST(IndexLease, LeasedHandoffSurvivesPressureUnderNonCoherentSim) {
  SimPool p(3, 0.05, cap(24));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, handed{0};
  std::thread flood([&] {
    auto kv = p.store(2);
    for (uint64_t i = 0; !stop; i++) {
      auto c = chain(5000 + i % 500, 1);
      (void)put(*kv, c, 0, 1024);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto prod = p.store(0), cons = p.store(1);
  for (uint64_t req = 0; req < 40; req++) {
    auto c = chain(100 + req, 4);
    size_t have = prod->lookup(c);
    bool ok = true;
    for (size_t i = have; i < c.size() && ok; i++) {
      auto r = put(*prod, c, i, 1024);
      ok = r.ok();
    }
    if (!ok) continue;  // the cache was full of other leases: fine, nothing was handed off
    std::vector<int32_t> st(4);
    if (prod->lease(c, req, 1, 60000, st).value() != 4u) {
      bad++;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t i = 0; i < 4; i++)
      if (!fetch_ok(*cons, c[i], 1024)) bad++;
    if (cons->lease_release(c, req, st).value() != 4u) bad++;
    handed++;
  }
  stop = true;
  flood.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(handed.load(), 3u);
  EXPECT_EQ(store_index(*prod).audit_lists(), 0u);
}
