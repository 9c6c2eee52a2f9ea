// SPDX-License-Identifier: MIT
// The "pnm" carve: long contexts (page tables + digests) in the pool, laid
// out as cxlkv/format/pnm_format.h says, written and read under the coherence
// contract.  One writer per partition (flock), any number of readers.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"
#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"
#include "cxlkv/format/pnm_format.h"
#include "util/safe_file.hpp"

namespace cxlkv::pnm {

namespace testing {
Faults& faults() {
  static Faults f;
  return f;
}
}  // namespace testing

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::f32: return "f32";
    case Dtype::bf16: return "bf16";
    case Dtype::f16: return "f16";
  }
  return "unknown";
}

size_t dtype_size(Dtype d) { return cxlkv_pnm_dtype_size(static_cast<uint32_t>(d)); }

const char* to_string(DigestKind k) {
  switch (k) {
    case DigestKind::minmax: return "minmax";
    case DigestKind::q8: return "q8";
  }
  return "unknown";
}

uint32_t effective_group_pages(const Geometry& g) {
  if (g.group_pages == 1) return 0;
  if (g.group_pages) return g.group_pages;
  if (g.page_tokens == 0) return 0;
  const uint64_t pages = (g.max_tokens + g.page_tokens - 1) / g.page_tokens;
  return pages >= kAutoGroupMinPages ? kAutoGroupPages : 0;
}

namespace {

// The layout fields of a descriptor for geometry g with its group size
// settled (group_pages: 0 one level): one mapping for create() and for
// digest_area_bytes().
cxlkv_pnm_ctx layout_of(const Geometry& g, uint32_t group_pages) {
  cxlkv_pnm_ctx c{};
  c.layers = static_cast<uint16_t>(g.layers);
  c.kv_heads = static_cast<uint16_t>(g.kv_heads);
  c.head_dim = static_cast<uint16_t>(g.head_dim);
  c.page_tokens = static_cast<uint16_t>(g.page_tokens);
  c.dtype = static_cast<uint32_t>(g.dtype);
  c.max_pages = g.page_tokens ? static_cast<uint32_t>((g.max_tokens + g.page_tokens - 1) / g.page_tokens) : 0;
  c.page_bytes = cxlkv_pnm_page_bytes(&c);
  c.digest = static_cast<uint8_t>(g.digest);
  c.group_log2 = group_pages ? static_cast<uint8_t>(__builtin_ctz(group_pages)) : 0;
  return c;
}

}  // namespace

uint64_t digest_area_bytes(const Geometry& g) {
  const cxlkv_pnm_ctx c = layout_of(g, effective_group_pages(g));
  return cxlkv_pnm_digest_area_bytes(&c);
}

