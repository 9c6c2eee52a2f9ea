/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Layout of the control carve (CXLKV_CARVE_CONTROL): node table, lock
 * manager lease and global lock slots.  Included by cxlkv_pool.h.
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
/* 2: header checksum (docs/integrity.md "Checked metadata") */
#define CXLKV_CTRL_VERSION      2u
#define CXLKV_DEFAULT_MAX_LOCKS 1024u
#define CXLKV_MAX_LOCKS         65536u

struct cxlkv_ctrl_header {
	__u64 magic;             /* CXLKV_CTRL_MAGIC */
	__u32 version;           /* CXLKV_CTRL_VERSION */
	__u32 max_nodes;         /* equals superblock max_nodes */
	__u32 max_locks;         /* lock ids are 0 .. max_locks-1 */
	__u32 checksum;          /* low 32 bits of cxlkv_hdr_checksum() of this line (uapi/cxlkv_pool.h) */
	__u64 lease_off;
	__u64 node_table_off;
	__u64 lock_table_off;
	__u64 grant_table_off;
	__u64 doorbell_off;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ctrl_header) == 64, "ctrl header is one line");

/*
 * Node table entry.  Written by the node it describes (one heartbeat
 * process per node) and, to evict a dead node, by an operator; so the line
 * is only ever written whole with non-temporal stores (rule 1).
 *
 * Liveness (one rule for the lock manager, the index and the tools): a node
 * whose host_id equals the reader's own is on the reader's host and is dead
 * exactly when its process (pid, start_time) is gone -- a stopped (SIGSTOP)
 * process is alive however old its heartbeat; a node on another host is dead
 * when its heartbeat is older than the staleness limit (3 s), judged on the
 * reader's clock (hosts are NTP-synchronised).  `heartbeat` advances every
 * beat (heartbeat_ms, 0 = the node runs no heartbeat thread).
 */
enum cxlkv_node_state {
	CXLKV_NODE_ABSENT  = 0,
	CXLKV_NODE_ACTIVE  = 1,
	CXLKV_NODE_EVICTED = 2,	/* cleared by an operator: cxlkvctl node evict */
};

struct cxlkv_node_entry {
	__u64 heartbeat;         /* advanced periodically while the node is alive */
	__u64 heartbeat_ns;      /* writer's CLOCK_REALTIME at the last beat */
	__u32 state;             /* enum cxlkv_node_state */
	__u32 pid;               /* process that owns the node's heartbeat */
	__u64 incarnation;       /* random per attach; tells restarts apart */
	__u64 start_time;        /* pid's start time: /proc/PID/stat field 22 (clock ticks since boot) */
	__u32 host_id;           /* hash of the host's boot_id and pid namespace: equal = same host */
	__u32 heartbeat_ms;      /* beat period, 0: no heartbeat thread */
	char  host[16];          /* NUL-terminated hostname (truncated), informational */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_node_entry) == 64, "node entry is one line");

/*
 * Lock manager lease (one per pool).  Written whole with non-temporal
 * stores (rule 1: the line changes writer on every takeover) by the holder
 * and by a contender taking over.  The holder advances `heartbeat` every
 * lease_ms/4; a contender that sees (owner, heartbeat) unchanged for
 * `lease_ms` of its own clock treats the lease as expired, writes its own
 * token and re-reads after a settle delay to confirm it won (there are no
 * cross-host atomics).  A holder that could not renew for lease_ms/2 stops
 * granting (self-fencing), so it is quiet before anyone may take over.
 * owner == 0: free (clean shutdown).
 */
