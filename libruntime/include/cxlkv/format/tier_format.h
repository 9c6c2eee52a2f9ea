/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * cxlkv SSD tier: the header at the start of every SSD pool device (a file
 * or a raw block device).  It records the device's geometry and the cached
 * result of the bandwidth probe, so a restart does not probe again.
 *
 * Layout of an SSD pool device:
 *
 *   [0, 4 KiB)                      this header
 *   [CXLKV_TIER_PROBE_OFF, +probe)  scratch area the bandwidth probe writes and reads
 *   [data_offset, capacity)         block extents (logical-block aligned)
 *
 * Every block extent starts with one logical block holding a
 * struct cxlkv_ssd_block_header (the rest of that block is zero), followed by
 * the payload, zero-padded to the logical block.  A read verifies the header
 * (magic, header checksum, the key and length the index names) and the
 * payload checksum; any mismatch makes the block a clean miss, never data.
 *
 * The device is written only by direct I/O (io_uring + O_DIRECT); nothing
 * here is shared through CPU caches, so the coherence rules do not apply.
 */
#ifndef _UAPI_CXLKV_TIER_H
#define _UAPI_CXLKV_TIER_H

#include "uapi/cxlkv_pool.h"

#define CXLKV_TIER_DEV_MAGIC     0x5244535654584c43ULL  /* "CLXTVSDR" little endian */
#define CXLKV_TIER_DEV_VERSION   1u
#define CXLKV_TIER_HEADER_SIZE   4096u
#define CXLKV_TIER_PROBE_OFF     (1ULL << 20)   /* 1 MiB: keeps probe I/O aligned for any block size */

struct cxlkv_tier_dev_header {
	__u64 magic;              /*   0 CXLKV_TIER_DEV_MAGIC */
	__u32 version;            /*   8 CXLKV_TIER_DEV_VERSION */
	__u32 logical_block;      /*  12 bytes; every extent is a multiple of this */
	__u64 capacity;           /*  16 bytes of the device when the header was written */
	__u64 data_offset;        /*  24 first byte of the extent area */
	__u64 probe_bytes;        /*  32 size of the probe scratch area */
	__u64 probe_read_bps;     /*  40 measured read bandwidth, bytes/s (0: never probed) */
	__u64 probe_write_bps;    /*  48 measured write bandwidth, bytes/s */
	__u64 probe_unix_ns;      /*  56 when the probe ran (CLOCK_REALTIME) */
	__u64 checksum;           /*  64 cxlkv_tier_header_checksum() */
	__u8  reserved[CXLKV_TIER_HEADER_SIZE - 72];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_tier_dev_header) == CXLKV_TIER_HEADER_SIZE,
		    "SSD device header is one 4 KiB block");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_tier_dev_header, checksum) == 64,
		    "checksum offset is part of the layout");

/* FNV-1a 64 over the header, with the checksum field read as zero. */
static inline __u64 cxlkv_tier_header_checksum(const struct cxlkv_tier_dev_header *h)
{
	const unsigned char *p = (const unsigned char *)h;
	const unsigned long ck_lo = __builtin_offsetof(struct cxlkv_tier_dev_header, checksum);
	const unsigned long ck_hi = ck_lo + sizeof(h->checksum);
	__u64 x = 0xcbf29ce484222325ULL;
	unsigned long i;

	for (i = 0; i < sizeof(*h); i++) {
		x ^= (i >= ck_lo && i < ck_hi) ? 0 : p[i];
		x *= 0x100000001b3ULL;
	}
	return x;
}

/* "CXLKVSB1" little endian */
#define CXLKV_SSD_BLOCK_MAGIC    0x3142535656584c43ULL

struct cxlkv_ssd_block_header {
	__u64 magic;              /*  0 CXLKV_SSD_BLOCK_MAGIC */
	__u64 key_lo;             /*  8 the block key the extent holds */
	__u64 key_hi;             /* 16 */
	__u32 length;             /* 24 payload bytes */
	__u32 flags;              /* 28 0 */
	__u64 payload_hash;       /* 32 XXH3-64 of the payload bytes (seed 0) */
	__u64 write_seq;          /* 40 writer's sequence number (diagnostics) */
	__u64 reserved;           /* 48 0 */
	__u64 header_check;       /* 56 cxlkv_ssd_block_header_check() */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ssd_block_header) == 64, "SSD block header is 64 bytes");

/* FNV-1a 64 over bytes 0..55 of a block header; never 0. */
static inline __u64 cxlkv_ssd_block_header_check(const struct cxlkv_ssd_block_header *h)
{
	const unsigned char *p = (const unsigned char *)h;
	__u64 x = 0xcbf29ce484222325ULL;
	unsigned long i;

	for (i = 0; i < 56; i++) {
		x ^= p[i];
		x *= 0x100000001b3ULL;
	}
	return x ? x : 1;
}

#endif /* _UAPI_CXLKV_TIER_H */
