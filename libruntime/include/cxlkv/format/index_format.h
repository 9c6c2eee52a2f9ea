/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Layout of the index carve (CXLKV_CARVE_INDEX): the pool-wide prefix index
 * of KV blocks.  Owned by the kvstore layer (libruntime/src/index/).
 *
 *   +0             struct cxlkv_index_header   (one line, written at format)
 *   +64            struct cxlkv_index_config   (one line, operator-written)
 *   +stripe_off    struct cxlkv_index_stripe   [nstripes]
 *   +stats_off     struct cxlkv_index_node_stats [max_nodes]
 *   +entry_off     struct cxlkv_index_entry    [nslots]
 *   +ext_off       struct cxlkv_index_ext      [nslots]   (version 2)
 *
 * ext_off is not stored: it is cxlkv_index_ext_off(header), the first 4 KiB
 * boundary after the entries.
 * The table is fixed-size open addressing: slots are grouped into stripes of
 * stripe_slots consecutive slots; a key's home stripe is chosen by its hash
 * and it probes linearly, wrapping, inside that stripe only.  Every change
 * to a stripe's entries or its stripe line is made while holding the
 * stripe's global lock (id lock_base + stripe; two-tier lock of the sync
 * layer), so rule 7 holds.  Entries are written by many nodes, so a whole
 * entry line is always written with one publish_line() (movdir64b or NT
 * stores, rule 1), and carries a checksum so that a lock-free reader can tell
 * a torn line (NT stores of one line are not atomic as a whole) from a valid
 * one.
 */
#ifndef _UAPI_CXLKV_INDEX_H
#define _UAPI_CXLKV_INDEX_H

#include <linux/types.h>

#include "uapi/cxlkv_pool.h"   /* cxlkv_hdr_checksum */

#ifndef CXLKV_STATIC_ASSERT
#if defined(__cplusplus)
#define CXLKV_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define CXLKV_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#endif

/* "CXLKVIX1" */
#define CXLKV_INDEX_MAGIC        0x315849564b4c5843ULL
/* 4: header checksum (docs/integrity.md "Checked metadata"); 5: hot and cold eviction lists per stripe (docs/eviction.md "What is evicted first");
 * 6: a second line of remote tier counters in each node's stats (docs/remote.md "Counters"), 41 lines a node */
#define CXLKV_INDEX_VERSION      6u
#define CXLKV_INDEX_NO_SLOT      0xffffffffu
#define CXLKV_INDEX_STATS_LINES  41u

struct cxlkv_index_header {
	__u64 magic;             /* CXLKV_INDEX_MAGIC */
	__u32 version;           /* CXLKV_INDEX_VERSION */
	__u32 max_nodes;         /* equals superblock max_nodes */
	__u64 nslots;            /* nstripes * stripe_slots */
	__u32 stripe_slots;      /* power of two */
	__u32 nstripes;
	__u64 stripe_off;        /* from carve start */
	__u64 stats_off;
	__u64 entry_off;
	__u32 lock_base;         /* stripe s uses global lock id lock_base + s */
	__u32 checksum;          /* low 32 bits of cxlkv_hdr_checksum() of this line */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_header) == 64, "index header is one line");

static inline __u32 cxlkv_index_header_checksum(const struct cxlkv_index_header *h)
{
	return (__u32)cxlkv_hdr_checksum(h, sizeof(*h), __builtin_offsetof(struct cxlkv_index_header, checksum), 4);
}

/* Offset of the extension records (from carve start). */
static inline __u64 cxlkv_index_ext_off(const struct cxlkv_index_header *h)
{
	return (h->entry_off + h->nslots * 64 + 4095) / 4096 * 4096;
}

/*
 * Pool-wide policy, written by the operator (format, `cxlkvctl index config`)
 * while no worker runs; workers read it at attach (rule 4).
 * Capacity limits are pool-wide: the sum of the stripes' used_blocks /
 * used_bytes (read in one sweep) is held to them, and eviction takes the
 * pool-wide least recently used evictable leaf (see struct cxlkv_index_ext).
 */
#define CXLKV_INDEX_MAX_DEVICES  8u
struct cxlkv_index_config {
	__u64 max_blocks;        /* 0: limited by slots only */
	__u64 max_bytes;         /* 0: limited by the allocator only */
	__u64 epoch_ms;          /* CLOCK_REALTIME ms at format: origin of lru_ms */
	__u32 interleave_stripe; /* bytes per stripe of an interleaved block */
	__u8  ndevices;          /* devices of the interleave set (1: none) */
	__u8  reserved0[3];
	__u8  weights[CXLKV_INDEX_MAX_DEVICES];  /* relative stripe share per device */
	__u8  reserved1[24];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_config) == 64, "index config is one line");

