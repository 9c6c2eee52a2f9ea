// SPDX-License-Identifier: MIT
// The pnm metrics family as a specification: what a partition's writer
// process did (digest builds, near-memory select and attention steps, bytes
// read near memory vs bytes over the link, hybrid recalls) reaches the
// pool's Prometheus exposition -- the text `cxlkvctl stats --prometheus`,
// cxlkvd's metrics endpoint and cxlkv_stats_prometheus() return -- as read
// by another host under NonCoherentSim with random evictions; totals
// survive a new writer of the partition; a read-only store's steps stay in
// its process; removing the writer's write-back or the reader's invalidate
// is caught; one definition per metric name.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cxlkv/gpu.hpp"
#include "cxlkv/metrics.hpp"
#include "pnm/pnm_internal.hpp"
#include "cxlkv/format/pnm_format.h"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

constexpr uint64_t kPool = 16ull << 20;

StoreOptions store_opts(uint32_t partition, bool writer = true) {
  StoreOptions o;
  o.carve_bytes = 4ull << 20;
  o.partitions = 2;
  o.slots_per_partition = 8;
  o.partition = partition;
  o.writer = writer;
  return o;
}

Geometry geo() {
  Geometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 32;
  g.dtype = Dtype::bf16;
  g.page_tokens = 16;
  g.max_tokens = 512;
  return g;
}

// Samples of the exposition: "name{labels}" -> value.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

double sample(const std::map<std::string, double>& s, const std::string& key) {
  auto it = s.find(key);
  return it == s.end() ? -1.0 : it->second;
}

std::string ctr(int c, uint32_t part) {
  return std::string(pnm_counter_metric(c).name) + "{partition=\"" + std::to_string(part) + "\"}";
}
std::string hist_count(int l, uint32_t part) {
  return std::string(pnm_latency_metric(l).name) + "_count{partition=\"" + std::to_string(part) + "\"}";
}

void append_random(Context& c, uint32_t n, std::mt19937_64& rng) {
  const Geometry& g = c.geometry();
  Tensor k = random_tensor(g.dtype, size_t(g.layers) * g.kv_heads * n * g.head_dim, rng);
  Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
  ASSERT_TRUE(c.append(k.data(), v.data(), n).ok());
}

std::vector<float> queries(const Geometry& g, uint32_t q_heads, std::mt19937_64& rng) {
  std::vector<float> q(size_t(g.layers) * q_heads * g.head_dim);
  std::normal_distribution<float> nd;
  for (auto& x : q) x = nd(rng);
  return q;
}

}  // namespace

TEST(PnmMetrics, EveryFamilyHasOneDefinitionWithUnitsInItsName) {
  std::set<std::string> names;
  for (int c = 0; c < int(CXLKV_PNM_CTR_COUNT); c++) {
    const MetricDesc& m = pnm_counter_metric(c);
    EXPECT_STREQ("counter", m.type);
    EXPECT_EQ(0u, std::string(m.name).rfind("cxlkv_pnm_", 0)) << m.name;
    EXPECT_TRUE(std::string(m.name).ends_with("_total")) << m.name;
    EXPECT_TRUE(names.insert(m.name).second) << "defined twice: " << m.name;
  }
  for (int l = 0; l < int(CXLKV_PNM_LAT_COUNT); l++) {
    const MetricDesc& m = pnm_latency_metric(l);
    EXPECT_STREQ("histogram", m.type);
    EXPECT_TRUE(std::string(m.name).ends_with("_seconds")) << m.name;
    EXPECT_TRUE(names.insert(m.name).second) << "defined twice: " << m.name;
  }
  EXPECT_STREQ("cxlkv_unknown", pnm_counter_metric(CXLKV_PNM_CTR_COUNT).name);
  EXPECT_STREQ("cxlkv_unknown", pnm_latency_metric(-1).name);
}

TEST(PnmMetrics, NoPnmCarveNoPnmFamilies) {
  SharedPool pool(kPool, 1, 0.0);
  EXPECT_EQ("", prometheus_pnm_exposition(pool.host(0)));
  EXPECT_EQ(std::string::npos, prometheus_region_exposition(pool.host(0)).find("cxlkv_pnm_"));
}

