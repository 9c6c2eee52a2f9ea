/* SPDX-License-Identifier: MIT */
/*
 * The KV-store part of the C API from C, as an inference engine would drive
 * it: chained block keys for a prompt, reserve -> write -> publish, longest
 * cached prefix, pin -> fetch -> unpin, counters, and errors for bad input.
 * Exit 0 = pass.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"
#include "cxlkv/cxlkv_rpc.h"

#include "support/c_check.h"
#include "support/c_pool.h"

#define MiB (1024ull * 1024ull)
#define POOL_SIZE (64 * MiB)
#define BLOCK_TOKENS 16
#define NTOKENS (5 * BLOCK_TOKENS + 7) /* 5 full blocks and a partial one */
#define NBLOCKS 5
#define PUBLISHED 3
/* A block's payload comes from two engine buffers (K and V halves). */
#define HALF 6000
#define BLOCK_BYTES (2 * HALF)

static unsigned char kbuf[NBLOCKS][HALF], vbuf[NBLOCKS][HALF];

static void fill(int blk)
{
	for (int i = 0; i < HALF; i++) {
		kbuf[blk][i] = (unsigned char)(blk * 31 + i);
		vbuf[blk][i] = (unsigned char)(blk * 17 + (i >> 3) + 5);
	}
}

static void test_block_keys(const uint32_t *tokens, struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_key again[8], other[8], salted[8];
	uint32_t changed[NTOKENS];
	const char salt[] = "model-a";

	CHECK(cxlkv_kv_block_keys(tokens, NTOKENS, BLOCK_TOKENS, NULL, 0, keys, 8) == NBLOCKS);
	/* Deterministic, all distinct. */
	CHECK(cxlkv_kv_block_keys(tokens, NTOKENS, BLOCK_TOKENS, NULL, 0, again, 8) == NBLOCKS);
	CHECK(memcmp(keys, again, NBLOCKS * sizeof(keys[0])) == 0);
	for (int i = 0; i < NBLOCKS; i++)
		for (int j = i + 1; j < NBLOCKS; j++)
			CHECK(keys[i].lo != keys[j].lo || keys[i].hi != keys[j].hi);
	/* max bounds the output: the first keys only. */
	memset(again, 0, sizeof(again));
	CHECK(cxlkv_kv_block_keys(tokens, NTOKENS, BLOCK_TOKENS, NULL, 0, again, 2) == 2);
	CHECK(memcmp(keys, again, 2 * sizeof(keys[0])) == 0 && again[2].lo == 0 && again[2].hi == 0);
	/* Chained: changing a token of block 1 changes the keys of blocks 1.. but not 0. */
	memcpy(changed, tokens, sizeof(changed));
	changed[BLOCK_TOKENS + 3] ^= 1;
	CHECK(cxlkv_kv_block_keys(changed, NTOKENS, BLOCK_TOKENS, NULL, 0, other, 8) == NBLOCKS);
	CHECK(memcmp(&keys[0], &other[0], sizeof(keys[0])) == 0);
	for (int i = 1; i < NBLOCKS; i++)
		CHECK(memcmp(&keys[i], &other[i], sizeof(keys[0])) != 0);
	/* Extras (model id, salt) give another chain. */
	CHECK(cxlkv_kv_block_keys(tokens, NTOKENS, BLOCK_TOKENS, salt, sizeof(salt), salted, 8) == NBLOCKS);
	CHECK(memcmp(&keys[0], &salted[0], sizeof(keys[0])) != 0);
	/* Fewer tokens than a block: no keys. */
	CHECK(cxlkv_kv_block_keys(tokens, BLOCK_TOKENS - 1, BLOCK_TOKENS, NULL, 0, other, 8) == 0);
	CHECK(cxlkv_kv_block_keys(tokens, 0, BLOCK_TOKENS, NULL, 0, other, 8) == 0);
}

/* reserve -> write -> publish for blocks [0, n). */
static void publish_blocks(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, int n)
{
	for (int i = 0; i < n; i++) {
		struct cxlkv_kv_block res;
		struct cxlkv_chunk chunks[2] = {{kbuf[i], HALF}, {vbuf[i], HALF}};

		fill(i);
		CHECK(cxlkv_kv_reserve(kv, &keys[i], i ? &keys[i - 1] : NULL, BLOCK_BYTES, &res) ==
		      CXLKV_KV_RESERVED);
		CHECK(res.status == CXLKV_KV_RESERVED && res.length >= BLOCK_BYTES);
		CHECK(memcmp(&res.key, &keys[i], sizeof(keys[i])) == 0);
		CHECK(cxlkv_kv_write(kv, &res, chunks, 2) == 0);
		CHECK(cxlkv_kv_publish(kv, &res) == 0);
	}
}

