/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Layout of the allocator carve (CXLKV_CARVE_ALLOC): the global chunk
 * allocator over the kv carve, remote-free bitmaps, and the object store.
 *
 * The kv carve is cut into `nchunks` chunks of `chunk_size` bytes (a power
 * of two, 64 KiB .. 1 GiB, default 2 MiB).  Chunk i starts at pool offset
 * arena_off + i * chunk_size.  A chunk is FREE (in the global bitmap) or
 * owned by one node: either a SMALL chunk cut into blocks of one size class
 * by that node's heap (free lists in node-local memory), or part of a LARGE
 * run of whole chunks handed out by one allocation.
 *
 *   +0                   struct cxlkv_alloc_header (two lines, written at format)
 *   +bitmap_off          __u64 words, bit i set = chunk i allocated   [lock ALLOC]
 *   +chunk_table_off     struct cxlkv_chunk_desc [nchunks]           [lock ALLOC]
 *   +inbox_off           struct cxlkv_remote_inbox [max_nodes]       [lock REMOTE_FREE+n]
 *   +pending_off         per node: __u64 words, bit i = chunk i has remote frees
 *                        (stride pending_stride bytes)               [lock REMOTE_FREE+n]
 *   +remote_bits_off     per chunk: __u64 words, bit b = block b was freed by
 *                        another node (stride remote_bits_stride)    [lock REMOTE_FREE+owner]
 *   +objstore_off        struct cxlkv_objstore_header + table (cxlkv/format/objstore_format.h)
 *   +state_off           struct cxlkv_alloc_state (one line)            [lock ALLOC]
 *                        then struct cxlkv_quarantine [nchunks]        [lock ALLOC]
 *                        then struct cxlkv_block_owner [nchunks * chunk_size /
 *                        CXLKV_OWNER_GRANULE] (cxlkv_alloc_owner_off)  [the block's holder]
 *
 * Offsets are relative to the start of the alloc carve; every region starts
 * on a 64 B line.  All of these lines are written by several nodes over
 * time (whichever holds the lock), so they are written only with 8-byte
 * non-temporal stores (rule 1) and read after invalidation (rule 4), while
 * holding the lock named above (rule 7).
 *
 * Remote free: a node frees a block of a chunk owned by another node by
 * setting the block's bit in the chunk's remote bitmap and the chunk's bit
 * in the owner's pending bitmap, and bumping the owner's inbox count, all
 * under the owner's REMOTE_FREE lock.  The owner drains its inbox into its
 * node-local free lists when a size class runs dry.  Large runs are freed
 * from any node straight back to the global bitmap under ALLOC.
 *
 * Checked metadata (docs/integrity.md "Checked metadata"): the header carries a checksum (written once
 * at format); the state line carries the checksum of the chunk bitmap,
 * updated with every bitmap word under ALLOC, so a zeroed or damaged bitmap
 * is refused instead of handing out published space.
 *
 * Quarantine (docs/integrity.md "Quarantine"): a LARGE run taken from a node declared dead (its
 * reservation reclaimed) is not freed but becomes a QUARANTINE run: bitmap
 * bits stay set, the head's descriptor names the node, and the head's
 * struct cxlkv_quarantine says when it may be released.  A paused process
 * of that node may still finish a copy into the run when it resumes; the
 * run is released only once that node is seen alive again and has beaten
 * twice since (it resumed, and its next checks fail with -ESTALE), or after
 * until_ns.  SMALL blocks go back to their owner node (the reserving node)
 * by remote free and are reused only by that node, so they need none.
 *
 * Block owners (docs/integrity.md "Block owners: overlapping entries"; layout version 3): one struct cxlkv_block_owner
 * per CXLKV_OWNER_GRANULE bytes of the arena, at the granule where a block
 * starts: the index slot (+ 1) of the entry that holds the block and the
 * entry's payload length, written by the reserving node right after the
 * allocation and before the entry that names the block is written (rule 3:
 * the entry's publication covers it), cleared before the block is freed.
 * A pin checks that the record of its entry's start names that entry, so an
 * entry whose location overlaps another entry's block (damaged or forged)
 * is refused with one line read, without a scan.  Only blocks whose
 * allocation is at least a granule have a record (smaller blocks share
 * granules); the records of one line belong to different blocks, possibly
 * of different nodes, so each is written with one 8-byte NT store (rule 1)
 * and read after invalidation (rule 4).  Each record has one writer at a
 * time: the node holding its block.
 */
#ifndef _UAPI_CXLKV_ALLOC_H
#define _UAPI_CXLKV_ALLOC_H

#include <linux/types.h>

#include "uapi/cxlkv_pool.h"   /* CXLKV_STATIC_ASSERT, CXLKV_LINE_SIZE */

/* "CXLKVAL1" */
#define CXLKV_ALLOC_MAGIC         0x314c41564b4c5843ULL
/* 2: header checksum, state line (bitmap checksum), quarantine table;
 * 3: block owner records after the quarantine table */
#define CXLKV_ALLOC_VERSION       3u
#define CXLKV_DEFAULT_CHUNK_SIZE  (2ULL << 20)
#define CXLKV_MIN_CHUNK_SIZE      (64ULL << 10)
#define CXLKV_MAX_CHUNK_SIZE      (1ULL << 30)
#define CXLKV_ALLOC_MIN_BLOCK     64u      /* cache-line granularity */

struct cxlkv_alloc_header {
	__u64 magic;             /*   0 CXLKV_ALLOC_MAGIC */
	__u32 version;           /*   8 CXLKV_ALLOC_VERSION */
	__u32 max_nodes;         /*  12 equals superblock max_nodes */
	__u64 chunk_size;        /*  16 bytes, power of two */
	__u64 arena_off;         /*  24 pool offset of chunk 0 (start of the kv carve) */
	__u64 nchunks;           /*  32 */
	__u64 bitmap_off;        /*  40 */
	__u64 chunk_table_off;   /*  48 */
	__u64 inbox_off;         /*  56 */
	__u64 pending_off;       /*  64 */
	__u64 pending_stride;    /*  72 bytes per node, multiple of 64 */
	__u64 remote_bits_off;   /*  80 */
	__u64 remote_bits_stride;/*  88 bytes per chunk: chunk_size / 64 bits, multiple of 64 */
	__u64 objstore_off;      /*  96 */
	__u64 objstore_bytes;    /* 104 */
	__u64 state_off;         /* 112 struct cxlkv_alloc_state, then cxlkv_quarantine[nchunks] */
	__u64 checksum;          /* 120 cxlkv_hdr_checksum() of the header */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_alloc_header) == 128, "alloc header is two lines");

enum cxlkv_chunk_kind {
	CXLKV_CHUNK_FREE       = 0,
	CXLKV_CHUNK_SMALL      = 1,	/* blocks of one size class, owned by `owner` */
	CXLKV_CHUNK_LARGE_HEAD = 2,	/* first chunk of a run of `run` chunks */
	CXLKV_CHUNK_LARGE_TAIL = 3,	/* later chunk of a run; `run` = distance to the head */
	CXLKV_CHUNK_QUARANTINE = 4,	/* head of a LARGE run taken from dead node `owner`; `run` chunks */
};
#define CXLKV_CHUNK_NO_OWNER    0xffffu

/* One 8-byte word per chunk, stored with one 8-byte NT store. */
struct cxlkv_chunk_desc {
	__u16 owner;             /* node, or CXLKV_CHUNK_NO_OWNER */
	__u8  kind;              /* enum cxlkv_chunk_kind */
	__u8  size_class;        /* SMALL: index into the runtime's size-class table */
	__u32 run;               /* LARGE_HEAD: chunks in the run; LARGE_TAIL: offset to head */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_chunk_desc) == 8, "chunk desc is one word");

