/* SPDX-License-Identifier: MIT */
/*
 * The KV store's batch calls from C (cxlkv.h, "KV store batches"): one call
 * for a chain of blocks each way, a status per block, and what happens when
 * some blocks fail: the others go on (or, along a chain, are cancelled),
 * nothing stays reserved, and bad arguments refuse the whole call.
 * Exit 0 = pass.
 */
#include <errno.h>
#include <stddef.h>
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
#define HALF 4096
#define BLOCK_BYTES (2 * HALF)
#define NKEYS 8

/* Block b's K and V halves. */
static unsigned char kbuf[NKEYS][HALF], vbuf[NKEYS][HALF];
static struct cxlkv_chunk in_chunks[2 * NKEYS];
static uint32_t two[NKEYS] = {2, 2, 2, 2, 2, 2, 2, 2};

static struct cxlkv_kv_key key(uint64_t a, uint64_t b)
{
	struct cxlkv_kv_key k = {a, b};
	return k;
}

static void fill_all(void)
{
	for (int b = 0; b < NKEYS; b++) {
		for (int i = 0; i < HALF; i++) {
			kbuf[b][i] = (unsigned char)(b * 29 + i);
			vbuf[b][i] = (unsigned char)(b * 13 + (i >> 2) + 3);
		}
		in_chunks[2 * b].addr = kbuf[b];
		in_chunks[2 * b].len = HALF;
		in_chunks[2 * b + 1].addr = vbuf[b];
		in_chunks[2 * b + 1].len = HALF;
	}
}

/* Read back blocks keys[0..n) (written from kbuf/vbuf[first..]) and compare. */
static void check_bytes(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, int n, int first)
{
	static unsigned char k2[NKEYS][HALF], v2[NKEYS][HALF];
	struct cxlkv_chunk out[2 * NKEYS];
	int32_t st[NKEYS];

	memset(k2, 0, sizeof(k2));
	memset(v2, 0, sizeof(v2));
	for (int b = 0; b < n; b++) {
		out[2 * b].addr = k2[b];
		out[2 * b].len = HALF;
		out[2 * b + 1].addr = v2[b];
		out[2 * b + 1].len = HALF;
	}
	CHECK(cxlkv_kv_get_many(kv, keys, (size_t)n, out, two, st) == n);
	for (int b = 0; b < n; b++) {
		CHECK(st[b] == 0);
		CHECK(memcmp(k2[b], kbuf[first + b], HALF) == 0 && memcmp(v2[b], vbuf[first + b], HALF) == 0);
	}
}

static void test_block_struct(void)
{
	CHECK(sizeof(struct cxlkv_kv_block) == 48);
	CHECK(offsetof(struct cxlkv_kv_block, version) == 44);
	CHECK(CXLKV_KV_RESERVED == 0 && CXLKV_KV_EXISTS == 1 && CXLKV_KV_BUSY == 2 && CXLKV_KV_MISS == 3);
}

/* put_chain publishes a whole chain in one call; get_many reads it back. */
static void test_put_chain_then_get_many(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	int32_t st[NKEYS];

	for (int i = 0; i < NKEYS; i++)
		st[i] = 99;
	CHECK(cxlkv_kv_lookup(kv, keys, NKEYS) == 0);
	CHECK(cxlkv_kv_put_chain(kv, NULL, keys, 6, BLOCK_BYTES, in_chunks, two, st) == 6);
	for (int i = 0; i < 6; i++)
		CHECK(st[i] == CXLKV_KV_RESERVED);
	CHECK(st[6] == 99); /* nothing written past n */
	CHECK(cxlkv_kv_lookup(kv, keys, NKEYS) == 6);
	check_bytes(kv, keys, 6, 0);

	/* The chain again, two blocks longer: the cached ones are EXISTS (and
	 * count as success), the new ones are written; status may be NULL. */
	CHECK(cxlkv_kv_put_chain(kv, NULL, keys, NKEYS, BLOCK_BYTES, in_chunks, two, st) == NKEYS);
	for (int i = 0; i < 6; i++)
		CHECK(st[i] == CXLKV_KV_EXISTS);
	CHECK(st[6] == CXLKV_KV_RESERVED && st[7] == CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_put_chain(kv, NULL, keys, NKEYS, BLOCK_BYTES, in_chunks, two, NULL) == NKEYS);
	CHECK(cxlkv_kv_lookup(kv, keys, NKEYS) == NKEYS);
	check_bytes(kv, keys, NKEYS, 0);
}

