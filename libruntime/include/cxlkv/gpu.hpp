// SPDX-License-Identifier: MIT
// The GPU path: KV blocks move between a paged GPU KV cache and pool blocks
// with one kernel launch per batch, over a pool mapping pinned for DMA.
//
// The kernels and every CUDA call live in libcxlkv-cuda.so, which this
// runtime opens with dlopen (CudaLibrary::load); libcxlkv itself never links
// CUDA and builds and runs where CUDA is not installed.  Where no GPU is
// present, CudaLibrary::cpu_reference() runs the same descriptors through the
// CPU reference implementation -- the oracle the GPU tests compare against.
//
// Addresses: pool blocks are named by their offset from the pinned range's
// base; GPU tensors by device pointers (uint64_t) in a PagedLayout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cxlkv/cxlkv.h"
#include "cxlkv/keys.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/result.hpp"

struct cxlkv_cuda_ops;
struct cxlkv_copy_desc;

namespace cxlkv {
class KvStore;
struct EngineLayout;
}  // namespace cxlkv

namespace cxlkv::gpu {

// ---- the CUDA library -----------------------------------------------------

enum class Availability {
  ready,              // a GPU is usable
  library_not_found,  // libcxlkv-cuda.so not found or not loadable
  incompatible,       // found, but speaks another ABI version
  no_driver,          // no CUDA driver (libcuda.so.1) on this machine
  no_device,          // driver present, no GPU
  error,              // anything else (message says what)
};
const char* to_string(Availability a);

struct DeviceInfo {
  int device_count = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  bool can_use_host_pointer = false;
  uint64_t total_mem = 0;
  int driver_version = 0, runtime_version = 0;
};

class CudaLibrary {
 public:
  // Finds libcxlkv-cuda.so: $CXLKV_CUDA_LIB (a file), then the directory of
  // libcxlkv (of the executable when linked statically), then the build
  // tree, then the dynamic linker's search path.  -ENOENT lists every place.
  static Result<std::shared_ptr<CudaLibrary>> load();
  static Result<std::shared_ptr<CudaLibrary>> load_from(const std::string& path);
  // The CPU stand-in: "device" memory is host memory, host registration is
  // the identity, streams are synchronous, kernels are the reference.
  static std::shared_ptr<CudaLibrary> cpu_reference();
  // A table already in the process (tests drive PoolPin with fakes).
  static std::shared_ptr<CudaLibrary> from_table(const cxlkv_cuda_ops* ops, std::string name);

  ~CudaLibrary();
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;

  const cxlkv_cuda_ops& ops() const { return *ops_; }
  const std::string& path() const { return path_; }  // "cpu-reference" for the stand-in
  bool is_reference() const { return reference_; }

  // -ENOSYS: no CUDA driver; -ENODEV: no GPU.
  Result<DeviceInfo> probe() const;
  // An Error from a failed ops call: "<what>: <library's message>".
  Error error(int rc, std::string_view what) const;

 private:
  CudaLibrary(void* handle, const cxlkv_cuda_ops* ops, std::string path, bool reference = false)
      : handle_(handle), ops_(ops), path_(std::move(path)), reference_(reference) {}
  void* handle_;
  const cxlkv_cuda_ops* ops_;
  std::string path_;
  bool reference_;
};

struct Status {
  Availability availability = Availability::error;
  std::string message;  // one line for humans
  std::string library;  // path of the library, when found
  DeviceInfo device;
};
// Load the library and probe device 0; never fails, says why not.
Status probe();

// ---- pinning the pool for DMA -----------------------------------------------

enum class PinMethod {
  host_register,  // cudaHostRegister(portable | mapped)
  io_memory,      // ... | cudaHostRegisterIoMemory: PFN / IO mappings (dev:, dax:)
  reference,      // CPU stand-in: nothing pinned
  pending,        // on demand: no chunk registered yet, so no method chosen yet
};
const char* to_string(PinMethod m);

// The pool mapping is registered in chunks when a transfer first
// touches them (or by a background pre-pin), never all at open, so a
// process is ready for its first transfer in well under a second whatever
// the pool size (registration costs ~0.6 s per GiB on an H100 host), and no
// single registration exceeds chunk_bytes (drivers refuse very large ones).
struct PinOptions {
  uint64_t chunk_bytes = 1ull << 30;  // registration unit (rounded up to pages)
  bool try_io_memory = true;          // fall back to the IO-memory flag when plain registration fails
  bool force_io_memory = false;       // only the IO-memory flag
  bool eager = false;                 // register every chunk at open (the pre-issue-15 behaviour)
  bool background = false;            // after open, a thread registers the chunks nobody touched yet
};

// What PoolPin has registered so far, and what it cost.
struct PinStats {
  uint64_t chunks_total = 0;   // chunks of the range
  uint64_t chunks_pinned = 0;  // registered now
  uint64_t bytes_pinned = 0;
  uint64_t on_demand = 0;      // chunks registered because a transfer touched them
  uint64_t background = 0;     // chunks registered by the background pre-pin (or pin_all)
  double pin_seconds = 0;      // time spent registering, all chunks together
  double max_chunk_seconds = 0;
  double open_seconds = 0;     // PoolPin::pin itself (what a process waits before its first transfer)
  bool background_running = false;
};

// A device-visible range.
struct DevicePiece {
  uint64_t dev = 0;
  uint64_t len = 0;
};

// RAII registration of [base, base+len) with the GPU, chunk by chunk on
// demand; every registered chunk is unregistered on destruction.
// Page-aligned base required (every pool mapping is).  Thread-safe.
class PoolPin {
 public:
  static Result<std::unique_ptr<PoolPin>> pin(std::shared_ptr<CudaLibrary> lib, void* base, uint64_t len,
                                             const PinOptions& opts = {});
  ~PoolPin();
  PoolPin(const PoolPin&) = delete;
  PoolPin& operator=(const PoolPin&) = delete;

