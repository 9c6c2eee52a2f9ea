// SPDX-License-Identifier: MIT
// Near-memory attention as a specification: output and log-sum-exp equal a
// float64 reference within bf16 / fp16 tolerance on every instruction set;
// a budget of the whole context equals full attention; merging the partials
// of two disjoint page sets equals attention over their union.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

// Output tolerance of a bf16 / fp16 attention: the inputs are exact in the
// dtype, the engine accumulates in float32.
constexpr double kTol = 2e-3;

struct Fixture {
  Fixture(Dtype t, uint32_t n, uint64_t seed, uint32_t page_tokens = 16)
      : pool(32ull << 20, 2, 0.02), rng(seed) {
    StoreOptions so;
    so.carve_bytes = 8ull << 20;
    ws = std::move(ContextStore::open(pool.host(0), so)).value();
    so.writer = false;
    rs = std::move(ContextStore::open(pool.host(1), so)).value();
    g = Geometry{2, 2, 40, t, page_tokens, 1024};
    w = std::move(ws->create(3, g)).value();
    k = random_tensor(t, size_t(2) * 2 * n * 40, rng);
    v = random_tensor(t, k.vals.size(), rng);
    // Two appends: a partial page in between.
    const uint32_t n1 = n / 3;
    Tensor k1 = slice(k, n, 0, n1), v1 = slice(v, n, 0, n1), k2 = slice(k, n, n1, n), v2 = slice(v, n, n1, n);
    EXPECT_TRUE(w->append(k1.data(), v1.data(), n1).ok());
    EXPECT_TRUE(w->append(k2.data(), v2.data(), n - n1).ok());
    r = std::move(rs->find(3)).value();
    this->n = n;
    std::normal_distribution<float> nd(0.f, 1.f);
    q.resize(size_t(2) * 8 * 40);  // 8 query heads: 4 per KV head
    for (auto& x : q) x = nd(rng);
  }
  // Tokens [a, b) of a [l][h][n][d] tensor.
  Tensor slice(const Tensor& x, uint32_t n_, uint32_t a, uint32_t b) {
    Tensor y;
    y.t = x.t;
    const size_t es = dtype_size(x.t);
    for (uint32_t lh = 0; lh < 4; lh++) {
      const size_t o = (size_t(lh) * n_ + a) * 40;
      y.bytes.insert(y.bytes.end(), x.bytes.begin() + o * es, x.bytes.begin() + (o + size_t(b - a) * 40) * es);
      y.vals.insert(y.vals.end(), x.vals.begin() + o, x.vals.begin() + o + size_t(b - a) * 40);
    }
    return y;
  }
  // Float64 attention of query head (l, j) over the tokens of `pages`.
  void reference(uint32_t l, uint32_t j, const std::vector<uint32_t>& pages, double* out, double* lse) const {
    const uint32_t h = j / 4;
    std::vector<const float*> ks, vs;
    for (uint32_t p : pages)
      for (uint32_t t = p * g.page_tokens; t < std::min(n, (p + 1) * g.page_tokens); t++) {
        ks.push_back(&k.vals[((size_t(l) * 2 + h) * n + t) * 40]);
        vs.push_back(&v.vals[((size_t(l) * 2 + h) * n + t) * 40]);
      }
    double qd[40];
    for (int d = 0; d < 40; d++) qd[d] = q[(size_t(l) * 8 + j) * 40 + d];
    ref_attention(qd, ks, vs, 40, 1.0 / std::sqrt(40.0), out, lse);
  }
  // Max deviation of a partial from the reference over page sets per (l, h).
  double deviation(const Partial& p, const std::function<std::vector<uint32_t>(uint32_t, uint32_t)>& pages) const {
    double worst = 0;
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t j = 0; j < 8; j++) {
        double out[40], lse;
        reference(l, j, pages(l, j / 4), out, &lse);
        const size_t i = size_t(l) * 8 + j;
        if (std::isinf(lse)) {
          worst = std::max(worst, std::isinf(p.lse[i]) ? 0.0 : 1e9);
          continue;
        }
        worst = std::max(worst, std::fabs(lse - p.lse[i]));
        for (int d = 0; d < 40; d++) worst = std::max(worst, std::fabs(out[d] - p.out[i * 40 + d]));
      }
    return worst;
  }
  SharedPool pool;
  std::mt19937_64 rng;
  std::unique_ptr<ContextStore> ws, rs;
  std::unique_ptr<Context> w, r;
  Geometry g;
  Tensor k, v;
  std::vector<float> q;
  uint32_t n = 0;
};

std::vector<uint32_t> all_pages(uint32_t np) {
  std::vector<uint32_t> v(np);
  for (uint32_t i = 0; i < np; i++) v[i] = i;
  return v;
}

class PnmAttention : public ::testing::TestWithParam<std::tuple<Dtype, Isa>> {};

}  // namespace

TEST_P(PnmAttention, FullAttentionEqualsAFloat64Reference) {
  auto [t, isa] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << to_string(isa) << " not on this CPU";
  Fixture f(t, 203, 1);
  auto p = attend(*f.r, f.q, 8, f.n, nullptr, 0.f, isa);
  ASSERT_TRUE(p.ok()) << p.error().message();
  const uint32_t np = f.r->pages_for(f.n);
  EXPECT_LT(f.deviation(*p, [&](uint32_t, uint32_t) { return all_pages(np); }), kTol);
}

