// SPDX-License-Identifier: MIT
#include "region/fd_backend.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "region/superblock.hpp"
#include "util/log.hpp"
#include "util/safe_file.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

namespace cxlkv::region {

namespace {

constexpr uint64_t kHuge = 2ull << 20;

Error sys_error(const PoolUri& uri, const std::string& what, int err) {
  return Error(-err, "pool " + uri.uri + ": " + what + ": " + std::strerror(err));
}

// Free bytes of the file system holding `fd` (for messages and the up-front
// check); false when unknown.
bool fs_space(int fd, uint64_t* total, uint64_t* avail) {
  struct statvfs v {};
  if (::fstatvfs(fd, &v) != 0 || v.f_frsize == 0) return false;
  *total = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
  *avail = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  return true;
}

// "24 GiB", "18.5 GiB": file-system sizes in messages (human_size is exact).
std::string approx_size(uint64_t b) {
  static const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<uint64_t>(v))) std::snprintf(buf, sizeof buf, "%.0f %s", v, unit[u]);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, unit[u]);
  return buf;
}

bool on_hugetlbfs(int fd) {
  struct statfs f {};
  return ::fstatfs(fd, &f) == 0 && static_cast<uint64_t>(f.f_type) == HUGETLBFS_MAGIC;
}

// Bytes of the mapping at `addr` mapped with PMD (2 MiB) entries, from
// /proc/self/smaps (FilePmdMapped / ShmemPmdMapped of that VMA).
uint64_t pmd_mapped_bytes(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  char head[32];
  std::snprintf(head, sizeof head, "%" PRIxPTR "-", reinterpret_cast<uintptr_t>(addr));
  std::string line;
  bool inside = false;
  uint64_t kb = 0;
  while (std::getline(in, line)) {
    bool is_head = !line.empty() && line.find(':') > line.find(' ');  // "start-end perms ..." lines
    if (is_head) {
      if (inside) break;
      inside = line.rfind(head, 0) == 0;
      continue;
    }
    if (!inside) continue;
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "FilePmdMapped: %llu kB", &v) == 1 ||
        std::sscanf(line.c_str(), "ShmemPmdMapped: %llu kB", &v) == 1)
      kb += v;
  }
  return kb * 1024;
}

const char* env_or_empty(const char* n) {
  const char* e = std::getenv(n);
  return e ? e : "";
}

}  // namespace

BackendOpenOptions attach_options(const OpenOptions& o) {
  BackendOpenOptions b;
  std::string pf = env_or_empty("CXLKV_PREFAULT");
  const bool pf_off = pf == "0" || pf == "off" || pf == "no";
  if (!pf.empty() && !pf_off && pf != "1" && pf != "on" && pf != "yes")
    log().warn("CXLKV_PREFAULT='{}' is not on or off (1/on/yes, 0/off/no); keeping on", pf);
  b.prefault = o.prefault && !pf_off;
  b.map_on_use = b.prefault && o.map_on_use;
  b.huge_pages = o.huge_pages;
  if (b.huge_pages == HugePages::off) {
    std::string h = env_or_empty("CXLKV_HUGE_PAGES");
    if (h == "prefer" || h == "1" || h == "on") b.huge_pages = HugePages::prefer;
    else if (h == "require") b.huge_pages = HugePages::require;
    else if (!h.empty() && h != "off" && h != "0")
      log().warn("CXLKV_HUGE_PAGES='{}' is not off, prefer or require; using off", h);
  }
  return b;
}

FdBackend::~FdBackend() {
  unmap();
  if (s_.fd >= 0) ::close(s_.fd);
}

uint64_t FdBackend::map_alignment() const { return s_.huge != HugePages::off ? kHuge : 4096; }

Error FdBackend::space_error(const std::string& what, int err) const {
  std::string msg = "pool " + uri_.uri + ": cannot " + what + " " + human_size(s_.size) + " for " + s_.path +
                    ": " + (err == EFAULT ? "the file system could not supply a page" : std::strerror(err));
  uint64_t total = 0, avail = 0;
  if (fs_space(s_.fd, &total, &avail))
    msg += " (its file system holds " + approx_size(total) + ", " + approx_size(avail) + " free)";
  return Error(err == ENOMEM || err == EFAULT ? -ENOSPC : -err, msg);
}

