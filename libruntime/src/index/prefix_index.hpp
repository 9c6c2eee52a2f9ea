// SPDX-License-Identifier: MIT
// PrefixIndex: the pool-wide table of KV blocks (layout: cxlkv/format/index_format.h).
//
// Protocol (DESIGN.md "Prefix index", coherence contract):
//  * Every change happens under the stripe's global lock (StripeLocks, the
//    sync layer's two-tier lock), as read-modify-write of one whole entry
//    line: read_fresh (rule 4) -> modify -> publish_line + fence (rule 1, 3).
//  * Lookups take no lock: they invalidate and load an entry line (rule 4),
//    validate its checksum (a torn line is re-read), and trust only READY.
//  * The cache is prefix-closed: a block is reserved only while its parent is
//    WRITING or READY (the parent's `children` count is raised first, under
//    the parent's stripe lock), published only after its parent is READY, and
//    evicted only when `children` is zero.  So along any chain the READY
//    blocks form a prefix, and the longest cached prefix is found by binary
//    search in O(log N) probes.
//  * Children counts: outside a lock holder's critical section, a live
//    entry's `children` equals the entries naming it as parent that are live
//    or pending drops (a removed child whose parent's stripe the remover did
//    not hold: a tombstone that keeps the parent's slot until a holder of
//    both stripes settles it).  No count is held by a process's memory alone
//    (a reserve that runs out of space pins a READY parent instead of
//    keeping its count raised).  So while a parent's stripe lock is held no
//    entry naming it can appear or go, and the count found then is the
//    truth, with every node live: the online repair (repair_index) sets it,
//    and a count left by a holder killed mid-change lasts until its next run.
//  * Crash safety: WRITING entries carry owner node + incarnation and pins are
//    a per-node bit mask; entries of nodes that NodeLiveness reports dead are
//    reclaimed / unpinned by whoever meets them, so nothing stays blocked.
//  * Pins of one node's processes (node_pins.hpp): each index counts its own
//    pins of a slot (local_pins_); with node pins set (KV sessions: the
//    node-local pin section), the node's bit is cleared only when no index
//    of the node pins the slot, and a dead process's pins are dropped by the
//    node's live ones (reclaim_node_pins).  Without them (tests' simulated
//    nodes) the index is its node's only pinner, as before.
//  * Lock order: a call takes the stripe locks it needs once, all together,
//    in ascending stripe order (StripeLockSet), and takes no other lock while it
//    holds them; a call needing a lock it does not hold (a parent's
//    `children` drop after an eviction, a victim in another stripe) releases
//    its set first.  So waits-for edges always go from a lower to a higher
//    stripe: no deadlock.
//  * Eviction (index_evict.cpp): pool-wide capacity; each stripe keeps its
//    READY memory leaves on two lists in the pool (cold: seen by one
//    request; hot: reused), uapi cxlkv_index_ext; the victim is the oldest
//    cold tail over all stripes unless a hot tail is far older, with lazy
//    promotion of tails used since they were linked; prefix closure holds
//    because only leaves are listed.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "cxlkv/keys.hpp"
#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "cxlkv/format/index_format.h"

