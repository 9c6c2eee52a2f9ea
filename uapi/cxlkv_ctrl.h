/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Layout of the control carve (CXLKV_CARVE_CONTROL): node table, lock
 * manager lease and global lock slots.  Included by cxlkv.h.
 *
 *   +0                      struct cxlkv_ctrl_header (one line, written at format)
 *   +lease_off              struct cxlkv_lease       (one line, lock manager only)
 *   +node_table_off         struct cxlkv_node_entry  [max_nodes]
 *   +lock_table_off         struct cxlkv_lock_slot   [max_locks][max_nodes]
 *   +grant_table_off        struct cxlkv_lock_grant  [max_locks]
 *   +doorbell_off           struct cxlkv_doorbell    [max_nodes]
 *
 * Offsets are relative to the start of the control carve.  Every structure
 * is a whole number of 64 B lines so that lines with different writers
 * never share a cache line (coherence contract rule 2).
 */
#ifndef _UAPI_CXLKV_CTRL_H
#define _UAPI_CXLKV_CTRL_H

#include <linux/types.h>

/* "CXLKVCT1" */
#define CXLKV_CTRL_MAGIC        0x315443564b4c5843ULL
#define CXLKV_CTRL_VERSION      1u
#define CXLKV_DEFAULT_MAX_LOCKS 1024u
#define CXLKV_MAX_LOCKS         65536u

struct cxlkv_ctrl_header {
	__u64 magic;             /* CXLKV_CTRL_MAGIC */
	__u32 version;           /* CXLKV_CTRL_VERSION */
	__u32 max_nodes;         /* equals superblock max_nodes */
	__u32 max_locks;         /* lock ids are 0 .. max_locks-1 */
	__u32 reserved0;
	__u64 lease_off;
	__u64 node_table_off;
	__u64 lock_table_off;
	__u64 grant_table_off;
	__u64 doorbell_off;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ctrl_header) == 64, "ctrl header is one line");

/* Written only by the node it describes (rule 2). */
enum cxlkv_node_state {
	CXLKV_NODE_ABSENT  = 0,
	CXLKV_NODE_ACTIVE  = 1,
	CXLKV_NODE_EVICTED = 2,	/* cleared by an operator: cxlkvctl node evict */
};

struct cxlkv_node_entry {
	__u64 heartbeat;         /* advanced periodically while the node is alive */
	__u64 heartbeat_ns;      /* writer's CLOCK_REALTIME at the last beat, for display */
	__u32 state;             /* enum cxlkv_node_state */
	__u32 pid;               /* process that owns the node's heartbeat */
	__u64 incarnation;       /* random per attach; tells restarts apart */
	char  host[32];          /* NUL-terminated hostname, informational */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_node_entry) == 64, "node entry is one line");

/*
 * Lock manager lease (one per pool).  The holder advances `heartbeat`; a
 * contender that sees it unchanged for `lease_ms` of its own clock treats
 * the lease as expired.
 */
struct cxlkv_lease {
	__u64 owner;             /* random token of the holder, 0 = free */
	__u64 heartbeat;
	__u32 node;
	__u32 pid;
	__u32 lease_ms;
	__u32 reserved0;
	__u8  reserved1[32];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_lease) == 64, "lease is one line");

/*
 * Global lock slot: one per (lock id, node), at
 *   lock_table_off + ((u64)lock_id * max_nodes + node) * 64.
 *
 * `request` is written only by the node (or, when a file that owns the slot
 * is closed, by the node's kernel module on its behalf):
 *   request = (ticket << 2) | CXLKV_SLOT_IDLE or CXLKV_SLOT_WAITING.
 * The node bumps the ticket on every acquisition.  The slot is LOCKED when
 * request says WAITING and the lock's grant (struct cxlkv_lock_grant) names
 * this node and ticket.  Release writes (ticket << 2) | IDLE.
 * Because the kernel and the runtime of one host may both write `request`,
 * it is written with 8-byte non-temporal stores only (rule 1).
 */
enum cxlkv_slot_state {
	CXLKV_SLOT_IDLE    = 0,
	CXLKV_SLOT_WAITING = 1,
	CXLKV_SLOT_LOCKED  = 2,	/* derived: WAITING + granted; never stored in request */
};
#define CXLKV_SLOT_STATE_MASK   0x3ULL
#define CXLKV_SLOT_TICKET_SHIFT 2

struct cxlkv_lock_slot {
	__u64 request;           /* (ticket << 2) | state, node-written */
	__u32 owner_pid;         /* informational: pid of the holder/waiter */
	__u32 reserved0;
	__u8  reserved1[48];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_lock_slot) == 64, "lock slot is one line");

/* Written only by the lock manager: who holds lock `id` now. */
#define CXLKV_GRANT_NONE        0xffffffffu
struct cxlkv_lock_grant {
	__u64 ticket;            /* ticket of the granted request */
	__u32 node;              /* granted node or CXLKV_GRANT_NONE */
	__u32 reserved0;
	__u64 grants;            /* number of grants so far (statistics) */
	__u8  reserved1[40];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_lock_grant) == 64, "grant is one line");

/*
 * Per-node doorbell, written only by that node: `seq` grows each time the
 * node posts a request, so the manager can find waiting nodes without
 * scanning every lock.  `pending[]` is a small ring of lock ids.
 */
#define CXLKV_DOORBELL_RING     12u
struct cxlkv_doorbell {
	__u64 seq;
	__u32 pending[CXLKV_DOORBELL_RING];
	__u8  reserved[8];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_doorbell) == 64, "doorbell is one line");

static inline __u64 cxlkv_lock_slot_off(const struct cxlkv_ctrl_header *h,
					__u32 lock_id, __u32 node)
{
	return h->lock_table_off +
	       ((__u64)lock_id * h->max_nodes + node) * sizeof(struct cxlkv_lock_slot);
}

#endif /* _UAPI_CXLKV_CTRL_H */
