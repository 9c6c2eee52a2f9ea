// SPDX-License-Identifier: MIT
// Region: open / format a pool by URI, validate its superblock, manage carves.
//
// The superblock is metadata shared by every host that maps the pool.  It is
// written by one operator at a time (flock on this host; across hosts by
// operational rule) with the publish protocol of the coherence contract and
// read back with invalidate-then-load.  Each update is a complete image with
// generation + 1 and a fresh checksum, so a torn or damaged write is refused
// rather than half-applied.
#include "cxlkv/region.hpp"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstring>

#include "region/backend.hpp"
#include "region/superblock.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
// Region::prepare maps whole granules of this size (the carve alignment).
constexpr uint64_t kGranule = 2ull << 20;
}  // namespace

using region::human_size;

const char* to_string(BackendKind k) {
  switch (k) {
    case BackendKind::shm: return "shm";
    case BackendKind::file: return "file";
    case BackendKind::dax: return "dax";
    case BackendKind::dev: return "dev";
    case BackendKind::mem: return "mem";
  }
  return "?";
}

const char* to_string(MemType t) {
  switch (t) {
    case MemType::wb: return "wb";
    case MemType::wc: return "wc";
    case MemType::uc: return "uc";
  }
  return "?";
}

namespace {

// Domain for a freshly mapped pool: the caller's (tests: a NonCoherentSim
// node), or a host domain (make_host_domain throws on a forced instruction
// path the CPU lacks; that becomes this pool's error).
struct DomainHolder {
  std::unique_ptr<MemoryDomain> owned;
  MemoryDomain* d = nullptr;
};
Result<DomainHolder> make_domain(const std::string& uri, const OpenOptions& o) {
  DomainHolder h;
  if (o.use_domain) {
    h.d = o.use_domain;
    return h;
  }
  try {
    h.owned = make_host_domain(o.domain);
    h.d = h.owned.get();
    return h;
  } catch (const std::exception& e) {
    return Error(-EINVAL, "pool " + uri + ": memory domain: " + e.what());
  }
}

// rule 4: drop whatever this CPU cached of the superblock, fence, then load.
cxlkv_superblock load_fresh(MemoryDomain& d, const std::byte* base) {
  cxlkv_superblock sb;
  d.invalidate(base, sizeof sb);
  d.fence();
  d.load(&sb, base, sizeof sb);
  return sb;
}

CarveInfo to_info(const cxlkv_carve& c) {
  CarveInfo i;
  i.name = std::string(c.name, strnlen(c.name, sizeof c.name));
  i.offset = c.offset;
  i.size = c.size;
  i.memtype = static_cast<MemType>(c.memtype);
  i.flags = c.flags;
  return i;
}

Error already_formatted(const std::string& uri, const cxlkv_superblock& sb) {
  return Error(-EEXIST, "pool " + uri + ": already holds a valid cxlkv superblock (generation " +
                            std::to_string(sb.generation) + ", " + std::to_string(sb.ncarves) +
                            " carves); use force (cxlkvctl format --force) to overwrite it");
}

// -EEXIST if the device exists and holds a valid superblock for its size,
// whatever size the URI or the options name (`want`, 0: none): formatting at
// another size would truncate or grow the pool and destroy it just the same.
Result<void> refuse_valid_pool(const region::PoolUri& pu, uint64_t want, const OpenOptions& opts) {
  region::BackendOpenOptions probe;
  probe.any_size = true;
  auto be = region::open_backend(pu, probe);
  if (!be) {
    // Files that may not be opened (a symbolic link, another user's file)
    // must not be created over either: say why now.
    int c = be.error().code();
    if (c == -ELOOP || c == -EPERM || c == -EACCES) return be.error();
    return {};
  }
  uint64_t have = be.value()->size();
  if (have < sizeof(cxlkv_superblock)) return {};  // nothing valid there
  auto base = be.value()->map();
  if (!base) return base.error();
  auto domain = make_domain(pu.uri, opts);
  if (!domain) return domain.error();
  cxlkv_superblock sb = load_fresh(*domain->d, base.value());
  if (!validate_superblock(pu.uri, &sb, sizeof sb, have).ok()) return {};
  if (want && want != have)
    return Error(-EEXIST, "pool " + pu.uri + ": " + pu.path + " holds a valid cxlkv pool of " + human_size(have) +
                              " (" + std::to_string(have) + " bytes, generation " + std::to_string(sb.generation) +
                              "); formatting it as " + human_size(want) + " (" + std::to_string(want) +
                              " bytes) would destroy it; use force (cxlkvctl format --force) to reformat it "
                              "at the new size");
  return already_formatted(pu.uri, sb);
}

struct MetadataLock {
  region::Backend& b;
  explicit MetadataLock(region::Backend& be) : b(be) {}
  ~MetadataLock() { b.unlock_metadata(); }
};

}  // namespace

