// SPDX-License-Identifier: MIT
// dev: lock slot ownership through CXLKV_IOC_LOCK_ALLOC / LOCK_FREE.
#include "region/dev_lock_slots.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "uapi/cxlkv_ioctl.h"

namespace cxlkv::region {

namespace {

// One file per device path for the whole process: its close (at exit or
// death) is what makes the kernel release the slots this process owns.
Result<int> slot_file(const Region& r) {
  struct File {
    pid_t pid;
    int fd;
  };
  static std::mutex mu;
  static auto* files = new std::map<std::string, File>();  // never freed: lives until exit
  const std::string& uri = r.uri();
  std::string path = uri.rfind("dev:", 0) == 0 ? uri.substr(4) : uri;
  std::lock_guard<std::mutex> g(mu);
  auto it = files->find(path);
  if (it != files->end()) {
    if (it->second.pid == ::getpid()) return it->second.fd;
    // A fork()ed child shares its parent's file, and with it the parent's
    // slots: drop the inherited copy and own slots through a file of its own.
    ::close(it->second.fd);
    files->erase(it);
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error(-errno, "pool " + uri + ": open " + path + " for lock slots: " + std::strerror(errno));
  (*files)[path] = File{::getpid(), fd};
  return fd;
}

Error slot_error(const Region& r, uint32_t id, int e, const char* what) {
  std::string why;
  switch (e) {
    case EBUSY: why = "owned by another file on this host (a live holder, or a dead one not yet released)"; break;
    case ENOENT: why = "not owned by this process, or the pool has no control carve"; break;
    case EINVAL: why = "lock id or node id out of range for this pool"; break;
    case EPERM: why = "the id is reserved for the cxlkv runtime (ids below " + std::to_string(CXLKV_LOCK_FIRST_USER) + ")"; break;
    case EDQUOT: why = "this process owns as many slots as the module allows per file (max_slots_per_file)"; break;
    case EBADF: why = "the device is not open for writing"; break;
    default: why = std::strerror(e);
  }
  return Error(-e, "pool " + r.uri() + ": lock " + std::to_string(id) + ": " + what + ": " + why);
}

}  // namespace

Result<void> dev_own_lock_slot(const Region& r, uint32_t lock_id) {
  if (r.kind() != BackendKind::dev) return {};
  auto fd = slot_file(r);
  if (!fd) return fd.error();
  cxlkv_ioc_lock a{};
  a.lock_id = lock_id;
  // The runtime's own layers use the reserved ids; the module refuses them
  // to callers that do not say they are the runtime.
  if (lock_id < CXLKV_LOCK_FIRST_USER) a.flags = CXLKV_LOCK_F_RUNTIME;
  if (::ioctl(fd.value(), CXLKV_IOC_LOCK_ALLOC, &a) != 0) return slot_error(r, lock_id, errno, "own slot");
  return {};
}

Result<void> dev_disown_lock_slot(const Region& r, uint32_t lock_id) {
  if (r.kind() != BackendKind::dev) return {};
  auto fd = slot_file(r);
  if (!fd) return fd.error();
  cxlkv_ioc_lock a{};
  a.lock_id = lock_id;
  if (::ioctl(fd.value(), CXLKV_IOC_LOCK_FREE, &a) != 0) return slot_error(r, lock_id, errno, "disown slot");
  return {};
}

}  // namespace cxlkv::region
