/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Near-memory long contexts (docs/near-memory.md): the on-pool layout of the "pnm"
 * carve (CXLKV_CARVE_PNM), made by the first process that asks for it.
 *
 *   carve offset 0     struct cxlkv_pnm_header (one line, written once)
 *   stats_off          nparts x struct cxlkv_pnm_part_stats (0: none, a carve
 *                      made before the stats existed)
 *   parts_off          nparts writer partitions of part_bytes each
 *
 * A partition has one writer process at a time (it holds an flock on a
 * node-local file, see libruntime/src/pnm/context_store.cpp), so every line
 * of a partition has one writer (rule 2) and needs no cross-host lock.
 * Readers (near-memory engines on any host) read any partition.
 *
 *   partition offset 0                 struct cxlkv_pnm_part (its allocator)
 *   64                                 slots_per_part x struct cxlkv_pnm_slot
 *   64 + slots_per_part * 128          heap: page tables, digests, pages
 *
 * A long context (one request) is a slot: a descriptor line (what it is:
 * geometry, where its page table and digests are) and a count line (how
 * many tokens are published).  Its page table maps page i to the pool
 * offset of page i; a page holds page_tokens tokens of K and V for every
 * layer and KV head, laid out [layer][K|V][kv_head][token][head_dim].  The
 * digests are per (layer, kv_head, page) the element-wise min and max of the
 * page's key vectors, one row per page laid out [layer][kv_head][page], in
 * the context's digest kind (cxlkv_pnm_ctx.digest): MINMAX rows are
 * [min|max][head_dim] in the KV element type (min and max of bf16 / fp16
 * values are exact); Q8 rows are struct cxlkv_pnm_q8_row.  A two-level
 * context (group_log2 > 0) has after its page rows one more row per
 * (layer, kv_head, group of 2^group_log2 pages), laid out
 * [layer][kv_head][group], the min and max over the group's pages
 * (docs/near-memory.md#digest-kinds).
 *
 * Publication (rule 3): the writer stores a batch of tokens (pages with
 * non-temporal copies, page-table entries and digests with stores +
 * clflush), fences, then stores the count line with one non-temporal
 * 64-byte store and fences.  A reader reads the count fresh (rule 4), then
 * invalidates and reads only what the count covers.  The digest of the last,
 * partly filled page may already include tokens past the count (the writer
 * widens it in place); min/max over more tokens is still an upper bound for
 * the published ones, which is all scoring needs.
 */
#ifndef _UAPI_CXLKV_PNM_H
#define _UAPI_CXLKV_PNM_H

#include <linux/types.h>

#include "uapi/cxlkv_pool.h"   /* CXLKV_STATIC_ASSERT, CXLKV_LINE_SIZE, cxlkv_hdr_checksum */

/* "CXLKVPN1" read as a little-endian u64. */
#define CXLKV_PNM_MAGIC               0x314e50564b4c5843ULL
/* Version 2: the count line carries a check (struct cxlkv_pnm_count).
 * Version 3: the descriptor names its digest kind and group size. */
#define CXLKV_PNM_VERSION             3u
#define CXLKV_PNM_DEFAULT_PAGE_TOKENS 16u
#define CXLKV_PNM_SLOT_SIZE           128u

/* Element type of K, V and the digests. */
enum cxlkv_pnm_dtype {
	CXLKV_PNM_F32  = 0,
	CXLKV_PNM_BF16 = 1,
	CXLKV_PNM_F16  = 2,
};
#define CXLKV_PNM_DTYPE_MAX CXLKV_PNM_F16

static inline unsigned cxlkv_pnm_dtype_size(__u32 dtype)
{
	return dtype == CXLKV_PNM_F32 ? 4u : 2u;
}

/* How a page's (or group's) digest row is stored. */
enum cxlkv_pnm_digest_kind {
	CXLKV_PNM_DIGEST_MINMAX = 0,  /* min and max in the KV element type */
	CXLKV_PNM_DIGEST_Q8     = 1,  /* struct cxlkv_pnm_q8_row */
};
#define CXLKV_PNM_DIGEST_MAX      CXLKV_PNM_DIGEST_Q8
#define CXLKV_PNM_GROUP_LOG2_MAX  10u

/* Head of a Q8 digest row, followed by __s8 min[head_dim], __s8
 * max[head_dim]: element d of every key the row covers lies in
 * [scale * min[d], scale * max[d]] (min rounded down, max up when written).
 * scale_bits: an IEEE-754 binary32, finite and > 0.  tokens: how many
 * tokens the row covers; a reader needs at least the published tokens of
 * its page (or group), so a stale row is told from a current one. */
struct cxlkv_pnm_q8_row {
	__u32 scale_bits;
	__u32 tokens;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_q8_row) == 8, "pnm q8 row head is 8 bytes");

