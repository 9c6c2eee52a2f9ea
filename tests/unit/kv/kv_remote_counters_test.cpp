// SPDX-License-Identifier: MIT
// The node's remote tier counters (docs/remote.md "Counters"): added through
// KvStore::count_remote (the C call cxlkv_kv_remote_count), they reach the
// last two lines of the node's stats record in the pool at once, read by another
// node (rule 4); every store of the same carve and node in the process
// shares them, so a flush of another store's stats writes them too, never
// zeros; and the Prometheus exposition names them once (cxlkv/metrics.hpp).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "cxlkv/metrics.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

const NodeKvStats* node_of(const std::vector<NodeKvStats>& v, uint32_t node) {
  for (auto& n : v)
    if (n.node == node) return &n;
  return nullptr;
}

TEST(KvRemoteCounters, TheLastTwoLinesOfTheNodeStats) {
  static_assert(offsetof(cxlkv_index_node_stats, remote) == 39 * 64);
  static_assert(sizeof(cxlkv_index_node_stats::remote) == 2 * 64);
  static_assert(CXLKV_INDEX_STATS_LINES == 41 && CXLKV_INDEX_VERSION == 6);
  static_assert(sizeof(cxlkv_index_node_stats) == CXLKV_INDEX_STATS_LINES * 64);
  // Every counter has a name, and the name finds it back.
  for (int r = 0; r < int(CXLKV_REMOTE_COUNT); r++) {
    const std::string_view n = remote_counter_name(r);
    EXPECT_FALSE(n.empty()) << r;
    EXPECT_EQ(remote_counter_index(n), r) << n;
    EXPECT_EQ(std::string(remote_metric(r).name), "cxlkv_remote_" + std::string(n) + "_total");
  }
  EXPECT_EQ(remote_counter_name(CXLKV_REMOTE_HIT_BLOCKS), "hit_blocks");
  EXPECT_EQ(remote_counter_name(CXLKV_REMOTE_PUSH_EVICTED_BLOCKS), "push_evicted_blocks");
  EXPECT_EQ(remote_counter_name(CXLKV_REMOTE_RECOVERED), "recovered");
  EXPECT_EQ(remote_counter_index("no_such_counter"), -1);
  EXPECT_EQ(remote_counter_index(""), -1);
}

TEST(KvRemoteCounters, ReachThePoolAtOnceAndSurviveOtherStoresFlushes) {
  SimPool p(3);
  auto engine = p.store(1);  // the engine's handle of node 1
  auto tier = p.store(1);    // the remote tier's own handle of node 1
  ASSERT_TRUE(engine && tier);
  // A node that only counted remote work is listed (its record never flushed).
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_HIT_BLOCKS, 4).ok());
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_HIT_BYTES, 4 * 4096).ok());
  auto seen = read_pool_stats(p.sim.node(2), p.pool.mem);  // another node's view (rule 4)
  auto* n1 = node_of(seen, 1);
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_HIT_BLOCKS], 4u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_HIT_BYTES], 4u * 4096);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSHED_BLOCKS], 0u);

  // The engine's handle flushes its own counters: the remote ones stay.
  auto c = chain(5, 3);
  for (size_t i = 0; i < c.size(); i++) ASSERT_TRUE(put(*engine, c, i).ok());
  EXPECT_EQ(engine->lookup(c), 3u);
  engine->flush_stats();
  seen = read_pool_stats(p.sim.node(2), p.pool.mem);
  n1 = node_of(seen, 1);
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1->stats.counters[CXLKV_CTR_HIT_BLOCKS], 3u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_HIT_BLOCKS], 4u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_HIT_BYTES], 4u * 4096);

  // Counts from several threads at once (the tier's pusher and lookups)
  // beside flushes: none is lost.
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; t++)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; i++) EXPECT_TRUE(tier->count_remote(CXLKV_REMOTE_PUSHED_BLOCKS, 1).ok());
    });
  for (int i = 0; i < 50; i++) engine->flush_stats();
  for (auto& t : ts) t.join();
  seen = read_pool_stats(p.sim.node(0), p.pool.mem);
  n1 = node_of(seen, 1);
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSHED_BLOCKS], 4000u);

  // The second line (why blocks were not pushed, ...) reaches the pool as
  // the first does, and leaves the first as it was.
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_PUSH_DROPPED_BLOCKS, 5).ok());
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_PUSH_EVICTED_BLOCKS, 3).ok());
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_PUSH_QUEUE_FULL_BLOCKS, 2).ok());
  ASSERT_TRUE(tier->count_remote(CXLKV_REMOTE_RECOVERED, 1).ok());
  seen = read_pool_stats(p.sim.node(2), p.pool.mem);
  n1 = node_of(seen, 1);
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSH_DROPPED_BLOCKS], 5u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSH_EVICTED_BLOCKS], 3u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSH_QUEUE_FULL_BLOCKS], 2u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_RECOVERED], 1u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSHED_BLOCKS], 4000u);
  engine->flush_stats();  // a whole-record flush writes both lines as counted
  seen = read_pool_stats(p.sim.node(0), p.pool.mem);
  n1 = node_of(seen, 1);
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_PUSH_EVICTED_BLOCKS], 3u);
  EXPECT_EQ(n1->remote[CXLKV_REMOTE_HIT_BLOCKS], 4u);

  // Another node's counters are its own.
  auto other = p.store(2);
  ASSERT_TRUE(other->count_remote(CXLKV_REMOTE_DEGRADED, 1).ok());
  seen = read_pool_stats(p.sim.node(0), p.pool.mem);
  EXPECT_EQ(node_of(seen, 2)->remote[CXLKV_REMOTE_DEGRADED], 1u);
  EXPECT_EQ(node_of(seen, 1)->remote[CXLKV_REMOTE_DEGRADED], 0u);

  // An unknown counter is refused and changes nothing.
  auto bad = tier->count_remote(CXLKV_REMOTE_COUNT, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), -EINVAL);

  // The exposition: one family per counter, per node.
  const std::string text = prometheus_exposition(seen);
  EXPECT_NE(text.find("# TYPE cxlkv_remote_hit_blocks_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_remote_hit_blocks_total{node=\"1\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_remote_pushed_blocks_total{node=\"1\"} 4000\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_remote_degraded_total{node=\"2\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("cxlkv_remote_push_evicted_blocks_total{node=\"1\"} 3\n"), std::string::npos);
}

TEST(KvRemoteCounters, ANewProcessStartsItsCountersAgain) {
  // The counters belong to the stores of a carve and node alive in this
  // process: when the last one closes they go, as a process's do at exit,
  // and the next store of that node counts from zero (a Prometheus reset).
  SimPool p(2);
  {
    auto a = p.store(1);
    ASSERT_TRUE(a->count_remote(CXLKV_REMOTE_MISS_BLOCKS, 7).ok());
  }
  auto b = p.store(1);
  ASSERT_TRUE(b->count_remote(CXLKV_REMOTE_MISS_BLOCKS, 1).ok());
  auto seen = read_pool_stats(p.sim.node(0), p.pool.mem);
  ASSERT_NE(node_of(seen, 1), nullptr);
  EXPECT_EQ(node_of(seen, 1)->remote[CXLKV_REMOTE_MISS_BLOCKS], 1u);
}

}  // namespace
