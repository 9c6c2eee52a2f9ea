// SPDX-License-Identifier: MIT
// KvSession: a KvStore wired to the real pool layers of one node:
//   stripe locks   -> the sync layer's two-tier locks (lock id lock_base + stripe)
//   payload space  -> the node heap (chunk allocator + size classes) over the kv carve
//   liveness       -> the control carve's node table (state, incarnation,
//                     heartbeat age; a same-host pid that no longer exists is dead at once)
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/alloc.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/sync.hpp"
#include "index/index_check.hpp"
#include "index/node_pins.hpp"
#include "index/prefix_index.hpp"
#include "kv/index_service.hpp"
#include "kv/store_index.hpp"
#include "sync/node_local.hpp"
#include "util/lock_timeout.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

class TwoTierStripeLocks final : public StripeLocks {
 public:
  // Stripe waits are bounded as every lock wait is (util/lock_timeout.hpp).
  TwoTierStripeLocks(NodeContext& node, uint32_t base, uint32_t n)
      : node_(node), base_(base), timeout_(lock_timeout()) {
    for (uint32_t i = 0; i < n; i++) locks_.push_back(std::make_unique<TwoTierLock>(node, base + i));
  }
  Result<void> lock(uint32_t s) override {
    if (s >= locks_.size()) return Error(-EINVAL, "index: stripe lock " + std::to_string(s) + " out of range");
    auto r = bounded() ? locks_[s]->try_lock_for(timeout_) : locks_[s]->lock();
    if (!r) return r.error();
    // Acquired::recovered: a process of this node died inside the critical
    // section.  Every index entry is a single self-checking line and an
    // EVICTING leftover is finished by the next evictor, so the entries stay
    // consistent; at worst the stripe's usage counters are off by one block.
    return {};
  }
  void unlock(uint32_t s) override { (void)locks_[s]->unlock(); }
  // A batch's stripes: one multi-lock acquire of the sync layer (LockSet,
  // docs/coherence.md "Multi-lock acquire"), one set per thread.
  Result<void> lock_many(std::span<const uint32_t> stripes) override {
    std::vector<uint32_t> ids;
    ids.reserve(stripes.size());
    for (uint32_t s : stripes) {
      if (s >= locks_.size()) return Error(-EINVAL, "index: stripe lock " + std::to_string(s) + " out of range");
      ids.push_back(base_ + s);
    }
    auto r = bounded() ? thread_set().try_lock_for(ids, timeout_) : thread_set().lock(ids);
    if (!r) return r.error();
    return {};  // Acquired::recovered: as for lock()
  }
  void unlock_many(std::span<const uint32_t>) override { (void)thread_set().unlock(); }
  bool cheap(uint32_t s) const override { return s < locks_.size() && locks_[s]->kept(); }
  bool node_has(uint32_t s) const override { return s < locks_.size() && locks_[s]->node_has_grant(); }

 private:
  bool bounded() const { return !lock_wait_unbounded(timeout_); }
  // This thread's LockSet for this object (sets are per thread; an id, not
  // the address, names the object, so a new one at the same address gets a
  // set of its own node).
  LockSet& thread_set() {
    struct Entry {
      uint64_t owner;
      std::unique_ptr<LockSet> set;
    };
    static thread_local std::vector<Entry> sets;
    for (auto& e : sets)
      if (e.owner == id_) return *e.set;
    if (sets.size() >= 8)  // a thread that used many stores: forget an idle one
      for (auto it = sets.begin(); it != sets.end(); ++it)
        if (it->set->held().empty()) {
          sets.erase(it);
          break;
        }
    sets.push_back(Entry{id_, std::make_unique<LockSet>(node_)});
    return *sets.back().set;
  }
  static uint64_t next_id() {
    static std::atomic<uint64_t> n{1};
    return n.fetch_add(1);
  }
  NodeContext& node_;
  uint32_t base_;
  std::chrono::nanoseconds timeout_;
  uint64_t id_ = next_id();
  std::vector<std::unique_ptr<TwoTierLock>> locks_;
};

