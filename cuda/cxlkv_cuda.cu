// SPDX-License-Identifier: MIT
// libcxlkv-cuda.so: the batched copy kernels and every CUDA runtime call of
// cxlkv, behind the function table of cxlkv_cuda_abi.h.  libcxlkv loads this
// library with dlopen, so the runtime itself never links CUDA.
//
// Batches: one kernel launch per batch however many chunks it holds, in a
// launch shape chosen from the batch (cuda/copy_core.h).  Small batches
// (<= kInlineDescs descriptors, e.g. one Llama-3.1-8B block of 64 chunks)
// pass their descriptors inside the kernel parameters: one launch, no
// descriptor upload, and no cudaMemcpy from the (possibly uncached) pool,
// which the copy engines handle slowly for small pieces.  Larger batches
// stage their descriptors and tile prefix through a ring of pinned host /
// device buffer pairs; an event recorded after the kernel tells when a slot
// may be reused, so a caller never waits for its own batch, only (rarely)
// for one eight batches older.
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "cuda/copy_core.h"
#include "cuda/cxlkv_cuda_abi.h"

namespace cc = cxlkv::copycore;

namespace {

thread_local char g_last_error[512];

int fail(int err, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  va_end(ap);
  return err;
}

// Map a CUDA error to an errno and record "what: cudaErrorX: text".
int cuda_fail(cudaError_t e, const char* what) {
  int err = -EIO;
  switch (e) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      err = e == cudaErrorNoDevice ? -ENODEV : -ENOSYS;
      break;
    case cudaErrorMemoryAllocation: err = -ENOMEM; break;
    case cudaErrorInvalidValue: err = -EINVAL; break;
    case cudaErrorHostMemoryAlreadyRegistered: err = -EEXIST; break;
    case cudaErrorHostMemoryNotRegistered: err = -ENOENT; break;
    case cudaErrorNotSupported: err = -EOPNOTSUPP; break;
    default: break;
  }
  return fail(err, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CK(call, what)                              \
  do {                                              \
    cudaError_t ck_e_ = (call);                     \
    if (ck_e_ != cudaSuccess) return cuda_fail(ck_e_, what); \
  } while (0)

// ---- kernels -----------------------------------------------------------

// Small batches: up to kInlineDescs descriptors and their tile prefix ride
// in the kernel parameters (3.6 KiB of the 4 KiB limit): one launch, no
// descriptor upload, no staging round trip.
struct InlineBatch {
  cxlkv_copy_desc d[cc::kInlineDescs];
  uint32_t first[cc::kInlineDescs + 1];
};
static_assert(sizeof(InlineBatch) + 16 <= 4096, "kernel parameters are limited to 4 KiB");

template <uint64_t Tile, uint32_t Tpt, uint32_t Tpb, uint32_t U>
__global__ void __launch_bounds__(cc::kThreads) copy_inline(InlineBatch b, uint32_t n, uint32_t ntiles) {
  cc::copy_batch_thread<Tile, Tpt, Tpb, U>(b.d, b.first, n, ntiles, blockIdx.x, gridDim.x, threadIdx.x);
}

template <uint64_t Tile, uint32_t Tpt, uint32_t Tpb, uint32_t U>
__global__ void __launch_bounds__(cc::kThreads)
    copy_staged(const cxlkv_copy_desc* d, const uint32_t* first, uint32_t n, uint32_t ntiles) {
  cc::copy_batch_thread<Tile, Tpt, Tpb, U>(d, first, n, ntiles, blockIdx.x, gridDim.x, threadIdx.x);
}

#define CXLKV_BLOCK_SHAPE cc::kTileBytes, cc::kThreads, 1, cc::kUnroll
#define CXLKV_WARP_SHAPE cc::kWarpTileBytes, cc::kWarpThreads, cc::kThreads / cc::kWarpThreads, cc::kWarpUnroll
static_assert(cc::kBlockShape.tile_bytes == cc::kTileBytes && cc::kWarpShape.tile_bytes == cc::kWarpTileBytes &&
                  cc::kWarpShape.tiles_per_block == cc::kThreads / cc::kWarpThreads,
              "shape table and kernel instantiations agree");

__global__ void __launch_bounds__(cc::kThreads)
    sparse_units(const cxlkv_sparse_list* lists, uint32_t nlists, const uint32_t* tokens,
                 uint64_t piece_bytes, uint32_t w, uint64_t total_units) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total_units; g += stride)
    cc::sparse_unit(lists, nlists, tokens, piece_bytes, w, g);
}

// ---- descriptor staging ring --------------------------------------------

struct Slot {
  void* host = nullptr;  // pinned
  void* dev = nullptr;
  size_t cap = 0;
  cudaEvent_t done = nullptr;
  bool in_flight = false;
};

constexpr int kSlots = 8;