/* A missing block is CXLKV_KV_MISS; the others are read, its buffer untouched. */
static void test_get_many_with_a_miss(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_key ks[3] = {keys[0], key(0x1234, 0x5678), keys[2]};
	static unsigned char b[3][BLOCK_BYTES];
	struct cxlkv_chunk out[3] = {{b[0], BLOCK_BYTES}, {b[1], BLOCK_BYTES}, {b[2], BLOCK_BYTES}};
	uint32_t one[3] = {1, 1, 1};
	int32_t st[3];

	memset(b, 0xee, sizeof(b));
	CHECK(cxlkv_kv_get_many(kv, ks, 3, out, one, st) == 2);
	CHECK(st[0] == 0 && st[1] == CXLKV_KV_MISS && st[2] == 0);
	CHECK(memcmp(b[0], kbuf[0], HALF) == 0 && memcmp(b[0] + HALF, vbuf[0], HALF) == 0);
	CHECK(memcmp(b[2], kbuf[2], HALF) == 0 && memcmp(b[2] + HALF, vbuf[2], HALF) == 0);
	for (int i = 0; i < BLOCK_BYTES; i++)
		if (b[1][i] != 0xee) {
			CHECK(!"a missed block's buffer was written");
			break;
		}
}

/* A chain under a parent that is not cached: the first block fails with
 * -ENOENT, the rest are cancelled, nothing is reserved. */
static void test_reserve_chain_unknown_parent(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_key parent = key(77, 78), ks[3] = {key(1, 100), key(2, 100), key(3, 100)};
	struct cxlkv_kv_block out[3];
	int32_t st[3];

	CHECK(cxlkv_kv_reserve_chain(kv, &parent, ks, 3, BLOCK_BYTES, out, st) == 0);
	CHECK(st[0] == -ENOENT && st[1] == -ECANCELED && st[2] == -ECANCELED);
	CHECK(out[0].status == (uint32_t)-ENOENT && out[2].status == (uint32_t)-ECANCELED);
	CHECK(cxlkv_last_error()[0] != '\0');
	/* Such handles are skipped by the calls that take handles. */
	CHECK(cxlkv_kv_publish_many(kv, out, 3, st) == 0);
	CHECK(st[0] == -ENOENT && st[1] == -ECANCELED);
	CHECK(cxlkv_kv_abort_many(kv, out, 3, st) == 0);
	/* The first block, as a root, is free to reserve. */
	CHECK(cxlkv_kv_reserve_chain(kv, NULL, ks, 1, BLOCK_BYTES, out, st) == 1 && st[0] == CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_abort_many(kv, out, 1, st) == 1 && st[0] == 0);
}

/* Step by step: one write of four fails; the caller publishes the blocks
 * before it and aborts it and the one after. */
static void test_write_many_partial(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_key c[4] = {key(10, 200), key(11, 200), key(12, 200), key(13, 200)};
	struct cxlkv_kv_key chain[NKEYS + 4];
	struct cxlkv_kv_block rs[4];
	uint32_t nch[4] = {2, 2, 1, 2}; /* block 2 gets only its K half: too short */
	struct cxlkv_chunk chunks[7] = {in_chunks[0], in_chunks[1], in_chunks[2], in_chunks[3],
					in_chunks[4], in_chunks[6], in_chunks[7]};
	int32_t st[4];

	CHECK(cxlkv_kv_reserve_chain(kv, &keys[NKEYS - 1], c, 4, BLOCK_BYTES, rs, st) == 4);
	for (int i = 0; i < 4; i++) {
		CHECK(st[i] == CXLKV_KV_RESERVED && rs[i].status == CXLKV_KV_RESERVED);
		CHECK(memcmp(&rs[i].key, &c[i], sizeof(c[i])) == 0 && rs[i].length >= BLOCK_BYTES);
	}
	CHECK(cxlkv_kv_write_many(kv, rs, 4, chunks, nch, st) == 3);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == -EINVAL && st[3] == 0);
	CHECK(strstr(cxlkv_last_error(), "bytes") != NULL);
	CHECK(cxlkv_kv_publish_many(kv, rs, 2, st) == 2);
	CHECK(st[0] == 0 && st[1] == 0);
	CHECK(cxlkv_kv_abort_many(kv, rs + 2, 2, st) == 2);
	CHECK(st[0] == 0 && st[1] == 0);
	memcpy(chain, keys, sizeof(keys[0]) * NKEYS);
	memcpy(chain + NKEYS, c, sizeof(c));
	CHECK(cxlkv_kv_lookup(kv, chain, NKEYS + 4) == NKEYS + 2);
	/* Settled handles are refused: an aborted block cannot be published. */
	CHECK(cxlkv_kv_publish_many(kv, rs + 2, 1, st) == 0 && st[0] < 0);
	/* Nothing of blocks 2, 3 was left reserved. */
	CHECK(cxlkv_kv_reserve_chain(kv, &c[1], c + 2, 2, BLOCK_BYTES, rs, st) == 2);
	CHECK(st[0] == CXLKV_KV_RESERVED && st[1] == CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_abort_many(kv, rs, 2, st) == 2);
}

/* publish_many goes in the given order: a child before its parent gets
 * -EAGAIN and can be published once the parent is. */
