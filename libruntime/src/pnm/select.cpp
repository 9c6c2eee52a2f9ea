// SPDX-License-Identifier: MIT
// Page scoring and top-T_budget selection (docs/near-memory.md "A decode step").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cxlkv/pnm.hpp"
#include "pnm/pnm_internal.hpp"

namespace cxlkv::pnm {

void score_pages(Isa isa, Dtype dtype, const void* digests, uint32_t npages, uint32_t dim, const float* q,
                 uint32_t nq, ScoreMode mode, float* out) {
  detail::kernels(isa).score(dtype, digests, npages, dim, q, nq, mode, out);
}

void score_q8_pages(Isa isa, const void* rows, uint32_t npages, uint32_t dim, const float* q, uint32_t nq,
                    ScoreMode mode, float* out) {
  detail::kernels(isa).score_q8(rows, npages, dim, q, nq, mode, out);
}

namespace {

// A score as an unsigned key of the same order (larger score, larger key);
// NaN ranks as -inf, as the selection orders it.
inline uint32_t score_key(float s) {
  if (std::isnan(s)) s = -INFINITY;
  uint32_t u;
  std::memcpy(&u, &s, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The best `want` of pages [b, e) by (score desc, page asc), by radix
// selection on the score keys: a histogram of the top 12 key bits over all
// pages, then of the next bits over the pages of the boundary bucket only.
// Two short passes over the scores instead of nth_element's comparisons
// through an index array (docs/near-memory.md#selection-at-the-read-bound).
void top_of_range(const float* scores, uint32_t b, uint32_t e, uint32_t want, std::vector<uint32_t>& out) {
  thread_local std::vector<uint32_t> cand, next, hist;
  cand.clear();
  uint32_t need = want;
  bool first = true;
  for (const uint32_t shift : {20u, 8u, 0u}) {
    const uint32_t bits = shift == 0 ? 8 : 12, mask = (1u << bits) - 1;
    hist.assign(size_t(1) << bits, 0);
    if (first) {
      for (uint32_t p = b; p < e; p++) hist[(score_key(scores[p]) >> shift) & mask]++;
    } else {
      for (uint32_t p : cand) hist[(score_key(scores[p]) >> shift) & mask]++;
    }
    uint32_t above = 0, t = mask;
    for (;; t--) {
      if (above + hist[t] >= need) break;
      above += hist[t];
    }
    next.clear();
    auto split = [&](uint32_t p) {
      const uint32_t k = (score_key(scores[p]) >> shift) & mask;
      if (k > t) out.push_back(p);
      else if (k == t) next.push_back(p);
    };
    if (first) {
      for (uint32_t p = b; p < e; p++) split(p);
    } else {
      for (uint32_t p : cand) split(p);
    }
    first = false;
    need -= above;
    cand.swap(next);
    if (need == 0) return;
    if (need == cand.size() || shift == 0) break;
  }
  // The boundary bucket's pages share their key (or all are taken): the
  // lowest pages first, and cand is ascending.
  out.insert(out.end(), cand.begin(), cand.begin() + need);
}

}  // namespace

std::vector<uint32_t> top_pages(const float* scores, uint32_t npages, uint32_t budget_pages, uint32_t sink_pages,
                                uint32_t local_pages) {
  std::vector<uint32_t> out;
  if (npages == 0) return out;
  const uint32_t sink = std::min(sink_pages, npages);
  const uint32_t local = std::min(local_pages, npages - sink);
  const uint32_t mid_begin = sink, mid_end = npages - local;
  for (uint32_t p = 0; p < sink; p++) out.push_back(p);
  const uint32_t kept = sink + local;
  const uint32_t want = budget_pages > kept ? std::min(budget_pages - kept, mid_end - mid_begin) : 0;
  if (want == mid_end - mid_begin) {
    for (uint32_t p = mid_begin; p < mid_end; p++) out.push_back(p);
  } else if (want > 0) {
    top_of_range(scores, mid_begin, mid_end, want, out);
  }
  for (uint32_t p = mid_end; p < npages; p++) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

namespace detail {

std::string check_step(const Context& ctx, std::span<const float> queries, uint32_t q_heads, uint64_t ntokens) {
  const Geometry& g = ctx.geometry();
  if (q_heads == 0 || q_heads % g.kv_heads)
    return std::to_string(q_heads) + " query heads are not a multiple of " + std::to_string(g.kv_heads) +
           " KV heads";
  if (queries.size() != size_t(g.layers) * q_heads * g.head_dim)
    return "queries hold " + std::to_string(queries.size()) + " floats, expected " +
           std::to_string(size_t(g.layers) * q_heads * g.head_dim);
  if (ntokens > ctx.tokens())
    return std::to_string(ntokens) + " tokens asked, " + std::to_string(ctx.tokens()) + " published";
  return "";
}

Result<std::vector<uint32_t>> select_head(const Context& ctx, const float* q, uint32_t group, uint32_t l, uint32_t h,
                                          uint64_t ntokens, const SelectOptions& o, Isa isa,
                                          std::vector<float>* scores_out, uint64_t* bytes_read) {
  const Geometry& g = ctx.geometry();
  const uint32_t np = ctx.pages_for(ntokens);
  const uint32_t budget = static_cast<uint32_t>(
      std::min<uint64_t>((o.token_budget + g.page_tokens - 1) / g.page_tokens, np));
  const size_t rb = ctx.digest_row_bytes();
  const auto& kn = kernels(isa);
  constexpr uint32_t kChunk = 256;  // rows staged (or checked) per pass (fits L2)
  thread_local std::vector<unsigned char> buf;
  thread_local std::vector<float> local_scores, group_scores;
  std::vector<float>& scores = scores_out ? *scores_out : local_scores;
  uint64_t bytes = 0;
  // Rows [first, first + n) of the page (or group) digests of (l, h) into
  // out: read in place where the domain is coherent, else staged (rule 4:
  // invalidate, fence, load), checked, scored.
  auto score_rows = [&](bool groups, uint32_t first, uint32_t n, float* out) -> Result<void> {
    const void* in_place = groups ? ctx.group_digests_in_place(l, h) : ctx.digests_in_place(l, h);
    for (uint32_t c0 = first; c0 < first + n; c0 += kChunk) {
      const uint32_t m = std::min(kChunk, first + n - c0);
      const unsigned char* rows;
      if (in_place) {
        rows = static_cast<const unsigned char*>(in_place) + size_t(c0) * rb;
      } else {
        buf.resize(size_t(kChunk) * rb);
        CXLKV_TRY(groups ? ctx.read_group_digests(l, h, c0, m, buf.data())
                         : ctx.read_digests(l, h, c0, m, buf.data()));  // rule 4: invalidate, fence, load
        rows = buf.data();
      }
      CXLKV_TRY(ctx.check_digest_rows(rows, c0, m, groups, l, h, ntokens));
      if (g.digest == DigestKind::q8)
        kn.score_q8(rows, m, g.head_dim, q, group, o.mode, out + (c0 - first));
      else
        kn.score(g.dtype, rows, m, g.head_dim, q, group, o.mode, out + (c0 - first));
    }
    bytes += uint64_t(n) * rb;
    return {};
  };
  if (g.group_pages && !o.one_level) {
    // Two levels (docs/near-memory.md#digest-kinds): every group digest,
    // then the page digests of the best groups only.  A group's min/max
    // bound its pages', so a group's score bounds its pages' scores; pages
    // of groups not read are not candidates (-inf in scores_out).
    const uint32_t gp = g.group_pages, ng = ctx.groups_for(ntokens);
    group_scores.resize(ng);
    CXLKV_TRY(score_rows(true, 0, ng, group_scores.data()));
    const uint64_t refine = o.refine_pages ? o.refine_pages : std::max<uint64_t>(4ull * budget, 512);
    const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(ng, (refine + gp - 1) / gp));
    // The read pages' scores kept compact (not an array over every page:
    // filling and ranking one costs more than the reads at 1M tokens).
    thread_local std::vector<uint32_t> cand_pages, picked;
    thread_local std::vector<float> cand_scores;
    cand_pages.clear();
    cand_scores.clear();
    const std::vector<uint32_t> chosen = top_pages(group_scores.data(), ng, take, 0, 0);
    const auto* in_place = static_cast<const char*>(ctx.digests_in_place(l, h));
    for (size_t j = 0; j < chosen.size(); j++) {
      const uint32_t gi = chosen[j], p0 = gi * gp, n = std::min(gp, np - p0);
      // The next group's page rows are elsewhere (past a 4 KiB boundary the
      // hardware prefetcher does not follow): asked for while this one is scored.
      if (in_place && j + 1 < chosen.size())
        for (size_t o = 0; o < size_t(gp) * rb && chosen[j + 1] * size_t(gp) * rb + o < size_t(np) * rb; o += 64)
          __builtin_prefetch(in_place + chosen[j + 1] * size_t(gp) * rb + o);
      const size_t at = cand_scores.size();
      cand_scores.resize(at + n);
      CXLKV_TRY(score_rows(false, p0, n, cand_scores.data() + at));
      for (uint32_t i = 0; i < n; i++) cand_pages.push_back(p0 + i);
    }
    if (scores_out) {
      scores.assign(np, -INFINITY);
      for (size_t i = 0; i < cand_pages.size(); i++) scores[cand_pages[i]] = cand_scores[i];
    }
    // Sink and local pages always; then the best read pages of the rest
    // (ascending pages, so ties go to the lower page as in top_pages).
    const uint32_t sink = std::min(o.sink_pages, np), local = std::min(o.local_pages, np - sink);
    const uint32_t mid_end = np - local;
    size_t w = 0;
    for (size_t i = 0; i < cand_pages.size(); i++)
      if (cand_pages[i] >= sink && cand_pages[i] < mid_end) {
        cand_pages[w] = cand_pages[i];
        cand_scores[w++] = cand_scores[i];
      }
    cand_pages.resize(w);
    cand_scores.resize(w);
    const uint32_t kept = sink + local;
    const uint32_t want = budget > kept ? std::min<uint32_t>(budget - kept, static_cast<uint32_t>(w)) : 0;
    std::vector<uint32_t> out;
    for (uint32_t p = 0; p < sink; p++) out.push_back(p);
    picked.clear();
    if (want == w) {
      for (uint32_t i = 0; i < w; i++) picked.push_back(i);
    } else if (want > 0) {
      top_of_range(cand_scores.data(), 0, static_cast<uint32_t>(w), want, picked);
    }
    for (uint32_t i : picked) out.push_back(cand_pages[i]);
    for (uint32_t p = mid_end; p < np; p++) out.push_back(p);
    std::sort(out.begin(), out.end());
    if (bytes_read) *bytes_read = bytes;
    return out;
  } else {
    scores.resize(np);
    CXLKV_TRY(score_rows(false, 0, np, scores.data()));
  }
  if (bytes_read) *bytes_read = bytes;
  return top_pages(scores.data(), np, budget, o.sink_pages, o.local_pages);
}

}  // namespace detail

Result<Selection> select_pages(const Context& ctx, std::span<const float> queries, uint32_t q_heads,
                               uint64_t ntokens, const SelectOptions& o, Isa isa) {
  const Geometry& g = ctx.geometry();
  if (auto e = detail::check_step(ctx, queries, q_heads, ntokens); !e.empty())
    return Error(-EINVAL, "pnm context " + std::to_string(ctx.request_id()) + ": select: " + e);
  const uint32_t group = q_heads / g.kv_heads;
  Selection sel;
  sel.layers = g.layers;
  sel.kv_heads = g.kv_heads;
  sel.pages.resize(size_t(g.layers) * g.kv_heads);
  for (uint32_t l = 0; l < g.layers; l++)
    for (uint32_t h = 0; h < g.kv_heads; h++) {
      const float* q = queries.data() + (size_t(l) * q_heads + size_t(h) * group) * g.head_dim;
      uint64_t read = 0;
      auto p = detail::select_head(ctx, q, group, l, h, ntokens, o, isa, nullptr, &read);
      if (!p.ok()) return p.error();
      sel.digest_bytes += read;
      sel.pages[size_t(l) * g.kv_heads + h] = std::move(p.value());
    }
  return sel;
}

}  // namespace cxlkv::pnm
