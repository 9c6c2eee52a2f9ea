/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * cxlkv on-pool layout: the single definition shared by the kernel module
 * (kmod/) and the userspace runtime (libruntime/).
 *
 * Everything here is fixed-width, little-endian, explicitly padded and
 * checked by static asserts so that C (kernel, gnu11) and C++20 agree on
 * every offset.  Pool data refers to other pool data by offset from the
 * start of the pool, never by virtual address.
 *
 *   offset 0            superblock (4 KiB) in the first 2 MiB of the pool
 *   carves              named, 2 MiB-aligned sub-ranges with a memory type
 *
 * Sub-headers hold the layouts of individual carves and the ioctl ABI:
 *   cxlkv_ctrl.h   control carve (node table, lease, lock slots)
 *   cxlkv_ioctl.h  /dev/cxlkvN ioctl ABI (kernel module)
 */
#ifndef _UAPI_CXLKV_POOL_H
#define _UAPI_CXLKV_POOL_H

#include <linux/types.h>

#if defined(__cplusplus)
#define CXLKV_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define CXLKV_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* "CXLKVPL1" read as a little-endian u64. */
#define CXLKV_SB_MAGIC          0x314c50564b4c5843ULL
#define CXLKV_LAYOUT_VERSION    1u
#define CXLKV_SB_SIZE           4096u
#define CXLKV_LINE_SIZE         64u
#define CXLKV_CARVE_ALIGN       (2ULL << 20)          /* 2 MiB */
/* The first carve may start here: [0, 2 MiB) belongs to the superblock. */
#define CXLKV_FIRST_CARVE_OFF   CXLKV_CARVE_ALIGN
#define CXLKV_MIN_POOL_SIZE     (2 * CXLKV_CARVE_ALIGN)
#define CXLKV_MAX_CARVES        32u
#define CXLKV_CARVE_NAME_MAX    32u    /* bytes including the NUL */
#define CXLKV_MAX_NODES         64u    /* upper bound for sb.max_nodes */

/* Standard carve names created by `cxlkvctl format`. */
#define CXLKV_CARVE_CONTROL     "control"
#define CXLKV_CARVE_INDEX       "index"
#define CXLKV_CARVE_ALLOC       "alloc"
#define CXLKV_CARVE_KV          "kv"
#define CXLKV_CARVE_PNM         "pnm"    /* near-memory long contexts (cxlkv/format/pnm_format.h), made on first use */
#define CXLKV_CARVE_RPC         "rpc"      /* shared-memory RPC rings: cxlkv/format/rpc_format.h */

/* Memory type that user mappings of a carve get (enforced by the module). */
enum cxlkv_memtype {
	CXLKV_MEM_WB = 0,	/* write-back: flush/invalidate per the coherence contract */
	CXLKV_MEM_WC = 1,	/* write-combining: stores bypass the cache, loads uncached */
	CXLKV_MEM_UC = 2,	/* uncacheable */
};
#define CXLKV_MEM_MAX           CXLKV_MEM_UC

/* cxlkv_carve.flags */
#define CXLKV_CARVE_F_SYSTEM    (1u << 0)   /* created by format; `carve rm` needs --force */
#define CXLKV_CARVE_F_ALL       (CXLKV_CARVE_F_SYSTEM)

struct cxlkv_carve {
	char  name[CXLKV_CARVE_NAME_MAX];  /* NUL-terminated, [a-z0-9_.-], not empty */
	__u64 offset;                      /* from pool start, multiple of CXLKV_CARVE_ALIGN */
	__u64 size;                        /* multiple of CXLKV_CARVE_ALIGN, non-zero */
	__u32 memtype;                     /* enum cxlkv_memtype */
	__u32 flags;                       /* CXLKV_CARVE_F_* */
	__u64 reserved;                    /* zero */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_carve) == 64, "cxlkv_carve is one line");

