// SPDX-License-Identifier: MIT
// Registering the pool mapping for GPU DMA.  cudaHostRegister(portable |
// mapped) works for ordinary memory (shm:, file:); PFN mappings (dev:, dax:
// with VM_PFNMAP / VM_IO) need cudaHostRegisterIoMemory.  Very large pools
// are registered in chunks, which also keeps one failure from wasting a long
// pin of the whole range.
#include <cerrno>
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
}  // namespace

Result<std::unique_ptr<PoolPin>> PoolPin::pin(std::shared_ptr<CudaLibrary> lib, void* base, uint64_t len,
                                              const PinOptions& opts) {
  const std::string what = "pin of pool range " + hex(reinterpret_cast<uintptr_t>(base)) + "+" + hex(len);
  if (!lib || !base || !len) return Error(-EINVAL, what + ": no library, base or length");
  if (reinterpret_cast<uintptr_t>(base) % kPage) return Error(-EINVAL, what + ": base is not page aligned");
  uint64_t chunk = opts.chunk_bytes ? (opts.chunk_bytes + kPage - 1) / kPage * kPage : len;
  if (chunk > len) chunk = len;

  std::unique_ptr<PoolPin> p(new PoolPin);
  p->lib_ = lib;
  p->base_ = static_cast<std::byte*>(base);
  p->size_ = len;

  struct Attempt {
    PinMethod method;
    uint32_t flags;
  };
  std::vector<Attempt> attempts;
  if (!opts.force_io_memory) attempts.push_back({PinMethod::host_register, 0});
  if (opts.force_io_memory || opts.try_io_memory) attempts.push_back({PinMethod::io_memory, CXLKV_CUDA_REG_IOMEMORY});

  std::string why;
  int last_rc = -EIO;
  for (const auto& a : attempts) {
    bool ok = true;
    for (uint64_t off = 0; off < len; off += chunk) {
      const uint64_t n = len - off < chunk ? len - off : chunk;
      uint64_t dev = 0;
      int rc = lib->ops().host_register(p->base_ + off, n, a.flags, &dev);
      if (rc < 0) {
        last_rc = rc;
        why += std::string(why.empty() ? "" : "; ") + to_string(a.method) + " failed at offset " + hex(off) + ": " +
               lib->ops().last_error();
        for (const auto& c : p->chunks_) lib->ops().host_unregister(p->base_ + c.off);
        p->chunks_.clear();
        ok = false;
        break;
      }
      p->chunks_.push_back({off, n, dev});
    }
    if (ok) {
      p->method_ = lib->is_reference() ? PinMethod::reference : a.method;
      p->chunk_bytes_ = chunk;
      log().info("gpu: pinned {} bytes at {} in {} chunk(s) by {}", len, hex(reinterpret_cast<uintptr_t>(base)),
                 p->chunks_.size(), to_string(p->method_));
      return p;
    }
  }
  return Error(last_rc, what + ": " + why);
}

PoolPin::~PoolPin() {
  for (const auto& c : chunks_) {
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
