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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv.h"

namespace cxlkv {

enum class BackendKind { shm, file, dax, dev };
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

struct OpenOptions {
  // Domain used for pool accesses; DomainMode::flush unless told otherwise
  // (coherent for tests on one host if explicitly asked).
  HostDomainOptions domain{};
};

struct FormatOptions {
  uint64_t size = 0;        // shm:/file: create or resize to this size (shm: taken from the URI)
  uint32_t max_nodes = 16;  // 1 .. CXLKV_MAX_NODES
  bool force = false;       // overwrite a pool that already holds a valid superblock
};

class Region {
 public:
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Open an existing, formatted pool.
  static Result<std::unique_ptr<Region>> open(std::string_view uri, const OpenOptions& opts = {});
  // Write a fresh superblock (no carves) and return the opened pool.
  static Result<std::unique_ptr<Region>> format(std::string_view uri, const FormatOptions& fopts,
                                                const OpenOptions& opts = {});

  const std::string& uri() const { return uri_; }
  BackendKind kind() const { return kind_; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  MemoryDomain& domain() const { return *domain_; }

  // A fresh copy of the superblock (invalidated and re-read: rule 4).
  cxlkv_superblock superblock() const;
  uint32_t max_nodes() const;

  // Carves (2 MiB aligned).  Names: 1..31 chars of [a-z0-9_.-].
  // create: size rounded up to 2 MiB; placed first-fit after the superblock.
  virtual Result<CarveInfo> carve_create(std::string_view name, uint64_t size, MemType mt,
                                         uint32_t flags = 0);
  Result<CarveInfo> carve(std::string_view name) const;
  std::vector<CarveInfo> carves() const;
  virtual Result<void> carve_remove(std::string_view name);

  // Offset <-> pointer.  at() checks bounds in debug builds only.
  std::byte* at(uint64_t off) const { return base_ + off; }
  template <class T>
  T* at(uint64_t off) const { return reinterpret_cast<T*>(base_ + off); }
  uint64_t offset_of(const void* p) const {
    return static_cast<uint64_t>(static_cast<const std::byte*>(p) - base_);
  }
  bool contains(uint64_t off, uint64_t len) const { return off <= size_ && len <= size_ - off; }

 protected:
  Region() = default;
  std::string uri_;
  BackendKind kind_ = BackendKind::shm;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::unique_ptr<MemoryDomain> domain_;
};

// Typed pool pointer: an offset, never a virtual address (DESIGN: the pool).
template <class T>
struct PoolPtr {
  uint64_t off = 0;
  T* get(const Region& r) const { return r.at<T>(off); }
  explicit operator bool() const { return off != 0; }
};

// Validate a superblock image of `avail` bytes belonging to a pool of
// `pool_size` bytes.  Returns an Error naming `pool` and the exact problem.
// Used by Region::open, the fuzz test and cxlkvctl.
Result<void> validate_superblock(std::string_view pool, const void* image, size_t avail,
                                 uint64_t pool_size);

}  // namespace cxlkv