namespace cxlkv {

// Where a block's payload lives (the index entry's location fields).
struct BlockLocation {
  uint64_t offset = 0;  // byte offset (MEM) or LBA (SSD)
  uint32_t length = 0;  // payload bytes
  uint8_t device = 0;   // device index or CXLKV_LOC_DEV_INTERLEAVED
  uint8_t tier = CXLKV_TIER_MEM;
};

// Cross-host mutual exclusion per stripe.  The real implementation is the
// sync layer's two-tier lock (lock id = header.lock_base + stripe).
class StripeLocks {
 public:
  virtual ~StripeLocks() = default;
  virtual Result<void> lock(uint32_t stripe) = 0;
  virtual void unlock(uint32_t stripe) = 0;
  // Several stripes in one call (a batch; `stripes` ascending, distinct):
  // all or nothing.  The default takes them one at a time; the sync layer's
  // implementation is one multi-lock acquire (cxlkv::LockSet).
  virtual Result<void> lock_many(std::span<const uint32_t> stripes) {
    for (size_t i = 0; i < stripes.size(); i++)
      if (auto r = lock(stripes[i]); !r) {
        for (size_t j = i; j-- > 0;) unlock(stripes[j]);
        return r.error();
      }
    return {};
  }
  // Releases what one lock_many() took (descending order).
  virtual void unlock_many(std::span<const uint32_t> stripes) {
    for (size_t i = stripes.size(); i-- > 0;) unlock(stripes[i]);
  }
  // A hint: taking `stripe` now is cheap (no cross-host round trip).  Locks
  // of one process (tests, the offline repair) always are; the two-tier
  // locks are while this node keeps the stripe's grant (TwoTierLock::kept).
  // The index's reads choose their path by it (docs/coherence.md
  // "Optimistic reads"); correctness never depends on it.
  virtual bool cheap(uint32_t /*stripe*/) const { return true; }
  // A hint: taking `stripe` now needs no lock manager round trip (the node
  // has its grant: TwoTierLock::node_has_grant).  Locks of one process
  // always do.  PrefixIndex::lock_ahead skips a batch whose stripes all do.
  virtual bool node_has(uint32_t /*stripe*/) const { return true; }
};

// Is the process that attached as (node, incarnation) still alive?
class NodeLiveness {
 public:
  virtual ~NodeLiveness() = default;
  virtual bool alive(uint32_t node, uint32_t incarnation_lo) = 0;
  // Any live incarnation of `node` (for pin bits, which carry no incarnation).
  virtual bool node_alive(uint32_t node) = 0;
};

// Payload space for blocks: the index allocates under the stripe lock at
// reserve and frees at eviction / abort / reclaim.
class PayloadSpace {
 public:
  virtual ~PayloadSpace() = default;
  virtual Result<BlockLocation> alloc(uint64_t bytes) = 0;  // -ENOSPC when full
  // After alloc() failed with -ENOSPC: can evicting more blocks still make
  // room?  false when the space evictions free is held by a live node that
  // does not drain it (docs/eviction.md "Remote frees"); a reserve then stops
  // after its usual rounds instead of evicting that node's blocks for nothing.
  virtual bool evicting_can_help() { return true; }
  virtual void free(const BlockLocation& loc) = 0;
  // Space of a reservation taken from (node, incarnation low bits) declared
  // dead (docs/integrity.md "Quarantine"): a paused process of that node may still store into it
  // when it resumes, so an implementation quarantines what others could
  // reuse (cxlkv/format/alloc_format.h) instead of freeing it.
  virtual void free_taken(const BlockLocation& loc, uint32_t node, uint32_t incarnation_lo) {
    (void)node;
    (void)incarnation_lo;
    free(loc);
  }
  // Block owners (docs/integrity.md "Block owners: overlapping entries"; cxlkv/format/alloc_format.h "Block owners"): index slot
  // `slot` now holds the block at `loc` (called under the stripe lock after
  // alloc, before the entry naming it is written: the entry's publication
  // covers the record, rule 3).  free() / free_taken() clear it.
  virtual void claim(const BlockLocation& loc, uint32_t slot) {
    (void)loc;
    (void)slot;
  }
  // Does the space record `slot` as the holder of the block at `loc`?  One
  // fresh read of the record (no scan).  A space that keeps no records
  // (tests' spaces) says yes.
  struct Owner {
    bool ok = true;
    uint32_t slot = 0xffffffffu;  // the recorded holder (CXLKV_INDEX_NO_SLOT: none)
    uint32_t length = 0;           // its recorded payload length
    std::string why;               // when !ok: what the record says
    int32_t code = -EIO;           // when !ok: -EIO (another block's space), -EBADMSG (not where a block starts)
  };
  virtual Owner owner_check(const BlockLocation& loc, uint32_t slot) {
    (void)loc;
    (void)slot;
    return {};
  }
  // After a fetch's copy (docs/integrity.md "Space reuse seen at fetch"): is the space of each block
  // (memory tier; slots[i] holds locs[i]) still allocated as that block?
  // The allocation is unchanged as long as its chunk descriptors still
  // describe it and, for a block with an owner record, the record still
  // names its slot; a later allocation of any part of it (damaged
  // allocator metadata handing out published space) changes one of them
  // before its bytes land (the allocator and the reserve write them
  // first, rule 3).  All lines are read in one sweep with one fence
  // (rule 4).  out[i].ok false: the bytes read may be another block's.
  // A space that keeps no records (tests' spaces) says yes.
  virtual void still_allocated(std::span<const BlockLocation> locs, std::span<const uint32_t> slots,
                               std::span<Owner> out) {
    (void)locs;
    (void)slots;
    for (Owner& o : out) o = Owner{};
  }
};

struct IndexFormatOptions {
  uint32_t max_nodes = 16;
  uint32_t stripe_slots = 0;  // 0: auto (power of two, >= 64)
  // Stripe s uses global lock id lock_base + s.  Default: the runtime-layer
  // range of uapi/cxlkv_ctrl.h (72..127): 48 stripes -> 72..119; 120..127
  // stay free for the tier layer.
  uint32_t max_stripes = 48;
  uint32_t lock_base = 72;
  uint64_t max_blocks = 0;
  uint64_t max_bytes = 0;
  uint32_t interleave_stripe = 64 << 10;
  uint8_t ndevices = 1;
  uint8_t weights[CXLKV_INDEX_MAX_DEVICES] = {1, 1, 1, 1, 1, 1, 1, 1};
};

// Initialise an index carve of `bytes` at `carve` (called by format_pool()).
// Zeroes the table and writes header + config with flushes (rule 3).
Result<void> index_format(MemoryDomain& d, void* carve, uint64_t bytes, const IndexFormatOptions& o);

// Change the pool-wide policy (capacity limits, interleave set) of a
// formatted index; operator action while no worker runs.  Keeps epoch_ms.
struct IndexPolicy {
  uint64_t max_blocks = 0;
  uint64_t max_bytes = 0;
  uint32_t interleave_stripe = 64 << 10;
  uint8_t ndevices = 1;
  uint8_t weights[CXLKV_INDEX_MAX_DEVICES] = {1, 1, 1, 1, 1, 1, 1, 1};
};
Result<void> index_set_policy(MemoryDomain& d, void* carve, const IndexPolicy& p);
Result<cxlkv_index_config> index_policy(MemoryDomain& d, const void* carve);

enum class ReserveStatus { reserved, exists_ready, busy };

// Reservations and pins carry the entry version they saw (fencing; docs/integrity.md "Fencing: handles carry the entry version").
struct Reservation {
  ReserveStatus status = ReserveStatus::busy;
  uint32_t slot = CXLKV_INDEX_NO_SLOT;
  BlockLocation loc;  // valid when reserved / exists_ready
  uint32_t version = 0;
};

struct PinnedBlock {
  uint32_t slot = CXLKV_INDEX_NO_SLOT;
  BlockLocation loc;
  uint32_t version = 0;
};

// Per-block statuses of the batch calls (docs/coherence.md "PrefixIndex
// batch interface"; same values as the CXLKV_KV_* macros of cxlkv.h).
constexpr int32_t kBlockReserved = 0, kBlockExists = 1, kBlockBusy = 2, kBlockMiss = 3;

struct IndexCounters {  // what index operations did (KvStore turns these into stats)
  uint64_t evictions = 0, reclaims = 0;
  uint64_t demotions = 0, promotions = 0;  // SSD tier hooks (docs/eviction.md "The SSD tier")
  uint64_t second_chances = 0;     // list tails found used since linked, moved to the head
  uint64_t victim_reads = 0;       // entry reads spent choosing victims (cost per eviction)
  uint64_t scan_evictions = 0;     // victims found by the fallback window scan
  uint64_t lease_expiries = 0;     // leases this process found ended by ttl or consumer death
  uint64_t list_repairs = 0;       // stripes whose list a dead holder left dirty, rebuilt
  // Pins refused because the entry's location is not the block the
  // allocator records for it (it overlaps another entry's block: damaged or forged).
  uint64_t overlap_refusals = 0;
  // The online repair (repair_index): what it found left by dead processes.
  uint64_t repair_runs = 0, stale_counts_fixed = 0, dead_writes_reclaimed = 0, drops_settled = 0;
};

// ---- SSD tier hook (docs/eviction.md "The SSD tier"; the tier layer is libruntime/src/tier/) -------
// With a DemotionTarget set, eviction demotes: an unpinned READY leaf in
// memory is copied to the SSD tier and stays READY at its SSD location
// instead of being dropped, so prefix closure and pins are untouched (the
// entry never leaves READY).  Memory blocks are chosen before SSD blocks;
// an SSD block is dropped only when no memory block can go, or to make room
// when the SSD tier is full.  SSD locations are freed through release().
class DemotionTarget {
 public:
  virtual ~DemotionTarget() = default;
  // Copies the payload at `mem` to the SSD tier; its new location, or
  // -ENOSPC when the tier is full (the block is then evicted as before).
  // `key` is the block's (docs/integrity.md "The SSD tier"; the SSD tier records it with the block).
  virtual Result<BlockLocation> demote(const BlockKey& key, const BlockLocation& mem) = 0;
  virtual void release(const BlockLocation& ssd) = 0;
};

struct IndexEntryView {
  BlockKey key;
  uint32_t state = 0;
  BlockLocation loc;
  uint32_t parent_slot = CXLKV_INDEX_NO_SLOT, children = 0;
  uint64_t pin_mask = 0;
  uint32_t owner_node = 0, owner_inc = 0, lru_ms = 0, version = 0;
  // extension record (eviction list, lease)
  bool linked = false;
  uint32_t lease_count = 0, lease_node = CXLKV_LEASE_NODE_ANY, lease_start_ms = 0, lease_expiry_ms = 0;
  uint64_t lease_consumer = 0;
};

struct IndexUsage {
  uint64_t slots = 0, stripes = 0, used_blocks = 0, used_bytes = 0, evictions = 0, reclaims = 0,
           tombstones = 0, lease_expiries = 0, lease_dead = 0, leased = 0;
  uint64_t by_state[5] = {};
};

class NodePins;  // index/node_pins.hpp

namespace index_detail {
class StripeLockSet;  // index/stripe_lock_set.hpp (not the sync layer's cxlkv::LockSet)
}

// The index's batch calls (docs/coherence.md "PrefixIndex batch
// interface"), the one interface a KV store makes its locking index calls
// through: PrefixIndex itself (this process takes the stripe locks) or the
// index service's client (kv/index_service.hpp: the same calls over the
// shared-memory RPC to the process that owns the index; docs/rpc.md "The
// index service").  Both act on the same on-pool index, so statuses,
// locations and chain semantics are the same.  The calls are documented on
// PrefixIndex below.
class IndexBatchOps {
 public:
  virtual ~IndexBatchOps() = default;
  virtual Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                       std::span<Reservation> out, std::span<int32_t> status,
                                       bool through_busy = false) = 0;
  virtual Result<size_t> publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                      std::span<int32_t> status) = 0;
  // publish_many that also checks each entry's version and location under
  // the stripe lock; false where the calls cannot (the index service's
  // protocol carries no versions): the store then checks the handles itself
  // before publishing.
  virtual bool publish_checks_versions() const { return false; }
  virtual Result<size_t> publish_many(std::span<const Reservation> handles, std::span<const BlockKey> keys,
                                      std::span<int32_t> status);
  virtual Result<size_t> abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                    std::span<int32_t> status) = 0;
  virtual Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                  std::span<int32_t> status) = 0;
  virtual Result<size_t> unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                    std::span<int32_t> status) = 0;
  // The lookups of a get whose pins never leave the call (docs/coherence.md
  // "Optimistic reads"): as pin_many, pinned[i] = 1.  With `optimistic`, a
  // key whose stripe is not cheap to lock may instead be found by a
  // lock-free fresh probe and left unpinned (pinned[i] = 0): the caller
  // must check after its copy that the entry is unchanged and discard the
  // bytes otherwise.  This default pins every key.
  virtual Result<size_t> read_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                   std::span<int32_t> status, std::span<uint8_t> pinned, bool optimistic);
  // Writes the recency the optimistic reads owe (pending for `min_age_ms`
  // or more; 0: all now).  Nothing where reads are never optimistic.
  virtual void settle_reads(uint32_t /*min_age_ms*/) {}
  // Take and drop the locks of `keys` ahead of several calls on them;
  // nothing where the locks are not this process's to take (the index
  // service takes its own).
  virtual void lock_ahead(std::span<const BlockKey> /*keys*/) {}
  // The node and incarnation (low 32 bits) that own reservations made
  // through these calls (the handle check of docs/integrity.md "Fencing:
  // handles carry the entry version"): this node for the lock-based path,
  // the serving node for the service.
  virtual void reservation_owner(uint32_t* node, uint32_t* incarnation) const = 0;
  // "locks" or "service" (metrics, messages).
  virtual const char* mode() const = 0;
  // The message for a block that the last batch call refused with `code`
  // (empty: none better than the code's name).  The lock-based path keeps
  // the first failure's message in this thread; the index service's
  // refusals come back as codes only, so its client names the pool, the
  // service and the cause the code stands for (docs/integrity.md "Checked
  // metadata").
  virtual std::string block_message(const char* op, const BlockKey& key, int32_t code) const;
};

