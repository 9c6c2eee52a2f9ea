// SPDX-License-Identifier: MIT
// Digest kinds as a specification (docs/near-memory.md#digest-kinds): a q8
// row bounds every element its min/max row bounds, within one step of its
// scale; the q8 score is an upper bound of every key's q.k on every
// instruction set; a group digest of a two-level context bounds every key of
// its pages, however the appends fell; two-level selection reading every
// group's pages equals one-level selection, and with the default refinement
// still finds planted needles while reading far fewer bytes; a damaged or
// stale q8 row (page or group) is refused naming the context, layer, head
// and row; a carve of layout version 2 is refused naming both versions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pnm/pnm_internal.hpp"
#include "pnm/synthetic.hpp"
#include "cxlkv/format/pnm_format.h"
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

float q8_scale(const unsigned char* row) {
  cxlkv_pnm_q8_row h;
  std::memcpy(&h, row, sizeof h);
  float s;
  std::memcpy(&s, &h.scale_bits, 4);
  return s;
}
uint32_t q8_tokens(const unsigned char* row) {
  cxlkv_pnm_q8_row h;
  std::memcpy(&h, row, sizeof h);
  return h.tokens;
}
// Element d of the min (half 0) or max (half 1) of a q8 row, dequantized exactly.
double q8_elem(const unsigned char* row, uint32_t dim, uint32_t half, uint32_t d) {
  return double(q8_scale(row)) * int8_t(row[sizeof(cxlkv_pnm_q8_row) + half * dim + d]);
}

StoreOptions store_opts(bool writer = true) {
  StoreOptions o;
  o.carve_bytes = 8ull << 20;
  o.partitions = 1;
  o.slots_per_partition = 8;
  o.writer = writer;
  return o;
}

}  // namespace

TEST(PnmDigestQ8, ARowBoundsEveryElementOfItsMinMaxRowWithinOneStep) {
  std::mt19937_64 rng(1);
  for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32})
    for (uint32_t dim : {24u, 128u}) {
      for (int round = 0; round < 50; round++) {
        const float spread = round % 5 == 0 ? 1e-3f : 3.f;  // small and ordinary magnitudes
        Tensor keys = random_tensor(t, size_t(16) * dim, rng, spread);
        std::vector<unsigned char> mm(2 * dim * dtype_size(t)), row(sizeof(cxlkv_pnm_q8_row) + 2 * dim);
        detail::digest_rows(t, keys.data(), 16, dim, mm.data(), true);
        ASSERT_TRUE(detail::encode_q8_row(t, mm.data(), dim, 16, row.data()));
        const double s = q8_scale(row.data());
        ASSERT_GT(s, 0);
        EXPECT_EQ(16u, q8_tokens(row.data()));
        for (uint32_t d = 0; d < dim; d++) {
          const double lo = detail::load_elem(t, mm.data(), d), hi = detail::load_elem(t, mm.data(), dim + d);
          const double qlo = q8_elem(row.data(), dim, 0, d), qhi = q8_elem(row.data(), dim, 1, d);
          ASSERT_LE(qlo, lo) << to_string(t) << " d " << d;
          ASSERT_GE(qhi, hi) << to_string(t) << " d " << d;
          ASSERT_LT(lo - qlo, s * 1.0001) << "min more than one step out";
          ASSERT_LT(qhi - hi, s * 1.0001) << "max more than one step out";
        }
      }
    }
  // An element that is not finite cannot be bounded: refused.
  std::vector<unsigned char> mm(2 * 8 * 4), row(sizeof(cxlkv_pnm_q8_row) + 16);
  for (uint32_t d = 0; d < 16; d++) detail::store_elem(Dtype::f32, mm.data(), d, d == 9 ? INFINITY : 1.f);
  EXPECT_FALSE(detail::encode_q8_row(Dtype::f32, mm.data(), 8, 16, row.data()));
}