TEST_P(PnmAttention, SelectedPagesEqualAFloat64ReferenceOverThosePages) {
  auto [t, isa] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << to_string(isa) << " not on this CPU";
  Fixture f(t, 250, 2);
  SelectOptions o;
  o.token_budget = 64;
  auto sel = select_pages(*f.r, f.q, 8, f.n, o, isa);
  ASSERT_TRUE(sel.ok());
  auto p = attend(*f.r, f.q, 8, f.n, &*sel, 0.f, isa);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_LT(f.deviation(*p, [&](uint32_t l, uint32_t h) { return sel->at(l, h); }), kTol);
}

INSTANTIATE_TEST_SUITE_P(DtypesIsas, PnmAttention,
                         ::testing::Combine(::testing::Values(Dtype::bf16, Dtype::f16, Dtype::f32),
                                            ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512)),
                         [](const auto& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_" +
                                  to_string(std::get<1>(i.param));
                         });

TEST(PnmAttentionBudget, BudgetOfTheWholeContextEqualsFullAttention) {
  Fixture f(Dtype::bf16, 190, 3);
  SelectOptions o;
  o.token_budget = 1 << 20;
  auto sel = select_pages(*f.r, f.q, 8, f.n, o);
  ASSERT_TRUE(sel.ok());
  for (auto& pages : sel->pages) EXPECT_EQ(all_pages(f.r->pages_for(f.n)), pages);
  auto a = attend(*f.r, f.q, 8, f.n, &*sel);
  auto b = attend(*f.r, f.q, 8, f.n, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->out, b->out);
  EXPECT_EQ(a->lse, b->lse);
}

TEST(PnmAttentionBudget, AnEngineStepWithTheWholeContextAsBudgetEqualsAFloat64FullAttention) {
  // The decode-step path (Engine::step: fresh count, select, attend), both
  // score modes, no sink / local pages: T_budget >= the context keeps every
  // page, and the result is full attention over every token.
  for (ScoreMode mode : {ScoreMode::upper_bound, ScoreMode::coarse}) {
    Fixture f(Dtype::bf16, 221, 6);
    Engine eng;  // one thread: a NonCoherentSim node is one thread's cache
    StepRequest rq;
    rq.ctx = f.r.get();
    rq.queries = f.q;
    rq.q_heads = 8;
    rq.select.token_budget = f.n;  // exactly the context
    rq.select.sink_pages = 0;
    rq.select.local_pages = 0;
    rq.select.mode = mode;
    StepResult r = eng.step(rq);
    ASSERT_TRUE(r.status.ok()) << r.status.error().message();
    EXPECT_EQ(uint64_t(f.n), r.ntokens);
    const uint32_t np = f.r->pages_for(f.n);
    for (const auto& pages : r.selection.pages) EXPECT_EQ(all_pages(np), pages) << to_string(mode);
    EXPECT_LT(f.deviation(r.partial, [&](uint32_t, uint32_t) { return all_pages(np); }), kTol) << to_string(mode);
  }
}

TEST(PnmAttentionMerge, MergedPartialsOfDisjointPagesEqualAttentionOverTheirUnion) {
  Fixture f(Dtype::bf16, 300, 4);
  const uint32_t np = f.r->pages_for(f.n);
  std::mt19937_64 rng(9);
  Selection a, b;
  a.layers = b.layers = 2;
  a.kv_heads = b.kv_heads = 2;
  a.pages.resize(4);
  b.pages.resize(4);
  for (uint32_t i = 0; i < 4; i++)
    for (uint32_t p = 0; p < np; p++) (rng() % 2 ? a : b).pages[i].push_back(p);
  b.pages[3].clear();  // one (layer, head) wholly on one side: the other part is empty
  auto pa = attend(*f.r, f.q, 8, f.n, &a);
  auto pb = attend(*f.r, f.q, 8, f.n, &b);
  ASSERT_TRUE(pa.ok() && pb.ok());
  auto m = merge(*pa, *pb);
  ASSERT_TRUE(m.ok());
  EXPECT_LT(f.deviation(*m, [&](uint32_t l, uint32_t h) {
    auto u = a.pages[l * 2 + h];
    u.insert(u.end(), b.pages[l * 2 + h].begin(), b.pages[l * 2 + h].end());
    std::sort(u.begin(), u.end());
    return u;
  }), kTol);
  Partial odd = *pa;
  odd.head_dim = 7;
  EXPECT_EQ(-EINVAL, merge(*pa, odd).error().code());
}

TEST(PnmAttentionMerge, AnEmptyPartialIsTheIdentity) {
  Fixture f(Dtype::f16, 100, 5);
  Selection none;
  none.layers = 2;
  none.kv_heads = 2;
  none.pages.resize(4);
  auto e = attend(*f.r, f.q, 8, f.n, &none);
  ASSERT_TRUE(e.ok());
  for (float x : e->lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  auto full = attend(*f.r, f.q, 8, f.n, nullptr);
  auto m = merge(*full, *e);
  ASSERT_TRUE(m.ok());
  for (size_t i = 0; i < m->out.size(); i++) ASSERT_NEAR(full->out[i], m->out[i], 1e-6);
}
