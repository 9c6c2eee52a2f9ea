// SPDX-License-Identifier: MIT
#include "sync/node_local.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "sync/robust_mutex.hpp"
#include "util/log.hpp"
#include "util/safe_file.hpp"

namespace cxlkv {

namespace {
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

Error sys_error(const std::string& name, const char* op) {
  int e = errno;
  return Error(-e, "node-local memory /dev/shm/" + name + ": " + op + ": " + std::strerror(e));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

Result<NodeLocal*> NodeLocal::open(const std::string& name, uint32_t node,
                                   const uint8_t pool_id[16], uint32_t max_locks,
                                   uint32_t max_nodes, uint64_t heap_bytes) {
  const uint64_t locks_off = align_up(sizeof(NodeLocalHeader), 4096);
  const uint64_t heap_off = align_up(locks_off + uint64_t(max_locks) * sizeof(LocalLockEntry), 4096);
  const uint64_t total = align_up(heap_off + heap_bytes, 4096);

  Fd f;
  {
    // What shm_open("/NAME", O_CREAT) opens, without following a symbolic
    // link and refusing a file another user planted (util/safe_file.hpp).
    util::SafeOpenOptions so;
    so.what = "node-local memory";
    so.create = true;
    auto sf = util::safe_open("/dev/shm/" + name, so);
    if (!sf) return sf.error();
    f.fd = sf->fd;
  }
  // Serialise creation against the other processes of this node.
  if (::flock(f.fd, LOCK_EX) != 0) return sys_error(name, "flock");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return sys_error(name, "fstat");

  bool fresh = static_cast<uint64_t>(st.st_size) != total;
  if (!fresh) {
    NodeLocalHeader h;
    if (::pread(f.fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return sys_error(name, "pread");
    fresh = h.magic != kNodeLocalMagic || h.version != kNodeLocalVersion || h.node != node ||
            std::memcmp(h.pool_id, pool_id, 16) != 0 || h.max_locks != max_locks ||
            h.total_size != total;
  }
  if (fresh) {
    if (st.st_size != 0)
      log().warn("node-local memory /dev/shm/{}: layout does not match this pool; re-initialising", name);
    // Zero the whole file, then size it (tmpfs: pages appear on first touch).
    if (::ftruncate(f.fd, 0) != 0 || ::ftruncate(f.fd, static_cast<off_t>(total)) != 0)
      return sys_error(name, "ftruncate");
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) return sys_error(name, "mmap");

  auto* nl = new NodeLocal;
  nl->hdr = static_cast<NodeLocalHeader*>(p);
  nl->locks = reinterpret_cast<LocalLockEntry*>(static_cast<std::byte*>(p) + locks_off);
  nl->heap = static_cast<std::byte*>(p) + heap_off;
  nl->heap_bytes = heap_bytes;
  nl->map_len = total;
  nl->name = name;
  if (fresh) {
    NodeLocalHeader* h = nl->hdr;
    h->version = kNodeLocalVersion;
    h->node = node;
    std::memcpy(h->pool_id, pool_id, 16);
    h->max_locks = max_locks;
    h->max_nodes = max_nodes;
    h->total_size = total;
    h->locks_off = locks_off;
    h->heap_off = heap_off;
    h->heap_bytes = heap_bytes;
    sync::robust_mutex_init(&h->doorbell_mu);
    sync::robust_mutex_init(&h->heartbeat_mu);
    sync::robust_mutex_init(&h->heap_mu);
    for (uint32_t i = 0; i < max_locks; i++) {
      new (&nl->locks[i]) LocalLockEntry{};
      sync::robust_mutex_init(&nl->locks[i].mu);
    }
    __atomic_store_n(&h->magic, kNodeLocalMagic, __ATOMIC_RELEASE);  // valid from here on
  }
  ::flock(f.fd, LOCK_UN);
  return nl;
}

NodeLocal::~NodeLocal() {
  if (hdr) ::munmap(hdr, map_len);
}

}  // namespace cxlkv