// Leave the file system as it was before format touched it.
void FdBackend::undo_creation() {
  if (s_.created) {
    ::unlink(s_.path.c_str());
  } else if (s_.old_size != s_.size) {
    if (::ftruncate(s_.fd, static_cast<off_t>(s_.old_size)) != 0)
      log().warn("pool {}: could not truncate {} back to {} bytes: {}", uri_.uri, s_.path, s_.old_size,
                 std::strerror(errno));
  }
}

// Fault every page in for writing: the kernel allocates (tmpfs: zeroes) the
// pages now, so the data path takes no first-touch faults.  Read-touching
// each page is the fallback on kernels without MADV_POPULATE_WRITE (it maps
// the pages; the first write to each is then a cheap write-protect fault).
//
// Attaching to an existing pool on tmpfs (shm:) or hugetlbfs, the pages are
// there already and only the page tables are missing: MADV_POPULATE_READ
// maps them with fault-around (many pages per fault) and, tmpfs needing no
// write notification, maps them writable, so writes take no fault either;
// MADV_POPULATE_WRITE would take one write fault (and a dirty-accounting
// pass) per 4 KiB page: 2.3x the time of the read populate on a 2-core VM
// (0.44 vs 0.19 s per GiB), paid by every attaching process.  A file system
// that tracks dirty pages (file: pools) keeps the write populate.
Result<void> FdBackend::populate() {
  if (!s_.allocate) {
    struct statfs f {};
    if (::fstatfs(s_.fd, &f) == 0 && (f.f_type == TMPFS_MAGIC || f.f_type == HUGETLBFS_MAGIC) &&
        ::madvise(base_, s_.size, MADV_POPULATE_READ) == 0)
      return {};
  }
  if (::madvise(base_, s_.size, MADV_POPULATE_WRITE) == 0) return {};
  int e = errno;
  if (e != EINVAL) return space_error("fault in", e);
  const long page = ::sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < s_.size; off += static_cast<uint64_t>(page))
    (void)*reinterpret_cast<volatile const unsigned char*>(base_ + off);
  return {};
}

Result<void> FdBackend::allocate_and_populate() {
  // Huge pages on a huge=advise tmpfs come only from faults through this
  // MADV_HUGEPAGE mapping, so then fault first and let posix_fallocate find
  // the file allocated; otherwise allocate first (a file system too small
  // fails at once, before pages are faulted in one by one).
  bool fault_first = s_.prefault && s_.huge != HugePages::off;
  if (fault_first) CXLKV_TRY(populate());
  if (int rc = ::posix_fallocate(s_.fd, 0, static_cast<off_t>(s_.size)); rc != 0)
    return space_error("allocate", rc);
  if (s_.prefault && !fault_first) CXLKV_TRY(populate());
  return {};
}

