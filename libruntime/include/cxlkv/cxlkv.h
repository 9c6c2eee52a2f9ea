/* SPDX-License-Identifier: MIT */
/*
 * cxlkv C API.  Every function returns 0 (or a non-negative count) on
 * success and a negative errno on failure, as liburing does; the message of
 * the last error on this thread is in cxlkv_last_error().  Option structs
 * carry their own size in their first field so they can grow.
 */
#ifndef CXLKV_CXLKV_H
#define CXLKV_CXLKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CXLKV_API_VERSION 1

/* One contiguous piece of caller memory in a gather / scatter list. */
struct cxlkv_chunk {
	void  *addr;
	size_t len;
};

/* Message of the last failed call on this thread ("" if none). */
const char *cxlkv_last_error(void);

struct cxlkv_pool;

struct cxlkv_format_opts {
	size_t   size;        /* sizeof(struct cxlkv_format_opts) */
	uint64_t pool_size;   /* shm:/file: bytes (0: from URI / existing file) */
	uint32_t max_nodes;   /* 0: default 16 */
	uint32_t flags;       /* CXLKV_FORMAT_F_* */
	/* since API 1 + standard-format sizing; older (smaller) structs get defaults */
	uint32_t max_locks;   /* 0: default 1024 (CXLKV_DEFAULT_MAX_LOCKS) */
	uint32_t reserved;    /* 0 */
	uint64_t index_entries; /* 0: one per 64 KiB of kv space (power of two) */
	/* since the RPC (cxlkv_rpc.h): bytes of an "rpc" carve for the shared-memory
	 * RPC rings (rounded up to 2 MiB; 2 MiB hold 64 rings of 128 one-line
	 * slots); 0: none */
	uint64_t rpc_bytes;
};
#define CXLKV_FORMAT_F_FORCE        (1u << 0)   /* overwrite a valid pool */
#define CXLKV_FORMAT_F_NO_STANDARD  (1u << 1)   /* superblock only, no standard carves */
#define CXLKV_FORMAT_F_INDEX_SERVICE (1u << 2)  /* with the index service's "rpc.index" carve:
                                                 * the pool is in index-service mode (cxlkv_rpc.h) */

int  cxlkv_pool_format(const char *uri, const struct cxlkv_format_opts *opts);
int  cxlkv_pool_open(const char *uri, struct cxlkv_pool **out);
void cxlkv_pool_close(struct cxlkv_pool *pool);
void    *cxlkv_pool_base(struct cxlkv_pool *pool);
uint64_t cxlkv_pool_size(struct cxlkv_pool *pool);

/* offset <-> pointer; cxlkv_off_to_ptr returns NULL when out of range,
 * cxlkv_ptr_to_off returns CXLKV_BAD_OFFSET for a pointer outside the pool. */
#define CXLKV_BAD_OFFSET UINT64_MAX
void    *cxlkv_off_to_ptr(struct cxlkv_pool *pool, uint64_t off);
uint64_t cxlkv_ptr_to_off(struct cxlkv_pool *pool, const void *p);

struct cxlkv_carve_info {
	char     name[32];
	uint64_t offset;
	uint64_t size;
	uint32_t memtype;     /* enum cxlkv_memtype (uapi/cxlkv_pool.h) */
	uint32_t flags;
};
int cxlkv_carve_create(struct cxlkv_pool *pool, const char *name, uint64_t size,
		       uint32_t memtype, struct cxlkv_carve_info *out);
int cxlkv_carve_lookup(struct cxlkv_pool *pool, const char *name, struct cxlkv_carve_info *out);
/* Fills up to `max` entries; returns the number of carves. */
int cxlkv_carve_list(struct cxlkv_pool *pool, struct cxlkv_carve_info *out, int max);
/* Refuses (-EPERM) system carves made by format; CXLKV_CARVE_RM_F_FORCE removes them too. */
int cxlkv_carve_remove(struct cxlkv_pool *pool, const char *name);
#define CXLKV_CARVE_RM_F_FORCE (1u << 0)
int cxlkv_carve_remove_flags(struct cxlkv_pool *pool, const char *name, uint32_t flags);

/* CPU gather-write / scatter-read between a chunk list and one pool block at
 * pool offset dst_off / src_off.  0 on success (the written block is in pool
 * memory when gather_write returns: publish its index entry afterwards);
 * -ERANGE when the block does not fit in the pool, -EINVAL / -EOVERFLOW for
 * a bad chunk list.  Nothing is copied on error. */
int cxlkv_gather_write(struct cxlkv_pool *pool, uint64_t dst_off,
		       const struct cxlkv_chunk *chunks, size_t nchunks);
int cxlkv_scatter_read(struct cxlkv_pool *pool, uint64_t src_off,
		       const struct cxlkv_chunk *chunks, size_t nchunks);


/* ---- sync: nodes, cross-host locks, allocator, object store ------------- */
/*
 * A process attaches to a pool as one node (0 .. max_nodes-1); processes of
 * the same host use the same node id and share its node-local state.  Lock
 * ids below CXLKV_LOCK_FIRST_USER (128, uapi/cxlkv_ctrl.h) are reserved:
 * the lock calls refuse them with -EINVAL.
 * A lock manager must run for the pool (cxlkvd, or
 * cxlkv_lock_manager_start() in-process).
 */
