// SPDX-License-Identifier: MIT
// The pool-wide capacity bound (index config line: max_blocks / max_bytes)
// is operator-written while nodes run (`cxlkvctl kv ... --mem-capacity`): a
// KV store that opened before the bound was set, or before it changed, obeys
// the bound in force, not the one it read at attach.  Every node on its own
// NonCoherentSim domain, so a node that kept a stale copy of the config line
// (no invalidation before reading it) is caught.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

// The bound as another node (an operator's cxlkvctl) sets it: one NT line.
void set_bound(SimPool& p, uint32_t by_node, uint64_t max_blocks) {
  auto cur = index_policy(p.sim.node(by_node), p.pool.mem);
  ASSERT_TRUE(cur.ok()) << cur.error().message();
  IndexPolicy pol;
  pol.max_blocks = max_blocks;
  pol.max_bytes = cur->max_bytes;
  pol.interleave_stripe = cur->interleave_stripe;
  pol.ndevices = cur->ndevices;
  auto r = index_set_policy(p.sim.node(by_node), p.pool.mem, pol);
  ASSERT_TRUE(r.ok()) << r.error().message();
}

size_t cached(KvStore& kv, uint64_t first_id, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += kv.lookup(chain(first_id + i, 1)) == 1;
  return k;
}

// Node `node`'s domain that never invalidates the index config line (the
// 64 bytes at carve + 64) and forwards everything else: a node that reads
// the bound without rule 4 keeps the copy it cached at attach.
class StaleConfigDomain final : public MemoryDomain {
 public:
  StaleConfigDomain(MemoryDomain& d, const void* carve)
      : d_(d), cfg_(static_cast<const std::byte*>(carve) + 64) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override { return "stale-config(" + d_.describe() + ")"; }
  void load(void* a, const void* b, size_t n) override { d_.load(a, b, n); }
  void store(void* a, const void* b, size_t n) override { d_.store(a, b, n); }
  void store_nt(void* a, const void* b, size_t n) override { d_.store_nt(a, b, n); }
  void flush(const void* p, size_t n) override { d_.flush(p, n); }
  void flush_bulk(const void* p, size_t n) override { d_.flush_bulk(p, n); }
  void invalidate(const void* p, size_t n) override {
    // The parts of [p, p+n) before and after the config line.
    const auto* b = static_cast<const std::byte*>(p);
    const auto* e = b + n;
    if (b < cfg_) d_.invalidate(b, static_cast<size_t>(std::min(e, cfg_) - b));
    if (e > cfg_ + 64) {
      const auto* from = std::max(b, cfg_ + 64);
      d_.invalidate(from, static_cast<size_t>(e - from));
    }
    if (b < cfg_ + 64 && e > cfg_) skipped++;
  }
  void invalidate_payload(const void* p, size_t n) override { invalidate(p, n); }
  void invalidate_clean(const void* p, size_t n) override { invalidate(p, n); }
  void fence() override { d_.fence(); }
  void copy_to_pool(void* a, const void* b, size_t n) override { d_.copy_to_pool(a, b, n); }
  void copy_from_pool(void* a, const void* b, size_t n) override {
    invalidate(b, n);
    d_.fence();
    d_.load(a, b, n);
  }
  void publish_line(void* a, const void* b) override { d_.publish_line(a, b); }
  int skipped = 0;  // invalidations of the config line dropped

 private:
  MemoryDomain& d_;
  const std::byte* cfg_;
};

// A store of node `node` whose index reads go through `index_domain`.
std::unique_ptr<KvStore> store_through(SimPool& p, uint32_t node, MemoryDomain& index_domain) {
  return SimPool::make(p.deps(node, &index_domain, &p.sim.node(node)));
}

// Longer than the index's refresh period of the bound (50 ms).
constexpr auto kAfterRefresh = std::chrono::milliseconds(200);

}  // namespace

TEST(KvCapacity, BoundSetAfterTheStoreOpenedIsObeyed) {
  SimPool p(2);
  auto a = p.store(0);
  ASSERT_TRUE(a);
  // The store has read the (unbounded) config and used it.
  for (uint64_t id = 100; id < 102; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok());
  set_bound(p, 1, 4);  // node 1, the operator, bounds the pool to 4 blocks
  std::this_thread::sleep_for(kAfterRefresh);
  for (uint64_t id = 200; id < 210; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok()) << id;
  EXPECT_LE(cached(*a, 100, 2) + cached(*a, 200, 10), 4u) << "the pool holds at most the bound set after open";
  EXPECT_GE(store_index(*a).counters().evictions, 8u);
}

TEST(KvCapacity, BoundRaisedWhileTheStoreRunsIsObeyed) {
  IndexFormatOptions o = SimPool::small_index();
  o.max_blocks = 2;
  SimPool p(2, 0.0, o);
  auto a = p.store(0);
  ASSERT_TRUE(a);
  for (uint64_t id = 300; id < 304; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok());
  EXPECT_EQ(cached(*a, 300, 4), 2u) << "the bound read at open";
  set_bound(p, 1, 6);
  std::this_thread::sleep_for(kAfterRefresh);
  for (uint64_t id = 400; id < 406; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok());
  EXPECT_EQ(cached(*a, 300, 4) + cached(*a, 400, 6), 6u) << "the raised bound keeps six blocks";
}

TEST(KvCapacity, BoundSetBeforeTheFirstReserveAppliesAtOnce) {
  SimPool p(2);
  auto a = p.store(0);
  ASSERT_TRUE(a);
  set_bound(p, 1, 3);  // after open, before any reserve: no wait needed
  for (uint64_t id = 500; id < 508; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok());
  EXPECT_LE(cached(*a, 500, 8), 3u);
}

// The same scenario as BoundSetAfterTheStoreOpenedIsObeyed with the fresh
// read of the config line broken: node 0 keeps the unbounded copy it read at
// attach, and the pool holds every block.  Shows the first test depends on
// the invalidation (rule 4), not only on the store re-reading the line.
TEST(KvCapacity, BoundReadWithoutInvalidationIsCaught) {
  SimPool p(2);
  StaleConfigDomain stale(p.sim.node(0), p.pool.mem);
  auto a = store_through(p, 0, stale);
  ASSERT_TRUE(a);
  const int at_open = stale.skipped;  // the reads of the config line at attach
  for (uint64_t id = 100; id < 102; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok());
  set_bound(p, 1, 4);
  std::this_thread::sleep_for(kAfterRefresh);
  for (uint64_t id = 200; id < 210; id++) ASSERT_TRUE(put(*a, chain(id, 1), 0).ok()) << id;
  EXPECT_GT(stale.skipped, at_open) << "the store re-reads the config line after attach";
  EXPECT_EQ(cached(*a, 100, 2) + cached(*a, 200, 10), 12u) << "a stale bound (none) keeps every block";
  EXPECT_EQ(store_index(*a).counters().evictions, 0u);
}