Region::~Region() {
  owned_domain_.reset();
  if (backend_) backend_->unmap();
}

Result<std::unique_ptr<Region>> Region::attach(std::string uri, BackendKind kind,
                                               std::unique_ptr<region::Backend> be,
                                               const OpenOptions& opts) {
  auto base = be->map();
  if (!base) return base.error();
  auto domain = make_domain(uri, opts);
  if (!domain) return domain.error();
  std::unique_ptr<Region> r(new Region());
  r->uri_ = std::move(uri);
  r->kind_ = kind;
  r->base_ = base.value();
  r->size_ = be->size();
  r->backend_ = std::move(be);
  r->owned_domain_ = std::move(domain->owned);
  r->domain_ = domain->d;
  r->torn_read_patience_us_ = opts.torn_read_patience_us;
  if (r->backend_->maps_on_use()) {
    const uint64_t words = (r->size_ / kGranule + 63) / 64 + 1;
    r->mapped_.reset(new std::atomic<uint64_t>[words]);
    for (uint64_t i = 0; i < words; i++) r->mapped_[i].store(0, std::memory_order_relaxed);
  }
  return r;
}

void Region::prepare(uint64_t off, uint64_t len) const {
  if (!mapped_ || len == 0 || off >= size_) return;
  len = std::min(len, size_ - off);
  const uint64_t first = off / kGranule, last = (off + len - 1) / kGranule;
  auto is_mapped = [&](uint64_t g) {
    return (mapped_[g / 64].load(std::memory_order_relaxed) >> (g % 64)) & 1;
  };
  // Runs of granules not mapped yet: one madvise each.  Two threads may map
  // the same granule at once; mapping is idempotent.
  for (uint64_t g = first; g <= last;) {
    if (is_mapped(g)) {
      g++;
      continue;
    }
    uint64_t end = g + 1;
    while (end <= last && !is_mapped(end)) end++;
    if (backend_->map_range(g * kGranule, (end - g) * kGranule))
      for (uint64_t k = g; k < end; k++) mapped_[k / 64].fetch_or(1ull << (k % 64), std::memory_order_relaxed);
    g = end;
  }
}

Result<std::unique_ptr<Region>> Region::validate_attached(std::unique_ptr<Region> r) {
  // A device smaller than a superblock is validated from the bytes it has.
  if (r->size_ < sizeof(cxlkv_superblock)) {
    std::vector<std::byte> img(r->size_);
    r->domain_->invalidate(r->base_, r->size_);
    r->domain_->fence();
    r->domain_->load(img.data(), r->base_, r->size_);
    auto v = validate_superblock(r->uri_, img.data(), img.size(), r->size_);
    log().warn("{}", v.error().message());
    return v.error();
  }
  auto sb = r->read_superblock();
  if (!sb) return sb.error();  // read_superblock logged it
  log().info("pool {}: opened ({}, {} bytes, generation {}, {} carves, domain {})", r->uri_,
             to_string(r->kind_), r->size_, sb->generation, sb->ncarves, r->domain_->describe());
  return r;
}

Result<std::unique_ptr<Region>> Region::open(std::string_view uri, const OpenOptions& opts) {
  auto pu = region::parse_pool_uri(uri);
  if (!pu) return pu.error();
  auto be = region::open_backend(pu.value(), region::attach_options(opts));
  if (!be) return be.error();
  auto r = attach(pu->uri, pu->kind, std::move(be).value(), opts);
  if (!r) return r;
  return validate_attached(std::move(r).value());
}

Result<std::unique_ptr<Region>> Region::open_memory(std::string_view name, void* base, uint64_t size,
                                                    const OpenOptions& opts) {
  std::string uri = "mem:" + std::string(name);
  auto r = attach(uri, BackendKind::mem, region::make_memory_backend(uri, base, size), opts);
  if (!r) return r;
  return validate_attached(std::move(r).value());
}

Result<std::unique_ptr<Region>> Region::format_memory(std::string_view name, void* base, uint64_t size,
                                                      const FormatOptions& fopts, const OpenOptions& opts) {
  std::string uri = "mem:" + std::string(name);
  if (fopts.size && fopts.size != size)
    return Error(-EINVAL, "pool " + uri + ": a mem: pool has the size of its memory; do not give another");
  auto r = attach(uri, BackendKind::mem, region::make_memory_backend(uri, base, size), opts);
  if (!r) return r;
  return format_attached(std::move(r).value(), fopts);
}