TEST(PnmMetrics, WhatTheWriterDidReachesAnotherHostsExpositionUnderRandomEvictions) {
  SharedPool pool(kPool, 2, 0.3, true, 0.2);
  auto ws = ContextStore::open(pool.host(0), store_opts(1));
  ASSERT_TRUE(ws.ok()) << ws.error().message();
  // Before anything was recorded: the families are there, without samples.
  {
    const std::string text = prometheus_region_exposition(pool.host(1));
    for (int c = 0; c < int(CXLKV_PNM_CTR_COUNT); c++)
      EXPECT_NE(std::string::npos, text.find(std::string("# TYPE ") + pnm_counter_metric(c).name + " counter"));
    EXPECT_EQ(-1.0, sample(samples(text), ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 1)));
  }
  const Geometry g = geo();
  auto c = (*ws)->create(7, g);
  ASSERT_TRUE(c.ok()) << c.error().message();
  std::mt19937_64 rng(5);
  append_random(**c, 40, rng);  // pages 0..2
  append_random(**c, 30, rng);  // pages 2..4
  append_random(**c, 1, rng);   // page 4
  const uint64_t db = 2ull * g.head_dim * 2;  // bf16 min + max
  const uint64_t digest_written = (3 + 3 + 1) * uint64_t(g.layers) * g.kv_heads * db;

  Engine eng({1, -1});  // one thread: a NonCoherentSim node is one thread's cache
  const uint32_t qh = 4;
  auto q = queries(g, qh, rng);
  StepRequest req;
  req.ctx = c->get();
  req.queries = q;
  req.q_heads = qh;
  req.select.token_budget = 32;
  StepResult a = eng.step(req);
  ASSERT_TRUE(a.status.ok()) << a.status.error().message();
  req.all_pages = true;
  StepResult b = eng.step(req);
  ASSERT_TRUE(b.status.ok());
  req.all_pages = false;
  req.q_heads = 3;  // not a multiple of kv_heads: a failed step
  StepResult bad = eng.step(req);
  ASSERT_FALSE(bad.status.ok());

  uint64_t selected = 0;
  for (const auto& p : a.selection.pages) selected += p.size();
  const auto s = samples(prometheus_region_exposition(pool.host(1)));
  EXPECT_EQ(3, sample(s, ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 1)));
  EXPECT_EQ(0, sample(s, ctr(CXLKV_PNM_CTR_GPU_DIGEST_BUILDS, 1)));
  EXPECT_EQ(71, sample(s, ctr(CXLKV_PNM_CTR_APPENDED_TOKENS, 1)));
  EXPECT_EQ(double(digest_written), sample(s, ctr(CXLKV_PNM_CTR_DIGEST_WRITE_BYTES, 1)));
  EXPECT_EQ(1, sample(s, ctr(CXLKV_PNM_CTR_SELECT_STEPS, 1)));
  EXPECT_EQ(double(selected), sample(s, ctr(CXLKV_PNM_CTR_SELECTED_PAGES, 1)));
  EXPECT_EQ(2, sample(s, ctr(CXLKV_PNM_CTR_ATTEND_STEPS, 1)));
  EXPECT_EQ(1, sample(s, ctr(CXLKV_PNM_CTR_STEP_ERRORS, 1)));
  EXPECT_EQ(double(a.digest_bytes + b.digest_bytes), sample(s, ctr(CXLKV_PNM_CTR_DIGEST_READ_BYTES, 1)));
  EXPECT_EQ(double(a.kv_bytes + b.kv_bytes), sample(s, ctr(CXLKV_PNM_CTR_KV_READ_BYTES, 1)));
  EXPECT_EQ(double(a.link_bytes_near + b.link_bytes_near), sample(s, ctr(CXLKV_PNM_CTR_LINK_BYTES, 1)));
  EXPECT_EQ(double(a.link_bytes_selected + b.link_bytes_selected),
            sample(s, ctr(CXLKV_PNM_CTR_LINK_SELECTED_BYTES, 1)));
  EXPECT_EQ(double(a.link_bytes_all + b.link_bytes_all), sample(s, ctr(CXLKV_PNM_CTR_LINK_ALL_BYTES, 1)));
  // Near-memory attention sent far fewer bytes over the link than recalling would have.
  EXPECT_LT(sample(s, ctr(CXLKV_PNM_CTR_LINK_BYTES, 1)), sample(s, ctr(CXLKV_PNM_CTR_LINK_ALL_BYTES, 1)));
  EXPECT_EQ(3, sample(s, hist_count(CXLKV_PNM_LAT_DIGEST_BUILD, 1)));
  EXPECT_EQ(1, sample(s, hist_count(CXLKV_PNM_LAT_SELECT, 1)));
  EXPECT_EQ(2, sample(s, hist_count(CXLKV_PNM_LAT_ATTEND, 1)));
  EXPECT_EQ(2, sample(s, std::string(pnm_latency_metric(CXLKV_PNM_LAT_ATTEND).name) +
                             "_bucket{partition=\"1\",le=\"+Inf\"}"));
  // Partition 0 has had no writer: no samples of it.
  EXPECT_EQ(-1.0, sample(s, ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 0)));
  // The store's own copy says the same.
  cxlkv_pnm_part_stats mine{};
  (*ws)->stats(&mine);
  EXPECT_EQ(3u, mine.counters[CXLKV_PNM_CTR_DIGEST_BUILDS]);
  EXPECT_EQ(2u, mine.counters[CXLKV_PNM_CTR_ATTEND_STEPS]);
}