  PinMethod method() const { return method_.load(std::memory_order_acquire); }
  size_t chunk_count() const { return nchunks_; }  // chunks of the range (pinned or not)
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  bool chunk_pinned(size_t i) const { return i < nchunks_ && chunks_[i].state.load(std::memory_order_acquire); }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  CudaLibrary& library() const { return *lib_; }
  PinStats stats() const;

  // Device-visible pieces of pool bytes [off, off+len), appended to out:
  // one piece unless the range crosses registration chunks that the GPU
  // sees at non-adjacent addresses.  Registers the chunks it touches that
  // are not registered yet.  -ERANGE when outside the range; a failed
  // registration names the chunk and both methods' errors.
  Result<void> to_device(uint64_t off, uint64_t len, std::vector<DevicePiece>& out) const;
  // Register the chunks overlapping [off, off+len) now (pre-pin a hot range).
  Result<void> pin_range(uint64_t off, uint64_t len) const;
  // Register every chunk now, in this thread.
  Result<void> pin_all() const;
  // Start / stop the background pre-pin (idempotent).
  void start_background() const;
  void stop_background() const;

 private:
  struct Chunk {
    uint64_t off = 0, len = 0, dev = 0;   // dev valid once state is 1
    std::atomic<uint8_t> state{0};        // 0 not registered, 1 registered
  };
  PoolPin() = default;
  Result<void> ensure(size_t i, bool on_demand) const;
  std::shared_ptr<CudaLibrary> lib_;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t chunk_bytes_ = 0;
  bool try_io_memory_ = true, force_io_memory_ = false;
  mutable std::atomic<PinMethod> method_{PinMethod::pending};
  std::unique_ptr<Chunk[]> chunks_;
  size_t nchunks_ = 0;
  mutable std::mutex mu_;          // registrations (one at a time) and the stats below
  mutable PinStats st_;
  mutable std::thread bg_;
  mutable std::atomic<bool> bg_stop_{false};
};

// ---- engine layouts -----------------------------------------------------------

// A vLLM-style paged KV cache on the GPU.
//   layer_first: one tensor per (layer, K|V), [num_blocks, block_tokens, heads, head_size];
//                tensors[2*l] is layer l's K, tensors[2*l+1] its V.
//   block_first: one tensor [num_blocks, layers, 2, block_tokens, heads, head_size].
// A pool block holds the block's (layer, K|V) slices in that order, so both
// kinds produce the same pool bytes.
enum class LayoutKind : uint32_t {
  layer_first = CXLKV_GPU_LAYOUT_LAYER_FIRST,
  block_first = CXLKV_GPU_LAYOUT_BLOCK_FIRST,
};

struct PagedLayout {
  LayoutKind kind = LayoutKind::layer_first;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_size = 0;
  uint32_t block_tokens = 0;
  uint32_t elem_bytes = 2;
  uint64_t num_blocks = 0;      // blocks in each tensor (block ids are checked against it)
  uint64_t block_stride = 0;    // bytes between blocks in a tensor; 0: dense
  std::vector<uint64_t> tensors;  // device pointers