namespace {

constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t since_ns(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// The node-local lock file that makes a process the one writer of a partition.
std::string lock_path(const Region& r, uint32_t part) {
  std::string name;
  for (char c : r.uri()) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return "/dev/shm/cxlkv-pnm-" + name + "-p" + std::to_string(part) + ".lock";
}

// Why options cannot make a new carve ("" when they can): the sizes
// ContextStore::open would lay out, checked before the carve exists.
std::string check_new_carve(const StoreOptions& o) {
  if (o.partitions == 0 || o.slots_per_partition == 0) return "partitions and slots_per_partition must be > 0";
  const uint64_t bytes = align_up(o.carve_bytes, CXLKV_CARVE_ALIGN);  // what carve_create makes
  const uint64_t parts_off = align_up(kAlign + uint64_t(o.partitions) * sizeof(cxlkv_pnm_part_stats), kAlign);
  const uint64_t part_bytes = bytes > parts_off ? (bytes - parts_off) / o.partitions / kAlign * kAlign : 0;
  const uint64_t min_part = kAlign + uint64_t(o.slots_per_partition) * CXLKV_PNM_SLOT_SIZE + kAlign;
  if (o.carve_bytes == 0 || part_bytes < min_part)
    return "carve of " + std::to_string(o.carve_bytes) + " bytes is too small for " + std::to_string(o.partitions) +
           " partitions of " + std::to_string(o.slots_per_partition) + " slots";
  return "";
}

}  // namespace

// ---- ContextStore --------------------------------------------------------------

ContextStore::~ContextStore() {
  if (lock_fd_ >= 0) {
    ::unlink(lock_path_.c_str());  // while still held: a later writer makes a fresh file
    ::close(lock_fd_);             // drops the flock
  }
}

Result<std::unique_ptr<ContextStore>> ContextStore::open(Region& region, const StoreOptions& o) {
  const std::string C = "pool " + region.uri() + ": pnm carve: ";
  auto st = std::unique_ptr<ContextStore>(new ContextStore());
  st->region_ = &region;
  st->opts_ = o;
  MemoryDomain& d = region.domain();

  auto carve = region.carve(CXLKV_CARVE_PNM);
  bool made = false;
  if (!carve.ok()) {
    if (carve.error().code() != -ENOENT) return carve.error();
    // Options first, the carve after: a carve made and then refused would
    // stay without a header, and every later open would wait for its magic
    // and fail (cxlkv/format/pnm_format.h: the header is written once, by its maker).
    if (auto bad = check_new_carve(o); !bad.empty()) return Error(-EINVAL, C + bad);
    auto c = region.carve_create(CXLKV_CARVE_PNM, o.carve_bytes, MemType::wb);
    if (c.ok()) {
      made = true;
      carve = c;
    } else if (c.error().code() == -EEXIST) {
      carve = region.carve(CXLKV_CARVE_PNM);  // another process made it first
      if (!carve.ok()) return carve.error();
    } else if (c.error().code() == -ENOSPC) {
      return Error(-ENOSPC, c.error().message() +
                                " (the pnm carve needs free pool space: format the pool without the standard "
                                "carves, or with room beside them)");
    } else {
      return c.error();
    }
  }
  st->carve_off_ = carve->offset;
  st->carve_size_ = carve->size;
  auto* hdr = region.at<cxlkv_pnm_header>(st->carve_off_);
  // A carve this call made but could not give a header is removed again,
  // for the same reason as above.
  struct RemoveUnpublished {
    Region& r;
    bool armed;
    ~RemoveUnpublished() {
      if (armed) (void)r.carve_remove(CXLKV_CARVE_PNM);
    }
  } unpublished{region, made};

  if (made) {
    cxlkv_pnm_header h{};
    h.version = CXLKV_PNM_VERSION;
    h.nparts = o.partitions;
    h.slots_per_part = o.slots_per_partition;
    // Per-partition statistics right after the header, partitions after them.
    h.stats_off = kAlign;
    h.parts_off = align_up(kAlign + uint64_t(o.partitions) * sizeof(cxlkv_pnm_part_stats), kAlign);
    h.part_bytes = carve->size > h.parts_off ? (carve->size - h.parts_off) / o.partitions / kAlign * kAlign : 0;
    const uint64_t min_part = kAlign + uint64_t(o.slots_per_partition) * CXLKV_PNM_SLOT_SIZE + kAlign;
    if (h.part_bytes < min_part)
      return Error(-EINVAL, C + "carve of " + std::to_string(carve->size) + " bytes is too small for " +
                                std::to_string(o.partitions) + " partitions of " +
                                std::to_string(o.slots_per_partition) + " slots");
    // Partition headers and empty slots first (a fresh carve reads as zeros,
    // but a carve re-made over old bytes does not), then the header.
    for (uint32_t p = 0; p < o.partitions; p++) {
      const uint64_t po = st->carve_off_ + h.parts_off + uint64_t(p) * h.part_bytes;
      cxlkv_pnm_part part{};
      part.heap_next = kAlign + uint64_t(o.slots_per_partition) * CXLKV_PNM_SLOT_SIZE;
      part.heap_end = h.part_bytes;
      d.store_nt(region.at(po), &part, sizeof part);
      std::vector<unsigned char> zero(size_t(o.slots_per_partition) * CXLKV_PNM_SLOT_SIZE, 0);
      d.store_nt(region.at(po + kAlign), zero.data(), zero.size());
      const cxlkv_pnm_part_stats zs{};
      d.store_nt(region.at(st->carve_off_ + h.stats_off + uint64_t(p) * sizeof zs), &zs, sizeof zs);
    }
    // Rule 3: partitions and slots in memory before the header's magic.
    d.fence();
    h.magic = CXLKV_PNM_MAGIC;
    h.checksum = cxlkv_pnm_header_checksum(&h);
    d.publish_line(hdr, &h);
    d.fence();  // rule 3: the header is visible before anyone is told the carve is ready
    unpublished.armed = false;
  }

  // Read the header fresh (rule 4); a carve just made by another process may
  // not have its magic yet: wait for it a little.
  cxlkv_pnm_header h{};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    h = d.read_fresh(hdr);
    if (h.magic == CXLKV_PNM_MAGIC && h.checksum == cxlkv_pnm_header_checksum(&h)) break;
    if (std::chrono::steady_clock::now() > until)
      return Error(-EIO, C + (h.magic == CXLKV_PNM_MAGIC ? "header checksum mismatch (stored " +
                                                               hex(h.checksum) + ", computed " +
                                                               hex(cxlkv_pnm_header_checksum(&h)) + ")"
                                                         : "not initialised (no magic) after 2 s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (h.version != CXLKV_PNM_VERSION)
    return Error(-EPROTO, C + "layout version " + std::to_string(h.version) + ", this library reads " +
                              std::to_string(CXLKV_PNM_VERSION) +
                              " (the contexts of another layout cannot be read: `cxlkvctl carve rm pnm` "
                              "removes the carve, the next store open makes a fresh one)");
  if (h.nparts == 0 || h.slots_per_part == 0 || h.parts_off % kAlign || h.part_bytes % kAlign ||
      h.parts_off + uint64_t(h.nparts) * h.part_bytes > st->carve_size_ ||
      kAlign + uint64_t(h.slots_per_part) * CXLKV_PNM_SLOT_SIZE > h.part_bytes)
    return Error(-EIO, C + "header geometry does not fit the carve (" + std::to_string(h.nparts) +
                           " partitions of " + std::to_string(h.part_bytes) + " bytes)");
  if (h.stats_off && (h.stats_off % kAlign || h.stats_off + uint64_t(h.nparts) * sizeof(cxlkv_pnm_part_stats) >
                                                   h.parts_off))
    return Error(-EIO, C + "header names statistics at " + std::to_string(h.stats_off) +
                           " that overlap the partitions at " + std::to_string(h.parts_off));
  st->stats_ = std::make_unique<cxlkv_pnm_part_stats>();
  st->nparts_ = h.nparts;
  st->slots_ = h.slots_per_part;
  st->parts_off_ = h.parts_off;
  st->part_bytes_ = h.part_bytes;

  if (o.writer) {
    if (o.partition >= st->nparts_)
      return Error(-EINVAL, C + "partition " + std::to_string(o.partition) + " out of range (carve has " +
                                std::to_string(st->nparts_) + ")");
    st->lock_path_ = lock_path(region, o.partition);
    const std::string& lp = st->lock_path_;
    // flock the node-local file; a file unlinked by the previous writer
    // between our open and our flock is not the lock any more: retry.  The
    // file lives in /dev/shm, where any user can plant a symbolic link or a
    // file of their own under its predictable name: it is opened the way
    // every node-local file is (util/safe_file.hpp: no link followed, created
    // exclusively, refused when another user owns it or others may write it).
    util::SafeOpenOptions so;
    so.what = C + "partition " + std::to_string(o.partition) + " writer lock file";
    so.create = true;
    so.mode = 0600;  // only this user's processes take the writer lock
    for (int tries = 0;; tries++) {
      auto sf = util::safe_open(lp, so);
      if (!sf) return sf.error();
      st->lock_fd_ = sf->fd;
      if (::flock(st->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::close(st->lock_fd_);
        st->lock_fd_ = -1;
        return Error(err == EWOULDBLOCK ? -EBUSY : -err,
                     C + "partition " + std::to_string(o.partition) +
                         " already has a writer process (lock file " + lp + ")");
      }
      // Still the file at the path (lstat: a link put there since is not)?
      struct stat b {};
      if (::lstat(lp.c_str(), &b) == 0 && sf->st.st_ino == b.st_ino && sf->st.st_dev == b.st_dev) break;
      ::close(st->lock_fd_);
      st->lock_fd_ = -1;
      if (tries > 100) return Error(-EAGAIN, C + "lock file " + lp + " keeps being replaced");
    }
    // Our own partition header: we are its only writer, but a previous
    // writer (maybe on another host) wrote it last: read it fresh (rule 4).
    auto part = d.read_fresh(region.at<cxlkv_pnm_part>(st->part_off(o.partition)));
    const uint64_t heap0 = kAlign + uint64_t(st->slots_) * CXLKV_PNM_SLOT_SIZE;
    if (part.heap_next < heap0 || part.heap_next > part.heap_end || part.heap_end > st->part_bytes_)
      return Error(-EIO, C + "partition " + std::to_string(o.partition) + " header damaged (heap " +
                             std::to_string(part.heap_next) + ".." + std::to_string(part.heap_end) + ")");
    st->heap_next_ = part.heap_next;
    st->heap_end_ = part.heap_end;
    st->live_ = part.live;
    if (h.stats_off) {
      // Totals continue from what the previous writer stored (rule 4: fresh).
      st->stats_off_ = st->carve_off_ + h.stats_off + uint64_t(o.partition) * sizeof(cxlkv_pnm_part_stats);
      const auto* sp = region.at<cxlkv_pnm_part_stats>(st->stats_off_);
      d.invalidate(sp, sizeof *sp);  // rule 4
      d.fence();
      d.load(st->stats_.get(), sp, sizeof *sp);
    }
  }
  return st;
}

uint64_t ContextStore::heap_free() const { return heap_end_ - heap_next_; }

// ---- statistics --------------------------------------------------------------

namespace {
// Bucket of the half-octave histograms: [2^(b/2), 2^((b+1)/2)) ns (cxlkv/format/pnm_format.h).
uint32_t lat_bucket(uint64_t ns) {
  if (ns < 1) ns = 1;
  const int b = static_cast<int>(std::floor(2.0 * std::log2(static_cast<double>(ns))));
  return static_cast<uint32_t>(std::clamp(b, 0, int(CXLKV_PNM_LAT_BUCKETS) - 1));
}
uint64_t ms_to_ns(double ms) { return ms > 0 ? static_cast<uint64_t>(ms * 1e6) : 0; }
}  // namespace

void ContextStore::store_stats_locked() {
  if (!stats_off_) return;
  stats_->updated_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  stats_->pid = static_cast<uint32_t>(::getpid());
  MemoryDomain& d = region_->domain();
  // Rule 2: this partition's writer is the lines' one writer; whole lines
  // with non-temporal stores, then a fence (rule 3: in memory for readers).
  if (testing::faults().skip_writer_flush) {
    d.store(region_->at(stats_off_), stats_.get(), sizeof(cxlkv_pnm_part_stats));  // left in this cache
  } else {
    d.store_nt(region_->at(stats_off_), stats_.get(), sizeof(cxlkv_pnm_part_stats));
  }
  d.fence();
}

void ContextStore::record_digest_build(uint64_t tokens, uint64_t digest_bytes, bool gpu, uint64_t ns) {
  std::lock_guard<std::mutex> g(stats_mu_);
  auto& c = stats_->counters;
  c[CXLKV_PNM_CTR_DIGEST_BUILDS]++;
  if (gpu) c[CXLKV_PNM_CTR_GPU_DIGEST_BUILDS]++;
  c[CXLKV_PNM_CTR_APPENDED_TOKENS] += tokens;
  c[CXLKV_PNM_CTR_DIGEST_WRITE_BYTES] += digest_bytes;
  stats_->latency[CXLKV_PNM_LAT_DIGEST_BUILD][lat_bucket(ns)]++;
  store_stats_locked();
}

void ContextStore::record_step(const StepResult& r, bool selected) {
  std::lock_guard<std::mutex> g(stats_mu_);
  auto& c = stats_->counters;
  if (!r.status.ok()) {
    c[CXLKV_PNM_CTR_STEP_ERRORS]++;
  } else {
    if (selected) {
      c[CXLKV_PNM_CTR_SELECT_STEPS]++;
      for (const auto& p : r.selection.pages) c[CXLKV_PNM_CTR_SELECTED_PAGES] += p.size();
      stats_->latency[CXLKV_PNM_LAT_SELECT][lat_bucket(ms_to_ns(r.select_ms))]++;
    }
    c[CXLKV_PNM_CTR_ATTEND_STEPS]++;
    stats_->latency[CXLKV_PNM_LAT_ATTEND][lat_bucket(ms_to_ns(r.attend_ms))]++;
    c[CXLKV_PNM_CTR_DIGEST_READ_BYTES] += r.digest_bytes;
    c[CXLKV_PNM_CTR_KV_READ_BYTES] += r.kv_bytes;
    c[CXLKV_PNM_CTR_LINK_BYTES] += r.link_bytes_near;
    c[CXLKV_PNM_CTR_LINK_SELECTED_BYTES] += r.link_bytes_selected;
    c[CXLKV_PNM_CTR_LINK_ALL_BYTES] += r.link_bytes_all;
  }
  store_stats_locked();
}

void ContextStore::record_hybrid_step(uint64_t recall_bytes) {
  std::lock_guard<std::mutex> g(stats_mu_);
  stats_->counters[CXLKV_PNM_CTR_HYBRID_STEPS]++;
  stats_->counters[CXLKV_PNM_CTR_HYBRID_RECALL_BYTES] += recall_bytes;
  store_stats_locked();
}

void ContextStore::stats(cxlkv_pnm_part_stats* out) const {
  std::lock_guard<std::mutex> g(stats_mu_);
  *out = *stats_;
}

Result<uint64_t> ContextStore::heap_alloc(uint64_t bytes) {
  bytes = align_up(bytes, kAlign);
  if (bytes > heap_end_ - heap_next_)
    // Every caller's message names the pool and the context first.
    return Error(-ENOSPC, "pnm partition " + std::to_string(opts_.partition) + " is full: " +
                              std::to_string(bytes) + " bytes asked, " + std::to_string(heap_end_ - heap_next_) +
                              " left");
  const uint64_t off = part_off(opts_.partition) + heap_next_;
  heap_next_ += bytes;
  return off;
}

Result<void> ContextStore::write_part() {
  cxlkv_pnm_part part{};
  part.heap_next = heap_next_;
  part.heap_end = heap_end_;
  part.live = live_;
  MemoryDomain& d = region_->domain();
  // One writer (this partition's), one line: NT store, then fence (rule 3).
  d.publish_line(region_->at(part_off(opts_.partition)), &part);
  d.fence();
  return {};
}

Result<std::unique_ptr<Context>> ContextStore::create(uint64_t request_id, const Geometry& given) {
  const std::string C = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id) + ": ";
  if (!opts_.writer) return Error(-EPERM, C + "store opened read-only");
  Geometry g = given;
  if (g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.page_tokens == 0 || g.max_tokens == 0 ||
      g.layers > 0xffff || g.kv_heads > 0xffff || g.head_dim > 0xffff || g.page_tokens > 0xffff ||
      static_cast<uint32_t>(g.dtype) > CXLKV_PNM_DTYPE_MAX)
    return Error(-EINVAL, C + "bad geometry (layers " + std::to_string(g.layers) + ", kv_heads " +
                              std::to_string(g.kv_heads) + ", head_dim " + std::to_string(g.head_dim) +
                              ", page_tokens " + std::to_string(g.page_tokens) + ", max_tokens " +
                              std::to_string(g.max_tokens) + ")");
  const uint64_t max_pages = (g.max_tokens + g.page_tokens - 1) / g.page_tokens;
  if (max_pages > 0xffffffffull) return Error(-EINVAL, C + "max_tokens too large");
  if (static_cast<uint32_t>(g.digest) > CXLKV_PNM_DIGEST_MAX)
    return Error(-EINVAL, C + "digest kind " + std::to_string(static_cast<uint32_t>(g.digest)) + " unknown");
  if (given.group_pages > 1 && ((given.group_pages & (given.group_pages - 1)) ||
                                given.group_pages > (1u << CXLKV_PNM_GROUP_LOG2_MAX)))
    return Error(-EINVAL, C + "group_pages " + std::to_string(given.group_pages) +
                              " (0: chosen, 1: one level, or a power of two 2.." +
                              std::to_string(1u << CXLKV_PNM_GROUP_LOG2_MAX) + ")");
  // The group size is settled here: the context's geometry says what it was
  // made with (docs/near-memory.md#digest-kinds).
  g.group_pages = effective_group_pages(given);
  MemoryDomain& d = region_->domain();

  int free_slot = -1;
  for (uint32_t s = 0; s < slots_; s++) {
    auto c = d.read_fresh(region_->at<cxlkv_pnm_ctx>(slot_off(opts_.partition, s)));
    if (c.state == CXLKV_PNM_LIVE && c.request_id == request_id)
      return Error(-EEXIST, C + "already exists in partition " + std::to_string(opts_.partition));
    if (c.state != CXLKV_PNM_LIVE && free_slot < 0) free_slot = static_cast<int>(s);
  }
  if (free_slot < 0)
    return Error(-ENOSPC, C + "partition " + std::to_string(opts_.partition) + " has no free slot (" +
                              std::to_string(slots_) + " in use)");

  cxlkv_pnm_ctx c = layout_of(g, g.group_pages);  // g.group_pages is settled above
  c.request_id = request_id;
  c.state = CXLKV_PNM_LIVE;
  const uint64_t saved_next = heap_next_;
  auto pt = heap_alloc(max_pages * 8);
  if (!pt.ok()) return Error(-ENOSPC, C + pt.error().message());
  auto dg = heap_alloc(cxlkv_pnm_digest_area_bytes(&c));
  if (!dg.ok()) {
    heap_next_ = saved_next;
    return Error(-ENOSPC, C + dg.error().message());
  }
  c.page_table_off = *pt;
  c.digest_off = *dg;

  const uint64_t so = slot_off(opts_.partition, static_cast<uint32_t>(free_slot));
  auto* slot = region_->at<cxlkv_pnm_slot>(so);
  const auto old = d.read_fresh(&slot->ctx);
  c.generation = old.generation + 1;
  c.check = cxlkv_pnm_ctx_check(&c);
  live_++;
  CXLKV_TRY(write_part());

  // The count of the new generation (0 tokens) first, so a reader that sees
  // the LIVE descriptor never pairs it with the previous context's count.
  cxlkv_pnm_count cnt{};
  cnt.generation = c.generation;
  cnt.check = cxlkv_pnm_count_check(&cnt);
  d.publish_line(&slot->count, &cnt);
  // Rule 3: the count line is in memory before the descriptor that names it.
  d.fence();
  d.store(&slot->ctx, &c, sizeof c);
  // Rule 3 (metadata): clflush the descriptor, fence: visible to every host.
  d.flush(&slot->ctx, sizeof c);
  d.fence();

  auto ctx = std::unique_ptr<Context>(new Context());
  ctx->store_ = this;
  ctx->region_ = region_;
  ctx->slot_off_ = so;
  ctx->partition_ = opts_.partition;
  ctx->request_id_ = request_id;
  ctx->generation_ = c.generation;
  ctx->geo_ = g;
  ctx->max_pages_ = c.max_pages;
  ctx->page_table_off_ = c.page_table_off;
  ctx->digest_off_ = c.digest_off;
  ctx->set_digest_layout(c);
  ctx->writable_ = true;
  ctx->last_digest_.assign(size_t(g.layers) * g.kv_heads * 2 * g.head_dim * dtype_size(g.dtype), 0);
  if (g.group_pages) ctx->last_group_.assign(ctx->last_digest_.size(), 0);
  return ctx;
}

Result<std::unique_ptr<Context>> ContextStore::find(uint64_t request_id) {
  MemoryDomain& d = region_->domain();
  for (uint32_t p = 0; p < nparts_; p++)
    for (uint32_t s = 0; s < slots_; s++) {
      const uint64_t so = slot_off(p, s);
      auto c = d.read_fresh(region_->at<cxlkv_pnm_ctx>(so));  // rule 4
      if (c.state != CXLKV_PNM_LIVE || c.request_id != request_id) continue;
      if (c.check != cxlkv_pnm_ctx_check(&c))
        return Error(-EIO, "pool " + region_->uri() + ": pnm context " + std::to_string(request_id) +
                               ": descriptor check mismatch in partition " + std::to_string(p) + " slot " +
                               std::to_string(s));
      // Every offset and size of the descriptor, before any is used
      // (cxlkv/format/pnm_format.h): the check above only says the line is whole.
      const std::string D = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id) +
                            " (partition " + std::to_string(p) + " slot " + std::to_string(s) + "): descriptor ";
      if (c.layers == 0 || c.kv_heads == 0 || c.head_dim == 0 || c.page_tokens == 0 || c.max_pages == 0)
        return Error(-EBADMSG, D + "geometry has a zero field (layers " + std::to_string(c.layers) + ", kv_heads " +
                                   std::to_string(c.kv_heads) + ", head_dim " + std::to_string(c.head_dim) +
                                   ", page_tokens " + std::to_string(c.page_tokens) + ", max_pages " +
                                   std::to_string(c.max_pages) + ")");
      if (c.dtype > CXLKV_PNM_DTYPE_MAX) return Error(-EBADMSG, D + "dtype " + std::to_string(c.dtype) + " unknown");
      if (c.digest > CXLKV_PNM_DIGEST_MAX)
        return Error(-EBADMSG, D + "digest kind " + std::to_string(c.digest) + " unknown");
      if (c.group_log2 > CXLKV_PNM_GROUP_LOG2_MAX)
        return Error(-EBADMSG, D + "group_log2 " + std::to_string(c.group_log2) + " beyond " +
                                   std::to_string(CXLKV_PNM_GROUP_LOG2_MAX));
      if (c.page_bytes != cxlkv_pnm_page_bytes(&c))
        return Error(-EBADMSG, D + "page_bytes " + std::to_string(c.page_bytes) + " does not match its geometry (" +
                                   std::to_string(cxlkv_pnm_page_bytes(&c)) + ")");
      const uint64_t heap_lo = part_off(p) + kAlign + uint64_t(slots_) * CXLKV_PNM_SLOT_SIZE;
      const uint64_t heap_hi = part_off(p) + part_bytes_;
      auto in_heap = [&](uint64_t off, uint64_t len) { return off >= heap_lo && off <= heap_hi && len <= heap_hi - off; };
      const uint64_t pt_len = uint64_t(c.max_pages) * 8;
      const uint64_t dg_len = cxlkv_pnm_digest_area_bytes(&c);
      if (c.page_table_off % 8 || !in_heap(c.page_table_off, pt_len))
        return Error(-EBADMSG, D + "page_table_off " + hex(c.page_table_off) + " (+" + std::to_string(pt_len) +
                                   " bytes) is not in the heap of partition " + std::to_string(p) + " (" +
                                   hex(heap_lo) + ".." + hex(heap_hi) + ")");
      if (!in_heap(c.digest_off, dg_len))
        return Error(-EBADMSG, D + "digest_off " + hex(c.digest_off) + " (+" + std::to_string(dg_len) +
                                   " bytes) is not in the heap of partition " + std::to_string(p) + " (" +
                                   hex(heap_lo) + ".." + hex(heap_hi) + ")");
      if (c.page_table_off < c.digest_off + dg_len && c.digest_off < c.page_table_off + pt_len)
        return Error(-EBADMSG, D + "page table and digests overlap");
      auto ctx = std::unique_ptr<Context>(new Context());
      ctx->store_ = this;
      ctx->region_ = region_;
      ctx->slot_off_ = so;
      ctx->partition_ = p;
      ctx->request_id_ = request_id;
      ctx->generation_ = c.generation;
      ctx->geo_ = Geometry{c.layers,
                           c.kv_heads,
                           c.head_dim,
                           static_cast<Dtype>(c.dtype),
                           c.page_tokens,
                           uint64_t(c.max_pages) * c.page_tokens,
                           static_cast<DigestKind>(c.digest),
                           c.group_log2 ? 1u << c.group_log2 : 0u};
      ctx->max_pages_ = c.max_pages;
      ctx->page_table_off_ = c.page_table_off;
      ctx->digest_off_ = c.digest_off;
      ctx->set_digest_layout(c);
      auto n = ctx->refresh();
      if (!n.ok()) return n.error();
      return ctx;
    }
  return Error(-ENOENT, "pool " + region_->uri() + ": pnm context " + std::to_string(request_id) +
                            ": not found in " + std::to_string(nparts_) + " partitions");
}

Result<void> ContextStore::destroy(uint64_t request_id) {
  const std::string C = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id) + ": ";
  if (!opts_.writer) return Error(-EPERM, C + "store opened read-only");
  MemoryDomain& d = region_->domain();
  for (uint32_t s = 0; s < slots_; s++) {
    auto* ctx = region_->at<cxlkv_pnm_ctx>(slot_off(opts_.partition, s));
    auto c = d.read_fresh(ctx);
    if (c.state != CXLKV_PNM_LIVE || c.request_id != request_id) continue;
    c.state = CXLKV_PNM_FREE;
    c.check = cxlkv_pnm_ctx_check(&c);
    d.store(ctx, &c, sizeof c);
    d.flush(ctx, sizeof c);  // rule 3 (metadata): readers see FREE and give up (-ESTALE)
    d.fence();
    if (live_ > 0) live_--;
    if (live_ == 0) heap_next_ = kAlign + uint64_t(slots_) * CXLKV_PNM_SLOT_SIZE;  // heap empty: reset
    return write_part();
  }
  return Error(-ENOENT, C + "not found in partition " + std::to_string(opts_.partition));
}

// ---- Context ------------------------------------------------------------------

Context::~Context() = default;

uint64_t Context::page_bytes() const {
  return uint64_t(geo_.layers) * 2 * geo_.kv_heads * geo_.page_tokens * geo_.head_dim * dtype_size(geo_.dtype);
}

Result<void> Context::write_page_entry(uint32_t page, uint64_t off) {
  MemoryDomain& d = region_->domain();
  auto* e = region_->at<uint64_t>(page_table_off_ + uint64_t(page) * 8);
  d.store(e, &off, 8);
  // Rule 3: page-table lines have one writer; clflush them before the count.
  if (!testing::faults().skip_writer_flush) d.flush(e, 8);
  return {};
}

void Context::set_digest_layout(const cxlkv_pnm_ctx& c) {
  row_bytes_ = cxlkv_pnm_digest_bytes(&c);
  max_groups_ = static_cast<uint32_t>(cxlkv_pnm_max_groups(&c));
  group_off_ = c.digest_off + uint64_t(c.layers) * c.kv_heads * c.max_pages * row_bytes_;
}

Result<void> Context::store_row(uint64_t off, const void* minmax, uint32_t tokens) {
  MemoryDomain& d = region_->domain();
  const void* row = minmax;
  thread_local std::vector<unsigned char> q8;
  if (geo_.digest == DigestKind::q8) {
    q8.resize(row_bytes_);
    if (!detail::encode_q8_row(geo_.dtype, minmax, geo_.head_dim, tokens, q8.data()))
      return Error(-EINVAL, "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) +
                                ": a key element is not finite: a q8 digest cannot bound it");
    row = q8.data();
  }
  d.store(region_->at(off), row, row_bytes_);
  // Rule 3: bulk write-back of the digest row; the fence before the count orders it.
  if (!testing::faults().skip_writer_flush) d.flush_bulk(region_->at(off), row_bytes_);
  return {};
}

Result<void> Context::write_digest(uint32_t layer, uint32_t head, uint32_t page, const void* dg, uint32_t tokens,
                                   bool new_page) {
  const uint64_t lh = uint64_t(layer) * geo_.kv_heads + head;
  CXLKV_TRY(store_row(digest_off_ + (lh * max_pages_ + page) * row_bytes_, dg, tokens));
  if (!geo_.group_pages) return {};
  // The page's group: min/max over its pages so far, widened by this page
  // (a page row is two rows of the element type: widening by both is
  // widening by the page's keys).
  const uint32_t gp = geo_.group_pages, grp = page / gp;
  const uint64_t db = 2ull * geo_.head_dim * dtype_size(geo_.dtype);
  unsigned char* gd = last_group_.data() + lh * db;
  detail::digest_rows(geo_.dtype, dg, 2, geo_.head_dim, gd, new_page && page % gp == 0);
  const uint32_t covered = (page % gp) * geo_.page_tokens + tokens;
  return store_row(group_off_ + (lh * max_groups_ + grp) * row_bytes_, gd, covered);
}

Result<void> Context::publish(uint64_t new_tokens) {
  MemoryDomain& d = region_->domain();
  // Rule 3: pages, page-table entries and digests reach memory before the count.
  d.fence();
  cxlkv_pnm_count cnt{};
  cnt.ntokens = new_tokens;
  cnt.generation = generation_;
  cnt.check = cxlkv_pnm_count_check(&cnt);
  d.publish_line(region_->at(slot_off_ + 64), &cnt);
  d.fence();  // rule 3: the count is visible before append() returns
  tokens_ = new_tokens;
  return {};
}

Result<void> Context::append(const void* k, const void* v, uint32_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string C = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) + ": append: ";
  if (!writable_) return Error(-EPERM, C + "read-only handle");
  if ((n > 0 && (!k || !v))) return Error(-EINVAL, C + "K or V is NULL");
  if (tokens_ + n > uint64_t(max_pages_) * geo_.page_tokens)
    return Error(-ENOSPC, C + std::to_string(n) + " tokens after " + std::to_string(tokens_) +
                              " exceed the capacity of " + std::to_string(uint64_t(max_pages_) * geo_.page_tokens));
  if (n == 0) return {};
  MemoryDomain& d = region_->domain();
  const size_t es = dtype_size(geo_.dtype);
  const uint64_t row = uint64_t(geo_.head_dim) * es, db = 2 * row;
  const uint32_t pt = geo_.page_tokens;
  uint64_t t = tokens_;
  const uint64_t tokens_before = tokens_;
  uint32_t done = 0;
  while (done < n) {
    const uint32_t page = static_cast<uint32_t>(t / pt), in_page = static_cast<uint32_t>(t % pt);
    const uint32_t cnt = std::min<uint32_t>(n - done, pt - in_page);
    if (in_page == 0) {
      auto off = store_->heap_alloc(page_bytes());
      if (!off.ok()) return Error(-ENOSPC, C + off.error().message());
      last_page_off_ = *off;
      CXLKV_TRY(write_page_entry(page, last_page_off_));
    }
    for (uint32_t l = 0; l < geo_.layers; l++)
      for (uint32_t h = 0; h < geo_.kv_heads; h++) {
        const uint64_t src = ((uint64_t(l) * geo_.kv_heads + h) * n + done) * row;
        for (uint32_t kv = 0; kv < 2; kv++) {
          const auto* s = static_cast<const unsigned char*>(kv ? v : k) + src;
          const uint64_t dst = last_page_off_ + ((uint64_t(l) * 2 + kv) * geo_.kv_heads + h) * pt * row +
                               uint64_t(in_page) * row;
          // Payload: NT copy, in memory after the fence in publish() (rule 3).
          d.copy_to_pool(region_->at(dst), s, cnt * row);
        }
        unsigned char* dg = last_digest_.data() + (uint64_t(l) * geo_.kv_heads + h) * db;
        detail::digest_rows(geo_.dtype, static_cast<const unsigned char*>(k) + src, cnt, geo_.head_dim, dg,
                            in_page == 0);
        CXLKV_TRY(write_digest(l, h, page, dg, in_page + cnt, in_page == 0));
      }
    // The store grew its heap: its header goes out before the count too.
    if (in_page == 0) CXLKV_TRY(store_->write_part());
    done += cnt;
    t += cnt;
  }
  CXLKV_TRY(publish(t));
  const uint64_t written =
      uint64_t(pages_for(t) - tokens_before / geo_.page_tokens) * geo_.layers * geo_.kv_heads * row_bytes_;
  store_->record_digest_build(n, written, false, since_ns(t0));
  return {};
}

