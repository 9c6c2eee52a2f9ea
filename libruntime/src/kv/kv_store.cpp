// SPDX-License-Identifier: MIT
// KvStore: write path, read path, payload tiers and statistics.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "index/index_check.hpp"
#include "index/prefix_index.hpp"
#include "kv/interleave.hpp"
#include "tier/ssd_payload_tier.hpp"
#include "transfer/cpu_copy.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

// MEM tier: one pool device, or a block striped over the interleave set.
class MemTier final : public PayloadTier {
 public:
  MemTier(std::vector<PoolDevice> devs, InterleaveSet set) : devs_(std::move(devs)), set_(std::move(set)) {}

  Result<void> write(const BlockLocation& loc, std::span<const Chunk> chunks) override {
    return io(loc, chunks, true);
  }
  Result<void> read(const BlockLocation& loc, std::span<const Chunk> chunks) override {
    return io(loc, chunks, false);
  }

 private:
  // docs/integrity.md "Checked metadata": the location lies inside the device's kv carve.
  static Result<void> in_payload_range(const PoolDevice& dv, uint32_t d, uint64_t off, uint64_t len) {
    const uint64_t lo = dv.payload_hi ? dv.payload_lo : 0, hi = dv.payload_hi ? dv.payload_hi : dv.size;
    if (off >= lo && off <= hi && len <= hi - off) return {};
    return Error(-EUCLEAN, "kv: index entry names bytes [" + std::to_string(off) + ", +" + std::to_string(len) +
                               ") of device " + std::to_string(d) + ", outside its kv carve [" + std::to_string(lo) +
                               ", " + std::to_string(hi) + "): damaged entry, not read or written");
  }

  Result<void> io(const BlockLocation& loc, std::span<const Chunk> chunks, bool wr) {
    uint64_t total = 0;
    for (const Chunk& c : chunks) {
      if (c.len && !c.addr) return Error(-EINVAL, "kv: chunk with null address");
      total += c.len;
    }
    if (total != loc.length)
      return Error(-EINVAL, "kv: chunk list holds " + std::to_string(total) + " bytes, block has " +
                                std::to_string(loc.length));
    if (loc.device == CXLKV_LOC_DEV_INTERLEAVED) {
      if (set_.devices() > devs_.size())
        return Error(-ENODEV, "kv: block is interleaved over " + std::to_string(set_.devices()) +
                                  " devices, this store has " + std::to_string(devs_.size()));
      uint64_t ext = set_.extent(loc.length);
      for (uint32_t d = 0; d < set_.devices(); d++) {
        if (loc.offset > devs_[d].size || ext > devs_[d].size - loc.offset)
          return Error(-EFAULT, "kv: interleaved block at " + std::to_string(loc.offset) + " exceeds device " +
                                    std::to_string(d));
        CXLKV_TRY(in_payload_range(devs_[d], d, loc.offset, ext));
        if (devs_[d].region) devs_[d].region->prepare(loc.offset, ext);  // map_on_use: before the copy
      }
      if (!wr) {
        // rules 4/6: each device's part of the block is invalidated in one
        // sweep, then one fence per device orders it before the loads.
        for (uint32_t d = 0; d < set_.devices(); d++) devs_[d].domain->invalidate_payload(devs_[d].base + loc.offset, ext);
        for (uint32_t d = 0; d < set_.devices(); d++) devs_[d].domain->fence();
      }
      uint64_t x = 0;  // logical block offset
      for (const Chunk& c : chunks) {
        auto* p = static_cast<std::byte*>(c.addr);
        uint64_t left = c.len;
        while (left) {
          uint32_t dev;
          uint64_t doff, run;
          set_.map(x, &dev, &doff, &run);
          uint64_t n = std::min(left, run);
          std::byte* pool = devs_[dev].base + loc.offset + doff;
          if (wr) devs_[dev].domain->copy_to_pool(pool, p, n);
          else devs_[dev].domain->load_payload(p, pool, n);  // invalidated above
          p += n;
          x += n;
          left -= n;
        }
      }
      if (wr)
        for (uint32_t d = 0; d < set_.devices(); d++)
          devs_[d].domain->fence();  // rule 3: payload in memory before the entry is published
      return {};
    }
    if (loc.device >= devs_.size())
      return Error(-ENODEV, "kv: index entry names device " + std::to_string(loc.device) + ", but this store has " +
                                std::to_string(devs_.size()) + " pool device(s) (0.." +
                                std::to_string(devs_.size() - 1) +
                                "): a damaged entry, or a store opened without the writer's devices; not read or "
                                "written");
    const PoolDevice& dv = devs_[loc.device];
    if (loc.offset > dv.size || loc.length > dv.size - loc.offset)
      return Error(-EFAULT, "kv: block [" + std::to_string(loc.offset) + ", +" + std::to_string(loc.length) +
                                ") outside device " + std::to_string(loc.device));
    CXLKV_TRY(in_payload_range(dv, loc.device, loc.offset, loc.length));
    if (dv.region) dv.region->prepare(loc.offset, loc.length);  // map_on_use: before the copy
    std::byte* pool = dv.base + loc.offset;
    // gather_write: NT / flushed copy + fence (rule 3), so the caller may
    // publish; scatter_read invalidates before loading (rule 6).
    Result<size_t> n = wr ? gather_write(*dv.domain, pool, chunks) : scatter_read(*dv.domain, pool, chunks);
    if (!n) return n.error();
    return {};
  }

