// SPDX-License-Identifier: MIT
// The C API of the near-memory engine (cxlkv/cxlkv_pnm.h) over the C++ one.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "capi/capi.hpp"
#include "cxlkv/cxlkv_pnm.h"
#include "cxlkv/pnm.hpp"

using namespace cxlkv;
using cxlkv::capi::guarded;
using cxlkv::capi::set_error;

struct cxlkv_pnm_store {
  std::unique_ptr<pnm::ContextStore> st;
};
struct cxlkv_pnm_context {
  std::unique_ptr<pnm::Context> ctx;
};
struct cxlkv_pnm_engine {
  std::unique_ptr<pnm::Engine> e;
};

namespace {

Result<pnm::SelectOptions> select_opts(const cxlkv_pnm_step_opts* o, bool* all_pages) {
  pnm::SelectOptions s;
  *all_pages = false;
  if (!o) return s;
  if (o->size < sizeof(size_t)) return Error(-EINVAL, "step options: size field is " + std::to_string(o->size));
  if (CXLKV_OPT_HAS(o, token_budget) && o->token_budget) s.token_budget = o->token_budget;
  if (CXLKV_OPT_HAS(o, sink_pages)) s.sink_pages = o->sink_pages;
  if (CXLKV_OPT_HAS(o, local_pages)) s.local_pages = o->local_pages;
  if (CXLKV_OPT_HAS(o, score_mode)) {
    if (o->score_mode > CXLKV_PNM_SCORE_COARSE)
      return Error(-EINVAL, "step options: unknown score_mode " + std::to_string(o->score_mode));
    s.mode = o->score_mode == CXLKV_PNM_SCORE_COARSE ? pnm::ScoreMode::coarse : pnm::ScoreMode::upper_bound;
  }
  if (CXLKV_OPT_HAS(o, flags)) {
    if (o->flags & ~CXLKV_PNM_STEP_F_ALL_PAGES)
      return Error(-EINVAL, "step options: unknown flags " + std::to_string(o->flags));
    *all_pages = o->flags & CXLKV_PNM_STEP_F_ALL_PAGES;
  }
  if (CXLKV_OPT_HAS(o, refine_pages)) s.refine_pages = o->refine_pages;
  return s;
}

size_t query_floats(const pnm::Context& c, uint32_t q_heads) {
  return size_t(c.geometry().layers) * q_heads * c.geometry().head_dim;
}

}  // namespace