/*
 * Per-stripe accounting and the head of the stripe's eviction list, changed
 * only under the stripe's lock and written whole with publish_line (several
 * nodes write it over time: rule 1).  A lock holder sets list_dirty (and
 * publishes the line) before its first change to the stripe's list or
 * counters and clears it with its last write before unlocking: a holder that
 * dies in between leaves list_dirty set, and the next holder rebuilds the
 * list and the counters from the entries (which are always self-consistent).
 */
struct cxlkv_index_stripe {
	__u64 used_blocks;       /* WRITING + READY + EVICTING entries in memory (not on the SSD tier) */
	__u64 used_bytes;        /* their payload bytes */
	__u64 evictions;
	__u32 reclaims;          /* WRITING entries of dead writers removed */
	__u32 tombstones;
	/* Two eviction lists of READY memory leaves (version 5): the cold list
	 * holds blocks not known to be reused, the hot list blocks read again
	 * by another request or cached again after an eviction
	 * (CXLKV_EXT_REUSED).  Cold tails go first; a hot tail only once it is
	 * several times older than the oldest cold tail (index_evict.cpp). */
	__u32 lru_head;          /* cold list: slot + 1 of the most recently used leaf (0: list empty) */
	__u32 lru_tail;          /* cold list: slot + 1 of the least recently used one */
	__u32 tail_ms;           /* linked_ms of lru_tail */
	__u32 hot_head;          /* hot list: slot + 1 of its most recently used leaf (0: list empty) */
	__u32 hot_tail;          /* hot list: slot + 1 of its least recently used leaf */
	__u32 hot_tail_ms;       /* linked_ms of hot_tail */
	__u16 list_dirty;        /* 1 while a holder changes the lists / counters (crash repair) */
	__u16 lease_dead;        /* leases ended by their consumer node's death */
	__u32 lease_expiries;    /* leases ended by their ttl or their consumer node's death */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_stripe) == 64, "index stripe is one line");

enum cxlkv_index_state {
	CXLKV_ENTRY_EMPTY     = 0,	/* never used: ends a probe */
	CXLKV_ENTRY_WRITING   = 1,	/* reserved; payload being written by owner_node */
	CXLKV_ENTRY_READY     = 2,	/* published: payload complete and flushed */
	CXLKV_ENTRY_EVICTING  = 3,	/* being removed; payload may be reused soon */
	CXLKV_ENTRY_TOMBSTONE = 4,	/* removed: a probe continues past it; while
					 * parent_slot still names a slot, the
					 * parent's children count is yet to drop
					 * (a pending drop: counted as a child, the
					 * slot not reused) */
};

enum cxlkv_tier {
	CXLKV_TIER_MEM = 0,		/* loc_off: byte offset in the device's kv carve */
	CXLKV_TIER_SSD = 1,		/* loc_off: LBA (512 B sectors) on SSD device loc_dev */
};
/* loc_dev value: payload striped over the interleave set (config line) at
 * the same offset of every device's kv carve. */
#define CXLKV_LOC_DEV_INTERLEAVED 0xffu

/*
 * One index entry = one 64 B line.  `check` is cxlkv_index_entry_check()
 * over bytes 0..59; an all-zero line is a valid EMPTY entry.  `version`
 * grows on every change so a reader can tell two READY images apart.
 */
struct cxlkv_index_entry {
	__u64 key_lo;            /*  0 */
	__u64 key_hi;            /*  8 */
	__u64 loc_off;           /* 16 offset (MEM) or LBA (SSD) */
	__u32 loc_len;           /* 24 payload bytes */
	__u8  loc_dev;           /* 28 device index or CXLKV_LOC_DEV_INTERLEAVED */
	__u8  loc_tier;          /* 29 enum cxlkv_tier */
	__u8  state;             /* 30 enum cxlkv_index_state */
	__u8  owner_node;        /* 31 node that reserved it (WRITING) */
	__u32 parent_slot;       /* 32 slot of the previous block, or CXLKV_INDEX_NO_SLOT */
	__u32 children;          /* 36 live children + pending drops naming it (prefix-closed eviction) */
	__u64 pin_mask;          /* 40 bit n: node n holds pins (crash-safe: dead nodes' bits ignored) */
	__u32 lru_ms;            /* 48 last pin/publish, ms since config.epoch_ms */
	__u32 owner_inc;         /* 52 low 32 bits of the owner's incarnation */
	__u32 version;           /* 56 */
	__u32 check;             /* 60 */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_entry) == 64, "index entry is one line");