static void test_publish_order(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_key d[2] = {key(20, 300), key(21, 300)};
	struct cxlkv_kv_block rs[2], swapped[2];
	int32_t st[2];

	CHECK(cxlkv_kv_reserve_chain(kv, NULL, d, 2, BLOCK_BYTES, rs, st) == 2);
	CHECK(cxlkv_kv_write_many(kv, rs, 2, in_chunks, two, st) == 2);
	swapped[0] = rs[1];
	swapped[1] = rs[0];
	CHECK(cxlkv_kv_publish_many(kv, swapped, 2, st) == 1);
	CHECK(st[0] == -EAGAIN && st[1] == 0);
	CHECK(cxlkv_kv_lookup(kv, d, 2) == 1);
	CHECK(cxlkv_kv_publish_many(kv, swapped, 1, st) == 1 && st[0] == 0);
	CHECK(cxlkv_kv_lookup(kv, d, 2) == 2);
	check_bytes(kv, d, 2, 0);
}

/* put_chain with a bad chunk list for block 2 of 4: 0 and 1 are published,
 * 2 fails, 3 is cancelled, and neither 2 nor 3 stays reserved. */
static void test_put_chain_partial(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_key e[4] = {key(30, 400), key(31, 400), key(32, 400), key(33, 400)};
	struct cxlkv_kv_block rs[2];
	uint32_t nch[4] = {2, 2, 1, 2};
	struct cxlkv_chunk chunks[7] = {in_chunks[0], in_chunks[1], in_chunks[2], in_chunks[3],
					in_chunks[4], in_chunks[6], in_chunks[7]};
	int32_t st[4];

	CHECK(cxlkv_kv_put_chain(kv, NULL, e, 4, BLOCK_BYTES, chunks, nch, st) == 2);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == -EINVAL && st[3] == -ECANCELED);
	CHECK(strncmp(cxlkv_last_error(), "kv:", 3) == 0);
	CHECK(cxlkv_kv_lookup(kv, e, 4) == 2);
	check_bytes(kv, e, 2, 0);
	/* Block 2 is not cached, so block 3 has no parent; 2 is free again. */
	CHECK(cxlkv_kv_reserve_chain(kv, &e[2], &e[3], 1, BLOCK_BYTES, rs, st) == 0 && st[0] == -ENOENT);
	CHECK(cxlkv_kv_reserve_chain(kv, &e[1], &e[2], 1, BLOCK_BYTES, rs, st) == 1 && st[0] == 0);
	CHECK(cxlkv_kv_abort_many(kv, rs, 1, st) == 1);
}

/* pin_many / fetch_many / unpin_many, with a miss among them. */
static void test_pin_fetch_unpin_many(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_key ks[3] = {keys[3], key(0xdead, 0xbeef), keys[4]};
	struct cxlkv_kv_block pins[3];
	static unsigned char b[3][BLOCK_BYTES];
	struct cxlkv_chunk out[3] = {{b[0], BLOCK_BYTES}, {b[1], BLOCK_BYTES}, {b[2], BLOCK_BYTES}};
	uint32_t one[3] = {1, 1, 1};
	int32_t st[3];

	CHECK(cxlkv_kv_pin_many(kv, ks, 3, pins, st) == 2);
	CHECK(st[0] == 0 && st[1] == CXLKV_KV_MISS && st[2] == 0);
	CHECK(pins[0].status == 0 && pins[1].status == CXLKV_KV_MISS && pins[2].status == 0);
	CHECK(pins[0].length == BLOCK_BYTES);
	CHECK(cxlkv_kv_fetch_many(kv, pins, 3, out, one, st) == 2);
	CHECK(st[0] == 0 && st[1] == CXLKV_KV_MISS && st[2] == 0);
	CHECK(memcmp(b[0], kbuf[3], HALF) == 0 && memcmp(b[2] + HALF, vbuf[4], HALF) == 0);
	CHECK(cxlkv_kv_unpin_many(kv, pins, 3, st) == 2);
	CHECK(st[0] == 0 && st[1] == CXLKV_KV_MISS && st[2] == 0);
	/* Unpinning again: refused per block, the call itself succeeds. */
	CHECK(cxlkv_kv_unpin_many(kv, pins, 3, st) == 0);
	CHECK(st[0] < 0 && st[1] == CXLKV_KV_MISS && st[2] < 0);
	CHECK(cxlkv_last_error()[0] != '\0');
}

/* Handles that are not RESERVED are skipped by write_many. */
static void test_write_many_skips_existing(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_block rs[2];
	int32_t st[2];
	unsigned char before[HALF];

	CHECK(cxlkv_kv_reserve_chain(kv, NULL, keys, 2, BLOCK_BYTES, rs, st) == 2);
	CHECK(st[0] == CXLKV_KV_EXISTS && st[1] == CXLKV_KV_EXISTS);
	memcpy(before, kbuf[0], HALF);
	memset(kbuf[0], 0x55, HALF);
	CHECK(cxlkv_kv_write_many(kv, rs, 2, in_chunks, two, st) == 0);
	CHECK(st[0] == CXLKV_KV_EXISTS && st[1] == CXLKV_KV_EXISTS);
	memcpy(kbuf[0], before, HALF);
	check_bytes(kv, keys, 2, 0);
}

