/* SPDX-License-Identifier: MIT */
/*
 * The C ABI between libcxlkv (the runtime, which never links CUDA) and
 * libcxlkv-cuda.so (the kernels and every CUDA call), which the runtime
 * loads with dlopen when a GPU path is asked for.
 *
 * The library exports one symbol, CXLKV_CUDA_ENTRY, returning a table of
 * function pointers.  The table starts with the ABI version and its own
 * size: a caller accepts a table whose version equals the one it was built
 * with and whose size is at least the size it knows; new functions are only
 * ever appended (size grows, version stays), an incompatible change bumps
 * the version.
 *
 * Every function returns 0 or a negative errno; the message of the last
 * failure on the calling thread (naming the CUDA error) is in last_error().
 * Streams and events are opaque (cudaStream_t / cudaEvent_t as void *;
 * NULL is the legacy default stream).
 *
 * Descriptors: addresses are as the GPU sees them -- device pointers, or
 * device pointers of registered (pinned, mapped) host memory.  Source and
 * destination ranges of one batch must not overlap.
 */
#ifndef CXLKV_CUDA_ABI_H
#define CXLKV_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CXLKV_CUDA_ABI_VERSION 1
#define CXLKV_CUDA_ENTRY "cxlkv_cuda_get_ops"
#define CXLKV_CUDA_LIBRARY_NAME "libcxlkv-cuda.so"

/* One contiguous copy: len bytes from src to dst.  Any alignment, any length. */
struct cxlkv_copy_desc {
	uint64_t src;
	uint64_t dst;
	uint64_t len;
};

/*
 * Sparse read: one list per (layer, head[, K|V]).  Output piece i of the
 * list (0 <= i < count) is piece_bytes copied from
 *     src_base + tokens[first + i] * src_stride
 * to  dst_base + i * dst_stride.
 * `first` is the list's position in the shared token-index array: lists are
 * in order and first[k+1] == first[k] + count[k] (a prefix sum).
 */
struct cxlkv_sparse_list {
	uint64_t src_base;
	uint64_t dst_base;
	uint64_t src_stride;
	uint64_t dst_stride;
	uint32_t first;
	uint32_t count;
};

/* Launch shapes of copy_shaped (cuda/copy_core.h): AUTO picks from the batch. */
#define CXLKV_CUDA_SHAPE_AUTO  0u
#define CXLKV_CUDA_SHAPE_BLOCK 1u /* one 256-thread block per 16 KiB tile */
#define CXLKV_CUDA_SHAPE_WARP  2u /* one warp per 4 KiB tile, 8 tiles per block */

/* host_register flags */
#define CXLKV_CUDA_REG_IOMEMORY (1u << 0) /* PFN / IO mappings: cudaHostRegisterIoMemory */

/* probe() result: what device 0 is. */
struct cxlkv_cuda_device_info {
	int32_t  device_count;
	int32_t  cc_major;
	int32_t  cc_minor;
	int32_t  can_use_host_pointer; /* registered host pointer usable as device pointer */
	uint64_t total_mem;
	char     name[96];
	int32_t  driver_version;       /* e.g. 13000 */
	int32_t  runtime_version;
};

struct cxlkv_cuda_ops {
	uint32_t abi_version; /* CXLKV_CUDA_ABI_VERSION */
	uint32_t size;        /* sizeof(struct cxlkv_cuda_ops) as the library was built */

	/* Message of the last failure on this thread ("" if none). */
	const char *(*last_error)(void);

	/* -ENOSYS: no usable CUDA driver; -ENODEV: driver but no GPU; 0: info filled. */
	int (*probe)(struct cxlkv_cuda_device_info *info);
	int (*set_device)(int device);

	/* Pin [p, p+len) for DMA (portable + mapped) and return its device address. */
	int (*host_register)(void *p, size_t len, uint32_t flags, uint64_t *dev_addr);
	int (*host_unregister)(void *p);

	/* One launch for the whole batch (stream-ordered; returns once enqueued). */
	int (*copy)(const struct cxlkv_copy_desc *descs, size_t n, void *stream);
	int (*sparse_copy)(const struct cxlkv_sparse_list *lists, size_t nlists,
			   const uint32_t *tokens, size_t ntokens, uint64_t piece_bytes,
			   void *stream);

	/* Plain CUDA helpers (baselines, tests, stream-completion waits). */
	int (*memcpy_async)(void *dst, const void *src, size_t n, void *stream);
	int (*stream_create)(void **stream);
	int (*stream_destroy)(void *stream);
	int (*stream_sync)(void *stream);
	/* Record a new event on `stream`; event_wait blocks until it completed and frees it. */
	int (*event_record)(void *stream, void **event);
	int (*event_wait)(void *event);
	int (*device_alloc)(void **p, size_t n);
	int (*device_free)(void *p);
	int (*host_alloc)(void **p, size_t n); /* pinned, mapped */
	int (*host_free)(void *p);

	/* ---- appended after the table's first version (same ABI version,
	 * larger table) ---- */
	/* Load every kernel of the library and its descriptor ring now, so the
	 * first transfer of a process pays no lazy module loading
	 * (CUDA_MODULE_LOADING=LAZY is the default since CUDA 12.2). */
	int (*warmup)(void *stream);
	/* copy() with a chosen launch shape (CXLKV_CUDA_SHAPE_*); copy() is AUTO. */
	int (*copy_shaped)(const struct cxlkv_copy_desc *descs, size_t n, uint32_t shape, void *stream);
	/* Events the caller keeps (event_record creates them): */
	int (*event_query)(void *event);   /* 0 completed, -EAGAIN not yet */
	int (*event_sync)(void *event);    /* block until completed; the event stays */
	int (*event_destroy)(void *event);
	int (*stream_wait_event)(void *stream, void *event); /* later work on stream waits for it (GPU side) */
};

typedef const struct cxlkv_cuda_ops *(*cxlkv_cuda_get_ops_fn)(uint32_t abi_version);

/* Exported by libcxlkv-cuda.so; NULL if it cannot serve `abi_version`. */
const struct cxlkv_cuda_ops *cxlkv_cuda_get_ops(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_CUDA_ABI_H */
