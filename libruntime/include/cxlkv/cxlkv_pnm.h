/* SPDX-License-Identifier: MIT */
/*
 * cxlkv near-memory long contexts (docs/near-memory.md), C API.  Same conventions as
 * cxlkv.h: 0 (or a count) on success, a negative errno on failure with the
 * message in cxlkv_last_error(); options structs carry their own size.
 *
 *   struct cxlkv_pnm_store *st;       the pool's "pnm" carve (made on first use)
 *   cxlkv_pnm_store_open(pool, &opts, &st);
 *   struct cxlkv_pnm_context *ctx;    one request's long context
 *   cxlkv_pnm_create(st, request_id, &geometry, &ctx);    writer
 *   cxlkv_pnm_append(ctx, k, v, ntokens);                 K, V: [layers][kv_heads][ntokens][head_dim]
 *   cxlkv_pnm_find(st, request_id, &ctx);                 reader (any host)
 *   cxlkv_pnm_attend(ctx, engine, q, q_heads, 0, &step, out, lse, &stats);
 *                                      score pages, keep the top token_budget, attention:
 *                                      out [layers][q_heads][head_dim], lse [layers][q_heads]
 *   cxlkv_pnm_merge(...)               join two partials (GPU part + near-memory part)
 */
#ifndef CXLKV_PNM_H
#define CXLKV_PNM_H

#include <stddef.h>
#include <stdint.h>

#include "cxlkv/cxlkv.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cxlkv_pnm_store;
struct cxlkv_pnm_context;
struct cxlkv_pnm_engine;

/* Element types of K, V and digests (= enum cxlkv_pnm_dtype, cxlkv/format/pnm_format.h). */
#define CXLKV_PNM_DTYPE_F32  0u
#define CXLKV_PNM_DTYPE_BF16 1u
#define CXLKV_PNM_DTYPE_F16  2u

#define CXLKV_PNM_STORE_F_READONLY (1u << 0) /* a reader: no partition lock, no create / destroy */

struct cxlkv_pnm_store_opts {
	size_t   size;                /* sizeof(struct cxlkv_pnm_store_opts) */
	uint64_t carve_bytes;         /* when the carve is made here; 0: 64 MiB */
	uint32_t partitions;          /* when made here; 0: 4 */
	uint32_t slots_per_partition; /* when made here; 0: 64 */
	uint32_t partition;           /* the partition this process writes */
	uint32_t flags;               /* CXLKV_PNM_STORE_F_* */
};

struct cxlkv_pnm_geometry {
	size_t   size;                /* sizeof(struct cxlkv_pnm_geometry) */
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype;               /* CXLKV_PNM_DTYPE_* */
	uint32_t page_tokens;         /* 0: 16 */
	uint32_t reserved;
	uint64_t max_tokens;          /* capacity */
	/* Digest kind (docs/near-memory.md#digest-kinds); a caller whose size
	 * ends before these gets minmax, one level. */
	uint32_t digest;              /* CXLKV_PNM_DIGEST_MINMAX_ROWS | CXLKV_PNM_DIGEST_Q8_ROWS */
	uint32_t group_pages;         /* pages per group digest (a power of two); 1: one level;
	                               * 0: two levels of 16 from 4096 pages of capacity, else one;
	                               * cxlkv_pnm_geometry_of gives the size made (1: one level) */
};

#define CXLKV_PNM_DIGEST_MINMAX_ROWS 0u /* min and max in the KV element type */
#define CXLKV_PNM_DIGEST_Q8_ROWS     1u /* int8 min and max, a scale per row, rounded outward */

#define CXLKV_PNM_SCORE_UPPER_BOUND 0u /* sum_d max(q_d min_d, q_d max_d) */
#define CXLKV_PNM_SCORE_COARSE      1u /* max(q.min, q.max) */
#define CXLKV_PNM_STEP_F_ALL_PAGES  (1u << 0) /* attention over every page (no selection) */

