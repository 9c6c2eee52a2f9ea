// SPDX-License-Identifier: MIT
// Hybrid steady-token mode and engines as a specification: Algorithm 1's
// masks equal a direct set computation on random sequences of top sets; a
// hybrid step (GPU part over resident pages recalled through the sparse-read
// path, CPU stand-in library) merged with the near-memory part equals
// attention over the selection; steady queries recall nothing; several
// engines serve requests data-parallel with the single-engine results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "cxlkv/gpu.hpp"
#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

TEST(PnmSteady, MasksMatchADirectSetComputationOfAlgorithm1OnRandomTopSequences) {
  std::mt19937_64 rng(1);
  for (int seq = 0; seq < 40; seq++) {
    const uint32_t np = 1 + uint32_t(rng() % 150), cap = uint32_t(rng() % 40);
    std::set<uint32_t> R;  // the direct computation's resident set
    PageMask mask;         // the mask implementation's
    for (int step = 0; step < 25; step++) {
      std::vector<float> scores(np);
      for (auto& s : scores) s = float(rng() % 50);
      const uint32_t k = uint32_t(rng() % (np + 1));
      std::vector<uint32_t> top = top_pages(scores.data(), np, k, 1, 1);
      SteadyStep st = steady_step(mask, top, scores, np, cap);

      const std::set<uint32_t> S(top.begin(), top.end());
      std::set<uint32_t> E, kept;
      for (uint32_t p : R) (S.count(p) ? kept : E).insert(p);
      std::vector<uint32_t> N;
      for (uint32_t p : S)
        if (!R.count(p)) N.push_back(p);
      std::sort(N.begin(), N.end(), [&](uint32_t a, uint32_t b) {
        return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
      });
      const size_t room = cap > kept.size() ? cap - kept.size() : 0;
      std::set<uint32_t> rec(N.begin(), N.begin() + std::min(room, N.size()));
      std::set<uint32_t> R2 = kept;
      R2.insert(rec.begin(), rec.end());
      std::set<uint32_t> near;
      for (uint32_t p : S)
        if (!R2.count(p)) near.insert(p);

      auto as_vec = [](const std::set<uint32_t>& s) { return std::vector<uint32_t>(s.begin(), s.end()); };
      ASSERT_EQ(as_vec(E), from_mask(st.evict)) << "seq " << seq << " step " << step;
      ASSERT_EQ(as_vec(rec), from_mask(st.recall));
      ASSERT_EQ(as_vec(R2), from_mask(st.resident));
      ASSERT_EQ(as_vec(near), from_mask(st.near));
      ASSERT_EQ(E.size(), st.evicted);
      ASSERT_EQ(rec.size(), st.recalled);
      ASSERT_LE(R2.size(), std::max<size_t>(cap, 0));
      R = R2;
      mask = st.resident;
    }
  }
}