Result<void> Context::append_pages(std::span<const uint64_t> offs, const void* digests, uint64_t ntokens) {
  const auto t0 = std::chrono::steady_clock::now();
  CXLKV_TRY(append_pages_impl(offs, digests, ntokens));
  if (!offs.empty())
    store_->record_digest_build(ntokens, uint64_t(offs.size()) * geo_.layers * geo_.kv_heads * row_bytes_, false,
                                since_ns(t0));
  return {};
}

Result<void> Context::append_pages_impl(std::span<const uint64_t> offs, const void* digests, uint64_t ntokens) {
  const std::string C =
      "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) + ": append_pages: ";
  if (!writable_) return Error(-EPERM, C + "read-only handle");
  const uint32_t pt = geo_.page_tokens;
  if (tokens_ % pt) return Error(-EINVAL, C + "the last page is partial (" + std::to_string(tokens_) + " tokens)");
  if (offs.empty()) return {};
  if (!digests) return Error(-EINVAL, C + "digests is NULL");
  if (ntokens > offs.size() * pt || ntokens <= (offs.size() - 1) * pt)
    return Error(-EINVAL, C + std::to_string(ntokens) + " tokens do not fill " + std::to_string(offs.size()) +
                              " pages of " + std::to_string(pt));
  const uint32_t page0 = static_cast<uint32_t>(tokens_ / pt);
  if (page0 + offs.size() > max_pages_)
    return Error(-ENOSPC, C + std::to_string(offs.size()) + " pages after " + std::to_string(page0) +
                              " exceed the capacity of " + std::to_string(max_pages_));
  // The rule readers apply to every page-table entry (cxlkv/format/pnm_format.h):
  // a page they would refuse is refused here.
  std::vector<std::pair<uint64_t, uint64_t>> carves;
  bool have_carves = false;
  for (size_t i = 0; i < offs.size(); i++)
    if (auto why = bad_page(offs[i], carves, have_carves); !why.empty())
      return Error(-EINVAL, C + "page " + std::to_string(i) + " at " + hex(offs[i]) + " " + why);
  const uint64_t db = 2ull * geo_.head_dim * dtype_size(geo_.dtype);
  const auto* dg = static_cast<const unsigned char*>(digests);
  for (size_t i = 0; i < offs.size(); i++) CXLKV_TRY(write_page_entry(page0 + uint32_t(i), offs[i]));
  const bool as_given = geo_.digest == DigestKind::minmax && !geo_.group_pages;
  for (uint32_t l = 0; l < geo_.layers; l++)
    for (uint32_t h = 0; h < geo_.kv_heads; h++) {
      MemoryDomain& d = region_->domain();
      const uint64_t lh = uint64_t(l) * geo_.kv_heads + h;
      const unsigned char* run = dg + lh * offs.size() * db;
      if (as_given) {
        const uint64_t off = digest_off_ + (lh * max_pages_ + page0) * db;
        // Whole runs of digests at once; same rule 3 as write_digest().
        d.store(region_->at(off), run, offs.size() * db);
        if (!testing::faults().skip_writer_flush) d.flush_bulk(region_->at(off), offs.size() * db);
      } else {
        for (size_t i = 0; i < offs.size(); i++) {
          const uint32_t tok = i + 1 < offs.size() ? pt : static_cast<uint32_t>(ntokens - (offs.size() - 1) * pt);
          CXLKV_TRY(write_digest(l, h, page0 + uint32_t(i), run + i * db, tok, true));
        }
      }
      std::memcpy(last_digest_.data() + lh * db, run + (offs.size() - 1) * db, db);
    }
  last_page_off_ = offs.back();
  return publish(tokens_ + ntokens);
}

