// SPDX-License-Identifier: MIT
// The SSD tier inside the KV store: demotion on eviction, promotion on a
// hit, pins and prefix closure across tiers, a full SSD tier, lost blocks.
#include <gtest/gtest.h>

#include <random>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/metrics.hpp"
#include "cxlkv/tier.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "tier/fault_injector.hpp"
#include "tier/ssd_payload_tier.hpp"
#include "support/tier_test_support.hpp"
#include "support/kv_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

constexpr uint64_t kPoolBytes = 8 << 20;
constexpr uint64_t kIndexBytes = 2 << 20;
constexpr uint32_t kBlock = 64 * 1024;

// Payload space that holds at most `limit` blocks (memory tier capacity).
class LimitedSpace final : public PayloadSpace {
 public:
  LimitedSpace(PayloadSpace& inner, uint32_t limit) : inner_(inner), limit_(limit) {}
  Result<BlockLocation> alloc(uint64_t bytes) override {
    if (used_ >= limit_) return Error(-ENOSPC, "memory tier full");
    auto r = inner_.alloc(bytes);
    if (r) used_++;
    return r;
  }
  void free(const BlockLocation& loc) override {
    ASSERT_EQ(loc.tier, CXLKV_TIER_MEM) << "an SSD location reached the memory allocator";
    inner_.free(loc);
    used_--;
  }
  uint32_t used() const { return used_; }
  void set_limit(uint32_t n) { limit_ = n; }

 private:
  PayloadSpace& inner_;
  uint32_t limit_;
  uint32_t used_ = 0;
};

struct TieredStore {
  TieredStore(uint32_t mem_blocks, uint64_t ssd_bytes, bool promote, std::shared_ptr<FaultInjector> faults = nullptr,
              uint64_t index_max_blocks = 0, std::vector<double> ssd_gbps = {1.0})
      : pool(kPoolBytes), sim(pool.mem, pool.bytes, NonCoherentSimOptions{2, 0.0, 7}),
        range(kIndexBytes, kPoolBytes - kIndexBytes), space(range, mem_blocks), ssd_bytes_(ssd_bytes),
        promote_(promote), faults_(std::move(faults)), ssd_gbps_(std::move(ssd_gbps)) {
    IndexFormatOptions fo;
    fo.stripe_slots = 64;
    fo.max_stripes = 1;  // one stripe: eviction order is easy to reason about
    fo.max_blocks = index_max_blocks;
    auto r = index_format(sim.node(0), pool.mem, kIndexBytes, fo);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    live.set_incarnation(0, 100);
    live.set_incarnation(1, 200);
    open_node();
  }
  // Opens (again: a restart of this node's process) the SSD pool, its tier
  // and the KV store over the same index carve and SSD file.
  void open_node() {
    kv.reset();
    tier.reset();
    ssd.reset();
    if (!dir.ok() || !dir.direct_io_ok()) return;
    SsdPoolOptions so;
    so.probe_bytes = 64 * 1024;
    for (size_t i = 0; i < ssd_gbps_.size(); i++)
      so.devices.push_back({dir.file("ssd" + std::to_string(i)), ssd_bytes_, ssd_gbps_[i], false});
    if (faults_) so.faults = {faults_};
    auto sp = SsdPool::open(so);
    EXPECT_TRUE(sp) << (sp ? "" : sp.error().message());
    if (!sp) return;
    ssd = std::move(*sp);
    tier = std::make_unique<SsdPayloadTier>(*ssd);
    auto kv_r = KvStore::create(deps(0, tier.get(), promote_));
    EXPECT_TRUE(kv_r.ok()) << (kv_r.ok() ? "" : kv_r.error().message());
    if (kv_r.ok()) kv = std::move(kv_r.value());
  }
  KvDeps deps(uint32_t node, PlacingTier* ssd_tier, bool promote) {
    KvDeps d;
    d.index_domain = &sim.node(node);
    d.index_carve = pool.mem;
    d.index_bytes = kIndexBytes;
    d.node = node;
    d.incarnation = node ? 200 : 100;
    d.locks = &locks;
    d.liveness = &live;
    d.space = &space;
    d.devices.push_back(PoolDevice{&sim.node(node), pool.mem, pool.bytes});
    d.ssd_tier = ssd_tier;
    d.demote_on_evict = ssd_tier != nullptr;
    d.promote_on_hit = promote;
    return d;
  }
  bool ready() const { return kv != nullptr; }
  BlockKey some_block_on_ssd(std::span<const BlockKey> c) {
    for (auto& k : c)
      if (tier_of(k) == CXLKV_TIER_SSD) return k;
    ADD_FAILURE() << "no block of the chain was demoted";
    return c[0];
  }