static void test_write_read(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_stats s0, s1;
	struct cxlkv_kv_block pin, res;
	struct cxlkv_kv_key unknown[3] = {{1, 2}, {3, 4}, {5, 6}};
	static unsigned char k2[HALF], v2[HALF];
	struct cxlkv_chunk out[2] = {{k2, HALF}, {v2, HALF}};
	struct cxlkv_chunk in[2];

	memset(&s0, 0, sizeof(s0));
	s0.size = sizeof(s0);
	CHECK(cxlkv_kv_stats(kv, &s0) == 0 && s0.size == sizeof(s0));

	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == 0);
	publish_blocks(kv, keys, PUBLISHED);
	/* The longest cached prefix of the chain, never past the first miss. */
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED);
	CHECK(cxlkv_kv_lookup(kv, keys, 2) == 2);
	CHECK(cxlkv_kv_lookup(kv, keys + 1, NBLOCKS - 1) == PUBLISHED - 1);
	CHECK(cxlkv_kv_lookup(kv, unknown, 3) == 0);
	CHECK(cxlkv_kv_lookup(kv, keys, 0) == 0);

	/* Every published block reads back byte for byte. */
	for (int i = 0; i < PUBLISHED; i++) {
		memset(k2, 0, sizeof(k2));
		memset(v2, 0, sizeof(v2));
		CHECK(cxlkv_kv_pin(kv, &keys[i], &pin) == 0);
		CHECK(pin.length == BLOCK_BYTES);
		CHECK(cxlkv_kv_fetch(kv, &pin, out, 2) == 0);
		CHECK(memcmp(k2, kbuf[i], HALF) == 0 && memcmp(v2, vbuf[i], HALF) == 0);
		CHECK(cxlkv_kv_unpin(kv, &pin) == 0);
	}
	/* A block of the chain that was never published is not pinnable. */
	CHECK_ERR(cxlkv_kv_pin(kv, &keys[PUBLISHED], &pin), -ENOENT);
	CHECK_ERR(cxlkv_kv_pin(kv, &unknown[0], &pin), -ENOENT);

	memset(&s1, 0, sizeof(s1));
	s1.size = sizeof(s1);
	CHECK(cxlkv_kv_stats(kv, &s1) == 0);
	CHECK(s1.reserves == s0.reserves + PUBLISHED);
	CHECK(s1.publishes == s0.publishes + PUBLISHED);
	CHECK(s1.fetches == s0.fetches + PUBLISHED);
	CHECK(s1.bytes_in == s0.bytes_in + PUBLISHED * BLOCK_BYTES);
	CHECK(s1.bytes_out == s0.bytes_out + PUBLISHED * BLOCK_BYTES);
	CHECK(s1.lookups >= s0.lookups + 6);
	CHECK(s1.hit_blocks >= s0.hit_blocks + PUBLISHED + 2 + PUBLISHED - 1);
	CHECK(s1.miss_blocks >= s0.miss_blocks + NBLOCKS + (NBLOCKS - PUBLISHED) + 3);

	/* The same block again: reserve says EXISTS, and that reservation
	 * cannot write or publish a second copy. */
	fill(0);
	in[0].addr = kbuf[0];
	in[0].len = HALF;
	in[1].addr = vbuf[0];
	in[1].len = HALF;
	CHECK(cxlkv_kv_reserve(kv, &keys[0], NULL, BLOCK_BYTES, &res) == CXLKV_KV_EXISTS);
	CHECK(res.status == CXLKV_KV_EXISTS);
	CHECK(cxlkv_kv_write(kv, &res, in, 2) < 0);
	CHECK(cxlkv_kv_publish(kv, &res) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
	/* Aborting a reservation we do not own leaves the cached block alone. */
	CHECK(cxlkv_kv_abort(kv, &res) == 0);
	CHECK(cxlkv_kv_stats(kv, &s0) == 0);
	CHECK(s0.publishes == s1.publishes && s0.bytes_in == s1.bytes_in);
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED);

	/* An aborted reservation leaves nothing behind and can be redone. */
	fill(PUBLISHED);
	in[0].addr = kbuf[PUBLISHED];
	in[1].addr = vbuf[PUBLISHED];
	CHECK(cxlkv_kv_reserve(kv, &keys[PUBLISHED], &keys[PUBLISHED - 1], BLOCK_BYTES, &res) ==
	      CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_abort(kv, &res) == 0);
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED);
	CHECK(cxlkv_kv_reserve(kv, &keys[PUBLISHED], &keys[PUBLISHED - 1], BLOCK_BYTES, &res) ==
	      CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_write(kv, &res, in, 2) == 0);
	CHECK(cxlkv_kv_publish(kv, &res) == 0);
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED + 1);

	/* A child whose parent is not cached is refused. */
	CHECK_ERR(cxlkv_kv_reserve(kv, &unknown[1], &unknown[0], BLOCK_BYTES, &res), -ENOENT);
}

