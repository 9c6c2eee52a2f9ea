// SPDX-License-Identifier: MIT
// dev:/dev/cxlkvN -- pools served by the cxlkv kernel module (kmod/).
//
// The module owns the carve table: it maps the superblock page read-only
// and each carve with that carve's memory type (PAT), and refuses anything
// else.  So this backend reserves one virtual range of the pool's size,
// maps the superblock page and every carve at their pool offsets inside it,
// and sends format and carve changes to the module's ioctls
// (uapi/cxlkv_ioctl.h).  Carves created later, here or on another host,
// are mapped when Region next reads the carve table (carves_seen).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "region/backend.hpp"
#include "uapi/cxlkv_ioctl.h"
#include "util/log.hpp"

namespace cxlkv::region {

namespace {

std::string errstr(int neg) { return std::string(std::strerror(-neg)); }

int ioc(int fd, unsigned long cmd, void* arg) { return ::ioctl(fd, cmd, arg) == 0 ? 0 : -errno; }

class DevBackend final : public Backend {
 public:
  DevBackend(PoolUri uri, int fd, const cxlkv_ioc_info& info)
      : Backend(std::move(uri)), fd_(fd), info_(info) {}
  ~DevBackend() override {
    unmap();
    ::close(fd_);
  }

  uint64_t size() const override { return info_.size; }