struct cxlkv_node;
struct cxlkv_lock_manager;

struct cxlkv_node_opts {
	size_t   size;          /* sizeof(struct cxlkv_node_opts); at least up to `node`
				 * (0 and unknown flags: -EINVAL) */
	uint32_t node;          /* node id */
	uint32_t flags;         /* CXLKV_NODE_F_* */
	uint32_t heartbeat_ms;  /* 0: default 250 */
	uint32_t reserved;
};
#define CXLKV_NODE_F_HEARTBEAT  (1u << 0)   /* publish heartbeats from a thread */

int  cxlkv_node_attach(struct cxlkv_pool *pool, const struct cxlkv_node_opts *opts,
		       struct cxlkv_node **out);
void cxlkv_node_detach(struct cxlkv_node *node);
/* Remove this host's node-local file of `node` (/dev/shm/cxlkv-node-<pool
 * id>-<node>) once no process of that node uses it: what a tool created.
 * A missing file is not an error.  0 or -errno (-EINVAL: node out of range). */
int  cxlkv_node_remove_local(struct cxlkv_pool *pool, uint32_t node);

/* 0 acquired; 1 acquired after recovering from a holder on this node that
 * died (its data may be half-updated); -ETIMEDOUT (timed), -errno. */
int cxlkv_lock_acquire(struct cxlkv_node *node, uint32_t lock_id);
int cxlkv_lock_acquire_timeout(struct cxlkv_node *node, uint32_t lock_id, uint64_t timeout_ns);
int cxlkv_lock_release(struct cxlkv_node *node, uint32_t lock_id);

struct cxlkv_lock_manager_opts {
	size_t   size;          /* sizeof(struct cxlkv_lock_manager_opts) */
	uint32_t node;          /* recorded in the lease */
	uint32_t lease_ms;      /* 0: default 2000 */
	uint32_t flags;         /* CXLKV_LOCK_MANAGER_F_* */
	uint32_t reserved;
};
#define CXLKV_LOCK_MANAGER_F_WAIT  (1u << 0)   /* wait for the lease instead of -EBUSY */

/* Run the pool's lock manager on a thread of this process. */
int  cxlkv_lock_manager_start(struct cxlkv_pool *pool, const struct cxlkv_lock_manager_opts *opts,
			      struct cxlkv_lock_manager **out);
void cxlkv_lock_manager_stop(struct cxlkv_lock_manager *mgr);

/* Allocate >= size bytes (64 B aligned, size >= 1: 0 is -EINVAL) from the kv
 * carve; *off = pool offset. */
int cxlkv_alloc(struct cxlkv_node *node, uint64_t size, uint64_t *off);
/* Free a block allocated by any node. */
int cxlkv_free(struct cxlkv_node *node, uint64_t off);

struct cxlkv_heap_stats {
	uint64_t allocs, frees, remote_frees_sent, remote_frees_drained;
	uint64_t bytes_in_use, chunks_owned, chunk_refills, chunk_returns, enospc;
};
int cxlkv_heap_stats(struct cxlkv_node *node, struct cxlkv_heap_stats *out);

/* Named roots: name (1..40 bytes) -> pool offset (below the pool's size:
 * -ERANGE otherwise). */
int cxlkv_obj_put(struct cxlkv_node *node, const char *name, uint64_t off);
int cxlkv_obj_get(struct cxlkv_node *node, const char *name, uint64_t *off);
int cxlkv_obj_destroy(struct cxlkv_node *node, const char *name);

/* ---- GPU path ------------------------------------------------------------
 * Kernels live in libcxlkv-cuda.so, loaded at run time (next to libcxlkv, or
 * $CXLKV_CUDA_LIB); libcxlkv never links CUDA.  Pool blocks are named by
 * their offset from the base of the range given to cxlkv_gpu_open; GPU
 * tensors by device pointers.  Streams are cudaStream_t passed as void *
 * (NULL: the default stream).  Everything is plain C types and pointers,
 * usable from Python ctypes (see cuda/cxlkv_gpu_ctypes.py).
 */

/* 0 and a description in msg when a GPU is usable; otherwise the reason in
 * msg and -ENOENT (library not found), -EPROTO (incompatible library),
 * -ENOSYS (no CUDA driver), -ENODEV (no GPU). */
int cxlkv_gpu_probe(char *msg, size_t msg_len);

#define CXLKV_GPU_LAYOUT_LAYER_FIRST 0u /* tensors[2l], tensors[2l+1]: layer l's K, V [blocks, tokens, heads, head] */
#define CXLKV_GPU_LAYOUT_BLOCK_FIRST 1u /* tensors[0]: [blocks, layers, 2, tokens, heads, head] */