TEST(PnmDigestQ8, ScoreIsAnUpperBoundOfEveryKeysDotProductOnEveryIsa) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (Isa isa : isas())
    for (Dtype t : {Dtype::bf16, Dtype::f32})
      for (uint32_t dim : {24u, 128u, 37u}) {
        const uint32_t np = 20, ntok = 16, nq = 5;
        const size_t rb = sizeof(cxlkv_pnm_q8_row) + 2 * dim;
        Tensor keys = random_tensor(t, size_t(np) * ntok * dim, rng);
        std::vector<unsigned char> mm(2 * dim * dtype_size(t)), rows(np * rb);
        for (uint32_t p = 0; p < np; p++) {
          detail::digest_rows(t, keys.bytes.data() + size_t(p) * ntok * dim * dtype_size(t), ntok, dim, mm.data(),
                              true);
          ASSERT_TRUE(detail::encode_q8_row(t, mm.data(), dim, ntok, rows.data() + p * rb));
        }
        std::vector<float> q(size_t(nq) * dim);
        for (auto& x : q) x = nd(rng);
        for (ScoreMode mode : {ScoreMode::upper_bound, ScoreMode::coarse}) {
          std::vector<float> s(np);
          score_q8_pages(isa, rows.data(), np, dim, q.data(), nq, mode, s.data());
          for (uint32_t p = 0; p < np; p++) {
            const unsigned char* r = rows.data() + p * rb;
            double want = -INFINITY, best = -INFINITY;
            for (uint32_t h = 0; h < nq; h++) {
              double ub = 0, a = 0, b = 0;
              for (uint32_t d = 0; d < dim; d++) {
                const double x = q[h * dim + d], lo = q8_elem(r, dim, 0, d), hi = q8_elem(r, dim, 1, d);
                ub += std::max(x * lo, x * hi);
                a += x * lo;
                b += x * hi;
              }
              want = std::max(want, mode == ScoreMode::upper_bound ? ub : std::max(a, b));
              for (uint32_t i = 0; i < ntok; i++) {
                double dot = 0;
                for (uint32_t d = 0; d < dim; d++) dot += double(q[h * dim + d]) * keys.at((size_t(p) * ntok + i) * dim + d);
                best = std::max(best, dot);
              }
            }
            ASSERT_NEAR(want, s[p], 1e-4 * (1 + std::fabs(want))) << to_string(isa) << " " << to_string(t);
            if (mode == ScoreMode::upper_bound) {
              ASSERT_GE(s[p] + 1e-3, best) << "not an upper bound: " << to_string(isa) << " " << to_string(t);
            }
          }
        }
      }
}

namespace {

// A context of one digest kind on a coherent pool, appended in uneven
// batches, and every key it holds.
struct KindContext {
  KindContext(DigestKind kind, uint32_t group_pages, uint32_t tokens, Dtype t = Dtype::bf16)
      : pool(32ull << 20, 1, 0.0, false) {
    g = Geometry{2, 2, 24, t, 8, 1024, kind, group_pages};
    ws = std::move(ContextStore::open(pool.host(0), store_opts())).value();
    rs = std::move(ContextStore::open(pool.host(0), store_opts(false))).value();
    auto c = ws->create(3, g);
    EXPECT_TRUE(c.ok()) << c.error().message();
    w = std::move(c).value();
    std::mt19937_64 rng(7);
    keys.assign(size_t(g.layers) * g.kv_heads, {});
    for (uint32_t done = 0, step = 0; done < tokens; step++) {
      const uint32_t n = std::min<uint32_t>(tokens - done, 1 + (step * 7) % 23);
      Tensor k = random_tensor(t, size_t(g.layers) * g.kv_heads * n * g.head_dim, rng);
      Tensor v = random_tensor(t, k.vals.size(), rng);
      for (size_t lh = 0; lh < keys.size(); lh++)
        keys[lh].insert(keys[lh].end(), k.vals.begin() + lh * n * g.head_dim, k.vals.begin() + (lh + 1) * n * g.head_dim);
      auto a = w->append(k.data(), v.data(), n);
      EXPECT_TRUE(a.ok()) << a.error().message();
      done += n;
    }
    r = std::move(rs->find(3)).value();
  }
  Geometry g;
  SharedPool pool;
  std::unique_ptr<ContextStore> ws, rs;
  std::unique_ptr<Context> w, r;
  std::vector<std::vector<float>> keys;  // [l * kv_heads + h][token * head_dim + d]
};

}  // namespace