/* A chain longer than the pool: the leading blocks are published, the first
 * that finds no space fails with -ENOSPC, the rest are cancelled. */
static void test_put_chain_nospc(struct cxlkv_kv *kv)
{
	enum { N = 48 };
	const size_t big = 2 * MiB;
	struct cxlkv_kv_key ks[N];
	struct cxlkv_chunk chunks[N];
	uint32_t one[N];
	int32_t st[N];
	unsigned char *src = malloc(big + 64 * N), *dst = malloc(big);
	int k;

	if (!src || !dst) {
		CHECK(!"out of memory");
		free(src);
		free(dst);
		return;
	}
	for (size_t i = 0; i < big + 64 * N; i++)
		src[i] = (unsigned char)(i * 7 + (i >> 9));
	for (int i = 0; i < N; i++) {
		ks[i] = key(1000 + (uint64_t)i, 500);
		chunks[i].addr = src + 64 * i; /* each block's bytes differ */
		chunks[i].len = big;
		one[i] = 1;
	}
	k = cxlkv_kv_put_chain(kv, NULL, ks, N, big, chunks, one, st);
	CHECK(k > 0 && k < N);
	if (k > 0 && k < N) {
		for (int i = 0; i < k; i++)
			CHECK(st[i] == 0);
		CHECK(st[k] == -ENOSPC);
		for (int i = k + 1; i < N; i++)
			CHECK(st[i] == -ECANCELED);
		CHECK(strstr(cxlkv_last_error(), "space") != NULL);
		CHECK(cxlkv_kv_lookup(kv, ks, N) == k);
		/* The last published block reads back. */
		CHECK(cxlkv_kv_get_many(kv, &ks[k - 1], 1, &(struct cxlkv_chunk){dst, big}, one, st) == 1);
		CHECK(memcmp(dst, src + 64 * (k - 1), big) == 0);
	}
	free(src);
	free(dst);
}

/* Handles are checked against the index (docs/integrity.md "Fencing: handles carry the entry version"): settled, reused, forged
 * or out-of-range reservations and pins are refused, nothing is read or
 * written through them. */
static void test_handles_are_validated(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_key f[2] = {key(40, 600), key(41, 600)};
	struct cxlkv_kv_block rs[2], res, pin, forged;
	static unsigned char b[BLOCK_BYTES];
	struct cxlkv_chunk out = {b, BLOCK_BYTES};
	int32_t st[2];

	/* A write after publish would overwrite a published block: -ESTALE. */
	CHECK(cxlkv_kv_put_chain(kv, NULL, f, 1, BLOCK_BYTES, in_chunks, two, st) == 1);
	CHECK(cxlkv_kv_reserve_chain(kv, &f[0], &f[1], 1, BLOCK_BYTES, rs, st) == 1);
	CHECK(cxlkv_kv_write_many(kv, rs, 1, in_chunks, two, st) == 1);
	CHECK(cxlkv_kv_publish(kv, &rs[0]) == 0);
	CHECK_ERR(cxlkv_kv_write(kv, &rs[0], in_chunks, 2), -ESTALE);
	CHECK_ERR(cxlkv_kv_publish(kv, &rs[0]), -ESTALE);
	/* An aborted reservation cannot write into whatever reuses its space. */
	CHECK(cxlkv_kv_reserve(kv, &keys[0], NULL, 1, &res) == CXLKV_KV_EXISTS);
	CHECK(cxlkv_kv_reserve_chain(kv, &f[1], &f[0], 0, BLOCK_BYTES, rs, st) == 0);
	{
		struct cxlkv_kv_key g = key(42, 600);
		CHECK(cxlkv_kv_reserve(kv, &g, &f[1], BLOCK_BYTES, &res) == CXLKV_KV_RESERVED);
		CHECK(cxlkv_kv_abort(kv, &res) == 0);
		CHECK_ERR(cxlkv_kv_write(kv, &res, in_chunks, 2), -ESTALE);
		CHECK_ERR(cxlkv_kv_publish(kv, &res), -ESTALE);
		/* A reservation whose version is not the entry's (reclaimed and reused). */
		CHECK(cxlkv_kv_reserve(kv, &g, &f[1], BLOCK_BYTES, &res) == CXLKV_KV_RESERVED);
		forged = res;
		forged.version++;
		CHECK_ERR(cxlkv_kv_write(kv, &forged, in_chunks, 2), -ESTALE);
		CHECK(cxlkv_kv_publish_many(kv, &forged, 1, st) == 0 && st[0] == -ESTALE);
		CHECK(cxlkv_kv_abort(kv, &res) == 0);
	}
	/* Pins: a forged location is never read; a wrong version or slot is refused. */
	CHECK(cxlkv_kv_pin(kv, &f[0], &pin) == 0);
	memset(b, 0xab, sizeof(b));
	forged = pin;
	forged.loc_off = 0; /* the superblock */
	CHECK_ERR(cxlkv_kv_fetch(kv, &forged, &out, 1), -EINVAL);
	CHECK(b[0] == 0xab && b[BLOCK_BYTES - 1] == 0xab);
	forged = pin;
	forged.version += 7;
	CHECK_ERR(cxlkv_kv_fetch(kv, &forged, &out, 1), -ESTALE);
	forged = pin;
	forged.slot = 0x7fffffff;
	CHECK_ERR(cxlkv_kv_fetch(kv, &forged, &out, 1), -EINVAL);
	CHECK(b[0] == 0xab);
	CHECK(cxlkv_kv_fetch(kv, &pin, &out, 1) == 0);
	CHECK(memcmp(b, kbuf[0], HALF) == 0);
	/* An unpin checks the handle as a fetch does: a forged one is refused
	 * and the real pin stays; a pin handle dies with its own unpin. */
	forged = pin;
	forged.loc_off += 1;
	CHECK_ERR(cxlkv_kv_unpin(kv, &forged), -EINVAL);
	forged = pin;
	forged.version += 1;
	CHECK_ERR(cxlkv_kv_unpin(kv, &forged), -EINVAL);
	CHECK(cxlkv_kv_unpin(kv, &pin) == 0);
	memset(b, 0xab, sizeof(b));
	CHECK_ERR(cxlkv_kv_fetch(kv, &pin, &out, 1), -ESTALE);
	CHECK(b[0] == 0xab);
	CHECK_ERR(cxlkv_kv_unpin(kv, &pin), -EINVAL);
}

