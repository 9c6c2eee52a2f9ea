/* SPDX-License-Identifier: MIT */
/*
 * The near-memory engine's GPU kernels in libcxlkv-cuda.so (docs/near-memory.md): a
 * second function table, exported as CXLKV_CUDA_PNM_ENTRY beside the copy
 * kernels' table (cxlkv_cuda_abi.h), with the same rules: version + size
 * first, functions only appended, 0 or a negative errno, last_error() on the
 * calling thread.
 */
#ifndef CXLKV_PNM_ABI_H
#define CXLKV_PNM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CXLKV_CUDA_PNM_ABI_VERSION 1
#define CXLKV_CUDA_PNM_ENTRY "cxlkv_cuda_pnm_get_ops"

/*
 * Page digests: K is `rows` blocks (one per (layer, KV head)) of `ntokens`
 * rows of head_dim elements ([rows][ntokens][head_dim], device memory); the
 * output is [rows][npages][2][head_dim] (min then max per page of
 * page_tokens tokens; the last page may be partial), npages =
 * ceil(ntokens / page_tokens).  dtype: 0 f32, 1 bf16, 2 f16 (enum
 * cxlkv_pnm_dtype).  Exact: the min and max elements are copied bit for bit.
 */
struct cxlkv_pnm_digest_args {
	uint64_t k;           /* device pointer */
	uint64_t out;         /* device pointer */
	uint64_t ntokens;
	uint32_t rows;
	uint32_t head_dim;
	uint32_t page_tokens;
	uint32_t dtype;
};

/*
 * Partial attention over pages resident in device memory (the hybrid
 * steady-token mode's GPU part): for each of nq query heads i (float row
 * q[i][head_dim]), softmax(scale * q.K) V over the tokens of the pages of its
 * KV head i / group, written as out[i][head_dim] (float) and lse[i] (natural
 * log of the sum of exp(scale * q.k); -inf with out 0 when it has no pages),
 * so that it merges exactly with other partials by log-sum-exp.  The pages
 * of KV head h are entries page_start[h] .. page_start[h + 1] - 1: page_k[e]
 * is the device address of the page's K rows (page_ntok[e] rows of head_dim
 * elements of dtype), its V rows are v_offset bytes after them.
 */
struct cxlkv_pnm_attend_args {
	uint64_t q;           /* device: float [nq][head_dim] */
	uint64_t out;         /* device: float [nq][head_dim] */
	uint64_t lse;         /* device: float [nq] */
	uint64_t page_start;  /* device: uint32 [nq / group + 1] */
	uint64_t page_k;      /* device: uint64 [entries] */
	uint64_t page_ntok;   /* device: uint32 [entries] */
	uint64_t v_offset;    /* bytes from a page's K rows to its V rows */
	uint32_t nq;
	uint32_t group;       /* query heads per KV head; nq is a multiple of it */
	uint32_t head_dim;
	uint32_t dtype;       /* as cxlkv_pnm_digest_args */
	float    scale;
	uint32_t reserved;
};

struct cxlkv_cuda_pnm_ops {
	uint32_t abi_version; /* CXLKV_CUDA_PNM_ABI_VERSION */
	uint32_t size;        /* sizeof(struct cxlkv_cuda_pnm_ops) as the library was built */
	const char *(*last_error)(void);
	/* One launch (stream-ordered; returns once enqueued). */
	int (*digest)(const struct cxlkv_pnm_digest_args *args, void *stream);
	/* Appended (a library built before it has a smaller size): one launch. */
	int (*attend)(const struct cxlkv_pnm_attend_args *args, void *stream);
};

typedef const struct cxlkv_cuda_pnm_ops *(*cxlkv_cuda_pnm_get_ops_fn)(uint32_t abi_version);
const struct cxlkv_cuda_pnm_ops *cxlkv_cuda_pnm_get_ops(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_PNM_ABI_H */