  std::vector<PoolDevice> devs_;
  InterleaveSet set_;
};

// Turns block sizes into interleaved allocations when the set has > 1 device.
class InterleavedSpace final : public PayloadSpace {
 public:
  InterleavedSpace(PayloadSpace& inner, InterleaveSet set) : inner_(inner), set_(std::move(set)) {}
  Result<BlockLocation> alloc(uint64_t bytes) override {
    auto r = inner_.alloc(set_.extent(bytes));
    if (!r) return r.error();
    BlockLocation l = r.value();
    l.device = CXLKV_LOC_DEV_INTERLEAVED;
    l.length = static_cast<uint32_t>(bytes);
    return l;
  }
  bool evicting_can_help() override { return inner_.evicting_can_help(); }
  void free(const BlockLocation& loc) override {
    BlockLocation l = loc;
    l.device = 0;
    l.length = static_cast<uint32_t>(set_.extent(loc.length));
    inner_.free(l);
  }
  void free_taken(const BlockLocation& loc, uint32_t node, uint32_t inc) override {
    inner_.free_taken(inner(loc), node, inc);
  }
  // docs/integrity.md "Block owners: overlapping entries": owner records of the extent on device 0's allocator.
  void claim(const BlockLocation& loc, uint32_t slot) override { inner_.claim(inner(loc), slot); }
  Owner owner_check(const BlockLocation& loc, uint32_t slot) override { return inner_.owner_check(inner(loc), slot); }
  void still_allocated(std::span<const BlockLocation> locs, std::span<const uint32_t> slots,
                       std::span<Owner> out) override {
    std::vector<BlockLocation> in(locs.size());
    for (size_t i = 0; i < locs.size(); i++) in[i] = inner(locs[i]);
    inner_.still_allocated(in, slots, out);
  }

 private:
  BlockLocation inner(const BlockLocation& loc) const {
    BlockLocation l = loc;
    l.device = 0;
    l.length = static_cast<uint32_t>(set_.extent(loc.length));
    return l;
  }
  PayloadSpace& inner_;
  InterleaveSet set_;
};

int latency_bucket(uint64_t ns) {
  if (ns < 1) ns = 1;
  // two buckets per octave: b = floor(2*log2(ns))
  int b = static_cast<int>(std::floor(2.0 * std::log2(static_cast<double>(ns))));
  return std::clamp(b, 0, int(CXLKV_LAT_BUCKETS) - 1);
}

// docs/eviction.md "The SSD tier": the index's demotion hook.  Reads the block from memory (rule 6:
// the MEM tier invalidates first) and places it on the SSD tier.
class TierDemotion final : public DemotionTarget {
 public:
  TierDemotion(PayloadTier& mem, PlacingTier& ssd) : mem_(mem), ssd_(ssd) {}
  Result<BlockLocation> demote(const BlockKey& key, const BlockLocation& m) override {
    staging_.resize(m.length);
    Chunk c{staging_.data(), m.length};
    auto r = mem_.read(m, {&c, 1});
    if (!r) return r.error();
    return ssd_.place(key, {&c, 1});  // the SSD block records its key (docs/integrity.md "The SSD tier")
  }
  void release(const BlockLocation& loc) override { ssd_.release(loc); }