class PrefixIndex final : public IndexBatchOps {
 public:
  // Attach to a formatted index carve.  Fails with a message if the carve is
  // not formatted (bad magic / version / geometry).
  static Result<std::unique_ptr<PrefixIndex>> attach(MemoryDomain& d, void* carve, uint64_t bytes,
                                                     uint32_t node, uint64_t incarnation,
                                                     StripeLocks& locks, NodeLiveness& live,
                                                     PayloadSpace& space);

  ~PrefixIndex();
  const cxlkv_index_header& header() const { return hdr_; }
  const cxlkv_index_config& config() const { return cfg_; }
  uint32_t node() const { return node_; }

  // ---- lock-free reads ---------------------------------------------------
  // Slot of `key` in state READY, or NO_SLOT.
  uint32_t find_ready(const BlockKey& key, BlockLocation* loc = nullptr) const;
  // Any live state (WRITING / READY / EVICTING) -> that state, else EMPTY.
  uint32_t find_state(const BlockKey& key, uint32_t* slot = nullptr) const;
  // Number of leading READY blocks of `chain`: binary search (O(log N)
  // probes; relies on prefix closure) or a linear scan (for comparison).
  size_t longest_prefix(std::span<const BlockKey> chain) const;
  size_t longest_prefix_linear(std::span<const BlockKey> chain) const;
  uint64_t probes() const { return probes_.load(std::memory_order_relaxed); }  // lock-free entry reads so far
  // Entry lines found damaged (checksum never validates) by this process.
  uint64_t damaged_lines() const { return damaged_lines_.load(std::memory_order_relaxed); }