extern "C" {

int cxlkv_pnm_store_open(struct cxlkv_pool* pool, const struct cxlkv_pnm_store_opts* opts,
                         struct cxlkv_pnm_store** out) {
  return guarded(__func__, [&]() -> int {
    if (!pool || !out) return set_error(-EINVAL, "cxlkv_pnm_store_open: pool or out is NULL");
    *out = nullptr;
    pnm::StoreOptions so;
    if (opts) {
      if (opts->size < sizeof(size_t)) return set_error(-EINVAL, "cxlkv_pnm_store_open: options size is too small");
      if (CXLKV_OPT_HAS(opts, carve_bytes) && opts->carve_bytes) so.carve_bytes = opts->carve_bytes;
      if (CXLKV_OPT_HAS(opts, partitions) && opts->partitions) so.partitions = opts->partitions;
      if (CXLKV_OPT_HAS(opts, slots_per_partition) && opts->slots_per_partition)
        so.slots_per_partition = opts->slots_per_partition;
      if (CXLKV_OPT_HAS(opts, partition)) so.partition = opts->partition;
      if (CXLKV_OPT_HAS(opts, flags)) {
        if (opts->flags & ~CXLKV_PNM_STORE_F_READONLY)
          return set_error(-EINVAL, "cxlkv_pnm_store_open: unknown flags " + std::to_string(opts->flags));
        so.writer = !(opts->flags & CXLKV_PNM_STORE_F_READONLY);
      }
    }
    auto st = pnm::ContextStore::open(*pool->region, so);
    if (!st.ok()) return set_error(st.error());
    *out = new cxlkv_pnm_store{std::move(st.value())};
    return 0;
  });
}

void cxlkv_pnm_store_close(struct cxlkv_pnm_store* st) { delete st; }

int cxlkv_pnm_create(struct cxlkv_pnm_store* st, uint64_t request_id, const struct cxlkv_pnm_geometry* g,
                     struct cxlkv_pnm_context** out) {
  return guarded(__func__, [&]() -> int {
    if (!st || !g || !out) return set_error(-EINVAL, "cxlkv_pnm_create: store, geometry or out is NULL");
    *out = nullptr;
    if (!CXLKV_OPT_HAS(g, max_tokens)) return set_error(-EINVAL, "cxlkv_pnm_create: geometry size too small");
    if (g->dtype > CXLKV_PNM_DTYPE_F16)
      return set_error(-EINVAL, "cxlkv_pnm_create: unknown dtype " + std::to_string(g->dtype));
    pnm::Geometry geo{g->layers, g->kv_heads, g->head_dim, static_cast<pnm::Dtype>(g->dtype),
                      g->page_tokens ? g->page_tokens : 16u, g->max_tokens};
    if (CXLKV_OPT_HAS(g, group_pages)) {  // the digest kind: create() checks both
      geo.digest = static_cast<pnm::DigestKind>(g->digest);
      geo.group_pages = g->group_pages;
    } else {
      geo.group_pages = 1;  // a caller older than the digest kinds gets what it got then: one level
    }
    auto c = st->st->create(request_id, geo);
    if (!c.ok()) return set_error(c.error());
    *out = new cxlkv_pnm_context{std::move(c.value())};
    return 0;
  });
}

int cxlkv_pnm_find(struct cxlkv_pnm_store* st, uint64_t request_id, struct cxlkv_pnm_context** out) {
  return guarded(__func__, [&]() -> int {
    if (!st || !out) return set_error(-EINVAL, "cxlkv_pnm_find: store or out is NULL");
    *out = nullptr;
    auto c = st->st->find(request_id);
    if (!c.ok()) return set_error(c.error());
    *out = new cxlkv_pnm_context{std::move(c.value())};
    return 0;
  });
}

int cxlkv_pnm_destroy(struct cxlkv_pnm_store* st, uint64_t request_id) {
  return guarded(__func__, [&]() -> int {
    if (!st) return set_error(-EINVAL, "cxlkv_pnm_destroy: store is NULL");
    auto r = st->st->destroy(request_id);
    return r.ok() ? 0 : set_error(r.error());
  });
}

void cxlkv_pnm_context_close(struct cxlkv_pnm_context* ctx) { delete ctx; }

int cxlkv_pnm_geometry_of(const struct cxlkv_pnm_context* ctx, struct cxlkv_pnm_geometry* g) {
  return guarded(__func__, [&]() -> int {
    if (!ctx || !g) return set_error(-EINVAL, "cxlkv_pnm_geometry_of: context or geometry is NULL");
    if (!CXLKV_OPT_HAS(g, max_tokens)) return set_error(-EINVAL, "cxlkv_pnm_geometry_of: geometry size too small");
    const auto& x = ctx->ctx->geometry();
    g->layers = x.layers;
    g->kv_heads = x.kv_heads;
    g->head_dim = x.head_dim;
    g->dtype = static_cast<uint32_t>(x.dtype);
    g->page_tokens = x.page_tokens;
    g->reserved = 0;
    g->max_tokens = x.max_tokens;
    if (CXLKV_OPT_HAS(g, group_pages)) {
      g->digest = static_cast<uint32_t>(x.digest);
      g->group_pages = x.group_pages ? x.group_pages : 1;  // 1: one level (0 would ask for a choice)
    }
    return 0;
  });
}

int cxlkv_pnm_append(struct cxlkv_pnm_context* ctx, const void* k, const void* v, uint32_t ntokens) {
  return guarded(__func__, [&]() -> int {
    if (!ctx) return set_error(-EINVAL, "cxlkv_pnm_append: context is NULL");
    auto r = ctx->ctx->append(k, v, ntokens);
    return r.ok() ? 0 : set_error(r.error());
  });
}

int64_t cxlkv_pnm_refresh(struct cxlkv_pnm_context* ctx) {
  int64_t n = 0;
  int rc = guarded("cxlkv_pnm_refresh", [&]() -> int {
    if (!ctx) return set_error(-EINVAL, "cxlkv_pnm_refresh: context is NULL");
    auto r = ctx->ctx->refresh();
    if (!r.ok()) return set_error(r.error());
    n = static_cast<int64_t>(*r);
    return 0;
  });
  return rc < 0 ? rc : n;
}

int cxlkv_pnm_engine_create(uint32_t threads, int numa_node, struct cxlkv_pnm_engine** out) {
  return guarded(__func__, [&]() -> int {
    if (!out) return set_error(-EINVAL, "cxlkv_pnm_engine_create: out is NULL");
    if (threads == 0 || threads > 1024)
      return set_error(-EINVAL, "cxlkv_pnm_engine_create: " + std::to_string(threads) + " threads (1..1024)");
    const pnm::EngineOptions eo{threads, numa_node};
    if (auto ok = pnm::check_engine_options(eo); !ok)
      return set_error(ok.error().code(), "cxlkv_pnm_engine_create: " + ok.error().message());
    *out = new cxlkv_pnm_engine{std::make_unique<pnm::Engine>(eo)};
    return 0;
  });
}

void cxlkv_pnm_engine_destroy(struct cxlkv_pnm_engine* e) { delete e; }

int cxlkv_pnm_attend(struct cxlkv_pnm_context* ctx, struct cxlkv_pnm_engine* engine, const float* queries,
                     uint32_t q_heads, uint64_t ntokens, const struct cxlkv_pnm_step_opts* opts, float* out,
                     float* lse, struct cxlkv_pnm_step_stats* stats) {
  return guarded(__func__, [&]() -> int {
    if (!ctx || !queries || !out || !lse)
      return set_error(-EINVAL, "cxlkv_pnm_attend: context, queries, out or lse is NULL");
    if (stats && stats->size < sizeof(size_t))
      return set_error(-EINVAL, "cxlkv_pnm_attend: stats size field is " + std::to_string(stats->size));
    bool all = false;
    auto so = select_opts(opts, &all);
    if (!so.ok()) return set_error(-EINVAL, "cxlkv_pnm_attend: " + so.error().message());
    pnm::StepRequest rq;
    rq.ctx = ctx->ctx.get();
    rq.queries = std::span<const float>(queries, q_heads ? query_floats(*ctx->ctx, q_heads) : 0);
    rq.q_heads = q_heads;
    rq.ntokens = ntokens;
    rq.select = *so;
    rq.all_pages = all;
    pnm::Engine local({1, -1});
    auto r = (engine ? *engine->e : local).step(rq);
    if (!r.status.ok()) return set_error(r.status.error());
    std::memcpy(out, r.partial.out.data(), r.partial.out.size() * sizeof(float));
    std::memcpy(lse, r.partial.lse.data(), r.partial.lse.size() * sizeof(float));
    if (stats) {
      cxlkv_pnm_step_stats s{};
      s.size = stats->size;
      s.ntokens = r.ntokens;
      for (auto& v : r.selection.pages) s.selected_pages += v.size();
      s.select_ms = r.select_ms;
      s.attend_ms = r.attend_ms;
      s.digest_bytes = r.digest_bytes;
      s.kv_bytes = r.kv_bytes;
      s.link_bytes_near = r.link_bytes_near;
      s.link_bytes_selected = r.link_bytes_selected;
      s.link_bytes_all = r.link_bytes_all;
      std::memcpy(stats, &s, std::min(stats->size, sizeof s));
    }
    return 0;
  });
}

int cxlkv_pnm_select(struct cxlkv_pnm_context* ctx, const float* queries, uint32_t q_heads, uint64_t ntokens,
                     const struct cxlkv_pnm_step_opts* opts, uint32_t* pages, uint32_t max_per_head,
                     uint32_t* counts) {
  return guarded(__func__, [&]() -> int {
    if (!ctx || !queries || !pages || !counts)
      return set_error(-EINVAL, "cxlkv_pnm_select: context, queries, pages or counts is NULL");
    bool all = false;
    auto so = select_opts(opts, &all);
    if (!so.ok()) return set_error(-EINVAL, "cxlkv_pnm_select: " + so.error().message());
    if (ntokens == 0) {
      auto n = ctx->ctx->refresh();
      if (!n.ok()) return set_error(n.error());
      ntokens = *n;
    }
    auto sel = pnm::select_pages(*ctx->ctx, std::span<const float>(queries, q_heads ? query_floats(*ctx->ctx, q_heads) : 0),
                                 q_heads, ntokens, *so);
    if (!sel.ok()) return set_error(sel.error());
    for (size_t i = 0; i < sel->pages.size(); i++)
      if (sel->pages[i].size() > max_per_head)
        return set_error(-ENOSPC, "cxlkv_pnm_select: " + std::to_string(sel->pages[i].size()) +
                                      " pages selected for a head, room for " + std::to_string(max_per_head));
    for (size_t i = 0; i < sel->pages.size(); i++) {
      counts[i] = static_cast<uint32_t>(sel->pages[i].size());
      std::memcpy(pages + i * max_per_head, sel->pages[i].data(), sel->pages[i].size() * sizeof(uint32_t));
    }
    return 0;
  });
}

int cxlkv_pnm_merge(size_t n, uint32_t head_dim, const float* out_a, const float* lse_a, const float* out_b,
                    const float* lse_b, float* out, float* lse) {
  return guarded(__func__, [&]() -> int {
    if (!out_a || !lse_a || !out_b || !lse_b || !out || !lse)
      return set_error(-EINVAL, "cxlkv_pnm_merge: a NULL array");
    pnm::merge_rows(n, head_dim, out_a, lse_a, out_b, lse_b, out, lse);
    return 0;
  });
}

}  // extern "C"
