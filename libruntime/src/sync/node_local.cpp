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
  const uint64_t pins_off = align_up(heap_off + heap_bytes, 4096);
  const uint64_t total = pins_off + kNodePinSectionBytes;

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
  nl->pins = static_cast<std::byte*>(p) + pins_off;
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
    sync::robust_mutex_init(&h->watcher_mu);
    for (uint32_t i = 0; i < max_locks; i++) {
      new (&nl->locks[i]) LocalLockEntry{};
      sync::robust_mutex_init(&nl->locks[i].mu);
    }
    sync::robust_mutex_init(&reinterpret_cast<NodePinSectionHead*>(nl->pins)->mu);  // the rest stays zero
    __atomic_store_n(&h->magic, kNodeLocalMagic, __ATOMIC_RELEASE);  // valid from here on
  }
  ::flock(f.fd, LOCK_UN);
  return nl;
}

NodeLocal::~NodeLocal() {
  if (hdr) ::munmap(hdr, map_len);
}

}  // namespace cxlkv

// ---- garbage collection of node-local files (cxlkvctl node gc, cxlkvd) ----

#include <dirent.h>

#include <fstream>
#include <set>

#include "cxlkv/sync.hpp"

namespace cxlkv {

namespace {
constexpr const char* kShmDir = "/dev/shm";
constexpr const char* kNodePrefix = "cxlkv-node-";

std::string hex16(const uint8_t id[16]) {
  char buf[33];
  for (int i = 0; i < 16; i++) std::snprintf(buf + 2 * i, 3, "%02x", id[i]);
  return buf;
}

// Pool ids of the shm pools that exist: regular files in /dev/shm that
// start with a cxlkv superblock.
std::set<std::string> shm_pool_ids() {
  std::set<std::string> ids;
  DIR* d = ::opendir(kShmDir);
  if (!d) return ids;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n == "." || n == ".." || n.rfind(kNodePrefix, 0) == 0) continue;
    int fd = ::openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    cxlkv_superblock sb{};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        ::pread(fd, &sb, 48, 0) == 48 && sb.magic == CXLKV_SB_MAGIC)
      ids.insert(hex16(sb.pool_id));
    ::close(fd);
  }
  ::closedir(d);
  return ids;
}

// pid of a process that maps /dev/shm/NAME, or 0.
uint32_t mapped_by(const std::string& name) {
  const std::string needle = std::string(kShmDir) + "/" + name;
  DIR* d = ::opendir("/proc");
  if (!d) return 0;
  uint32_t found = 0;
  while (dirent* de = ::readdir(d)) {
    char* end = nullptr;
    unsigned long pid = std::strtoul(de->d_name, &end, 10);
    if (!pid || *end) continue;
    std::ifstream maps(std::string("/proc/") + de->d_name + "/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.size() >= needle.size() && line.compare(line.size() - needle.size(), needle.size(), needle) == 0) {
        found = static_cast<uint32_t>(pid);
        break;
      }
    if (found) break;
  }
  ::closedir(d);
  return found;
}
}  // namespace

std::vector<NodeLocalGc> gc_node_local(const std::vector<std::array<uint8_t, 16>>& keep_pools, bool dry_run) {
  std::set<std::string> live = shm_pool_ids();
  for (const auto& id : keep_pools) live.insert(hex16(id.data()));
  std::vector<NodeLocalGc> out;
  DIR* d = ::opendir(kShmDir);
  if (!d) return out;
  std::vector<std::string> names;
  while (dirent* de = ::readdir(d))
    if (std::string(de->d_name).rfind(kNodePrefix, 0) == 0) names.push_back(de->d_name);
  ::closedir(d);
  for (const auto& n : names) {
    NodeLocalGc g;
    g.name = n;
    // cxlkv-node-<32 hex pool id>-<node>
    const std::string rest = n.substr(std::strlen(kNodePrefix));
    g.pool_id = rest.substr(0, std::min<size_t>(32, rest.size()));
    if (rest.size() < 34 || rest[32] != '-') {
      g.why = "name does not follow cxlkv-node-<pool id>-<node>; left alone";
      out.push_back(g);
      continue;
    }
    g.node = static_cast<uint32_t>(std::strtoul(rest.c_str() + 33, nullptr, 10));
    if (live.count(g.pool_id)) {
      g.why = "pool exists";
    } else if (uint32_t pid = mapped_by(n)) {
      g.why = "pool not found, but mapped by pid " + std::to_string(pid);
    } else if (dry_run) {
      g.why = "pool not found (would remove)";
    } else if (::unlink((std::string(kShmDir) + "/" + n).c_str()) == 0) {
      g.removed = true;
      g.why = "pool not found; removed";
    } else {
      g.why = std::string("pool not found; unlink failed: ") + std::strerror(errno);
    }
    out.push_back(g);
  }
  return out;
}

Result<void> remove_node_local(const Region& region, uint32_t node) {
  if (node >= region.max_nodes())
    return Error(-EINVAL, "pool " + region.uri() + ": node " + std::to_string(node) + " out of range (max_nodes " +
                              std::to_string(region.max_nodes()) + ")");
  const std::string name = NodeContext::default_local_name(region, node);
  if (::shm_unlink(("/" + name).c_str()) != 0 && errno != ENOENT) {
    int e = errno;
    return Error(-e, "node-local memory /dev/shm/" + name + ": unlink: " + std::strerror(e));
  }
  return {};
}

}  // namespace cxlkv
