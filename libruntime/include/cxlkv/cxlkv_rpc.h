/* SPDX-License-Identifier: MIT */
/*
 * cxlkv shared-memory RPC, C API (docs/rpc.md "The RPC").  The C++ API is cxlkv/rpc.hpp;
 * the on-pool layout and protocol are in cxlkv/format/rpc_format.h.
 *
 * A server owns an RPC carve of the pool ("rpc" unless told otherwise) and
 * answers requests from clients on any host that maps the pool; each client
 * claims one ring of request/response slots and may keep up to `depth`
 * requests outstanding.  All calls return 0 (or a count) or a negative
 * errno, with the message in cxlkv_last_error().
 *
 * What a request's completion status means:
 *   >= 0 or the handler's own negative errno   the reply, exactly once
 *   -ETIMEDOUT    no reply within the timeout (the request may still run)
 *   -ECONNRESET   the server died or was replaced before replying: the
 *                 request ran at most once; the next submit reconnects
 *   -EOPNOTSUPP   no handler for the op
 */
#ifndef CXLKV_RPC_H
#define CXLKV_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "cxlkv/cxlkv.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cxlkv_rpc_server;
struct cxlkv_rpc_client;

struct cxlkv_rpc_server_opts {
	size_t      size;        /* sizeof(struct cxlkv_rpc_server_opts) */
	const char *carve;       /* NULL: "rpc" */
	/* Geometry, used when this server writes the carve header (0: default). */
	uint32_t    rings;       /* 64 */
	uint32_t    depth;       /* 128, a power of two */
	uint32_t    req_lines;   /* 1: 48 B requests; each more line adds 56 B */
	uint32_t    resp_lines;  /* 1 */
	uint32_t    spin_rounds; /* idle polling rounds before yielding (0: 20000) */
	uint32_t    reserved;
};

/* A handler writes up to reply_cap bytes to reply, sets *reply_len, and
 * returns the status the client sees (>= 0 or a negative errno).  Handlers
 * run on the server's polling thread. */
typedef int32_t (*cxlkv_rpc_handler_fn)(void *ctx, uint32_t op, const void *req, uint32_t req_len,
					void *reply, uint32_t reply_cap, uint32_t *reply_len);

/* -EBUSY while a live server holds the carve. */
int  cxlkv_rpc_server_create(struct cxlkv_node *node, const struct cxlkv_rpc_server_opts *opts,
			     struct cxlkv_rpc_server **out);
int  cxlkv_rpc_server_handle(struct cxlkv_rpc_server *srv, uint32_t op, cxlkv_rpc_handler_fn fn, void *ctx);
/* One polling round on the calling thread: requests answered, or -errno. */
int  cxlkv_rpc_server_poll(struct cxlkv_rpc_server *srv);
/* Poll on a thread of the library until cxlkv_rpc_server_destroy. */
int  cxlkv_rpc_server_start(struct cxlkv_rpc_server *srv);
uint32_t cxlkv_rpc_server_epoch(struct cxlkv_rpc_server *srv);
void cxlkv_rpc_server_destroy(struct cxlkv_rpc_server *srv);

struct cxlkv_rpc_client_opts {
	size_t      size;                /* sizeof(struct cxlkv_rpc_client_opts) */
	const char *carve;               /* NULL: "rpc" */
	int32_t     ring;                /* -1: the first free ring */
	uint32_t    timeout_ms;          /* per request (0: 2000) */
	uint32_t    connect_timeout_ms;  /* 0: 2000 */
	uint32_t    reserved;
};

/* -ECONNREFUSED no live server, -EBUSY ring taken, -ENOSPC no free ring. */
int  cxlkv_rpc_client_connect(struct cxlkv_node *node, const struct cxlkv_rpc_client_opts *opts,
			      struct cxlkv_rpc_client **out);
void cxlkv_rpc_client_close(struct cxlkv_rpc_client *cli);

struct cxlkv_rpc_call {
	uint32_t    op;
	uint32_t    req_len;
	const void *req;
	void       *reply;       /* reply payload copied here, up to reply_cap bytes */
	uint32_t    reply_cap;
	uint32_t    reserved;
	void       *tag;         /* handed back in the completion */
};

struct cxlkv_rpc_completion {
	uint64_t ticket;
	int32_t  status;         /* see the top of this file */
	uint32_t len;            /* reply bytes the server sent */
	void    *tag;
};

/* Submit up to n calls (one pair of fences for all); tickets[i] (may be
 * NULL) gets each one's ticket.  Returns how many were submitted, -EAGAIN
 * when the ring is full, -EMSGSIZE, -ECONNRESET (no server to reconnect to). */
int cxlkv_rpc_submit(struct cxlkv_rpc_client *cli, const struct cxlkv_rpc_call *calls, size_t n,
		     uint64_t *tickets);
/* Completions that are ready (up to max), oldest first; never blocks. */
int cxlkv_rpc_poll(struct cxlkv_rpc_client *cli, struct cxlkv_rpc_completion *out, size_t max);
/* One request, waiting up to timeout_ns (0: the client's timeout).  Returns
 * the handler's status (>= 0 or its negative errno) with *reply_len set, or
 * -ETIMEDOUT / -ECONNRESET / -EMSGSIZE with cxlkv_last_error() set. */
int cxlkv_rpc_call(struct cxlkv_rpc_client *cli, uint32_t op, const void *req, uint32_t req_len,
		   void *reply, uint32_t reply_cap, uint32_t *reply_len, uint64_t timeout_ns);
/* Ring geometry seen by the client. */
uint32_t cxlkv_rpc_client_ring(struct cxlkv_rpc_client *cli);
uint32_t cxlkv_rpc_client_depth(struct cxlkv_rpc_client *cli);
uint32_t cxlkv_rpc_client_request_max(struct cxlkv_rpc_client *cli);

/* ---- index service (docs/rpc.md "The index service") ----
 * One process owns the prefix index and serves its batched reserve /
 * publish / abort / pin / unpin over this RPC (carve "rpc.index"); every
 * cxlkv_kv_open on a pool that has that carve then goes through the service
 * (unless CXLKV_KV_INDEX_LOCKS or CXLKV_INDEX_MODE=locks says otherwise),
 * with the same C API behaviour.  cxlkvd --index-service hosts it as a
 * daemon; this hosts it in the calling process: attaches as `node`, takes
 * the index's stripe locks through the pool's lock manager, and serves on a
 * thread of the library.  Creates the carve when the pool has none (the
 * pool is in index-service mode from then on).  -EBUSY: a live service
 * already runs on the pool. */
struct cxlkv_pool;
struct cxlkv_index_service;
int  cxlkv_index_service_start(struct cxlkv_pool *pool, uint32_t node, struct cxlkv_index_service **out);
void cxlkv_index_service_stop(struct cxlkv_index_service *svc);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_RPC_H */
