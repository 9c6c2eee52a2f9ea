// SPDX-License-Identifier: MIT
#include "huge_tmpfs.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace replay {

HugeTmpfs HugeTmpfs::mount(uint64_t bytes) {
  HugeTmpfs t;
  auto refuse = [&](const char* step) {
    t.why_not_ = std::string(step) + ": " + std::strerror(errno) +
                 (errno == EPERM ? " (a private tmpfs needs CAP_SYS_ADMIN)" : "");
    return std::move(t);
  };
  const int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0) return refuse("fsopen tmpfs");
  // huge=always: every 2 MiB-aligned extent of a file gets a huge page when
  // the kernel has one (else 4 KiB pages; FdBackend says so).  size: the
  // run's pools and no more, so a runaway run cannot take all memory.
  const std::string size = std::to_string((bytes + (2ull << 20) - 1) & ~((2ull << 20) - 1));
  int mnt = -1;
  if (fsconfig(fs, FSCONFIG_SET_STRING, "huge", "always", 0) != 0 ||
      fsconfig(fs, FSCONFIG_SET_STRING, "size", size.c_str(), 0) != 0 ||
      fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0700", 0) != 0 ||
      fsconfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    const int e = errno;
    close(fs);
    errno = e;
    return refuse("fsconfig tmpfs huge=always");
  }
  // Not close-on-exec: the workers reach the pool through this descriptor.
  mnt = fsmount(fs, 0, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  const int e = errno;
  close(fs);
  errno = e;
  if (mnt < 0) return refuse("fsmount tmpfs");
  t.fd_ = mnt;
  return t;
}

HugeTmpfs& HugeTmpfs::operator=(HugeTmpfs&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    why_not_ = std::move(o.why_not_);
    o.fd_ = -1;
  }
  return *this;
}

HugeTmpfs::~HugeTmpfs() {
  if (fd_ >= 0) close(fd_);
}

std::string HugeTmpfs::pool_uri(const std::string& name) const {
  return "file:/proc/self/fd/" + std::to_string(fd_) + "/" + name;
}

void HugeTmpfs::unlink(const std::string& name) const {
  if (fd_ >= 0) (void)unlinkat(fd_, name.c_str(), 0);
}

}  // namespace replay