  Result<void> put(std::span<const BlockKey> c, size_t i) {
    auto r = kv->reserve(c[i], i ? &c[i - 1] : nullptr, kBlock);
    if (!r) return r.error();
    if (!r->reserved()) return {};
    std::vector<std::byte> buf(kBlock);
    fill_block(c[i], buf.data(), kBlock);
    Chunk ch{buf.data(), kBlock};
    CXLKV_TRY(kv->write(*r, {&ch, 1}));
    return kv->publish(*r);
  }
  // pin -> fetch -> verify -> unpin; returns the tier it was read from, or the error.
  Result<uint8_t> get(const BlockKey& k) {
    auto p = kv->pin(k);
    if (!p) return p.error();
    std::vector<std::byte> buf(p->length);
    Chunk ch{buf.data(), buf.size()};
    auto f = kv->fetch(*p, {&ch, 1});
    uint8_t tier_read = p->loc_tier;
    (void)kv->unpin(*p);
    if (!f) return f.error();
    std::vector<std::byte> want(p->length);
    fill_block(k, want.data(), want.size());
    if (buf != want) return Error(-EBADMSG, "block bytes differ");
    return tier_read;
  }
  uint8_t tier_of(const BlockKey& k) {
    BlockLocation loc;
    EXPECT_NE(store_index(*kv).find_ready(k, &loc), CXLKV_INDEX_NO_SLOT);
    return loc.tier;
  }

  tier_test::ScratchDir dir;
  AlignedPool pool;
  NonCoherentSim sim;
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace range;
  LimitedSpace space;
  std::unique_ptr<SsdPool> ssd;
  std::unique_ptr<SsdPayloadTier> tier;
  std::unique_ptr<KvStore> kv;
  uint64_t ssd_bytes_;
  bool promote_;
  std::shared_ptr<FaultInjector> faults_;
  std::vector<double> ssd_gbps_;
};

// What a read of block k returned: its own bytes, a clean miss (an error,
// nothing handed out), or bytes that are not k's (must never happen).
struct ReadOutcome {
  size_t right = 0, miss = 0, wrong = 0;
};
void tally(TieredStore& t, const BlockKey& k, ReadOutcome* o) {
  auto r = t.get(k);
  if (r) o->right++;
  else if (r.error().code() == -EBADMSG) o->wrong++;  // get() compares the bytes
  else o->miss++;
}

std::vector<BlockKey> chain(uint64_t id, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = id * 1000003 + i + 1;
  return keys_from_ids(ids);
}

#define REQUIRE_STORE(t)                                                                          \
  do {                                                                                             \
    if (!(t).dir.ok() || !(t).dir.direct_io_ok()) GTEST_SKIP() << "O_DIRECT not supported here"; \
    ASSERT_TRUE((t).ready());                                                                      \
  } while (0)

}  // namespace

