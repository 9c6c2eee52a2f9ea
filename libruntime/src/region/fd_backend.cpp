// SPDX-License-Identifier: MIT
#include "region/fd_backend.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cxlkv::region {

namespace {
Error sys_error(const PoolUri& uri, const std::string& what, int err) {
  return Error(-err, "pool " + uri.uri + ": " + what + ": " + std::strerror(err));
}
}  // namespace

FdBackend::~FdBackend() {
  unmap();
  if (fd_ >= 0) ::close(fd_);
}

Result<std::byte*> FdBackend::map() {
  if (base_) return base_;
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return sys_error(uri_, "mmap of " + std::to_string(size_) + " bytes", errno);
  base_ = static_cast<std::byte*>(p);
  return base_;
}

void FdBackend::unmap() {
  if (base_) ::munmap(base_, size_);
  base_ = nullptr;
}

Result<void> FdBackend::lock_metadata() {
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno != EINTR) return sys_error(uri_, "flock " + uri_.path, errno);
  }
  return {};
}

void FdBackend::unlock_metadata() { ::flock(fd_, LOCK_UN); }

Result<std::unique_ptr<Backend>> open_fd_backend(const PoolUri& uri, const std::string& path,
                                                 const BackendOpenOptions& o) {
  int flags = O_RDWR | O_CLOEXEC | (o.create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return Error(-ENOENT, "pool " + uri.uri + ": " + path +
                                " does not exist (a pool is created by formatting it: "
                                "cxlkvctl --pool " + uri.uri + " format)");
    return sys_error(uri, "open " + path, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return sys_error(uri, "stat " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(-EINVAL, "pool " + uri.uri + ": " + path + " is not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (o.create && o.size != 0 && o.size != size) {
    if (::ftruncate(fd, static_cast<off_t>(o.size)) != 0) {
      int err = errno;
      ::close(fd);
      return sys_error(uri, "resize " + path + " to " + std::to_string(o.size) + " bytes", err);
    }
    size = o.size;
  }
  if (size == 0) {
    ::close(fd);
    return Error(-ENODATA, "pool " + uri.uri + ": " + path +
                               " is empty (unformatted; give a size when formatting)");
  }
  return std::unique_ptr<Backend>(new FdBackend(uri, fd, size));
}

}  // namespace cxlkv::region
