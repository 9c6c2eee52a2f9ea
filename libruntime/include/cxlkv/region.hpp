// SPDX-License-Identifier: MIT
// Region: one mapped pool device, opened by URI.
//
//   shm:NAME:SIZE    /dev/shm/NAME (embedded default; SIZE like 256M, 4G)
//   file:PATH        a regular file (size fixed at format)
//   dax:/dev/daxX.Y  device-dax; mapping alignment read from sysfs
//   dev:/dev/cxlkvN  the cxlkv kernel module (ioctls in uapi/cxlkv_ioctl.h)
//
// Formatting is explicit (Region::format); open() validates the superblock
// and refuses a damaged pool with an Error naming the pool and the problem.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv_pool.h"

namespace cxlkv {

namespace region {
class Backend;  // libruntime/src/region/backend.hpp
// The size syntax of pool URIs (shm:NAME:SIZE), public so that the tools'
// size options read sizes the same way: "4096", "64K", "256M", "4G", "1T"
// (powers of 1024, decimal digits); false on anything else or overflow.
bool parse_size(std::string_view text, uint64_t* out);
}  // namespace region

enum class BackendKind { shm, file, dax, dev, mem };  // mem: Region::open_memory (tests)
const char* to_string(BackendKind k);

enum class MemType : uint32_t { wb = CXLKV_MEM_WB, wc = CXLKV_MEM_WC, uc = CXLKV_MEM_UC };
const char* to_string(MemType t);

struct CarveInfo {
  std::string name;
  uint64_t offset = 0;  // from pool start
  uint64_t size = 0;
  MemType memtype = MemType::wb;
  uint32_t flags = 0;
};

// Huge pages for pools in tmpfs / hugetlbfs files (shm:, file:).
//   off      4 KiB pages (default)
//   prefer   map 2 MiB aligned with MADV_HUGEPAGE; when the file system gives
//            no huge pages (/dev/shm mounted huge=never, the usual default)
//            the pool works with 4 KiB pages and an info line says so
//   require  the same, but an error when no huge pages are in effect
// Huge pages take effect when the tmpfs is mounted huge=always or
// huge=within_size (or huge=advise for pages first faulted by this mapping),
// when /sys/kernel/mm/transparent_hugepage/shmem_enabled is "force", or for a
// file: pool in a hugetlbfs mount.  Environment: CXLKV_HUGE_PAGES=prefer|require.
enum class HugePages { off, prefer, require };

struct OpenOptions {
  // Domain used for pool accesses; DomainMode::flush unless told otherwise
  // (coherent for tests on one host if explicitly asked).
  HostDomainOptions domain{};
  // Use this domain instead of making a host domain (not owned; must
  // outlive the Region).  Tests: a NonCoherentSim node over the pool memory.
  MemoryDomain* use_domain = nullptr;
  // How long a superblock whose checksum does not match is re-read before
  // the pool is called damaged (an update by another process or host may be
  // in flight).  Tests that stage such an update raise it.
  uint32_t torn_read_patience_us = 5000;
  // Fault every page of a shm:/file: pool in when it is mapped (format and
  // attach: MADV_POPULATE_WRITE, else a read touch of each page), so the data
  // path never takes a first-touch page fault (a fresh 2 MiB block otherwise
  // costs 512 faults, each zeroing a page that is then overwritten).  Cost:
  // the pool's memory is committed at format (it is also allocated up front,
  // see FormatOptions) and each attaching process builds page tables for the
  // whole pool at attach: 2 MiB of page tables per GiB of pool with 4 KiB
  // pages (4 KiB per GiB with 2 MiB pages), and attach takes time in
  // proportion to the pool size.  CXLKV_PREFAULT=0 turns it off.
  bool prefault = true;
  // With prefault: attaching to an existing shm:/file: pool maps no page up
  // front; Region::prepare() maps a range at its first use instead (2 MiB
  // at a time, once per process), and the KV store prepares each block's
  // payload before its copy.  For a process that uses part of a large pool
  // (each of several workers, or a reader of a few blocks): it builds page
  // tables (and tears them down at exit) only for what it touches, instead
  // of the whole pool at attach.  Format still faults everything in.
  bool map_on_use = false;
  HugePages huge_pages = HugePages::off;  // CXLKV_HUGE_PAGES when off
};

struct FormatOptions {
  // shm:/file: create or resize to this size (0: the shm: URI's SIZE, or the
  // existing file's size).  Must be a multiple of 2 MiB, at least 4 MiB.
  uint64_t size = 0;
  uint32_t max_nodes = 16;  // 1 .. CXLKV_MAX_NODES
  // Overwrite a pool that already holds a valid superblock.  Without it,
  // format refuses a valid pool whatever size the URI or `size` names
  // (-EEXIST; a different size is named beside the pool's own).
  bool force = false;
  // shm:/file: pools are allocated up front (posix_fallocate) at format, so
  // a file system too small is an error here (-ENOSPC naming the sizes), not
  // a SIGBUS in a writer later.
};

class Region {
 public:
  virtual ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Open an existing, formatted pool.
  static Result<std::unique_ptr<Region>> open(std::string_view uri, const OpenOptions& opts = {});
  // Write a fresh superblock (no carves) and return the opened pool.
  // Refuses (-EEXIST) to overwrite a valid superblock unless fopts.force.
  static Result<std::unique_ptr<Region>> format(std::string_view uri, const FormatOptions& fopts,
                                                const OpenOptions& opts = {});