struct cxlkv_gpu_layout {
	size_t          size;          /* sizeof(struct cxlkv_gpu_layout) */
	uint32_t        kind;          /* CXLKV_GPU_LAYOUT_* */
	uint32_t        num_layers;
	uint32_t        num_kv_heads;
	uint32_t        head_size;     /* elements */
	uint32_t        block_tokens;
	uint32_t        elem_bytes;    /* 2 for fp16/bf16, 1 for fp8 */
	uint64_t        num_blocks;    /* blocks in each tensor */
	uint64_t        block_stride;  /* bytes between blocks in a tensor; 0: dense */
	const uint64_t *tensors;       /* device pointers, 2*num_layers or 1 */
	size_t          ntensors;
};
/* Bytes of one pool block for this layout (0 if the layout is invalid). */
uint64_t cxlkv_gpu_layout_block_bytes(const struct cxlkv_gpu_layout *layout);

struct cxlkv_gpu;

struct cxlkv_gpu_opts {
	size_t   size;             /* sizeof(struct cxlkv_gpu_opts) */
	uint32_t flags;            /* CXLKV_GPU_F_* */
	int32_t  device;           /* CUDA device ordinal */
	uint64_t pin_chunk_bytes;  /* registration unit; 0: 1 GiB */
};
#define CXLKV_GPU_F_CPU_REFERENCE  (1u << 0) /* no GPU: CPU reference backend (tests, examples) */
#define CXLKV_GPU_F_FORCE_IOMEMORY (1u << 1) /* register with cudaHostRegisterIoMemory only */
#define CXLKV_GPU_F_NO_IOMEMORY    (1u << 2) /* never fall back to it */
#define CXLKV_GPU_F_PIN_EAGER      (1u << 3) /* register every chunk at open (slow for large pools) */
#define CXLKV_GPU_F_PIN_BACKGROUND (1u << 4) /* pre-register untouched chunks on a background thread */

/* Load libcxlkv-cuda and open [base, base+size) (a pool mapping, e.g.
 * cxlkv_pool_base()/cxlkv_pool_size()) for DMA.  opts may be NULL.
 * The range is registered with the GPU in chunks of pin_chunk_bytes when a
 * transfer first touches them (or ahead of time with PIN_BACKGROUND /
 * PIN_EAGER), so opening takes well under a second whatever the size; the
 * kernels are loaded at open (no lazy module loading on the first
 * transfer).  See cxlkv_gpu_pin_stats. */
int  cxlkv_gpu_open(void *base, uint64_t size, const struct cxlkv_gpu_opts *opts,
		    struct cxlkv_gpu **out);
/* The same for a whole pool mapping. */
int  cxlkv_gpu_open_pool(struct cxlkv_pool *pool, const struct cxlkv_gpu_opts *opts,
			 struct cxlkv_gpu **out);
/* Unpin and release (after the caller's streams are idle). */
void cxlkv_gpu_close(struct cxlkv_gpu *gpu);
/* "host-register", "io-memory" or "cpu-reference". */
const char *cxlkv_gpu_pin_method(struct cxlkv_gpu *gpu);

/* GPU blocks block_ids[i] -> pool block at pool_offs[i] (gather) and back
 * (scatter); one kernel launch, enqueued on stream. */
int cxlkv_gpu_gather(struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
		     const uint64_t *block_ids, const uint64_t *pool_offs, size_t nblocks,
		     void *stream);
int cxlkv_gpu_scatter(struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
		      const uint64_t *block_ids, const uint64_t *pool_offs, size_t nblocks,
		      void *stream);

/* Sparse read: for list k, piece i (of piece_bytes) of token t = tokens[first_k + i]
 * comes from pool offset pool_off + t * pool_stride and goes to
 * dst + i * dst_stride; lists take their tokens from `tokens` in order. */
struct cxlkv_gpu_sparse_list {
	uint64_t pool_off;
	uint64_t pool_stride;
	uint64_t dst;          /* device pointer */
	uint64_t dst_stride;
	uint32_t count;        /* tokens in this list */
	uint32_t reserved;     /* 0 */
};
int cxlkv_gpu_sparse_read(struct cxlkv_gpu *gpu, const struct cxlkv_gpu_sparse_list *lists,
			  size_t nlists, const uint32_t *tokens, size_t ntokens,
			  uint64_t piece_bytes, void *stream);

/* Wait for everything enqueued on stream. */
int cxlkv_gpu_sync(struct cxlkv_gpu *gpu, void *stream);

/* ---- GPU path: on-demand pinning (docs/gpu.md "On-demand pinning") ---------------------------------- */
struct cxlkv_gpu_pin_stats {
	size_t   size;              /* sizeof(struct cxlkv_gpu_pin_stats), set by the caller */
	uint64_t chunk_bytes;       /* registration unit */
	uint64_t chunks_total;      /* chunks of the range */
	uint64_t chunks_pinned;     /* registered now */
	uint64_t bytes_pinned;
	uint64_t on_demand;         /* chunks registered because a transfer touched them */
	uint64_t background;        /* chunks registered ahead of time (background / eager / pin_range) */
	double   pin_seconds;       /* time spent registering, all chunks */
	double   max_chunk_seconds; /* slowest single registration */
	double   open_seconds;      /* cxlkv_gpu_open's own registration time (0 unless PIN_EAGER) */
	uint32_t background_running;
	uint32_t reserved;
};
int cxlkv_gpu_pin_stats(struct cxlkv_gpu *gpu, struct cxlkv_gpu_pin_stats *out);
/* Register the chunks overlapping [off, off+len) now (a hot range), or
 * start the background pre-pin of every chunk (len == UINT64_MAX). */
