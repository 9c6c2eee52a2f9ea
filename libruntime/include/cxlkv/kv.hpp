// SPDX-License-Identifier: MIT
// KvStore: publish and reuse KV blocks through the pool (C++ API).
//
//   write:  reserve (WRITING) -> write (gather the engine's chunks into the
//           pool, flushed) -> publish (READY; the visibility boundary)
//   read:   lookup (longest cached prefix, no lock) -> pin -> fetch
//           (scatter into the engine's chunks) -> unpin
//
// A KvStore is one node's handle; use one per thread (the NonCoherentSim
// convention: one node from one thread at a time).  Payload bytes go through
// one PayloadTier per tier (MEM here; the SSD tier plugs in the same way),
// chosen by the location's tier field.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxlkv/keys.hpp"
#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "cxlkv/types.hpp"
#include "cxlkv/format/index_format.h"

namespace cxlkv {

class PrefixIndex;
class StripeLocks;
class NodeLiveness;
class PayloadSpace;
class DemotionTarget;
struct BlockLocation;
class Region;
class NodeContext;
class IndexBatchOps;

// One pool device holding payload: its mapping and the domain to touch it.
struct PoolDevice {
  MemoryDomain* domain = nullptr;
  std::byte* base = nullptr;  // start of the device (location offsets are from here)
  uint64_t size = 0;
  // Payload locations must lie in [payload_lo, payload_hi) (the
  // device's kv carve); an index entry naming other bytes (the superblock,
  // another carve) is refused, never read.  0, 0: the whole device.
  uint64_t payload_lo = 0, payload_hi = 0;
  // The device's pool, when it maps on use (OpenOptions::map_on_use): each
  // block's payload range is prepared (Region::prepare) before its copy.
  const Region* region = nullptr;
};

// Payload I/O of one tier (MEM: pool devices; SSD: the tier layer).
class PayloadTier {
 public:
  virtual ~PayloadTier() = default;
  // Gather `chunks` (total = loc.length) into the block; on return the bytes
  // are in memory (flushed/NT + fenced), ready for publish (rule 3 / rule 5).
  virtual Result<void> write(const BlockLocation& loc, std::span<const Chunk> chunks) = 0;
  // Scatter the block into `chunks`, invalidating stale lines first (rule 6).
  virtual Result<void> read(const BlockLocation& loc, std::span<const Chunk> chunks) = 0;
};

// A payload tier that chooses its own locations: the SSD tier (docs/eviction.md "The SSD tier";
// libruntime/src/tier/ssd_payload_tier.hpp).  Blocks enter it by demotion.
//
// The tier records each block's key with it and checks it on
// read, so the keyed calls below are the ones the KV store uses; a read
// whose block no longer holds `key` (or fails its checksum) is a clean miss:
// -ESTALE or -EBADMSG, never data.
class PlacingTier : public PayloadTier {
 public:
  // Places and writes block `key` made of `chunks`; -ENOSPC when the tier is full.
  virtual Result<BlockLocation> place(const BlockKey& key, std::span<const Chunk> chunks) = 0;
  virtual void release(const BlockLocation& loc) = 0;
  // Reads block `key` at `loc` into `chunks` after checking that it holds it.
  virtual Result<void> read_block(const BlockKey& key, const BlockLocation& loc, std::span<const Chunk> chunks) = 0;
  // One read per block, issued together (several in flight): status[i] = 0
  // or a negative errno as read_block.  blocks[i] = chunks[first[i] ..
  // first[i] + count[i]).  The default loops over read_block.
  struct BlockRead {
    BlockKey key;
    BlockLocation const* loc = nullptr;
    std::span<const Chunk> chunks;
  };
  virtual void read_many(std::span<const BlockRead> blocks, std::span<int32_t> status) {
    for (size_t i = 0; i < blocks.size(); i++) {
      auto r = read_block(blocks[i].key, *blocks[i].loc, blocks[i].chunks);
      status[i] = r ? 0 : r.error().code();
    }
  }
  // At attach: `loc` is named by an index entry that survived a restart;
  // its space must not be handed out again.
  virtual void claim(const BlockLocation& loc) { (void)loc; }
  // Whether this process can read a block at `loc` (SSD locations are per
  // host: another host's SSD is not a hit here).
  virtual bool readable(const BlockLocation& loc) const { (void)loc; return true; }
};

struct KvStats {
  uint64_t counters[CXLKV_CTR_COUNT] = {};
  uint32_t latency[CXLKV_LAT_COUNT][CXLKV_LAT_BUCKETS] = {};
  void add(const KvStats& o);
  // Percentile (0..100) of latency histogram `which` in microseconds (bucket upper bound).
  double latency_us(int which, double pct) const;
  uint64_t latency_count(int which) const;
};
const char* counter_name(int c);  // "lookups", "hit_blocks", ...
const char* latency_name(int l);  // "lookup", "reserve", "write", "publish", "pin", "fetch", "unpin", "put", "get"

// Read every node's statistics from an index carve (for the CLI / replay).
struct NodeKvStats {
  uint32_t node = 0;
  uint32_t pid = 0;
  uint64_t updated_ms = 0;
  KvStats stats;
  uint64_t ssd[CXLKV_SSD_COUNT] = {};  // the node's SSD tier counters (enum cxlkv_index_ssd_counter)
  uint64_t remote[CXLKV_REMOTE_COUNT] = {};  // its remote tier counters (enum cxlkv_index_remote_counter)
};
std::vector<NodeKvStats> read_pool_stats(MemoryDomain& d, const void* index_carve);
// The same for an index carve of `carve_bytes` whose header this process has
// not checked (a pool on disk, the metrics endpoint): empty, never a read
// outside the carve, when the header is damaged (read_index_header says why).
std::vector<NodeKvStats> read_pool_stats(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes);

// Per-block outcome of the batch calls: the values of cxlkv.h's CXLKV_KV_*
// (>= 0), or a negative errno for a block that failed, -ECANCELED for one
// the call did not attempt because an earlier block of its chain failed.
inline constexpr int32_t kKvReserved = 0;  // this caller writes it / the operation succeeded on it
inline constexpr int32_t kKvExists = 1;    // already READY: nothing to write
inline constexpr int32_t kKvBusy = 2;      // another node is writing it
inline constexpr int32_t kKvMiss = 3;      // not cached (pin / fetch of a block that is not READY)

struct KvReservation {
  BlockKey key;
  uint32_t slot = 0xffffffffu;
  // 0 reserved (write it), 1 exists_ready, 2 busy (another writer); from a
  // batch call also uint32_t(-errno) for a block that was not reserved.
  uint32_t status = 0;
  uint64_t length = 0;
  uint64_t loc_off = 0;
  uint8_t loc_dev = 0, loc_tier = 0;
  uint32_t version = 0;  // entry version seen at reserve (fencing; docs/integrity.md "Fencing: handles carry the entry version")
  bool reserved() const { return status == 0; }
};

struct KvPin {
  BlockKey key;
  uint32_t slot = 0xffffffffu;
  uint64_t length = 0;
  uint64_t loc_off = 0;
  uint8_t loc_dev = 0, loc_tier = 0;
  // Which pin of the store that made it (pin_many numbers its pins; 0: not
  // a pin of any store).  A handle is honoured by that store only while
  // this very pin is held: its unpin ends it (docs/integrity.md "Pin handles").
  uint16_t tag = 0;
  // 0 pinned; from pin_many also kKvMiss or uint32_t(-errno) (not pinned).
  uint32_t status = 0;
  uint32_t version = 0;  // entry version seen at pin (fencing; docs/integrity.md "Fencing: handles carry the entry version")
  bool pinned() const { return status == 0; }
};

// Everything a KvStore needs, given explicitly (tests give simulated parts;
// open_kv_store() below wires the real sync layer).
struct KvDeps {
  MemoryDomain* index_domain = nullptr;
  void* index_carve = nullptr;
  uint64_t index_bytes = 0;
  uint32_t node = 0;
  uint64_t incarnation = 0;
  StripeLocks* locks = nullptr;
  NodeLiveness* liveness = nullptr;
  PayloadSpace* space = nullptr;
  std::vector<PoolDevice> devices;  // MEM tier devices; [0] holds the index
  // SSD tier (docs/eviction.md "The SSD tier"), optional.  demote_on_evict: blocks evicted from
  // memory go to it instead of being dropped; promote_on_hit: a block read
  // from it moves back to memory when the reader holds its only pin.
  PlacingTier* ssd_tier = nullptr;
  bool demote_on_evict = false;
  bool promote_on_hit = false;
  // Lookup stops at the first block on an SSD this store cannot
  // read (another host's, or any SSD without ssd_tier), so such blocks are
  // never counted as hits.  It checks each block of the found prefix (one
  // lock-free probe each); a deployment whose SSD tiers all share devices
  // may turn it off.
  bool lookup_checks_readable = true;
  // Where reserve / publish / abort / pin / unpin go (the index
  // service's client); nullptr: this store's own index (lock-based).
  IndexBatchOps* index_backend = nullptr;
  // get_many finds the blocks whose stripe lock another node keeps without
  // that lock and without a pin, and checks after the copy that they did
  // not change (docs/coherence.md "Optimistic reads"); false: every get
  // pins under the stripe locks.
  bool optimistic_reads = true;
};

class KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> create(KvDeps deps);
  ~KvStore();

