// SPDX-License-Identifier: MIT
// GpuPool: a pinned pool mapping plus the batched copies over it.
//
// Coherence (docs/coherence.md rule 5): the GPU writes pool payload by DMA, which
// never enters this host's CPU caches when DDIO is off (cuda/README.md), and
// nothing here publishes: the caller (or kv_gpu.cpp) writes the index entry
// only after the stream has completed the gather.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"

namespace cxlkv::gpu {

Result<std::unique_ptr<GpuPool>> GpuPool::open(std::shared_ptr<CudaLibrary> lib, void* base, uint64_t size,
                                               const PinOptions& opts, int device) {
  if (!lib) return Error(-EINVAL, "GPU pool: no CUDA library");
  if (int rc = lib->ops().set_device(device); rc < 0)
    return lib->error(rc, "GPU pool: device " + std::to_string(device));
  std::unique_ptr<GpuPool> g(new GpuPool);
  g->device_ = device;
  auto pin = PoolPin::pin(std::move(lib), base, size, opts);
  if (!pin) return pin.error();
  g->pin_ = std::move(pin.value());
  // Every kernel loaded now, not inside the first transfer.
  if (int rc = g->library().ops().warmup(nullptr); rc < 0) return g->library().error(rc, "GPU pool: kernel warm-up");
  return g;
}

Result<void> GpuPool::select_device() const {
  // cudaSetDevice is per host thread: every entry point may run on another.
  if (int rc = library().ops().set_device(device_); rc < 0)
    return library().error(rc, "GPU pool: device " + std::to_string(device_));
  return {};
}

Result<void> GpuPool::copy(std::span<const cxlkv_copy_desc> descs, void* stream) {
  CXLKV_TRY(select_device());
  if (int rc = library().ops().copy(descs.data(), descs.size(), stream); rc < 0)
    return library().error(rc, "GPU copy of " + std::to_string(descs.size()) + " chunks");
  return {};
}

Result<void> GpuPool::gather(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                             std::span<const uint64_t> pool_offs, void* stream) {
  auto d = plan_blocks(layout, block_ids, pool_offs, *pin_, Direction::gather);
  if (!d) return d.error();
  return copy(d.value(), stream);
}

Result<void> GpuPool::scatter(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                              std::span<const uint64_t> pool_offs, void* stream) {
  auto d = plan_blocks(layout, block_ids, pool_offs, *pin_, Direction::scatter);
  if (!d) return d.error();
  return copy(d.value(), stream);
}

Result<void> GpuPool::sparse_read(std::span<const SparseList> lists, std::span<const uint32_t> tokens,
                                  uint64_t piece_bytes, void* stream) {
  if (piece_bytes == 0) return Error(-EINVAL, "GPU sparse read: piece size is 0");
  std::vector<cxlkv_sparse_list> out;
  std::vector<uint32_t> out_tokens;
  out.reserve(lists.size());
  size_t next = 0;
  std::vector<DevicePiece> pieces;
  for (size_t k = 0; k < lists.size(); k++) {
    const SparseList& l = lists[k];
    const std::string who = "GPU sparse read, list " + std::to_string(k);
    if (l.count > tokens.size() - next)
      return Error(-EINVAL, who + ": lists hold more than the " + std::to_string(tokens.size()) + " token indices");
    if (l.count == 0) continue;
    std::span<const uint32_t> mine = tokens.subspan(next, l.count);
    next += l.count;
    const uint64_t max_t = *std::max_element(mine.begin(), mine.end());
    if (l.pool_stride && max_t > (UINT64_MAX - piece_bytes) / l.pool_stride)
      return Error(-ERANGE, who + ": token " + std::to_string(max_t) + " overflows the pool offset");
    const uint64_t span = max_t * l.pool_stride + piece_bytes;
    pieces.clear();
    if (auto r = pin_->to_device(l.pool_off, span, pieces); !r) return Error(r.error().code(), who + ": " + r.error().message());
    const uint32_t first = static_cast<uint32_t>(out_tokens.size());
    if (pieces.size() == 1) {
      out.push_back({pieces[0].dev, l.dst, l.pool_stride, l.dst_stride, first, l.count});
      out_tokens.insert(out_tokens.end(), mine.begin(), mine.end());
      continue;
    }
    // The list spans registration chunks the GPU sees apart: one list per token.
    for (uint32_t i = 0; i < l.count; i++) {
      pieces.clear();
      CXLKV_TRY(pin_->to_device(l.pool_off + mine[i] * l.pool_stride, piece_bytes, pieces));
      if (pieces.size() != 1)
        return Error(-ERANGE, who + ": a piece crosses a pin chunk boundary (raise PinOptions::chunk_bytes)");
      out.push_back({pieces[0].dev, l.dst + i * l.dst_stride, 0, 0, static_cast<uint32_t>(out_tokens.size()), 1});
      out_tokens.push_back(0);
    }
  }
  if (next != tokens.size())
    return Error(-EINVAL, "GPU sparse read: lists hold " + std::to_string(next) + " of " +
                              std::to_string(tokens.size()) + " token indices");
  if (out_tokens.size() > UINT32_MAX) return Error(-E2BIG, "GPU sparse read: too many tokens");
  CXLKV_TRY(select_device());
  if (int rc = library().ops().sparse_copy(out.data(), out.size(), out_tokens.data(), out_tokens.size(), piece_bytes,
                                           stream);
      rc < 0)
    return library().error(rc, "GPU sparse read of " + std::to_string(tokens.size()) + " pieces");
  return {};
}

Result<void> GpuPool::sync(void* stream) {
  CXLKV_TRY(select_device());
  if (int rc = library().ops().stream_sync(stream); rc < 0) return library().error(rc, "GPU stream sync");
  return {};
}

Result<void> GpuPool::wait_enqueued(void* stream) {
  CXLKV_TRY(select_device());
  const cxlkv_cuda_ops& o = library().ops();
  void* ev = nullptr;
  if (int rc = o.event_record(stream, &ev); rc < 0) return library().error(rc, "GPU wait: event record");
  if (int rc = o.event_wait(ev); rc < 0) return library().error(rc, "GPU wait: enqueued work failed");
  return {};
}

}  // namespace cxlkv::gpu