struct Ring {
  std::mutex mu;
  Slot slots[kSlots];
  unsigned next = 0;
};

std::mutex g_rings_mu;
std::map<int, Ring*> g_rings;  // per device; lives for the process

Ring* ring_for_current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> g(g_rings_mu);
  Ring*& r = g_rings[dev];
  if (!r) r = new Ring;
  return r;
}

// Take a slot able to hold `bytes` (caller holds ring->mu).
int slot_acquire(Ring* ring, size_t bytes, Slot** out) {
  Slot& s = ring->slots[ring->next++ % kSlots];
  if (s.in_flight) {
    CK(cudaEventSynchronize(s.done), "descriptor slot reuse: waiting for an older batch");
    s.in_flight = false;
  }
  if (!s.done) CK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "descriptor slot event");
  if (s.cap < bytes) {
    size_t cap = 4096;
    while (cap < bytes) cap *= 2;
    if (s.host) cudaFreeHost(s.host);
    if (s.dev) cudaFree(s.dev);
    s.host = s.dev = nullptr;
    s.cap = 0;
    CK(cudaHostAlloc(&s.host, cap, cudaHostAllocDefault), "descriptor staging (pinned host)");
    CK(cudaMalloc(&s.dev, cap), "descriptor staging (device)");
    s.cap = cap;
  }
  *out = &s;
  return 0;
}

// ---- ops -----------------------------------------------------------------

const char* op_last_error() { return g_last_error; }

int op_probe(cxlkv_cuda_device_info* info) {
  if (!info) return fail(-EINVAL, "probe: info is NULL");
  memset(info, 0, sizeof *info);
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  info->driver_version = drv;
  info->runtime_version = rt;
  if (drv == 0) return fail(-ENOSYS, "no CUDA driver (libcuda.so.1 not found or not loadable)");
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceCount");
  if (n == 0) return fail(-ENODEV, "CUDA driver %d present but no GPU", drv);
  info->device_count = n;
  int dev = 0;
  CK(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  const size_t name_len = strnlen(p.name, sizeof p.name);
  memcpy(info->name, p.name, name_len < sizeof info->name ? name_len : sizeof info->name - 1);
  info->cc_major = p.major;
  info->cc_minor = p.minor;
  info->total_mem = p.totalGlobalMem;
  int v = 0;
  cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, dev);
  info->can_use_host_pointer = v;
  return 0;
}

int op_set_device(int device) {
  CK(cudaSetDevice(device), "cudaSetDevice");
  return 0;
}

int op_host_register(void* p, size_t len, uint32_t flags, uint64_t* dev_addr) {
  if (!p || !len || !dev_addr) return fail(-EINVAL, "host_register: empty range");
  unsigned f = cudaHostRegisterPortable | cudaHostRegisterMapped;
  if (flags & CXLKV_CUDA_REG_IOMEMORY) f |= cudaHostRegisterIoMemory;
  cudaError_t e = cudaHostRegister(p, len, f);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return cuda_fail(e, (flags & CXLKV_CUDA_REG_IOMEMORY) ? "cudaHostRegister(portable|mapped|iomemory)"
                                                          : "cudaHostRegister(portable|mapped)");
  }
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(p);
    return cuda_fail(e, "cudaHostGetDevicePointer");
  }
  *dev_addr = reinterpret_cast<uintptr_t>(d);
  return 0;
}

int op_host_unregister(void* p) {
  CK(cudaHostUnregister(p), "cudaHostUnregister");
  return 0;
}

int shape_from_env() {
  // CXLKV_GPU_SHAPE=block|warp forces a shape for every AUTO batch (tuning on a GPU).
  const char* e = getenv("CXLKV_GPU_SHAPE");
  if (!e) return CXLKV_CUDA_SHAPE_AUTO;
  if (!strcmp(e, "block")) return CXLKV_CUDA_SHAPE_BLOCK;
  if (!strcmp(e, "warp")) return CXLKV_CUDA_SHAPE_WARP;
  return CXLKV_CUDA_SHAPE_AUTO;
}

