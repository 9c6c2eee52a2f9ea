/* SPDX-License-Identifier: MIT */
/*
 * The sync part of the C API from C, as a user would drive it: format a shm
 * pool, start the in-process lock manager, attach nodes, lock / unlock /
 * try-lock, allocate and free from the kv carve, named roots, and errors for
 * bad input.  Exit 0 = pass.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"

#include "support/c_check.h"
#include "support/c_pool.h"

#define MiB (1024ull * 1024ull)
#define POOL_SIZE (64 * MiB)
#define USER_LOCK 200u /* >= CXLKV_LOCK_FIRST_USER */
#define MS 1000000ull

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

/* Two nodes contend for one lock; the waiter times out, then gets it. */
static void test_locks(struct cxlkv_node *a, struct cxlkv_node *b)
{
	CHECK(cxlkv_lock_acquire(a, USER_LOCK) == 0);
	CHECK_ERR(cxlkv_lock_acquire_timeout(b, USER_LOCK, 20 * MS), -ETIMEDOUT);
	CHECK(cxlkv_lock_release(a, USER_LOCK) == 0);
	CHECK(cxlkv_lock_acquire_timeout(b, USER_LOCK, 5000 * MS) == 0);
	/* A lock another node holds is not ours to release. */
	CHECK_ERR(cxlkv_lock_release(a, USER_LOCK), -EPERM);
	CHECK(cxlkv_lock_release(b, USER_LOCK) == 0);
	/* Released twice: refused, not a crash. */
	CHECK_ERR(cxlkv_lock_release(b, USER_LOCK), -EPERM);
	/* Repeated acquire/release cycles keep working (tickets advance). */
	for (int i = 0; i < 50; i++) {
		CHECK(cxlkv_lock_acquire(i & 1 ? a : b, USER_LOCK + 1) == 0);
		CHECK(cxlkv_lock_release(i & 1 ? a : b, USER_LOCK + 1) == 0);
	}
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

#define NALLOC 64
static void test_alloc(struct cxlkv_pool *pool, struct cxlkv_node *a, struct cxlkv_node *b)
{
	struct cxlkv_carve_info kv;
	struct cxlkv_heap_stats st;
	uint64_t offs[NALLOC], sorted[NALLOC], size = 1000, off = 0;
	uint64_t *big = NULL;
	size_t nbig = 0, cap = 0;
	int i, rc;

	CHECK(cxlkv_carve_lookup(pool, "kv", &kv) == 0);
	for (i = 0; i < NALLOC; i++) {
		offs[i] = CXLKV_BAD_OFFSET;
		CHECK(cxlkv_alloc(a, size, &offs[i]) == 0);
		/* In the kv carve, 64 B aligned, and the whole block fits. */
		CHECK(offs[i] % 64 == 0);
		CHECK(offs[i] >= kv.offset && offs[i] + size <= kv.offset + kv.size);
		/* Writable through the pool mapping. */
		if (offs[i] != CXLKV_BAD_OFFSET)
			memset(cxlkv_off_to_ptr(pool, offs[i]), i, size);
	}
	/* Distinct and not overlapping. */
	memcpy(sorted, offs, sizeof(offs));
	qsort(sorted, NALLOC, sizeof(sorted[0]), cmp_u64);
	for (i = 1; i < NALLOC; i++)
		CHECK(sorted[i] >= sorted[i - 1] + size);
	/* Nobody overwrote anybody: each block still holds its own byte. */
	for (i = 0; i < NALLOC; i++) {
		const unsigned char *p = cxlkv_off_to_ptr(pool, offs[i]);
		CHECK(p && p[0] == (unsigned char)i && p[size - 1] == (unsigned char)i);
	}
	CHECK(cxlkv_heap_stats(a, &st) == 0);
	CHECK(st.allocs >= NALLOC && st.bytes_in_use >= NALLOC * size);

	/* Free half locally, half from another node (remote free). */
	for (i = 0; i < NALLOC; i++)
		CHECK(cxlkv_free(i & 1 ? b : a, offs[i]) == 0);
	CHECK(cxlkv_heap_stats(a, &st) == 0);
	CHECK(st.frees >= NALLOC / 2);
	CHECK(cxlkv_heap_stats(b, &st) == 0);
	CHECK(st.remote_frees_sent >= NALLOC / 2);

	/* Exhaustion: big blocks until the carve is full -> -ENOSPC + message. */
	for (;;) {
		if (nbig == cap) {
			cap = cap ? 2 * cap : 64;
			big = realloc(big, cap * sizeof(*big));
			if (!big)
				abort();
		}
		rc = cxlkv_alloc(a, MiB, &off);
		if (rc < 0)
			break;
		big[nbig++] = off;
		if (nbig > 2 * POOL_SIZE / MiB)
			break; /* more than the pool holds: a bug, caught below */
	}
	CHECK(rc == -ENOSPC);
	CHECK(cxlkv_last_error()[0] != '\0');
	CHECK(nbig > 0 && nbig * MiB <= kv.size);
	CHECK(cxlkv_heap_stats(a, &st) == 0 && st.enospc >= 1);
	/* Freeing makes the space usable again. */
	for (size_t k = 0; k < nbig; k++)
		CHECK(cxlkv_free(a, big[k]) == 0);
	CHECK(cxlkv_alloc(a, MiB, &off) == 0);
	CHECK(cxlkv_free(a, off) == 0);
	free(big);

	/* An impossible size fails cleanly. */
	CHECK(cxlkv_alloc(a, UINT64_MAX, &off) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
	/* Offsets that were never allocated are refused, not corrupting. */
	CHECK(cxlkv_free(a, POOL_SIZE + 4096) < 0);
	CHECK(cxlkv_free(a, 0) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
	CHECK(cxlkv_alloc(a, 128, &off) == 0);
	CHECK(cxlkv_free(a, off) == 0);
}

static void test_objects(struct cxlkv_node *a, struct cxlkv_node *b)
{
	char longname[64];
	uint64_t off = 0;

	CHECK(cxlkv_obj_put(a, "model/llama-70b/root", 4096) == 0);
	/* Another node sees it. */
	CHECK(cxlkv_obj_get(b, "model/llama-70b/root", &off) == 0 && off == 4096);
	CHECK_ERR(cxlkv_obj_get(b, "no-such-object", &off), -ENOENT);
	CHECK(strstr(cxlkv_last_error(), "no-such-object") != NULL);
	CHECK(cxlkv_obj_destroy(b, "model/llama-70b/root") == 0);
	CHECK_ERR(cxlkv_obj_get(a, "model/llama-70b/root", &off), -ENOENT);
	CHECK(cxlkv_obj_destroy(a, "model/llama-70b/root") < 0);
	/* Names: 1..40 bytes. */
	CHECK_ERR(cxlkv_obj_put(a, "", 64), -EINVAL);
	memset(longname, 'x', 41);
	longname[41] = '\0';
	CHECK(cxlkv_obj_put(a, longname, 64) < 0);
	longname[40] = '\0';
	CHECK(cxlkv_obj_put(a, longname, 64) == 0);
	CHECK(cxlkv_obj_get(a, longname, &off) == 0 && off == 64);
	CHECK(cxlkv_obj_destroy(a, longname) == 0);
}

static void test_bad_input(struct cxlkv_pool *pool, struct cxlkv_node *a)
{
	struct cxlkv_node_opts no;
	struct cxlkv_node *n = NULL;
	struct cxlkv_lock_manager *m = NULL;
	struct cxlkv_heap_stats st;
	uint64_t off;

	memset(&no, 0, sizeof(no));
	no.size = sizeof(no);
	CHECK_ERR(cxlkv_node_attach(NULL, &no, &n), -EINVAL);
	CHECK_ERR(cxlkv_node_attach(pool, NULL, &n), -EINVAL);
	CHECK_ERR(cxlkv_node_attach(pool, &no, NULL), -EINVAL);
	no.node = 4; /* max_nodes 4 */
	CHECK_ERR(cxlkv_node_attach(pool, &no, &n), -EINVAL);
	no.node = 1000000;
	CHECK_ERR(cxlkv_node_attach(pool, &no, &n), -EINVAL);
	/* The options carry their size: 0 (never set) and flags this library
	 * does not know are refused, not read as defaults. */
	no.node = 2;
	no.size = 0;
	CHECK_ERR(cxlkv_node_attach(pool, &no, &n), -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "opts->size 0") != NULL);
	no.size = sizeof(no);
	no.flags = 1u << 7;
	CHECK_ERR(cxlkv_node_attach(pool, &no, &n), -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "unknown flags 128") != NULL);
	no.flags = 0;
	CHECK_ERR(cxlkv_lock_manager_start(NULL, NULL, &m), -EINVAL);
	CHECK_ERR(cxlkv_lock_manager_start(pool, NULL, NULL), -EINVAL);

	CHECK_ERR(cxlkv_lock_acquire(NULL, USER_LOCK), -EINVAL);
	/* Errors name the C function, not a C++ lambda ("operator()"). */
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_lock_acquire:", 19) == 0);
	CHECK_ERR(cxlkv_lock_acquire_timeout(NULL, USER_LOCK, MS), -EINVAL);
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_lock_acquire_timeout:", 27) == 0);
	CHECK_ERR(cxlkv_node_remove_local(NULL, 0), -EINVAL);
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_node_remove_local:", 24) == 0);
	CHECK_ERR(cxlkv_node_remove_local(pool, 4), -EINVAL); /* max_nodes 4 */
	CHECK_ERR(cxlkv_lock_release(NULL, USER_LOCK), -EINVAL);
	/* max_locks defaults to 1024. */
	CHECK_ERR(cxlkv_lock_acquire(a, 1024), -EINVAL);
	/* Ids below CXLKV_LOCK_FIRST_USER are cxlkv's own (index stripes, ...). */
	CHECK_ERR(cxlkv_lock_acquire(a, 72), -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "reserved") != NULL);
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_lock_acquire:", 19) == 0);
	CHECK_ERR(cxlkv_lock_acquire_timeout(a, 0, MS), -EINVAL);
	CHECK_ERR(cxlkv_lock_release(a, 127), -EINVAL); /* CXLKV_LOCK_FIRST_USER - 1 */
	CHECK_ERR(cxlkv_lock_acquire(a, UINT32_MAX), -EINVAL);
	CHECK_ERR(cxlkv_lock_acquire_timeout(a, UINT32_MAX, MS), -EINVAL);
	CHECK(cxlkv_lock_release(a, UINT32_MAX) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');

	CHECK_ERR(cxlkv_alloc(NULL, 64, &off), -EINVAL);
	CHECK_ERR(cxlkv_alloc(a, 64, NULL), -EINVAL);
	CHECK_ERR(cxlkv_free(NULL, 0), -EINVAL);
	CHECK_ERR(cxlkv_heap_stats(NULL, &st), -EINVAL);
	CHECK_ERR(cxlkv_heap_stats(a, NULL), -EINVAL);
	CHECK_ERR(cxlkv_obj_put(NULL, "x", 0), -EINVAL);
	CHECK_ERR(cxlkv_obj_put(a, NULL, 0), -EINVAL);
	CHECK_ERR(cxlkv_obj_get(a, "x", NULL), -EINVAL);
	CHECK_ERR(cxlkv_obj_get(NULL, "x", &off), -EINVAL);
	CHECK_ERR(cxlkv_obj_destroy(a, NULL), -EINVAL);
	/* A block of no bytes, and a root outside the pool (the offset
	 * UINT64_MAX wrapped a reader's base + offset). */
	CHECK_ERR(cxlkv_alloc(a, 0, &off), -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "an allocation of 0 bytes") != NULL);
	CHECK_ERR(cxlkv_obj_put(a, "x", UINT64_MAX), -ERANGE);
	CHECK(strstr(cxlkv_last_error(), "object 'x': offset 18446744073709551615 is outside the pool") != NULL);
	CHECK_ERR(cxlkv_obj_put(a, "x", POOL_SIZE), -ERANGE);
	CHECK_ERR(cxlkv_obj_get(a, "x", &off), -ENOENT);
	/* NULL handles are harmless where nothing can be reported. */
	cxlkv_node_detach(NULL);
	cxlkv_lock_manager_stop(NULL);
}