struct cxlkv_lease {
	__u64 owner;             /* random token of the holder, 0 = free */
	__u64 heartbeat;
	__u32 node;
	__u32 pid;
	__u32 lease_ms;
	__u32 reserved0;
	__u64 epoch;             /* grows by one at every acquisition (takeover count) */
	__u64 renew_ns;          /* holder's CLOCK_REALTIME at the last renewal (display) */
	__u8  reserved1[16];
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
 * The manager grants only after reading the slot WAITING with the ticket it
 * grants, and treats the lock as released as soon as the holder's slot no
 * longer reads (ticket << 2) | WAITING.  A waiter that gives up (timeout)
 * writes (ticket << 2) | IDLE, exactly like a release, so a late grant for
 * the abandoned ticket is harmless.  Tickets start at 1 (0 never granted).
 */
enum cxlkv_slot_state {
	CXLKV_SLOT_IDLE    = 0,
	CXLKV_SLOT_WAITING = 1,
	CXLKV_SLOT_LOCKED  = 2,	/* derived: WAITING + granted; never stored in request */
	CXLKV_SLOT_STICKY  = 3,	/* released, but the node keeps the grant (sticky grant) */
};
#define CXLKV_SLOT_STATE_MASK   0x3ULL
#define CXLKV_SLOT_TICKET_SHIFT 2

/*
 * Lock sets (docs/locks.md "Lock sets").  A node taking several locks at once (LockSet) asks
 * for all of them in one go: it writes every request, each naming the next
 * lower lock of the same set that it asks for (`prev_lock` = that id + 1, 0
 * for none: a single lock, or the lowest the set asks for) and the ticket
 * of that request (`prev_ticket`), then posts them on its doorbell once.
 * The manager grants a request whose prev_lock is not 0 only while it
 * holds that lower lock granted to this node with exactly prev_ticket, so
 * each set is granted in ascending order, one lock after the other, as if
 * the node had asked for them one at a time (no deadlock between sets: a
 * set never holds a higher lock of its own while it waits for a lower one);
 * the manager walks the locks in ascending order in a round, so a set whose
 * locks are free is granted whole in one round, and it revokes every kept
 * grant a waiting request names at once (eligible or not).  A node that
 * keeps (sticky) a lock of the set above the first one it must ask for
 * does not use it out of order: it asks for it anew (a newer ticket, which
 * the manager reads as the release of the kept grant plus a request).
 * prev fields are written (NT, rule 1) before the request word that they
 * qualify, with a fence between (rule 3).
 */
struct cxlkv_lock_slot {
	__u64 request;           /* (ticket << 2) | state, node-written */
	__u32 owner_pid;         /* pid of the holder/waiter (liveness on its host) */
	__u32 reserved0;         /* zeroed by the module with owner_pid (one 8-byte store) */
	__u64 owner_start;       /* owner_pid's start time (/proc/PID/stat field 22), 0 unknown */
	__u32 prev_lock;         /* lock sets: lower lock of the same set + 1; 0: none */
	__u32 reserved2;
	__u64 prev_ticket;       /* lock sets: ticket of the request for prev_lock - 1 */
	__u8  reserved1[24];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_lock_slot) == 64, "lock slot is one line");

/*
 * Written only by the lock manager (whole line, non-temporal: the writer
 * changes at a manager takeover, rule 1): who holds lock `id` now.  A node
 * polls it (invalidate before every read, rule 4) until it names the node
 * and the ticket of its WAITING request.  A stale read can only show an
 * older grant, and an older grant never names the current ticket, so stale
 * reads delay but never admit two holders.
 *
 * Sticky grants.  A holder whose grant is not CONTENDED may release without
 * writing anything to the pool: its slot keeps reading (ticket << 2) |
 * WAITING and the node keeps the grant; a later acquisition by a process of
 * the same node re-enters on node-local memory only (no pool access).
 * The manager takes a kept grant back only with the node's acknowledgement:
 * when another node waits it writes the grant with CXLKV_GRANT_REVOKED set
 * (same node and ticket), fences, then bumps the node's doorbell `revokes`;
 * the node's watcher (one thread per node, on the node's host) sees the bump,
 * reads the grant fresh and, under the node-local lock of that lock (so
 * never while a local process is inside the critical section), writes
 * (ticket << 2) | IDLE and marks the lock not kept in node-local memory.  A
 * holder inside its critical section finds the revocation in node-local
 * memory at its release and writes IDLE itself.  The lock is free once the
 * slot no longer reads (ticket << 2) | WAITING (or STICKY).  Safety: the
 * grant stays with the node until the node itself writes IDLE, and after
 * that no process of the node re-enters on it (the node-local phase says
 * so), so no grant is ever held by two nodes; a holder that has not seen
 * the revocation still owns the grant.  The only exception is a node judged
 * dead (liveness rule above): its kept grants are taken without an answer.
 * Its node-local memory still says `cached` when a successor process of the
 * node (or a sibling, while the node entry names the dead process) comes
 * back, so a process re-enters on node-local memory alone only a grant it
 * kept itself; one kept by another process of the node only while that
 * process lives (the slot's owner_pid + owner_start), which it checks
 * after writing its own owner record; else it writes IDLE and asks anew.
 * The manager, before it takes a kept grant from a dead node, reads the
 * slot again and keeps the grant with the node if its owner changed.
 * A node judged dead by heartbeat may only have been paused: it re-enters
 * no kept grant while its last beat is older than half the liveness limit,
 * and its first beat after such a lapse gives up every kept grant (IDLE)
 * before it is alive again (docs/locks.md "Heartbeat lapses").
 * A grant written for a fresh request has flags 0, or CONTENDED when other
 * nodes wait as well: then the holder's release writes IDLE, and the lock
 * goes round-robin without a revocation round.  (Version 1 of this protocol
 * wrote STICKY at release and re-read the grant at re-entry, a Dekker pair;
 * a manager still treats a slot reading (ticket << 2) | STICKY as kept.)
 *
 * Dead nodes.  The manager never writes a node's slot.  A request or hold
 * whose owner is dead (liveness rule above; on the manager's host: owner_pid
 * with owner_start gone) is ignored: a dead holder's CONTENDED grant is
 * granted to the next waiter, a dead waiter is skipped.  A grant that the
 * node may keep (not CONTENDED) passes on only when the node's watcher
 * acknowledges the revocation (it recovers the dead process's robust
 * node-local mutex and writes IDLE) or the whole node is judged dead.  The
 * node's next process on that host finds the dead owner through its robust
 * node-local mutex and writes the slot IDLE itself.
 *
 * Dead processes of live nodes.  One liveness rule for every holder: a node
 * is judged by the manager (its heartbeat; on the manager's own host, its
 * process), a process of a live node only on its own host, where pid and
 * start time mean something and the dead holder's robust node-local mutex
 * says so.  A manager on the holder's host checks the slot's owner itself
 * (above).  From another host it asks the node instead, with the
 * revocation it uses for kept grants: for a CONTENDED grant that others
 * have waited on for a liveness period, it writes the grant REVOKED |
 * CONTENDED (same node and ticket), fences and bumps `revokes`, and bumps
 * `revokes` again at every later period while the grant stands.  The node's
 * watcher (any live process of the node runs one) tries the lock's
 * node-local mutex: a dead owner (EOWNERDEAD) -> it writes the slot IDLE
 * for the dead holder's ticket; a live holder -> nothing (its release of a
 * CONTENDED grant writes IDLE).  So the lock of a holder that died on
 * another host moves on within a few liveness periods while its node lives,
 * and is never taken from a live holder.
 */
