/* SPDX-License-Identifier: MIT */
/*
 * The C API from C: format a file: pool, open it, carve, offsets <-> pointers,
 * gather/scatter round trip, and errors for bad input.  Exit 0 = pass.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"

#include "support/c_check.h"

#define MiB (1024ull * 1024ull)

static void test_format_open_carve(const char *uri)
{
	struct cxlkv_format_opts fo;
	struct cxlkv_pool *pool = NULL;
	struct cxlkv_carve_info info, list[8];
	int n;

	memset(&fo, 0, sizeof(fo));
	fo.size = sizeof(fo);
	fo.pool_size = 64 * MiB;
	fo.max_nodes = 4;
	CHECK(cxlkv_pool_format(uri, &fo) == 0);
	/* A second format without FORCE must not clobber the pool. */
	CHECK(cxlkv_pool_format(uri, &fo) == -EEXIST);
	CHECK(strstr(cxlkv_last_error(), uri) != NULL);

	CHECK(cxlkv_pool_open(uri, &pool) == 0);
	if (!pool)
		return;
	CHECK(cxlkv_pool_size(pool) == 64 * MiB);
	CHECK(cxlkv_pool_base(pool) != NULL);

	/* Standard carves are there, sorted, system, WB. */
	n = cxlkv_carve_list(pool, list, 8);
	CHECK(n == 4);
	CHECK(n == 4 && strcmp(list[0].name, "control") == 0 && strcmp(list[3].name, "kv") == 0);
	CHECK(cxlkv_carve_lookup(pool, "kv", &info) == 0 && info.memtype == 0 && (info.flags & 1));
	CHECK(cxlkv_carve_remove(pool, "kv") == -EPERM);
	CHECK(cxlkv_carve_remove_flags(pool, "kv", CXLKV_CARVE_RM_F_FORCE) == 0);
	CHECK(cxlkv_carve_lookup(pool, "kv", &info) == -ENOENT);

	/* The freed space takes a user carve, 2 MiB aligned. */
	CHECK(cxlkv_carve_create(pool, "scratch", 3 * MiB, 1 /* WC */, &info) == 0);
	CHECK(info.offset % (2 * MiB) == 0 && info.size == 4 * MiB && info.memtype == 1);
	CHECK(cxlkv_carve_create(pool, "scratch", 2 * MiB, 0, NULL) == -EEXIST);
	CHECK(cxlkv_carve_create(pool, "Bad Name", 2 * MiB, 0, NULL) == -EINVAL);
	CHECK(cxlkv_carve_create(pool, "big", 1024 * MiB, 0, NULL) == -ENOSPC);
	CHECK(cxlkv_carve_create(pool, "mt", 2 * MiB, 7, NULL) == -EINVAL);

	/* Offsets and pointers. */
	CHECK(cxlkv_off_to_ptr(pool, info.offset) == (char *)cxlkv_pool_base(pool) + info.offset);
	CHECK(cxlkv_ptr_to_off(pool, cxlkv_off_to_ptr(pool, info.offset)) == info.offset);
	CHECK(cxlkv_off_to_ptr(pool, 64 * MiB) == NULL);
	CHECK(cxlkv_ptr_to_off(pool, &fo) == CXLKV_BAD_OFFSET);

	cxlkv_pool_close(pool);
}

/* Three caller buffers -> one pool block -> three other buffers. */
static void test_gather_scatter(const char *uri)
{
	struct cxlkv_format_opts fo;
	struct cxlkv_pool *pool = NULL;
	struct cxlkv_carve_info kv;
	static char a[5000], b[64], c[70001], a2[5000], b2[64], c2[70001];
	struct cxlkv_chunk in[3] = {{a, sizeof(a)}, {b, sizeof(b)}, {c, sizeof(c)}};
	struct cxlkv_chunk out[3] = {{a2, sizeof(a2)}, {b2, sizeof(b2)}, {c2, sizeof(c2)}};
	struct cxlkv_chunk null_chunk = {NULL, 16};
	size_t i;

	memset(&fo, 0, sizeof(fo));
	fo.size = sizeof(fo);
	fo.pool_size = 64 * MiB;
	fo.flags = CXLKV_FORMAT_F_FORCE;
	CHECK(cxlkv_pool_format(uri, &fo) == 0);
	CHECK(cxlkv_pool_open(uri, &pool) == 0);
	if (!pool)
		return;
	CHECK(cxlkv_carve_lookup(pool, "kv", &kv) == 0);
	for (i = 0; i < sizeof(a); i++)
		a[i] = (char)(i * 7 + 1);
	memset(b, 0x42, sizeof(b));
	for (i = 0; i < sizeof(c); i++)
		c[i] = (char)(i ^ (i >> 8));

	/* An unaligned pool offset exercises the copy's head and tail. */
	CHECK(cxlkv_gather_write(pool, kv.offset + 3, in, 3) == 0);
	CHECK(memcmp((char *)cxlkv_off_to_ptr(pool, kv.offset + 3 + sizeof(a)), b, sizeof(b)) == 0);
	CHECK(cxlkv_scatter_read(pool, kv.offset + 3, out, 3) == 0);
	CHECK(memcmp(a, a2, sizeof(a)) == 0);
	CHECK(memcmp(b, b2, sizeof(b)) == 0);
	CHECK(memcmp(c, c2, sizeof(c)) == 0);

	/* Blocks past the end of the pool and bad chunk lists are refused. */
	CHECK(cxlkv_gather_write(pool, 64 * MiB - 100, in, 3) == -ERANGE);
	CHECK(strstr(cxlkv_last_error(), "outside the pool") != NULL);
	CHECK(cxlkv_scatter_read(pool, UINT64_MAX - 10, out, 3) == -ERANGE);
	CHECK(cxlkv_gather_write(pool, kv.offset, NULL, 2) == -EINVAL);
	CHECK(cxlkv_gather_write(pool, kv.offset, &null_chunk, 1) == -EINVAL);
	CHECK(cxlkv_gather_write(NULL, 0, in, 3) == -EINVAL);
	CHECK(cxlkv_gather_write(pool, kv.offset, in, 0) == 0);
	cxlkv_pool_close(pool);
}