TEST(PnmDigestTwoLevel, GroupDigestsBoundEveryKeyOfTheirPagesAcrossUnevenAppends) {
  for (DigestKind kind : {DigestKind::q8, DigestKind::minmax}) {
    const uint32_t tokens = 300, gp = 4;  // 38 pages of 8, 10 groups of 4 pages (the last partial)
    KindContext c(kind, gp, tokens);
    ASSERT_EQ(10u, c.r->groups_for(tokens));
    const uint32_t dim = c.g.head_dim, span = gp * c.g.page_tokens;
    const size_t rb = c.r->digest_row_bytes();
    EXPECT_EQ(kind == DigestKind::q8 ? sizeof(cxlkv_pnm_q8_row) + 2 * dim : 2 * dim * 2, rb);
    std::vector<unsigned char> rows(10 * rb);
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t h = 0; h < 2; h++) {
        ASSERT_TRUE(c.r->read_group_digests(l, h, 0, 10, rows.data()).ok());
        ASSERT_TRUE(c.r->check_digest_rows(rows.data(), 0, 10, true, l, h, tokens).ok());
        const auto& ks = c.keys[l * 2 + h];
        for (uint32_t gi = 0; gi < 10; gi++) {
          const unsigned char* row = rows.data() + gi * rb;
          if (kind == DigestKind::q8) {
            EXPECT_EQ(std::min(span, tokens - gi * span), q8_tokens(row));
          }
          for (uint32_t t = gi * span; t < std::min(tokens, (gi + 1) * span); t++)
            for (uint32_t d = 0; d < dim; d++) {
              const double lo = kind == DigestKind::q8 ? q8_elem(row, dim, 0, d)
                                                       : detail::load_elem(Dtype::bf16, row, d);
              const double hi = kind == DigestKind::q8 ? q8_elem(row, dim, 1, d)
                                                       : detail::load_elem(Dtype::bf16, row, dim + d);
              ASSERT_LE(lo, ks[size_t(t) * dim + d]) << to_string(kind) << " group " << gi << " token " << t;
              ASSERT_GE(hi, ks[size_t(t) * dim + d]) << to_string(kind) << " group " << gi << " token " << t;
            }
        }
      }
  }
}

TEST(PnmDigestTwoLevel, SelectionReadingEveryGroupEqualsOneLevelAndDefaultRefinementFindsTheNeedles) {
  // Planted needles over 16K tokens; q8 page and group digests.
  const uint64_t tokens = 16384;
  Geometry g{2, 2, 64, Dtype::bf16, 16, tokens, DigestKind::q8, 16};
  SharedPool pool(96ull << 20, 1, 0.0, false);
  StoreOptions so = store_opts();
  so.carve_bytes = 64ull << 20;
  auto ws = ContextStore::open(pool.host(0), so);
  ASSERT_TRUE(ws.ok()) << ws.error().message();
  auto w = (*ws)->create(4, g);
  ASSERT_TRUE(w.ok()) << w.error().message();
  NeedleSet ns(g, 8, tokens, 6);
  std::vector<unsigned char> k, v;
  for (uint64_t t = 0; t < tokens; t += 2048) {
    ns.make_kv(t, 2048, k, v);
    ASSERT_TRUE((*w)->append(k.data(), v.data(), 2048).ok());
  }
  const std::vector<float> q = ns.queries(0);
  Engine eng;
  StepRequest rq;
  rq.ctx = w->get();
  rq.queries = q;
  rq.q_heads = 8;
  rq.ntokens = tokens;
  rq.select.token_budget = 256;
  rq.select.one_level = true;
  StepResult flat = eng.step(rq);
  ASSERT_TRUE(flat.status.ok()) << flat.status.error().message();
  rq.select.one_level = false;
  rq.select.refine_pages = 1024;  // every page: the group pass only orders the reads
  StepResult all = eng.step(rq);
  ASSERT_TRUE(all.status.ok()) << all.status.error().message();
  EXPECT_EQ(flat.selection.pages, all.selection.pages);
  rq.select.refine_pages = 0;  // default: max(4 x budget, 512) pages
  StepResult two = eng.step(rq);
  ASSERT_TRUE(two.status.ok()) << two.status.error().message();
  const uint64_t rb = 8 + 2 * 64, pairs = 4;
  EXPECT_EQ(pairs * 1024 * rb, flat.digest_bytes);
  EXPECT_EQ(pairs * (64 + 512) * rb, two.digest_bytes) << "64 group rows, then 32 groups of 16 pages";
  for (uint32_t i = 0; i < pairs; i++)
    for (uint64_t t : ns.needles) {
      const uint32_t page = uint32_t(t / 16);
      EXPECT_TRUE(std::binary_search(two.selection.pages[i].begin(), two.selection.pages[i].end(), page))
          << "needle page " << page << " of (layer, head) " << i;
      EXPECT_TRUE(std::binary_search(flat.selection.pages[i].begin(), flat.selection.pages[i].end(), page));
    }
}