  uint64_t chunk_bytes() const;  // one (layer, K|V) slice of one block
  uint64_t block_bytes() const;  // one pool block: 2 * layers * chunk_bytes
  uint64_t stride() const;       // effective block stride
  Result<void> validate() const;

  static PagedLayout from_c(const cxlkv_gpu_layout& l);
  // The KV store's EngineLayout (layout.hpp) whose bases are device pointers.
  static PagedLayout from_engine(const EngineLayout& l);
  // Llama-3.1-8B geometry: 32 layers, 8 KV heads, head 128, fp16; 16-token
  // blocks are 64 chunks of 32 KiB (2 MiB).
  static PagedLayout llama31_8b(LayoutKind kind, uint64_t num_blocks, std::vector<uint64_t> tensors,
                                uint32_t block_tokens = 16);
};

// GPU slices of one block, in pool order (adjacent slices merged).
void block_slices(const PagedLayout& layout, uint64_t block_id, std::vector<DevicePiece>& out);

enum class Direction { gather, scatter };  // gather: GPU -> pool; scatter: pool -> GPU

// The descriptor batch moving `block_ids[i]` <-> pool block at `pool_offs[i]`.
Result<std::vector<cxlkv_copy_desc>> plan_blocks(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                                 std::span<const uint64_t> pool_offs, const PoolPin& pin,
                                                 Direction dir);

// The pool side of one block -- device-visible pieces of its
// logical bytes [x, x+len) (one pool device, the stripes of an interleaved
// block, or a staging buffer an SSD block was read into).
using PoolResolver = std::function<Result<void>(uint64_t x, uint64_t len, std::vector<DevicePiece>& out)>;

// Descriptors moving layers [layer_lo, layer_hi) of GPU block `block_id`
// <-> the same layers of the pool block `pool` resolves (pool order: layer,
// then K|V), appended to out.
Result<void> plan_block(const PagedLayout& layout, uint64_t block_id, uint32_t layer_lo, uint32_t layer_hi,
                        const PoolResolver& pool, Direction dir, std::vector<cxlkv_copy_desc>& out);

// One sparse-read list: pieces of `pool_stride`-spaced tokens starting at
// pool offset `pool_off`, written to `dst` (device) every `dst_stride` bytes.
using SparseList = cxlkv_gpu_sparse_list;

// ---- the GPU view of a pool -------------------------------------------------------

class GpuPool {
 public:
  // Loads nothing itself: give it CudaLibrary::load() or cpu_reference().
  static Result<std::unique_ptr<GpuPool>> open(std::shared_ptr<CudaLibrary> lib, void* base, uint64_t size,
                                              const PinOptions& opts = {}, int device = 0);

  ~GpuPool();
  const PoolPin& pin() const { return *pin_; }
  CudaLibrary& library() const { return pin_->library(); }
  int device() const { return device_; }

  // A ring of pinned host staging slots (SSD-tier blocks are read
  // into one, then copied to the GPU by one launch, while the next slot is
  // being read).  acquire waits until the slot's previous DMA completed;
  // release records an event on `stream` after the work using it.
  struct StagingSlot {
    std::byte* host = nullptr;
    uint64_t dev = 0;  // device-visible address of host
    uint64_t bytes = 0;
    size_t index = 0;
  };
  Result<StagingSlot> staging_acquire(uint64_t bytes);
  Result<void> staging_release(const StagingSlot& s, void* stream);
  static constexpr size_t kStagingSlots = 4;
  static constexpr uint64_t kStagingSlotBytes = 16ull << 20;  // default least bytes per slot
  // Least bytes per slot (tests use small slots to make the ring turn over).
  void set_staging_slot_bytes(uint64_t b) { staging_min_slot_ = b; }

  // GPU tensors -> pool blocks / pool blocks -> GPU tensors: one launch,
  // enqueued on `stream` (cudaStream_t; nullptr = default stream).
  Result<void> gather(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                      std::span<const uint64_t> pool_offs, void* stream);
  Result<void> scatter(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                       std::span<const uint64_t> pool_offs, void* stream);
  // Sparse read: pool pieces of the listed tokens -> GPU.
  Result<void> sparse_read(std::span<const SparseList> lists, std::span<const uint32_t> tokens,
                           uint64_t piece_bytes, void* stream);
  // Raw batch of device-visible descriptors.
  Result<void> copy(std::span<const cxlkv_copy_desc> descs, void* stream);
  // Block until everything enqueued on `stream` so far has completed.
  Result<void> sync(void* stream);
  // Block until the work enqueued on `stream` up to now has completed (an
  // event, so later work of other callers on the stream is not waited for).
  Result<void> wait_enqueued(void* stream);