 private:
  PayloadTier& mem_;
  PlacingTier& ssd_;
  std::vector<std::byte> staging_;
};

}  // namespace

// ---- statistics -------------------------------------------------------------

const char* counter_name(int c) {
  static const char* names[CXLKV_CTR_COUNT] = {
      "lookups",  "hit_blocks", "miss_blocks", "reserves",  "reserve_exists", "publishes",
      "aborts",   "fetches",    "pins",        "pin_misses", "evictions",     "reclaims",
      "bytes_in", "bytes_out",  "nospc",       "errors"};
  return c >= 0 && c < int(CXLKV_CTR_COUNT) ? names[c] : "?";
}

const char* latency_name(int l) {
  static const char* names[CXLKV_LAT_COUNT] = {"lookup", "reserve", "write", "publish", "pin",
                                              "fetch",  "unpin",   "put",   "get"};
  return l >= 0 && l < int(CXLKV_LAT_COUNT) ? names[l] : "?";
}

void KvStats::add(const KvStats& o) {
  for (unsigned i = 0; i < CXLKV_CTR_COUNT; i++) counters[i] += o.counters[i];
  for (unsigned l = 0; l < CXLKV_LAT_COUNT; l++)
    for (unsigned b = 0; b < CXLKV_LAT_BUCKETS; b++) latency[l][b] += o.latency[l][b];
}

uint64_t KvStats::latency_count(int which) const {
  uint64_t n = 0;
  for (unsigned b = 0; b < CXLKV_LAT_BUCKETS; b++) n += latency[which][b];
  return n;
}

double KvStats::latency_us(int which, double pct) const {
  uint64_t n = latency_count(which);
  if (n == 0) return 0;
  uint64_t want = static_cast<uint64_t>(std::ceil(pct / 100.0 * double(n)));
  if (want == 0) want = 1;
  uint64_t acc = 0;
  for (unsigned b = 0; b < CXLKV_LAT_BUCKETS; b++) {
    acc += latency[which][b];
    if (acc >= want) return std::pow(2.0, (b + 1) / 2.0) / 1000.0;  // bucket upper bound, us
  }
  return std::pow(2.0, CXLKV_LAT_BUCKETS / 2.0) / 1000.0;
}

std::vector<NodeKvStats> read_pool_stats(MemoryDomain& d, const void* index_carve) {
  std::vector<NodeKvStats> out;
  auto* base = static_cast<const std::byte*>(index_carve);
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(base));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC || h.max_nodes == 0 || h.max_nodes > 64) return out;
  for (uint32_t n = 0; n < h.max_nodes; n++) {
    auto* p = reinterpret_cast<const cxlkv_index_node_stats*>(base + h.stats_off + uint64_t(n) * sizeof(cxlkv_index_node_stats));
    cxlkv_index_node_stats s;
    d.invalidate(p, sizeof s);  // rule 4
    d.fence();
    d.load(&s, p, sizeof s);
    // A node that only counted remote tier work (count_remote) has not
    // flushed the rest of its record yet.
    bool remote = false;
    for (uint64_t v : s.remote) remote |= v != 0;
    if (s.updated_ms == 0 && !remote) continue;
    NodeKvStats ns;
    ns.node = n;
    ns.pid = s.pid;
    ns.updated_ms = s.updated_ms;
    std::memcpy(ns.stats.counters, s.counters, sizeof s.counters);
    std::memcpy(ns.stats.latency, s.latency, sizeof s.latency);
    std::memcpy(ns.ssd, s.ssd, sizeof s.ssd);
    std::memcpy(ns.remote, s.remote, sizeof s.remote);
    out.push_back(ns);
  }
  return out;
}

