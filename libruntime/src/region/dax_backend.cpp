// SPDX-License-Identifier: MIT
// dax:/dev/daxX.Y -- a device-dax character device (CXL Type-3 memory exposed
// as a dax region, or a memmap= range).  Device-dax refuses mappings whose
// address or length is not a multiple of the device's alignment (typically
// 2 MiB), so the alignment and size are read from sysfs and the mapping is
// placed at an aligned address.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "region/backend.hpp"

namespace cxlkv::region {

namespace {

// Read one unsigned number (decimal or 0x hex) from a sysfs attribute.
bool read_sysfs_u64(const std::string& path, uint64_t* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::string s;
  f >> s;
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno || end == s.c_str()) return false;
  *out = v;
  return true;
}

class DaxBackend : public Backend {
 public:
  DaxBackend(PoolUri uri, int fd, uint64_t size, uint64_t align)
      : Backend(std::move(uri)), fd_(fd), size_(size), align_(align) {}
  ~DaxBackend() override {
    unmap();
    ::close(fd_);
  }
  uint64_t size() const override { return size_; }
  uint64_t map_alignment() const override { return align_; }

  Result<std::byte*> map() override {
    if (base_) return base_;
    // Reserve size + align of address space, then place the device mapping
    // at the first aligned address inside it and give back the rest.
    uint64_t span = size_ + align_;
    void* r = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
      int err = errno;
      return Error(-err, "pool " + uri_.uri + ": reserving " + std::to_string(span) +
                             " bytes of address space: " + std::strerror(err));
    }
    auto start = reinterpret_cast<uintptr_t>(r);
    uintptr_t aligned = (start + align_ - 1) & ~(uintptr_t)(align_ - 1);
    void* p = ::mmap(reinterpret_cast<void*>(aligned), size_, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED, fd_, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::munmap(r, span);
      return Error(-err, "pool " + uri_.uri + ": mmap of " + std::to_string(size_) +
                             " bytes at " + std::to_string(align_) + "-byte alignment: " +
                             std::strerror(err));
    }
    if (aligned > start) ::munmap(r, aligned - start);
    uintptr_t tail = aligned + size_, end = start + span;
    if (end > tail) ::munmap(reinterpret_cast<void*>(tail), end - tail);
    base_ = static_cast<std::byte*>(p);
    return base_;
  }
  void unmap() override {
    if (base_) ::munmap(base_, size_);
    base_ = nullptr;
  }
  Result<void> lock_metadata() override {
    while (::flock(fd_, LOCK_EX) != 0) {
      int err = errno;
      if (err != EINTR) return Error(-err, "pool " + uri_.uri + ": flock: " + std::strerror(err));
    }
    return {};
  }
  void unlock_metadata() override { ::flock(fd_, LOCK_UN); }

 private:
  int fd_;
  uint64_t size_, align_;
  std::byte* base_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Backend>> open_dax_backend(const PoolUri& uri, const BackendOpenOptions&) {
  const std::string& dev = uri.path;
  struct stat st {};
  if (::stat(dev.c_str(), &st) != 0) {
    int err = errno;
    return Error(-err, "pool " + uri.uri + ": " + dev + ": " + std::strerror(err) +
                           " (is the device-dax region configured? see `daxctl list`)");
  }
  if (!S_ISCHR(st.st_mode))
    return Error(-ENODEV, "pool " + uri.uri + ": " + dev + " is not a character device (device-dax)");
  std::string name = dev.substr(dev.rfind('/') + 1);
  // Test seam: CXLKV_SYSFS replaces /sys, so a test can describe a fake
  // device (a character device such as /dev/zero) with its own size/align.
  const char* env = std::getenv("CXLKV_SYSFS");
  std::string sys = env && *env ? env : "/sys";
  // The dax bus exposes the device's attributes; older kernels only the class.
  std::string dirs[] = {sys + "/bus/dax/devices/" + name, sys + "/class/dax/" + name};
  uint64_t size = 0, align = 0;
  std::string used;
  for (const auto& d : dirs) {
    if (read_sysfs_u64(d + "/size", &size)) {
      used = d;
      if (!read_sysfs_u64(d + "/align", &align)) align = 2ULL << 20;  // dax default
      break;
    }
  }
  if (used.empty())
    return Error(-ENODEV, "pool " + uri.uri + ": no sysfs attributes for " + name + " under " + sys +
                              "/bus/dax/devices or " + sys + "/class/dax (not a device-dax device?)");
  if (size == 0)
    return Error(-ENODEV, "pool " + uri.uri + ": " + used + "/size is 0 (region not provisioned)");
  if (align == 0 || (align & (align - 1)) != 0 || size % align != 0)
    return Error(-EINVAL, "pool " + uri.uri + ": " + used + ": alignment " + std::to_string(align) +
                              " is not a power of two dividing the size " + std::to_string(size));
  int fd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Error(-err, "pool " + uri.uri + ": open " + dev + ": " + std::strerror(err));
  }
  return std::unique_ptr<Backend>(new DaxBackend(uri, fd, size, align));
}

}  // namespace cxlkv::region
