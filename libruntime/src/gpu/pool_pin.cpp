// SPDX-License-Identifier: MIT
// Registering the pool mapping for GPU DMA, on demand (docs/gpu.md "On-demand pinning").
//
// cudaHostRegister(portable | mapped) works for ordinary memory (shm:,
// file:); PFN mappings (dev:, dax: with VM_PFNMAP / VM_IO) need
// cudaHostRegisterIoMemory.  Registration costs ~0.6 s per GiB, so nothing is
// registered at open: the range is cut into chunks (default 1 GiB) and a
// chunk is registered the first time a transfer touches it (to_device), or
// by an optional background pre-pin.  The first chunk decides the method;
// later chunks try it first.  Every registered chunk is unregistered at
// destruction, after the background thread has stopped.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "util/log.hpp"

namespace cxlkv::gpu {

const char* to_string(PinMethod m) {
  switch (m) {
    case PinMethod::host_register: return "host-register";
    case PinMethod::io_memory: return "io-memory";
    case PinMethod::reference: return "cpu-reference";
    case PinMethod::pending: return "on-demand (nothing registered yet)";
  }
  return "?";
}

namespace {
constexpr uint64_t kPage = 4096;
std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<std::unique_ptr<PoolPin>> PoolPin::pin(std::shared_ptr<CudaLibrary> lib, void* base, uint64_t len,
                                              const PinOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = "pin of pool range " + hex(reinterpret_cast<uintptr_t>(base)) + "+" + hex(len);
  if (!lib || !base || !len) return Error(-EINVAL, what + ": no library, base or length");
  if (reinterpret_cast<uintptr_t>(base) % kPage) return Error(-EINVAL, what + ": base is not page aligned");
  uint64_t chunk = opts.chunk_bytes ? (opts.chunk_bytes + kPage - 1) / kPage * kPage : len;
  if (chunk > len) chunk = len;

  std::unique_ptr<PoolPin> p(new PoolPin);
  p->lib_ = lib;
  p->base_ = static_cast<std::byte*>(base);
  p->size_ = len;
  p->chunk_bytes_ = chunk;
  p->try_io_memory_ = opts.try_io_memory;
  p->force_io_memory_ = opts.force_io_memory;
  p->nchunks_ = static_cast<size_t>((len + chunk - 1) / chunk);
  p->chunks_.reset(new Chunk[p->nchunks_]);
  for (size_t i = 0; i < p->nchunks_; i++) {
    p->chunks_[i].off = i * chunk;
    p->chunks_[i].len = len - i * chunk < chunk ? len - i * chunk : chunk;
  }
  p->st_.chunks_total = p->nchunks_;
  if (lib->is_reference()) p->method_ = PinMethod::reference;
  if (opts.eager) CXLKV_TRY(p->pin_all());
  p->st_.open_seconds = seconds_since(t0);
  if (opts.background && !opts.eager) p->start_background();
  log().info("gpu: pool range {} bytes at {}: {} chunk(s) of {} bytes, {}", len, hex(reinterpret_cast<uintptr_t>(base)),
             p->nchunks_, chunk, opts.eager ? "all registered" : opts.background ? "pre-pinning in the background"
                                                                               : "registered on first touch");
  return p;
}

// Register chunk i unless it is already (one registration at a time).
Result<void> PoolPin::ensure(size_t i, bool on_demand) const {
  Chunk& c = chunks_[i];
  if (c.state.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> g(mu_);
  if (c.state.load(std::memory_order_relaxed)) return {};
  struct Attempt {
    PinMethod method;
    uint32_t flags;
  };
  Attempt order[2];
  int n = 0;
  const PinMethod chosen = method_.load(std::memory_order_relaxed);
  if (chosen == PinMethod::io_memory || force_io_memory_) {
    order[n++] = {PinMethod::io_memory, CXLKV_CUDA_REG_IOMEMORY};
  } else {
    order[n++] = {PinMethod::host_register, 0};
    if (try_io_memory_) order[n++] = {PinMethod::io_memory, CXLKV_CUDA_REG_IOMEMORY};
  }
  std::string why;
  int last_rc = -EIO;
  const auto t0 = std::chrono::steady_clock::now();
  for (int a = 0; a < n; a++) {
    uint64_t dev = 0;
    int rc = lib_->ops().host_register(base_ + c.off, c.len, order[a].flags, &dev);
    if (rc < 0) {
      last_rc = rc;
      why += std::string(why.empty() ? "" : "; ") + to_string(order[a].method) + " failed: " + lib_->ops().last_error();
      continue;
    }
    const double s = seconds_since(t0);
    c.dev = dev;
    c.state.store(1, std::memory_order_release);
    if (chosen == PinMethod::pending) method_.store(order[a].method, std::memory_order_release);
    st_.chunks_pinned++;
    st_.bytes_pinned += c.len;
    (on_demand ? st_.on_demand : st_.background)++;
    st_.pin_seconds += s;
    if (s > st_.max_chunk_seconds) st_.max_chunk_seconds = s;
    log().debug("gpu: registered pool chunk {} ({} bytes at offset {}) by {} in {:.3f} s ({})", i, c.len, hex(c.off),
                to_string(order[a].method), s, on_demand ? "on demand" : "pre-pin");
    return {};
  }
  return Error(last_rc, "pin of pool chunk " + std::to_string(i) + " (" + hex(c.len) + " bytes at offset " +
                            hex(c.off) + " of the range at " + hex(reinterpret_cast<uintptr_t>(base_)) + "): " + why);
}

Result<void> PoolPin::pin_range(uint64_t off, uint64_t len) const {
  if (off > size_ || len > size_ - off)
    return Error(-ERANGE, "pool range " + hex(off) + "+" + hex(len) + " is outside the " + hex(size_) + " bytes");
  if (len == 0) return {};
  for (uint64_t i = off / chunk_bytes_; i <= (off + len - 1) / chunk_bytes_; i++) CXLKV_TRY(ensure(i, true));
  return {};
}

Result<void> PoolPin::pin_all() const {
  for (size_t i = 0; i < nchunks_; i++) CXLKV_TRY(ensure(i, false));
  return {};
}

void PoolPin::start_background() const {
  std::lock_guard<std::mutex> g(mu_);
  if (bg_.joinable() || lib_->is_reference()) return;
  bg_stop_ = false;
  st_.background_running = true;
  bg_ = std::thread([this] {
    for (size_t i = 0; i < nchunks_ && !bg_stop_.load(std::memory_order_relaxed); i++) {
      if (auto r = ensure(i, false); !r) {
        log().warn("gpu: background pre-pin stopped: {}", r.error().message());
        break;
      }
    }
    std::lock_guard<std::mutex> g2(mu_);
    st_.background_running = false;
  });
}

void PoolPin::stop_background() const {
  bg_stop_ = true;
  if (bg_.joinable() && bg_.get_id() != std::this_thread::get_id()) bg_.join();
}

PinStats PoolPin::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return st_;
}

PoolPin::~PoolPin() {
  stop_background();
  for (size_t i = 0; i < nchunks_; i++) {
    const Chunk& c = chunks_[i];
    if (!c.state.load(std::memory_order_acquire)) continue;
    if (int rc = lib_->ops().host_unregister(base_ + c.off); rc < 0)
      log().warn("gpu: unpin of pool chunk at offset {} failed: {}", hex(c.off), lib_->ops().last_error());
  }
}

Result<void> PoolPin::to_device(uint64_t off, uint64_t len, std::vector<DevicePiece>& out) const {
  if (off > size_ || len > size_ - off)
    return Error(-ERANGE, "pool range " + hex(off) + "+" + hex(len) + " is outside the pinned " + hex(size_) +
                              " bytes");
  if (len == 0) return {};
  size_t i = static_cast<size_t>(off / chunk_bytes_);
  const size_t first = out.size();
  while (len) {
    CXLKV_TRY(ensure(i, true));
    const Chunk& c = chunks_[i];
    const uint64_t in = off - c.off;
    const uint64_t n = c.len - in < len ? c.len - in : len;
    const uint64_t dev = c.dev + in;
    if (out.size() > first && out.back().dev + out.back().len == dev)
      out.back().len += n;  // the GPU sees adjacent chunks contiguously
    else
      out.push_back({dev, n});
    off += n;
    len -= n;
    i++;
  }
  return {};
}

}  // namespace cxlkv::gpu