class NodeTableLiveness final : public NodeLiveness {
 public:
  NodeTableLiveness(NodeContext& node) : node_(node) {
    char h[64] = {};
    gethostname(h, sizeof h - 1);
    host_ = h;
  }
  bool alive(uint32_t n, uint32_t inc) override {
    cxlkv_node_entry e;
    if (!read(n, &e)) return false;
    return static_cast<uint32_t>(e.incarnation) == inc && live(e);
  }
  bool node_alive(uint32_t n) override {
    cxlkv_node_entry e;
    if (!read(n, &e)) return false;
    const NodeVerdict v = judge_node(e);
    if (v.alive) return true;
    // Pins (and lease consumers) are a node's, of any of its processes: the
    // node table names one process per node (the last to beat; another
    // takes over the heartbeat within a period when it dies), so a node of
    // this host whose named process is gone still lives while a process of
    // it holds a pin record (index/node_pins.hpp).  Only active nodes: an
    // operator's `node evict` stays final.  A yes is kept for
    // kAliveByRecordMs (a no is not: a record may appear at any time).
    if (!v.local || n >= alive_until_.size()) return false;
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    if (alive_until_[n].load(std::memory_order_relaxed) > now) return true;
    if (!NodePins::any_live_record(NodeContext::default_local_name(node_.region(), n))) return false;
    alive_until_[n].store(now + kAliveByRecordMs, std::memory_order_relaxed);
    return true;
  }

 private:
  bool read(uint32_t n, cxlkv_node_entry* e) {
    if (n >= node_.control().max_nodes()) return false;
    *e = node_.domain().read_fresh(node_.control().node_entry(n));  // rule 4
    return true;
  }
  // The liveness rule of the sync layer (docs/coherence.md "Liveness"): a node of
  // this host by its process (pid + start time), another host's by heartbeat.
  bool live(const cxlkv_node_entry& e) { return judge_node(e).alive; }
  static constexpr int64_t kAliveByRecordMs = 50;
  NodeContext& node_;
  std::string host_;
  std::vector<std::atomic<int64_t>> alive_until_ =
      std::vector<std::atomic<int64_t>>(node_.control().max_nodes());  // steady ms
};

// Remote frees (evictions of blocks in another node's chunks) become
// usable space only when the owner drains them (alloc/node_heap.cpp).  Each
// session drains its node's inbox every kDrainPeriod from a thread, so an
// idle node gives the space back; an allocation that finds no space while
// an alive node has remote frees waiting polls for at most kDrainWait (a
// few periods, with room for a loaded host) before -ENOSPC.
// CXLKV_DRAIN_PERIOD_MS overrides the period; 0 runs no drainer (for tests
// that show what it guards).
constexpr std::chrono::milliseconds kDrainPeriod{10};
constexpr std::chrono::milliseconds kDrainWait{500};

std::chrono::milliseconds drain_period() {
  if (const char* e = std::getenv("CXLKV_DRAIN_PERIOD_MS"); e && *e) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(e, &end, 10);
    if (*end == 0 && v <= 60000) return std::chrono::milliseconds(v);
    log().warn("kv: CXLKV_DRAIN_PERIOD_MS='{}' is not 0..60000; using {} ms", e, kDrainPeriod.count());
  }
  return kDrainPeriod;
}