struct cxlkv_pnm_header {
	__u64 magic;            /* CXLKV_PNM_MAGIC, stored last (the header's publish flag) */
	__u32 version;          /* CXLKV_PNM_VERSION */
	__u32 nparts;           /* writer partitions */
	__u64 parts_off;        /* first partition, from the carve start; 64-aligned */
	__u64 part_bytes;       /* multiple of 64 */
	__u32 slots_per_part;
	__u32 checksum;         /* low 32 bits of cxlkv_hdr_checksum over this line */
	__u64 stats_off;        /* per-partition statistics, from the carve start; 0: none */
	__u8  reserved[16];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_header) == 64, "pnm header is one line");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_pnm_header, checksum) == 36,
		    "pnm header checksum offset is part of the layout");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_pnm_header, stats_off) == 40,
		    "pnm header stats_off offset is part of the layout");

static inline __u32 cxlkv_pnm_header_checksum(const struct cxlkv_pnm_header *h)
{
	return (__u32)cxlkv_hdr_checksum(h, sizeof(*h),
					 __builtin_offsetof(struct cxlkv_pnm_header, checksum), 4);
}

/* First line of a partition: its heap allocator.  Written only by the
 * partition's writer; read by the writer (its own lines) at open. */
struct cxlkv_pnm_part {
	__u64 heap_next;        /* next free byte of the heap, from the partition start */
	__u64 heap_end;         /* end of the heap, from the partition start */
	__u32 live;             /* LIVE slots; the heap is reset when it drops to 0 */
	__u32 reserved0;
	__u8  reserved[40];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_part) == 64, "pnm partition header is one line");

enum cxlkv_pnm_slot_state {
	CXLKV_PNM_FREE = 0,
	CXLKV_PNM_LIVE = 1,
};

/* What a context is: written at create and destroy (store + clflush). */
struct cxlkv_pnm_ctx {
	__u64 request_id;
	__u32 state;            /* enum cxlkv_pnm_slot_state */
	__u32 generation;       /* grows at every create in this slot */
	__u16 layers;
	__u16 kv_heads;
	__u16 head_dim;
	__u16 page_tokens;
	__u32 dtype;            /* enum cxlkv_pnm_dtype */
	__u32 max_pages;        /* capacity of the page table and digests */
	__u64 page_table_off;   /* pool offset of __u64[max_pages] page offsets */
	__u64 digest_off;       /* pool offset of the digests (layout above) */
	__u64 page_bytes;       /* bytes of one page */
	__u32 check;            /* FNV-1a 32 of the line with check = 0 */
	__u8  digest;           /* enum cxlkv_pnm_digest_kind */
	__u8  group_log2;       /* 0: one level; else pages per group digest = 1 << group_log2 */
	__u16 reserved0;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_ctx) == 64, "pnm context descriptor is one line");

/* How many tokens are published: the context's publish flag, its own line
 * (rule 2: written at every append, one 64-byte store).  check lets a
 * reader tell a damaged or forged count from a published one. */
struct cxlkv_pnm_count {
	__u64 ntokens;
	__u32 generation;       /* equals cxlkv_pnm_ctx.generation of the same context */
	__u32 check;            /* FNV-1a 32 of the line with check = 0 */
	__u8  reserved[48];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_count) == 64, "pnm count is one line");