TEST(TierKv, BlocksEvictedFromMemoryAreDemotedAndStayCachedByteExact) {
  TieredStore t(4, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto c = chain(1, 12);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok()) << "block " << i;
  // Memory holds 4 blocks, yet the whole chain is still cached: 8 live on SSD.
  EXPECT_EQ(t.kv->lookup(c), 12u);
  EXPECT_EQ(t.kv->lookup_linear(c), 12u);
  EXPECT_EQ(store_index(*t.kv).counters().demotions, 8u);
  EXPECT_EQ(store_index(*t.kv).counters().evictions, 0u);
  EXPECT_EQ(t.space.used(), 4u);
  size_t on_ssd = 0;
  for (auto& k : c) {
    auto r = t.get(k);
    ASSERT_TRUE(r) << r.error().message();
    on_ssd += r.value() == CXLKV_TIER_SSD;
  }
  EXPECT_EQ(on_ssd, 8u);
  EXPECT_EQ(t.tier->stats().reads, 8u);
  EXPECT_EQ(t.tier->stats().placed, 8u);
}

TEST(TierKv, HitOnTheSsdTierPromotesTheBlockBackToMemory) {
  TieredStore t(4, 32 << 20, /*promote=*/true);
  REQUIRE_STORE(t);
  auto c = chain(2, 6);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok());
  const BlockKey k = t.some_block_on_ssd(c);
  t.space.set_limit(6);                     // room in memory again
  auto r = t.get(k);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), CXLKV_TIER_SSD);     // this read came from SSD ...
  EXPECT_EQ(t.tier_of(k), CXLKV_TIER_MEM);  // ... and moved the block to memory
  EXPECT_EQ(store_index(*t.kv).counters().promotions, 1u);
  EXPECT_EQ(t.tier->stats().released, 1u);  // its SSD extent was given back
  r = t.get(k);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), CXLKV_TIER_MEM);
  EXPECT_EQ(t.kv->lookup(c), 6u);
}

TEST(TierKv, PromotionWaitsWhileAnotherPinIsHeld) {
  TieredStore t(4, 32 << 20, /*promote=*/true);
  REQUIRE_STORE(t);
  auto c = chain(3, 6);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok());
  const BlockKey k = t.some_block_on_ssd(c);
  t.space.set_limit(8);
  auto other = t.kv->pin(k);  // someone else is reading it from SSD
  ASSERT_TRUE(other);
  auto r = t.get(k);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(t.tier_of(k), CXLKV_TIER_SSD);  // not moved under the other reader
  ASSERT_TRUE(t.kv->unpin(*other).ok());
  EXPECT_EQ(store_index(*t.kv).counters().promotions, 0u);
  EXPECT_EQ(t.space.used(), 4u);  // the promotion's memory was given back
}