namespace {

struct HybridFixture {
  HybridFixture(uint32_t n, uint64_t seed, bool sim = true) : pool(32ull << 20, 2, 0.02, sim), rng(seed) {
    StoreOptions so;
    so.carve_bytes = 8ull << 20;
    ws = std::move(ContextStore::open(pool.host(0), so)).value();
    so.writer = false;
    rs = std::move(ContextStore::open(pool.host(1), so)).value();
    g = Geometry{2, 2, 32, Dtype::bf16, 16, 2048};
    w = std::move(ws->create(5, g)).value();
    add(n);
    r = std::move(rs->find(5)).value();
  }
  void add(uint32_t n) {
    Tensor k = random_tensor(g.dtype, size_t(4) * n * 32, rng);
    Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
    ASSERT_TRUE(w->append(k.data(), v.data(), n).ok());
    for (uint32_t lh = 0; lh < 4; lh++) {  // what was appended, per (layer, KV head): [t][32]
      kh[lh].insert(kh[lh].end(), k.vals.begin() + size_t(lh) * n * 32, k.vals.begin() + size_t(lh + 1) * n * 32);
      vh[lh].insert(vh[lh].end(), v.vals.begin() + size_t(lh) * n * 32, v.vals.begin() + size_t(lh + 1) * n * 32);
    }
  }
  // Max deviation of p from float64 attention of each query head over the
  // tokens of sel's pages of its KV head (first ntok tokens).
  double float64_deviation(const Partial& p, const std::vector<float>& q, const Selection& sel, uint64_t ntok) const {
    double worst = 0;
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t j = 0; j < 4; j++) {
        const uint32_t lh = l * 2 + j / 2;
        std::vector<const float*> ks, vs;
        for (uint32_t pg : sel.at(l, j / 2))
          for (uint64_t t = uint64_t(pg) * 16; t < std::min<uint64_t>(ntok, uint64_t(pg + 1) * 16); t++) {
            ks.push_back(&kh[lh][t * 32]);
            vs.push_back(&vh[lh][t * 32]);
          }
        double qd[32], out[32], lse;
        for (int d = 0; d < 32; d++) qd[d] = q[(size_t(l) * 4 + j) * 32 + d];
        ref_attention(qd, ks, vs, 32, 1.0 / std::sqrt(32.0), out, &lse);
        const size_t i = size_t(l) * 4 + j;
        worst = std::max(worst, std::fabs(lse - p.lse[i]));
        for (int d = 0; d < 32; d++) worst = std::max(worst, std::fabs(out[d] - p.out[i * 32 + d]));
      }
    return worst;
  }
  std::vector<float> kh[4], vh[4];
  std::vector<float> query() {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(size_t(2) * 4 * 32);
    for (auto& x : q) x = nd(rng);
    return q;
  }
  SharedPool pool;
  std::mt19937_64 rng;
  std::unique_ptr<ContextStore> ws, rs;
  std::unique_ptr<Context> w, r;
  Geometry g;
};

double max_diff(const Partial& a, const Partial& b) {
  double d = 0;
  for (size_t i = 0; i < a.out.size(); i++) d = std::max(d, double(std::fabs(a.out[i] - b.out[i])));
  for (size_t i = 0; i < a.lse.size(); i++) d = std::max(d, double(std::fabs(a.lse[i] - b.lse[i])));
  return d;
}

}  // namespace

TEST(PnmHybrid, StepsMergeGpuAndNearMemoryPartsIntoAttentionOverTheSelection) {
  HybridFixture f(300, 2);
  auto lib = gpu::CudaLibrary::cpu_reference();
  auto gp = gpu::GpuPool::open(lib, f.pool.base(), f.pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  auto hy = HybridRequest::create(*f.r, **gp, 6);
  ASSERT_TRUE(hy.ok()) << hy.error().message();
  SelectOptions o;
  o.token_budget = 10 * 16;
  uint64_t total_recalled = 0;
  for (int step = 0; step < 6; step++) {
    if (step % 2) f.add(7);  // decode appends tokens: the newest page grows
    auto n = f.r->refresh();
    ASSERT_TRUE(n.ok());
    auto q = f.query();
    HybridStats st;
    auto h = (*hy)->step(q, 4, *n, o, &st);
    ASSERT_TRUE(h.ok()) << h.error().message();
    auto sel = select_pages(*f.r, q, 4, *n, o);
    ASSERT_TRUE(sel.ok());
    auto want = attend(*f.r, q, 4, *n, &*sel);
    ASSERT_TRUE(want.ok());
    EXPECT_LT(max_diff(*h, *want), 1e-4) << "step " << step;
    EXPECT_GT(st.gpu_pages, 0u);
    EXPECT_GT(st.near_pages, 0u) << "10 selected pages, 6 resident: some are computed near memory";
    EXPECT_EQ(st.gpu_pages + st.near_pages, 4u * 10);
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t hd = 0; hd < 2; hd++) EXPECT_LE(from_mask((*hy)->resident(l, hd)).size(), 6u);
    total_recalled += st.recalled;
  }
  EXPECT_GT(total_recalled, 0u);
  // The same query twice: the resident set is steady, nothing to recall.
  auto q = f.query();
  const uint64_t n = f.r->tokens();
  HybridStats a, b;
  ASSERT_TRUE((*hy)->step(q, 4, n, o, &a).ok());
  ASSERT_TRUE((*hy)->step(q, 4, n, o, &b).ok());
  EXPECT_EQ(0u, b.recalled);
  EXPECT_EQ(0u, b.evicted);
  EXPECT_EQ(0u, b.recall_bytes);
}