int launch_copy(const cxlkv_copy_desc* descs, size_t n, uint32_t shape_id, cudaStream_t s) {
  static const int env_shape = shape_from_env();
  if (shape_id == CXLKV_CUDA_SHAPE_AUTO) shape_id = static_cast<uint32_t>(env_shape);
  const cc::Shape& sh = cc::choose_shape(descs, n, shape_id);
  const bool warp = sh.id == CXLKV_CUDA_SHAPE_WARP;
  if (n <= cc::kInlineDescs) {
    InlineBatch b;
    const uint64_t ntiles = cc::tile_prefix(descs, n, sh.tile_bytes, b.first);
    if (ntiles == UINT64_MAX) return fail(-E2BIG, "copy: batch of %zu descriptors has too many tiles", n);
    if (ntiles == 0) return 0;
    memcpy(b.d, descs, n * sizeof *descs);
    const unsigned grid = cc::grid_for(ntiles, sh);
    if (warp)
      copy_inline<CXLKV_WARP_SHAPE><<<grid, cc::kThreads, 0, s>>>(b, static_cast<uint32_t>(n), static_cast<uint32_t>(ntiles));
    else
      copy_inline<CXLKV_BLOCK_SHAPE><<<grid, cc::kThreads, 0, s>>>(b, static_cast<uint32_t>(n), static_cast<uint32_t>(ntiles));
    CK(cudaGetLastError(), "copy kernel launch (inline descriptors)");
    return 0;
  }
  if (n > UINT32_MAX - 1) return fail(-E2BIG, "copy: %zu descriptors in one batch", n);
  Ring* ring = ring_for_current_device();
  if (!ring) return fail(-ENODEV, "copy: no current CUDA device");
  std::lock_guard<std::mutex> g(ring->mu);
  Slot* slot = nullptr;
  const size_t dbytes = n * sizeof(cxlkv_copy_desc);
  const size_t bytes = dbytes + (n + 1) * sizeof(uint32_t);
  if (int rc = slot_acquire(ring, bytes, &slot)) return rc;
  auto* first = reinterpret_cast<uint32_t*>(static_cast<char*>(slot->host) + dbytes);
  const uint64_t ntiles = cc::tile_prefix(descs, n, sh.tile_bytes, first);
  if (ntiles == UINT64_MAX) return fail(-E2BIG, "copy: batch of %zu descriptors has too many tiles", n);
  if (ntiles == 0) return 0;
  memcpy(slot->host, descs, dbytes);
  CK(cudaMemcpyAsync(slot->dev, slot->host, bytes, cudaMemcpyHostToDevice, s), "copy: descriptor upload");
  const auto* dd = static_cast<const cxlkv_copy_desc*>(slot->dev);
  const auto* df = reinterpret_cast<const uint32_t*>(static_cast<const char*>(slot->dev) + dbytes);
  const unsigned grid = cc::grid_for(ntiles, sh);
  if (warp)
    copy_staged<CXLKV_WARP_SHAPE><<<grid, cc::kThreads, 0, s>>>(dd, df, static_cast<uint32_t>(n), static_cast<uint32_t>(ntiles));
  else
    copy_staged<CXLKV_BLOCK_SHAPE><<<grid, cc::kThreads, 0, s>>>(dd, df, static_cast<uint32_t>(n), static_cast<uint32_t>(ntiles));
  CK(cudaGetLastError(), "copy kernel launch");
  CK(cudaEventRecord(slot->done, s), "copy: slot event");
  slot->in_flight = true;
  return 0;
}

int op_copy_shaped(const cxlkv_copy_desc* descs, size_t n, uint32_t shape, void* stream) {
  if (n && !descs) return fail(-EINVAL, "copy: descriptors are NULL");
  if (shape > CXLKV_CUDA_SHAPE_WARP) return fail(-EINVAL, "copy: unknown launch shape %u", shape);
  if (n == 0) return 0;
  return launch_copy(descs, n, shape, static_cast<cudaStream_t>(stream));
}

int op_copy(const cxlkv_copy_desc* descs, size_t n, void* stream) {
  return op_copy_shaped(descs, n, CXLKV_CUDA_SHAPE_AUTO, stream);
}

// Every kernel launched once with no work, and one descriptor slot
// allocated: under lazy module loading (the CUDA 12.2+ default) the first
// launch of each kernel would otherwise load it inside a caller's transfer.
int op_warmup(void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  InlineBatch b;
  memset(&b, 0, sizeof b);
  copy_inline<CXLKV_BLOCK_SHAPE><<<1, cc::kThreads, 0, s>>>(b, 0, 0);
  copy_inline<CXLKV_WARP_SHAPE><<<1, cc::kThreads, 0, s>>>(b, 0, 0);
  copy_staged<CXLKV_BLOCK_SHAPE><<<1, cc::kThreads, 0, s>>>(nullptr, nullptr, 0, 0);
  copy_staged<CXLKV_WARP_SHAPE><<<1, cc::kThreads, 0, s>>>(nullptr, nullptr, 0, 0);
  sparse_units<<<1, cc::kThreads, 0, s>>>(nullptr, 0, nullptr, 16, 16, 0);
  CK(cudaGetLastError(), "warm-up launches");
  Ring* ring = ring_for_current_device();
  if (!ring) return fail(-ENODEV, "warm-up: no current CUDA device");
  {
    std::lock_guard<std::mutex> g(ring->mu);
    Slot* slot = nullptr;
    if (int rc = slot_acquire(ring, 4096, &slot)) return rc;
    ring->next--;  // the slot is not used: the next batch takes it
  }
  CK(cudaStreamSynchronize(s), "warm-up");
  return 0;
}