/*
 * Extension record of an entry (two per line, at cxlkv_index_ext_off + 32 *
 * slot), written only under the stripe's lock with non-temporal stores (the
 * line has many writers over time and two records: rule 1) and read under
 * that lock after an invalidation (rule 4).
 *
 * Eviction lists: every READY memory-tier leaf (children == 0) of a stripe is
 * on one of the stripe's two doubly linked lists (cold or hot), most recently
 * used at the head.  A block is linked at publish and when its last child goes, unlinked when it
 * gains a child or leaves; a pin does not move it (it stamps the entry's
 * lru_ms): the evictor finds lru_ms > linked_ms at the tail and moves it to
 * the head instead (lazy promotion, CLOCK-like), so a victim costs O(1)
 * expected entry reads.
 *
 * Handoff lease: a published block leased for a consumer is not evicted until
 * lease_count releases, lease_expiry_ms passes, or lease_node (when not
 * CXLKV_NODE_ANY) is dead.
 */
#define CXLKV_LEASE_NODE_ANY 0xffu
/* ext.linked bits.  REUSED (sticky): the block was read by a request other
 * than the one that produced it (a hit), gained a child from a later request,
 * had a reused child, or came back after an eviction (its key was found in a
 * ghost tombstone when it was reserved again).  HOT: it is on its stripe's
 * hot list (set by link from REUSED, kept until unlink, so the list it is on
 * is always known). */
#define CXLKV_EXT_LINKED 0x01u   /* on one of the stripe's lists */
#define CXLKV_EXT_REUSED 0x02u
/* HANDOFF: the block's lease was taken while the block was unused since it
 * was linked (a block just published for its consumer): the consumer's reads
 * are the handoff, not a reuse, so when the last lease ends the entry's
 * lru_ms goes back to the lease's start and the block counts as unused
 * (docs/eviction.md "What is evicted first"; reads by the request that produced a block do not make it look
 * popular). */
#define CXLKV_EXT_HANDOFF 0x04u
#define CXLKV_EXT_HOT     0x08u
/* LEASED (sticky): the block has been leased; a lease for another consumer
 * after the first one ended marks it REUSED. */
#define CXLKV_EXT_LEASED  0x10u
struct cxlkv_index_ext {
	__u32 lru_prev;          /* towards the head (more recent), or NO_SLOT */
	__u32 lru_next;          /* towards the tail (older), or NO_SLOT */
	__u32 linked_ms;         /* entry lru_ms when (re)linked */
	__u8  linked;            /* CXLKV_EXT_* bits */
	__u8  lease_node;        /* consumer node or CXLKV_LEASE_NODE_ANY */
	__u16 lease_count;       /* live leases (0: none) */
	__u64 lease_consumer;    /* first consumer id (display, release check) */
	__u32 lease_start_ms;    /* ms since config.epoch_ms */
	__u32 lease_expiry_ms;   /* ms since config.epoch_ms */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_ext) == 32, "two index ext records per line");

/*
 * Per-node statistics, written only by that node (rule 2) with plain stores
 * and a flush; the CLI sums them.  Latency histograms: bucket b counts
 * operations of [2^(b/2), 2^((b+1)/2)) ns, two buckets per octave.
 */
enum cxlkv_index_counter {
	CXLKV_CTR_LOOKUPS = 0,
	CXLKV_CTR_HIT_BLOCKS,
	CXLKV_CTR_MISS_BLOCKS,
	CXLKV_CTR_RESERVES,
	CXLKV_CTR_RESERVE_EXISTS,
	CXLKV_CTR_PUBLISHES,
	CXLKV_CTR_ABORTS,
	CXLKV_CTR_FETCHES,
	CXLKV_CTR_PINS,
	CXLKV_CTR_PIN_MISSES,
	CXLKV_CTR_EVICTIONS,
	CXLKV_CTR_RECLAIMS,
	CXLKV_CTR_BYTES_IN,
	CXLKV_CTR_BYTES_OUT,
	CXLKV_CTR_NOSPC,
	CXLKV_CTR_ERRORS,
	CXLKV_CTR_COUNT
};
/* One histogram per step of the write and read paths (a batch call adds
 * its time divided by its blocks once per block) and one per whole request:
 * PUT = reserve + write + publish of a put_chain call, GET = pin + fetch +
 * unpin of a get_many call. */