  // ---- updates (each takes the stripe locks it needs) ---------------------
  // Reserve `key` (child of `parent`, or a root when parent is null) for
  // `bytes` of payload.  exists_ready / busy: someone else has it (never
  // written twice).  Errors: -ENOENT parent not cached, -ENOSPC nothing
  // evictable, -EINVAL bad key / length.
  Result<Reservation> reserve(const BlockKey& key, const BlockKey* parent, uint64_t bytes);
  // WRITING -> READY.  The payload must already be in memory (flushed and
  // fenced).  -EAGAIN while the parent is still WRITING; -EOWNERDEAD if the
  // parent's writer died (abort then).
  Result<void> publish(uint32_t slot, const BlockKey& key);
  // Give up a reservation: frees payload, no visible block remains.
  Result<void> abort(uint32_t slot, const BlockKey& key);
  // Pin a READY block for reading (this node's bit; counted per index, and
  // with node pins across the node's processes: the bit goes with the
  // node's last pin).
  // -ENOENT if it is not READY (evicted meanwhile).
  Result<BlockLocation> pin(const BlockKey& key, uint32_t* slot_out = nullptr);
  Result<void> unpin(uint32_t slot, const BlockKey& key);
  // Evict one unpinned READY leaf (or reclaim a dead writer's entry) of
  // `stripe`; false if none.  Used under pressure and by tests.
  Result<bool> evict_one(uint32_t stripe);
  // Evict the pool-wide least recently used evictable leaf; false if none.
  Result<bool> evict_any();
  // Remove every entry left by dead writers and every dead node's pin bit
  // (and, with node pins, the pins of this node's gone processes): the
  // gone processes' pins, then repair_index().  Returns what it changed.
  Result<uint64_t> reclaim_dead();
  // The online repair (top of this file, "Children counts";
  // index_repair.cpp), run while other nodes work: a lock-free sweep of the
  // table finds suspects (pending drops, counts that disagree with the
  // entries naming them, WRITING blocks of dead writers, EVICTING
  // leftovers, pin bits of dead nodes, stripe lines left dirty); their
  // stripes and their parents' are then taken in one lock set (whose
  // acquire rebuilds a dirty stripe's lists), where the counts are exact: pending
  // drops are settled, every count is set to the entries (live or pending)
  // naming it, dead writers' WRITING blocks go leaf first.  Bounded rounds;
  // nothing is locked when the sweep finds nothing.
  struct RepairReport {
    uint64_t drops_settled = 0, counts_fixed = 0, writing_reclaimed = 0, evicting_finished = 0, pins_cleared = 0;
    uint64_t total() const {
      return drops_settled + counts_fixed + writing_reclaimed + evicting_finished + pins_cleared;
    }
  };
  Result<RepairReport> repair_index();
  // ---- pins of this node's processes (node_pins.hpp) -------------------------
  // From now on this index's pins are counted with the other processes' of
  // its node in `pins` (its record; the index owns it and gives it back when
  // it goes).  Call before the first pin.  Reclaims gone processes' pins once.
  Result<void> set_node_pins(std::unique_ptr<NodePins> pins);
  NodePins* node_pins() const { return node_pins_.get(); }
  // Drop the pins of this node's processes that are gone (killed, or their
  // store closed with pins left): each slot no live index of the node pins
  // any more loses the node's bit.  Returns the bits cleared.
  Result<uint64_t> reclaim_node_pins();
  // Drop one READY block on an operator's request (cxlkvctl kv rm; in
  // index_remove.cpp): -ENOENT not cached, -ENOTEMPTY it has cached children
  // (prefix closure: remove them first), -EBUSY a live node pins or leases it.
  Result<void> remove(const BlockKey& key);
  IndexCounters counters() const { return ctr_; }
  // Offline repair of a children count (index_repair.cpp; cxlkvctl kv check
  // --repair, index_check.hpp): under the slot's stripe lock, the live entry
  // at `slot`, if it still holds `key` with count `expected` (as a snapshot
  // found it), gets count `children`, and its list membership follows as
  // child_added / child_dropped leave it: a READY memory block without
  // children joins its stripe's eviction list (link_leaf), one with children
  // leaves it.  Right only while no other node changes the index (the count
  // found is then the truth).  false: the entry changed since the snapshot,
  // nothing written.  *listed: the block is now on an eviction list.
  Result<bool> set_children(uint32_t slot, const BlockKey& key, uint32_t expected, uint32_t children,
                            bool* listed = nullptr);