namespace cxlkv::gpu {

// ---- staging ring (docs/gpu.md "Every tier"; SSD-tier blocks on the GPU path) -------------------

GpuPool::~GpuPool() { staging_free(); }

void GpuPool::staging_free() {
  if (!staging_host_) return;
  const cxlkv_cuda_ops& o = library().ops();
  for (void*& e : staging_event_) {
    if (!e) continue;
    (void)o.event_sync(e);  // the DMA reading the slot is done before the memory goes
    (void)o.event_destroy(e);
    e = nullptr;
  }
  (void)o.host_unregister(staging_host_);
  std::free(staging_host_);
  staging_host_ = nullptr;
  staging_dev_ = staging_slot_bytes_ = 0;
}

Result<GpuPool::StagingSlot> GpuPool::staging_acquire(uint64_t bytes) {
  CXLKV_TRY(select_device());
  const cxlkv_cuda_ops& o = library().ops();
  if (bytes > staging_slot_bytes_) {
    staging_free();
    uint64_t slot = std::max<uint64_t>(staging_min_slot_, (bytes + 4095) / 4096 * 4096);
    void* p = std::aligned_alloc(4096, slot * kStagingSlots);  // O_DIRECT-friendly
    if (!p) return Error(-ENOMEM, "GPU staging ring: " + std::to_string(slot * kStagingSlots) + " bytes");
    uint64_t dev = 0;
    if (int rc = o.host_register(p, slot * kStagingSlots, 0, &dev); rc < 0) {
      std::free(p);
      return library().error(rc, "GPU staging ring: pin " + std::to_string(slot * kStagingSlots) + " bytes");
    }
    staging_host_ = static_cast<std::byte*>(p);
    staging_dev_ = dev;
    staging_slot_bytes_ = slot;
    staging_next_ = 0;
  }
  const size_t i = staging_next_++ % kStagingSlots;
  if (void*& e = staging_event_[i]) {  // the slot's previous DMA must be done before it is overwritten
    int rc = o.event_sync(e);
    (void)o.event_destroy(e);
    e = nullptr;
    if (rc < 0) return library().error(rc, "GPU staging ring: earlier copy from slot " + std::to_string(i));
  }
  return StagingSlot{staging_host_ + i * staging_slot_bytes_, staging_dev_ + i * staging_slot_bytes_,
                     staging_slot_bytes_, i};
}

Result<void> GpuPool::staging_release(const StagingSlot& s, void* stream) {
  void* ev = nullptr;
  if (int rc = library().ops().event_record(stream, &ev); rc < 0)
    return library().error(rc, "GPU staging ring: event after slot " + std::to_string(s.index));
  staging_event_[s.index] = ev;
  return {};
}

}  // namespace cxlkv::gpu