TEST(TierKv, PinnedBlockIsNeitherDemotedNorEvicted) {
  TieredStore t(3, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto c = chain(4, 2);
  ASSERT_TRUE(t.put(c, 0).ok());
  auto pin = t.kv->pin(c[0]);
  ASSERT_TRUE(pin);
  for (uint64_t id = 10; id < 16; id++) {  // pressure from other chains
    auto o = chain(id, 1);
    ASSERT_TRUE(t.put(o, 0).ok());
  }
  EXPECT_EQ(t.tier_of(c[0]), CXLKV_TIER_MEM);
  ASSERT_TRUE(t.kv->unpin(*pin).ok());
}

TEST(TierKv, FullSsdTierFallsBackToEvictionAndEverythingCachedStaysReadable) {
  // SSD data area: 4 MiB device - 1 MiB header/probe = 3 MiB = 48 blocks of 64 KiB.
  TieredStore t(4, 4 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  const uint64_t ssd_blocks = t.ssd->device_info(0).data_bytes / t.ssd->extent_bytes(0, kBlock);
  std::vector<std::vector<BlockKey>> chains;
  for (uint64_t id = 100; id < 100 + ssd_blocks + 20; id++) {
    chains.push_back(chain(id, 1));
    ASSERT_TRUE(t.put(chains.back(), 0).ok()) << "chain " << id;
  }
  EXPECT_GT(t.tier->stats().full, 0u);            // the tier filled up ...
  EXPECT_GT(store_index(*t.kv).counters().evictions, 0u);  // ... and eviction took over
  size_t cached = 0;
  for (auto& c : chains) {
    if (t.kv->lookup(c) == 0) continue;
    cached++;
    auto r = t.get(c[0]);
    ASSERT_TRUE(r) << r.error().message();
  }
  EXPECT_EQ(cached, 4 + ssd_blocks);  // memory + SSD, both full
  EXPECT_EQ(t.ssd->lost_blocks(), 0u);
}

TEST(TierKv, LostSsdBlockIsReportedAndNeverReturnedAsData) {
  auto faults = std::make_shared<FaultInjector>();
  TieredStore t(2, 32 << 20, /*promote=*/false, faults);
  REQUIRE_STORE(t);
  auto c = chain(5, 4);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok());
  const BlockKey k = t.some_block_on_ssd(c);
  faults->fail(IoOp::kRead, 0, 1ull << 40, -EIO);  // every SSD read fails
  auto r = t.get(k);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), -EIO);
  // Named with its location and what failed, not a bare "Input/output error".
  EXPECT_NE(r.error().message().find("kv: fetch of SSD block " + to_hex(k) + " at device "), std::string::npos)
      << r.error().message();
  EXPECT_NE(r.error().message().find("the SSD read failed: Input/output error"), std::string::npos)
      << r.error().message();
  EXPECT_EQ(t.tier->stats().lost, 1u);
  faults->clear();  // the tier keeps serving
  for (auto& other : c) {
    if (other == k) continue;
    r = t.get(other);
    ASSERT_TRUE(r) << r.error().message();
  }
  r = t.get(c[0]);
  ASSERT_TRUE(r) << r.error().message();
}

TEST(TierKv, PrefixClosureHoldsAcrossTiersUnderRandomWork) {
  TieredStore t(6, 8 << 20, /*promote=*/true);
  REQUIRE_STORE(t);
  std::mt19937_64 rng(3);
  std::vector<std::vector<BlockKey>> chains;
  for (uint64_t id = 0; id < 12; id++) chains.push_back(chain(200 + id, 1 + rng() % 8));
  for (int step = 0; step < 400; step++) {
    auto& c = chains[rng() % chains.size()];
    size_t have = t.kv->lookup(c);
    ASSERT_EQ(have, t.kv->lookup_linear(c)) << "binary search and scan disagree: closure broken";
    if (have < c.size() && rng() % 2) {
      auto r = t.put(c, have);
      ASSERT_TRUE(r.ok() || r.error().code() == -ENOSPC) << r.error().message();
    } else if (have) {
      auto r = t.get(c[rng() % have]);
      ASSERT_TRUE(r || r.error().code() == -ENOENT) << r.error().message();
    }
    if (step % 10 == 0) t.space.set_limit(4 + static_cast<uint32_t>(rng() % 6));
  }
  EXPECT_GT(store_index(*t.kv).counters().demotions, 0u);
  EXPECT_EQ(t.ssd->lost_blocks(), 0u);
}