bool Context::still_valid() const {
  MemoryDomain& d = region_->domain();
  auto c = d.read_fresh(region_->at<cxlkv_pnm_ctx>(slot_off_));  // rule 4
  return c.state == CXLKV_PNM_LIVE && c.generation == generation_ && c.request_id == request_id_;
}

Result<uint64_t> Context::refresh() {
  MemoryDomain& d = region_->domain();
  const std::string C = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) + ": ";
  if (!still_valid()) return Error(-ESTALE, C + "destroyed or replaced since it was opened");
  if (testing::faults().skip_reader_invalidate) {
    auto cnt = d.read(region_->at<cxlkv_pnm_count>(slot_off_ + 64));
    if (cnt.generation == generation_) tokens_ = std::max<uint64_t>(tokens_, cnt.ntokens);
    return tokens_;
  }
  // Rule 4: the count line fresh.  It is published by one 64-byte store, so
  // a check mismatch is damage, or a torn line caught mid-store: read again a
  // few times before calling it damage.
  cxlkv_pnm_count cnt{};
  for (int tries = 0;; tries++) {
    cnt = d.read_fresh(region_->at<cxlkv_pnm_count>(slot_off_ + 64));
    if (cnt.check == cxlkv_pnm_count_check(&cnt)) break;
    if (tries == 3)
      return Error(-EBADMSG, C + "count line check mismatch (stored " + hex(cnt.check) + ", computed " +
                                 hex(cxlkv_pnm_count_check(&cnt)) + "; ntokens " + std::to_string(cnt.ntokens) +
                                 ")");
  }
  if (cnt.generation != generation_) {
    // The count of a new generation is stored before its descriptor (see
    // create()): a descriptor of our generation with a count of another is
    // a context replaced since our first read, or a damaged count line.
    if (!still_valid()) return Error(-ESTALE, C + "destroyed or replaced since it was opened");
    return Error(-EBADMSG, C + "count line names generation " + std::to_string(cnt.generation) +
                               ", its descriptor " + std::to_string(generation_));
  }
  if (cnt.ntokens > uint64_t(max_pages_) * geo_.page_tokens)
    return Error(-EBADMSG, C + "published count (ntokens) " + std::to_string(cnt.ntokens) +
                               " exceeds the capacity of " + std::to_string(uint64_t(max_pages_) * geo_.page_tokens));
  // Counts only grow (a context is appended to, never cut).
  if (cnt.ntokens < tokens_)
    return Error(-EBADMSG, C + "published count (ntokens) " + std::to_string(cnt.ntokens) + " is below the " +
                               std::to_string(tokens_) + " read before");
  tokens_ = cnt.ntokens;
  return tokens_;
}