std::vector<NodeKvStats> read_pool_stats(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes) {
  if (!index_carve || carve_bytes < sizeof(cxlkv_index_header)) return {};
  auto h = d.read_fresh(static_cast<const cxlkv_index_header*>(index_carve));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC || !check_index_header(h, carve_bytes, "").ok()) return {};
  return read_pool_stats(d, index_carve);
}

// ---- KvStore ------------------------------------------------------------------

// The node's remote tier counters (docs/remote.md "Counters") live in the
// process, not in one store: the tier counts through a handle of its own
// while the engine's handles flush the node's stats, and every flush writes
// the whole stats record, so all stores of one index carve and node share
// these values and write them under one mutex (the last line of the record
// is never written with two different values at once).
struct KvStore::RemoteCounters {
  std::mutex mu;
  uint64_t v[CXLKV_REMOTE_COUNT] = {};
};

std::shared_ptr<KvStore::RemoteCounters> KvStore::remote_counters_of(const void* index_carve, uint32_t node) {
  static std::mutex mu;
  static std::map<std::pair<const void*, uint32_t>, std::weak_ptr<RemoteCounters>> all;
  std::lock_guard g(mu);
  auto& w = all[{index_carve, node}];
  auto sp = w.lock();
  if (!sp) w = sp = std::make_shared<RemoteCounters>();
  return sp;
}

Result<std::unique_ptr<KvStore>> KvStore::create(KvDeps deps) {
  if (!deps.index_domain || !deps.index_carve || !deps.locks || !deps.liveness || !deps.space)
    return Error(-EINVAL, "kv: incomplete dependencies (index carve, domain, locks, liveness, payload space)");
  if (deps.devices.empty()) return Error(-EINVAL, "kv: no pool device for payload");
  for (size_t i = 0; i < deps.devices.size(); i++)
    if (!deps.devices[i].domain || !deps.devices[i].base)
      return Error(-EINVAL, "kv: pool device " + std::to_string(i) + " has no mapping");
  std::unique_ptr<KvStore> kv(new KvStore());
  kv->deps_ = std::move(deps);
  auto& dp = kv->deps_;
  kv->remote_ = remote_counters_of(dp.index_carve, dp.node);
  // The index allocates through an interleaving adapter when the pool-wide
  // config names several devices.
  auto probe_cfg = dp.index_domain->read_fresh(
      reinterpret_cast<const cxlkv_index_config*>(static_cast<std::byte*>(dp.index_carve) + 64));  // rule 4
  InterleaveSet set(probe_cfg.interleave_stripe, probe_cfg.ndevices ? probe_cfg.ndevices : 1, probe_cfg.weights);
  if (set.devices() > 1) {
    if (dp.devices.size() < set.devices())
      return Error(-ENODEV, "kv: pool is formatted to interleave over " + std::to_string(set.devices()) +
                                " devices, only " + std::to_string(dp.devices.size()) + " given");
    kv->interleaved_space_ = std::make_unique<InterleavedSpace>(*dp.space, set);
  }
  PayloadSpace& space = kv->interleaved_space_ ? *kv->interleaved_space_ : *dp.space;
  auto ix = PrefixIndex::attach(*dp.index_domain, dp.index_carve, dp.index_bytes, dp.node, dp.incarnation,
                                *dp.locks, *dp.liveness, space);
  if (!ix) return ix.error();
  kv->index_ = std::move(ix.value());
  // docs/rpc.md "The index service": the locking calls go to the index service when one is given.
  kv->ops_ = dp.index_backend ? dp.index_backend : kv->index_.get();
  kv->mem_tier_ = std::make_unique<MemTier>(dp.devices, set);
  if (dp.ssd_tier && dp.demote_on_evict) {  // docs/eviction.md "The SSD tier"
    kv->demotion_ = std::make_unique<TierDemotion>(*kv->mem_tier_, *dp.ssd_tier);
    kv->index_->set_demotion(kv->demotion_.get());
  }
  if (dp.ssd_tier) kv->claim_ssd_blocks();  // before this store places anything (docs/integrity.md "The SSD tier")
  return kv;
}

KvStore::~KvStore() {
  if (index_) flush_stats();
}

