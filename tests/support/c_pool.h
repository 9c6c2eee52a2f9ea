/* SPDX-License-Identifier: MIT */
/*
 * The pool the C test programs (tests/unit/capi/NAME_test.c) run against,
 * set up as a user of the public C API would: a shm pool formatted for 4
 * nodes, opened, its lock manager started on node 0 and, when asked, a KV
 * handle on node 1 (and, in the index-service runs, the service on node 3
 * that owns the index).  c_pool_close takes it all down again and removes
 * the files the program created.  Failed steps are counted by CHECK
 * (support/c_check.h) and leave their handle NULL.
 */
#ifndef CXLKV_TESTS_C_POOL_H
#define CXLKV_TESTS_C_POOL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"
#include "cxlkv/cxlkv_rpc.h"

#include "support/c_check.h"

/* c_pool_open flags. */
#define C_POOL_KV 1u /* open a KV handle on node C_POOL_KV_NODE */
/* In the runs CTest names *_service_c (CXLKV_TEST_INDEX_SERVICE set; docs/rpc.md
 * "The index service"): format with the service's carve and start the service
 * on node C_POOL_SERVICE_NODE before the KV handle opens, so the store's calls
 * go through it. */
#define C_POOL_INDEX_SERVICE_FROM_ENV 2u

#define C_POOL_KV_NODE 1u
#define C_POOL_SERVICE_NODE 3u

struct c_pool {
	char uri[128];  /* shm:NAME:SIZE */
	char path[128]; /* /dev/shm/NAME, removed at close */
	struct cxlkv_pool *pool;
	struct cxlkv_lock_manager *mgr;
	struct cxlkv_index_service *svc;
	struct cxlkv_kv *kv;
	unsigned flags;
};

/* Formats and opens shm:PREFIX-PID:SIZE and starts what `flags` ask for.
 * 0, or -1 when the pool could not be opened (its file is removed then and
 * the program should exit 1). */
static inline int c_pool_open(struct c_pool *p, const char *prefix, uint64_t size, unsigned flags)
{
	char name[96];
	struct cxlkv_format_opts fo;
	struct cxlkv_lock_manager_opts mo;
	struct cxlkv_kv_opts ko;
	const int service = (flags & C_POOL_INDEX_SERVICE_FROM_ENV) && getenv("CXLKV_TEST_INDEX_SERVICE");

	memset(p, 0, sizeof(*p));
	p->flags = flags;
	snprintf(name, sizeof(name), "%s-%d", prefix, (int)getpid());
	snprintf(p->uri, sizeof(p->uri), "shm:%s:%llu", name, (unsigned long long)size);
	snprintf(p->path, sizeof(p->path), "/dev/shm/%s", name);
	memset(&fo, 0, sizeof(fo));
	fo.size = sizeof(fo);
	fo.max_nodes = 4;
	if (service)
		fo.flags |= CXLKV_FORMAT_F_INDEX_SERVICE;
	CHECK(cxlkv_pool_format(p->uri, &fo) == 0);
	CHECK(cxlkv_pool_open(p->uri, &p->pool) == 0);
	if (!p->pool) {
		unlink(p->path);
		return -1;
	}
	memset(&mo, 0, sizeof(mo));
	mo.size = sizeof(mo);
	mo.node = 0;
	CHECK(cxlkv_lock_manager_start(p->pool, &mo, &p->mgr) == 0 && p->mgr != NULL);
	if (service)
		CHECK(cxlkv_index_service_start(p->pool, C_POOL_SERVICE_NODE, &p->svc) == 0 && p->svc != NULL);
	if (flags & C_POOL_KV) {
		memset(&ko, 0, sizeof(ko));
		ko.size = sizeof(ko);
		ko.node = C_POOL_KV_NODE;
		CHECK(cxlkv_kv_open(p->pool, &ko, &p->kv) == 0 && p->kv != NULL);
	}
	return 0;
}

/* Closes the KV handle, stops the index service and the lock manager, and
 * removes the node-local files of the nodes this program created (the KV
 * handle's, the service's); the pool stays open.  A second call does nothing.
 * Handles the program opened on top (GPU handles, nodes) go first. */
static inline void c_pool_stop(struct c_pool *p)
{
	if (!p->pool)
		return;
	cxlkv_kv_close(p->kv);
	p->kv = NULL;
	cxlkv_index_service_stop(p->svc);
	if (p->svc)
		cxlkv_node_remove_local(p->pool, C_POOL_SERVICE_NODE);
	p->svc = NULL;
	cxlkv_lock_manager_stop(p->mgr);
	p->mgr = NULL;
	if (p->flags & C_POOL_KV)
		cxlkv_node_remove_local(p->pool, C_POOL_KV_NODE);
	p->flags &= ~C_POOL_KV;
}

/* c_pool_stop, then the pool closed and its file removed. */
static inline void c_pool_close(struct c_pool *p)
{
	c_pool_stop(p);
	cxlkv_pool_close(p->pool);
	p->pool = NULL;
	unlink(p->path);
}

#endif /* CXLKV_TESTS_C_POOL_H */