std::string Context::bad_page(uint64_t off, std::vector<std::pair<uint64_t, uint64_t>>& carves,
                              bool& have_carves) const {
  const uint64_t pb = page_bytes();
  if (off % 64) return "is not 64-aligned";
  if (!region_->contains(off, pb)) return "(+" + std::to_string(pb) + " bytes) is outside the pool";
  const uint64_t end = off + pb;
  const ContextStore& st = *store_;
  if (off < st.carve_off_ + st.carve_size_ && st.carve_off_ < end) {
    // In the pnm carve: only in the heap of this context's partition, and not
    // over the context's own page table or digests.
    const uint64_t lo = st.part_off(partition_) + kAlign + uint64_t(st.slots_) * CXLKV_PNM_SLOT_SIZE;
    const uint64_t hi = st.part_off(partition_) + st.part_bytes_;
    if (off < lo || end > hi)
      return "(+" + std::to_string(pb) + " bytes) is in the pnm carve outside the heap of partition " +
             std::to_string(partition_) + " (" + hex(lo) + ".." + hex(hi) + ")";
    const uint64_t pt_end = page_table_off_ + uint64_t(max_pages_) * 8;
    const uint64_t dg_end = group_off_ + uint64_t(geo_.layers) * geo_.kv_heads * max_groups_ * row_bytes_;
    if ((off < pt_end && page_table_off_ < end) || (off < dg_end && digest_off_ < end))
      return "overlaps the context's own page table or digests";
    return "";
  }
  // Elsewhere: past the superblock, in space no other carve holds.
  if (off < CXLKV_FIRST_CARVE_OFF) return "is in the superblock";
  if (!have_carves) {
    for (const auto& c : region_->carves()) carves.emplace_back(c.offset, c.offset + c.size);
    have_carves = true;
  }
  for (const auto& [a, b] : carves)
    if (off < b && a < end)
      return "(+" + std::to_string(pb) + " bytes) lies in another carve of the pool (" + hex(a) + ".." + hex(b) + ")";
  return "";
}

