// SPDX-License-Identifier: MIT
// A pool held in a regular file (file:PATH) or a tmpfs file (shm:NAME):
// mapped MAP_SHARED, superblock updates serialized with flock().
//
// Files are opened with util::safe_open (no symbolic links, exclusive
// creation, owner and mode checked).  A file created or resized by format is
// allocated up front (posix_fallocate) when it is mapped, so a file system
// too small fails the format instead of a writer taking SIGBUS later; the
// file is then removed (created) or truncated back (resized).
#pragma once

#include "region/backend.hpp"

namespace cxlkv::region {

class FdBackend : public Backend {
 public:
  struct Setup {
    std::string path;
    int fd = -1;
    uint64_t size = 0;
    bool created = false;   // this open created the file
    uint64_t old_size = 0;  // size before this open resized it
    bool allocate = false;  // allocate the whole file at map()
    bool prefault = false;
    bool map_on_use = false;
    HugePages huge = HugePages::off;
  };
  FdBackend(PoolUri uri, Setup s) : Backend(std::move(uri)), s_(std::move(s)) {}
  ~FdBackend() override;

  uint64_t size() const override { return s_.size; }
  uint64_t map_alignment() const override;
  Result<std::byte*> map() override;
  void unmap() override;
  bool maps_on_use() const override { return on_use_advice_ != 0; }
  bool map_range(uint64_t off, uint64_t len) override;
  Result<void> lock_metadata() override;
  void unlock_metadata() override;
  // After map(): whether huge pages back the mapping (checked only when the
  // pages were faulted in).
  bool huge_pages_in_effect() const override { return huge_effective_; }

 private:
  Result<void> allocate_and_populate();
  Result<void> populate();
  Error space_error(const std::string& what, int err) const;
  void undo_creation();

  Setup s_;
  std::byte* base_ = nullptr;
  bool huge_effective_ = false;
  int on_use_advice_ = 0;  // map_on_use: the madvise that maps a range (0: mapped whole at map())
};

// Open (optionally create / resize) the file at `path` for the pool `uri`.
Result<std::unique_ptr<Backend>> open_fd_backend(const PoolUri& uri, const std::string& path,
                                                 const BackendOpenOptions& o);

}  // namespace cxlkv::region