namespace {
Result<void> check_format_size(const std::string& uri, uint64_t s) {
  if (s % CXLKV_CARVE_ALIGN != 0 || s < CXLKV_MIN_POOL_SIZE)
    return Error(-EINVAL, "pool " + uri + ": size " + std::to_string(s) +
                              " is not a multiple of 2 MiB of at least " + human_size(CXLKV_MIN_POOL_SIZE));
  return {};
}
Result<void> check_max_nodes(const std::string& uri, uint32_t n) {
  if (n < 1 || n > CXLKV_MAX_NODES)
    return Error(-EINVAL, "pool " + uri + ": max_nodes " + std::to_string(n) + " out of range 1.." +
                              std::to_string(CXLKV_MAX_NODES));
  return {};
}
}  // namespace

Result<std::unique_ptr<Region>> Region::format(std::string_view uri, const FormatOptions& fopts,
                                               const OpenOptions& opts) {
  auto pu = region::parse_pool_uri(uri);
  if (!pu) return pu.error();
  CXLKV_TRY(check_max_nodes(pu->uri, fopts.max_nodes));
  uint64_t want = fopts.size ? fopts.size : pu->size;
  if (want) CXLKV_TRY(check_format_size(pu->uri, want));
  bool resizable = pu->kind == BackendKind::shm || pu->kind == BackendKind::file;
  if (want && !resizable)
    return Error(-EINVAL, "pool " + pu->uri + ": a " + std::string(to_string(pu->kind)) +
                              ": pool has the device's size; do not give one");

  // A new shm:/file: pool needs a size; find out before creating an empty file.
  if (resizable && want == 0) {
    auto probe = region::open_backend(pu.value(), {});
    if (!probe && probe.error().code() == -ENOENT) return region::needs_size_error(pu.value());
  }

  // Look before touching anything: creating or resizing the device below
  // must not happen to a valid pool that is not meant to be overwritten.
  if (!fopts.force) CXLKV_TRY(refuse_valid_pool(pu.value(), want, opts));

  region::BackendOpenOptions bo = region::attach_options(opts);
  bo.create = resizable;
  bo.size = want;
  auto be = region::open_backend(pu.value(), bo);
  if (!be) return be.error();
  auto r = attach(pu->uri, pu->kind, std::move(be).value(), opts);
  if (!r) return r;
  return format_attached(std::move(r).value(), fopts);
}

Result<std::unique_ptr<Region>> Region::format_attached(std::unique_ptr<Region> r, const FormatOptions& fopts) {
  const std::string P = "pool " + r->uri_ + ": ";
  CXLKV_TRY(check_max_nodes(r->uri_, fopts.max_nodes));
  CXLKV_TRY(check_format_size(r->uri_, r->size_));
  CXLKV_TRY(r->backend_->lock_metadata());
  MetadataLock unlock(*r->backend_);

  if (r->backend_->device_owns_carves()) {
    // The device writes the superblock (and refuses what the path below
    // refuses: a valid pool without force).
    CXLKV_TRY(r->backend_->device_format(fopts.max_nodes, fopts.force));
    auto sb = r->read_superblock();
    if (!sb) return sb.error();
    log().info("pool {}: formatted by the device ({} bytes, max_nodes {}, generation {})", r->uri_,
               r->size_, sb->max_nodes, sb->generation);
    return r;
  }

  // Checked (again, for URI pools) under the metadata lock: another process
  // of this host may have formatted the pool since refuse_valid_pool() looked.
  cxlkv_superblock old = load_fresh(*r->domain_, r->base_);
  if (!fopts.force && validate_superblock(r->uri_, &old, sizeof old, r->size_).ok())
    return already_formatted(r->uri_, old);

  cxlkv_superblock sb{};
  sb.magic = CXLKV_SB_MAGIC;
  sb.layout_version = CXLKV_LAYOUT_VERSION;
  sb.sb_size = CXLKV_SB_SIZE;
  sb.pool_size = r->size_;
  sb.max_nodes = fopts.max_nodes;
  sb.ncarves = 0;
  if (getrandom(sb.pool_id, sizeof sb.pool_id, 0) != sizeof sb.pool_id)
    return Error(-EIO, P + "getrandom for the pool id failed: " + std::strerror(errno));
  sb.format_time_ns = realtime_ns();
  // Keep counting across reformats so that a cached copy never looks current.
  sb.generation = old.magic == CXLKV_SB_MAGIC ? old.generation : 0;

  r->write_superblock(sb);
  r->last_good_ = sb;
  log().info("pool {}: formatted ({} bytes, max_nodes {}, generation {})", r->uri_, r->size_, sb.max_nodes,
             sb.generation);
  return r;
}