struct cxlkv_pnm_slot {
	struct cxlkv_pnm_ctx   ctx;
	struct cxlkv_pnm_count count;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_slot) == CXLKV_PNM_SLOT_SIZE, "pnm slot is two lines");

static inline __u32 cxlkv_pnm_ctx_check(const struct cxlkv_pnm_ctx *c)
{
	const unsigned char *p = (const unsigned char *)c;
	const unsigned long lo = __builtin_offsetof(struct cxlkv_pnm_ctx, check);
	__u32 h = 0x811c9dc5u;
	unsigned long i;

	for (i = 0; i < sizeof(*c); i++) {
		unsigned char ch = (i >= lo && i < lo + 4) ? 0 : p[i];

		h ^= ch;
		h *= 0x01000193u;
	}
	return h;
}

static inline __u32 cxlkv_pnm_count_check(const struct cxlkv_pnm_count *c)
{
	const unsigned char *p = (const unsigned char *)c;
	const unsigned long lo = __builtin_offsetof(struct cxlkv_pnm_count, check);
	__u32 h = 0x811c9dc5u;
	unsigned long i;

	for (i = 0; i < sizeof(*c); i++) {
		unsigned char ch = (i >= lo && i < lo + 4) ? 0 : p[i];

		h ^= ch;
		h *= 0x01000193u;
	}
	return h;
}

/* Bytes of one page: K and V of page_tokens tokens, every layer and head. */
static inline __u64 cxlkv_pnm_page_bytes(const struct cxlkv_pnm_ctx *c)
{
	return (__u64)c->layers * 2 * c->kv_heads * c->page_tokens * c->head_dim *
	       cxlkv_pnm_dtype_size(c->dtype);
}

/* Offset inside a page of the K (kv = 0) or V (kv = 1) rows of (layer, head). */
static inline __u64 cxlkv_pnm_page_rows_off(const struct cxlkv_pnm_ctx *c, __u32 layer, __u32 kv,
					    __u32 head)
{
	return (((__u64)layer * 2 + kv) * c->kv_heads + head) * c->page_tokens * c->head_dim *
	       cxlkv_pnm_dtype_size(c->dtype);
}

/* Bytes of one digest row (a page's or a group's) for one (layer, head). */
static inline __u64 cxlkv_pnm_digest_bytes(const struct cxlkv_pnm_ctx *c)
{
	if (c->digest == CXLKV_PNM_DIGEST_Q8)
		return sizeof(struct cxlkv_pnm_q8_row) + 2ull * c->head_dim;
	return 2ull * c->head_dim * cxlkv_pnm_dtype_size(c->dtype);
}

/* Group rows per (layer, head): 0 for a one-level context. */
static inline __u64 cxlkv_pnm_max_groups(const struct cxlkv_pnm_ctx *c)
{
	return c->group_log2 ? ((__u64)c->max_pages + (1ull << c->group_log2) - 1) >> c->group_log2 : 0;
}

/* Bytes of all digest rows of a context (page rows, then group rows). */
static inline __u64 cxlkv_pnm_digest_area_bytes(const struct cxlkv_pnm_ctx *c)
{
	return (__u64)c->layers * c->kv_heads * (c->max_pages + cxlkv_pnm_max_groups(c)) *
	       cxlkv_pnm_digest_bytes(c);
}

/* Pool offset of the digest of (layer, head, page). */
static inline __u64 cxlkv_pnm_digest_at(const struct cxlkv_pnm_ctx *c, __u32 layer, __u32 head,
					__u32 page)
{
	return c->digest_off +
	       (((__u64)layer * c->kv_heads + head) * c->max_pages + page) * cxlkv_pnm_digest_bytes(c);
}

/* Pool offset of the group digest of (layer, head, group) (group_log2 > 0). */
static inline __u64 cxlkv_pnm_group_digest_at(const struct cxlkv_pnm_ctx *c, __u32 layer, __u32 head,
					      __u32 group)
{
	return c->digest_off +
	       ((__u64)c->layers * c->kv_heads * c->max_pages +
		((__u64)layer * c->kv_heads + head) * cxlkv_pnm_max_groups(c) + group) *
		       cxlkv_pnm_digest_bytes(c);
}