  // A pool in caller memory (`base`, `size` bytes, 64 B aligned), named
  // "mem:NAME" in messages.  For tests: several Regions over one buffer,
  // each with its own NonCoherentSim node as OpenOptions::use_domain, act
  // as several hosts sharing a pool.  The memory must outlive the Region.
  static Result<std::unique_ptr<Region>> open_memory(std::string_view name, void* base, uint64_t size,
                                                     const OpenOptions& opts = {});
  static Result<std::unique_ptr<Region>> format_memory(std::string_view name, void* base, uint64_t size,
                                                       const FormatOptions& fopts, const OpenOptions& opts = {});

  const std::string& uri() const { return uri_; }
  BackendKind kind() const { return kind_; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  MemoryDomain& domain() const { return *domain_; }
  // Whether huge pages (2 MiB or more) back this process's mapping of the
  // pool (shm:/file: with HugePages on a tmpfs or hugetlbfs that gives them;
  // checked when the pages were faulted in).
  bool huge_pages() const;

  // A fresh copy of the superblock (invalidated and re-read: rule 4).  If
  // the fresh copy fails validation (an update in flight, or damage), the
  // error is logged and the last valid copy is returned.
  cxlkv_superblock superblock() const;
  // The same, or the validation error of the fresh copy.
  Result<cxlkv_superblock> read_superblock() const;
  uint32_t max_nodes() const;

  // Carves (2 MiB aligned).  Names: 1..31 chars of [a-z0-9_.-].
  // create: size rounded up to 2 MiB; placed first-fit after the superblock.
  // Errors: -EINVAL bad name/size/memtype/flags, -EEXIST name taken,
  // -ENOSPC no room or table full.
  Result<CarveInfo> carve_create(std::string_view name, uint64_t size, MemType mt,
                                 uint32_t flags = 0);
  Result<CarveInfo> carve(std::string_view name) const;  // -ENOENT if absent
  std::vector<CarveInfo> carves() const;
  // System carves (CXLKV_CARVE_F_SYSTEM, made by format) need force (-EPERM).
  Result<void> carve_remove(std::string_view name, bool force = false);

  // Offset <-> pointer.  at() checks bounds in debug builds only.
  std::byte* at(uint64_t off) const {
    assert(off <= size_);
    return base_ + off;
  }
  template <class T>
  T* at(uint64_t off) const {
    assert(off <= size_ && sizeof(T) <= size_ - off);
    return reinterpret_cast<T*>(base_ + off);
  }
  uint64_t offset_of(const void* p) const {
    return static_cast<uint64_t>(static_cast<const std::byte*>(p) - base_);
  }
  bool contains(uint64_t off, uint64_t len) const { return off <= size_ && len <= size_ - off; }

  // OpenOptions::map_on_use: map [off, off + len) now if this process has
  // not yet (whole 2 MiB granules, one madvise per run of new ones), so
  // that the copy that follows takes no page fault per 4 KiB page.  A hint:
  // a range it cannot map is faulted in by the access as usual.  Thread
  // safe; nothing to do (and cheap) on a pool mapped whole at attach.
  void prepare(uint64_t off, uint64_t len) const;

 private:
  Region() = default;
  static Result<std::unique_ptr<Region>> attach(std::string uri, BackendKind kind,
                                                std::unique_ptr<region::Backend> be, const OpenOptions& opts);
  static Result<std::unique_ptr<Region>> validate_attached(std::unique_ptr<Region> r);
  static Result<std::unique_ptr<Region>> format_attached(std::unique_ptr<Region> r, const FormatOptions& fopts);
  // Writes `sb` (generation + 1, new checksum) with the publish protocol.
  void write_superblock(cxlkv_superblock& sb);
  Result<CarveInfo> carve_create_locked(std::string_view name, uint64_t size, MemType mt,
                                        uint32_t flags);
  Result<void> carve_remove_locked(std::string_view name, bool force);

  std::string uri_;
  BackendKind kind_ = BackendKind::shm;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::unique_ptr<region::Backend> backend_;
  std::unique_ptr<MemoryDomain> owned_domain_;  // null when OpenOptions::use_domain
  MemoryDomain* domain_ = nullptr;
  std::mutex mu_carves_;                  // one carve change at a time in this process
  uint32_t torn_read_patience_us_ = 5000;
  mutable std::mutex mu_;                 // last_good_
  mutable cxlkv_superblock last_good_{};  // last superblock that validated
  // map_on_use: one bit per 2 MiB granule this process has mapped (null:
  // the pool was mapped whole, or not by this process's page tables).
  std::unique_ptr<std::atomic<uint64_t>[]> mapped_;
};

// Typed pool pointer: an offset, never a virtual address (DESIGN: the pool).
// Offset 0 is the superblock, so it doubles as the null pointer.
template <class T>
struct PoolPtr {
  uint64_t off = 0;
  T* get(const Region& r) const { return off ? r.at<T>(off) : nullptr; }
  static PoolPtr of(const Region& r, const T* p) { return PoolPtr{p ? r.offset_of(p) : 0}; }
  explicit operator bool() const { return off != 0; }
  friend bool operator==(const PoolPtr&, const PoolPtr&) = default;
};
static_assert(sizeof(PoolPtr<int>) == 8, "PoolPtr is stored in the pool as a u64");

// Validate a superblock image of `avail` bytes belonging to a pool of
// `pool_size` bytes.  Returns an Error naming `pool` and the exact problem.
// Used by Region::open, the fuzz test and cxlkvctl.
Result<void> validate_superblock(std::string_view pool, const void* image, size_t avail,
                                 uint64_t pool_size);

}  // namespace cxlkv