void Region::write_superblock(cxlkv_superblock& sb) {
  sb.generation += 1;
  region::seal_superblock(sb);
  // rule 3: the superblock is metadata.  Plain stores of the whole image,
  // then clflush of every one of its 64 lines so the image is in memory
  // (not only in this CPU's cache), then a fence so that nothing this
  // process does afterwards (e.g. using a new carve) overtakes it.
  domain_->store(base_, &sb, sizeof sb);
  domain_->flush(base_, sizeof sb);
  domain_->fence();
}

Result<cxlkv_superblock> Region::read_superblock() const {
  cxlkv_superblock sb = load_fresh(*domain_, base_);
  // A checksum mismatch on an otherwise plausible image is most likely an
  // update in flight (another process or host is storing the 4 KiB image
  // right now): re-read for a moment before calling the pool damaged.
  // Re-read every 50 us: a writer stores the 4 KiB image in microseconds;
  // the patience (default 5 ms) covers a writer descheduled midway.
  auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(torn_read_patience_us_);
  while (sb.magic == CXLKV_SB_MAGIC && cxlkv_sb_checksum(&sb) != sb.checksum &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    sb = load_fresh(*domain_, base_);
  }
  auto v = validate_superblock(uri_, &sb, sizeof sb, size_);
  if (!v) {
    log().warn("{}", v.error().message());
    return v.error();
  }
  if (backend_) backend_->carves_seen(sb);
  std::lock_guard<std::mutex> g(mu_);
  if (sb.generation >= last_good_.generation) last_good_ = sb;
  return sb;
}

cxlkv_superblock Region::superblock() const {
  auto sb = read_superblock();
  if (sb) return sb.value();
  std::lock_guard<std::mutex> g(mu_);
  return last_good_;
}

uint32_t Region::max_nodes() const { return superblock().max_nodes; }

bool Region::huge_pages() const { return backend_ && backend_->huge_pages_in_effect(); }

Result<CarveInfo> Region::carve(std::string_view name) const {
  cxlkv_superblock sb = superblock();
  for (uint32_t i = 0; i < sb.ncarves; i++)
    if (name == std::string_view(sb.carves[i].name, strnlen(sb.carves[i].name, CXLKV_CARVE_NAME_MAX)))
      return to_info(sb.carves[i]);
  return Error(-ENOENT, "pool " + uri_ + ": no carve named '" + std::string(name) + "'");
}

std::vector<CarveInfo> Region::carves() const {
  cxlkv_superblock sb = superblock();
  std::vector<CarveInfo> v;
  for (uint32_t i = 0; i < sb.ncarves; i++) v.push_back(to_info(sb.carves[i]));
  return v;
}

Result<CarveInfo> Region::carve_create(std::string_view name, uint64_t size, MemType mt,
                                       uint32_t flags) {
  const std::string C = "pool " + uri_ + ": carve '" + std::string(name) + "': ";
  if (!region::valid_carve_name(name))
    return Error(-EINVAL, C + "invalid name (names are " + region::carve_name_rule() + ")");
  if (size == 0) return Error(-EINVAL, C + "size is zero");
  if (static_cast<uint32_t>(mt) > CXLKV_MEM_MAX)
    return Error(-EINVAL, C + "unknown memory type " + std::to_string(static_cast<uint32_t>(mt)));
  if (flags & ~CXLKV_CARVE_F_ALL) return Error(-EINVAL, C + "unknown flags " + std::to_string(flags));
  if (size > size_) return Error(-ENOSPC, C + "size " + std::to_string(size) + " exceeds the pool");
  std::lock_guard<std::mutex> g(mu_carves_);
  CXLKV_TRY(backend_->lock_metadata());
  MetadataLock unlock(*backend_);
  return carve_create_locked(name, size, mt, flags);
}

