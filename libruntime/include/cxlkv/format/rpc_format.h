/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Layout of the shared-memory RPC carve (CXLKV_CARVE_RPC, "rpc"; a service
 * may use its own carve of the same layout, e.g. "rpc.index").  Beluga's
 * design: fixed request and response slots per client in pool memory,
 * flags polled with invalidate-before-read, everything in user space.
 *
 *   +0                 struct cxlkv_rpc_header       (one line, written at format)
 *   +server_off        struct cxlkv_rpc_server_line  (one line, the server)
 *   +rings_off         nrings rings of ring_bytes each:
 *     line 0           struct cxlkv_rpc_client_line  (the ring's client)
 *     line 1           struct cxlkv_rpc_doorbell     (the ring's client)
 *     line 2           struct cxlkv_rpc_ack          (the server)
 *     req area         depth slots of req_lines lines (the client)
 *     resp area        depth slots of resp_lines lines (the server)
 *
 * One writer per line (coherence contract rule 2): every line above is
 * written by exactly one party, and the request and response areas never
 * share a line.  A line whose writer changes (the server line at a
 * takeover, a ring's client lines when another process claims the ring) is
 * written with non-temporal stores only (rule 1).
 *
 * Protocol (sequence numbers are per ring, 32 bits, wrapping; slot = seq %
 * depth, depth a power of two so the wrap keeps the mapping).  A message
 * (request or response) is line 0 (struct cxlkv_rpc_req_hdr / _resp_hdr:
 * flag, op or status, len, 48 payload bytes) and, for longer payloads,
 * continuation lines (struct cxlkv_rpc_cont_line: a stamp equal to the
 * flag, 56 payload bytes).  Every line of a message carries its flag, so a
 * reader can tell each line of this message from an older one on its own.
 *   writer   (client for requests, server for responses) either
 *            - whole lines (CXLKV_RPC_LEN_WHOLE set in len): every line,
 *              flag and stamps included, is one 64-byte store (movdir64b:
 *              never seen in part); one fence after all lines of a batch
 *              (rule 3: each line is its own flag);
 *            - or in two phases (a CPU without movdir64b: a line may land
 *              in pieces): every line with line 0's flag word 0 (NT),
 *              fence, the flag words (NT), fence (rule 3).
 *            The client also writes the doorbell tail (flag of its last
 *            request) in the same phase as the flags; many requests share
 *            the fences.
 *            A writer that polls next (a client waiting for its reply, a
 *            server's next round) may let that poll's fence be the
 *            publication's last fence.
 *   reader   invalidates the first lines of the next expected slot (and,
 *            server, the doorbell of a ring that was busy in its last
 *            round), fences, loads (rule 4), so a lone request or reply
 *            costs one round of misses; then further slots the doorbell
 *            announces (server) or that follow an answered one (client), as
 *            a batch with one fence.  A message is taken only
 *            when line 0's flag equals cxlkv_rpc_flag(epoch, inc, seq) for
 *            the next expected seq and every continuation line it needs
 *            carries that flag as its stamp.  Continuation lines loaded
 *            before the flag was seen are trusted only from a whole-lines
 *            writer; otherwise they are invalidated again after the flag
 *            was seen (rule 4).  A message not yet complete is retried on a
 *            later round.
 * The flag word is one aligned 8-byte store (single-copy atomic).
 *
 * Version 2 (this one): continuation lines carry a stamp (56 payload bytes
 * each, 64 in version 1) and len carries CXLKV_RPC_LEN_WHOLE.  A carve of
 * another version is refused at open.
 */
#ifndef _UAPI_CXLKV_RPC_H
#define _UAPI_CXLKV_RPC_H

#include <linux/types.h>

#ifndef CXLKV_STATIC_ASSERT
#if defined(__cplusplus)
#define CXLKV_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define CXLKV_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#endif

/* "CXLKRPC1" read as a little-endian u64. */
#define CXLKV_RPC_MAGIC         0x314350524b4c5843ULL
#define CXLKV_RPC_VERSION       2u        /* 2: stamped continuation lines */
#define CXLKV_RPC_MAX_RINGS     4096u
#define CXLKV_RPC_MAX_DEPTH     4096u     /* power of two */
#define CXLKV_RPC_MAX_LINES     1024u     /* per request / response slot */
#define CXLKV_RPC_HDR_BYTES     16u       /* flag + op/status + len */
#define CXLKV_RPC_INLINE        48u       /* payload bytes in the header line */
#define CXLKV_RPC_CONT          56u       /* payload bytes in each continuation line */
#define CXLKV_RPC_LEN_MASK      0x00ffffffu  /* len: payload bytes ... */
#define CXLKV_RPC_LEN_WHOLE     0x80000000u  /* ... | every line written as one 64-byte store */
#define CXLKV_RPC_RING_LINES    3u        /* client line, doorbell, ack */

struct cxlkv_rpc_header {
	__u64 magic;             /*  0 CXLKV_RPC_MAGIC */
	__u32 version;           /*  8 CXLKV_RPC_VERSION */
	__u32 nrings;            /* 12 rings 0 .. nrings-1 */
	__u32 depth;             /* 16 slots per ring, power of two */
	__u32 req_lines;         /* 20 lines per request slot (>= 1) */
	__u32 resp_lines;        /* 24 lines per response slot (>= 1) */
	__u32 checksum;          /* 28 low 32 bits of cxlkv_hdr_checksum() of this line */
	__u64 server_off;        /* 32 from the carve start */
	__u64 rings_off;         /* 40 */
	__u64 ring_bytes;        /* 48 */
	__u64 reserved;          /* 56 zero */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_header) == 64, "rpc header is one line");
CXLKV_STATIC_ASSERT(__builtin_offsetof(struct cxlkv_rpc_header, checksum) == 28, "rpc header checksum offset");

enum cxlkv_rpc_server_state {
	CXLKV_RPC_SERVER_NONE    = 0,
	CXLKV_RPC_SERVER_RUNNING = 1,
	CXLKV_RPC_SERVER_STOPPED = 2,	/* clean shutdown */
};

/*
 * Written by the server (whole line, non-temporal: it changes writer when a
 * new server takes over).  epoch grows by one at every server start; a
 * request carries the epoch its client connected to, and a server never
 * executes a request of another epoch.  Liveness of the server: the rule of
 * uapi/cxlkv_ctrl.h (process on this host, node heartbeat on another).
 */
struct cxlkv_rpc_server_line {
	__u32 state;             /* enum cxlkv_rpc_server_state */
	__u32 epoch;
	__u32 pid;
	__u32 host_id;
	__u64 start_time;        /* pid's start time (/proc/PID/stat field 22) */
	__u32 node;              /* the server's node id (heartbeat for remote clients) */
	__u32 reserved0;
	__u64 token;             /* random per start */
	__u8  reserved1[24];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_server_line) == 64, "rpc server line is one line");

enum cxlkv_rpc_client_state {
	CXLKV_RPC_CLIENT_FREE     = 0,
	CXLKV_RPC_CLIENT_ATTACHED = 1,
	CXLKV_RPC_CLIENT_DETACHED = 2,
};

/*
 * Ring line 0, written by the ring's client (whole line, non-temporal: the
 * ring changes owner).  A connect writes a fresh incarnation `inc` (non-zero
 * 16 bits), the server epoch it connected to and the first seq it will use;
 * the server starts expecting start_seq when it sees a new inc or token,
 * and acknowledges with both.  A ring whose owner is dead (liveness rule) or
 * DETACHED may be claimed by another client.  Two clients that claim one
 * free ring at once (no cross-host atomics) both write the line; the last
 * write stays, the other client finds another token there (before or after
 * the ack) and gives the ring up.
 */
struct cxlkv_rpc_client_line {
	__u32 state;             /* enum cxlkv_rpc_client_state */
	__u32 pid;
	__u64 start_time;
	__u32 host_id;
	__u32 node;
	__u32 inc;               /* 1 .. 0xffff */
	__u32 epoch;             /* server epoch at connect */
	__u32 start_seq;
	__u32 reserved0;
	__u64 token;             /* random per claim: tells apart two claims of one
	                          * ring made at once (even by one process) */
	__u8  reserved1[16];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_client_line) == 64, "rpc client line is one line");

/* Ring line 1, written by the client: the flag of its last submitted request. */
struct cxlkv_rpc_doorbell {
	__u64 tail;              /* cxlkv_rpc_flag(epoch, inc, last seq) */
	__u8  reserved[56];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_doorbell) == 64, "rpc doorbell is one line");

