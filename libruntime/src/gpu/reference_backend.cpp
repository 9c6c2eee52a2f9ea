// SPDX-License-Identifier: MIT
#include "gpu/reference_backend.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/copy_core.h"

namespace cxlkv::gpu {
namespace cc = copycore;

namespace {
thread_local char g_last_error[256];

int fail(int rc, const char* msg) {
  std::snprintf(g_last_error, sizeof g_last_error, "%s", msg);
  return rc;
}
}  // namespace

namespace {
// The kernel's grid emulated: thread blocks and their threads in turn (the
// threads of one launch write disjoint bytes, so their order does not matter).
template <uint64_t Tile, uint32_t Tpt, uint32_t Tpb, uint32_t U>
int run_shape(const cxlkv_copy_desc* descs, size_t n, const cc::Shape& sh) {
  if (n > UINT32_MAX - 1) return -E2BIG;
  std::vector<uint32_t> first(n + 1);
  const uint64_t ntiles = cc::tile_prefix(descs, n, Tile, first.data());
  if (ntiles == UINT64_MAX) return -E2BIG;
  const uint32_t grid = cc::grid_for(ntiles, sh);
  for (uint32_t b = 0; b < grid; b++)
    for (uint32_t t = 0; t < cc::kThreads; t++)
      cc::copy_batch_thread<Tile, Tpt, Tpb, U>(descs, first.data(), static_cast<uint32_t>(n),
                                              static_cast<uint32_t>(ntiles), b, grid, t);
  return 0;
}
}  // namespace

int reference_copy_shaped(const cxlkv_copy_desc* descs, size_t n, uint32_t shape) {
  if (n == 0) return 0;
  const cc::Shape& sh = cc::choose_shape(descs, n, shape);
  if (sh.id == CXLKV_CUDA_SHAPE_WARP)
    return run_shape<cc::kWarpTileBytes, cc::kWarpThreads, cc::kThreads / cc::kWarpThreads, cc::kWarpUnroll>(descs, n, sh);
  return run_shape<cc::kTileBytes, cc::kThreads, 1, cc::kUnroll>(descs, n, sh);
}

void reference_copy(const cxlkv_copy_desc* descs, size_t n) { (void)reference_copy_shaped(descs, n, CXLKV_CUDA_SHAPE_AUTO); }

int reference_sparse_copy(const cxlkv_sparse_list* lists, size_t nlists, const uint32_t* tokens,
                          size_t ntokens, uint64_t piece_bytes) {
  if (ntokens == 0) return 0;
  if (int rc = cc::sparse_check(lists, nlists, ntokens, piece_bytes)) return rc;
  const uint32_t w = cc::sparse_width(lists, nlists, piece_bytes);
  const uint64_t units = static_cast<uint64_t>(ntokens) * (piece_bytes / w);
  for (uint64_t g = 0; g < units; g++)
    cc::sparse_unit(lists, static_cast<uint32_t>(nlists), tokens, piece_bytes, w, g);
  return 0;
}

namespace {

const char* op_last_error() { return g_last_error; }

int op_probe(cxlkv_cuda_device_info* info) {
  if (!info) return fail(-EINVAL, "probe: info is NULL");
  std::memset(info, 0, sizeof *info);
  info->device_count = 1;
  info->can_use_host_pointer = 1;
  std::snprintf(info->name, sizeof info->name, "cpu-reference");
  return 0;
}
int op_set_device(int device) { return device == 0 ? 0 : fail(-ENODEV, "cpu-reference has only device 0"); }
int op_host_register(void* p, size_t len, uint32_t, uint64_t* dev) {
  if (!p || !len || !dev) return fail(-EINVAL, "host_register: empty range");
  *dev = reinterpret_cast<uintptr_t>(p);
  return 0;
}
int op_host_unregister(void*) { return 0; }
int op_copy(const cxlkv_copy_desc* d, size_t n, void*) {
  if (n && !d) return fail(-EINVAL, "copy: descriptors are NULL");
  reference_copy(d, n);
  return 0;
}
int op_copy_shaped(const cxlkv_copy_desc* d, size_t n, uint32_t shape, void*) {
  if (n && !d) return fail(-EINVAL, "copy: descriptors are NULL");
  if (shape > CXLKV_CUDA_SHAPE_WARP) return fail(-EINVAL, "copy: unknown launch shape");
  return reference_copy_shaped(d, n, shape) ? fail(-E2BIG, "copy: too many tiles") : 0;
}
int op_sparse_copy(const cxlkv_sparse_list* l, size_t nl, const uint32_t* t, size_t nt, uint64_t piece, void*) {
  if (nt && (!l || !t)) return fail(-EINVAL, "sparse_copy: lists or tokens are NULL");
  int rc = reference_sparse_copy(l, nl, t, nt, piece);
  return rc ? fail(rc, "sparse_copy: lists are not a prefix sum over the token indices") : 0;
}
int op_memcpy_async(void* dst, const void* src, size_t n, void*) {
  std::memcpy(dst, src, n);
  return 0;
}
int op_stream_create(void** s) {
  static char token;
  *s = &token;
  return 0;
}
int op_nop(void*) { return 0; }
int op_event_record(void*, void** e) {
  static char token;
  *e = &token;
  return 0;
}
int op_nop2(void*, void*) { return 0; }
int op_alloc(void** p, size_t n) {
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return *p ? 0 : fail(-ENOMEM, "cpu-reference: out of memory");
}
int op_free(void* p) {
  std::free(p);
  return 0;
}

const cxlkv_cuda_ops g_ops = {
    CXLKV_CUDA_ABI_VERSION,
    sizeof(cxlkv_cuda_ops),
    op_last_error,
    op_probe,
    op_set_device,
    op_host_register,
    op_host_unregister,
    op_copy,
    op_sparse_copy,
    op_memcpy_async,
    op_stream_create,
    op_nop,
    op_nop,
    op_event_record,
    op_nop,
    op_alloc,
    op_free,
    op_alloc,
    op_free,
    op_nop,  // warmup: nothing to load
    op_copy_shaped,
    op_nop,  // event_query: streams are synchronous, every event has completed
    op_nop,  // event_sync
    op_nop,  // event_destroy
    op_nop2, // stream_wait_event
};

}  // namespace

const cxlkv_cuda_ops& reference_ops() { return g_ops; }

}  // namespace cxlkv::gpu
