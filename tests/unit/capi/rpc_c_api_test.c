/* SPDX-License-Identifier: MIT */
/*
 * The RPC C API from C, as a user would drive it: format a pool with an
 * "rpc" carve, start a server with a handler, connect a client, call, submit
 * a batch and poll it, and the errors for bad input.  Exit 0 = pass.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"
#include "cxlkv/cxlkv_rpc.h"

#include "support/c_check.h"

#define MiB (1024ull * 1024ull)
#define OP_SUM 1u

/* Replies with the byte sum of the request (8 bytes) and status = len. */
static int32_t sum_handler(void *ctx, uint32_t op, const void *req, uint32_t len, void *reply, uint32_t cap,
			   uint32_t *reply_len)
{
	const unsigned char *p = req;
	uint64_t sum = 0;
	uint32_t i;

	(void)op;
	++*(int *)ctx;
	for (i = 0; i < len; i++)
		sum += p[i];
	if (cap < sizeof(sum))
		return -ENOBUFS;
	memcpy(reply, &sum, sizeof(sum));
	*reply_len = sizeof(sum);
	return (int32_t)len;
}

static struct cxlkv_node *attach(struct cxlkv_pool *pool, uint32_t id)
{
	struct cxlkv_node_opts no;
	struct cxlkv_node *n = NULL;

	memset(&no, 0, sizeof(no));
	no.size = sizeof(no);
	no.node = id;
	CHECK(cxlkv_node_attach(pool, &no, &n) == 0 && n != NULL);
	return n;
}

int main(void)
{
	char uri[128];
	struct cxlkv_format_opts fo;
	struct cxlkv_pool *pool = NULL;
	struct cxlkv_node *sn, *cn;
	struct cxlkv_rpc_server *srv = NULL;
	struct cxlkv_rpc_client *cli = NULL;
	struct cxlkv_rpc_server_opts so;
	struct cxlkv_rpc_client_opts co;
	int handled = 0;
	unsigned char req[100];
	uint64_t sum = 0, want = 0;
	uint32_t len = 0, i;
	int rc;

	snprintf(uri, sizeof(uri), "shm:cxlkv-test-rpc-c-%d:64M", (int)getpid());
	memset(&fo, 0, sizeof(fo));
	fo.size = sizeof(fo);
	fo.flags = CXLKV_FORMAT_F_FORCE;
	fo.max_nodes = 4;
	fo.max_locks = 256;
	fo.rpc_bytes = 2 * MiB;
	CHECK(cxlkv_pool_format(uri, &fo) == 0);
	CHECK(cxlkv_pool_open(uri, &pool) == 0);
	if (!pool)
		return 1;
	sn = attach(pool, 0);
	cn = attach(pool, 1);

	memset(&co, 0, sizeof(co));
	co.size = sizeof(co);
	co.ring = -1;
	CHECK_ERR(cxlkv_rpc_client_connect(cn, &co, &cli), -ECONNREFUSED);

	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.rings = 4;
	so.depth = 8;
	so.req_lines = 2;
	so.spin_rounds = 100;
	CHECK(cxlkv_rpc_server_create(sn, &so, &srv) == 0 && srv != NULL);
	CHECK(cxlkv_rpc_server_epoch(srv) >= 1);
	CHECK_ERR(cxlkv_rpc_server_handle(srv, OP_SUM, NULL, NULL), -EINVAL);
	CHECK(cxlkv_rpc_server_handle(srv, OP_SUM, sum_handler, &handled) == 0);
	CHECK(cxlkv_rpc_server_start(srv) == 0);

	CHECK(cxlkv_rpc_client_connect(cn, &co, &cli) == 0 && cli != NULL);
	CHECK(cxlkv_rpc_client_depth(cli) == 8);
	CHECK(cxlkv_rpc_client_request_max(cli) == 48 + 56);

	for (i = 0; i < sizeof(req); i++) {
		req[i] = (unsigned char)(i * 7);
		want += req[i];
	}
	rc = cxlkv_rpc_call(cli, OP_SUM, req, sizeof(req), &sum, sizeof(sum), &len, 0);
	CHECK(rc == (int)sizeof(req));
	CHECK(len == sizeof(sum) && sum == want);
	/* a reply larger than the caller's buffer: truncated, len says how long */
	sum = 0;
	CHECK(cxlkv_rpc_call(cli, OP_SUM, req, 4, &sum, 2, &len, 0) == 4);
	CHECK(len == sizeof(sum) && sum == ((req[0] + req[1] + req[2] + req[3]) & 0xffff));
	/* an unknown op is -EOPNOTSUPP */
	CHECK(cxlkv_rpc_call(cli, 77, NULL, 0, NULL, 0, NULL, 0) == -EOPNOTSUPP);
	CHECK_ERR(cxlkv_rpc_call(cli, OP_SUM, req, 200, &sum, sizeof(sum), &len, 0), -EMSGSIZE);
	CHECK_ERR(cxlkv_rpc_call(cli, OP_SUM, NULL, 5, NULL, 0, NULL, 0), -EINVAL);

	/* a batch: 8 requests, one submit, polled until all are in */
	{
		struct cxlkv_rpc_call calls[10];
		struct cxlkv_rpc_completion done[10];
		uint64_t sums[10], tickets[10];
		int got = 0, n;

		memset(calls, 0, sizeof(calls));
		for (i = 0; i < 10; i++) {
			calls[i].op = OP_SUM;
			calls[i].req = req;
			calls[i].req_len = i;
			calls[i].reply = &sums[i];
			calls[i].reply_cap = sizeof(sums[i]);
			calls[i].tag = (void *)(uintptr_t)i;
		}
		n = cxlkv_rpc_submit(cli, calls, 10, tickets);
		CHECK(n == 8); /* the ring holds 8 */
		CHECK_ERR(cxlkv_rpc_submit(cli, calls + 8, 2, tickets + 8), -EAGAIN);
		for (i = 0; i < 100000 && got < 8; i++) {
			int k, m = cxlkv_rpc_poll(cli, done + got, 10 - (size_t)got);

			CHECK(m >= 0);
			for (k = 0; m > 0 && k < m; k++) {
				uintptr_t t = (uintptr_t)done[got + k].tag;
				CHECK(done[got + k].status == (int32_t)t);
				CHECK(done[got + k].ticket == tickets[t]);
			}
			got += m > 0 ? m : 0;
			if (m == 0)
				usleep(10);
		}
		CHECK(got == 8);
	}

	cxlkv_rpc_client_close(cli);
	cxlkv_rpc_server_destroy(srv);
	CHECK(handled == 2 + 8);
	cxlkv_node_detach(sn);
	cxlkv_node_detach(cn);
	cxlkv_node_remove_local(pool, 0);
	cxlkv_node_remove_local(pool, 1);
	cxlkv_pool_close(pool);
	{
		char name[128];

		snprintf(name, sizeof(name), "/dev/shm/cxlkv-test-rpc-c-%d", (int)getpid());
		unlink(name);
	}
	if (failures)
		fprintf(stderr, "rpc_c_api_test: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