namespace {
// Rule 4 / 6: invalidate the range, fence, then load.
void read_range(MemoryDomain& d, void* dst, const void* src, size_t n) {
  if (!testing::faults().skip_reader_invalidate) {
    d.invalidate_payload(src, n);
    d.fence();
  }
  d.load_payload(dst, src, n);
}
}  // namespace

Result<void> Context::read_digests(uint32_t layer, uint32_t head, uint32_t page0, uint32_t npages,
                                   void* dst) const {
  if (layer >= geo_.layers || head >= geo_.kv_heads || uint64_t(page0) + npages > max_pages_)
    return Error(-EINVAL, "pnm context " + std::to_string(request_id_) + ": digests (layer " +
                              std::to_string(layer) + ", head " + std::to_string(head) + ", pages " +
                              std::to_string(page0) + "+" + std::to_string(npages) + ") out of range");
  const uint64_t off = digest_off_ + ((uint64_t(layer) * geo_.kv_heads + head) * max_pages_ + page0) * row_bytes_;
  read_range(region_->domain(), dst, region_->at(off), npages * row_bytes_);
  return {};
}

Result<void> Context::read_group_digests(uint32_t layer, uint32_t head, uint32_t group0, uint32_t ngroups,
                                         void* dst) const {
  if (layer >= geo_.layers || head >= geo_.kv_heads || uint64_t(group0) + ngroups > max_groups_)
    return Error(-EINVAL, "pnm context " + std::to_string(request_id_) + ": group digests (layer " +
                              std::to_string(layer) + ", head " + std::to_string(head) + ", groups " +
                              std::to_string(group0) + "+" + std::to_string(ngroups) + ") out of range");
  const uint64_t off = group_off_ + ((uint64_t(layer) * geo_.kv_heads + head) * max_groups_ + group0) * row_bytes_;
  read_range(region_->domain(), dst, region_->at(off), ngroups * row_bytes_);
  return {};
}