TEST(TierKv, ChainLongerThanBothTiersStopsWithNoSpaceAndStaysPrefixClosed) {
  TieredStore t(4, 4 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  const uint64_t ssd_blocks = t.ssd->device_info(0).data_bytes / t.ssd->extent_bytes(0, kBlock);
  auto c = chain(6, ssd_blocks + 10);
  size_t i = 0;
  for (; i < c.size(); i++) {
    auto r = t.put(c, i);
    if (!r) {
      EXPECT_EQ(r.error().code(), -ENOSPC) << r.error().message();
      break;
    }
  }
  // Every block of the chain has a cached child, so none may be dropped:
  // memory and SSD fill up, then the next block finds no space.
  EXPECT_EQ(i, 4 + ssd_blocks);
  EXPECT_EQ(t.kv->lookup(c), i);
  EXPECT_EQ(t.kv->lookup_linear(c), i);
  for (size_t k = 0; k < i; k++) {
    auto r = t.get(c[k]);
    ASSERT_TRUE(r) << "block " << k << ": " << r.error().message();
  }
}

TEST(TierKv, IndexBlockCapacityLimitsMemoryOnlyAndDemotionRelievesIt) {
  TieredStore t(1000, 32 << 20, /*promote=*/true, nullptr, /*index_max_blocks=*/4);
  REQUIRE_STORE(t);
  auto c = chain(7, 12);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok()) << "block " << i;
  EXPECT_EQ(t.kv->lookup(c), 12u);
  EXPECT_EQ(store_index(*t.kv).counters().demotions, 8u);
  EXPECT_EQ(store_index(*t.kv).counters().evictions, 0u);
  EXPECT_EQ(store_index(*t.kv).usage().used_blocks, 4u);  // memory-tier blocks
  EXPECT_EQ(t.space.used(), 4u);
  // Memory is at its capacity: a hit on SSD is served but not promoted.
  const BlockKey k = t.some_block_on_ssd(c);
  auto r = t.get(k);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(t.tier_of(k), CXLKV_TIER_SSD);
  EXPECT_EQ(store_index(*t.kv).counters().promotions, 0u);
  EXPECT_EQ(t.space.used(), 4u);
}

// ---- SSD blocks know what they hold (docs/integrity.md "The SSD tier") ----

namespace {
std::vector<std::vector<BlockKey>> put_chains(TieredStore& t, uint64_t first_id, size_t n) {
  std::vector<std::vector<BlockKey>> cs;
  for (uint64_t id = first_id; id < first_id + n; id++) {
    cs.push_back(chain(id, 1));
    EXPECT_TRUE(t.put(cs.back(), 0).ok()) << "chain " << id;
  }
  return cs;
}
size_t on_ssd(TieredStore& t, const std::vector<std::vector<BlockKey>>& cs) {
  size_t n = 0;
  for (auto& c : cs) {
    BlockLocation loc;
    if (store_index(*t.kv).find_ready(c[0], &loc) != CXLKV_INDEX_NO_SLOT && loc.tier == CXLKV_TIER_SSD) n++;
  }
  return n;
}
}  // namespace

TEST(TierKv, AfterARestartBlocksPublishedLaterNeverTakeTheExtentsOfEarlierOnes) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 10);  // 8 of them demoted to the SSD tier
  const size_t a_on_ssd = on_ssd(t, a);
  ASSERT_GE(a_on_ssd, 8u);
  t.open_node();  // the process restarts: new SSD pool, tier and store over the same index and file
  ASSERT_TRUE(t.ready());
  EXPECT_EQ(t.tier->stats().claimed, a_on_ssd);  // every SSD extent the index names is claimed again
  auto b = put_chains(t, 2000, 10);  // demotes A's memory blocks and B's onto the SSD
  ReadOutcome o;
  for (auto& c : a) tally(t, c[0], &o);
  for (auto& c : b) tally(t, c[0], &o);
  EXPECT_EQ(o.wrong, 0u);
  EXPECT_EQ(o.miss, 0u);  // with the extents claimed, nothing was overwritten
  EXPECT_EQ(o.right, 20u);
  EXPECT_EQ(t.tier->stats().bad, 0u);
}