TEST(PnmHybrid, GpuAndNearMemoryPartsMergeIntoAFloat64AttentionOverTheirUnion) {
  // The log-sum-exp merge of the GPU part (resident pages, recalled through
  // the sparse-read path) and the near-memory part (the rest of the
  // selection) against a float64 attention over the union -- the step's
  // selection -- computed from what was appended, over decode steps that
  // append, evict and recall.
  HybridFixture f(260, 4);
  auto gp = gpu::GpuPool::open(gpu::CudaLibrary::cpu_reference(), f.pool.base(), f.pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  auto hy = HybridRequest::create(*f.r, **gp, 4);
  ASSERT_TRUE(hy.ok()) << hy.error().message();
  SelectOptions o;
  o.token_budget = 9 * 16;
  uint32_t both = 0;
  for (int step = 0; step < 6; step++) {
    f.add(5);
    auto n = f.r->refresh();
    ASSERT_TRUE(n.ok());
    auto q = f.query();
    HybridStats st;
    auto h = (*hy)->step(q, 4, *n, o, &st);
    ASSERT_TRUE(h.ok()) << h.error().message();
    auto sel = select_pages(*f.r, q, 4, *n, o);
    ASSERT_TRUE(sel.ok());
    EXPECT_LT(f.float64_deviation(*h, q, *sel, *n), 2e-3) << "step " << step;
    if (st.gpu_pages && st.near_pages) both++;
  }
  EXPECT_GT(both, 0u) << "no step had both a GPU and a near-memory part";
}

TEST(PnmHybrid, AutoSteadySetIsSizedFromTheMeasuredOverlapOfSuccessiveSelections) {
  HybridFixture f(300, 3);
  auto gp = gpu::GpuPool::open(gpu::CudaLibrary::cpu_reference(), f.pool.base(), f.pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  auto hy = HybridRequest::create(*f.r, **gp, 10, true);
  ASSERT_TRUE(hy.ok()) << hy.error().message();
  SelectOptions o;
  o.token_budget = 10 * 16;
  const uint64_t n = f.r->tokens();
  const uint32_t pairs = 4;
  std::vector<std::vector<uint32_t>> last;
  std::vector<float> avg(pairs, -1.f);
  auto q_same = f.query();
  for (int step = 0; step < 6; step++) {
    auto q = step < 3 ? q_same : f.query();  // steady queries, then new ones each step
    HybridStats st;
    auto h = (*hy)->step(q, 4, n, o, &st);
    ASSERT_TRUE(h.ok()) << h.error().message();
    auto sel = select_pages(*f.r, q, 4, n, o);
    ASSERT_TRUE(sel.ok());
    auto want = attend(*f.r, q, 4, n, &*sel);
    ASSERT_TRUE(want.ok());
    EXPECT_LT(max_diff(*h, *want), 1e-4) << "step " << step;
    // The overlap with the last selection, and the steady size it gives: a
    // moving average (weight 1/2), rounded up, within [1, 10].
    uint64_t overlap = 0, steady = 0;
    for (uint32_t i = 0; i < pairs; i++) {
      uint32_t ov = 0;
      if (!last.empty())
        for (uint32_t p : sel->pages[i]) ov += std::binary_search(last[i].begin(), last[i].end(), p);
      overlap += ov;
      if (!last.empty()) avg[i] = avg[i] < 0 ? float(ov) : 0.5f * avg[i] + 0.5f * float(ov);
      steady += last.empty() ? 10 : std::clamp<uint32_t>(uint32_t(std::ceil(avg[i])), 1u, 10u);
      for (uint32_t l = 0; l < 2; l++)
        for (uint32_t hd = 0; hd < 2; hd++) EXPECT_LE(from_mask((*hy)->resident(l, hd)).size(), 10u);
    }
    EXPECT_EQ(overlap, st.overlap) << "step " << step;
    EXPECT_EQ(steady, st.steady) << "step " << step;
    if (step == 1 || step == 2) {
      EXPECT_EQ(pairs * 10u, st.overlap) << "the same query selects the same pages";
    }
    last = sel->pages;
  }
}

TEST(PnmEngines, SeveralEnginesServeRequestsDataParallelWithSingleEngineResults) {
  HybridFixture f(400, 3, false);
  // Three more contexts in the same carve.
  std::vector<std::unique_ptr<Context>> ctxs;
  ctxs.push_back(std::move(f.r));
  for (uint64_t id = 6; id < 9; id++) {
    auto w = f.ws->create(id, f.g);
    ASSERT_TRUE(w.ok());
    const uint32_t n = 100 + uint32_t(id) * 37;
    Tensor k = random_tensor(f.g.dtype, size_t(4) * n * 32, f.rng);
    Tensor v = random_tensor(f.g.dtype, k.vals.size(), f.rng);
    ASSERT_TRUE((*w)->append(k.data(), v.data(), n).ok());
    auto rd = f.rs->find(id);
    ASSERT_TRUE(rd.ok());
    ctxs.push_back(std::move(rd.value()));
  }
  std::vector<std::vector<float>> qs;
  std::vector<StepRequest> reqs;
  for (size_t i = 0; i < ctxs.size(); i++) qs.push_back(f.query());
  for (size_t i = 0; i < ctxs.size(); i++) {
    StepRequest rq;
    rq.ctx = ctxs[i].get();
    rq.queries = qs[i];
    rq.q_heads = 4;
    rq.select.token_budget = 64;
    rq.all_pages = (i == 3);
    reqs.push_back(rq);
  }
  // A coherent pool here: a NonCoherentSim node is one thread's cache, and
  // the engines read with several threads (the store tests cover the sim).
  EngineGroup group({{2, -1}, {2, -1}});
  ASSERT_EQ(2u, group.size());
  auto res = group.step(reqs);
  ASSERT_EQ(4u, res.size());
  for (size_t i = 0; i < reqs.size(); i++) {
    ASSERT_TRUE(res[i].status.ok()) << res[i].status.error().message();
    auto n = ctxs[i]->tokens();
    EXPECT_EQ(n, res[i].ntokens);
    Result<Partial> want = Error(0, "");
    if (reqs[i].all_pages) {
      want = attend(*ctxs[i], qs[i], 4, n, nullptr);
    } else {
      auto sel = select_pages(*ctxs[i], qs[i], 4, n, reqs[i].select);
      ASSERT_TRUE(sel.ok());
      EXPECT_EQ(sel->pages, res[i].selection.pages);
      want = attend(*ctxs[i], qs[i], 4, n, &*sel);
    }
    ASSERT_TRUE(want.ok());
    EXPECT_LT(max_diff(*want, res[i].partial), 1e-5) << "request " << i;
    EXPECT_GT(res[i].link_bytes_selected, res[i].link_bytes_near);
    EXPECT_GE(res[i].link_bytes_all, res[i].link_bytes_selected);
  }
  StepRequest bad = reqs[0];
  bad.q_heads = 3;
  EXPECT_EQ(-EINVAL, group.engine(0).step(bad).status.error().code());
}