int main(void)
{
	struct c_pool p;
	struct cxlkv_pool *pool;
	struct cxlkv_lock_manager_opts mo;
	struct cxlkv_lock_manager *mgr2 = NULL;
	struct cxlkv_node *a, *b;

	/* The pool and its lock manager on node 0; no KV handle. */
	if (c_pool_open(&p, "cxlkv-sync-c-api-test", POOL_SIZE, 0) != 0)
		return 1;
	pool = p.pool;
	/* One manager per pool: a second one is refused while the lease is held. */
	memset(&mo, 0, sizeof(mo));
	mo.size = sizeof(mo);
	mo.node = 0;
	CHECK_ERR(cxlkv_lock_manager_start(pool, &mo, &mgr2), -EBUSY);

	a = attach(pool, 0);
	b = attach(pool, 1);
	if (a && b) {
		test_locks(a, b);
		test_alloc(pool, a, b);
		test_objects(a, b);
		test_bad_input(pool, a);
	}
	cxlkv_node_detach(b);
	cxlkv_node_detach(a);
	c_pool_stop(&p);
	/* Remove what this program created; a second removal finds nothing and is fine. */
	CHECK(cxlkv_node_remove_local(pool, 0) == 0);
	CHECK(cxlkv_node_remove_local(pool, 1) == 0);
	CHECK(cxlkv_node_remove_local(pool, 1) == 0);
	c_pool_close(&p);
	if (failures) {
		fprintf(stderr, "sync_c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("sync_c_api_test: pass\n");
	return 0;
}