/*
 * Handle checks are per block inside a batch: a stale (wrong version) or
 * forged (location) handle fails alone, before anything is written to or
 * read from its location; the other blocks of the call go on.
 */
static void test_batch_handles_checked_per_block(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_key c[3] = {key(50, 700), key(51, 700), key(52, 700)};
	struct cxlkv_kv_block rs[3], pins[3];
	static unsigned char b[3][BLOCK_BYTES];
	struct cxlkv_chunk out[3] = {{b[0], BLOCK_BYTES}, {b[1], BLOCK_BYTES}, {b[2], BLOCK_BYTES}};
	uint32_t one[3] = {1, 1, 1};
	int32_t st[3];

	/* Three roots reserved in one chain call each, so none depends on another. */
	for (int i = 0; i < 3; i++)
		CHECK(cxlkv_kv_reserve_chain(kv, NULL, &c[i], 1, BLOCK_BYTES, &rs[i], &st[i]) == 1);
	rs[1].version += 3; /* stale */
	CHECK(cxlkv_kv_write_many(kv, rs, 3, in_chunks, two, st) == 2);
	CHECK(st[0] == CXLKV_KV_RESERVED && st[1] == -ESTALE && st[2] == CXLKV_KV_RESERVED);
	CHECK(strstr(cxlkv_last_error(), "changed since the handle was made") != NULL);
	CHECK(cxlkv_kv_publish_many(kv, rs, 3, st) == 2);
	CHECK(st[0] == CXLKV_KV_RESERVED && st[1] == -ESTALE && st[2] == CXLKV_KV_RESERVED);
	rs[1].version -= 3;
	CHECK(cxlkv_kv_abort_many(kv, &rs[1], 1, st) == 1 && st[0] == CXLKV_KV_RESERVED);
	CHECK(cxlkv_kv_lookup(kv, &c[0], 1) == 1 && cxlkv_kv_lookup(kv, &c[1], 1) == 0);
	CHECK(cxlkv_kv_lookup(kv, &c[2], 1) == 1);

	/* Pins: a forged location in the middle is never read. */
	c[1] = c[2];
	CHECK(cxlkv_kv_pin_many(kv, c, 2, pins, st) == 2);
	pins[2] = pins[1];
	pins[1] = pins[0];
	pins[1].loc_off = 0; /* the superblock */
	memset(b, 0xcd, sizeof(b));
	CHECK(cxlkv_kv_fetch_many(kv, pins, 3, out, one, st) == 2);
	CHECK(st[0] == 0 && st[1] == -EINVAL && st[2] == 0);
	CHECK(strstr(cxlkv_last_error(), "forged") != NULL);
	CHECK(b[1][0] == 0xcd && b[1][BLOCK_BYTES - 1] == 0xcd);
	CHECK(memcmp(b[0], kbuf[0], HALF) == 0 && memcmp(b[0] + HALF, vbuf[0], HALF) == 0);
	CHECK(memcmp(b[2], kbuf[2], HALF) == 0 && memcmp(b[2] + HALF, vbuf[2], HALF) == 0);
	pins[1] = pins[2];
	CHECK(cxlkv_kv_unpin_many(kv, pins, 2, st) == 2);
}

