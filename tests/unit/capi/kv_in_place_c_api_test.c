/* SPDX-License-Identifier: MIT */
/*
 * Reserved blocks written in place from C (cxlkv.h, "Reserved blocks written
 * in place"; docs/remote.md "Straight from the pool"): reserve a chain, ask
 * where the blocks' bytes lie, write them there with ordinary stores (as a
 * transfer engine's receive does), flush, publish; the bytes read back are
 * those written.  Handles that are not reserved get no address; bad
 * arguments refuse the call.  And the remote tier's counter call
 * (cxlkv_kv_remote_count): a known name counts, an unknown one is refused.
 * Exit 0 = pass.
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
#define BLOCK 8192
#define N 4

static unsigned char want[N][BLOCK];

int main(void)
{
	struct c_pool p;
	struct cxlkv_pool *pool;
	struct cxlkv_kv *kv;
	struct cxlkv_kv_key keys[N];
	struct cxlkv_kv_block blocks[N];
	void *addrs[N];
	int32_t st[N];

	if (c_pool_open(&p, "cxlkv-kv-in-place-c-api-test", POOL_SIZE, C_POOL_KV) != 0)
		return 1;
	pool = p.pool;
	kv = p.kv;
	for (int b = 0; b < N; b++) {
		keys[b].lo = 0x1000 + (uint64_t)b;
		keys[b].hi = 0xabcdef;
		for (int i = 0; i < BLOCK; i++)
			want[b][i] = (unsigned char)(b * 31 + i * 7 + 1);
	}

	/* Reserve, hand out, write in place, flush, publish. */
	CHECK(cxlkv_kv_reserve_chain(kv, NULL, keys, N, BLOCK, blocks, st) == N);
	CHECK(cxlkv_kv_reserved_addrs(kv, blocks, N, addrs, st) == N);
	for (int b = 0; b < N; b++) {
		CHECK(st[b] == 0 && addrs[b] != NULL);
		if (addrs[b])
			memcpy(addrs[b], want[b], BLOCK); /* ordinary stores, as a socket receive writes */
	}
	CHECK(cxlkv_kv_flush_in_place(kv, blocks, N, st) == N);
	CHECK(cxlkv_kv_publish_many(kv, blocks, N, st) == N);
	CHECK(cxlkv_kv_lookup(kv, keys, N) == N);
	{
		static unsigned char got[N][BLOCK];
		struct cxlkv_chunk out[N];
		uint32_t one[N] = {1, 1, 1, 1};

		for (int b = 0; b < N; b++) {
			out[b].addr = got[b];
			out[b].len = BLOCK;
		}
		CHECK(cxlkv_kv_get_many(kv, keys, N, out, one, st) == N);
		for (int b = 0; b < N; b++)
			CHECK(st[b] == 0 && memcmp(got[b], want[b], BLOCK) == 0);
	}

	/* Handles that are not reservations (the chain exists now) get no address. */
	{
		struct cxlkv_kv_block again[N];
		int32_t rst[N];

		CHECK(cxlkv_kv_reserve_chain(kv, NULL, keys, N, BLOCK, again, rst) == N);
		for (int b = 0; b < N; b++)
			CHECK(rst[b] == CXLKV_KV_EXISTS);
		CHECK(cxlkv_kv_reserved_addrs(kv, again, N, addrs, st) == 0);
		for (int b = 0; b < N; b++)
			CHECK(st[b] == CXLKV_KV_EXISTS && addrs[b] == NULL);
		CHECK(cxlkv_kv_flush_in_place(kv, again, N, st) == 0);
	}

	/* Bad arguments refuse the call. */
	CHECK_ERR(cxlkv_kv_reserved_addrs(NULL, blocks, N, addrs, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_reserved_addrs(kv, blocks, N, NULL, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_flush_in_place(kv, NULL, N, st), -EINVAL);

	/* The remote tier's counters (docs/remote.md "Counters"). */
	CHECK(cxlkv_kv_remote_count(kv, "hit_blocks", 3) == 0);
	CHECK_ERR(cxlkv_kv_remote_count(kv, "no_such_counter", 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_remote_count(kv, NULL, 1), -EINVAL);
	{
		int n = cxlkv_stats_prometheus(pool, NULL, 0);
		char *text = n > 0 ? malloc((size_t)n + 1) : NULL;

		CHECK(text != NULL);
		if (text) {
			CHECK(cxlkv_stats_prometheus(pool, text, (size_t)n + 1) == n);
			CHECK(strstr(text, "cxlkv_remote_hit_blocks_total{node=\"1\"} 3\n") != NULL);
			free(text);
		}
	}

	c_pool_close(&p);
	if (failures)
		fprintf(stderr, "%d check(s) failed\n", failures);
	return failures ? 1 : 0;
}