/* Per owner node: how many remote frees wait to be drained (a cheap check). */
struct cxlkv_remote_inbox {
	__u64 pending;           /* remote frees posted since the last drain, plus those
	                            it drained into chunks it has yet to give back */
	__u64 posted;            /* total remote frees ever posted (statistics) */
	__u8  reserved[48];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_remote_inbox) == 64, "inbox is one line");

/* Allocator state: one line, written under ALLOC with NT stores (rule 1). */
struct cxlkv_alloc_state {
	__u64 bitmap_sum;        /* XOR of cxlkv_bitmap_word_sum(i, word i) over the chunk bitmap */
	__u64 quarantined;       /* chunks in QUARANTINE runs */
	__u64 releases;          /* quarantine runs released (statistics) */
	__u8  reserved[40];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_alloc_state) == 64, "alloc state is one line");

/* Per chunk; meaningful at a QUARANTINE head. */
struct cxlkv_quarantine {
	__u64 until_ns;          /* CLOCK_REALTIME: released after this whatever else */
	__u64 heartbeat;         /* the node's heartbeat counter when quarantined */
	__u32 owner_inc;         /* low 32 bits of the reserving incarnation */
	__u32 reserved0;
	__u64 reserved1;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_quarantine) == 32, "quarantine record is half a line");

/* Bytes of arena per block owner record (a block of at least this many bytes has one). */
#define CXLKV_OWNER_GRANULE       1024u

/* Who holds a block (at the record of the granule where the block starts). */
struct cxlkv_block_owner {
	__u32 slot_plus1;        /* index slot + 1 of the entry naming the block; 0: none */
	__u32 length;            /* that entry's payload length in bytes */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_block_owner) == 8, "block owner record is one word");

/* Offset (in the alloc carve) of the owner records: after the quarantine table. */
static inline __u64 cxlkv_alloc_owner_off(const struct cxlkv_alloc_header *h)
{
	return h->state_off + sizeof(struct cxlkv_alloc_state) +
	       (h->nchunks * sizeof(struct cxlkv_quarantine) + CXLKV_LINE_SIZE - 1) / CXLKV_LINE_SIZE * CXLKV_LINE_SIZE;
}

/* Bytes of owner records for the arena. */
static inline __u64 cxlkv_alloc_owner_bytes(const struct cxlkv_alloc_header *h)
{
	__u64 n = h->nchunks * (h->chunk_size / CXLKV_OWNER_GRANULE) * sizeof(struct cxlkv_block_owner);

	return (n + CXLKV_LINE_SIZE - 1) / CXLKV_LINE_SIZE * CXLKV_LINE_SIZE;
}

/*
 * One bitmap word's share of state.bitmap_sum: a 64-bit mix of the word and
 * its index, so a word moved, zeroed or flipped changes the sum (a zeroed
 * bitmap of a pool in use does not add up to its sum).
 */
static inline __u64 cxlkv_bitmap_word_sum(__u64 index, __u64 word)
{
	__u64 z = word ^ (index * 0x9e3779b97f4a7c15ULL) ^ 0xa0761d6478bd642fULL;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

#endif /* _UAPI_CXLKV_ALLOC_H */