/* Ring line 2, written by the server: the client incarnation it serves. */
struct cxlkv_rpc_ack {
	__u32 inc;               /* the client line's inc the server accepted, 0 none */
	__u32 epoch;             /* the server's epoch */
	__u64 token;             /* the client line's token the server accepted */
	__u8  reserved[48];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_ack) == 64, "rpc ack is one line");

/* First line of a request slot (client-written). */
struct cxlkv_rpc_req_hdr {
	__u64 flag;              /* cxlkv_rpc_flag(): written last, alone */
	__u32 op;                /* handler number */
	__u32 len;               /* payload bytes (CXLKV_RPC_LEN_MASK) | CXLKV_RPC_LEN_WHOLE */
	__u8  data[CXLKV_RPC_INLINE];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_req_hdr) == 64, "rpc request header is one line");

/* First line of a response slot (server-written). */
struct cxlkv_rpc_resp_hdr {
	__u64 flag;              /* the request's flag: written last, alone */
	__s32 status;            /* handler result, or a negative errno */
	__u32 len;               /* payload bytes (CXLKV_RPC_LEN_MASK) | CXLKV_RPC_LEN_WHOLE */
	__u8  data[CXLKV_RPC_INLINE];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_resp_hdr) == 64, "rpc response header is one line");

/* Lines 1.. of a request or response slot (same writer as line 0). */
struct cxlkv_rpc_cont_line {
	__u64 stamp;             /* the message's flag */
	__u8  data[CXLKV_RPC_CONT];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_rpc_cont_line) == 64, "rpc continuation line is one line");

static inline __u64 cxlkv_rpc_flag(__u32 epoch, __u32 inc, __u32 seq)
{
	return ((__u64)(epoch & 0xffffu) << 48) | ((__u64)(inc & 0xffffu) << 32) | seq;
}

static inline __u32 cxlkv_rpc_payload_max(__u32 lines)
{
	return CXLKV_RPC_INLINE + (lines - 1) * CXLKV_RPC_CONT;
}

/* Lines a message of `len` payload bytes occupies. */
static inline __u32 cxlkv_rpc_msg_lines(__u32 len)
{
	return len <= CXLKV_RPC_INLINE ? 1u : 1u + (len - CXLKV_RPC_INLINE + CXLKV_RPC_CONT - 1) / CXLKV_RPC_CONT;
}

static inline __u64 cxlkv_rpc_ring_bytes(__u32 depth, __u32 req_lines, __u32 resp_lines)
{
	return 64ull * (CXLKV_RPC_RING_LINES + (__u64)depth * (req_lines + resp_lines));
}

#endif /* _UAPI_CXLKV_RPC_H */
