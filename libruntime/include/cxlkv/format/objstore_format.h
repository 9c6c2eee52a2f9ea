/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Object store: named roots (string key -> pool offset), a fixed-size
 * open-addressing table with linear probing in the alloc carve at
 * cxlkv_alloc_header.objstore_off.
 *
 * Writers (put / destroy) hold the global lock CXLKV_LOCK_OBJSTORE and write
 * an entry as one whole line with non-temporal stores (publish_line; rule
 * 1: any node may write any entry), then fence (rule 3).  Readers do not
 * lock: they invalidate the entry (rule 4), read it and check `check`
 * (FNV-1a 32 over the line with `check` taken as zero); a torn or
 * half-written line fails the check and is re-read, then read under the
 * lock.  Entries never move: a destroyed entry becomes a TOMBSTONE, which a
 * later put may reuse, so a concurrent reader never misses a key that stays
 * present.
 */
#ifndef _UAPI_CXLKV_OBJSTORE_H
#define _UAPI_CXLKV_OBJSTORE_H

#include <linux/types.h>

#include "uapi/cxlkv_pool.h"   /* CXLKV_STATIC_ASSERT, CXLKV_LINE_SIZE */

/* "CXLKVOS1" */
#define CXLKV_OBJSTORE_MAGIC     0x31534f564b4c5843ULL
#define CXLKV_OBJSTORE_VERSION   1u
#define CXLKV_OBJ_KEY_MAX        40u     /* bytes, no terminating NUL stored */
#define CXLKV_OBJSTORE_DEFAULT_ENTRIES 4096u

struct cxlkv_objstore_header {
	__u64 magic;             /* CXLKV_OBJSTORE_MAGIC */
	__u32 version;
	__u32 nentries;          /* power of two */
	__u64 table_off;         /* relative to this header */
	__u8  reserved[40];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_objstore_header) == 64, "objstore header is one line");

enum cxlkv_obj_state {
	CXLKV_OBJ_EMPTY     = 0,
	CXLKV_OBJ_LIVE      = 1,
	CXLKV_OBJ_TOMBSTONE = 2,
};

struct cxlkv_obj_entry {
	__u64 value;             /* pool offset the name refers to */
	__u32 state;             /* enum cxlkv_obj_state */
	__u16 key_len;           /* 1 .. CXLKV_OBJ_KEY_MAX */
	__u16 reserved0;
	__u32 seq;               /* grows on every write of this entry */
	__u32 check;             /* FNV-1a 32 of the line with check = 0 */
	char  key[CXLKV_OBJ_KEY_MAX];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_obj_entry) == 64, "objstore entry is one line");

static inline __u32 cxlkv_obj_entry_check(const struct cxlkv_obj_entry *e)
{
	const unsigned char *p = (const unsigned char *)e;
	const unsigned long lo = __builtin_offsetof(struct cxlkv_obj_entry, check);
	__u32 h = 0x811c9dc5u;
	unsigned long i;

	for (i = 0; i < sizeof(*e); i++) {
		unsigned char c = (i >= lo && i < lo + 4) ? 0 : p[i];

		h ^= c;
		h *= 0x01000193u;
	}
	return h;
}

#endif /* _UAPI_CXLKV_OBJSTORE_H */
