// SPDX-License-Identifier: MIT
// Pool backends: how a pool URI becomes a shared mapping.  Region (region.cpp)
// owns the superblock and carve logic; a backend only knows its device:
// how big it is, how it must be mapped, and (for the kernel module) how
// carve memory types are enforced.
//
// One file per backend: shm_backend.cpp, file_backend.cpp, dax_backend.cpp,
// dev_backend.cpp (the kernel module's; owned by the kmod area).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"

namespace cxlkv::region {

// A parsed pool URI.  `uri` is the text as given, used in every message.
struct PoolUri {
  std::string uri;
  BackendKind kind = BackendKind::shm;
  std::string path;   // shm: /dev/shm/NAME; file:, dax:, dev: the path
  uint64_t size = 0;  // shm: the SIZE part (0 when omitted)
};

// Parse "shm:NAME[:SIZE]", "file:PATH", "dax:/dev/daxX.Y", "dev:/dev/cxlkvN".
// Errors (-EINVAL) say what is wrong with the text.
Result<PoolUri> parse_pool_uri(std::string_view uri);

struct BackendOpenOptions {
  // Create the device if missing / resize it to `size` (shm:, file: only;
  // used by Region::format).  0 keeps the existing size.  A created or
  // resized file is allocated up front when mapped (fd_backend.cpp).
  bool create = false;
  uint64_t size = 0;
  // shm: open the device whatever size the URI names (format's look at an
  // existing pool, which must see a valid pool of another size).
  bool any_size = false;
  // Mapping (shm:, file:): fault every page in at map(), and huge pages;
  // see OpenOptions.  Probes that only read the superblock leave them off.
  bool prefault = false;
  // With prefault: an existing device is not faulted in at map(); map_range()
  // maps parts of it on demand (OpenOptions::map_on_use).  Format ignores it.
  bool map_on_use = false;
  HugePages huge_pages = HugePages::off;
};

// OpenOptions (and the CXLKV_PREFAULT / CXLKV_HUGE_PAGES environment) as
// backend options for a mapping that is kept (attach, format).
BackendOpenOptions attach_options(const OpenOptions& o);

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const PoolUri& uri() const { return uri_; }
  // Bytes the device holds (what map() maps).
  virtual uint64_t size() const = 0;
  // Required alignment of the mapping's virtual address (device-dax: the
  // device's align, e.g. 2 MiB; others: the page size).
  virtual uint64_t map_alignment() const { return 4096; }
  // Map the whole device shared, read/write.  One mapping per backend.
  virtual Result<std::byte*> map() = 0;
  virtual void unmap() = 0;
  // map_on_use: whether map() left the pages to map_range(), and mapping
  // [off, off + len) of the mapping now (page-aligned; a hint: false when
  // the kernel refused, the access then faults as usual).
  virtual bool maps_on_use() const { return false; }
  virtual bool map_range(uint64_t /*off*/, uint64_t /*len*/) { return true; }
  // After map(): whether 2 MiB (or larger) pages back the mapping.
  virtual bool huge_pages_in_effect() const { return false; }

  // Serialize superblock updates between processes of this host (flock on
  // the device file where there is one); unlock_metadata() releases it.
  // Hosts sharing one pool must still have a single operator at a time.
  virtual Result<void> lock_metadata() { return {}; }
  virtual void unlock_metadata() {}

  // Memory-type hook: called after a carve was created (or its memtype set)
  // and before its removal is published.  The kernel module enforces the
  // carve's memtype for user mappings; file-like backends have nothing to do.
  virtual Result<void> carve_added(const cxlkv_carve& /*carve*/) { return {}; }
  virtual Result<void> carve_removed(const cxlkv_carve& /*carve*/) { return {}; }

  // Pools whose device owns the carve table (the kernel module, dev:): the
  // superblock is mapped read-only, so Region sends format and carve changes
  // to the device instead of writing the superblock, and shows the backend
  // every carve table it reads so that carves made since (here or on another
  // host) get mapped.  Other backends: Region writes the superblock itself.
  virtual bool device_owns_carves() const { return false; }
  virtual Result<void> device_format(uint32_t /*max_nodes*/, bool /*force*/) { return {}; }
  // `want`: name, size, memtype, flags; returns the entry as placed.
  virtual Result<cxlkv_carve> device_carve_create(const cxlkv_carve& want) { return want; }
  virtual Result<void> device_carve_remove(std::string_view /*name*/, bool /*force*/) { return {}; }
  virtual void carves_seen(const cxlkv_superblock& /*sb*/) {}

 protected:
  explicit Backend(PoolUri uri) : uri_(std::move(uri)) {}
  PoolUri uri_;
};

// Factories, one per backend file.  Errors name the pool URI.
Result<std::unique_ptr<Backend>> open_shm_backend(const PoolUri& uri, const BackendOpenOptions& o);
Result<std::unique_ptr<Backend>> open_file_backend(const PoolUri& uri, const BackendOpenOptions& o);
Result<std::unique_ptr<Backend>> open_dax_backend(const PoolUri& uri, const BackendOpenOptions& o);
// Kernel module backend (dev:/dev/cxlkvN), implemented in dev_backend.cpp.
Result<std::unique_ptr<Backend>> open_dev_backend(const PoolUri& uri, const BackendOpenOptions& o);

// A pool in caller memory (Region::open_memory); no device, no flock.
std::unique_ptr<Backend> make_memory_backend(const std::string& uri, void* base, uint64_t size);

// "formatting a new pool needs a size" (-EINVAL), for format paths that
// find no device and were given no size.
Error needs_size_error(const PoolUri& uri);

// Dispatch on uri.kind.
Result<std::unique_ptr<Backend>> open_backend(const PoolUri& uri, const BackendOpenOptions& o);

}  // namespace cxlkv::region