/*
 * Statistics of a partition (the `pnm` metrics family, cxlkv/metrics.hpp):
 * what the partition's writer process did (digest builds) and what the
 * near-memory engines of that process did over any context (select and
 * attention steps, bytes read near memory, bytes that crossed or would have
 * crossed the link).  Written only by the partition's writer (rule 2), whole
 * lines with non-temporal stores and a fence; read fresh (rule 4) by
 * `cxlkvctl stats --prometheus`, cxlkvd's metrics endpoint and
 * cxlkv_stats_prometheus().  Totals since the carve was made: a new writer of
 * the partition continues from the stored values.
 */
enum cxlkv_pnm_counter {
	CXLKV_PNM_CTR_DIGEST_BUILDS = 0,   /* appends that built and published digests */
	CXLKV_PNM_CTR_GPU_DIGEST_BUILDS,   /* of which with digests computed on the GPU */
	CXLKV_PNM_CTR_APPENDED_TOKENS,
	CXLKV_PNM_CTR_DIGEST_WRITE_BYTES,  /* digest bytes written to the pool */
	CXLKV_PNM_CTR_SELECT_STEPS,        /* decode steps that scored and selected pages */
	CXLKV_PNM_CTR_SELECTED_PAGES,      /* summed over (layer, KV head) */
	CXLKV_PNM_CTR_ATTEND_STEPS,        /* decode steps that computed near-memory attention */
	CXLKV_PNM_CTR_STEP_ERRORS,         /* steps that failed */
	CXLKV_PNM_CTR_DIGEST_READ_BYTES,   /* digests read near memory */
	CXLKV_PNM_CTR_KV_READ_BYTES,       /* K and V read near memory */
	CXLKV_PNM_CTR_LINK_BYTES,          /* crossed the link: queries in, output + LSE out */
	CXLKV_PNM_CTR_LINK_SELECTED_BYTES, /* would have crossed recalling the selected pages */
	CXLKV_PNM_CTR_LINK_ALL_BYTES,      /* would have crossed recalling every page */
	CXLKV_PNM_CTR_HYBRID_STEPS,        /* hybrid steady-token steps */
	CXLKV_PNM_CTR_HYBRID_RECALL_BYTES, /* pool -> GPU recalls of hybrid steps */
	CXLKV_PNM_CTR_COUNT
};
#define CXLKV_PNM_CTR_SLOTS 16u        /* counters[] entries (2 lines) */
enum cxlkv_pnm_latency {
	CXLKV_PNM_LAT_DIGEST_BUILD = 0,    /* one append: pages, digests, publish */
	CXLKV_PNM_LAT_SELECT,              /* score + top-K of one step, all layers and heads */
	CXLKV_PNM_LAT_ATTEND,              /* near-memory attention of one step */
	CXLKV_PNM_LAT_COUNT
};
/* Bucket b counts [2^(b/2), 2^((b+1)/2)) ns, as the index's node histograms. */
#define CXLKV_PNM_LAT_BUCKETS 64u

struct cxlkv_pnm_part_stats {
	__u64 counters[CXLKV_PNM_CTR_SLOTS];                        /* enum cxlkv_pnm_counter; 2 lines */
	__u32 latency[CXLKV_PNM_LAT_COUNT][CXLKV_PNM_LAT_BUCKETS];  /* 12 lines */
	__u64 updated_ms;       /* writer's clock at its last store; 0: never written */
	__u32 pid;              /* writer process */
	__u32 reserved0;
	__u8  reserved[48];
};
CXLKV_STATIC_ASSERT(CXLKV_PNM_CTR_COUNT <= CXLKV_PNM_CTR_SLOTS, "pnm counters fit their two lines");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_pnm_part_stats, updated_ms) == 14 * 64,
		    "pnm stats trailer follows the histograms");
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_pnm_part_stats) == 15 * 64, "pnm partition stats are 15 lines");

#endif /* _UAPI_CXLKV_PNM_H */