TEST(PnmDigestTwoLevel, SelectionReadUnderNonCoherentSimEqualsTheWritersOwnRead) {
  SharedPool pool(32ull << 20, 2, 0.05);
  auto ws = ContextStore::open(pool.host(0), store_opts());
  auto rs = ContextStore::open(pool.host(1), store_opts(false));
  ASSERT_TRUE(ws.ok() && rs.ok());
  Geometry g{2, 2, 24, Dtype::f16, 8, 800, DigestKind::q8, 4};
  auto w = (*ws)->create(9, g);
  ASSERT_TRUE(w.ok()) << w.error().message();
  std::mt19937_64 rng(6);
  for (uint32_t n : {300u, 1u, 99u}) {
    Tensor k = random_tensor(g.dtype, size_t(2) * 2 * n * 24, rng);
    Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
    ASSERT_TRUE((*w)->append(k.data(), v.data(), n).ok());
  }
  auto r = (*rs)->find(9);
  ASSERT_TRUE(r.ok()) << r.error().message();
  std::vector<float> q(size_t(2) * 4 * 24);
  std::normal_distribution<float> nd;
  for (auto& x : q) x = nd(rng);
  SelectOptions o;
  o.token_budget = 64;
  o.refine_pages = 16;
  auto a = select_pages(**w, q, 4, 400, o);
  auto b = select_pages(**r, q, 4, 400, o);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(a->pages, b->pages);
}

namespace {
bool has(const Error& e, const std::string& s) { return e.message().find(s) != std::string::npos; }
}  // namespace

TEST(PnmDigestQ8, ADamagedOrStaleRowIsRefusedNamingItNeverScored) {
  KindContext c(DigestKind::q8, 4, 100);  // 13 pages of 8 (the last holds 4), 4 groups
  auto row_at = [&](bool group, uint32_t l, uint32_t h, uint32_t i) {
    const void* base = group ? c.r->group_digests_in_place(l, h) : c.r->digests_in_place(l, h);
    return reinterpret_cast<cxlkv_pnm_q8_row*>(static_cast<unsigned char*>(const_cast<void*>(base)) +
                                               i * c.r->digest_row_bytes());
  };
  std::vector<float> q(size_t(2) * 4 * 24, 0.5f);
  auto select = [&] {
    SelectOptions o;
    o.token_budget = 32;
    return select_pages(*c.r, q, 4, 100, o);
  };
  ASSERT_TRUE(select().ok()) << "undamaged";
  struct Case {
    bool group;
    uint32_t index;
    uint32_t scale_bits;  // 0: keep
    uint32_t tokens;      // UINT32_MAX: keep
    const char* what;
  };
  const float nan = std::nanf(""), neg = -1.f;
  uint32_t nan_bits, neg_bits;
  std::memcpy(&nan_bits, &nan, 4);
  std::memcpy(&neg_bits, &neg, 4);
  const Case cases[] = {
      {false, 5, nan_bits, UINT32_MAX, "page 5 is damaged"},
      {false, 5, neg_bits, UINT32_MAX, "page 5 is damaged"},
      {false, 7, 0, 9, "page 7 is damaged"},         // more tokens than a page holds
      {false, 12, 0, 3, "page 12 is stale"},         // the last page: 4 published, 3 covered
      {true, 2, 0x7f800000u, UINT32_MAX, "group 2 is damaged"},
      {true, 3, 0, 1, "group 3 is stale"},           // 4 published tokens in group 3
  };
  for (const Case& k : cases) {
    cxlkv_pnm_q8_row* row = row_at(k.group, 1, 1, k.index);
    const cxlkv_pnm_q8_row saved = *row;
    if (k.scale_bits) row->scale_bits = k.scale_bits;
    if (k.tokens != UINT32_MAX) row->tokens = k.tokens;
    auto s = select();
    ASSERT_FALSE(s.ok()) << k.what << ": scored anyway";
    EXPECT_EQ(-EBADMSG, s.error().code());
    EXPECT_TRUE(has(s.error(), "pnm context 3: q8 digest of layer 1 head 1 ")) << s.error().message();
    EXPECT_TRUE(has(s.error(), k.what)) << s.error().message();
    *row = saved;
    ASSERT_TRUE(select().ok()) << "restored";
  }
}

