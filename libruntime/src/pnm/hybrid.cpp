// SPDX-License-Identifier: MIT
// Hybrid steady-token mode (docs/near-memory.md "Hybrid mode"): GPU-resident pages per
// request kept by Algorithm 1's masks, recalls through the GPU sparse-read
// path, GPU part + near-memory part merged by log-sum-exp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "cuda/cxlkv_cuda_abi.h"
#include "cuda/cxlkv_pnm_abi.h"
#include "cxlkv/gpu.hpp"
#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"
#include "pnm/pnm_internal.hpp"

namespace cxlkv::pnm {

Result<std::unique_ptr<HybridRequest>> HybridRequest::create(Context& ctx, gpu::GpuPool& gpu, uint32_t capacity,
                                                            bool auto_steady) {
  const Geometry& g = ctx.geometry();
  const std::string C = "pnm context " + std::to_string(ctx.request_id()) + ": hybrid: ";
  if (capacity == 0) return Error(-EINVAL, C + "capacity is 0 pages");
  auto h = std::unique_ptr<HybridRequest>(new HybridRequest());
  h->ctx_ = &ctx;
  h->gpu_ = &gpu;
  h->capacity_ = capacity;
  h->auto_steady_ = auto_steady;
  h->piece_ = uint64_t(g.page_tokens) * g.head_dim * dtype_size(g.dtype);
  const uint64_t bytes = uint64_t(g.layers) * g.kv_heads * capacity * 2 * h->piece_;
  if (int rc = gpu.library().ops().device_alloc(&h->buf_, bytes); rc < 0)
    return Error(rc, C + "GPU buffer of " + std::to_string(bytes) + " bytes: " + gpu.library().ops().last_error());
  const size_t pairs = size_t(g.layers) * g.kv_heads;
  h->resident_.resize(pairs);
  h->slot_of_.resize(pairs);
  h->free_.resize(pairs);
  h->last_top_.resize(pairs);
  h->overlap_avg_.assign(pairs, -1.f);
  for (auto& f : h->free_)
    for (uint32_t s = capacity; s-- > 0;) f.push_back(s);
  return h;
}

HybridRequest::~HybridRequest() {
  if (buf_) gpu_->library().ops().device_free(buf_);
}

const PageMask& HybridRequest::resident(uint32_t layer, uint32_t head) const {
  return resident_.at(size_t(layer) * ctx_->geometry().kv_heads + head);
}

Result<Partial> HybridRequest::step(std::span<const float> queries, uint32_t q_heads, uint64_t ntokens,
                                    const SelectOptions& o, HybridStats* stats, Isa isa) {
  Context& ctx = *ctx_;
  const Geometry& g = ctx.geometry();
  const std::string C = "pnm context " + std::to_string(ctx.request_id()) + ": hybrid step: ";
  if (auto e = detail::check_step(ctx, queries, q_heads, ntokens); !e.empty()) return Error(-EINVAL, C + e);
  HybridStats st;
  const uint32_t group = q_heads / g.kv_heads, np = ctx.pages_for(ntokens);
  const size_t pairs = size_t(g.layers) * g.kv_heads;
  std::vector<uint64_t> table(np);
  CXLKV_TRY(ctx.read_page_table(0, np, table.data()));
  const Geometry& geo = g;
  auto rows_off = [&](uint32_t l, uint32_t kv, uint32_t h) {
    return ((uint64_t(l) * 2 + kv) * geo.kv_heads + h) * piece_;
  };
  auto slot_dev = [&](size_t i, uint32_t slot, uint32_t kv) {
    return reinterpret_cast<uint64_t>(buf_) + ((uint64_t(i) * capacity_ + slot) * 2 + kv) * piece_;
  };
  const uint64_t pool_base = reinterpret_cast<uint64_t>(gpu_->pin().base());
  const uint64_t region_base = reinterpret_cast<uint64_t>(ctx.region().base());
  if (region_base < pool_base || region_base + ctx.region().size() > pool_base + gpu_->pin().size())
    return Error(-ERANGE, C + "the GPU pool does not cover the context's pool mapping");
  std::vector<gpu::SparseList> lists;
  std::vector<std::vector<uint32_t>> near(pairs);
  std::vector<float> scores;
  const uint32_t last_page = np ? np - 1 : 0;
  const bool last_grew = np && (last_page_ != ntokens);
  for (size_t i = 0; i < pairs; i++) {
    const uint32_t l = uint32_t(i / g.kv_heads), h = uint32_t(i % g.kv_heads);
    const float* q = queries.data() + (size_t(l) * q_heads + size_t(h) * group) * g.head_dim;
    auto top = detail::select_head(ctx, q, group, l, h, ntokens, o, isa, &scores);
    if (!top.ok()) return top.error();
    // The overlap with the last step's selection, measured; with auto
    // sizing it (averaged) is this step's steady size.
    const PageMask top_mask = to_mask(*top, np);
    uint32_t overlap = 0;
    for (size_t w = 0; w < std::min(top_mask.size(), last_top_[i].size()); w++)
      overlap += uint32_t(std::popcount(top_mask[w] & last_top_[i][w]));
    const bool measured = !last_top_[i].empty();
    if (measured)
      overlap_avg_[i] = overlap_avg_[i] < 0 ? float(overlap) : 0.5f * overlap_avg_[i] + 0.5f * float(overlap);
    last_top_[i] = top_mask;
    uint32_t cap = capacity_;
    if (auto_steady_ && measured)
      cap = std::clamp<uint32_t>(uint32_t(std::ceil(overlap_avg_[i])), 1u, capacity_);
    st.overlap += overlap;
    st.steady += cap;
    SteadyStep s = steady_step(resident_[i], *top, scores, np, cap);
    auto& slots = slot_of_[i];
    slots.resize(np, -1);
    for (uint32_t p : from_mask(s.evict)) {
      free_[i].push_back(uint32_t(slots[p]));
      slots[p] = -1;
    }
    auto recall_page = [&](uint32_t p) {
      for (uint32_t kv = 0; kv < 2; kv++) {
        const uint64_t off = table[p] + rows_off(l, kv, h) + (region_base - pool_base);
        lists.push_back(gpu::SparseList{off, 0, slot_dev(i, uint32_t(slots[p]), kv), piece_, 1, 0});
      }
      st.recall_bytes += 2 * piece_;
    };
    for (uint32_t p : from_mask(s.recall)) {
      slots[p] = int32_t(free_[i].back());
      free_[i].pop_back();
      recall_page(p);
    }
    // The newest page grows between steps: a resident copy is refreshed.
    if (last_grew && slots[last_page] >= 0 && !(s.recall[last_page / 64] >> (last_page % 64) & 1)) {
      recall_page(last_page);
      st.refreshed++;
    }
    st.evicted += s.evicted;
    st.recalled += s.recalled;
    resident_[i] = s.resident;
    near[i] = from_mask(s.near);
    st.near_pages += near[i].size();
  }
  if (!lists.empty()) {
    std::vector<uint32_t> zeros(lists.size(), 0);  // one piece per list, at the list's own offset
    CXLKV_TRY(gpu_->sparse_read(lists, zeros, piece_, nullptr));
    CXLKV_TRY(gpu_->sync(nullptr));
  }
  last_page_ = ntokens;

  Partial gpu_part, near_part;
  for (Partial* p : {&gpu_part, &near_part}) {
    p->layers = g.layers;
    p->q_heads = q_heads;
    p->head_dim = g.head_dim;
    p->out.assign(size_t(g.layers) * q_heads * g.head_dim, 0.f);
    p->lse.assign(size_t(g.layers) * q_heads, -INFINITY);
  }
  const float scale = 1.f / std::sqrt(float(g.head_dim));
  // GPU part on a GPU: the partial-attention kernel over the resident pages
  // (one launch for every query head), output + log-sum-exp back to the host.
  const bool on_gpu = !gpu_->library().is_reference();
  if (on_gpu) {
    gpu::CudaLibrary& lib = gpu_->library();
    auto ops = detail::pnm_ops(lib);
    if (!ops.ok()) return Error(ops.error().code(), C + ops.error().message());
    if ((*ops)->size < offsetof(cxlkv_cuda_pnm_ops, attend) + sizeof((*ops)->attend) || !(*ops)->attend)
      return Error(-ENOSYS, C + lib.path() + " has no GPU partial-attention kernel (built before it)");
    const uint32_t nq = g.layers * q_heads;
    std::vector<uint32_t> start(pairs + 1, 0), pn;
    std::vector<uint64_t> pk;
    for (size_t i = 0; i < pairs; i++) {
      for (uint32_t p : from_mask(resident_[i])) {
        pk.push_back(slot_dev(i, uint32_t(slot_of_[i][p]), 0));
        pn.push_back(uint32_t(std::min<uint64_t>(g.page_tokens, ntokens - uint64_t(p) * g.page_tokens)));
        st.gpu_pages++;
      }
      start[i + 1] = uint32_t(pk.size());
    }
    // One device allocation: q | out | lse | page_start | page_k | page_ntok.
    auto al = [](uint64_t v) { return (v + 63) / 64 * 64; };
    const uint64_t qb = uint64_t(nq) * g.head_dim * 4, lb = uint64_t(nq) * 4;
    const uint64_t o_q = 0, o_out = al(qb), o_lse = o_out + al(qb), o_st = o_lse + al(lb),
                   o_pk = o_st + al((pairs + 1) * 4), o_pn = o_pk + al(pk.size() * 8 + 8),
                   total = o_pn + al(pn.size() * 4 + 4);
    std::vector<unsigned char> host(total, 0);
    std::memcpy(host.data() + o_q, queries.data(), qb);
    std::memcpy(host.data() + o_st, start.data(), start.size() * 4);
    if (!pk.empty()) std::memcpy(host.data() + o_pk, pk.data(), pk.size() * 8);
    if (!pn.empty()) std::memcpy(host.data() + o_pn, pn.data(), pn.size() * 4);
    const cxlkv_cuda_ops& co = lib.ops();
    void* dev = nullptr;
    if (int rc = co.device_alloc(&dev, total); rc < 0)
      return Error(rc, C + "GPU attention buffer of " + std::to_string(total) + " bytes: " + co.last_error());
    struct Free {
      const cxlkv_cuda_ops& o;
      void* p;
      ~Free() { o.device_free(p); }
    } free_dev{co, dev};
    const uint64_t d0 = reinterpret_cast<uint64_t>(dev);
    const cxlkv_pnm_attend_args a{d0 + o_q,  d0 + o_out,    d0 + o_lse, d0 + o_st, d0 + o_pk,
                                  d0 + o_pn, piece_,        nq,         group,     g.head_dim,
                                  static_cast<uint32_t>(g.dtype), scale, 0};
    int rc = co.memcpy_async(dev, host.data(), total, nullptr);
    if (rc < 0) return Error(rc, C + "GPU attention upload: " + co.last_error());
    rc = (*ops)->attend(&a, nullptr);
    if (rc < 0) {
      const std::string why = (*ops)->last_error();
      (void)gpu_->sync(nullptr);  // the upload reads `host`: done before it goes
      return Error(rc, C + "GPU partial attention: " + why);
    }
    rc = co.memcpy_async(host.data() + o_out, reinterpret_cast<void*>(d0 + o_out), o_st - o_out, nullptr);
    auto synced = gpu_->sync(nullptr);
    if (rc < 0) return Error(rc, C + "GPU attention download: " + co.last_error());
    if (!synced.ok()) return synced.error();
    std::memcpy(gpu_part.out.data(), host.data() + o_out, qb);
    std::memcpy(gpu_part.lse.data(), host.data() + o_lse, lb);
  }
  std::vector<float> m(group), lsum(group);
  for (size_t i = 0; i < pairs; i++) {
    const uint32_t l = uint32_t(i / g.kv_heads), h = uint32_t(i % g.kv_heads);
    const size_t qh0 = size_t(l) * q_heads + size_t(h) * group;
    const float* q = queries.data() + qh0 * g.head_dim;
    if (on_gpu) {
      CXLKV_TRY(detail::attend_head(ctx, table.data(), near[i], l, h, q, group, ntokens, scale, isa,
                                    near_part.out.data() + qh0 * g.head_dim, near_part.lse.data() + qh0));
      continue;
    }
    // GPU part: the resident pages, read from the GPU buffer (host memory
    // with the CPU stand-in).
    float* acc = gpu_part.out.data() + qh0 * g.head_dim;
    std::fill(m.begin(), m.end(), -INFINITY);
    std::fill(lsum.begin(), lsum.end(), 0.f);
    for (uint32_t p : from_mask(resident_[i])) {
      const uint32_t ntok = uint32_t(std::min<uint64_t>(g.page_tokens, ntokens - uint64_t(p) * g.page_tokens));
      const auto* kb = reinterpret_cast<const void*>(slot_dev(i, uint32_t(slot_of_[i][p]), 0));
      const auto* vb = reinterpret_cast<const void*>(slot_dev(i, uint32_t(slot_of_[i][p]), 1));
      attend_rows(isa, g.dtype, kb, vb, ntok, g.head_dim, q, group, scale, m.data(), lsum.data(), acc);
      st.gpu_pages++;
    }
    for (uint32_t j = 0; j < group; j++)
      if (lsum[j] > 0) {
        for (uint32_t d = 0; d < g.head_dim; d++) acc[size_t(j) * g.head_dim + d] /= lsum[j];
        gpu_part.lse[qh0 + j] = m[j] + std::log(lsum[j]);
      }
    // Near-memory part: the rest of the selection, read from the pool.
    CXLKV_TRY(detail::attend_head(ctx, table.data(), near[i], l, h, q, group, ntokens, scale, isa,
                                  near_part.out.data() + qh0 * g.head_dim, near_part.lse.data() + qh0));
  }
  if (stats) *stats = st;
  ctx.store().record_hybrid_step(st.recall_bytes);  // the pnm metrics family
  return merge(gpu_part, near_part);
}

}  // namespace cxlkv::pnm