Result<CarveInfo> Region::carve_create_locked(std::string_view name, uint64_t size, MemType mt,
                                              uint32_t flags) {
  const std::string C = "pool " + uri_ + ": carve '" + std::string(name) + "': ";
  if (backend_->device_owns_carves()) {
    cxlkv_carve want{};
    std::memcpy(want.name, name.data(), name.size());
    want.size = size;
    want.memtype = static_cast<uint32_t>(mt);
    want.flags = flags;
    auto c = backend_->device_carve_create(want);
    if (!c) return c.error();
    (void)read_superblock();  // maps the new carve (carves_seen)
    return to_info(c.value());
  }
  auto cur = read_superblock();
  if (!cur) return Error(cur.error().code(), cur.error().message() + " (carve '" + std::string(name) +
                                                 "' not created)");
  cxlkv_superblock sb = cur.value();
  uint64_t need = (size + CXLKV_CARVE_ALIGN - 1) / CXLKV_CARVE_ALIGN * CXLKV_CARVE_ALIGN;
  for (uint32_t i = 0; i < sb.ncarves; i++)
    if (name == sb.carves[i].name) return Error(-EEXIST, C + "already exists");
  if (sb.ncarves >= CXLKV_MAX_CARVES)
    return Error(-ENOSPC, C + "carve table full (" + std::to_string(CXLKV_MAX_CARVES) + " carves)");

  // First fit: the gaps are before carve 0, between neighbours, after the last.
  uint32_t at = sb.ncarves;
  uint64_t off = 0, largest = 0, cursor = CXLKV_FIRST_CARVE_OFF;
  bool found = false;
  for (uint32_t i = 0; i <= sb.ncarves && !found; i++) {
    uint64_t gap_end = i < sb.ncarves ? sb.carves[i].offset : sb.pool_size;
    uint64_t gap = gap_end > cursor ? gap_end - cursor : 0;
    if (gap >= need) {
      found = true;
      at = i;
      off = cursor;
    }
    largest = std::max(largest, gap);
    if (i < sb.ncarves) cursor = sb.carves[i].offset + sb.carves[i].size;
  }
  if (!found)
    return Error(-ENOSPC, C + "no free range of " + human_size(need) + " (largest free range: " +
                              human_size(largest) + ")");

  cxlkv_carve c{};
  std::memcpy(c.name, name.data(), name.size());
  c.offset = off;
  c.size = need;
  c.memtype = static_cast<uint32_t>(mt);
  c.flags = flags;
  std::memmove(&sb.carves[at + 1], &sb.carves[at], (sb.ncarves - at) * sizeof(cxlkv_carve));
  sb.carves[at] = c;
  sb.ncarves++;
  CXLKV_TRY(backend_->carve_added(c));
  write_superblock(sb);
  {
    std::lock_guard<std::mutex> g(mu_);
    last_good_ = sb;
  }
  log().info("pool {}: carve '{}' created at {:#x}, {} ({}, flags {:#x})", uri_, c.name, c.offset,
             human_size(c.size), to_string(mt), c.flags);
  return to_info(c);
}

Result<void> Region::carve_remove(std::string_view name, bool force) {
  std::lock_guard<std::mutex> g(mu_carves_);
  CXLKV_TRY(backend_->lock_metadata());
  MetadataLock unlock(*backend_);
  return carve_remove_locked(name, force);
}

Result<void> Region::carve_remove_locked(std::string_view name, bool force) {
  const std::string C = "pool " + uri_ + ": carve '" + std::string(name) + "': ";
  if (backend_->device_owns_carves()) {
    CXLKV_TRY(backend_->device_carve_remove(name, force));
    (void)read_superblock();
    return {};
  }
  auto cur = read_superblock();
  if (!cur) return Error(cur.error().code(), cur.error().message() + " (carve '" + std::string(name) +
                                                 "' not removed)");
  cxlkv_superblock sb = cur.value();
  uint32_t i = 0;
  while (i < sb.ncarves && name != std::string_view(sb.carves[i].name, strnlen(sb.carves[i].name, CXLKV_CARVE_NAME_MAX)))
    i++;
  if (i == sb.ncarves) return Error(-ENOENT, C + "no such carve");
  cxlkv_carve c = sb.carves[i];
  if ((c.flags & CXLKV_CARVE_F_SYSTEM) && !force)
    return Error(-EPERM, C + "is a system carve (made by format); removing it needs force (--force)");
  CXLKV_TRY(backend_->carve_removed(c));
  std::memmove(&sb.carves[i], &sb.carves[i + 1], (sb.ncarves - i - 1) * sizeof(cxlkv_carve));
  sb.ncarves--;
  std::memset(&sb.carves[sb.ncarves], 0, sizeof(cxlkv_carve));
  write_superblock(sb);
  {
    std::lock_guard<std::mutex> g(mu_);
    last_good_ = sb;
  }
  log().info("pool {}: carve '{}' removed (was at {:#x}, {})", uri_, c.name, c.offset, human_size(c.size));
  return {};
}

}  // namespace cxlkv