int cxlkv_gpu_pin_range(struct cxlkv_gpu *gpu, uint64_t off, uint64_t len);

/* ---- KV store (prefix index + blocks) -------------------------------------
 * Write: reserve -> write (gather the engine's chunks) -> publish.
 * Read:  lookup (longest cached prefix) -> pin -> fetch (scatter) -> unpin.
 * A cxlkv_kv handle is one node of the pool (attached with heartbeats); use
 * it from one thread at a time.  A lock manager must run for the pool.
 * Block keys are 128-bit (keys.hpp: chained XXH3-128 with a fixed seed).
 */
struct cxlkv_kv;
struct cxlkv_kv_key { uint64_t lo, hi; };

struct cxlkv_kv_opts {
	size_t   size;          /* sizeof(struct cxlkv_kv_opts) */
	uint32_t node;          /* node id of this process */
	uint32_t flags;         /* 0, or one CXLKV_KV_INDEX_* below */
};
/* How the store reaches the prefix index (docs/rpc.md "The index service").  Neither flag: the
 * CXLKV_INDEX_MODE environment variable ("locks" / "service") when set, else
 * the pool's mode (index service when it has the "rpc.index" carve, see
 * cxlkv_rpc.h).  In service mode a service that is down makes the calls fail
 * with -ECONNRESET / -ETIMEDOUT (cxlkv_kv_open: its error), never hang. */
#define CXLKV_KV_INDEX_LOCKS   (1u << 0)  /* this process takes the index's stripe locks */
#define CXLKV_KV_INDEX_SERVICE (1u << 1)  /* through the pool's index service */
int  cxlkv_kv_open(struct cxlkv_pool *pool, const struct cxlkv_kv_opts *opts, struct cxlkv_kv **out);
void cxlkv_kv_close(struct cxlkv_kv *kv);

/* Keys of the full blocks of `tokens` (block_tokens each), chained; extras
 * (model id, salt) may be NULL.  Returns the number of keys (<= max). */
int cxlkv_kv_block_keys(const uint32_t *tokens, size_t ntokens, size_t block_tokens,
			const void *extras, size_t nextras, struct cxlkv_kv_key *out, size_t max);

/* XXH3-64 of data[0..len): the payload hash the SSD tier checks its
 * blocks with, for callers that carry KV blocks outside the pool (the
 * Python remote tier verifies each block it receives with it) and would
 * otherwise need a hash library of their own.  Not cryptographic. */
uint64_t cxlkv_checksum64(const void *data, size_t len);

/* Keys of an engine's own block hashes (vLLM's request.block_hashes, ...):
 * key i = BLAKE2b-128(personal "cxlkv-ekey-v1", u32le(ns_len) || ns || item i),
 * digest bytes 0..7 lo, 8..15 hi (little-endian), the all-zero key made lo = 1
 * (the definition of cxlkv.keys_from_hashes).  `items` holds n encoded hashes
 * one after the other, item i item_lens[i] bytes: a tag byte ('b' bytes,
 * 's' UTF-8 text, 'i' a 32-byte little-endian two's-complement int) and the
 * hash.  Returns n, or -EINVAL (the lengths do not add up to items_len). */
int cxlkv_kv_engine_keys(const void *ns, size_t ns_len, const void *items, size_t items_len,
			 const uint32_t *item_lens, size_t n, struct cxlkv_kv_key *out);

/* Number of leading blocks of chain[0..n) that are cached (no lock taken). */
int cxlkv_kv_lookup(struct cxlkv_kv *kv, const struct cxlkv_kv_key *chain, size_t n);

#define CXLKV_KV_RESERVED     0   /* this caller writes it / the operation succeeded on it */
#define CXLKV_KV_EXISTS       1   /* already cached (READY): nothing to write */
#define CXLKV_KV_BUSY         2   /* another node is writing it */
#define CXLKV_KV_MISS         3   /* not cached: pin / fetch of a block that is not READY */
struct cxlkv_kv_block {           /* a reservation or a pin */
	struct cxlkv_kv_key key;
	uint32_t slot;
	uint32_t status;          /* CXLKV_KV_*; from a batch call also (uint32_t) of a
				     negative errno for a block it did not get */
	uint64_t length;
	uint64_t loc_off;
	uint8_t  loc_dev, loc_tier;
	uint16_t pin_tag;         /* a pin: which pin of the handle's store (0: none); a
				     handle is valid only until its own unpin */
	uint32_t version;         /* entry version seen at reserve / pin (fencing) */
};
#ifdef __cplusplus
static_assert(sizeof(struct cxlkv_kv_block) == 48, "struct cxlkv_kv_block is 48 bytes");
#else
_Static_assert(sizeof(struct cxlkv_kv_block) == 48, "struct cxlkv_kv_block is 48 bytes");
#endif
/* parent: the previous block of the chain, NULL for the first.  Returns
 * CXLKV_KV_RESERVED / _EXISTS / _BUSY, -ENOENT (parent not cached),
 * -ENOSPC (everything pinned or being written), -EINVAL. */