 private:
  GpuPool() = default;
  Result<void> select_device() const;
  void staging_free();
  std::unique_ptr<PoolPin> pin_;
  int device_ = 0;
  std::byte* staging_host_ = nullptr;  // kStagingSlots slots of staging_slot_bytes_, registered
  uint64_t staging_dev_ = 0, staging_slot_bytes_ = 0;
  void* staging_event_[kStagingSlots] = {};
  size_t staging_next_ = 0;
  uint64_t staging_min_slot_ = kStagingSlotBytes;
};

// ---- the KV store on the GPU path -----------------------------------------------

struct GpuPublishReport {
  size_t written = 0;         // reserved, gathered from the GPU and published by this call
  size_t already_cached = 0;  // READY already: nothing written
  size_t busy = 0;            // another writer holds it: nothing written
};

class LayerLoad;
class LayerSave;

// publish / fetch of KvStore blocks straight between GPU tensors and pool
// blocks, one kernel launch per batch.
//   publish: reserve every block -> one gather -> wait for the DMA ->
//            publish in chain order (rule 5: an index entry is written only
//            after the DMA that filled its block has completed).
//   fetch:   pin every block -> one scatter -> wait -> unpin (the pins keep
//            eviction away while the GPU reads).
// `devices[d]` is a GpuPool opened over the store's MEM pool device d (the
// same mapping, so location offsets are offsets into it); all of them on
// one GPU.  Every tier is reachable (docs/gpu.md "Every tier"): blocks on one pool device
// by DMA straight from the pool; blocks interleaved over the pool devices
// through their stripe map (one descriptor per stripe piece, same launch);
// SSD-tier blocks are read by the store (io_uring, several in flight,
// checked against their key) into a pinned staging slot of devices[0],
// whose DMA to the GPU overlaps the read of the next slot.
class KvGpu {
 public:
  KvGpu(KvStore& store, std::vector<GpuPool*> devices) : store_(store), devices_(std::move(devices)) {}

  // chain[i]'s parent is chain[i-1]; chain[0]'s is `parent` (nullptr: first block).
  Result<GpuPublishReport> publish(std::span<const BlockKey> chain, const BlockKey* parent,
                                   const PagedLayout& layout, std::span<const uint64_t> block_ids, void* stream);
  Result<void> fetch(std::span<const BlockKey> keys, const PagedLayout& layout,
                     std::span<const uint64_t> block_ids, void* stream);
  // The same with a status per block (KvStore::put_chain / get_many
  // semantics; cxlkv_kv_gpu_put_chain / _get_many): put_chain gathers the
  // reserved blocks in one launch, waits for the DMA (rule 5), then
  // publishes them parents first and aborts what it could not write;
  // get_many pins, scatters the pinned blocks in one launch (SSD blocks
  // through the staging ring), waits, and unpins.  Return the number of
  // blocks RESERVED or EXISTS / fetched.
  Result<size_t> put_chain(const BlockKey* parent, std::span<const BlockKey> keys, const PagedLayout& layout,
                           std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status);
  Result<size_t> get_many(std::span<const BlockKey> keys, const PagedLayout& layout,
                          std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status);

  // ---- layer-wise (docs/gpu.md "Layer-wise transfers") ------------------------------------------------
  // Load: pins the blocks and enqueues on `stream`, group by group, the
  // copies of layers [g*L, (g+1)*L) (L = layers_per_group) of every block,
  // recording a CUDA event after each group, so the engine computes layer 0
  // while later layers arrive (vLLM's wait_for_layer_load).  status[i] as
  // get_many's (MISS, -errno) for blocks that will not be loaded; returns
  // the handle, which unpins after the last group when finished.
  Result<std::unique_ptr<LayerLoad>> load_layers(std::span<const BlockKey> keys, const PagedLayout& layout,
                                                 std::span<const uint64_t> block_ids, void* stream,
                                                 uint32_t layers_per_group, std::span<int32_t> status);
  // Save: reserves the chain now (status[i] RESERVED / EXISTS / BUSY /
  // -errno as reserve_chain); LayerSave::save_layer(l, stream) gathers layer
  // l of every reserved block as prefill produces it; finish() waits for the
  // DMA of every layer and only then publishes (rule 5), parents first.
  Result<std::unique_ptr<LayerSave>> save_layers(const BlockKey* parent, std::span<const BlockKey> keys,
                                                 const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                                 std::span<int32_t> status);