const void* Context::digests_in_place(uint32_t layer, uint32_t head) const {
  if (region_->domain().mode() != DomainMode::coherent || layer >= geo_.layers || head >= geo_.kv_heads)
    return nullptr;
  return region_->at(digest_off_ + (uint64_t(layer) * geo_.kv_heads + head) * max_pages_ * row_bytes_);
}

const void* Context::group_digests_in_place(uint32_t layer, uint32_t head) const {
  if (region_->domain().mode() != DomainMode::coherent || layer >= geo_.layers || head >= geo_.kv_heads ||
      !max_groups_)
    return nullptr;
  return region_->at(group_off_ + (uint64_t(layer) * geo_.kv_heads + head) * max_groups_ * row_bytes_);
}

Result<void> Context::check_digest_rows(const void* rows, uint32_t first, uint32_t n, bool groups, uint32_t layer,
                                        uint32_t head, uint64_t ntokens) const {
  if (geo_.digest != DigestKind::q8) return {};
  const uint64_t span = uint64_t(geo_.page_tokens) * (groups ? geo_.group_pages : 1);
  for (uint32_t i = 0; i < n; i++) {
    cxlkv_pnm_q8_row r;
    std::memcpy(&r, static_cast<const unsigned char*>(rows) + i * row_bytes_, sizeof r);
    const uint64_t at = uint64_t(first + i) * span;
    const uint64_t need = at < ntokens ? std::min(span, ntokens - at) : 0;
    // A finite positive binary32 has its sign bit clear and is below +inf's bits.
    const bool damaged = r.scale_bits == 0 || r.scale_bits >= 0x7f800000u || r.tokens > span;
    if (damaged || r.tokens < need)
      return Error(-EBADMSG, "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) +
                                 ": q8 digest of layer " + std::to_string(layer) + " head " + std::to_string(head) +
                                 (groups ? " group " : " page ") + std::to_string(first + i) +
                                 (damaged ? " is damaged (scale bits " + hex(r.scale_bits) + ", tokens " +
                                                std::to_string(r.tokens) + " of " + std::to_string(span) + ")"
                                          : " is stale (covers " + std::to_string(r.tokens) + " tokens, the count needs " +
                                                std::to_string(need) + ")"));
  }
  return {};
}