  // ---- batches (docs/coherence.md "PrefixIndex batch interface") ---------------
  // keys[0] is a child of `parent` (nullptr: a root), keys[i] a child of
  // keys[i-1].  Fills out[i] and status[i]; stops at the first block that can
  // be neither reserved nor found (status -ECANCELED after it); blocks
  // already reserved stay reserved.  Returns the number of leading blocks
  // that are RESERVED or EXISTS.
  //
  // A BUSY block (WRITING, by another request or node) stops the chain
  // unless `through_busy`: then it keeps its status kBlockBusy and the blocks
  // below it are found or reserved as usual (a child may be reserved below a
  // WRITING parent; its publish returns -EAGAIN until that parent's writer
  // publishes it, and -EOWNERDEAD if that writer died: abort then).  Its
  // writer cannot abort it while our reservations hang below it (abort_many
  // says -EBUSY), so a caller passing through_busy must publish or abort its
  // blocks below a BUSY one promptly.  The return value still counts leading
  // RESERVED / EXISTS blocks only (it stops at the first BUSY one).
  Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                               std::span<Reservation> out, std::span<int32_t> status,
                               bool through_busy = false) override;
  // Takes the stripe locks of `keys` in one multi-lock acquire and releases
  // them at once, changing nothing.  The grants the node keeps afterwards
  // (sticky grants: docs/coherence.md "Multi-lock acquire", uapi/cxlkv_ctrl.h
  // "Sticky grants") spare the batch calls that follow (one per chain of a
  // step) a lock manager round trip each: one round trip for the step.
  // Best effort: a lock that cannot be had now is the later call's to wait for.
  void lock_ahead(std::span<const BlockKey> keys) override;
  // Each handles blocks independently (status per block); returns how many
  // succeeded.  publish_many publishes in the given order (a chain parent
  // first), so a child whose parent is published earlier in the call succeeds.
  Result<size_t> publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                              std::span<int32_t> status) override;
  // publish_many of reservations (slot, location, version) that also fences
  // each block by its handle (docs/integrity.md "Fencing: handles carry the entry version"): a block whose entry no longer has
  // the version and location its reservation carries (reclaimed and
  // reserved again) fails with -ESTALE.  The check is the fresh read publish
  // makes under the stripe lock anyway, so the KV store's put_chain needs no
  // handle check of its own after the copy.
  Result<size_t> publish_many(std::span<const Reservation> handles, std::span<const BlockKey> keys,
                              std::span<int32_t> status) override;
  bool publish_checks_versions() const override { return true; }
  Result<size_t> abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override;
  Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                          std::span<int32_t> status) override;
  Result<size_t> unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override;
  Result<size_t> read_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out, std::span<int32_t> status,
                           std::span<uint8_t> pinned, bool optimistic) override;
  void settle_reads(uint32_t min_age_ms) override;
  size_t reads_owed() const;  // recency stamps not yet written (tests)
  void reservation_owner(uint32_t* node, uint32_t* incarnation) const override {
    *node = node_;
    *incarnation = inc_lo_;
  }
  const char* mode() const override { return "locks"; }
  // ---- handoff leases (index_lease.cpp) ---------------------------------------
  // A producer leases READY blocks for a consumer (a request id; the
  // consuming node or kLeaseNodeAny): they are not evicted (nor demoted)
  // until the consumer releases them, ttl_ms passes, or the consumer node is
  // dead.  A block leased by several consumers keeps one record: a count, the
  // latest expiry, the first consumer id, and node "any" when their nodes
  // differ.  status[i]: 0 leased, kBlockMiss not cached (READY), -errno.
  static constexpr uint32_t kLeaseNodeAny = 0xffffffffu;
  Result<size_t> lease_many(std::span<const BlockKey> keys, uint64_t consumer, uint32_t consumer_node,
                            uint32_t ttl_ms, std::span<int32_t> status);
  // status[i]: 0 released, -ENOENT not leased (or not to this consumer),
  // -ETIMEDOUT the lease had expired / its consumer node was declared dead
  // (released all the same), kBlockMiss block not cached.
  Result<size_t> release_many(std::span<const BlockKey> keys, uint64_t consumer, std::span<int32_t> status);
  struct LeaseView {
    BlockKey key;
    uint32_t slot = 0, count = 0, node = kLeaseNodeAny;
    uint64_t consumer = 0;
    uint32_t age_ms = 0;          // since the first lease of the record
    int64_t expires_in_ms = 0;    // negative: expired
    bool live = false;            // still protects the block (not expired, node alive)
  };
  std::vector<LeaseView> leases() const;  // lock-free snapshot for display

  // Message of the first failed block of this thread's last batch call.
  static std::string last_block_message();
  // Is slot still holding `key` in `state` at `version`?  One fresh read (rule 4).
  bool still_valid(uint32_t slot, const BlockKey& key, uint32_t state, uint32_t version) const;
  // The entry lines of `slots` read fresh in one invalidation sweep and one
  // fence (rule 4), for the KV store's handle checks of a batch (in
  // index_fresh.cpp).  out[i]: the entry (the ext fields are not read);
  // an out-of-range slot gives an EMPTY view.
  void entries_fresh(std::span<const uint32_t> slots, std::span<IndexEntryView> out) const;

  // ---- SSD tier hooks (docs/eviction.md "The SSD tier") --------------------------------------------
  void set_demotion(DemotionTarget* t) { demotion_ = t; }
  // Promotion: block `key` at `slot`, READY at `from`, moves to `to`, whose
  // payload the caller has already written (and fenced, rule 3).  Only when
  // the caller's pin is the block's only pin (nobody else may be reading
  // `from`).  false: not moved, the caller frees `to`; true: the caller
  // releases `from`.
  Result<bool> relocate(uint32_t slot, const BlockKey& key, const BlockLocation& from, const BlockLocation& to);
  // The payload of block `key` at `slot`, READY at `at`, failed
  // its checks (an SSD block whose header names another key, or a bad
  // checksum): remove the entry so later lookups miss instead of failing
  // again.  The caller's pin on it is consumed.  Only a leaf that no other
  // live node or local pin holds is removed (prefix closure, readers);
  // false: left in place (it will miss again, and go once it is a leaf).
  Result<bool> drop_damaged(uint32_t slot, const BlockKey& key, const BlockLocation& at);

  // ---- inspection ----------------------------------------------------------
  IndexUsage usage() const;            // lock-free snapshot
  // Consistency of the eviction lists with the entries (tests, cxlkvctl):
  // number of problems found; meaningful only while no node changes the index.
  uint64_t audit_lists(std::string* first_problem = nullptr) const;
  IndexEntryView entry(uint32_t slot) const;
  uint32_t stripe_of(const BlockKey& k) const;

 private:
  friend class index_detail::StripeLockSet;
  using StripeLockSet = index_detail::StripeLockSet;
  PrefixIndex();  // out of line (node_pins_ is of an incomplete type here)
  cxlkv_index_entry* slot_ptr(uint32_t slot) const;
  cxlkv_index_stripe* stripe_ptr(uint32_t stripe) const;
  cxlkv_index_ext* ext_ptr(uint32_t slot) const;
  // ---- codec (index_entry.cpp) ----------------------------------------------
  // rule 4 read of one line; re-read until its checksum is valid.
  cxlkv_index_entry read_entry(uint32_t slot) const;
  cxlkv_index_entry read_entry_fresh(uint32_t slot) const;  // memory, never a lock set's copy
  // rule 1/3: seal (version, check), publish_line, fence.  Returns the
  // version written (bumped unless `bump` is false).
  uint32_t write_entry(uint32_t slot, cxlkv_index_entry e, bool bump = true);
  void write_empty(uint32_t slot);
  cxlkv_index_stripe read_stripe(uint32_t stripe) const;
  void write_stripe(uint32_t stripe, const cxlkv_index_stripe& s);
  // All stripe lines in one invalidation sweep and one fence (rule 4).
  std::vector<cxlkv_index_stripe> read_stripes() const;
  cxlkv_index_ext read_ext(uint32_t slot) const;  // under the stripe lock
  void write_ext(uint32_t slot, const cxlkv_index_ext& x);  // NT, under the stripe lock
  uint32_t home(const BlockKey& k) const;
  uint32_t now_ms() const;
  bool pins_live(cxlkv_index_entry& e, bool* changed);
  bool writer_dead(const cxlkv_index_entry& e);
  // Probe the key's stripe (its lock held or not): slot of a live entry of
  // `key` (else NO_SLOT) and the first reusable slot before the probe ended.
  // ghost: set when a tombstone on the way still holds `key` (it was evicted).
  uint32_t probe(const BlockKey& key, cxlkv_index_entry* e, uint32_t* free_slot, bool* ghost = nullptr) const;

  // ---- under a StripeLockSet (index_evict.cpp) ------------------------------------
  void link(StripeLockSet& ls, uint32_t slot, uint32_t ms, bool at_head);
  void unlink(StripeLockSet& ls, uint32_t slot);
  void child_added(StripeLockSet& ls, uint32_t parent_slot);
  // Children count down; a READY memory block left without children joins the list.
  // reused_child: the child that went was reused, so the parent was too.
  void child_dropped(StripeLockSet& ls, uint32_t parent_slot, bool reused_child = false);
  // A READY memory block `e` at `slot` that just became a leaf joins its list
  // by its last read (child_dropped, set_children).
  void link_leaf(StripeLockSet& ls, uint32_t slot, const cxlkv_index_entry& e);
  void mark_reused(uint32_t slot);  // sets ext REUSED (under the stripe lock)
  void repair_stripe(StripeLockSet& ls, uint32_t stripe);  // rebuild the lists + counters from the entries
  // Remove entry at slot (payload freed).  A parent in a held stripe has its
  // children count dropped at once; else the entry stays a pending drop (a
  // tombstone naming the parent) and `slot` is appended to `parents` for
  // drop_children() after unlocking.
  void remove_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, bool reclaim,
                     std::vector<uint32_t>* parents);
  // The pending drop at `child`, when `ls` holds its stripe and its
  // parent's: the parent's count drops and the tombstone names no parent
  // any more.  false: not a pending drop (settled already), or a stripe not held.
  bool settle_drop(StripeLockSet& ls, uint32_t child, bool reused);
  // Empty plain tombstones from `slot` backwards (pending drops stay).
  void trim_tombstones(StripeLockSet& ls, uint32_t slot);
  // The online repair (index_repair.cpp): see repair_index().
  uint64_t repair_locked(StripeLockSet& ls, RepairReport& rep, std::vector<uint32_t>* parents);
  void sweep_entries(std::vector<cxlkv_index_entry>& all) const;  // the table, lock-free (rule 4)
  bool dead_pins(const cxlkv_index_entry& e);  // a READY entry with pin bits of dead nodes
  // A WRITING entry the repair takes: its writer is dead (index_repair.cpp).
  bool dead_writing(const cxlkv_index_entry& e, uint32_t now);
  // The count of the live entry `e` at `slot` becomes `children`; its list
  // membership follows (a READY memory leaf is listed).  true: a leaf now.
  bool set_count_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, uint32_t children);
  // A READY block pinned by this index under the held set (reserve_locked).
  bool pin_locked(StripeLockSet& ls, uint32_t slot);
  // Evict from the tail of the stripe's hot or cold list (lazy promotion of
  // used tails); a tail's key is its linked_ms (+ bonus on the hot list):
  // false if no victim whose key <= limit was found in a few steps.
  bool evict_from_list(StripeLockSet& ls, uint32_t stripe, bool hot, std::vector<uint32_t>* parents, uint64_t limit,
                       uint64_t bonus);
  // Read n consecutive entries in one invalidation sweep and one fence (rule 4).
  void read_window(uint32_t first, uint32_t n, cxlkv_index_entry* out) const;
  Result<bool> evict_locked(StripeLockSet& ls, uint32_t stripe, std::vector<uint32_t>* parents);
  enum class EvictFrom { any, mem, ssd };  // which tier's blocks a pass may choose (docs/eviction.md "The SSD tier")
  Result<bool> evict_pass(StripeLockSet& ls, uint32_t stripe, std::vector<uint32_t>* parents, EvictFrom from);
  bool demote_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, std::vector<uint32_t>* parents);
  // The stripe lines as one call last saw them: read in one sweep (rule 4)
  // at the start of the call, then kept current with the lines this call
  // wrote (copied from its LockSets before they release), so a reserve that
  // evicts sweeps the stripe lines once, not once per capacity check.
  // Other nodes' changes since the sweep are not in it: capacity is checked
  // against each reserve's own sweep, and concurrent reservers can pass it
  // by their in-flight chains until the next reserve's sweep.
  struct PoolView {
    std::vector<cxlkv_index_stripe> st;
    void take(const StripeLockSet& ls);  // the held stripes' current lines
  };
  PoolView pool_view() const { return PoolView{read_stripes()}; }
  // One victim pool-wide: the oldest list tail over all stripes (of `view`,
  // else one sweep of the stripe lines), or only over the stripes `held` holds.
  Result<bool> evict_global(std::vector<uint32_t>* parents, StripeLockSet* held, PoolView* view = nullptr);
  // Evict ahead of demand until `blocks` more blocks / `bytes` fit the
  // pool-wide capacity (or nothing evictable is left).  No lock held.
  Result<void> make_room(uint64_t blocks, uint64_t bytes, PoolView* view = nullptr);
  // Settles the pending drops of `removed` (slots remove_locked() left
  // naming a parent in a stripe it did not hold).  No lock held.
  Result<void> drop_children(std::vector<uint32_t>& removed, PoolView* view = nullptr);
  bool lease_live(cxlkv_index_ext& x, uint32_t now, bool* ended_dead);
  // Pool-wide usage: sweep of the stripe lines, held stripes from `ls`.
  void pool_used(const StripeLockSet* ls, uint64_t* blocks, uint64_t* bytes) const;
  bool over_capacity(const StripeLockSet* ls, uint64_t add_blocks, uint64_t add_bytes) const;
  // The same against `view` (no sweep), held stripes from `ls`.
  bool over_capacity(const PoolView& view, const StripeLockSet* ls, uint64_t add_blocks, uint64_t add_bytes) const;

  // ---- batch internals (index_batch.cpp) -------------------------------------
  // Reserve keys[from..) under the held set; returns index of the first block
  // not settled or keys.size().  Its steps are ReserveCall's.
  struct ReserveCall;
  size_t reserve_locked(StripeLockSet& ls, const BlockKey* pkey, std::span<const BlockKey> keys, size_t from,
                        uint64_t bytes, std::span<Reservation> out, std::span<int32_t> status,
                        std::vector<uint32_t>* parents, bool* need_reclaim,
                        std::vector<std::pair<uint32_t, BlockKey>>* pinned,
                        const PoolView& view, bool through_busy);
  void block_error(int32_t code, std::string msg);
  // The first slots of `key`'s probe sequence (read in a StripeLockSet's sweep).
  void probe_lines(const BlockKey& key, std::vector<uint32_t>& out) const;
  void prefetch_probes(StripeLockSet& ls, const BlockKey* pkey, std::span<const BlockKey> keys);
  Result<size_t> publish_checked(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                 std::span<const Reservation> handles, std::span<int32_t> status);
  // reserve_chain without the repair-and-retry of a full pool.
  Result<size_t> reserve_chain_once(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                    std::span<Reservation> out, std::span<int32_t> status, bool through_busy);
  static constexpr int64_t kRepairGapMs = 100;  // a full pool's repairs, at most one per this per index
  std::atomic<int64_t> repair_ms_{0};            // realtime ms of the last one
  static void begin_batch();  // remembers the first failure's message
  struct BatchFailure {
    int32_t code = 0;
    std::string msg;
  };
  static BatchFailure batch_failure();  // this thread's first failure so far
  static void set_batch_failure(const BatchFailure& f);
  // The capacity bound (max_blocks / max_bytes of the config line) as an
  // operator sets it now (`cxlkvctl kv ... --mem-capacity` on a pool in
  // service): read fresh at most every kCapacityRefreshMs (index_entry.cpp).
  void refresh_capacity();
  static constexpr int64_t kCapacityRefreshMs = 50;
  std::atomic<int64_t> capacity_read_ms_{0};  // steady-clock ms of the last read

  MemoryDomain* d_ = nullptr;
  std::byte* carve_ = nullptr;
  uint64_t bytes_ = 0;
  cxlkv_index_header hdr_{};
  cxlkv_index_config cfg_{};
  uint64_t ext_off_ = 0;
  uint32_t node_ = 0;
  uint32_t inc_lo_ = 0;
  StripeLocks* locks_ = nullptr;
  NodeLiveness* live_ = nullptr;
  PayloadSpace* space_ = nullptr;
  mutable std::atomic<uint64_t> probes_{0};
  // Damaged entry lines (docs/integrity.md "Checked metadata"; index_damage.cpp): a line whose checksum
  // does not validate after one bounded retry is remembered here and read
  // as damaged at once from then on, until it validates again.
  bool damaged_known(uint32_t slot, const cxlkv_index_entry& seen) const;
  // Block owners (index_check.cpp side, in index_owner.cpp; docs/integrity.md
  // "Block owners: overlapping entries"): a READY memory
  // entry at `slot` is served only when the payload space records `slot` as
  // the holder of its block; else the pin is refused (-EIO, the message
  // names the slot, its extent and the recorded holder's), counted.
  Result<void> owner_ok(uint32_t slot, const cxlkv_index_entry& e);
  bool settle_bad_line(uint32_t slot, cxlkv_index_entry* e) const;
  mutable std::mutex damaged_mu_;
  mutable std::unordered_map<uint32_t, uint32_t> damaged_;  // slot -> check word seen
  mutable std::atomic<uint64_t> damaged_lines_{0};
  IndexCounters ctr_;
  DemotionTarget* demotion_ = nullptr;  // the SSD tier, if any (docs/eviction.md "The SSD tier")
  std::mutex pin_mu_;
  std::unordered_map<uint32_t, uint32_t> local_pins_;  // slot -> pins held by this index
  std::unique_ptr<NodePins> node_pins_;  // the node's pins by process (nullptr: this index is its node's only pinner)
  std::atomic<uint32_t> evict_hand_{0};
  std::vector<uint32_t> stripe_hands_;  // fallback scan: where the next window of a stripe starts
  // Optimistic reads (index_read.cpp): the recency stamps they owe, written
  // by settle_reads under the stripe locks.
  struct OwedRead {
    uint32_t slot;
    uint32_t version;
    uint32_t ms;
    BlockKey key;
  };
  mutable std::mutex owed_mu_;
  std::vector<OwedRead> owed_;
  uint32_t owed_since_ms_ = 0;  // now_ms() of the oldest owed stamp
};

}  // namespace cxlkv