void KvStore::record(int which, std::chrono::steady_clock::time_point t0, size_t blocks) {
  if (blocks == 0) return;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  stats_.latency[which][latency_bucket(static_cast<uint64_t>(ns) / blocks)] += static_cast<uint32_t>(blocks);
  maybe_flush_stats();
}

void KvStore::maybe_flush_stats() {
  if (++ops_since_flush_ >= 512) flush_stats();
}

void KvStore::flush_stats() {
  ops_since_flush_ = 0;
  const auto& h = index_->header();
  auto* p = reinterpret_cast<cxlkv_index_node_stats*>(static_cast<std::byte*>(deps_.index_carve) + h.stats_off +
                                                      uint64_t(deps_.node) * sizeof(cxlkv_index_node_stats));
  cxlkv_index_node_stats s{};
  std::memcpy(s.counters, stats_.counters, sizeof s.counters);
  s.counters[CXLKV_CTR_EVICTIONS] = index_->counters().evictions;
  s.counters[CXLKV_CTR_RECLAIMS] = index_->counters().reclaims;
  std::memcpy(s.latency, stats_.latency, sizeof s.latency);
  s.updated_ms = realtime_ms();
  s.pid = static_cast<uint32_t>(getpid());
  if (auto* ssd = dynamic_cast<SsdPayloadTier*>(deps_.ssd_tier)) {  // SSD tier metrics (docs/operations.md "Metrics")
    const SsdTierStats t = ssd->stats();
    s.ssd[CXLKV_SSD_DEMOTED] = t.placed;
    s.ssd[CXLKV_SSD_DEMOTED_BYTES] = t.placed_bytes;
    s.ssd[CXLKV_SSD_READS] = t.reads;
    s.ssd[CXLKV_SSD_READ_BYTES] = t.read_bytes;
    s.ssd[CXLKV_SSD_READ_FAILURES] = t.lost + t.bad;
    s.ssd[CXLKV_SSD_FULL] = t.full;
  }
  std::lock_guard g(remote_->mu);  // count_remote writes the last line too
  std::memcpy(s.remote, remote_->v, sizeof s.remote);
  // rule 2 + 3: these lines have one writer (this node): plain stores, then flush.
  deps_.index_domain->store(p, &s, sizeof s);
  deps_.index_domain->flush(p, sizeof s);
  deps_.index_domain->fence();
}

Result<void> KvStore::count_remote(int which, uint64_t n) {
  if (which < 0 || which >= int(CXLKV_REMOTE_COUNT))
    return Error(-EINVAL, "kv: remote tier counter " + std::to_string(which) + " does not exist (0.." +
                              std::to_string(CXLKV_REMOTE_COUNT - 1) + ")");
  const auto& h = index_->header();
  auto* p = reinterpret_cast<cxlkv_index_node_stats*>(static_cast<std::byte*>(deps_.index_carve) + h.stats_off +
                                                      uint64_t(deps_.node) * sizeof(cxlkv_index_node_stats));
  std::lock_guard g(remote_->mu);
  remote_->v[which] += n;
  // rule 2 + 3: the line has one writer (this node; this process's stores
  // of it under remote_->mu): plain stores of the whole line, then flush.
  deps_.index_domain->store(p->remote, remote_->v, sizeof p->remote);
  deps_.index_domain->flush(p->remote, sizeof p->remote);
  deps_.index_domain->fence();
  return {};
}

size_t KvStore::lookup(std::span<const BlockKey> chain) {
  auto t0 = std::chrono::steady_clock::now();
  size_t n = index_->longest_prefix(chain);
  if (n && deps_.lookup_checks_readable) n = readable_prefix(chain, n);  // docs/integrity.md "The SSD tier"
  count(CXLKV_CTR_LOOKUPS);
  count(CXLKV_CTR_HIT_BLOCKS, n);
  count(CXLKV_CTR_MISS_BLOCKS, chain.size() - n);
  record(CXLKV_LAT_LOOKUP, t0);
  return n;
}

const char* KvStore::index_mode() const { return ops_->mode(); }

size_t KvStore::lookup_linear(std::span<const BlockKey> chain) { return index_->longest_prefix_linear(chain); }