  Result<std::byte*> map() override {
    std::lock_guard<std::mutex> g(mu_);
    if (base_) return base_;
    // One reservation for the whole pool; nothing in it is accessible until
    // the module maps the superblock page and the carves over it.
    void* p = ::mmap(nullptr, info_.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return err(-errno, "reserving " + std::to_string(info_.size) + " bytes of address space");
    base_ = static_cast<std::byte*>(p);
    if (::mmap(base_, CXLKV_SB_SIZE, PROT_READ, MAP_SHARED | MAP_FIXED, fd_, 0) == MAP_FAILED) {
      int e = -errno;
      unmap_locked();
      return err(e, "mapping the superblock page");
    }
    // An unformatted device has no carves yet: that is for Region to report.
    auto* l = new cxlkv_ioc_carve_list{};
    int r = ioc(fd_, CXLKV_IOC_CARVE_LIST, l);
    if (r == 0) {
      for (uint32_t i = 0; i < l->count && r == 0; i++) r = map_carve_locked(l->carves[i]);
      if (r) {
        delete l;
        unmap_locked();
        return err(r, "mapping its carves");
      }
    }
    delete l;
    return base_;
  }

  void unmap() override {
    std::lock_guard<std::mutex> g(mu_);
    unmap_locked();
  }

  Result<void> lock_metadata() override {
    if (::flock(fd_, LOCK_EX) != 0) return err(-errno, "flock");
    return {};
  }
  void unlock_metadata() override { ::flock(fd_, LOCK_UN); }

  bool device_owns_carves() const override { return true; }

  Result<void> device_format(uint32_t max_nodes, bool force) override {
    std::lock_guard<std::mutex> g(mu_);
    // The module refuses to format a pool with mapped carves: drop ours.
    auto mapped = mapped_;
    for (auto& [off, c] : mapped) unmap_carve_locked(off);
    cxlkv_ioc_format f{};
    f.max_nodes = max_nodes;
    f.flags = force ? CXLKV_FORMAT_F_FORCE : 0;
    int r = ioc(fd_, CXLKV_IOC_FORMAT, &f);
    if (r == 0) return {};
    for (auto& [off, c] : mapped) (void)map_carve_locked(c);
    if (r == -EEXIST)
      return err(r, "already holds a valid cxlkv superblock; use force (cxlkvctl format --force) to overwrite it");
    if (r == -EBUSY) return err(r, "format refused: carves are mapped or lock slots owned by processes on this host");
    return err(r, "format (CXLKV_IOC_FORMAT)");
  }

  Result<cxlkv_carve> device_carve_create(const cxlkv_carve& want) override {
    cxlkv_carve c = want;
    c.offset = 0;
    c.reserved = 0;
    int r = ioc(fd_, CXLKV_IOC_CARVE_CREATE, &c);
    if (r == 0) return c;
    std::string what = "carve '" + std::string(want.name) + "': ";
    switch (r) {
      case -EEXIST: return err(r, what + "already exists");
      case -ENOSPC: return err(r, what + "no free range of that size, or the carve table is full");
      case -EINVAL: return err(r, what + "invalid name, size, memory type or flags");
      default: return err(r, what + "create (CXLKV_IOC_CARVE_CREATE)");
    }
  }

  Result<void> device_carve_remove(std::string_view name, bool force) override {
    std::lock_guard<std::mutex> g(mu_);
    std::string what = "carve '" + std::string(name) + "': ";
    cxlkv_ioc_carve_remove rm{};
    if (name.size() >= sizeof rm.name) return err(-EINVAL, what + "invalid name");
    std::memcpy(rm.name, name.data(), name.size());
    rm.flags = force ? CXLKV_CARVE_RM_FORCE : 0;
    // The module refuses to remove a carve mapped on this host: drop ours.
    cxlkv_carve mine{};
    bool had = false;
    for (auto& [off, c] : mapped_)
      if (name == c.name) {
        mine = c;
        had = true;
      }
    if (had) unmap_carve_locked(mine.offset);
    int r = ioc(fd_, CXLKV_IOC_CARVE_REMOVE, &rm);
    if (r == 0) return {};
    if (had) (void)map_carve_locked(mine);
    switch (r) {
      case -ENOENT: return err(r, what + "no such carve");
      case -EPERM: return err(r, what + "is a system carve (made by format); removing it needs force (--force)");
      case -EBUSY: return err(r, what + "is mapped elsewhere on this host (another process or Region)");
      default: return err(r, what + "remove (CXLKV_IOC_CARVE_REMOVE)");
    }
  }

  void carves_seen(const cxlkv_superblock& sb) override {
    std::lock_guard<std::mutex> g(mu_);
    if (!base_) return;
    for (uint32_t i = 0; i < sb.ncarves && i < CXLKV_MAX_CARVES; i++) {
      const cxlkv_carve& c = sb.carves[i];
      auto it = mapped_.find(c.offset);
      if (it != mapped_.end() && it->second.size == c.size) continue;
      if (it != mapped_.end()) unmap_carve_locked(c.offset);
      if (int r = map_carve_locked(c))
        log().warn("pool {}: carve '{}' not mapped: {}", uri_.uri, c.name, errstr(r));
    }
  }

 private:
  Error err(int neg, const std::string& what) const {
    return Error(neg, "pool " + uri_.uri + ": " + what + ": " + errstr(neg));
  }

  int map_carve_locked(const cxlkv_carve& c) {
    if (c.offset > info_.size || c.size > info_.size - c.offset) return -ERANGE;
    void* p = ::mmap(base_ + c.offset, c.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                     static_cast<off_t>(c.offset));
    if (p == MAP_FAILED) return -errno;
    mapped_[c.offset] = c;
    return 0;
  }

  // Put the reservation back over a carve (MAP_FIXED replaces the mapping whole).
  void unmap_carve_locked(uint64_t off) {
    auto it = mapped_.find(off);
    if (it == mapped_.end()) return;
    ::mmap(base_ + off, it->second.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    mapped_.erase(it);
  }

  void unmap_locked() {
    if (base_) ::munmap(base_, info_.size);
    base_ = nullptr;
    mapped_.clear();
  }

  int fd_;
  cxlkv_ioc_info info_;
  std::mutex mu_;
  std::byte* base_ = nullptr;
  std::map<uint64_t, cxlkv_carve> mapped_;  // by offset
};

}  // namespace

Result<std::unique_ptr<Backend>> open_dev_backend(const PoolUri& uri, const BackendOpenOptions&) {
  const std::string P = "pool " + uri.uri + ": ";
  int fd = ::open(uri.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    // No device node: the module is not loaded (or has no such backing).
    if (e == ENOENT)
      return Error(-ENODEV, P + "open " + uri.path + ": " + std::strerror(e) +
                                " (is cxlkv.ko loaded? see kmod/README.md)");
    return Error(-e, P + "open " + uri.path + ": " + std::strerror(e));
  }
  cxlkv_ioc_version v{};
  int r = ioc(fd, CXLKV_IOC_GET_VERSION, &v);
  if (r || v.abi_version != CXLKV_IOCTL_ABI_VERSION) {
    ::close(fd);
    if (r) return Error(r, P + uri.path + " is not a cxlkv device (GET_VERSION: " + errstr(r) + ")");
    return Error(-EPROTO, P + "module ioctl ABI version " + std::to_string(v.abi_version) +
                              ", this runtime speaks " + std::to_string(CXLKV_IOCTL_ABI_VERSION));
  }
  cxlkv_ioc_info info{};
  r = ioc(fd, CXLKV_IOC_INFO, &info);
  if (r) {
    ::close(fd);
    return Error(r, P + "INFO: " + errstr(r));
  }
  return std::unique_ptr<Backend>(new DevBackend(uri, fd, info));
}

}  // namespace cxlkv::region