TEST(TierKv, AnExtentOverwrittenWithAnotherBlockIsACleanMissAndItsEntryIsDropped) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 10);
  ASSERT_GE(on_ssd(t, a), 8u);
  {
    // A process that opens the same SSD file without the index (so it claims
    // nothing) hands out A's extents again, first fit, for blocks of other keys.
    SsdPoolOptions so;
    so.probe_bytes = 64 * 1024;
    so.devices.push_back({t.dir.file("ssd0"), 0, 1.0, false});
    auto other = SsdPool::open(so);
    ASSERT_TRUE(other) << other.error().message();
    SsdPayloadTier other_tier(**other);
    std::vector<std::byte> buf(kBlock);
    for (uint64_t id = 5000; id < 5010; id++) {
      BlockKey k = chain(id, 1)[0];
      fill_block(k, buf.data(), kBlock);
      Chunk ch{buf.data(), kBlock};
      ASSERT_TRUE(other_tier.place(k, {&ch, 1}));
    }
  }
  ReadOutcome o;
  size_t dropped = 0;
  for (auto& c : a) {
    const bool was_on_ssd = t.tier_of(c[0]) == CXLKV_TIER_SSD;
    tally(t, c[0], &o);
    if (was_on_ssd && t.kv->lookup(c) == 0) {
      dropped++;
    }
  }
  EXPECT_EQ(o.wrong, 0u);           // never B's bytes with status 0
  EXPECT_GE(o.miss, 8u);            // A's SSD blocks now hold B: clean misses
  EXPECT_EQ(dropped, o.miss);       // ... whose entries are gone, so lookups miss at once
  EXPECT_EQ(t.tier->stats().bad, o.miss);
}

TEST(TierKv, TruncatingTheSsdFileMidRunMakesEveryAffectedBlockACleanMiss) {
  for (bool regrow : {false, true}) {  // shorter file (short reads), or holes (zeros)
    TieredStore t(2, 32 << 20, /*promote=*/false);
    REQUIRE_STORE(t);
    auto a = put_chains(t, 1000, 40);
    ASSERT_GE(on_ssd(t, a), 38u);
    BlockLocation mid;
    ASSERT_NE(store_index(*t.kv).find_ready(a[20][0], &mid), CXLKV_INDEX_NO_SLOT);
    ASSERT_EQ(mid.tier, CXLKV_TIER_SSD);
    const std::string f = t.dir.file("ssd0");
    ASSERT_EQ(truncate(f.c_str(), static_cast<off_t>(mid.offset * 512)), 0);
    if (regrow) {
      ASSERT_EQ(truncate(f.c_str(), 32 << 20), 0);
    }
    ReadOutcome o;
    for (auto& c : a) tally(t, c[0], &o);
    EXPECT_EQ(o.wrong, 0u) << "regrow " << regrow;
    EXPECT_GE(o.miss, 18u) << "regrow " << regrow;   // blocks 20.. (those on the SSD) are gone
    EXPECT_GE(o.right, 20u) << "regrow " << regrow;  // the rest still serve
    for (size_t i = 20; i < a.size(); i++) {
      if (t.kv->lookup(a[i]) == 1) {
        EXPECT_EQ(t.tier_of(a[i][0]), CXLKV_TIER_MEM) << "block " << i;
      }
    }
  }
}

TEST(TierKv, ADamagedPayloadByteIsACleanMissNeverTheDamagedBytes) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 4);
  BlockLocation loc;
  ASSERT_NE(store_index(*t.kv).find_ready(a[0][0], &loc), CXLKV_INDEX_NO_SLOT);
  ASSERT_EQ(loc.tier, CXLKV_TIER_SSD);
  int fd = ::open(t.dir.file("ssd0").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char x = 0;
  const off_t at = static_cast<off_t>(loc.offset * 512 + t.ssd->extent_bytes(0, kBlock) - kBlock + 1234);
  ASSERT_EQ(pread(fd, &x, 1, at), 1);
  x ^= 0x40;
  ASSERT_EQ(pwrite(fd, &x, 1, at), 1);
  ::close(fd);
  auto r = t.get(a[0][0]);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), -ENOENT) << r.error().message();
  EXPECT_NE(r.error().message().find("fails its checks"), std::string::npos) << r.error().message();
  EXPECT_EQ(t.tier->stats().bad, 1u);
  EXPECT_EQ(t.kv->lookup(a[0]), 0u);  // dropped
  for (size_t i = 1; i < a.size(); i++) ASSERT_TRUE(t.get(a[i][0])) << "block " << i;
}

