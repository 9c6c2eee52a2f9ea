// SPDX-License-Identifier: MIT
// A pool held in a regular file (file:PATH) or a tmpfs file (shm:NAME):
// mapped MAP_SHARED, superblock updates serialized with flock().
#pragma once

#include "region/backend.hpp"

namespace cxlkv::region {

class FdBackend : public Backend {
 public:
  FdBackend(PoolUri uri, int fd, uint64_t size) : Backend(std::move(uri)), fd_(fd), size_(size) {}
  ~FdBackend() override;

  uint64_t size() const override { return size_; }
  Result<std::byte*> map() override;
  void unmap() override;
  Result<void> lock_metadata() override;
  void unlock_metadata() override;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::byte* base_ = nullptr;
};

// Open (optionally create / resize) the file at `path` for the pool `uri`.
Result<std::unique_ptr<Backend>> open_fd_backend(const PoolUri& uri, const std::string& path,
                                                 const BackendOpenOptions& o);

}  // namespace cxlkv::region