Result<std::byte*> FdBackend::map() {
  if (base_) return base_;
  void* p = MAP_FAILED;
  if (s_.huge != HugePages::off) {
    // 2 MiB aligned, so that the kernel can use PMD mappings.
    void* r = ::mmap(nullptr, s_.size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return sys_error(uri_, "reserve " + std::to_string(s_.size) + " bytes of address space", errno);
    auto a = (reinterpret_cast<uintptr_t>(r) + kHuge - 1) & ~(kHuge - 1);
    p = ::mmap(reinterpret_cast<void*>(a), s_.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s_.fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::munmap(r, s_.size + kHuge);
      return sys_error(uri_, "mmap of " + std::to_string(s_.size) + " bytes", e);
    }
    uintptr_t lo = reinterpret_cast<uintptr_t>(r), hi = lo + s_.size + kHuge;
    if (a > lo) ::munmap(r, a - lo);
    if (a + s_.size < hi) ::munmap(reinterpret_cast<void*>(a + s_.size), hi - a - s_.size);
    (void)::madvise(p, s_.size, MADV_HUGEPAGE);  // hugetlbfs and huge=never mounts refuse or ignore it
  } else {
    p = ::mmap(nullptr, s_.size, PROT_READ | PROT_WRITE, MAP_SHARED, s_.fd, 0);
    if (p == MAP_FAILED) return sys_error(uri_, "mmap of " + std::to_string(s_.size) + " bytes", errno);
  }
  base_ = static_cast<std::byte*>(p);

  const bool formatting = s_.allocate;
  Result<void> r;
  if (s_.allocate) {
    r = allocate_and_populate();
  } else if (s_.prefault && s_.map_on_use && s_.huge == HugePages::off) {
    // Mapped on use (Region::prepare): the same populate as below, a range
    // at a time (tmpfs / hugetlbfs: the pages exist, read populate maps them
    // writable; a file system that tracks dirty pages: write populate).
    struct statfs f {};
    const bool mem_fs = ::fstatfs(s_.fd, &f) == 0 && (f.f_type == TMPFS_MAGIC || f.f_type == HUGETLBFS_MAGIC);
    on_use_advice_ = mem_fs ? MADV_POPULATE_READ : MADV_POPULATE_WRITE;
  } else if (s_.prefault) {
    r = populate();
  }
  if (!r) {
    unmap();
    if (s_.allocate) undo_creation();
    return r.error();
  }
  s_.allocate = false;

  if (s_.huge != HugePages::off) {
    if (on_hugetlbfs(s_.fd)) huge_effective_ = true;
    else if (s_.prefault) huge_effective_ = pmd_mapped_bytes(base_) > 0;
    if (!huge_effective_) {
      std::string why = s_.prefault ? "the file system gave 4 KiB pages (a tmpfs needs huge=always, "
                                      "huge=within_size or huge=advise, or shmem_enabled=force)"
                                    : "not checked: prefault is off";
      if (s_.huge == HugePages::require && s_.prefault) {
        unmap();
        if (formatting) undo_creation();
        return Error(-EOPNOTSUPP, "pool " + uri_.uri + ": huge pages required but " + why + " for " + s_.path);
      }
      log().info("pool {}: huge pages requested; {}", uri_.uri, why);
    }
  }
  return base_;
}

bool FdBackend::map_range(uint64_t off, uint64_t len) {
  if (!base_ || !on_use_advice_ || off >= s_.size) return false;
  len = std::min(len, s_.size - off);
  return ::madvise(base_ + off, len, on_use_advice_) == 0;
}

void FdBackend::unmap() {
  if (base_) ::munmap(base_, s_.size);
  base_ = nullptr;
}

Result<void> FdBackend::lock_metadata() {
  while (::flock(s_.fd, LOCK_EX) != 0) {
    if (errno != EINTR) return sys_error(uri_, "flock " + uri_.uri, errno);
  }
  return {};
}

void FdBackend::unlock_metadata() { ::flock(s_.fd, LOCK_UN); }

Result<std::unique_ptr<Backend>> open_fd_backend(const PoolUri& uri, const std::string& path,
                                                 const BackendOpenOptions& o) {
  util::SafeOpenOptions so;
  so.what = "pool " + uri.uri;
  so.create = o.create;
  auto f = util::safe_open(path, so);
  if (!f) {
    if (f.error().code() == -ENOENT)
      return Error(-ENOENT, "pool " + uri.uri + ": " + path +
                                " does not exist (a pool is created by formatting it: "
                                "cxlkvctl --pool " + uri.uri + " format)");
    return f.error();
  }
  FdBackend::Setup s;
  s.path = path;
  s.fd = f->fd;
  s.created = f->created;
  s.size = s.old_size = static_cast<uint64_t>(f->st.st_size);
  s.prefault = o.prefault;
  s.map_on_use = o.map_on_use;
  s.huge = o.huge_pages;
  auto fail = [&](Error e) -> Result<std::unique_ptr<Backend>> {
    if (s.created) ::unlink(path.c_str());
    ::close(s.fd);
    return e;
  };
  if (o.create && o.size != 0 && o.size != s.size) {
    // Refuse at once what cannot fit: the blocks the file still needs
    // against the free space (posix_fallocate at map() is the real check).
    uint64_t have = static_cast<uint64_t>(f->st.st_blocks) * 512, total = 0, avail = 0;
    if (o.size > have && fs_space(s.fd, &total, &avail) && o.size - have > avail)
      return fail(Error(-ENOSPC, "pool " + uri.uri + ": cannot allocate " + human_size(o.size) + " for " + path +
                                     ": its file system holds " + approx_size(total) + ", " + approx_size(avail) +
                                     " free; the pool was not formatted"));
    if (::ftruncate(s.fd, static_cast<off_t>(o.size)) != 0)
      return fail(sys_error(uri, "resize " + path + " to " + std::to_string(o.size) + " bytes", errno));
    s.size = o.size;
  }
  if (s.size == 0)
    return fail(Error(-ENODATA, "pool " + uri.uri + ": " + path +
                                    " is empty (unformatted; give a size when formatting)"));
  s.allocate = o.create;
  return std::unique_ptr<Backend>(new FdBackend(uri, std::move(s)));
}

}  // namespace cxlkv::region
