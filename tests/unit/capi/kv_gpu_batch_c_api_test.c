/* SPDX-License-Identifier: MIT */
/*
 * cxlkv_kv_gpu_put_chain / cxlkv_kv_gpu_get_many from C on the CPU reference
 * GPU backend (CXLKV_GPU_F_CPU_REFERENCE: "device" tensors are host memory,
 * the kernels are the reference): a chain of paged-layout blocks is
 * published by key in one call and read back into other GPU blocks byte for
 * byte in one call, with a miss among them.  Exit 0 = pass.
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
#define LAYERS 2
#define HEADS 2
#define HEAD 8
#define TOKENS 4
#define ELEM 2
#define NBLOCKS 8
#define TBLOCK (TOKENS * HEADS * HEAD * ELEM) /* bytes of one block in one tensor */
#define TBYTES (NBLOCKS * TBLOCK)
#define NT (2 * LAYERS)

static unsigned char src[NT][TBYTES], dst[NT][TBYTES];
static uint64_t src_ptrs[NT], dst_ptrs[NT];

static void layout_over(struct cxlkv_gpu_layout *l, const uint64_t *ptrs)
{
	memset(l, 0, sizeof(*l));
	l->size = sizeof(*l);
	l->kind = CXLKV_GPU_LAYOUT_LAYER_FIRST;
	l->num_layers = LAYERS;
	l->num_kv_heads = HEADS;
	l->head_size = HEAD;
	l->block_tokens = TOKENS;
	l->elem_bytes = ELEM;
	l->num_blocks = NBLOCKS;
	l->tensors = ptrs;
	l->ntensors = NT;
}

/* GPU block d of dst holds what GPU block s of src held, in every tensor. */
static int same_block(int d, int s)
{
	for (int t = 0; t < NT; t++)
		if (memcmp(dst[t] + d * TBLOCK, src[t] + s * TBLOCK, TBLOCK) != 0)
			return 0;
	return 1;
}

static int zero_block(int d)
{
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < TBLOCK; i++)
			if (dst[t][d * TBLOCK + i])
				return 0;
	return 1;
}

int main(void)
{
	struct c_pool p;
	struct cxlkv_gpu_opts go;
	struct cxlkv_pool *pool;
	struct cxlkv_kv *kv;
	struct cxlkv_gpu *gpu = NULL, *other = NULL;
	struct cxlkv_gpu_layout sl, dl;
	struct cxlkv_kv_key keys[4] = {{1, 9}, {2, 9}, {3, 9}, {4, 9}};
	struct cxlkv_kv_key get_keys[4] = {{1, 9}, {2, 9}, {0x77, 0x77}, {4, 9}};
	struct cxlkv_kv_key fresh[2] = {{5, 9}, {6, 9}};
	uint64_t put_ids[4] = {3, 1, 7, 0}, get_ids[4] = {0, 1, 2, 3};
	int32_t st[4];
	static unsigned char elsewhere[1 << 16] __attribute__((aligned(4096)));

	for (int t = 0; t < NT; t++) {
		for (int i = 0; i < TBYTES; i++)
			src[t][i] = (unsigned char)(t * 53 + i * 7 + (i >> 7));
		src_ptrs[t] = (uint64_t)(uintptr_t)src[t];
		dst_ptrs[t] = (uint64_t)(uintptr_t)dst[t];
	}
	layout_over(&sl, src_ptrs);
	layout_over(&dl, dst_ptrs);
	CHECK(cxlkv_gpu_layout_block_bytes(&sl) == (uint64_t)NT * TBLOCK);

	if (c_pool_open(&p, "cxlkv-kv-gpu-batch-test", POOL_SIZE, C_POOL_KV) != 0)
		return 1;
	pool = p.pool;
	kv = p.kv;
	memset(&go, 0, sizeof(go));
	go.size = sizeof(go);
	go.flags = CXLKV_GPU_F_CPU_REFERENCE;
	CHECK(cxlkv_gpu_open_pool(pool, &go, &gpu) == 0);
	CHECK(cxlkv_gpu_open(elsewhere, sizeof(elsewhere), &go, &other) == 0);

	if (kv && gpu && other) {
		/* One call publishes the chain from scattered GPU blocks. */
		CHECK(cxlkv_kv_gpu_put_chain(kv, gpu, &sl, NULL, keys, put_ids, 4, NULL, st) == 4);
		for (int i = 0; i < 4; i++)
			CHECK(st[i] == CXLKV_KV_RESERVED);
		CHECK(cxlkv_kv_lookup(kv, keys, 4) == 4);
		/* Again: everything is cached already. */
		CHECK(cxlkv_kv_gpu_put_chain(kv, gpu, &sl, NULL, keys, put_ids, 4, NULL, st) == 4);
		for (int i = 0; i < 4; i++)
			CHECK(st[i] == CXLKV_KV_EXISTS);

		/* One call reads them into other GPU blocks; a miss stays untouched. */
		CHECK(cxlkv_kv_gpu_get_many(kv, gpu, &dl, get_keys, get_ids, 4, NULL, st) == 3);
		CHECK(st[0] == 0 && st[1] == 0 && st[2] == CXLKV_KV_MISS && st[3] == 0);
		CHECK(same_block(0, 3) && same_block(1, 1) && same_block(3, 0));
		CHECK(zero_block(2));
		CHECK(zero_block(4) && zero_block(7));

		/* A chain below a parent that is not cached: nothing happens. */
		CHECK(cxlkv_kv_gpu_put_chain(kv, gpu, &sl, &get_keys[2], &get_keys[2] + 0, put_ids, 0, NULL, st) == 0);
		CHECK(cxlkv_kv_gpu_put_chain(kv, gpu, &sl, &get_keys[2], fresh, put_ids, 2, NULL, st) == 0);
		CHECK(st[0] == -ENOENT && st[1] == -ECANCELED);

		/* Bad arguments refuse the whole call. */
		CHECK_ERR(cxlkv_kv_gpu_put_chain(kv, other, &sl, NULL, keys, put_ids, 4, NULL, st), -EINVAL);
		CHECK(strncmp(cxlkv_last_error(), "cxlkv_kv_gpu_put_chain", 22) == 0);
		CHECK_ERR(cxlkv_kv_gpu_get_many(NULL, gpu, &dl, keys, get_ids, 4, NULL, st), -EINVAL);
		CHECK_ERR(cxlkv_kv_gpu_get_many(kv, gpu, NULL, keys, get_ids, 4, NULL, st), -EINVAL);
		CHECK_ERR(cxlkv_kv_gpu_get_many(kv, gpu, &dl, keys, NULL, 4, NULL, st), -EINVAL);
		CHECK(cxlkv_kv_lookup(kv, keys, 4) == 4);
	}
	cxlkv_gpu_close(other);
	cxlkv_gpu_close(gpu);
	c_pool_close(&p);
	if (failures) {
		fprintf(stderr, "kv_gpu_batch_c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("kv_gpu_batch_c_api_test: pass\n");
	return 0;
}
