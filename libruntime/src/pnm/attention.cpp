// SPDX-License-Identifier: MIT
// Near-memory attention (docs/near-memory.md "A decode step"): exact softmax over the selected
// (or all) pages with output and log-sum-exp, and the merge of partials.
#include <algorithm>
#include <cmath>

#include "cxlkv/pnm.hpp"
#include "pnm/pnm_internal.hpp"

namespace cxlkv::pnm {

void attend_rows(Isa isa, Dtype dtype, const void* k, const void* v, uint32_t ntok, uint32_t dim, const float* q,
                 uint32_t nq, float scale, float* m, float* l, float* acc) {
  if (ntok == 0) return;
  const auto& kn = detail::kernels(isa);
  thread_local std::vector<float> qs, w;
  qs.resize(size_t(nq) * dim);
  for (size_t i = 0; i < qs.size(); i++) qs[i] = q[i] * scale;
  w.resize(size_t(nq) * detail::kAttendRows);
  const size_t row = size_t(dim) * dtype_size(dtype);
  for (uint32_t t0 = 0; t0 < ntok; t0 += detail::kAttendRows) {
    const uint32_t n = std::min(detail::kAttendRows, ntok - t0);
    kn.attend_rows(true, dtype, static_cast<const unsigned char*>(k) + t0 * row, n, dim, qs.data(), nq, m, l, acc,
                   w.data(), detail::kAttendRows, nullptr, 0);
    kn.attend_rows(false, dtype, static_cast<const unsigned char*>(v) + t0 * row, n, dim, nullptr, nq, nullptr,
                   nullptr, acc, w.data(), detail::kAttendRows, nullptr, 0);
  }
}

namespace detail {

// The selected pages of KV heads [h0, h0 + nh) of one layer for their
// query-head groups, in one pass (docs/near-memory.md#attention-at-the-read-bound):
// page by page, the key rows of every head that selected the page, then
// their value rows, through the online softmax.  A page holds a layer's
// heads' key rows side by side and then their value rows, so where the
// heads selected the same page (most pages, at a budget that is a good
// share of the context) each is one stretch read in order; the rows used
// a few uses later are prefetched, spread over the kernel's work on these
// (the next rows of a head are a whole page, every layer and head, away,
// past where the hardware prefetcher follows).  Rows are read
// in place where the domain is coherent (rule 4 holds trivially), else
// staged a page at a time (invalidate, fence, load).
Result<void> attend_heads(const Context& ctx, const uint64_t* table, const std::span<const uint32_t>* pages,
                          uint32_t L, uint32_t h0, uint32_t nh, const float* q, uint32_t group, uint64_t ntokens,
                          float scale, Isa isa, float* out, float* lse) {
  const Geometry& g = ctx.geometry();
  const auto& kn = kernels(isa);
  const uint32_t dim = g.head_dim;
  const size_t row = size_t(dim) * dtype_size(g.dtype);
  const uint32_t nq = nh * group;
  constexpr uint32_t ld = kAttendRows;
  thread_local std::vector<unsigned char> staged;
  thread_local std::vector<float> qs, m, l, w;
  qs.resize(size_t(nq) * dim);
  for (size_t i = 0; i < qs.size(); i++) qs[i] = q[i] * scale;  // scores come out scaled
  m.assign(nq, -INFINITY);
  l.assign(nq, 0.f);
  w.resize(size_t(nq) * ld);
  staged.resize(2 * size_t(nh) * g.page_tokens * row);
  std::fill(out, out + size_t(nq) * dim, 0.f);
  auto page_ntok = [&](uint32_t p) {
    return static_cast<uint32_t>(std::min<uint64_t>(g.page_tokens, ntokens - uint64_t(p) * g.page_tokens));
  };
  // The rows in the order they are used: the pages in order over every
  // head (a merge of the heads' lists; each head's list is taken in its own
  // order, sorted or not: at each step the lowest page any head is at),
  // and at each page the key rows of the heads there, then their value rows.
  struct Use {
    uint32_t page, head, kv;
  };
  thread_local std::vector<Use> uses;
  uses.clear();
  {
    std::vector<size_t> at(nh, 0);
    for (;;) {
      uint32_t p = UINT32_MAX;
      for (uint32_t i = 0; i < nh; i++)
        if (at[i] < pages[i].size()) p = std::min(p, pages[i][at[i]]);
      if (p == UINT32_MAX) break;
      const size_t first = uses.size();
      for (uint32_t i = 0; i < nh; i++)
        if (at[i] < pages[i].size() && pages[i][at[i]] == p) {
          uses.push_back({p, i, 0});
          at[i]++;
        }
      const size_t keys = uses.size();
      for (size_t u = first; u < keys; u++) uses.push_back({p, uses[u].head, 1});
    }
  }
  // The rows used `ahead` uses from now (8: 32 KiB of bf16 rows of 16
  // tokens, about a microsecond of work) are prefetched while these are
  // used, a few lines per block of the kernel's work: a burst per page
  // (what this did before) fills the core's miss buffers and stalls the
  // work behind it.  The layer's first uses go in one burst.
  //
  // A use's rows are a 4 KiB page of the pool of their own (16 tokens of
  // 128 bf16 elements; every layer and head lie between a head's rows of
  // two pages), so on a pool of 4 KiB pages each use is a TLB miss; the first line of the rows
  // `walk` uses from now is prefetched early, so that its page walk is
  // done before its lines are (a prefetch that waits on a walk waited
  // as long as the lines themselves: 15 ms -> 12.5 ms a step of the
  // bench on 4 KiB pages, little change on 2 MiB pages).
  constexpr size_t ahead = 8, walk = 32;
  auto in_place = [&](size_t u) {
    return static_cast<const unsigned char*>(ctx.rows_in_place(table[uses[u].page], L, uses[u].kv, h0 + uses[u].head));
  };
  for (size_t u = 0; u < std::min<size_t>(walk, uses.size()); u++)
    if (const unsigned char* r = in_place(u))
      for (size_t o = 0; o < (u < ahead ? page_ntok(uses[u].page) * row : 1); o += 64) __builtin_prefetch(r + o);
  std::vector<const unsigned char*> rows(2 * size_t(nh));
  for (size_t u0 = 0; u0 < uses.size();) {
    const uint32_t p = uses[u0].page, ntok = page_ntok(p);
    size_t u1 = u0;
    while (u1 < uses.size() && uses[u1].page == p) u1++;
    // Rows of the heads at page p: in place, or staged (K and V of each,
    // so that the value pass finds them).
    for (size_t u = u0; u < u1; u++) {
      const uint32_t i = uses[u].head, kv = uses[u].kv;
      rows[2 * i + kv] = in_place(u);
      if (rows[2 * i + kv]) continue;
      unsigned char* buf = staged.data() + (2 * size_t(i) + kv) * g.page_tokens * row;
      CXLKV_TRY(ctx.read_rows(table[p], L, kv, h0 + i, ntok, buf));
      rows[2 * i + kv] = buf;
    }
    for (size_t u = u0; u < u1; u++) {
      const uint32_t i = uses[u].head, kv = uses[u].kv;
      const unsigned char* next = nullptr;
      uint32_t next_bytes = 0;
      if (u + walk < uses.size())
        if (const unsigned char* f = in_place(u + walk)) __builtin_prefetch(f);
      if (u + ahead < uses.size() && (next = in_place(u + ahead)))
        next_bytes = uint32_t(page_ntok(uses[u + ahead].page) * row);
      const size_t q0 = size_t(i) * group;
      if (ntok <= ld) {
        if (kv == 0)
          kn.attend_rows(true, g.dtype, rows[2 * i], ntok, dim, qs.data() + q0 * dim, group, m.data() + q0,
                         l.data() + q0, out + q0 * dim, w.data() + q0 * ld, ld, next, next_bytes);
        else
          kn.attend_rows(false, g.dtype, rows[2 * i + 1], ntok, dim, nullptr, group, nullptr, nullptr,
                         out + q0 * dim, w.data() + q0 * ld, ld, next, next_bytes);
        continue;
      }
      // Pages longer than the kernel takes at a time: their value rows
      // follow each piece's key rows, all at the head's key use.
      if (kv == 0)
        for (uint32_t t0 = 0; t0 < ntok; t0 += ld) {
          const uint32_t n = std::min(ld, ntok - t0);
          kn.attend_rows(true, g.dtype, rows[2 * i] + t0 * row, n, dim, qs.data() + q0 * dim, group, m.data() + q0,
                         l.data() + q0, out + q0 * dim, w.data() + q0 * ld, ld, nullptr, 0);
          kn.attend_rows(false, g.dtype, rows[2 * i + 1] + t0 * row, n, dim, nullptr, group, nullptr, nullptr,
                         out + q0 * dim, w.data() + q0 * ld, ld, nullptr, 0);
        }
      for (uint32_t o = 0; o < next_bytes; o += 64) __builtin_prefetch(next + o);
    }
    u0 = u1;
  }
  for (uint32_t j = 0; j < nq; j++) {
    if (l[j] > 0) {
      for (uint32_t d = 0; d < dim; d++) out[size_t(j) * dim + d] /= l[j];
      lse[j] = m[j] + std::log(l[j]);
    } else {
      lse[j] = -INFINITY;  // no tokens: the empty partial, merge's identity
    }
  }
  return {};
}

Result<void> attend_head(const Context& ctx, const uint64_t* table, std::span<const uint32_t> pages, uint32_t L,
                         uint32_t h, const float* q, uint32_t group, uint64_t ntokens, float scale, Isa isa,
                         float* acc, float* lse) {
  return attend_heads(ctx, table, &pages, L, h, 1, q, group, ntokens, scale, isa, acc, lse);
}

}  // namespace detail

Result<Partial> attend(const Context& ctx, std::span<const float> queries, uint32_t q_heads, uint64_t ntokens,
                       const Selection* sel, float scale, Isa isa) {
  const Geometry& g = ctx.geometry();
  const std::string C = "pnm context " + std::to_string(ctx.request_id()) + ": attend: ";
  if (auto e = detail::check_step(ctx, queries, q_heads, ntokens); !e.empty()) return Error(-EINVAL, C + e);
  const uint32_t np = ctx.pages_for(ntokens);
  if (sel) {
    if (sel->layers != g.layers || sel->kv_heads != g.kv_heads ||
        sel->pages.size() != size_t(g.layers) * g.kv_heads)
      return Error(-EINVAL, C + "selection shape does not match the context");
    for (auto& v : sel->pages)
      for (uint32_t p : v)
        if (p >= np) return Error(-EINVAL, C + "selected page " + std::to_string(p) + " beyond " + std::to_string(np));
  }
  if (scale == 0.f) scale = 1.f / std::sqrt(float(g.head_dim));
  const uint32_t group = q_heads / g.kv_heads;
  Partial out;
  out.layers = g.layers;
  out.q_heads = q_heads;
  out.head_dim = g.head_dim;
  out.out.assign(size_t(g.layers) * q_heads * g.head_dim, 0.f);
  out.lse.assign(size_t(g.layers) * q_heads, -INFINITY);
  std::vector<uint64_t> table(np);
  CXLKV_TRY(ctx.read_page_table(0, np, table.data()));
  std::vector<uint32_t> all;
  if (!sel) {
    all.resize(np);
    for (uint32_t p = 0; p < np; p++) all[p] = p;
  }
  std::vector<std::span<const uint32_t>> heads(g.kv_heads);
  for (uint32_t L = 0; L < g.layers; L++) {
    for (uint32_t h = 0; h < g.kv_heads; h++) heads[h] = sel ? std::span<const uint32_t>(sel->at(L, h)) : all;
    const size_t qh0 = size_t(L) * q_heads;
    CXLKV_TRY(detail::attend_heads(ctx, table.data(), heads.data(), L, 0, g.kv_heads,
                                   queries.data() + qh0 * g.head_dim, group, ntokens, scale, isa,
                                   out.out.data() + qh0 * g.head_dim, out.lse.data() + qh0));
  }
  return out;
}

void merge_rows(size_t n, uint32_t head_dim, const float* out_a, const float* lse_a, const float* out_b,
                const float* lse_b, float* out, float* lse) {
  for (size_t i = 0; i < n; i++) {
    const float la = lse_a[i], lb = lse_b[i], mx = std::max(la, lb);
    float* o = out + i * head_dim;
    if (std::isinf(mx) && mx < 0) {  // both parts empty
      std::fill(o, o + head_dim, 0.f);
      lse[i] = -INFINITY;
      continue;
    }
    const float wa = std::exp(la - mx), wb = std::exp(lb - mx), w = wa + wb;
    const float* oa = out_a + i * head_dim;
    const float* ob = out_b + i * head_dim;
    for (uint32_t d = 0; d < head_dim; d++) o[d] = (wa * oa[d] + wb * ob[d]) / w;
    lse[i] = mx + std::log(w);
  }
}

Result<Partial> merge(const Partial& a, const Partial& b) {
  if (a.layers != b.layers || a.q_heads != b.q_heads || a.head_dim != b.head_dim ||
      a.out.size() != b.out.size() || a.lse.size() != b.lse.size() ||
      a.lse.size() != size_t(a.layers) * a.q_heads || a.out.size() != a.lse.size() * a.head_dim)
    return Error(-EINVAL, "pnm merge: partials of different shapes (" + std::to_string(a.layers) + "x" +
                              std::to_string(a.q_heads) + "x" + std::to_string(a.head_dim) + " and " +
                              std::to_string(b.layers) + "x" + std::to_string(b.q_heads) + "x" +
                              std::to_string(b.head_dim) + ")");
  Partial r = a;
  merge_rows(a.lse.size(), a.head_dim, a.out.data(), a.lse.data(), b.out.data(), b.lse.data(), r.out.data(),
             r.lse.data());
  return r;
}

}  // namespace cxlkv::pnm
