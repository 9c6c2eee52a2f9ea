// SPDX-License-Identifier: MIT
// Scoring and top-T_budget page selection as a specification: the score is
// an upper bound of q.k over a page (and the coarse score is max(q.min,
// q.max)), every instruction set computes the scalar kernel's scores, the
// selection keeps sink and local pages and the best of the rest (against a
// full sort), grouped query heads score their own KV head, and select_pages
// on a context read under NonCoherentSim equals a direct computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

// Digests [np][2][dim] of random pages of ntok keys, and the keys.
struct Pages {
  Pages(Dtype t, uint32_t np, uint32_t ntok, uint32_t dim, std::mt19937_64& rng) : t(t), np(np), ntok(ntok), dim(dim) {
    keys = random_tensor(t, size_t(np) * ntok * dim, rng);
    dig.resize(size_t(np) * 2 * dim * dtype_size(t));
    for (uint32_t p = 0; p < np; p++)
      detail::digest_rows(t, keys.bytes.data() + size_t(p) * ntok * dim * dtype_size(t), ntok, dim,
                          dig.data() + size_t(p) * 2 * dim * dtype_size(t), true);
  }
  float key(uint32_t p, uint32_t t_, uint32_t d) const { return keys.at((size_t(p) * ntok + t_) * dim + d); }
  float mn(uint32_t p, uint32_t d) const { return detail::load_elem(t, dig.data(), size_t(p) * 2 * dim + d); }
  float mx(uint32_t p, uint32_t d) const { return detail::load_elem(t, dig.data(), size_t(p) * 2 * dim + dim + d); }
  Dtype t;
  uint32_t np, ntok, dim;
  Tensor keys;
  std::vector<unsigned char> dig;
};

std::vector<float> random_q(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(n);
  for (auto& x : q) x = nd(rng);
  return q;
}

}  // namespace

TEST(PnmScore, DigestsAreTheElementWiseMinAndMaxOfThePageKeys) {
  std::mt19937_64 rng(1);
  for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32}) {
    Pages pg(t, 5, 16, 40, rng);
    for (uint32_t p = 0; p < 5; p++)
      for (uint32_t d = 0; d < 40; d++) {
        float mn = INFINITY, mx = -INFINITY;
        for (uint32_t i = 0; i < 16; i++) {
          mn = std::min(mn, pg.key(p, i, d));
          mx = std::max(mx, pg.key(p, i, d));
        }
        ASSERT_EQ(mn, pg.mn(p, d)) << to_string(t);
        ASSERT_EQ(mx, pg.mx(p, d)) << to_string(t);
      }
  }
}

TEST(PnmScore, UpperBoundScoreIsAtLeastEveryKeysDotProductOnEveryIsa) {
  std::mt19937_64 rng(2);
  for (Isa isa : isas())
    for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32})
      for (uint32_t dim : {24u, 128u, 37u}) {
        Pages pg(t, 20, 16, dim, rng);
        const uint32_t nq = 5;  // more than one head chunk of the AVX2 kernel
        auto q = random_q(size_t(nq) * dim, rng);
        std::vector<float> s(pg.np);
        score_pages(isa, t, pg.dig.data(), pg.np, dim, q.data(), nq, ScoreMode::upper_bound, s.data());
        for (uint32_t p = 0; p < pg.np; p++) {
          double bound = -INFINITY, best = -INFINITY;
          for (uint32_t h = 0; h < nq; h++) {
            double b = 0;
            for (uint32_t d = 0; d < dim; d++)
              b += std::max(double(q[h * dim + d]) * pg.mn(p, d), double(q[h * dim + d]) * pg.mx(p, d));
            bound = std::max(bound, b);
            for (uint32_t i = 0; i < pg.ntok; i++) {
              double dot = 0;
              for (uint32_t d = 0; d < dim; d++) dot += double(q[h * dim + d]) * pg.key(p, i, d);
              best = std::max(best, dot);
            }
          }
          ASSERT_NEAR(bound, s[p], 1e-4 * (1 + std::fabs(bound))) << to_string(isa) << " " << to_string(t);
          ASSERT_GE(s[p] + 1e-3, best) << "not an upper bound: " << to_string(isa) << " " << to_string(t);
        }
      }
}

TEST(PnmScore, CoarseScoreIsTheLargerOfQDotMinAndQDotMax) {
  std::mt19937_64 rng(3);
  for (Isa isa : isas()) {
    Pages pg(Dtype::bf16, 9, 16, 128, rng);
    auto q = random_q(128, rng);
    std::vector<float> s(pg.np);
    score_pages(isa, Dtype::bf16, pg.dig.data(), pg.np, 128, q.data(), 1, ScoreMode::coarse, s.data());
    for (uint32_t p = 0; p < pg.np; p++) {
      double a = 0, b = 0;
      for (uint32_t d = 0; d < 128; d++) {
        a += double(q[d]) * pg.mn(p, d);
        b += double(q[d]) * pg.mx(p, d);
      }
      EXPECT_NEAR(std::max(a, b), s[p], 1e-3) << to_string(isa);
    }
  }
}

