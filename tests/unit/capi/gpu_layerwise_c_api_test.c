/* SPDX-License-Identifier: MIT */
/*
 * Layer-wise load and save from C (docs/gpu.md "Layer-wise transfers") on the CPU reference GPU
 * backend: a chain saved layer by layer is invisible until save_finish and
 * then byte for byte what the GPU blocks held; a load delivers one event per
 * layer group, waits per layer, reports a miss, and finish unpins; a save
 * with a layer missing publishes nothing; on-demand pin statistics.
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
#define LAYERS 4
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
	struct cxlkv_gpu *gpu = NULL;
	struct cxlkv_gpu_layout sl, dl;
	struct cxlkv_gpu_load *load = NULL;
	struct cxlkv_gpu_save *save = NULL;
	struct cxlkv_gpu_pin_stats ps;
	struct cxlkv_kv_key keys[3] = {{11, 5}, {12, 5}, {13, 5}};
	struct cxlkv_kv_key get_keys[4] = {{11, 5}, {0x99, 0x99}, {12, 5}, {13, 5}};
	struct cxlkv_kv_key other[2] = {{21, 5}, {22, 5}};
	uint64_t put_ids[3] = {6, 2, 4}, get_ids[4] = {0, 1, 3, 5};
	int32_t st[4];

	for (int t = 0; t < NT; t++) {
		for (int i = 0; i < TBYTES; i++)
			src[t][i] = (unsigned char)(t * 29 + i * 13 + (i >> 6) + 1);
		src_ptrs[t] = (uint64_t)(uintptr_t)src[t];
		dst_ptrs[t] = (uint64_t)(uintptr_t)dst[t];
	}
	layout_over(&sl, src_ptrs);
	layout_over(&dl, dst_ptrs);

	if (c_pool_open(&p, "cxlkv-gpu-layerwise-test", POOL_SIZE, C_POOL_KV) != 0)
		return 1;
	pool = p.pool;
	kv = p.kv;
	memset(&go, 0, sizeof(go));
	go.size = sizeof(go);
	go.flags = CXLKV_GPU_F_CPU_REFERENCE;
	go.pin_chunk_bytes = 4 * MiB;
	CHECK(cxlkv_gpu_open_pool(pool, &go, &gpu) == 0);

	if (kv && gpu) {
		/* Save layer by layer: nothing visible until finish. */
		CHECK(cxlkv_kv_gpu_save_begin(kv, gpu, &sl, NULL, keys, put_ids, 3, st, &save) == 3);
		CHECK(save != NULL);
		for (int i = 0; i < 3; i++)
			CHECK(st[i] == CXLKV_KV_RESERVED);
		for (uint32_t l = 0; l < LAYERS; l++) {
			CHECK(cxlkv_gpu_save_layer(save, l, NULL) == 0);
			CHECK(cxlkv_kv_lookup(kv, keys, 3) == 0);
		}
		CHECK_ERR(cxlkv_gpu_save_layer(save, LAYERS, NULL), -EINVAL);
		CHECK(cxlkv_gpu_save_finish(save, st) == 3);
		CHECK(st[0] == CXLKV_KV_RESERVED && st[2] == CXLKV_KV_RESERVED);
		CHECK(cxlkv_kv_lookup(kv, keys, 3) == 3);

		/* Load in groups of 3 layers: 2 groups, a miss among the keys. */
		CHECK(cxlkv_kv_gpu_load_layers(kv, gpu, &dl, get_keys, get_ids, 4, 3, NULL, st, &load) == 3);
		CHECK(load != NULL);
		if (load) {
			CHECK(st[1] == CXLKV_KV_MISS);
			CHECK(cxlkv_gpu_load_groups(load) == 2);
			CHECK(cxlkv_gpu_load_event(load, 0) != NULL);
			CHECK(cxlkv_gpu_load_event(load, LAYERS) == NULL);
			CHECK(cxlkv_gpu_load_wait(load, 0) == 0);
			CHECK(cxlkv_gpu_load_stream_wait(load, 3, NULL) == 0);
			CHECK(cxlkv_gpu_load_ready(load, 3) == 1);
			CHECK_ERR(cxlkv_gpu_load_wait(load, LAYERS), -EINVAL);
			CHECK(cxlkv_gpu_load_finish(load, st) == 3);
			CHECK(st[0] == 0 && st[1] == CXLKV_KV_MISS && st[2] == 0 && st[3] == 0);
			CHECK(same_block(0, 6) && same_block(3, 2) && same_block(5, 4));
			CHECK(zero_block(1));
		}

		/* A save missing a layer publishes nothing and releases the blocks. */
		CHECK(cxlkv_kv_gpu_save_begin(kv, gpu, &sl, &keys[2], other, put_ids, 2, st, &save) == 2);
		CHECK(cxlkv_gpu_save_layer(save, 0, NULL) == 0);
		CHECK(cxlkv_gpu_save_finish(save, st) == 0);
		CHECK(st[0] == -ENODATA && st[1] == -ECANCELED);
		CHECK(cxlkv_kv_lookup(kv, other, 2) == 0);
		/* ... and an aborted save too. */
		CHECK(cxlkv_kv_gpu_save_begin(kv, gpu, &sl, &keys[2], other, put_ids, 2, st, &save) == 2);
		cxlkv_gpu_save_abort(save);
		CHECK(cxlkv_kv_gpu_put_chain(kv, gpu, &sl, &keys[2], other, put_ids, 2, NULL, st) == 2);
		CHECK(st[0] == CXLKV_KV_RESERVED);

		/* Pinning was on demand: only touched 4 MiB chunks are pinned. */
		memset(&ps, 0, sizeof(ps));
		ps.size = sizeof(ps);
		CHECK(cxlkv_gpu_pin_stats(gpu, &ps) == 0);
		CHECK(ps.chunk_bytes == 4 * MiB);
		CHECK(ps.chunks_total == POOL_SIZE / (4 * MiB));
		CHECK(ps.chunks_pinned >= 1 && ps.chunks_pinned < ps.chunks_total);
		CHECK(ps.on_demand == ps.chunks_pinned);
		CHECK(cxlkv_gpu_pin_range(gpu, 0, POOL_SIZE) == 0);
		CHECK(cxlkv_gpu_pin_stats(gpu, &ps) == 0);
		CHECK(ps.chunks_pinned == ps.chunks_total);

		/* Bad arguments. */
		CHECK_ERR(cxlkv_kv_gpu_load_layers(kv, gpu, &dl, get_keys, get_ids, 4, 1, NULL, st, NULL), -EINVAL);
		CHECK_ERR(cxlkv_kv_gpu_save_begin(NULL, gpu, &sl, NULL, keys, put_ids, 3, st, &save), -EINVAL);
		CHECK(save == NULL);
		CHECK_ERR(cxlkv_gpu_load_finish(NULL, st), -EINVAL);
		CHECK_ERR(cxlkv_gpu_save_layer(NULL, 0, NULL), -EINVAL);
	}
	cxlkv_gpu_close(gpu);
	c_pool_close(&p);
	if (failures) {
		fprintf(stderr, "gpu_layerwise_c_api_test: %d check(s) failed\n", failures);
		return 1;
	}
	printf("gpu_layerwise_c_api_test: pass\n");
	return 0;
}