Result<void> Context::read_page_table(uint32_t page0, uint32_t npages, uint64_t* dst) const {
  if (uint64_t(page0) + npages > max_pages_)
    return Error(-EINVAL, "pnm context " + std::to_string(request_id_) + ": page table range " +
                              std::to_string(page0) + "+" + std::to_string(npages) + " out of range");
  read_range(region_->domain(), dst, region_->at(page_table_off_ + uint64_t(page0) * 8), uint64_t(npages) * 8);
  // Every entry before any page is read (cxlkv/format/pnm_format.h): an entry of 0
  // would otherwise read the superblock as K and V.
  std::vector<std::pair<uint64_t, uint64_t>> carves;
  bool have_carves = false;
  for (uint32_t i = 0; i < npages; i++)
    if (auto why = bad_page(dst[i], carves, have_carves); !why.empty())
      return Error(-EBADMSG, "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) +
                                 ": page table entry " + std::to_string(page0 + i) + " " + hex(dst[i]) + " " + why);
  return {};
}

const void* Context::rows_in_place(uint64_t page_off, uint32_t layer, uint32_t kv, uint32_t head) const {
  if (region_->domain().mode() != DomainMode::coherent || testing::faults().skip_reader_invalidate ||
      layer >= geo_.layers || kv > 1 || head >= geo_.kv_heads || !region_->contains(page_off, page_bytes()))
    return nullptr;
  const uint64_t row = uint64_t(geo_.head_dim) * dtype_size(geo_.dtype);
  return region_->at(page_off + ((uint64_t(layer) * 2 + kv) * geo_.kv_heads + head) * geo_.page_tokens * row);
}

Result<void> Context::read_rows(uint64_t page_off, uint32_t layer, uint32_t kv, uint32_t head, uint32_t ntok,
                                void* dst) const {
  if (layer >= geo_.layers || kv > 1 || head >= geo_.kv_heads || ntok > geo_.page_tokens ||
      !region_->contains(page_off, page_bytes()))
    return Error(-EINVAL, "pnm context " + std::to_string(request_id_) + ": rows out of range");
  const uint64_t row = uint64_t(geo_.head_dim) * dtype_size(geo_.dtype);
  const uint64_t off = page_off + ((uint64_t(layer) * 2 + kv) * geo_.kv_heads + head) * geo_.page_tokens * row;
  read_range(region_->domain(), dst, region_->at(off), ntok * row);
  return {};
}

}  // namespace cxlkv::pnm