TEST(PnmSelect, TopPagesKeepSinkAndLocalAndTheBestOfTheRestAgainstAFullSort) {
  std::mt19937_64 rng(4);
  for (int round = 0; round < 200; round++) {
    const uint32_t np = 1 + uint32_t(rng() % 80), budget = uint32_t(rng() % 90);
    const uint32_t sink = uint32_t(rng() % 3), local = uint32_t(rng() % 4);
    std::vector<float> s(np);
    for (auto& x : s) x = float(rng() % 17);  // many ties
    auto got = top_pages(s.data(), np, budget, sink, local);
    // Reference: forced pages, then the rest by (score desc, page asc).
    std::vector<uint32_t> want;
    const uint32_t ns = std::min(sink, np), nl = std::min(local, np - ns);
    for (uint32_t p = 0; p < ns; p++) want.push_back(p);
    for (uint32_t p = np - nl; p < np; p++) want.push_back(p);
    std::vector<uint32_t> rest;
    for (uint32_t p = ns; p < np - nl; p++) rest.push_back(p);
    std::sort(rest.begin(), rest.end(), [&](uint32_t a, uint32_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
    const uint32_t take = budget > ns + nl ? std::min<uint32_t>(budget - ns - nl, uint32_t(rest.size())) : 0;
    want.insert(want.end(), rest.begin(), rest.begin() + take);
    std::sort(want.begin(), want.end());
    ASSERT_EQ(want, got) << "np " << np << " budget " << budget << " sink " << sink << " local " << local;
  }
}

TEST(PnmSelect, GroupedQueryHeadsSelectPagesOfTheirOwnKvHead) {
  // Two KV heads, four query heads (two per KV head).  A needle page whose
  // keys align with query heads 2-3 is planted in KV head 1 only.
  SharedPool pool(16ull << 20, 1, 0.0, false);
  StoreOptions so;
  so.carve_bytes = 4ull << 20;
  auto st = ContextStore::open(pool.host(0), so);
  ASSERT_TRUE(st.ok()) << st.error().message();
  Geometry g{1, 2, 32, Dtype::bf16, 16, 64 * 16};
  auto ctx = (*st)->create(1, g);
  ASSERT_TRUE(ctx.ok());
  std::mt19937_64 rng(5);
  const uint32_t n = 64 * 16, needle_page = 37;
  Tensor k = random_tensor(Dtype::bf16, size_t(2) * n * 32, rng, 0.1f);
  Tensor v = random_tensor(Dtype::bf16, k.vals.size(), rng);
  std::vector<float> q(4 * 32, 0.f);
  for (uint32_t d = 0; d < 32; d++) q[2 * 32 + d] = q[3 * 32 + d] = 1.f;  // heads 2, 3 -> KV head 1
  for (uint32_t t = needle_page * 16; t < needle_page * 16 + 16; t++)
    for (uint32_t d = 0; d < 32; d++) detail::store_elem(Dtype::bf16, k.bytes.data(), (size_t(n) + t) * 32 + d, 1.f);
  ASSERT_TRUE((*ctx)->append(k.data(), v.data(), n).ok());
  SelectOptions o;
  o.token_budget = 3 * 16;  // sink + local + one
  auto sel = select_pages(**ctx, q, 4, n, o);
  ASSERT_TRUE(sel.ok()) << sel.error().message();
  EXPECT_EQ((std::vector<uint32_t>{0, needle_page, 63}), sel->at(0, 1));
  EXPECT_EQ(3u, sel->at(0, 0).size());
  EXPECT_NE(needle_page, sel->at(0, 0)[1]) << "KV head 0 has no needle";
  // Shapes are checked.
  EXPECT_EQ(-EINVAL, select_pages(**ctx, q, 3, n, o).error().code());
  EXPECT_EQ(-EINVAL, select_pages(**ctx, std::span<const float>(q).subspan(1), 4, n, o).error().code());
  EXPECT_EQ(-EINVAL, select_pages(**ctx, q, 4, n + 1, o).error().code());
}

TEST(PnmSelect, SelectionReadUnderNonCoherentSimEqualsADirectComputation) {
  SharedPool pool(16ull << 20, 2, 0.05);
  StoreOptions so;
  so.carve_bytes = 4ull << 20;
  auto ws = ContextStore::open(pool.host(0), so);
  so.writer = false;
  auto rs = ContextStore::open(pool.host(1), so);
  ASSERT_TRUE(ws.ok() && rs.ok());
  Geometry g{2, 2, 24, Dtype::f16, 8, 400};
  auto w = (*ws)->create(9, g);
  ASSERT_TRUE(w.ok());
  std::mt19937_64 rng(6);
  const uint32_t n = 300;
  Tensor k = random_tensor(g.dtype, size_t(2) * 2 * n * 24, rng);
  Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
  ASSERT_TRUE((*w)->append(k.data(), v.data(), n).ok());
  auto r = (*rs)->find(9);
  ASSERT_TRUE(r.ok());
  auto q = random_q(size_t(2) * 6 * 24, rng);  // 6 query heads: 3 per KV head
  SelectOptions o;
  o.token_budget = 80;
  o.sink_pages = 2;
  auto sel = select_pages(**r, q, 6, n, o);
  ASSERT_TRUE(sel.ok()) << sel.error().message();
  const uint32_t np = (n + 7) / 8;
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t h = 0; h < 2; h++) {
      std::vector<float> s(np, -INFINITY);
      for (uint32_t p = 0; p < np; p++)
        for (uint32_t j = 0; j < 3; j++) {
          const float* qh = q.data() + (size_t(l) * 6 + h * 3 + j) * 24;
          double b = 0;
          for (uint32_t d = 0; d < 24; d++) {
            float mn = INFINITY, mx = -INFINITY;
            for (uint32_t t = p * 8; t < std::min(n, p * 8 + 8); t++) {
              const float x = k.at(((size_t(l) * 2 + h) * n + t) * 24 + d);
              mn = std::min(mn, x);
              mx = std::max(mx, x);
            }
            b += std::max(double(qh[d]) * mn, double(qh[d]) * mx);
          }
          s[p] = std::max(s[p], float(b));
        }
      EXPECT_EQ(top_pages(s.data(), np, 10, 2, 1), sel->at(l, h)) << "layer " << l << " head " << h;
    }
}