#define CXLKV_GRANT_REVOKED     0x1u
/* Set in a fresh grant when other nodes wait too: the holder releases IDLE
 * (hands the lock on at once) instead of keeping it sticky. */
#define CXLKV_GRANT_CONTENDED   0x2u
#define CXLKV_GRANT_NONE        0xffffffffu
struct cxlkv_lock_grant {
	__u64 ticket;            /* ticket of the granted request */
	__u32 node;              /* granted node or CXLKV_GRANT_NONE */
	__u32 flags;             /* CXLKV_GRANT_REVOKED: a kept (sticky) grant is being taken back */
	__u64 grants;            /* number of grants so far (statistics) */
	__u8  reserved1[40];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_lock_grant) == 64, "grant is one line");

/*
 * Per-node doorbell, written only by that node (its processes serialise
 * through a node-local mutex), with non-temporal stores: `seq` grows each
 * time the node posts a request and pending[(seq-1) % RING] names the lock.
 * The poster writes pending[] first, fences, then seq, fences (rule 3).  The
 * manager keeps the last seq it saw per node; new entries are
 * pending[old % RING .. seq % RING); if it fell more than RING behind it
 * rescans that node's slots of every lock (rare).  A doorbell entry is only
 * a hint: the manager always re-reads the slot before granting.  Thus the
 * manager finds waiters in O(max_nodes) line reads per round, independent
 * of max_locks.
 */
#define CXLKV_DOORBELL_RING     12u
struct cxlkv_doorbell {
	__u64 seq;
	__u32 pending[CXLKV_DOORBELL_RING];
	/* Written by the lock manager only (8-byte NT store, rule 1: the node
	 * writes the other bytes of this line, also NT): grows each time the
	 * manager revokes a grant this node keeps.  The node's watcher polls it
	 * and acknowledges (see "Sticky grants" above). */
	__u64 revokes;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_doorbell) == 64, "doorbell is one line");

/*
 * Lock ids reserved by the runtime.  Applications use ids from
 * CXLKV_LOCK_FIRST_USER up to max_locks - 1.
 */
#define CXLKV_LOCK_ALLOC              0u   /* chunk bitmap + chunk table (cxlkv/format/alloc_format.h) */
#define CXLKV_LOCK_OBJSTORE           1u   /* object store table (cxlkv/format/objstore_format.h) */
#define CXLKV_LOCK_REMOTE_FREE_BASE   2u   /* + node: remote-free bitmaps of that node's chunks */
#define CXLKV_LOCK_LAYER_BASE         72u  /* 72..127: other runtime layers (index, tiers) */
#define CXLKV_LOCK_FIRST_USER         128u
#define CXLKV_MIN_LOCKS               256u /* format refuses fewer */

static inline __u64 cxlkv_lock_slot_off(const struct cxlkv_ctrl_header *h,
					__u32 lock_id, __u32 node)
{
	return h->lock_table_off +
	       ((__u64)lock_id * h->max_nodes + node) * sizeof(struct cxlkv_lock_slot);
}

static inline __u64 cxlkv_ctrl_lines(__u64 n)
{
	return n * CXLKV_LINE_SIZE;
}

/*
 * Bytes the control carve needs for max_nodes and max_locks, laid out as
 * the format initializer does: header, lease, node table, lock slots,
 * grants, doorbells (each region starts on its own line).
 */
static inline __u64 cxlkv_ctrl_carve_bytes(__u32 max_nodes, __u32 max_locks)
{
	return cxlkv_ctrl_lines(2) + cxlkv_ctrl_lines(max_nodes) +
	       cxlkv_ctrl_lines((__u64)max_locks * max_nodes) +
	       cxlkv_ctrl_lines(max_locks) + cxlkv_ctrl_lines(max_nodes);
}

#endif /* _UAPI_CXLKV_CTRL_H */