/*
 * The superblock.  Written rarely (format, carve changes) by one operator at
 * a time; the writer stores it, then flushes every line and fences before it
 * is considered updated (coherence contract rule 3); readers invalidate the
 * 4 KiB before reading (rule 4).  `checksum` covers the whole 4 KiB with the
 * checksum field taken as zero; `generation` grows by one on every update.
 *
 * carves[0 .. ncarves-1] are in use, sorted by offset; the rest are zero.
 */
struct cxlkv_superblock {
	__u64 magic;                  /*   0 CXLKV_SB_MAGIC */
	__u32 layout_version;         /*   8 CXLKV_LAYOUT_VERSION */
	__u32 sb_size;                /*  12 CXLKV_SB_SIZE */
	__u64 pool_size;              /*  16 bytes, multiple of CXLKV_CARVE_ALIGN */
	__u32 max_nodes;              /*  24 1 .. CXLKV_MAX_NODES */
	__u32 ncarves;                /*  28 0 .. CXLKV_MAX_CARVES */
	__u8  pool_id[16];            /*  32 random at format time */
	__u64 format_time_ns;         /*  48 CLOCK_REALTIME at format */
	__u64 generation;             /*  56 */
	__u64 checksum;               /*  64 cxlkv_sb_checksum() */
	__u8  reserved0[56];          /*  72 zero */
	struct cxlkv_carve carves[CXLKV_MAX_CARVES];   /* 128 */
	__u8  reserved1[CXLKV_SB_SIZE - 128 - CXLKV_MAX_CARVES * 64];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_superblock) == CXLKV_SB_SIZE,
		    "superblock is 4 KiB");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_superblock, checksum) == 64,
		    "checksum offset is part of the layout");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_superblock, carves) == 128,
		    "carve table offset is part of the layout");

/*
 * FNV-1a 64 over the superblock, with the checksum field read as zero.
 * Detects corruption and torn updates, not tampering.  One definition for
 * the kernel and userspace, so both compute the same value.
 */
static inline __u64 cxlkv_sb_checksum(const struct cxlkv_superblock *sb)
{
	const unsigned char *p = (const unsigned char *)sb;
	const unsigned long ck_lo = __builtin_offsetof(struct cxlkv_superblock, checksum);
	const unsigned long ck_hi = ck_lo + sizeof(sb->checksum);
	__u64 h = 0xcbf29ce484222325ULL;
	unsigned long i;

	for (i = 0; i < CXLKV_SB_SIZE; i++) {
		unsigned char c = (i >= ck_lo && i < ck_hi) ? 0 : p[i];

		h ^= c;
		h *= 0x100000001b3ULL;
	}
	return h;
}

/*
 * FNV-1a 64 over a carve header of n bytes, with the checksum field
 * [ck_off, ck_off + ck_len) read as zero (docs/integrity.md "Checked metadata").  The
 * alloc header stores all 64 bits; the one-line control and index headers
 * store the low 32 bits in a 4-byte field.
 */
static inline __u64 cxlkv_hdr_checksum(const void *hdr, unsigned long n, unsigned long ck_off,
				       unsigned long ck_len)
{
	const unsigned char *p = (const unsigned char *)hdr;
	__u64 h = 0xcbf29ce484222325ULL;
	unsigned long i;

	for (i = 0; i < n; i++) {
		unsigned char c = (i >= ck_off && i < ck_off + ck_len) ? 0 : p[i];

		h ^= c;
		h *= 0x100000001b3ULL;
	}
	return h;
}

#include "cxlkv_ctrl.h"

/* The control carve header's checksum field (written at format, checked at open). */
static inline __u32 cxlkv_ctrl_header_checksum(const struct cxlkv_ctrl_header *h)
{
	return (__u32)cxlkv_hdr_checksum(h, sizeof(*h), __builtin_offsetof(struct cxlkv_ctrl_header, checksum), 4);
}

#endif /* _UAPI_CXLKV_POOL_H */