class HeapSpace final : public PayloadSpace {
 public:
  explicit HeapSpace(NodeHeap& heap)
      : heap_(heap),
        nnodes_(heap.node().control().max_nodes()),
        stalled_(std::make_unique<std::atomic<uint8_t>[]>(nnodes_)) {}
  Result<BlockLocation> alloc(uint64_t bytes) override {
    auto off = heap_.alloc(bytes);
    if (!off) {
      // Other nodes may have freed blocks of ours (evictions): take them back once.
      if (off.error().code() == -ENOSPC && heap_.drain_remote_frees().ok()) off = heap_.alloc(bytes);
      if (!off && off.error().code() == -ENOSPC) off = wait_for_drains(bytes, off.error());
      if (!off) return off.error();
    }
    return BlockLocation{off.value(), static_cast<uint32_t>(bytes), 0, CXLKV_TIER_MEM};
  }
  // docs/eviction.md "Remote frees": evicting on makes room unless the space
  // it frees waits for a live node that let a whole kDrainWait pass undrained.
  bool evicting_can_help() override {
    std::vector<uint32_t> stalled;
    (void)waiting_nodes(&stalled);
    return stalled.empty();
  }
  void free(const BlockLocation& loc) override {
    unclaim(loc);
    (void)heap_.free(loc.offset);
  }
  // docs/integrity.md "Quarantine": space of a reservation taken from a node declared dead.
  void free_taken(const BlockLocation& loc, uint32_t node, uint32_t inc) override {
    unclaim(loc);
    (void)heap_.free_taken(loc.offset, node, inc);
  }
  // docs/integrity.md "Block owners: overlapping entries": block owner records (cxlkv/format/alloc_format.h "Block owners").
  void claim(const BlockLocation& loc, uint32_t slot) override {
    if (recorded(loc.length)) heap_.chunks().set_owner(loc.offset, cxlkv_block_owner{slot + 1, loc.length});
  }
  Owner owner_check(const BlockLocation& loc, uint32_t slot) override {
    ChunkAllocator& ca = heap_.chunks();
    Owner r;
    if (!ca.in_arena(loc.offset)) {
      r.ok = false;
      r.why = "it lies outside the allocator's arena";
      return r;
    }
    if (recorded(loc.length)) {
      const cxlkv_block_owner o = ca.owner(loc.offset);  // rule 4: one fresh read
      if (o.slot_plus1 == slot + 1 && o.length == loc.length) {
        // One record covers a 1 KiB granule: the start must also be exact.
        if (const uint64_t step = block_step(loc.length); (loc.offset - ca.chunk_off(ca.chunk_of(loc.offset))) % step) {
          r.ok = false;
          r.code = -EBADMSG;
          r.slot = slot;
          r.length = o.length;
          r.why = "offset " + std::to_string(loc.offset) + " is not where the allocator starts a block of " +
                  std::to_string(loc.length) + " bytes (chunk " + std::to_string(ca.chunk_of(loc.offset)) +
                  " starts at offset " + std::to_string(ca.chunk_off(ca.chunk_of(loc.offset))) +
                  " and such blocks every " + std::to_string(step) +
                  " bytes from there): its location was moved inside its allocation granule";
          return r;
        }
        return r;
      }
      r.ok = false;
      r.slot = o.slot_plus1 ? o.slot_plus1 - 1 : CXLKV_INDEX_NO_SLOT;
      r.length = o.length;
      r.why = o.slot_plus1 ? "the allocator records the block at offset " + std::to_string(loc.offset) +
                                 " as held by slot " + std::to_string(o.slot_plus1 - 1) + " with " +
                                 std::to_string(o.length) + " bytes"
                           : "no allocated block of its size starts at offset " + std::to_string(loc.offset);
      return r;
    }
    // Blocks under a granule share records: the chunk must be cut into
    // blocks of this length's size class and the offset start one of them.
    const uint64_t c = ca.chunk_of(loc.offset);
    const cxlkv_chunk_desc cd = ca.desc(c);  // rule 4
    const uint32_t cls = size_class_for(loc.length, ca.geometry().chunk_size);
    if (cd.kind == CXLKV_CHUNK_SMALL && cd.size_class == cls && cls < kSizeClasses &&
        (loc.offset - ca.chunk_off(c)) % size_class_bytes(cls) == 0)
      return r;
    r.ok = false;
    r.why = "offset " + std::to_string(loc.offset) + " is not the start of a " + std::to_string(loc.length) +
            "-byte block (chunk " + std::to_string(c) + " kind " + std::to_string(cd.kind) + ", class " +
            std::to_string(cd.size_class) + ")";
    return r;
  }  // docs/integrity.md "Space reuse seen at fetch": after a fetch's copy, the chunk descriptors of each
  // block and its owner record (a block of a granule or more) must still
  // describe the allocation the block was handed out as.  An allocation
  // over any of its bytes rewrites a descriptor (alloc_run, fenced before
  // the ALLOC lock is released) or, for a block of the same size class at
  // the same start, its record (claim, before the new entry is written)
  // before its writer stores a byte: so a copy that saw the new bytes sees
  // the change here.  Descriptor and record lines are written only with NT
  // stores (rule 1): invalidated clean, all in one sweep, one fence (rule 4).
  void still_allocated(std::span<const BlockLocation> locs, std::span<const uint32_t> slots,
                       std::span<Owner> out) override {
    ChunkAllocator& ca = heap_.chunks();
    MemoryDomain& d = heap_.node().domain();
    const cxlkv_alloc_header& h = ca.header();
    const uint64_t cs = ca.geometry().chunk_size;
    const auto* descs = reinterpret_cast<const cxlkv_chunk_desc*>(ca.carve_base() + h.chunk_table_off);
    const auto* recs = reinterpret_cast<const cxlkv_block_owner*>(ca.carve_base() + cxlkv_alloc_owner_off(&h));
    const size_t n = std::min({locs.size(), slots.size(), out.size()});
    auto runs = [&](const BlockLocation& l) -> uint64_t {  // chunks the allocation spans (1: a small block's chunk)
      return size_class_for(l.length, cs) == kSizeClasses ? (uint64_t{l.length} + cs - 1) / cs : 1;
    };
    auto line_of = [](const void* p) { return reinterpret_cast<uintptr_t>(p) / CXLKV_LINE_SIZE; };
    uintptr_t last_desc = 0, last_rec = 0;
    bool any = false;
    for (size_t i = 0; i < n; i++) {
      const BlockLocation& l = locs[i];
      if (!ca.in_arena(l.offset)) continue;
      const uint64_t c = ca.chunk_of(l.offset), k = std::min<uint64_t>(runs(l), h.nchunks - c);
      if (line_of(&descs[c]) != last_desc || k > 1) d.invalidate_clean(&descs[c], k * sizeof *descs);
      last_desc = line_of(&descs[c + k - 1]);
      if (recorded(l.length)) {
        const cxlkv_block_owner* r = &recs[(l.offset - ca.chunk_off(0)) / CXLKV_OWNER_GRANULE];
        if (line_of(r) != last_rec) d.invalidate_clean(r, sizeof *r);
        last_rec = line_of(r);
      }
      any = true;
    }
    if (any) d.fence();  // rule 4: the invalidations before the loads
    for (size_t i = 0; i < n; i++) {
      Owner& o = out[i];
      o = Owner{};
      const BlockLocation& l = locs[i];
      auto fail = [&](std::string why) {
        o.ok = false;
        o.why = std::move(why);
      };
      if (!ca.in_arena(l.offset)) {
        fail("it lies outside the allocator's arena");
        continue;
      }
      const uint64_t c = ca.chunk_of(l.offset), k = runs(l);
      const uint32_t cls = size_class_for(l.length, cs);
      if (c + k > h.nchunks) {
        fail("it runs past the allocator's last chunk");
        continue;
      }
      for (uint64_t j = 0; j < k && o.ok; j++) {
        cxlkv_chunk_desc cd;
        d.load(&cd, &descs[c + j], sizeof cd);
        const bool same = cls < kSizeClasses ? cd.kind == CXLKV_CHUNK_SMALL && cd.size_class == cls
                          : j == 0       ? cd.kind == CXLKV_CHUNK_LARGE_HEAD && cd.run == k
                                         : cd.kind == CXLKV_CHUNK_LARGE_TAIL && cd.run == j;
        if (!same)
          fail("chunk " + std::to_string(c + j) + " is no longer allocated as this block (kind " +
               std::to_string(cd.kind) + ", class " + std::to_string(cd.size_class) + ", run " +
               std::to_string(cd.run) + "): its space was handed out again");
      }
      if (!o.ok || !recorded(l.length)) continue;
      cxlkv_block_owner r;
      d.load(&r, &recs[(l.offset - ca.chunk_off(0)) / CXLKV_OWNER_GRANULE], sizeof r);
      if (r.slot_plus1 != slots[i] + 1 || r.length != l.length)
        fail("the allocator now records its space as " +
             (r.slot_plus1 ? "held by slot " + std::to_string(r.slot_plus1 - 1) + " with " + std::to_string(r.length) +
                                 " bytes"
                           : std::string("free")) +
             ": its space was handed out again");
    }
  }


