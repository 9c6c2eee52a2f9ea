// SPDX-License-Identifier: MIT
// mem:NAME -- a pool in memory the caller owns (Region::open_memory).  Lets
// tests put several Regions, each with its own NonCoherentSim node, over one
// buffer: simulated hosts sharing a pool without any device.
#include "region/backend.hpp"

namespace cxlkv::region {

namespace {
class MemoryBackend : public Backend {
 public:
  MemoryBackend(PoolUri uri, void* base, uint64_t size)
      : Backend(std::move(uri)), base_(static_cast<std::byte*>(base)), size_(size) {}
  uint64_t size() const override { return size_; }
  Result<std::byte*> map() override { return base_; }
  void unmap() override {}

 private:
  std::byte* base_;
  uint64_t size_;
};
}  // namespace

std::unique_ptr<Backend> make_memory_backend(const std::string& uri, void* base, uint64_t size) {
  PoolUri u;
  u.uri = uri;
  u.kind = BackendKind::mem;
  u.size = size;
  return std::make_unique<MemoryBackend>(u, base, size);
}

}  // namespace cxlkv::region
