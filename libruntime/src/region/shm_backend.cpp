// SPDX-License-Identifier: MIT
// shm:NAME:SIZE -- the embedded default pool: a tmpfs file /dev/shm/NAME that
// every process of this host (and QEMU guests via ivshmem) can map.
#include <cerrno>

#include "region/fd_backend.hpp"

namespace cxlkv::region {

Result<std::unique_ptr<Backend>> open_shm_backend(const PoolUri& uri, const BackendOpenOptions& o) {
  BackendOpenOptions fo = o;
  if (o.create) {
    // No size at all: an existing pool is formatted at its own size, as a
    // file: pool is (Region::format refuses a missing one with
    // needs_size_error before it gets here).
    if (uri.size != 0 && o.size != 0 && uri.size != o.size)
      return Error(-EINVAL, "pool " + uri.uri + ": size " + std::to_string(o.size) +
                                " differs from the URI's size " + std::to_string(uri.size));
    fo.size = uri.size ? uri.size : o.size;
  }
  auto b = open_fd_backend(uri, uri.path, fo);
  if (!b) return b;
  // An existing shm: pool opened with a size in the URI must have that size:
  // two processes naming different sizes would disagree about the pool.
  if (uri.size != 0 && !o.any_size && b.value()->size() != uri.size)
    return Error(-EINVAL, "pool " + uri.uri + ": " + uri.path + " holds " +
                              std::to_string(b.value()->size()) + " bytes but the URI says " +
                              std::to_string(uri.size));
  return b;
}

}  // namespace cxlkv::region