 private:
  friend class LayerLoad;
  friend class LayerSave;
  struct Loc {
    uint8_t tier = 0, dev = 0;
    uint64_t off = 0, len = 0;
  };
  // The GpuPool that launches (devices[0], or the first one present).
  Result<GpuPool*> launcher() const;
  // The resolver of a MEM-tier block (one device or interleaved), checked
  // against the devices' kv carves; -ENODEV / -EUCLEAN / -EINVAL otherwise.
  Result<PoolResolver> mem_resolver(const Loc& loc, const BlockKey& key) const;
  // SSD blocks pinned at pins[at[k]]: read through the staging ring and
  // scattered (every layer) on `stream`; status[at[k]] set on failure.
  void staged_fetch(std::span<const KvPin> pins, std::span<const size_t> at, const PagedLayout& layout,
                    std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status);
  KvStore& store_;
  std::vector<GpuPool*> devices_;
};

// A layer-wise load in progress (KvGpu::load_layers).  Destroying it
// finishes it (waits for every group, then unpins).
class LayerLoad {
 public:
  ~LayerLoad();
  uint32_t layers() const { return layers_; }
  uint32_t layers_per_group() const { return per_group_; }
  size_t groups() const { return events_.size(); }
  size_t blocks_loading() const { return loading_; }
  // The cudaEvent_t recorded after the copies of the group holding `layer`
  // (nullptr for a layer out of range).  Valid until finish().
  void* event(uint32_t layer) const;
  // Block the calling thread until `layer` is in place.
  Result<void> wait_layer(uint32_t layer);
  // Make later work on `stream` wait (on the GPU) until `layer` is in place.
  Result<void> stream_wait_layer(uint32_t layer, void* stream);
  // 0 when `layer` is in place, -EAGAIN when not yet.
  Result<bool> layer_ready(uint32_t layer);
  // Wait for every group, unpin, fill status (as get_many) and return how
  // many blocks were loaded.  Once.
  Result<size_t> finish(std::span<int32_t> status);

 private:
  friend class KvGpu;
  LayerLoad(KvGpu kg, GpuPool* gp) : kg_(std::move(kg)), gp_(gp) {}
  KvGpu kg_;
  GpuPool* gp_;
  uint32_t layers_ = 0, per_group_ = 1;
  std::vector<void*> events_;
  std::vector<KvPin> pins_;
  std::vector<int32_t> status_;
  size_t loading_ = 0;
  bool finished_ = false;
};

// A layer-wise save in progress (KvGpu::save_layers).  Destroying it
// unfinished aborts its reservations (after the enqueued DMA completed).
class LayerSave {
 public:
  ~LayerSave();
  uint32_t layers() const { return layers_; }
  size_t blocks_reserved() const { return members_.size(); }
  // Enqueue the gather of layer `layer` of every reserved block on `stream`
  // (after the engine's work that produced it on that stream).  Each layer
  // once; any order.
  Result<void> save_layer(uint32_t layer, void* stream);
  uint32_t layers_saved() const { return saved_count_; }
  // Wait for every saved layer's DMA; publish the blocks (all layers saved)
  // parents first, abort the rest (-ENODATA when layers are missing).
  // status / return value as put_chain's.  Once.
  Result<size_t> finish(std::span<int32_t> status);
  // Abort every reservation (after the enqueued DMA completed).
  void abort();

 private:
  friend class KvGpu;
  LayerSave(KvGpu kg, GpuPool* gp) : kg_(std::move(kg)), gp_(gp) {}
  Result<void> wait_all();
  KvGpu kg_;
  GpuPool* gp_;
  PagedLayout layout_;
  bool has_parent_ = false;
  BlockKey parent_{};
  std::vector<BlockKey> keys_;
  std::vector<uint64_t> ids_;
  std::vector<KvReservation> rs_;
  std::vector<int32_t> status_;            // reserve_chain's
  std::vector<size_t> members_;            // reserved blocks being written
  std::vector<PoolResolver> resolvers_;    // per member
  std::vector<int32_t> member_error_;      // per member: 0 or why it cannot be written
  std::vector<uint8_t> saved_;             // per layer
  uint32_t layers_ = 0, saved_count_ = 0;
  std::vector<void*> events_;
  bool done_ = false;
};

}  // namespace cxlkv::gpu
