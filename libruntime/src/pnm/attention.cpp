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
  float s[256];
  for (uint32_t t0 = 0; t0 < ntok; t0 += 256) {
    const uint32_t n = std::min<uint32_t>(256, ntok - t0);
    const auto* kk = static_cast<const unsigned char*>(k) + size_t(t0) * dim * dtype_size(dtype);
    const auto* vv = static_cast<const unsigned char*>(v) + size_t(t0) * dim * dtype_size(dtype);
    for (uint32_t h = 0; h < nq; h++) {
      kn.dot_rows(dtype, kk, n, dim, q + size_t(h) * dim, s);
      float mx = m[h];
      for (uint32_t i = 0; i < n; i++) mx = std::max(mx, s[i] * scale);
      // Online softmax: rescale what was summed so far to the new maximum.
      const float c = std::isinf(m[h]) ? 0.f : std::exp(m[h] - mx);
      float* a = acc + size_t(h) * dim;
      if (c != 1.f)
        for (uint32_t d = 0; d < dim; d++) a[d] *= c;
      float sum = 0;
      for (uint32_t i = 0; i < n; i++) {
        s[i] = std::exp(s[i] * scale - mx);
        sum += s[i];
      }
      kn.axpy_rows(dtype, vv, n, dim, s, a);
      l[h] = l[h] * c + sum;
      m[h] = mx;
    }
  }
}

namespace detail {

// Two passes over the selected pages of one (layer, KV head) for the whole
// query-head group (docs/near-memory.md#attention-at-the-read-bound): every
// score first (each key row read and converted once for all the group's
// heads), one maximum and one vectorized exp per head, then every value
// row once; rows are read in place where the domain is coherent (rule 4
// holds trivially), else staged a page at a time (invalidate, fence,
// load).  Exact softmax: the same sums as the online form, without its
// per-page rescaling.
Result<void> attend_head(const Context& ctx, const uint64_t* table, std::span<const uint32_t> pages, uint32_t L,
                         uint32_t h, const float* q, uint32_t group, uint64_t ntokens, float scale, Isa isa,
                         float* acc, float* lse) {
  const Geometry& g = ctx.geometry();
  const auto& kn = kernels(isa);
  const uint32_t dim = g.head_dim;
  const size_t rows = size_t(g.page_tokens) * dim * dtype_size(g.dtype);
  thread_local std::vector<unsigned char> kb, vb;
  thread_local std::vector<float> qs, s;
  kb.resize(rows);
  vb.resize(rows);
  auto page_ntok = [&](uint32_t p) {
    return static_cast<uint32_t>(std::min<uint64_t>(g.page_tokens, ntokens - uint64_t(p) * g.page_tokens));
  };
  size_t total = 0;
  for (uint32_t p : pages) total += page_ntok(p);
  std::fill(acc, acc + size_t(group) * dim, 0.f);
  if (total == 0) {
    std::fill(lse, lse + group, -INFINITY);
    return {};
  }
  // The scale folded into the queries: scores come out scaled.
  qs.resize(size_t(group) * dim);
  for (size_t i = 0; i < qs.size(); i++) qs[i] = q[i] * scale;
  s.resize(size_t(group) * total);
  auto rows_of = [&](uint64_t page_off, uint32_t kv, uint32_t ntok, std::vector<unsigned char>& buf)
      -> Result<const void*> {
    if (const void* in_place = ctx.rows_in_place(page_off, L, kv, h)) return in_place;
    CXLKV_TRY(ctx.read_rows(page_off, L, kv, h, ntok, buf.data()));
    return static_cast<const void*>(buf.data());
  };
  // A page's rows of one (layer, head) are page_tokens x head_dim elements
  // in one place and the next page's a page (every layer and head) away:
  // the hardware prefetcher stops at each 4 KiB page, so the rows two pages
  // ahead are prefetched (in place only; staged rows are copied anyway).
  constexpr size_t kAhead = 2;
  auto prefetch = [&](size_t j, uint32_t kv) {
    if (j >= pages.size()) return;
    const auto* r = static_cast<const char*>(ctx.rows_in_place(table[pages[j]], L, kv, h));
    if (!r) return;
    for (size_t o = 0; o < size_t(page_ntok(pages[j])) * dim * dtype_size(g.dtype); o += 64)
      __builtin_prefetch(r + o);
  };
  size_t pos = 0;
  for (size_t j = 0; j < kAhead; j++) prefetch(j, 0);
  for (size_t j = 0; j < pages.size(); j++) {
    const uint32_t p = pages[j];
    prefetch(j + kAhead, 0);
    const uint32_t ntok = page_ntok(p);
    auto k = rows_of(table[p], 0, ntok, kb);
    if (!k.ok()) return k.error();
    kn.rows_heads(true, g.dtype, *k, ntok, dim, qs.data(), total, group, s.data() + pos);
    pos += ntok;
  }
  std::vector<float> m(group), l(group);
  for (uint32_t j = 0; j < group; j++) {
    float* sj = s.data() + size_t(j) * total;
    m[j] = *std::max_element(sj, sj + total);
    l[j] = kn.exp_sum(sj, static_cast<uint32_t>(total), m[j], sj);
  }
  pos = 0;
  for (size_t j = 0; j < kAhead; j++) prefetch(j, 1);
  for (size_t j = 0; j < pages.size(); j++) {
    const uint32_t p = pages[j];
    prefetch(j + kAhead, 1);
    const uint32_t ntok = page_ntok(p);
    auto v = rows_of(table[p], 1, ntok, vb);
    if (!v.ok()) return v.error();
    kn.rows_heads(false, g.dtype, *v, ntok, dim, s.data() + pos, total, group, acc);
    pos += ntok;
  }
  for (uint32_t j = 0; j < group; j++) {
    for (uint32_t d = 0; d < dim; d++) acc[size_t(j) * dim + d] /= l[j];
    lse[j] = m[j] + std::log(l[j]);
  }
  return {};
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
  for (uint32_t L = 0; L < g.layers; L++)
    for (uint32_t h = 0; h < g.kv_heads; h++) {
      const size_t qh0 = size_t(L) * q_heads + size_t(h) * group;
      CXLKV_TRY(detail::attend_head(ctx, table.data(), sel ? sel->at(L, h) : all, L, h,
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