/* Every step has its own latency, and the whole publish / fetch too. */
static void test_stats_latencies(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_stats s;

	memset(&s, 0, sizeof(s));
	s.size = sizeof(s);
	CHECK(cxlkv_kv_stats(kv, &s) == 0 && s.size == sizeof(s));
	CHECK(s.reserve_us_p50 > 0 && s.write_us_p50 > 0 && s.publish_us_p50 > 0);
	CHECK(s.pin_us_p50 > 0 && s.fetch_us_p50 > 0 && s.unpin_us_p50 > 0);
	CHECK(s.put_us_p50 > 0 && s.get_us_p50 > 0);
	CHECK(s.put_us_p99 >= s.put_us_p50 && s.get_us_p99 >= s.get_us_p50);
	/* A whole put of a chain takes longer than one of its steps per block. */
	CHECK(s.put_us_p99 >= s.publish_us_p50);
	/* An older, smaller struct gets its prefix only. */
	memset(&s, 0, sizeof(s));
	s.size = offsetof(struct cxlkv_kv_stats, reserve_us_p50);
	CHECK(cxlkv_kv_stats(kv, &s) == 0 && s.size == offsetof(struct cxlkv_kv_stats, reserve_us_p50));
	CHECK(s.fetch_us_p50 > 0 && s.reserve_us_p50 == 0);
}