int cxlkv_kv_reserve(struct cxlkv_kv *kv, const struct cxlkv_kv_key *key, const struct cxlkv_kv_key *parent,
		     uint64_t bytes, struct cxlkv_kv_block *out);
int cxlkv_kv_write(struct cxlkv_kv *kv, const struct cxlkv_kv_block *res,
		   const struct cxlkv_chunk *chunks, size_t nchunks);
/* -EAGAIN: the parent is not published yet (retry). */
int cxlkv_kv_publish(struct cxlkv_kv *kv, const struct cxlkv_kv_block *res);
int cxlkv_kv_abort(struct cxlkv_kv *kv, const struct cxlkv_kv_block *res);
/* -ENOENT: not cached. */
int cxlkv_kv_pin(struct cxlkv_kv *kv, const struct cxlkv_kv_key *key, struct cxlkv_kv_block *out);
int cxlkv_kv_fetch(struct cxlkv_kv *kv, const struct cxlkv_kv_block *pin,
		   const struct cxlkv_chunk *chunks, size_t nchunks);
int cxlkv_kv_unpin(struct cxlkv_kv *kv, const struct cxlkv_kv_block *pin);

/* ---- KV store batches: many blocks per call -------------------------------
 * Each call takes n blocks and `status` (n entries; may be NULL) and returns
 * the number of blocks that succeeded, or a negative errno when the whole
 * call is refused (bad arguments: then nothing was done).  status[i]:
 *   CXLKV_KV_RESERVED (0)  reserved by this caller / the operation succeeded
 *   CXLKV_KV_EXISTS        already cached (READY): nothing to write
 *   CXLKV_KV_BUSY          another node is writing it
 *   CXLKV_KV_MISS          not cached (pin / fetch / get)
 *   -errno                 this block failed (-ENOSPC, -ENOENT parent not
 *                          cached, -EAGAIN parent not yet published, -ESTALE
 *                          handle no longer valid, -EIO, ...)
 *   -ECANCELED             not attempted: an earlier block of the chain failed
 * One block failing does not stop the others, except along a chain
 * (reserve_chain, put_chain).  When some blocks fail, cxlkv_last_error()
 * holds the message of the first one.
 * Handles (struct cxlkv_kv_block) whose status is not CXLKV_KV_RESERVED (0)
 * are skipped by write / publish / abort / fetch / unpin: their status[i] is
 * the handle's status and they do not count.
 * Chunk lists of all blocks are concatenated in `chunks`: block i has
 * nchunks[i] of them (a skipped block's chunks are stepped over).
 * Handles are checked per block with one fresh read of the block's index
 * entry (a batch's in one sweep): write / fetch refuse a handle whose entry
 * changed since reserve / pin (-ESTALE: published, aborted, evicted,
 * reclaimed, another version) or that names another location (-EINVAL:
 * forged) before touching its bytes, and check again after the copy
 * (-ESTALE: the block was reclaimed or evicted under it; fetched bytes of
 * such a block are not to be used); publish checks before publishing.
 * A caller that dies mid-batch leaves what it published (along a chain
 * always a prefix); its reservations are reclaimed by the next node that
 * meets them (or by reclaim), their space freed, and its pins stop
 * protecting their blocks.
 */
/* keys[0] is a child of parent (NULL: a root), keys[i] a child of keys[i-1].
 * Stops at the first block that is neither RESERVED nor EXISTS (a BUSY block,
 * which another node is writing, stops it too: retry later); returns how
 * many leading blocks are RESERVED or EXISTS.  Blocks
 * reserved stay reserved whatever happens later in the chain: write and
 * publish them, or abort them. */
int cxlkv_kv_reserve_chain(struct cxlkv_kv *kv, const struct cxlkv_kv_key *parent,
			   const struct cxlkv_kv_key *keys, size_t n, uint64_t bytes,
			   struct cxlkv_kv_block *out, int32_t *status);
/* Writes the RESERVED blocks; the others are skipped. */
int cxlkv_kv_write_many(struct cxlkv_kv *kv, const struct cxlkv_kv_block *blocks, size_t n,
			const struct cxlkv_chunk *chunks, const uint32_t *nchunks, int32_t *status);
/* Publishes in the given order (parents first).  Publish only blocks whose
 * write succeeded and abort the others: publish cannot tell whether a
 * payload was written. */
int cxlkv_kv_publish_many(struct cxlkv_kv *kv, const struct cxlkv_kv_block *blocks, size_t n,
			  int32_t *status);
/* Aborts in reverse order (children before their parents). */
int cxlkv_kv_abort_many(struct cxlkv_kv *kv, const struct cxlkv_kv_block *blocks, size_t n,
			int32_t *status);