TEST(TierKv, BlocksOnAnotherHostsSsdAreNotHitsThere) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 6);  // host 0 demotes 4 of them to its own SSD (device 0)
  ASSERT_GE(on_ssd(t, a), 4u);
  // Host 1: its own SSD (device 1), same index.
  SsdPoolOptions so;
  so.probe_bytes = 64 * 1024;
  so.devices.push_back({t.dir.file("ssd1"), 16 << 20, 1.0, false});
  auto sp = SsdPool::open(so);
  ASSERT_TRUE(sp) << sp.error().message();
  SsdPayloadTier tier1(**sp, /*device_base=*/1);
  auto kv1 = KvStore::create(t.deps(1, &tier1, false));
  ASSERT_TRUE(kv1.ok()) << kv1.error().message();
  auto kv_none = KvStore::create(t.deps(1, nullptr, false));  // a node without any SSD tier
  ASSERT_TRUE(kv_none.ok()) << kv_none.error().message();
  EXPECT_EQ(tier1.stats().claimed, 0u);  // host 0's extents are not host 1's to account
  for (auto& c : a) {
    const bool remote = t.tier_of(c[0]) == CXLKV_TIER_SSD;
    EXPECT_EQ(t.kv->lookup(c), 1u);  // host 0 reads its own SSD
    EXPECT_EQ(kv1.value()->lookup(c), remote ? 0u : 1u);
    EXPECT_EQ(kv_none.value()->lookup(c), remote ? 0u : 1u);
  }
  EXPECT_EQ(tier1.stats().reads, 0u);
}

// ---- placement and parallel reads on the real KV path (docs/eviction.md "The SSD tier") ----

TEST(TierKv, DemotionsOneBlockAtATimeSplitInProportionToDeviceBandwidth) {
  // Two SSD devices at a 2:1 bandwidth ratio; the store demotes each block
  // as memory fills, one call per block.
  TieredStore t(2, 32 << 20, /*promote=*/false, nullptr, 0, {2.0, 1.0});
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 32);  // 30 demotions
  size_t per_dev[2] = {0, 0};
  for (auto& c : a) {
    BlockLocation loc;
    ASSERT_NE(store_index(*t.kv).find_ready(c[0], &loc), CXLKV_INDEX_NO_SLOT);
    if (loc.tier == CXLKV_TIER_SSD) per_dev[loc.device]++;
  }
  EXPECT_EQ(per_dev[0], 20u);  // not 30/0
  EXPECT_EQ(per_dev[1], 10u);
  ReadOutcome o;
  for (auto& c : a) tally(t, c[0], &o);
  EXPECT_EQ(o.right, 32u);
}

TEST(TierKv, GetManyReadsItsSsdBlocksTogetherSeveralInFlight) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 18);  // 16 on the SSD
  std::vector<BlockKey> keys;
  for (auto& c : a)
    if (t.tier_of(c[0]) == CXLKV_TIER_SSD) keys.push_back(c[0]);
  ASSERT_EQ(keys.size(), 16u);
  // Baseline: one block per call is one I/O in flight.
  ASSERT_TRUE(t.get(keys[0]));
  EXPECT_EQ(t.ssd->device_info(0).peak_in_flight, 1u);
  const uint64_t submits_before = t.ssd->device_info(0).submits;
  std::vector<std::vector<std::byte>> bufs(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks(keys.size(), 1);
  for (auto& b : bufs) chunks.push_back({b.data(), kBlock});
  std::vector<int32_t> st(keys.size(), 99);
  auto n = t.kv->get_many(keys, chunks, nchunks, st);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(n.value(), keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    EXPECT_EQ(st[i], 0) << i;
    std::vector<std::byte> want(kBlock);
    fill_block(keys[i], want.data(), kBlock);
    EXPECT_TRUE(bufs[i] == want) << "block " << i;
  }
  EXPECT_GE(t.ssd->device_info(0).peak_in_flight, 8u);                 // all queued at once
  EXPECT_LE(t.ssd->device_info(0).submits - submits_before, 4u);       // in a few submissions, not 16
  EXPECT_EQ(t.tier->stats().reads, 1u + keys.size());
}

