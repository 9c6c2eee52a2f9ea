// SPDX-License-Identifier: MIT
// dev:/dev/cxlkvN -- pools served by the cxlkv kernel module.
//
// PLACEHOLDER owned by the kmod area: replace open_dev_backend() with a
// Backend that opens the misc device, checks the ioctl ABI version, maps
// the pool and implements Backend::carve_added/carve_removed (memtype) with
// the module's ioctls (uapi/cxlkv_ioctl.h).
#include <cerrno>

#include "region/backend.hpp"

namespace cxlkv::region {

Result<std::unique_ptr<Backend>> open_dev_backend(const PoolUri& uri, const BackendOpenOptions&) {
  return Error(-ENODEV, "pool " + uri.uri + ": -ENODEV: kernel module backend not available");
}

}  // namespace cxlkv::region