 private:
  // Where blocks of `len` bytes start, counted from their chunk's start:
  // every size-class step, or the chunk start for a run of whole chunks.
  uint64_t block_step(uint64_t len) const {
    const uint64_t cs = heap_.chunks().geometry().chunk_size;
    const uint32_t cls = size_class_for(len, cs);
    return cls == kSizeClasses ? cs : size_class_bytes(cls);
  }
  // Does a block of `len` bytes get an owner record (its allocation spans a granule)?
  bool recorded(uint64_t len) const {
    const uint64_t cs = heap_.chunks().geometry().chunk_size;
    const uint32_t cls = size_class_for(len, cs);
    return cls == kSizeClasses || size_class_bytes(cls) >= CXLKV_OWNER_GRANULE;
  }
  // Alive nodes (not this one) with remote frees waiting; `stalled` gets
  // those that let a whole kDrainWait pass before (until seen drained).
  std::vector<uint32_t> waiting_nodes(std::vector<uint32_t>* stalled = nullptr) {
    std::vector<uint32_t> w;
    NodeContext& node = heap_.node();
    for (uint32_t n = 0; n < nnodes_; n++) {
      if (n == node.node()) continue;
      if (heap_.remote_frees_posted(n) == 0) {  // rule 4: one fresh read of its inbox line
        stalled_[n].store(0, std::memory_order_relaxed);
        continue;
      }
      const cxlkv_node_entry e = node.domain().read_fresh(node.control().node_entry(n));  // rule 4
      if (!judge_node(e).alive) continue;  // a dead node never drains
      if (!stalled_[n].load(std::memory_order_relaxed)) w.push_back(n);
      else if (stalled) stalled->push_back(n);
    }
    return w;
  }
  // Evictions freed blocks in chunks of other nodes: the space is theirs
  // until they drain (their session's drainer, each kDrainPeriod).  Retry
  // each time one of them drained, for at most kDrainWait.
  Result<uint64_t> wait_for_drains(uint64_t bytes, const Error& first) {
    std::vector<uint32_t> slow;
    std::vector<uint32_t> w = waiting_nodes(&slow);
    const auto deadline = std::chrono::steady_clock::now() + kDrainWait;
    while (!w.empty() && std::chrono::steady_clock::now() < deadline) {
      ::usleep(1000);
      std::vector<uint32_t> now = waiting_nodes();
      bool drained = false;  // one of w is no longer waiting (both ascending)
      for (size_t i = 0, j = 0; i < w.size() && !drained; i++) {
        while (j < now.size() && now[j] < w[i]) j++;
        drained = j == now.size() || now[j] != w[i];
      }
      if (!drained) continue;
      auto off = heap_.alloc(bytes);
      if (off || off.error().code() != -ENOSPC) return off;
      w = std::move(now);
    }
    for (uint32_t n : w) stalled_[n].store(1, std::memory_order_relaxed);
    slow.insert(slow.end(), w.begin(), w.end());
    if (slow.empty()) return first;
    std::string names;
    for (uint32_t n : slow) names += (names.empty() ? "" : ", ") + std::to_string(n);
    return Error(-ENOSPC, first.message() + "; space freed by evicting blocks of node " + names +
                              " waits for that node to drain its remote frees (not done within " +
                              std::to_string(kDrainWait.count()) + " ms)");
  }
  void unclaim(const BlockLocation& loc) {
    if (!recorded(loc.length)) return;
    heap_.chunks().set_owner(loc.offset, cxlkv_block_owner{});
    // rule 3: the record is cleared in memory before the block can be handed out again
    heap_.node().domain().fence();
  }