/* out[i].status / status[i]: 0 pinned, CXLKV_KV_MISS, or -errno. */
int cxlkv_kv_pin_many(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, size_t n,
		      struct cxlkv_kv_block *out, int32_t *status);
int cxlkv_kv_fetch_many(struct cxlkv_kv *kv, const struct cxlkv_kv_block *pins, size_t n,
			const struct cxlkv_chunk *chunks, const uint32_t *nchunks, int32_t *status);
int cxlkv_kv_unpin_many(struct cxlkv_kv *kv, const struct cxlkv_kv_block *pins, size_t n,
			int32_t *status);
/* reserve_chain -> write the reserved blocks -> publish them, parents first
 * (a `parent` another node is writing is waited for, up to 5 s).  status[i]:
 * RESERVED (written and published by this call), EXISTS, BUSY (another node
 * is writing it), -errno, -ECANCELED.  Every block this call reserved is
 * published or aborted before it returns.  Returns how many blocks are
 * RESERVED or EXISTS (EXISTS counts as success). */
int cxlkv_kv_put_chain(struct cxlkv_kv *kv, const struct cxlkv_kv_key *parent,
		       const struct cxlkv_kv_key *keys, size_t n, uint64_t bytes,
		       const struct cxlkv_chunk *chunks, const uint32_t *nchunks, int32_t *status);
/* cxlkv_kv_put_chain of nchains chains in one call (one engine step's
 * requests): chain j is the next chain_lens[j] of `keys`, a child of
 * parents[j] (the all-zero key, or parents NULL: a root).  The chains are
 * put in order, so a chain may start below a block an earlier chain of the
 * call publishes.  Chunk lists, nchunks and status run over all blocks
 * (sum of chain_lens = n).  Returns how many blocks are RESERVED or EXISTS,
 * or -EINVAL (nothing done) when the lengths do not add up. */
int cxlkv_kv_put_chains(struct cxlkv_kv *kv, const struct cxlkv_kv_key *parents, const uint32_t *chain_lens,
			size_t nchains, const struct cxlkv_kv_key *keys, size_t n, uint64_t bytes,
			const struct cxlkv_chunk *chunks, const uint32_t *nchunks, int32_t *status);
/* pin -> fetch -> unpin.  status[i]: 0 fetched, CXLKV_KV_MISS, -errno.
 * Returns how many were fetched. */
int cxlkv_kv_get_many(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, size_t n,
		      const struct cxlkv_chunk *chunks, const uint32_t *nchunks, int32_t *status);

/* ---- KV store batches straight from an engine's step ---------------------
 * An engine step's saves or loads in one call, from what the engine has at
 * hand: its own block hashes and block ids.  The keys are those of
 * cxlkv_kv_engine_keys (namespace ns, items encoded as there) and the chunk
 * lists those of the engine's paged cache, built from `paged` (docs/engines.md
 * "One call a step"): every chunk list a caller would otherwise build per
 * call, and every key it would hash, cost more than a small block's copy. */
struct cxlkv_paged_chunks {       /* where engine block b lies, in pool order */
	size_t          size;     /* sizeof(struct cxlkv_paged_chunks) */
	size_t          nchunks;  /* chunks per block */
	const uint64_t *addr;     /* chunk i of block 0 */
	const int64_t  *stride;   /* bytes from block b's chunk i to block b+1's */
	const uint64_t *len;      /* bytes of chunk i */
	uint64_t        num_blocks;   /* block ids are 0 .. num_blocks-1 */
};
/* Hashes of n blocks and the parents of nchains chains, one after the other
 * in `items` (n + nchains items, lengths in item_lens): chain j is the next
 * chain_lens[j] blocks, a child of parent item j, or a root where that item
 * is empty (length 0).  Block i is engine block block_ids[i].  Puts as
 * cxlkv_kv_put_chains; keys_out (may be NULL) gets the n blocks' keys.
 * -EINVAL (nothing done) for lengths that do not add up, a block id out of
 * range or a malformed `paged`. */
int cxlkv_kv_engine_put_chains(struct cxlkv_kv *kv, const struct cxlkv_paged_chunks *paged, const void *ns,
			       size_t ns_len, const void *items, size_t items_len, const uint32_t *item_lens,
			       size_t n, const uint32_t *chain_lens, size_t nchains, const uint64_t *block_ids,
			       int32_t *status, struct cxlkv_kv_key *keys_out);
/* The same with the keys at hand instead of the hashes (those of
 * cxlkv_kv_engine_keys, made once by whoever had them: an engine's
 * scheduler makes every rank's keys for its lookups, docs/engines.md "One
 * call a step"): keys[0..n) the blocks', parents[0..nchains) the chains'
 * (all-zero: a root).  Puts as cxlkv_kv_engine_put_chains. */
int cxlkv_kv_paged_put_chains(struct cxlkv_kv *kv, const struct cxlkv_paged_chunks *paged,
			      const struct cxlkv_kv_key *keys, size_t n, const struct cxlkv_kv_key *parents,
			      const uint32_t *chain_lens, size_t nchains, const uint64_t *block_ids,
			      int32_t *status);
/* Reads the blocks of n hashes (items, item_lens as above, no parents)
 * into engine blocks block_ids, as cxlkv_kv_get_many. */
