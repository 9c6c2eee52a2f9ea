// SPDX-License-Identifier: MIT
#include "sync/node_local.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <optional>

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

namespace {

// What a node-local file of this pool and node must hold, and where.
struct Layout {
  uint64_t locks_off, heap_off, pins_off, total;
};

Layout layout_of(uint32_t max_locks, uint64_t heap_bytes) {
  Layout l;
  l.locks_off = align_up(sizeof(NodeLocalHeader), 4096);
  l.heap_off = align_up(l.locks_off + uint64_t(max_locks) * sizeof(LocalLockEntry), 4096);
  l.pins_off = align_up(l.heap_off + heap_bytes, 4096);
  l.total = l.pins_off + kNodePinSectionBytes;
  return l;
}

// The header of an open node-local file, read with pread (never through a
// mapping: a file shorter than it claims would raise SIGBUS).  Empty when
// the file is shorter than a header or its header does not name `node`
// with this layout version and a total size equal to the file's.
std::optional<NodeLocalHeader> read_header(int fd, const struct stat& st, uint32_t node) {
  NodeLocalHeader h;
  if (static_cast<uint64_t>(st.st_size) < 4096) return std::nullopt;
  if (::pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return std::nullopt;
  if (h.magic != kNodeLocalMagic || h.version != kNodeLocalVersion || h.node != node ||
      h.total_size != static_cast<uint64_t>(st.st_size))
    return std::nullopt;
  return h;
}

// A node-local file as it is published: made whole in an unnamed file
// (O_TMPFILE), then linked under its name, so no process ever opens one
// half-made (DESIGN.md "The pool": node-local state; the lock manager maps
// page 0 of every local node's file).  -EOPNOTSUPP where the file system
// has no unnamed files.
Result<int> make_unnamed(const std::string& name, uint32_t node, const uint8_t pool_id[16], uint32_t max_locks,
                         uint32_t max_nodes, uint64_t heap_bytes) {
  const Layout L = layout_of(max_locks, heap_bytes);
  const mode_t mode = util::configured_file_mode();
  Fd f;
  f.fd = ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
  if (f.fd < 0) return sys_error(name, "create (unnamed, O_TMPFILE)");
  // The umask may have taken bits the operator asked for (group sharing).
  if (::fchmod(f.fd, mode) != 0) return sys_error(name, "chmod");
  if (::ftruncate(f.fd, static_cast<off_t>(L.total)) != 0) return sys_error(name, "ftruncate");
  void* p = ::mmap(nullptr, L.total, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) return sys_error(name, "mmap");
  auto* h = static_cast<NodeLocalHeader*>(p);
  h->version = kNodeLocalVersion;
  h->node = node;
  std::memcpy(h->pool_id, pool_id, 16);
  h->max_locks = max_locks;
  h->max_nodes = max_nodes;
  h->total_size = L.total;
  h->locks_off = L.locks_off;
  h->heap_off = L.heap_off;
  h->heap_bytes = heap_bytes;
  sync::robust_mutex_init(&h->doorbell_mu);
  sync::robust_mutex_init(&h->heartbeat_mu);
  sync::robust_mutex_init(&h->heap_mu);
  sync::robust_mutex_init(&h->watcher_mu);
  auto* locks = reinterpret_cast<LocalLockEntry*>(static_cast<std::byte*>(p) + L.locks_off);
  for (uint32_t i = 0; i < max_locks; i++) {
    new (&locks[i]) LocalLockEntry{};
    sync::robust_mutex_init(&locks[i].mu);
  }
  sync::robust_mutex_init(&reinterpret_cast<NodePinSectionHead*>(static_cast<std::byte*>(p) + L.pins_off)->mu);
  h->magic = kNodeLocalMagic;  // the rest stays zero
  ::munmap(p, L.total);
  const int fd = f.fd;
  f.fd = -1;
  return fd;
}

}  // namespace

Result<NodeLocal*> NodeLocal::open(const std::string& name, uint32_t node,
                                   const uint8_t pool_id[16], uint32_t max_locks,
                                   uint32_t max_nodes, uint64_t heap_bytes) {
  const Layout L = layout_of(max_locks, heap_bytes);
  const std::string path = "/dev/shm/" + name;
  // What shm_open("/NAME") opens, without following a symbolic link and
  // refusing a file another user planted (util/safe_file.hpp).
  util::SafeOpenOptions so;
  so.what = "node-local memory";
  // A file under the name is whole (make_unnamed); one of another layout or
  // pool is replaced by a new whole one.  Racing processes of the node agree
  // on whichever file the name holds at the end: a loser's link fails
  // (EEXIST) and it opens the winner's.
  for (int round = 0;; round++) {
    if (round == 8)
      return Error(-EAGAIN, "node-local memory " + path + ": replaced by other processes on every try; try again");
    Fd f;
    auto sf = util::safe_open(path, so);
    if (sf) {
      f.fd = sf->fd;
      auto h = read_header(f.fd, sf->st, node);
      if (h && std::memcmp(h->pool_id, pool_id, 16) == 0 && h->max_locks == max_locks && h->total_size == L.total) {
        void* p = ::mmap(nullptr, L.total, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);
        if (p == MAP_FAILED) return sys_error(name, "mmap");
        auto* nl = new NodeLocal;
        nl->hdr = static_cast<NodeLocalHeader*>(p);
        nl->locks = reinterpret_cast<LocalLockEntry*>(static_cast<std::byte*>(p) + L.locks_off);
        nl->heap = static_cast<std::byte*>(p) + L.heap_off;
        nl->heap_bytes = heap_bytes;
        nl->pins = static_cast<std::byte*>(p) + L.pins_off;
        nl->map_len = L.total;
        nl->name = name;
        nl->kept_here.assign(max_locks, 0);
        return nl;
      }
      log().warn("node-local memory {}: layout does not match this pool (or the file is damaged); replacing it",
                 path);
      // Another process may have replaced it already: remove only what we judged.
      struct stat now {};
      if (::lstat(path.c_str(), &now) == 0 && now.st_ino == sf->st.st_ino && now.st_dev == sf->st.st_dev)
        ::unlink(path.c_str());
    } else if (sf.error().code() != -ENOENT) {
      return sf.error();
    }
    auto fresh = make_unnamed(name, node, pool_id, max_locks, max_nodes, heap_bytes);
    if (!fresh) return fresh.error();
    Fd t;
    t.fd = fresh.value();
    // Link the whole file under its name; linking through /proc/self/fd
    // needs no privilege (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
    const std::string proc = "/proc/self/fd/" + std::to_string(t.fd);
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0 && errno != EEXIST)
      return sys_error(name, "link");
    // Ours or a racing process's: open what the name holds (next round).
  }
}

NodeLocalHeader* map_node_local_header(const std::string& name, uint32_t node) {
  util::SafeOpenOptions so;
  so.what = "node-local memory";
  auto sf = util::safe_open("/dev/shm/" + name, so);
  if (!sf) return nullptr;  // none, or another user's: that node is polled, not woken
  Fd f;
  f.fd = sf->fd;
  if (!read_header(f.fd, sf->st, node)) return nullptr;
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<NodeLocalHeader*>(p);
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