TEST(PnmMetrics, ANewWriterOfThePartitionContinuesTheTotals) {
  SharedPool pool(kPool, 2, 0.3);
  std::mt19937_64 rng(6);
  {
    auto ws = ContextStore::open(pool.host(0), store_opts(0));
    ASSERT_TRUE(ws.ok());
    auto c = (*ws)->create(1, geo());
    ASSERT_TRUE(c.ok());
    append_random(**c, 20, rng);
    c->reset();
  }
  // The next writer of partition 0, on another host.
  auto ws = ContextStore::open(pool.host(1), store_opts(0));
  ASSERT_TRUE(ws.ok()) << ws.error().message();
  auto c = (*ws)->create(2, geo());
  ASSERT_TRUE(c.ok());
  append_random(**c, 5, rng);
  const auto s = samples(prometheus_region_exposition(pool.host(0)));
  EXPECT_EQ(2, sample(s, ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 0)));
  EXPECT_EQ(25, sample(s, ctr(CXLKV_PNM_CTR_APPENDED_TOKENS, 0)));
}

TEST(PnmMetrics, AReadOnlyStoresStepsStayInItsProcess) {
  SharedPool pool(kPool, 2, 0.0);
  auto ws = ContextStore::open(pool.host(0), store_opts(0));
  ASSERT_TRUE(ws.ok());
  auto w = (*ws)->create(3, geo());
  ASSERT_TRUE(w.ok());
  std::mt19937_64 rng(7);
  append_random(**w, 64, rng);
  auto rs = ContextStore::open(pool.host(1), store_opts(0, false));
  ASSERT_TRUE(rs.ok());
  auto r = (*rs)->find(3);
  ASSERT_TRUE(r.ok());
  Engine eng;
  auto q = queries(geo(), 2, rng);
  StepRequest req;
  req.ctx = r->get();
  req.queries = q;
  req.q_heads = 2;
  ASSERT_TRUE(eng.step(req).status.ok());
  cxlkv_pnm_part_stats mine{};
  (*rs)->stats(&mine);
  EXPECT_EQ(1u, mine.counters[CXLKV_PNM_CTR_SELECT_STEPS]);
  const auto s = samples(prometheus_region_exposition(pool.host(0)));
  EXPECT_EQ(0, sample(s, ctr(CXLKV_PNM_CTR_SELECT_STEPS, 0))) << "a reader has no stats lines to store into";
  EXPECT_EQ(1, sample(s, ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 0)));
}

TEST(PnmMetrics, HybridStepsCountTheirRecalls) {
  SharedPool pool(kPool, 1, 0.0);
  auto ws = ContextStore::open(pool.host(0), store_opts(0));
  ASSERT_TRUE(ws.ok());
  auto c = (*ws)->create(4, geo());
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(8);
  append_random(**c, 100, rng);
  auto gp = gpu::GpuPool::open(gpu::CudaLibrary::cpu_reference(), pool.base(), pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  auto h = HybridRequest::create(**c, **gp, 2);
  ASSERT_TRUE(h.ok()) << h.error().message();
  auto q = queries(geo(), 2, rng);
  SelectOptions so;
  so.token_budget = 48;
  HybridStats st;
  ASSERT_TRUE((*h)->step(q, 2, 100, so, &st).ok());
  ASSERT_GT(st.recall_bytes, 0u);
  const auto s = samples(prometheus_region_exposition(pool.host(0)));
  EXPECT_EQ(1, sample(s, ctr(CXLKV_PNM_CTR_HYBRID_STEPS, 0)));
  EXPECT_EQ(double(st.recall_bytes), sample(s, ctr(CXLKV_PNM_CTR_HYBRID_RECALL_BYTES, 0)));
}

namespace {
// Host 1 reads the exposition (caching the stats lines), host 0 appends
// once more, host 1 reads again: the second read must show the new build.
double second_read_builds(SharedPool& pool) {
  auto ws = ContextStore::open(pool.host(0), store_opts(0));
  if (!ws.ok()) return -2;
  auto c = (*ws)->create(5, geo());
  if (!c.ok()) return -2;
  std::mt19937_64 rng(9);
  append_random(**c, 16, rng);
  (void)prometheus_region_exposition(pool.host(1));
  append_random(**c, 16, rng);
  return sample(samples(prometheus_region_exposition(pool.host(1))), ctr(CXLKV_PNM_CTR_DIGEST_BUILDS, 0));
}
}  // namespace

TEST(PnmMetrics, RemovedReaderInvalidateIsCaught) {
  {
    SharedPool pool(kPool, 2, 0.0);
    EXPECT_EQ(2, second_read_builds(pool));
  }
  SharedPool pool(kPool, 2, 0.0);
  pnm::testing::faults().skip_reader_invalidate = true;
  const double seen = second_read_builds(pool);
  pnm::testing::faults().skip_reader_invalidate = false;
  EXPECT_EQ(1, seen) << "the exposition without invalidate should have shown host 1's stale cached lines";
}

TEST(PnmMetrics, RemovedWriterWriteBackIsCaught) {
  SharedPool pool(kPool, 2, 0.0);
  pnm::testing::faults().skip_writer_flush = true;
  const double seen = second_read_builds(pool);
  pnm::testing::faults().skip_writer_flush = false;
  EXPECT_NE(2, seen) << "stats lines left in the writer's cache went unnoticed";
}