struct cxlkv_pnm_step_opts {
	size_t   size;                /* sizeof(struct cxlkv_pnm_step_opts) */
	uint64_t token_budget;        /* 0: 2048 */
	uint32_t sink_pages;          /* first pages always kept */
	uint32_t local_pages;         /* most recent pages always kept */
	uint32_t score_mode;          /* CXLKV_PNM_SCORE_* */
	uint32_t flags;               /* CXLKV_PNM_STEP_F_* */
	uint32_t refine_pages;        /* two-level contexts: page digests read after the groups (0: default) */
	uint32_t reserved;
};

struct cxlkv_pnm_step_stats {
	size_t   size;                /* sizeof(struct cxlkv_pnm_step_stats), set by the caller */
	uint64_t ntokens;             /* tokens the step covered */
	uint64_t selected_pages;      /* summed over (layer, KV head) */
	double   select_ms;
	double   attend_ms;
	uint64_t digest_bytes;        /* pool bytes of digests read */
	uint64_t kv_bytes;            /* pool bytes of K and V read */
	uint64_t link_bytes_near;     /* to / from the GPU with near-memory attention */
	uint64_t link_bytes_selected; /* ... recalling the selected pages instead */
	uint64_t link_bytes_all;      /* ... recalling every page */
};

int cxlkv_pnm_store_open(struct cxlkv_pool *pool, const struct cxlkv_pnm_store_opts *opts,
			 struct cxlkv_pnm_store **out);
void cxlkv_pnm_store_close(struct cxlkv_pnm_store *st);

int cxlkv_pnm_create(struct cxlkv_pnm_store *st, uint64_t request_id, const struct cxlkv_pnm_geometry *g,
		     struct cxlkv_pnm_context **out);
int cxlkv_pnm_find(struct cxlkv_pnm_store *st, uint64_t request_id, struct cxlkv_pnm_context **out);
int cxlkv_pnm_destroy(struct cxlkv_pnm_store *st, uint64_t request_id);
/* Closes the handle only (the context stays in the pool). */
void cxlkv_pnm_context_close(struct cxlkv_pnm_context *ctx);
/* The context's geometry (g->size set by the caller). */
int cxlkv_pnm_geometry_of(const struct cxlkv_pnm_context *ctx, struct cxlkv_pnm_geometry *g);

/* Writer: append ntokens tokens (published when it returns). */
int cxlkv_pnm_append(struct cxlkv_pnm_context *ctx, const void *k, const void *v, uint32_t ntokens);
/* Reader: the published token count (>= 0), or -errno (-ESTALE: destroyed). */
int64_t cxlkv_pnm_refresh(struct cxlkv_pnm_context *ctx);

/* Near-memory engines: a thread pool bound to numa_node's CPUs (-1: none).
 * -EINVAL for a NUMA node this host lacks or one without CPUs. */
int cxlkv_pnm_engine_create(uint32_t threads, int numa_node, struct cxlkv_pnm_engine **out);
void cxlkv_pnm_engine_destroy(struct cxlkv_pnm_engine *e);

/* One decode step: select pages (unless CXLKV_PNM_STEP_F_ALL_PAGES) and
 * compute attention over them.  queries [layers][q_heads][head_dim];
 * ntokens 0: the published count.  engine NULL: the calling thread. */
int cxlkv_pnm_attend(struct cxlkv_pnm_context *ctx, struct cxlkv_pnm_engine *engine, const float *queries,
		     uint32_t q_heads, uint64_t ntokens, const struct cxlkv_pnm_step_opts *opts, float *out,
		     float *lse, struct cxlkv_pnm_step_stats *stats);
/* The selection alone: pages[(layer * kv_heads + head) * max_per_head + i],
 * counts[layer * kv_heads + head].  -ENOSPC when a list is longer than max_per_head. */
int cxlkv_pnm_select(struct cxlkv_pnm_context *ctx, const float *queries, uint32_t q_heads, uint64_t ntokens,
		     const struct cxlkv_pnm_step_opts *opts, uint32_t *pages, uint32_t max_per_head,
		     uint32_t *counts);
/* out, lse = the merge of partials a and b over disjoint token sets
 * (n rows of head_dim; out may alias out_a). */
int cxlkv_pnm_merge(size_t n, uint32_t head_dim, const float *out_a, const float *lse_a, const float *out_b,
		    const float *lse_b, float *out, float *lse);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_PNM_H */