int cxlkv_kv_engine_get_many(struct cxlkv_kv *kv, const struct cxlkv_paged_chunks *paged, const void *ns,
			     size_t ns_len, const void *items, size_t items_len, const uint32_t *item_lens,
			     size_t n, const uint64_t *block_ids, int32_t *status);
/* The same by the n blocks' keys (as cxlkv_kv_paged_put_chains). */
int cxlkv_kv_paged_get_many(struct cxlkv_kv *kv, const struct cxlkv_paged_chunks *paged,
			    const struct cxlkv_kv_key *keys, size_t n, const uint64_t *block_ids, int32_t *status);

/* ---- KV store batches with GPU tensors ---------------------------------------
 * Blocks of a paged GPU layout by key, one call per batch: GPU block
 * block_ids[i] <-> key keys[i], one kernel launch per pool device.  `gpu`
 * must have been opened over the pool of `kv` (cxlkv_gpu_open_pool with the
 * pool given to cxlkv_kv_open); the blocks are layout-sized
 * (cxlkv_gpu_layout_block_bytes).  Statuses and return values as in
 * cxlkv_kv_put_chain / cxlkv_kv_get_many.  put_chain waits for the DMA
 * (stream) before it publishes anything (rule 5); get_many returns after the
 * copies completed (the pins are held until then).  Blocks on the SSD tier
 * come through a pinned staging ring, interleaved blocks through their
 * stripe map (docs/gpu.md "Every tier").
 */
int cxlkv_kv_gpu_put_chain(struct cxlkv_kv *kv, struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
			   const struct cxlkv_kv_key *parent, const struct cxlkv_kv_key *keys,
			   const uint64_t *block_ids, size_t n, void *stream, int32_t *status);
int cxlkv_kv_gpu_get_many(struct cxlkv_kv *kv, struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
			  const struct cxlkv_kv_key *keys, const uint64_t *block_ids, size_t n, void *stream,
			  int32_t *status);

/* ---- GPU path: layer-wise load and save (docs/gpu.md "Layer-wise transfers") ---------------------------
 * Load: pins the blocks and enqueues on `stream`, group by group, layers
 * [g*L, (g+1)*L) (L = layers_per_group, 0: one group) of every block, with
 * a CUDA event after each group, so layer 0 is usable while later layers
 * still travel (vLLM's wait_for_layer_load).  Returns the number of blocks
 * being loaded; status[i] 0, CXLKV_KV_MISS or -errno for the others.  Wait
 * per layer on the host (load_wait) or on the GPU (load_stream_wait: later
 * work on `stream` waits), or take the event (cudaEvent_t, valid until
 * finish).  finish waits for every group, unpins, fills status (as
 * cxlkv_kv_gpu_get_many), frees the handle and returns how many were loaded.
 * Save: reserves the chain (status as cxlkv_kv_reserve_chain; returns how
 * many blocks are RESERVED or EXISTS); save_layer(l, stream) gathers layer l
 * of every reserved block, enqueued on `stream` after the work that produced
 * it; finish waits for every layer's DMA and only then publishes (rule 5),
 * parents first; blocks whose layers were not all saved are aborted
 * (-ENODATA).  Returns as cxlkv_kv_gpu_put_chain; frees the handle.  abort
 * releases every reservation and frees the handle.  SSD-tier blocks are
 * loaded whole before the first group's event; interleaved blocks go
 * through their stripe map.  One thread at a time per kv handle. */
struct cxlkv_gpu_load;
struct cxlkv_gpu_save;
int   cxlkv_kv_gpu_load_layers(struct cxlkv_kv *kv, struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
			       const struct cxlkv_kv_key *keys, const uint64_t *block_ids, size_t n,
			       uint32_t layers_per_group, void *stream, int32_t *status,
			       struct cxlkv_gpu_load **out);
int   cxlkv_gpu_load_groups(struct cxlkv_gpu_load *load);
int   cxlkv_gpu_load_wait(struct cxlkv_gpu_load *load, uint32_t layer);
int   cxlkv_gpu_load_stream_wait(struct cxlkv_gpu_load *load, uint32_t layer, void *stream);
int   cxlkv_gpu_load_ready(struct cxlkv_gpu_load *load, uint32_t layer); /* 1 ready, 0 not yet, -errno */
void *cxlkv_gpu_load_event(struct cxlkv_gpu_load *load, uint32_t layer);
int   cxlkv_gpu_load_finish(struct cxlkv_gpu_load *load, int32_t *status);
int   cxlkv_kv_gpu_save_begin(struct cxlkv_kv *kv, struct cxlkv_gpu *gpu, const struct cxlkv_gpu_layout *layout,
			      const struct cxlkv_kv_key *parent, const struct cxlkv_kv_key *keys,
			      const uint64_t *block_ids, size_t n, int32_t *status, struct cxlkv_gpu_save **out);
int   cxlkv_gpu_save_layer(struct cxlkv_gpu_save *save, uint32_t layer, void *stream);
int   cxlkv_gpu_save_finish(struct cxlkv_gpu_save *save, int32_t *status);
void  cxlkv_gpu_save_abort(struct cxlkv_gpu_save *save);