int op_sparse_copy(const cxlkv_sparse_list* lists, size_t nlists, const uint32_t* tokens, size_t ntokens,
                   uint64_t piece_bytes, void* stream) {
  if (ntokens == 0) return 0;
  if (!lists || !tokens) return fail(-EINVAL, "sparse_copy: lists or tokens are NULL");
  if (cc::sparse_check(lists, nlists, ntokens, piece_bytes))
    return fail(-EINVAL, "sparse_copy: %zu lists do not cover %zu token indices as a prefix sum (piece %llu B)",
                nlists, ntokens, static_cast<unsigned long long>(piece_bytes));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t w = cc::sparse_width(lists, nlists, piece_bytes);
  const uint64_t units = static_cast<uint64_t>(ntokens) * (piece_bytes / w);
  const size_t lbytes = nlists * sizeof(cxlkv_sparse_list);
  const size_t bytes = lbytes + ntokens * sizeof(uint32_t);
  Ring* ring = ring_for_current_device();
  if (!ring) return fail(-ENODEV, "sparse_copy: no current CUDA device");
  std::lock_guard<std::mutex> g(ring->mu);
  Slot* slot = nullptr;
  if (int rc = slot_acquire(ring, bytes, &slot)) return rc;
  memcpy(slot->host, lists, lbytes);
  memcpy(static_cast<char*>(slot->host) + lbytes, tokens, ntokens * sizeof(uint32_t));
  CK(cudaMemcpyAsync(slot->dev, slot->host, bytes, cudaMemcpyHostToDevice, s), "sparse_copy: list upload");
  uint64_t blocks = (units + cc::kThreads - 1) / cc::kThreads;
  if (blocks > cc::kMaxGrid) blocks = cc::kMaxGrid;
  sparse_units<<<static_cast<unsigned>(blocks), cc::kThreads, 0, s>>>(
      static_cast<const cxlkv_sparse_list*>(slot->dev), static_cast<uint32_t>(nlists),
      reinterpret_cast<const uint32_t*>(static_cast<char*>(slot->dev) + lbytes), piece_bytes, w, units);
  CK(cudaGetLastError(), "sparse kernel launch");
  CK(cudaEventRecord(slot->done, s), "sparse_copy: slot event");
  slot->in_flight = true;
  return 0;
}

int op_memcpy_async(void* dst, const void* src, size_t n, void* stream) {
  CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
  return 0;
}

int op_stream_create(void** stream) {
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  *stream = s;
  return 0;
}
int op_stream_destroy(void* stream) {
  CK(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  return 0;
}
int op_stream_sync(void* stream) {
  CK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  return 0;
}
int op_event_record(void* stream, void** event) {
  cudaEvent_t e = nullptr;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t r = cudaEventRecord(e, static_cast<cudaStream_t>(stream));
  if (r != cudaSuccess) {
    cudaEventDestroy(e);
    return cuda_fail(r, "cudaEventRecord");
  }
  *event = e;
  return 0;
}
int op_event_wait(void* event) {
  cudaEvent_t e = static_cast<cudaEvent_t>(event);
  cudaError_t r = cudaEventSynchronize(e);
  cudaEventDestroy(e);
  if (r != cudaSuccess) return cuda_fail(r, "cudaEventSynchronize");
  return 0;
}
int op_event_query(void* event) {
  cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (r == cudaErrorNotReady) return -EAGAIN;
  if (r != cudaSuccess) return cuda_fail(r, "cudaEventQuery");
  return 0;
}
int op_event_sync(void* event) {
  CK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  return 0;
}
int op_event_destroy(void* event) {
  CK(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  return 0;
}
int op_stream_wait_event(void* stream, void* event) {
  CK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
     "cudaStreamWaitEvent");
  return 0;
}
int op_device_alloc(void** p, size_t n) {
  CK(cudaMalloc(p, n), "cudaMalloc");
  return 0;
}
int op_device_free(void* p) {
  CK(cudaFree(p), "cudaFree");
  return 0;
}
int op_host_alloc(void** p, size_t n) {
  CK(cudaHostAlloc(p, n, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc");
  return 0;
}
int op_host_free(void* p) {
  CK(cudaFreeHost(p), "cudaFreeHost");
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
    op_stream_destroy,
    op_stream_sync,
    op_event_record,
    op_event_wait,
    op_device_alloc,
    op_device_free,
    op_host_alloc,
    op_host_free,
    op_warmup,
    op_copy_shaped,
    op_event_query,
    op_event_sync,
    op_event_destroy,
    op_stream_wait_event,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const cxlkv_cuda_ops* cxlkv_cuda_get_ops(uint32_t abi_version) {
  return abi_version == CXLKV_CUDA_ABI_VERSION ? &g_ops : nullptr;
}