static void test_bad_input(struct cxlkv_pool *pool, struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_opts ko;
	struct cxlkv_kv *kv2 = NULL;
	struct cxlkv_kv_block res, pin;
	struct cxlkv_kv_stats st;
	struct cxlkv_kv_key out[4];
	uint32_t tokens[BLOCK_TOKENS] = {0};
	unsigned char small[100];
	struct cxlkv_chunk short_chunk = {small, sizeof(small)};
	struct cxlkv_chunk null_chunk = {NULL, BLOCK_BYTES};

	memset(&ko, 0, sizeof(ko));
	ko.size = sizeof(ko);
	CHECK_ERR(cxlkv_kv_open(NULL, &ko, &kv2), -EINVAL);
	CHECK_ERR(cxlkv_kv_open(pool, NULL, &kv2), -EINVAL);
	CHECK_ERR(cxlkv_kv_open(pool, &ko, NULL), -EINVAL);
	ko.node = 99; /* max_nodes 4 */
	CHECK_ERR(cxlkv_kv_open(pool, &ko, &kv2), -EINVAL);

	CHECK_ERR(cxlkv_kv_block_keys(NULL, 16, BLOCK_TOKENS, NULL, 0, out, 4), -EINVAL);
	CHECK_ERR(cxlkv_kv_block_keys(tokens, BLOCK_TOKENS, 0, NULL, 0, out, 4), -EINVAL);
	CHECK_ERR(cxlkv_kv_block_keys(tokens, BLOCK_TOKENS, BLOCK_TOKENS, NULL, 4, out, 4), -EINVAL);
	CHECK_ERR(cxlkv_kv_block_keys(tokens, BLOCK_TOKENS, BLOCK_TOKENS, NULL, 0, NULL, 4), -EINVAL);

	CHECK_ERR(cxlkv_kv_lookup(NULL, keys, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_lookup(kv, NULL, 3), -EINVAL);
	CHECK_ERR(cxlkv_kv_reserve(NULL, &keys[0], NULL, BLOCK_BYTES, &res), -EINVAL);
	CHECK_ERR(cxlkv_kv_reserve(kv, NULL, NULL, BLOCK_BYTES, &res), -EINVAL);
	CHECK_ERR(cxlkv_kv_reserve(kv, &keys[0], NULL, BLOCK_BYTES, NULL), -EINVAL);
	/* A zero-length block is not a block. */
	CHECK(cxlkv_kv_reserve(kv, &keys[4], &keys[3], 0, &res) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
	/* Nor is one larger than the pool. */
	CHECK(cxlkv_kv_reserve(kv, &keys[4], &keys[3], 2 * POOL_SIZE, &res) < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED + 1);

	/* A write whose chunks do not add up to the block is refused and the
	 * reservation can still be aborted. */
	CHECK(cxlkv_kv_reserve(kv, &keys[4], &keys[3], BLOCK_BYTES, &res) == CXLKV_KV_RESERVED);
	CHECK_ERR(cxlkv_kv_write(kv, &res, &short_chunk, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_write(kv, &res, &null_chunk, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_write(kv, &res, NULL, 2), -EINVAL);
	CHECK_ERR(cxlkv_kv_write(NULL, &res, &short_chunk, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_write(kv, NULL, &short_chunk, 1), -EINVAL);
	CHECK(cxlkv_kv_abort(kv, &res) == 0);
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED + 1);

	CHECK_ERR(cxlkv_kv_publish(NULL, &res), -EINVAL);
	CHECK_ERR(cxlkv_kv_publish(kv, NULL), -EINVAL);
	CHECK_ERR(cxlkv_kv_abort(kv, NULL), -EINVAL);
	CHECK_ERR(cxlkv_kv_pin(NULL, &keys[0], &pin), -EINVAL);
	CHECK_ERR(cxlkv_kv_pin(kv, NULL, &pin), -EINVAL);
	CHECK_ERR(cxlkv_kv_pin(kv, &keys[0], NULL), -EINVAL);

	/* Fetch into a buffer of the wrong size: refused, pin still valid. */
	CHECK(cxlkv_kv_pin(kv, &keys[0], &pin) == 0);
	CHECK_ERR(cxlkv_kv_fetch(kv, &pin, &short_chunk, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_fetch(kv, &pin, NULL, 1), -EINVAL);
	CHECK_ERR(cxlkv_kv_fetch(NULL, &pin, &short_chunk, 1), -EINVAL);
	CHECK(cxlkv_kv_unpin(kv, &pin) == 0);
	CHECK_ERR(cxlkv_kv_unpin(NULL, &pin), -EINVAL);
	CHECK_ERR(cxlkv_kv_unpin(kv, NULL), -EINVAL);

	CHECK_ERR(cxlkv_kv_stats(NULL, &st), -EINVAL);
	CHECK_ERR(cxlkv_kv_stats(kv, NULL), -EINVAL);
	st.size = 0;
	CHECK_ERR(cxlkv_kv_stats(kv, &st), -EINVAL);
	cxlkv_kv_close(NULL);
	/* Published data survived all of the above. */
	CHECK(cxlkv_kv_lookup(kv, keys, NBLOCKS) == PUBLISHED + 1);
}

/* cxlkv_free of a block the index names (a published KV block)
 * is refused with -EBUSY and a message naming the block, and the block
 * still reads back byte for byte; a block of the caller's own is freed. */
static void test_free_of_kv_block(struct cxlkv_pool *pool, struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_node_opts no;
	struct cxlkv_node *node = NULL;
	struct cxlkv_kv_block pin;
	static unsigned char k2[HALF], v2[HALF];
	struct cxlkv_chunk out[2] = {{k2, HALF}, {v2, HALF}};
	uint64_t own = 0;

	memset(&no, 0, sizeof(no));
	no.size = sizeof(no);
	no.node = 2;
	CHECK(cxlkv_node_attach(pool, &no, &node) == 0 && node != NULL);
	if (!node)
		return;
	CHECK(cxlkv_kv_pin(kv, &keys[0], &pin) == 0);
	CHECK_ERR(cxlkv_free(node, pin.loc_off), -EBUSY);
	CHECK(strstr(cxlkv_last_error(), "index names") != NULL);
	CHECK(strstr(cxlkv_last_error(), "READY") != NULL);
	CHECK(cxlkv_free(node, pin.loc_off + 64) < 0); /* not a block start either */
	CHECK(cxlkv_kv_fetch(kv, &pin, out, 2) == 0);
	fill(0);
	CHECK(memcmp(k2, kbuf[0], HALF) == 0 && memcmp(v2, vbuf[0], HALF) == 0);
	CHECK(cxlkv_kv_unpin(kv, &pin) == 0);
	CHECK(cxlkv_alloc(node, pin.length, &own) == 0);
	CHECK(cxlkv_free(node, own) == 0); /* the caller's own block: freed */
	cxlkv_node_detach(node);
	cxlkv_node_remove_local(pool, 2);
}

int main(void)
{
	struct c_pool p;
	struct cxlkv_pool *pool;
	struct cxlkv_kv *kv;
	struct cxlkv_kv_key keys[8];
	uint32_t tokens[NTOKENS];

	/* The same test in index-service mode (docs/rpc.md "The index service"; CTest's *_service_c run
	 * sets CXLKV_TEST_INDEX_SERVICE and CXLKV_INDEX_MODE=service): a service
	 * on node 3 owns the index, this store's calls go through it. */
	if (c_pool_open(&p, "cxlkv-kv-c-api-test", POOL_SIZE, C_POOL_KV | C_POOL_INDEX_SERVICE_FROM_ENV) != 0)
		return 1;
	pool = p.pool;
	kv = p.kv;

	for (int i = 0; i < NTOKENS; i++)
		tokens[i] = (uint32_t)(1000 + i * 7);
	test_block_keys(tokens, keys);
	if (kv) {
		test_write_read(kv, keys);
		test_bad_input(pool, kv, keys);
		test_free_of_kv_block(pool, kv, keys);
	}
	c_pool_close(&p);
	if (failures) {
		fprintf(stderr, "kv_c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("kv_c_api_test: pass\n");
	return 0;
}