/* FLAG NO_STANDARD: the superblock only; the whole pool is free for carves. */
static void test_superblock_only(const char *uri)
{
	struct cxlkv_format_opts fo;
	struct cxlkv_pool *pool = NULL;
	struct cxlkv_carve_info info;

	memset(&fo, 0, sizeof(fo));
	fo.size = sizeof(fo);
	fo.pool_size = 16 * MiB;
	fo.flags = CXLKV_FORMAT_F_FORCE | CXLKV_FORMAT_F_NO_STANDARD;
	CHECK(cxlkv_pool_format(uri, &fo) == 0);
	CHECK(cxlkv_pool_open(uri, &pool) == 0);
	if (!pool)
		return;
	CHECK(cxlkv_carve_list(pool, NULL, 0) == 0);
	CHECK(cxlkv_carve_create(pool, "all", 14 * MiB, 2 /* UC */, &info) == 0);
	CHECK(info.offset == 2 * MiB && info.memtype == 2);
	fo.flags = 1u << 7;
	CHECK(cxlkv_pool_format(uri, &fo) == -EINVAL);
	cxlkv_pool_close(pool);
}

static void *fail_on_another_thread(void *arg)
{
	struct cxlkv_pool *pool;

	(void)arg;
	return (void *)(long)cxlkv_pool_open("other-thread-bad-uri", &pool);
}

/* cxlkv_last_error() is per thread: another thread's failure leaves ours. */
static void test_last_error_is_per_thread(void)
{
	struct cxlkv_pool *pool;
	pthread_t t;
	void *rc = NULL;

	CHECK(cxlkv_pool_open("main-thread-bad-uri", &pool) == -EINVAL);
	CHECK(pthread_create(&t, NULL, fail_on_another_thread, NULL) == 0);
	CHECK(pthread_join(t, &rc) == 0);
	CHECK((long)rc == -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "main-thread-bad-uri") != NULL);
}

static void test_bad_input(const char *uri)
{
	struct cxlkv_pool *pool = (struct cxlkv_pool *)1;
	struct cxlkv_format_opts tiny;

	CHECK(cxlkv_pool_open("nonsense", &pool) == -EINVAL && pool == NULL);
	CHECK(strstr(cxlkv_last_error(), "nonsense") != NULL);
	CHECK(cxlkv_pool_open("file:/nonexistent/cxlkv-pool", &pool) == -ENOENT);
	CHECK(cxlkv_pool_open(NULL, &pool) == -EINVAL);
	CHECK(cxlkv_pool_open("dev:/dev/cxlkv99", &pool) < 0);
	CHECK(cxlkv_carve_lookup(NULL, "kv", NULL) == -EINVAL);
	CHECK(cxlkv_carve_list(NULL, NULL, 0) == -EINVAL);
	memset(&tiny, 0, sizeof(tiny));
	tiny.size = 4; /* smaller than any struct cxlkv_format_opts */
	CHECK(cxlkv_pool_format(uri, &tiny) == -EINVAL);
	/* NULL pools are harmless where nothing can be reported. */
	cxlkv_pool_close(NULL);
	CHECK(cxlkv_pool_base(NULL) == NULL && cxlkv_pool_size(NULL) == 0);
}

int main(void)
{
	char path[128], uri[160];

	snprintf(path, sizeof(path), "/tmp/cxlkv-c-api-test-%d", (int)getpid());
	snprintf(uri, sizeof(uri), "file:%s", path);
	unlink(path);
	test_format_open_carve(uri);
	test_gather_scatter(uri);
	test_superblock_only(uri);
	test_bad_input(uri);
	test_last_error_is_per_thread();
	unlink(path);
	if (failures) {
		fprintf(stderr, "c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("c_api_test: pass\n");
	return 0;
}