  NodeHeap& heap_;
  uint32_t nnodes_;
  // Per node: let a whole kDrainWait pass undrained (see waiting_nodes);
  // several threads may allocate at once.
  std::unique_ptr<std::atomic<uint8_t>[]> stalled_;
};

// The session's drainer thread (see kDrainPeriod).  It also drops, every
// kPinReclaimPeriod, the pins of this node's processes that are gone
// (index/node_pins.hpp): a killed process's pins stop protecting its
// blocks while its node's other processes keep theirs.
constexpr std::chrono::milliseconds kPinReclaimPeriod{200};
// Every kIndexRepairPeriod (CXLKV_INDEX_REPAIR_MS; 0: none) the drainer
// runs the index's online repair (index/prefix_index.hpp "Children
// counts"): what a process killed mid-change left -- a stale children count,
// a pending drop, a dead writer's WRITING block -- lasts at most this long
// after its death is seen (at once on this host; after the heartbeat limit
// for another host's).  Its lock-free sweep reads the whole table; only
// suspects' stripes are locked.
constexpr std::chrono::milliseconds kIndexRepairPeriod{1000};
// Recency stamps owed by optimistic reads are written once the oldest is
// this old: a reader whose stripes another node keeps asks for them about
// four times a second, not per get.
constexpr uint32_t kSettleReadsMs = 250;