static void test_bad_arguments(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys)
{
	struct cxlkv_kv_block rs[2];
	int32_t st[2];

	CHECK_ERR(cxlkv_kv_put_chain(NULL, NULL, keys, 2, BLOCK_BYTES, in_chunks, two, st), -EINVAL);
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_kv_put_chain", 18) == 0);
	CHECK_ERR(cxlkv_kv_put_chain(kv, NULL, NULL, 2, BLOCK_BYTES, in_chunks, two, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_put_chain(kv, NULL, keys, 2, BLOCK_BYTES, in_chunks, NULL, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_put_chain(kv, NULL, keys, 2, BLOCK_BYTES, NULL, two, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_get_many(kv, NULL, 2, in_chunks, two, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_reserve_chain(kv, NULL, keys, 2, BLOCK_BYTES, NULL, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_pin_many(kv, keys, 2, NULL, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_write_many(kv, NULL, 2, in_chunks, two, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_publish_many(NULL, rs, 2, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_abort_many(kv, NULL, 1, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_fetch_many(kv, rs, 1, in_chunks, NULL, st), -EINVAL);
	CHECK_ERR(cxlkv_kv_unpin_many(kv, NULL, 1, st), -EINVAL);
	/* Empty batches are fine and do nothing. */
	CHECK(cxlkv_kv_put_chain(kv, NULL, NULL, 0, BLOCK_BYTES, NULL, NULL, NULL) == 0);
	CHECK(cxlkv_kv_get_many(kv, NULL, 0, NULL, NULL, NULL) == 0);
	/* Single-block calls name themselves in their messages (not "operator()"). */
	CHECK_ERR(cxlkv_kv_lookup(NULL, keys, 1), -EINVAL);
	CHECK(strncmp(cxlkv_last_error(), "cxlkv_kv_lookup", 15) == 0);
	/* A zero-length block: the chain's first block fails, nothing is kept. */
	CHECK(cxlkv_kv_reserve_chain(kv, NULL, keys, 2, 0, rs, st) == 0);
	CHECK(st[0] == -EINVAL && st[1] == -ECANCELED);
	CHECK(cxlkv_kv_lookup(kv, keys, NKEYS) == NKEYS);
}

/* cxlkv_kv_put_chains: several chains in one call, in order.  A chain
 * may hang below a block an earlier chain of the call publishes; a chain
 * whose parent is not cached fails alone (-ENOENT, the rest of it
 * cancelled) and the chains after it still go; a chain of cached blocks
 * is EXISTS.  Lengths that do not add up refuse the call. */
static void test_put_chains(struct cxlkv_kv *kv)
{
	struct cxlkv_kv_key ks[NKEYS] = {key(50, 600), key(51, 600), key(52, 600), /* A: a root */
					 key(53, 600), key(54, 600),                /* X: unknown parent */
					 key(55, 600), key(56, 600),                /* B: below A[1] */
					 key(50, 600)};                             /* C: A[0] again */
	struct cxlkv_kv_key parents[4] = {key(0, 0), key(0x999, 1), key(51, 600), key(0, 0)};
	uint32_t lens[4] = {3, 2, 2, 1}, bad_lens[2] = {3, 4};
	struct cxlkv_kv_key b_chain[4] = {key(50, 600), key(51, 600), key(55, 600), key(56, 600)};
	struct cxlkv_kv_key roots[2] = {key(60, 600), key(61, 600)};
	uint32_t one_each[2] = {1, 1};
	int32_t st[NKEYS];

	CHECK(cxlkv_kv_put_chains(kv, parents, lens, 4, ks, NKEYS, BLOCK_BYTES, in_chunks, two, st) == 6);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0);
	CHECK(st[3] == -ENOENT && st[4] == -ECANCELED);
	CHECK(st[5] == 0 && st[6] == 0);
	CHECK(st[7] == CXLKV_KV_EXISTS);
	CHECK(cxlkv_last_error()[0] != '\0'); /* the failed chain's message */
	CHECK(cxlkv_kv_lookup(kv, ks, 3) == 3);
	CHECK(cxlkv_kv_lookup(kv, b_chain, 4) == 4);
	CHECK(cxlkv_kv_lookup(kv, &ks[3], 2) == 0);
	check_bytes(kv, ks, 3, 0);
	check_bytes(kv, &ks[5], 2, 5);
	/* parents NULL: every chain a root. */
	CHECK(cxlkv_kv_put_chains(kv, NULL, one_each, 2, roots, 2, BLOCK_BYTES, in_chunks, two, st) == 2);
	CHECK(st[0] == 0 && st[1] == 0);
	CHECK(cxlkv_kv_lookup(kv, &roots[1], 1) == 1);
	/* Lengths adding up to 7 of 8 keys, no lengths: refused, nothing done. */
	CHECK(cxlkv_kv_put_chains(kv, NULL, bad_lens, 2, &ks[0], NKEYS, BLOCK_BYTES, in_chunks, two, st) == -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "chain lengths") != NULL);
	CHECK(cxlkv_kv_put_chains(kv, NULL, NULL, 2, roots, 2, BLOCK_BYTES, in_chunks, two, st) == -EINVAL);
	CHECK(cxlkv_kv_put_chains(kv, NULL, NULL, 0, NULL, 0, BLOCK_BYTES, NULL, NULL, NULL) == 0);
}

/* The engine-step calls (docs/engines.md "One call a step"): keys from the
 * engine's hashes as cxlkv_kv_engine_keys makes them, chunk lists from the
 * paged template (block b's chunk i at addr[i] + b * stride[i]), a chain
 * below a parent given by its hash, an empty parent item a root; bad
 * templates, block ids and lengths refuse the whole call. */
static void engine_item(unsigned char *at, int id)
{
	at[0] = 'b';
	memcpy(at + 1, "hash", 4);
	at[5] = (unsigned char)id;
}

static void test_engine_step(struct cxlkv_kv *kv)
{
	static unsigned char k2[NKEYS][HALF], v2[NKEYS][HALF];
	uint64_t in_addr[2] = {(uint64_t)(uintptr_t)kbuf[0], (uint64_t)(uintptr_t)vbuf[0]};
	uint64_t out_addr[2] = {(uint64_t)(uintptr_t)k2[0], (uint64_t)(uintptr_t)v2[0]};
	int64_t stride[2] = {HALF, HALF};
	uint64_t len[2] = {HALF, HALF};
	struct cxlkv_paged_chunks in = {sizeof(in), 2, in_addr, stride, len, NKEYS};
	struct cxlkv_paged_chunks out = {sizeof(out), 2, out_addr, stride, len, NKEYS};
	/* Blocks h70..h73: chain 1 = h70 h71 h72 (a root), chain 2 = h73 below h71. */
	unsigned char items[6 * 6];
	uint32_t item_lens[6] = {6, 6, 6, 6, 0, 6}, chain_lens[2] = {3, 1}, bad_lens[2] = {3, 2};
	uint64_t ids[4] = {4, 5, 6, 7}, back[5] = {0, 1, 2, 3, 7}, bad_ids[4] = {4, 5, 6, NKEYS};
	struct cxlkv_kv_key keys[4], expect[4], chain[3];
	int32_t st[5];

	for (int i = 0; i < 4; i++)
		engine_item(items + 6 * i, 70 + i);
	engine_item(items + 24, 71); /* chain 2's parent; chain 1's item is empty */
	CHECK(cxlkv_kv_engine_keys("ns", 2, items, 24, item_lens, 4, expect) == 4);
	CHECK(cxlkv_kv_engine_put_chains(kv, &in, "ns", 2, items, 30, item_lens, 4, chain_lens, 2, ids, st, keys) == 4);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0);
	for (int i = 0; i < 4; i++)
		CHECK(keys[i].lo == expect[i].lo && keys[i].hi == expect[i].hi);
	chain[0] = expect[0];
	chain[1] = expect[1];
	chain[2] = expect[3];
	CHECK(cxlkv_kv_lookup(kv, chain, 3) == 3); /* h73 is h71's child */
	/* Read back into other buffers, engine blocks 0..3; a fifth hash is not cached. */
	engine_item(items + 24, 99);
	memset(k2, 0, sizeof(k2));
	memset(v2, 0, sizeof(v2));
	uint32_t get_lens[5] = {6, 6, 6, 6, 6};
	CHECK(cxlkv_kv_engine_get_many(kv, &out, "ns", 2, items, 30, get_lens, 5, back, st) == 4);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0 && st[4] == CXLKV_KV_MISS);
	for (int b = 0; b < 4; b++)
		CHECK(memcmp(k2[b], kbuf[4 + b], HALF) == 0 && memcmp(v2[b], vbuf[4 + b], HALF) == 0);
	/* Another namespace: other keys, nothing found. */
	CHECK(cxlkv_kv_engine_get_many(kv, &out, "other", 5, items, 24, get_lens, 4, back, st) == 0);
	CHECK(st[0] == CXLKV_KV_MISS);
	/* Refused, nothing done: a block id out of range, lengths that do not add up, bad templates. */
	engine_item(items + 24, 71);
	CHECK(cxlkv_kv_engine_put_chains(kv, &in, "ns", 2, items, 30, item_lens, 4, chain_lens, 2, bad_ids, st, NULL) ==
	      -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "out of range") != NULL);
	CHECK(cxlkv_kv_engine_put_chains(kv, &in, "ns", 2, items, 30, item_lens, 4, bad_lens, 2, ids, st, NULL) == -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "chain lengths") != NULL);
	CHECK(cxlkv_kv_engine_put_chains(kv, &in, "ns", 2, items, 29, item_lens, 4, chain_lens, 2, ids, st, NULL) == -EINVAL);
	CHECK(cxlkv_kv_engine_get_many(kv, NULL, "ns", 2, items, 24, get_lens, 4, back, st) == -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "paged") != NULL);
	struct cxlkv_paged_chunks small = out, none = out;
	small.size = 8;
	none.nchunks = 0;
	CHECK(cxlkv_kv_engine_get_many(kv, &small, "ns", 2, items, 24, get_lens, 4, back, st) == -EINVAL);
	CHECK(cxlkv_kv_engine_get_many(kv, &none, "ns", 2, items, 24, get_lens, 4, back, st) == -EINVAL);
	CHECK(cxlkv_kv_engine_get_many(kv, &out, "ns", 2, NULL, 0, NULL, 0, NULL, NULL) == 0);
}

/* cxlkv_kv_engine_keys: the keys of cxlkv.keys_from_hashes (BLAKE2b-128,
 * personal "cxlkv-ekey-v1"); the expected values are Python hashlib's. */
static void test_engine_keys(void)
{
	unsigned char items[1 + 3 + 1 + 32];
	uint32_t lens[2] = {4, 33};
	struct cxlkv_kv_key out[2];
	unsigned char big[200];

	memcpy(items, "sabc", 4);
	items[4] = 'b';
	for (int i = 0; i < 32; i++)
		items[5 + i] = (unsigned char)i;
	CHECK(cxlkv_kv_engine_keys("model=m;", 8, items, sizeof(items), lens, 2, out) == 2);
	CHECK(out[0].lo == 0xdec1fbb635a9b8a9ull && out[0].hi == 0x1d0a48192d9b5addull);
	CHECK(out[1].lo == 0x6724347bab6e210cull && out[1].hi == 0x4e7ddfd5f41a356dull);
	/* A namespace longer than one 128-byte BLAKE2b block. */
	memset(big, 'x', sizeof(big));
	CHECK(cxlkv_kv_engine_keys(big, sizeof(big), items, 4, lens, 1, out) == 1);
	CHECK(out[0].lo == 0xb6562cc2a4523c1bull && out[0].hi == 0x2ded91385078163full);
	/* Lengths that do not add up to the bytes given. */
	CHECK(cxlkv_kv_engine_keys("", 0, items, 36, lens, 2, out) == -EINVAL);
	CHECK(cxlkv_kv_engine_keys("", 0, items, 4, NULL, 1, out) == -EINVAL);
}

int main(void)
{
	struct c_pool p;
	struct cxlkv_kv *kv;
	struct cxlkv_kv_key keys[NKEYS];
	uint32_t tokens[NKEYS * 16];

	/* The same test in index-service mode (docs/rpc.md "The index service"; CTest's *_service_c run
	 * sets CXLKV_TEST_INDEX_SERVICE and CXLKV_INDEX_MODE=service): a service
	 * on node 3 owns the index, this store's calls go through it. */
	if (c_pool_open(&p, "cxlkv-kv-batch-c-api-test", POOL_SIZE, C_POOL_KV | C_POOL_INDEX_SERVICE_FROM_ENV) != 0)
		return 1;
	kv = p.kv;
	for (int i = 0; i < NKEYS * 16; i++)
		tokens[i] = (uint32_t)(500 + i * 3);
	CHECK(cxlkv_kv_block_keys(tokens, NKEYS * 16, 16, NULL, 0, keys, NKEYS) == NKEYS);
	fill_all();

	test_block_struct();
	if (kv) {
		test_put_chain_then_get_many(kv, keys);
		test_get_many_with_a_miss(kv, keys);
		test_reserve_chain_unknown_parent(kv);
		test_write_many_partial(kv, keys);
		test_publish_order(kv);
		test_put_chain_partial(kv);
		test_pin_fetch_unpin_many(kv, keys);
		test_write_many_skips_existing(kv, keys);
		test_bad_arguments(kv, keys);
		test_handles_are_validated(kv, keys);
		test_batch_handles_checked_per_block(kv);
		test_stats_latencies(kv);
		test_put_chains(kv);
		test_put_chain_nospc(kv);
		test_engine_step(kv);
	}
	test_engine_keys();
	c_pool_close(&p);
	if (failures) {
		fprintf(stderr, "kv_batch_c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("kv_batch_c_api_test: pass\n");
	return 0;
}