Result<void> KvStore::payload_io(const BlockLocation& loc, std::span<const Chunk> chunks, bool wr) {
  if (loc.tier == CXLKV_TIER_MEM) return wr ? mem_tier_->write(loc, chunks) : mem_tier_->read(loc, chunks);
  if (loc.tier == CXLKV_TIER_SSD && deps_.ssd_tier)
    return wr ? deps_.ssd_tier->write(loc, chunks) : deps_.ssd_tier->read(loc, chunks);
  if (loc.tier == CXLKV_TIER_SSD)
    return Error(-ENODEV, "kv: index entry names the SSD tier, which this store was opened without "
                          "(KvOpenOptions::ssd_tier; cxlkvctl kv --ssd FILE): not read or written");
  return Error(-EUCLEAN, "kv: index entry names tier " + std::to_string(loc.tier) + ", which is not a tier (" +
                             std::to_string(CXLKV_TIER_MEM) + ": memory, " + std::to_string(CXLKV_TIER_SSD) +
                             ": SSD): damaged entry, not read or written");
}

// docs/eviction.md "The SSD tier": a hit on the SSD tier moves the block back to memory.  Best
// effort: no memory, another reader's pin or a concurrent change leaves it
// where it is (the fetch already succeeded).
void KvStore::promote(const KvPin& p, const BlockLocation& from, std::span<const Chunk> chunks) {
  PayloadSpace& space = interleaved_space_ ? *interleaved_space_ : *deps_.space;
  auto to = space.alloc(from.length);
  if (!to) return;
  if (!mem_tier_->write(*to, chunks)) {  // fenced (rule 3) before relocate publishes it
    space.free(*to);
    return;
  }
  auto moved = index_->relocate(p.slot, p.key, from, *to);
  if (moved && moved.value()) {
    deps_.ssd_tier->release(from);
  } else {
    space.free(*to);
  }
}

bool KvStore::wait_ready(const BlockKey& key, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (uint32_t i = 0;; i++) {
    uint32_t slot;
    uint32_t st = index_->find_state(key, &slot);
    if (st == CXLKV_ENTRY_READY) return true;
    if (st != CXLKV_ENTRY_WRITING) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    if ((i & 1023) == 1023) {
      // The writer may have died: its entry would stay WRITING forever.
      IndexEntryView v = index_->entry(slot);
      if (v.state == CXLKV_ENTRY_WRITING && !deps_.liveness->alive(v.owner_node, v.owner_inc)) return false;
    }
    if (i < 64) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Result<uint64_t> KvStore::reclaim_dead() { return index_->reclaim_dead(); }

// ---- SSD tier checks (docs/integrity.md "The SSD tier") -------------------

// The index is the record of which SSD extents hold blocks: every SSD
// location a surviving entry names is claimed before this store places
// anything, so a restarted tier never hands out an extent that a published
// block still occupies.
void KvStore::claim_ssd_blocks() {
  const auto& h = index_->header();
  for (uint64_t slot = 0; slot < h.nslots; slot++) {
    IndexEntryView v = index_->entry(static_cast<uint32_t>(slot));
    if (v.loc.tier != CXLKV_TIER_SSD) continue;
    if (v.state != CXLKV_ENTRY_READY && v.state != CXLKV_ENTRY_EVICTING && v.state != CXLKV_ENTRY_WRITING) continue;
    deps_.ssd_tier->claim(v.loc);
  }
}

size_t KvStore::readable_prefix(std::span<const BlockKey> chain, size_t n) {
  for (size_t i = 0; i < n; i++) {
    BlockLocation loc;
    if (index_->find_ready(chain[i], &loc) == CXLKV_INDEX_NO_SLOT) return i;  // gone meanwhile
    if (loc.tier == CXLKV_TIER_SSD && !(deps_.ssd_tier && deps_.ssd_tier->readable(loc))) return i;
  }
  return n;
}

bool KvStore::consume_dropped_pin(const KvPin& p) {
  for (auto it = dropped_pins_.begin(); it != dropped_pins_.end(); ++it)
    if (it->first == p.slot && it->second == p.key) {
      dropped_pins_.erase(it);
      return true;
    }
  return false;
}

}  // namespace cxlkv