std::chrono::milliseconds index_repair_period() {
  if (const char* e = std::getenv("CXLKV_INDEX_REPAIR_MS"); e && *e) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(e, &end, 10);
    if (*end == 0 && v <= 3600000) return std::chrono::milliseconds(v);
    log().warn("kv: CXLKV_INDEX_REPAIR_MS='{}' is not 0..3600000; using {} ms", e, kIndexRepairPeriod.count());
  }
  return kIndexRepairPeriod;
}

class Drainer {
 public:
  // `repair`: the index whose online repair this session runs (nullptr:
  // none, e.g. a client of the index service, whose server owns the index).
  Drainer(NodeHeap& heap, std::chrono::milliseconds period, PrefixIndex* index, PrefixIndex* repair)
      : thread_([this, &heap, period, index, repair] {
          pthread_setname_np(pthread_self(), "cxlkv-drainer");
          std::unique_lock<std::mutex> lk(mu_);
          auto next_pins = std::chrono::steady_clock::now();
          const auto repair_period = index_repair_period();
          auto next_repair = std::chrono::steady_clock::now() + repair_period;
          while (!cv_.wait_for(lk, period, [this] { return stop_; })) {
            lk.unlock();
            if (index && std::chrono::steady_clock::now() >= next_pins) {
              next_pins = std::chrono::steady_clock::now() + kPinReclaimPeriod;
              if (auto r = index->reclaim_node_pins(); !r)
                log().debug("kv: dropping gone processes' pins: {}", r.error().message());
            }
            if (repair && repair_period.count() && std::chrono::steady_clock::now() >= next_repair) {
              next_repair = std::chrono::steady_clock::now() + repair_period;
              if (auto r = repair->repair_index(); !r)
                log().debug("kv: online index repair: {}", r.error().message());
            }
            // The recency stamps the store's optimistic reads owe (docs/coherence.md
            // "Optimistic reads"): here, never in a get, which must not wait for
            // the locks it went without (nor for a lock manager that is down).
            if (index) index->settle_reads(kSettleReadsMs);
            auto r = heap.drain_if_posted(std::chrono::milliseconds(100));  // bounded: the session can close
            if (!r) log().debug("kv: draining remote frees: {}", r.error().message());
            // Frees deferred for a lock out of reach (alloc/node_heap.cpp), once it comes.
            if (heap.deferred_frees()) (void)heap.retry_deferred_frees(std::chrono::milliseconds(100));
            lk.lock();
          }
        }) {}
  ~Drainer() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class RealSession final : public KvSession {
 public:
  KvStore& store() override { return *store_; }
  std::unique_ptr<NodeHeap> heap;
  std::unique_ptr<TwoTierStripeLocks> locks;
  std::unique_ptr<NodeTableLiveness> live;
  std::unique_ptr<HeapSpace> space;
  std::unique_ptr<IndexServiceClient> service;  // docs/rpc.md "The index service"
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<Drainer> drainer;  // declared last: stops first, before the heap goes
};

// docs/rpc.md "The index service": the pool's index mode (see KvIndexMode).
Result<KvIndexMode> resolve_index_mode(Region& pool, KvIndexMode asked) {
  if (asked != KvIndexMode::automatic) return asked;
  if (const char* e = std::getenv("CXLKV_INDEX_MODE"); e && *e) {
    const std::string m(e);
    if (m == "locks") return KvIndexMode::locks;
    if (m == "service") return KvIndexMode::service;
    if (m != "auto")
      return Error(-EINVAL, "kv: CXLKV_INDEX_MODE is '" + m + "'; expected locks, service or auto");
  }
  return pool.carve(kIndexServiceCarve) ? KvIndexMode::service : KvIndexMode::locks;
}

}  // namespace

