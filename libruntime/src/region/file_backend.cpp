// SPDX-License-Identifier: MIT
// file:PATH -- a pool in a regular file (tests, fuzzing, inspection of copies).
#include <cerrno>

#include "region/fd_backend.hpp"

namespace cxlkv::region {

Result<std::unique_ptr<Backend>> open_file_backend(const PoolUri& uri, const BackendOpenOptions& o) {
  return open_fd_backend(uri, uri.path, o);
}

}  // namespace cxlkv::region