  // Longest prefix of `chain` whose blocks are all READY.  No lock.
  size_t lookup(std::span<const BlockKey> chain);
  size_t lookup_linear(std::span<const BlockKey> chain);

  // Reserve one block (child of `parent`, nullptr for the first block).
  Result<KvReservation> reserve(const BlockKey& key, const BlockKey* parent, uint64_t bytes);
  // Gather-write the payload of a reserved block (sizes must add up to its length).
  Result<void> write(const KvReservation& r, std::span<const Chunk> chunks);
  // Make it visible (READY).  -EAGAIN: parent not yet published (retry).
  Result<void> publish(const KvReservation& r);
  Result<void> abort(const KvReservation& r);

  Result<KvPin> pin(const BlockKey& key);
  Result<void> fetch(const KvPin& p, std::span<const Chunk> chunks);
  Result<void> unpin(const KvPin& p);

  // ---- batches (one call for many blocks; status per block) ---------------
  // Every batch call takes n blocks and `status` with n entries, returns the
  // number of blocks that succeeded, or an Error when the whole call is
  // refused (sizes that do not match, a chunk list shorter than `nchunks`
  // says); then nothing was done.  A block that fails does not stop the
  // others, except along a chain (reserve_chain / put_chain): the blocks
  // after a failed one get -ECANCELED.  Handles whose status is not
  // RESERVED (reservations) or 0 (pins) are skipped by write / publish /
  // abort / fetch / unpin: their status[i] is the handle's status and they do
  // not count.  Chunks of all blocks are concatenated: block i has
  // nchunks[i] of them (skipped blocks' chunks are stepped over).  The
  // message of the first failed block is last_block_error().
  //
  // keys[0] is a child of `parent` (nullptr: a root), keys[i] a child of
  // keys[i-1].  out[i]/status[i]: RESERVED, EXISTS, BUSY or -errno; stops at
  // the first block that is neither RESERVED nor EXISTS (BUSY included;
  // -ECANCELED after it).  Returns how many leading blocks are RESERVED or EXISTS.  Reserved blocks stay
  // reserved whatever happens later in the chain: write + publish or abort them.
  // through_busy: a BUSY block does not stop the chain; the blocks below it
  // are reserved or found as usual and published once its writer has
  // published it (publish_many: -EAGAIN until then).  See
  // PrefixIndex::reserve_chain.
  Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                               std::span<KvReservation> out, std::span<int32_t> status, bool through_busy = false);
  Result<size_t> write_many(std::span<const KvReservation> rs, std::span<const Chunk> chunks,
                            std::span<const uint32_t> nchunks, std::span<int32_t> status);
  // Publishes in the given order (parents first).  Publish only blocks whose
  // write succeeded (abort the others): publish does not know whether the
  // payload was written.
  Result<size_t> publish_many(std::span<const KvReservation> rs, std::span<int32_t> status);
  // Aborts in reverse order (children before their parents).
  Result<size_t> abort_many(std::span<const KvReservation> rs, std::span<int32_t> status);
  // out[i]/status[i]: 0 pinned, kKvMiss not cached, or -errno.
  Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status);
  Result<size_t> fetch_many(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                            std::span<const uint32_t> nchunks, std::span<int32_t> status);
  Result<size_t> unpin_many(std::span<const KvPin> pins, std::span<int32_t> status);
  // reserve_chain -> write the reserved blocks -> publish them, parents
  // first (a `parent` another node is writing is waited for, bounded).
  // status[i]: RESERVED (written and published by this call), EXISTS, BUSY
  // (another node is writing it), -errno, -ECANCELED.  Every block this call
  // reserved is published or aborted before it returns.  Returns how many
  // blocks are RESERVED or EXISTS.
  Result<size_t> put_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                           std::span<const Chunk> chunks, std::span<const uint32_t> nchunks,
                           std::span<int32_t> status);
  // put_chain of several chains in one call (an engine step's requests):
  // chain j is the next chain_lens[j] keys, child of parents[j] (all-zero:
  // a root).  The chains are put one after the other, so a chain may start
  // below a block an earlier chain of the same call publishes.  Chunks,
  // counts and statuses are concatenated over all blocks; returns how many
  // blocks are RESERVED or EXISTS.  The call's fixed costs (the engine's
  // call, the status and argument handling) are paid once per step instead
  // of once per request.
  Result<size_t> put_chains(std::span<const BlockKey> parents, std::span<const uint32_t> chain_lens,
                            std::span<const BlockKey> keys, uint64_t bytes, std::span<const Chunk> chunks,
                            std::span<const uint32_t> nchunks, std::span<int32_t> status);
  // The end of put_chain for callers that write the payload themselves (the
  // GPU path): `rs` from reserve_chain, written[i] 0 where block i's payload
  // is in the pool (flushed / DMA complete, rule 3/5), else -errno.  Publishes
  // the reserved blocks before the first one not written, parents first, and
  // aborts the rest; fills status[i] as put_chain does and returns its count.
  // Reserved blocks written in place by another writer (a transfer engine
  // receiving into a registered mapping of the pool; docs/remote.md
  // "Straight from the pool").  reserved_extent: where reservation r's
  // payload lies in this process's mapping (0 and *at), or why not:
  // -EXDEV not one extent of memory (interleaved, or not in memory),
  // -ENODEV no such device, -EUCLEAN outside the device's kv carve, the
  // handle's status for one not RESERVED.  flush_in_place: once the
  // payloads are written with ordinary stores, writes their lines back and
  // fences (docs/coherence.md rule 3), after which publish_many may publish
  // them; status[i] as reserved_extent, returns how many were flushed.
  int32_t reserved_extent(const KvReservation& r, std::byte** at) const;
  size_t flush_in_place(std::span<const KvReservation> rs, std::span<int32_t> status);
  Result<size_t> settle_chain(const BlockKey* parent, std::span<const BlockKey> keys,
                              std::span<const KvReservation> rs, std::span<const int32_t> written,
                              std::span<int32_t> status);
  // pin -> fetch -> unpin.  status[i]: 0 fetched, kKvMiss not cached,
  // -errno.  Returns how many were fetched.
  Result<size_t> get_many(std::span<const BlockKey> keys, std::span<const Chunk> chunks,
                          std::span<const uint32_t> nchunks, std::span<int32_t> status);
  const std::string& last_block_error() const { return block_error_; }

  // ---- handoff leases (kv_lease.cpp) ----------------------------------------
  // A producer leases published blocks for a consumer (a request id; its
  // node, or kLeaseNodeAny): they are not evicted until the consumer releases
  // them, ttl_ms passes, or the consumer's node is dead.  status[i]: 0
  // leased, kKvMiss not cached, -errno.  Returns how many were leased.
  static constexpr uint32_t kLeaseNodeAny = 0xffffffffu;
  Result<size_t> lease(std::span<const BlockKey> keys, uint64_t consumer, uint32_t consumer_node, uint32_t ttl_ms,
                       std::span<int32_t> status);
  // The consumer's release.  status[i]: 0 released, -ENOENT not leased to
  // this consumer, -ETIMEDOUT the lease had already ended (expired, or its
  // node was declared dead), kKvMiss not cached.  Returns how many were released.
  Result<size_t> lease_release(std::span<const BlockKey> keys, uint64_t consumer, std::span<int32_t> status);

  // Wait until `key` is READY (or gone): for blocks another node is writing.
  // Returns true when READY, false when it disappeared / timed out.
  bool wait_ready(const BlockKey& key, std::chrono::milliseconds timeout);

  Result<uint64_t> reclaim_dead();
  // "locks" (this process takes the index's stripe locks) or "service".
  const char* index_mode() const;
  const KvStats& stats() const { return stats_; }
  void flush_stats();  // copy this node's stats into the pool now
  // Add n to the node's remote tier counter `which` (enum
  // cxlkv_index_remote_counter; docs/remote.md "Counters") and write the
  // counters' line of the node's stats now.  The counters are shared by
  // every store of this pool mapping and node in the process (a remote tier
  // counts through a handle of its own), so each store's flush_stats writes
  // the same values.  Safe to call from any thread, beside the store's user.
  Result<void> count_remote(int which, uint64_t n);
  uint32_t node() const { return deps_.node; }
  const std::vector<PoolDevice>& devices() const { return deps_.devices; }

 private:
  // The index is private to the library: reached through kv/store_index.hpp
  // (store_index()), never through this header.
  friend class KvStoreInternals;
  KvStore() = default;
  Result<void> payload_io(const BlockLocation& loc, std::span<const Chunk> chunks, bool write);
  void promote(const KvPin& p, const BlockLocation& from, std::span<const Chunk> chunks);  // SSD -> memory on a hit
  void claim_ssd_blocks();                                              // at create
  size_t readable_prefix(std::span<const BlockKey> chain, size_t n);   // lookup
  std::vector<std::pair<uint32_t, BlockKey>> dropped_pins_;             // pins consumed by a drop
  // The pins this store holds, by (slot, tag), as pin_many handed them out
  // (kv_batch.cpp "Pin handles"): fetch and unpin honour a handle only
  // while its pin is here and every field matches.  Store-local (a KvStore
  // is used by one thread at a time), so the check reads no pool line.
  struct HeldPin {
    BlockKey key;
    uint64_t loc_off = 0;
    uint32_t length = 0, version = 0;
    uint8_t loc_dev = 0, loc_tier = 0;
  };
  static uint64_t held_key(uint32_t slot, uint16_t tag) { return uint64_t(slot) << 16 | tag; }
  std::unordered_map<uint64_t, HeldPin> held_pins_;
  uint16_t last_pin_tag_ = 0;
  // `pinned` (get_many): the index's read_many instead of pin_many;
  // pinned[i] = 0 for a block found without a pin (optimistic read).
  Result<size_t> pin_blocks(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status,
                            bool held, std::span<uint8_t> pinned = {});
  Result<size_t> unpin_blocks(std::span<const KvPin> pins, std::span<int32_t> status, bool held);
  // 0 when `p` is a pin this store holds, field for field; else the code
  // (`not_held` when it holds no pin of that slot and tag) and *why.
  int32_t check_held(const KvPin& p, int32_t not_held, std::string* why) const;
  bool consume_dropped_pin(const KvPin& p);
  // Handle checks (kv_batch.cpp; docs/integrity.md "Fencing: handles carry
  // the entry version"): one fresh read of each block's
  // entry, all in one invalidation sweep and one fence; code 0 or -errno.
  struct HandleCheck;
  void check_handles(const char* op, std::vector<HandleCheck>& hs, bool after_copy);
  // After a fetch's copy: each memory block's space is still allocated as it.
  void check_space(const char* op, std::vector<HandleCheck>& hs);
  // The batch calls' bodies.  `made_here`: the handles come from this
  // store's own reserve_chain / pin_many in the same call (put_chain,
  // get_many), so the pre-copy check is skipped; the post-copy check stays
  // (for a write it is also the check publish needs: PublishCheck::done)
  // unless `post_check` is false because the publish that follows checks
  // in the index (PublishCheck::in_index).
  enum class PublishCheck { handles, done, in_index };
  Result<size_t> write_blocks(std::span<const KvReservation> rs, std::span<const Chunk> chunks,
                              std::span<const uint32_t> nchunks, std::span<int32_t> status, bool made_here,
                              bool post_check = true);
  Result<size_t> publish_blocks(std::span<const KvReservation> rs, std::span<int32_t> status, PublishCheck how);
  // `pinned` (get_many): pinned[i] = 0 marks a block read optimistically;
  // a change seen after its copy makes it a miss, not an error.
  Result<size_t> fetch_blocks(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                              std::span<const uint32_t> nchunks, std::span<int32_t> status, bool made_here,
                              std::span<const uint8_t> pinned = {});
  Result<size_t> settle_blocks(const BlockKey* parent, std::span<const BlockKey> keys,
                               std::span<const KvReservation> rs, std::span<const int32_t> written,
                               std::span<int32_t> status, PublishCheck how);
  // fetch_blocks' SSD blocks (checked handles) in one PlacingTier::read_many
  // (several in flight): code 0 read, else status[at] is set.
  void fetch_ssd(std::span<const KvPin> pins, std::vector<HandleCheck>& ssd,
                 std::span<const std::span<const Chunk>> chunks, std::span<int32_t> status);
  void count(int c, uint64_t n = 1) { stats_.counters[c] += n; }
  // One sample per block: a batch of `blocks` adds its time / blocks, blocks times.
  void record(int which, std::chrono::steady_clock::time_point t0, size_t blocks = 1);
  void maybe_flush_stats();
  void note_block_error(const Error& e);
  Result<void> check_batch(const char* what, size_t n, size_t nstatus, std::span<const Chunk> chunks,
                           const std::span<const uint32_t>* nchunks);

  KvDeps deps_;
  std::unique_ptr<PrefixIndex> index_;
  IndexBatchOps* ops_ = nullptr;  // deps_.index_backend or index_ (the lock-based path)
  std::unique_ptr<PayloadSpace> interleaved_space_;
  std::unique_ptr<PayloadTier> mem_tier_;
  std::unique_ptr<DemotionTarget> demotion_;  // MEM -> SSD copy for the index
  KvStats stats_;
  uint64_t ops_since_flush_ = 0;
  struct RemoteCounters;                    // kv_store.cpp: per (index carve, node) in this process
  static std::shared_ptr<RemoteCounters> remote_counters_of(const void* index_carve, uint32_t node);
  std::shared_ptr<RemoteCounters> remote_;
  std::string block_error_;  // first failed block of the last batch call
};

// ---- wiring to the real pool (sync layer: two-tier locks, node heap) -------

// How a session's KvStore reaches the index.  automatic: the
// CXLKV_INDEX_MODE environment variable ("locks" / "service") when set,
// else service when the pool has the index service's RPC carve (made by
// `cxlkvctl format --index-service` or by the first cxlkvd --index-service),
// else locks.
enum class KvIndexMode { automatic, locks, service };
struct KvOpenOptions {
  std::vector<Region*> extra_devices;  // interleave set beyond the primary pool
  // SSD tier (docs/eviction.md "The SSD tier"), optional; passed to KvDeps unchanged (see there).
  PlacingTier* ssd_tier = nullptr;
  bool demote_on_evict = false;
  bool promote_on_hit = false;
  KvIndexMode index_mode = KvIndexMode::automatic;  // locks or index service (docs/rpc.md)
};
class KvSession;  // owns the adapters (locks, liveness, heap) of one node
Result<std::unique_ptr<KvSession>> open_kv_session(Region& pool, NodeContext& node,
                                                   const KvOpenOptions& opts = {});
class KvSession {
 public:
  virtual ~KvSession() = default;
  virtual KvStore& store() = 0;
};

}  // namespace cxlkv