Result<std::unique_ptr<KvSession>> open_kv_session(Region& pool, NodeContext& node, const KvOpenOptions& opts) {
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  if (!ic) return Error(ic.error().code(), "kv: pool " + pool.uri() + " has no index carve (format it first)");
  MemoryDomain& d = node.domain();
  void* carve = pool.at(ic->offset);
  auto hdr = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(carve));  // rule 4
  if (hdr.magic != CXLKV_INDEX_MAGIC)
    return Error(-ENODATA, "kv: pool " + pool.uri() + ": index carve is not formatted");
  CXLKV_TRY(check_index_header(hdr, ic->size, "kv: pool " + pool.uri() + ": index carve: "));  // docs/integrity.md "Checked metadata"
  if (hdr.lock_base + hdr.nstripes > node.control().max_locks())
    return Error(-EINVAL, "kv: index stripes need lock ids up to " + std::to_string(hdr.lock_base + hdr.nstripes) +
                              ", the pool has " + std::to_string(node.control().max_locks()));
  auto mode = resolve_index_mode(pool, opts.index_mode);
  if (!mode) return mode.error();
  auto s = std::make_unique<RealSession>();
  if (mode.value() == KvIndexMode::service) {
    if (opts.ssd_tier)
      return Error(-EOPNOTSUPP, "kv: pool " + pool.uri() + ": the SSD tier is not supported in index-service mode");
    RpcClientOptions ro;
    ro.timeout = std::chrono::milliseconds(5000);  // a batch of 256 on a loaded server
    auto b = IndexServiceClient::connect(node, ro, pool.uri());
    if (!b) return b.error();
    s->service = std::move(b.value());
  }
  auto heap = NodeHeap::open(node);
  if (!heap) return heap.error();
  s->heap = std::move(heap.value());
  s->locks = std::make_unique<TwoTierStripeLocks>(node, hdr.lock_base, hdr.nstripes);
  s->live = std::make_unique<NodeTableLiveness>(node);
  s->space = std::make_unique<HeapSpace>(*s->heap);
  cxlkv_node_entry me = d.read_fresh(node.control().node_entry(node.node()));  // rule 4
  KvDeps deps;
  deps.index_domain = &d;
  deps.index_carve = carve;
  deps.index_bytes = ic->size;
  deps.node = node.node();
  deps.incarnation = me.incarnation;
  deps.locks = s->locks.get();
  deps.liveness = s->live.get();
  deps.space = s->space.get();
  // docs/integrity.md "Checked metadata": payload only inside each device's kv carve.
  auto device = [](Region& r, MemoryDomain& dom) {
    PoolDevice dv{&dom, r.base(), r.size()};
    dv.region = &r;  // map_on_use pools: payload mapped block by block at first use
    if (auto kv = r.carve(CXLKV_CARVE_KV)) {
      dv.payload_lo = kv->offset;
      dv.payload_hi = kv->offset + kv->size;
    }
    return dv;
  };
  deps.devices.push_back(device(pool, d));
  for (Region* r : opts.extra_devices) deps.devices.push_back(device(*r, r->domain()));
  deps.ssd_tier = opts.ssd_tier;  // docs/eviction.md "The SSD tier"
  deps.demote_on_evict = opts.demote_on_evict;
  deps.promote_on_hit = opts.promote_on_hit;
  deps.index_backend = s->service.get();  // nullptr: lock-based
  auto kv = KvStore::create(std::move(deps));
  if (!kv) return kv.error();
  s->store_ = std::move(kv.value());
  // The node's pins are counted across its processes (index/node_pins.hpp).
  auto pins = NodePins::open(node.local().pins, "node " + std::to_string(node.node()) + "'s pin table (/dev/shm/" +
                                                    node.local_shm_name() + ")");
  if (!pins) return pins.error();
  CXLKV_TRY(store_index(*s->store_).set_node_pins(std::move(pins.value())));
  if (auto period = drain_period(); period.count())
    s->drainer = std::make_unique<Drainer>(*s->heap, period, &store_index(*s->store_),
                                           s->service ? nullptr : &store_index(*s->store_));
  return std::unique_ptr<KvSession>(std::move(s));
}

}  // namespace cxlkv