TEST(PnmDigestKinds, CreateRefusesAnUnknownKindOrAGroupSizeThatIsNotAPowerOfTwo) {
  SharedPool pool(16ull << 20, 1, 0.0, false);
  auto s = ContextStore::open(pool.host(0), store_opts());
  ASSERT_TRUE(s.ok());
  Geometry g{1, 1, 16, Dtype::bf16, 16, 256};
  for (uint32_t gp : {3u, 12u, 2048u}) {
    g.group_pages = gp;
    auto c = (*s)->create(1, g);
    ASSERT_FALSE(c.ok()) << gp;
    EXPECT_TRUE(has(c.error(), "group_pages " + std::to_string(gp))) << c.error().message();
  }
  g.group_pages = 0;
  g.digest = static_cast<DigestKind>(7);
  auto c = (*s)->create(1, g);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(has(c.error(), "digest kind 7")) << c.error().message();
}

TEST(PnmDigestKinds, GroupSizeZeroIsTheStoresChoiceOneIsOneLevelAndAReaderSeesWhatWasMade) {
  // The choice: two levels of kAutoGroupPages from kAutoGroupMinPages pages
  // of capacity on, one level below (docs/near-memory.md#digest-kinds).
  SharedPool pool(32ull << 20, 1, 0.0, false);
  auto ws = ContextStore::open(pool.host(0), store_opts());
  auto rs = ContextStore::open(pool.host(0), store_opts(false));
  ASSERT_TRUE(ws.ok() && rs.ok());
  const uint64_t big = kAutoGroupMinPages * 4;  // pages of 4 tokens
  struct Case {
    uint64_t max_tokens;
    uint32_t given, made;
  };
  const Case cases[] = {{big, 0, kAutoGroupPages}, {big - 4, 0, 0}, {big, 1, 0}, {big, 4, 4}, {64, 0, 0}};
  uint64_t id = 10;
  for (const Case& k : cases) {
    Geometry g{1, 1, 8, Dtype::bf16, 4, k.max_tokens, DigestKind::minmax, k.given};
    EXPECT_EQ(k.made, effective_group_pages(g)) << k.max_tokens << " / " << k.given;
    auto c = (*ws)->create(++id, g);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(k.made, (*c)->geometry().group_pages) << k.max_tokens << " / " << k.given;
    auto r = (*rs)->find(id);
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(k.made, (*r)->geometry().group_pages) << "a reader sees the size the context was made with";
    EXPECT_EQ(k.made ? (*c)->pages_for(k.max_tokens) / k.made : 0u, (*c)->groups_for(k.max_tokens));
    // The rows the choice adds fit in the area digest_area_bytes sizes.
    const uint64_t rows = (k.max_tokens + 3) / 4 + (k.made ? ((k.max_tokens + 3) / 4 + k.made - 1) / k.made : 0);
    EXPECT_EQ(rows * 2 * 8 * 2, digest_area_bytes(g));
    ASSERT_TRUE((*ws)->destroy(id).ok());
  }
}

TEST(PnmDigestKinds, ACarveOfLayoutVersion2IsRefusedNamingBothVersions) {
  SharedPool pool(16ull << 20, 1, 0.0, false);
  {
    auto s = ContextStore::open(pool.host(0), store_opts());
    ASSERT_TRUE(s.ok());
  }
  auto carve = pool.host(0).carve(CXLKV_CARVE_PNM);
  ASSERT_TRUE(carve.ok());
  auto* h = reinterpret_cast<cxlkv_pnm_header*>(static_cast<unsigned char*>(pool.base()) + carve->offset);
  ASSERT_EQ(3u, h->version);
  h->version = 2;
  h->checksum = cxlkv_pnm_header_checksum(h);
  auto s = ContextStore::open(pool.host(0), store_opts(false));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(-EPROTO, s.error().code());
  EXPECT_TRUE(has(s.error(), "layout version 2")) << s.error().message();
  EXPECT_TRUE(has(s.error(), "reads 3")) << s.error().message();
}