/* ---- handoff leases ----------------------------------------------------
 * A producer leases published blocks for a consumer (consumer_id: e.g. the
 * request id; consumer_node: its node, or CXLKV_NODE_ANY): a leased block is
 * never evicted until the consumer releases it, ttl_ms passes, or the
 * consumer's node is dead.  Both return how many blocks succeeded, or -errno
 * when the whole call is refused (NULL kv/keys, ttl_ms 0, a node beyond the
 * pool's nodes).
 * lease status[i]:   0 leased, CXLKV_KV_MISS not cached, -errno.
 * release status[i]: 0 released, -ENOENT not leased to this consumer,
 *                    -ETIMEDOUT the lease had ended already (expired or its
 *                    node died; released all the same), CXLKV_KV_MISS.
 * `cxlkvctl index leases` lists leases with their age. */
#define CXLKV_NODE_ANY 0xffffffffu
int cxlkv_kv_lease(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, size_t n, uint64_t consumer_id,
		   uint32_t consumer_node, uint32_t ttl_ms, int32_t *status);
int cxlkv_kv_lease_release(struct cxlkv_kv *kv, const struct cxlkv_kv_key *keys, size_t n, uint64_t consumer_id,
			   int32_t *status);

struct cxlkv_kv_stats {
	size_t   size;                /* sizeof(struct cxlkv_kv_stats) */
	uint64_t lookups, hit_blocks, miss_blocks, reserves, publishes, fetches;
	uint64_t evictions, reclaims, bytes_in, bytes_out, nospc, errors;
	/* Per block: publish = the index entry (not the payload write), fetch =
	 * the payload read. */
	double   lookup_us_p50, lookup_us_p99, publish_us_p50, publish_us_p99, fetch_us_p50, fetch_us_p99;
	/* since the batch calls: the other steps, per block, and the whole
	 * publish (put_chain call) / whole fetch (get_many call) */
	double   reserve_us_p50, reserve_us_p99, write_us_p50, write_us_p99;
	double   pin_us_p50, pin_us_p99, unpin_us_p50, unpin_us_p99;
	double   put_us_p50, put_us_p99, get_us_p50, get_us_p99;
};
/* This handle's counters (the pool-wide view: cxlkvctl stats). */
int cxlkv_kv_stats(struct cxlkv_kv *kv, struct cxlkv_kv_stats *out);

/* ---- Reserved blocks written in place ---------------------------------------
 * For a writer outside this library that lands payloads straight in pool
 * memory (a transfer engine receiving into a registered mapping of the pool:
 * docs/remote.md "Straight from the pool"): reserve the blocks
 * (cxlkv_kv_reserve_chain), ask where their bytes lie, let the writer write
 * them, flush them, then publish them (cxlkv_kv_publish_many) or abort them.
 *
 * addrs[i]: where reserved block i's payload (blocks[i].length bytes) lies in
 * this process's mapping of the pool, status[i] 0; or NULL and status[i]
 * -EXDEV for a block that is not one extent of memory (interleaved over
 * devices, or not in memory), -EUCLEAN for a location outside the kv carve,
 * the handle's status for a handle that is not RESERVED.  The address is
 * the caller's to write only while the reservation is held (until its
 * publish or abort).  Returns how many addresses it gave. */
int cxlkv_kv_reserved_addrs(struct cxlkv_kv *kv, const struct cxlkv_kv_block *blocks, size_t n, void **addrs,
			    int32_t *status);
/* The payloads of those reserved blocks were written in place with ordinary
 * stores: write their lines back to memory and fence (docs/coherence.md
 * rule 3), after which cxlkv_kv_publish_many may publish them.  status[i]
 * as cxlkv_kv_reserved_addrs.  Returns how many blocks were flushed. */
int cxlkv_kv_flush_in_place(struct cxlkv_kv *kv, const struct cxlkv_kv_block *blocks, size_t n, int32_t *status);

/* The node's remote tier counters (docs/remote.md "Counters"): a remote tier
 * below the pool that lives outside this library (the Python package's, over
 * Mooncake Store) adds n to the counter `counter` of the handle's node, named
 * as its Prometheus family cxlkv_remote_<counter>_total without prefix and
 * suffix ("hit_blocks", ...: cxlkv/metrics.hpp).  The node's stats in the
 * pool carry it at once to `cxlkvctl stats` and the Prometheus text.  Safe
 * beside other calls on the same handle from other threads.  0, or -EINVAL
 * for an unknown counter. */
int cxlkv_kv_remote_count(struct cxlkv_kv *kv, const char *counter, uint64_t n);

/* Every node's KV counters and latency histograms as Prometheus text (the
 * same names as `cxlkvctl stats --prometheus`: cxlkv/metrics.hpp), NUL
 * terminated, truncated to len-1 bytes.  Returns the full text length
 * (call with len 0 to size the buffer), or -errno. */
int cxlkv_stats_prometheus(struct cxlkv_pool *pool, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_CXLKV_H */