enum cxlkv_index_latency {
	CXLKV_LAT_LOOKUP = 0,
	CXLKV_LAT_RESERVE,
	CXLKV_LAT_WRITE,
	CXLKV_LAT_PUBLISH,
	CXLKV_LAT_PIN,
	CXLKV_LAT_FETCH,
	CXLKV_LAT_UNPIN,
	CXLKV_LAT_PUT,
	CXLKV_LAT_GET,
	CXLKV_LAT_COUNT
};
#define CXLKV_LAT_BUCKETS 64u
/* The node's SSD tier (its metrics, docs/operations.md "Metrics"): what its SSD payload tier did. */
enum cxlkv_index_ssd_counter {
	CXLKV_SSD_DEMOTED = 0,		/* blocks written to the SSD tier (demotions) */
	CXLKV_SSD_DEMOTED_BYTES,
	CXLKV_SSD_READS,		/* blocks read from it (SSD hits) */
	CXLKV_SSD_READ_BYTES,
	CXLKV_SSD_READ_FAILURES,	/* reads that failed or were refused by header / checksum */
	CXLKV_SSD_FULL,			/* demotions refused for lack of SSD space */
	CXLKV_SSD_COUNT
};
/* The node's remote tier (docs/remote.md "Counters"): what a remote tier
 * below the pool (the Python package's, over Mooncake Store) did for this
 * node, added through cxlkv_kv_remote_count(). */
enum cxlkv_index_remote_counter {
	CXLKV_REMOTE_HIT_BLOCKS = 0,	/* blocks fetched from the remote tier into the pool (remote hits) */
	CXLKV_REMOTE_HIT_BYTES,
	CXLKV_REMOTE_MISS_BLOCKS,	/* blocks asked of it that it did not hold */
	CXLKV_REMOTE_FETCH_FAILURES,	/* lookup-path calls that failed or ran late, blocks refused by their header */
	CXLKV_REMOTE_DEGRADED,		/* times the tier went local-only */
	CXLKV_REMOTE_PUSHED_BLOCKS,	/* published blocks put into the remote tier */
	CXLKV_REMOTE_PUSHED_BYTES,
	CXLKV_REMOTE_PUSH_DROPPED_BLOCKS, /* published blocks not pushed: the sum of the four reasons below */
	/* Second line (version 6). */
	CXLKV_REMOTE_PUSH_EVICTED_BLOCKS, /* not pushed: gone from the pool before the push read it */
	CXLKV_REMOTE_PUSH_STORE_FULL_BLOCKS, /* not pushed: refused by a full store, twice */
	CXLKV_REMOTE_PUSH_QUEUE_FULL_BLOCKS, /* not pushed: the push queue was full */
	CXLKV_REMOTE_PUSH_FAILED_BLOCKS, /* not pushed: the tier degraded, a failed put or read, or closing */
	CXLKV_REMOTE_PUSH_SKIPPED_BLOCKS, /* kept back at their publish by the push policy (a choice, not a drop) */
	CXLKV_REMOTE_PUSH_PRESENT_BLOCKS, /* published blocks the store held already (not sent again) */
	CXLKV_REMOTE_TIMEOUTS,		/* remote calls that ran past the tier's timeout */
	CXLKV_REMOTE_RECOVERED,		/* times the tier came back after being degraded */
	CXLKV_REMOTE_COUNT
};

struct cxlkv_index_node_stats {
	__u64 counters[CXLKV_CTR_COUNT];                    /* 2 lines */
	__u32 latency[CXLKV_LAT_COUNT][CXLKV_LAT_BUCKETS];  /* 36 lines */
	__u64 updated_ms;                                   /* writer's clock, for display */
	__u32 pid;
	__u32 reserved0;
	__u64 ssd[CXLKV_SSD_COUNT];                         /* enum cxlkv_index_ssd_counter; 0 without an SSD tier */
	/* enum cxlkv_index_remote_counter; 0 without a remote tier: the last
	 * two lines. */
	__u64 remote[CXLKV_REMOTE_COUNT];
};
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_index_node_stats, ssd) == 38 * 64 + 16,
		    "node SSD counters follow updated_ms and pid");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_index_node_stats, remote) == 39 * 64 &&
		    CXLKV_REMOTE_COUNT * 8 == 2 * 64, "node remote tier counters are the stats' last two lines, whole");
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_index_node_stats) == CXLKV_INDEX_STATS_LINES * 64,
		    "node stats are 41 lines");

/* FNV-1a 32 over bytes 0..59 of an entry, never 0 for a non-empty line. */
static inline __u32 cxlkv_index_entry_check(const struct cxlkv_index_entry *e)
{
	const unsigned char *p = (const unsigned char *)e;
	__u32 h = 0x811c9dc5u;
	unsigned int i;

	for (i = 0; i < 60; i++) {
		h ^= p[i];
		h *= 0x01000193u;
	}
	return h ? h : 1;
}

#endif /* _UAPI_CXLKV_INDEX_H */