TEST(TierKv, GetManyOfADamagedSsdBlockIsAMissAndTheOthersAreServed) {
  TieredStore t(2, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto a = put_chains(t, 1000, 6);
  std::vector<BlockKey> keys;
  for (auto& c : a) keys.push_back(c[0]);
  BlockLocation loc;
  ASSERT_NE(store_index(*t.kv).find_ready(keys[0], &loc), CXLKV_INDEX_NO_SLOT);
  ASSERT_EQ(loc.tier, CXLKV_TIER_SSD);
  int fd = ::open(t.dir.file("ssd0").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk[16] = "not a block hdr";
  ASSERT_EQ(pwrite(fd, junk, sizeof junk, static_cast<off_t>(loc.offset * 512)), 16);  // the header
  ::close(fd);
  std::vector<std::vector<std::byte>> bufs(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks(keys.size(), 1);
  for (auto& b : bufs) chunks.push_back({b.data(), kBlock});
  std::vector<int32_t> st(keys.size(), 99);
  auto n = t.kv->get_many(keys, chunks, nchunks, st);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(st[0], kKvMiss);
  EXPECT_EQ(n.value(), keys.size() - 1);
  for (size_t i = 1; i < keys.size(); i++) {
    EXPECT_EQ(st[i], 0) << i;
    std::vector<std::byte> want(kBlock);
    fill_block(keys[i], want.data(), kBlock);
    EXPECT_TRUE(bufs[i] == want) << "block " << i;
  }
  EXPECT_EQ(t.kv->lookup(std::span(&keys[0], 1)), 0u);  // dropped
  ASSERT_TRUE(t.kv->get_many(keys, chunks, nchunks, st));
  EXPECT_EQ(st[0], kKvMiss);  // now a miss at pin
}

// Metrics (docs/operations.md "Metrics"): the node's SSD tier counters reach its stats line in the
// pool and the Prometheus exposition (cxlkv/metrics.hpp) as counters.
TEST(TierKv, SsdTierCountersReachThePoolStatsAndTheExposition) {
  TieredStore t(4, 32 << 20, /*promote=*/false);
  REQUIRE_STORE(t);
  auto c = chain(7, 12);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(t.put(c, i).ok()) << "block " << i;
  size_t on_ssd = 0;
  for (auto& k : c) {
    auto r = t.get(k);
    ASSERT_TRUE(r) << r.error().message();
    on_ssd += r.value() == CXLKV_TIER_SSD;
  }
  ASSERT_EQ(on_ssd, 8u);
  t.kv->flush_stats();
  auto nodes = read_pool_stats(t.sim.node(1), t.pool.mem);  // another node's view (rule 4)
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].ssd[CXLKV_SSD_DEMOTED], 8u);
  EXPECT_EQ(nodes[0].ssd[CXLKV_SSD_DEMOTED_BYTES], 8u * kBlock);
  EXPECT_EQ(nodes[0].ssd[CXLKV_SSD_READS], 8u);
  EXPECT_EQ(nodes[0].ssd[CXLKV_SSD_READ_BYTES], 8u * kBlock);
  EXPECT_EQ(nodes[0].ssd[CXLKV_SSD_READ_FAILURES], 0u);
  const std::string text = prometheus_exposition(nodes);
  EXPECT_NE(text.find("# TYPE cxlkv_ssd_demoted_blocks_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_ssd_demoted_blocks_total{node=\"0\"} 8\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_ssd_read_bytes_total{node=\"0\"} " + std::to_string(8u * kBlock) + "\n"),
            std::string::npos);
}
