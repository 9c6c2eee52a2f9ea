// SPDX-License-Identifier: MIT
// Shared-pool allocator (layout in cxlkv/format/alloc_format.h).
//
//   ChunkAllocator  the global tier: fixed-size chunks of the kv carve,
//                   tracked in a bitmap in the pool under the global lock
//                   CXLKV_LOCK_ALLOC.  Also serves large allocations as
//                   runs of whole chunks.
//   NodeHeap        the node tier: size classes (64 B .. 64 KiB, cache-line
//                   multiples, then powers of two up to 1 MiB, at most half
//                   a chunk) cut from chunks the node owns; free lists in
//                   node-local shared memory, shared by the node's processes.
//                   free() works for blocks of any node (remote frees go to
//                   the owner's remote-free bitmaps in the pool).
//
// Results are pool offsets (Region::at() turns one into a pointer).
// Exhaustion is -ENOSPC with a message naming the pool and sizes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"
#include "cxlkv/sync.hpp"
#include "cxlkv/format/alloc_format.h"
#include "cxlkv/format/objstore_format.h"

namespace cxlkv {

struct AllocFormatOptions {
  uint64_t chunk_size = CXLKV_DEFAULT_CHUNK_SIZE;        // power of two, 64 KiB .. 1 GiB
  uint32_t objstore_entries = CXLKV_OBJSTORE_DEFAULT_ENTRIES;  // power of two
};

// Bytes the alloc carve needs for a kv carve of kv_bytes (before 2 MiB rounding).
uint64_t alloc_carve_bytes(uint64_t kv_bytes, uint32_t max_nodes, const AllocFormatOptions& o = {});
// Carve initializer called by format_pool(): lays out the "alloc" carve over
// the "kv" carve and formats the object store table inside it.
Result<void> format_alloc_carve(Region& region, MemoryDomain& domain,
                                const AllocFormatOptions& opts = {});

// Size classes: class c holds blocks of size_class_bytes(c).  Larger blocks
// (over half a chunk, or over 1 MiB) are runs of whole chunks.
constexpr uint32_t kSizeClasses = 40;
uint32_t size_class_bytes(uint32_t c);
// Smallest class holding `bytes`, or kSizeClasses if it needs whole chunks.
uint32_t size_class_for(uint64_t bytes, uint64_t chunk_size);

// Quarantine of space taken from a node declared dead (docs/integrity.md "Quarantine";
// cxlkv/format/alloc_format.h): released once that node resumed and beat twice, or
// after this period (default 10 minutes; CXLKV_RECLAIM_QUARANTINE_MS in the
// environment; 0 turns quarantine off, for tests that show what it guards).
void set_reclaim_quarantine(std::chrono::milliseconds period);
std::chrono::milliseconds reclaim_quarantine();

struct AllocGeometry {
  uint64_t chunk_size = 0, nchunks = 0, arena_off = 0;
};

class ChunkAllocator {
 public:
  static Result<ChunkAllocator> open(NodeContext& node);
  const AllocGeometry& geometry() const { return geo_; }
  // Allocate a run of n chunks for this node (kind SMALL with `size_class`
  // when n == 1 and small, else LARGE).  Returns the first chunk index.
  Result<uint64_t> alloc_run(uint64_t n, bool small, uint32_t size_class);
  // Free the run starting at chunk `first` (any node may free a LARGE run).
  Result<void> free_run(uint64_t first) { return free_run(first, lock_timeout_); }
  Result<void> free_run(uint64_t first, std::chrono::nanoseconds lock_timeout);
  // Instead of freeing, quarantine the LARGE run at `first`, taken from
  // (node, incarnation low bits) that was declared dead.
  Result<void> quarantine_run(uint64_t first, uint32_t node, uint32_t incarnation_lo) {
    return quarantine_run(first, node, incarnation_lo, lock_timeout_);
  }
  Result<void> quarantine_run(uint64_t first, uint32_t node, uint32_t incarnation_lo,
                              std::chrono::nanoseconds lock_timeout);
  // Release the quarantine runs that may be released now; chunks released.
  Result<uint64_t> release_quarantine();
  // Chunks in quarantine (a fresh read of the state line; no lock).
  uint64_t quarantined_chunks() const;
  // Recompute the bitmap checksum under ALLOC; -EUCLEAN naming the pool
  // when it does not match the state line (a zeroed or damaged bitmap).
  Result<void> check_bitmap();
  // Chunk descriptor, read fresh (rule 4).
  cxlkv_chunk_desc desc(uint64_t chunk) const;
  uint64_t free_chunks() const;  // counted from the bitmap (takes no lock: a snapshot)
  uint64_t chunk_of(uint64_t pool_off) const { return (pool_off - geo_.arena_off) / geo_.chunk_size; }
  uint64_t chunk_off(uint64_t chunk) const { return geo_.arena_off + chunk * geo_.chunk_size; }
  bool in_arena(uint64_t pool_off) const {
    return pool_off >= geo_.arena_off && pool_off < geo_.arena_off + geo_.nchunks * geo_.chunk_size;
  }
  const cxlkv_alloc_header& header() const { return hdr_; }
  // The bound of every wait for ALLOC / REMOTE_FREE (CXLKV_LOCK_TIMEOUT_MS
  // read at open, util/lock_timeout.hpp; nanoseconds::max(): unbounded).
  // Past it a call fails with -ETIMEDOUT naming the pool and the lock, and
  // changes nothing in the pool.
  std::chrono::nanoseconds lock_timeout() const { return lock_timeout_; }
  std::byte* carve_base() const { return base_; }
  // Block owner records (docs/integrity.md "Block owners: overlapping entries"; cxlkv/format/alloc_format.h): the record of the
  // granule where a block at pool offset `off` starts.  set_owner writes it
  // with one 8-byte NT store (rule 1: records of one line belong to
  // different blocks and nodes; the caller holds the block); owner reads it
  // fresh (rule 4).  Offsets outside the arena: no record (owner() gives {}).
  void set_owner(uint64_t off, const cxlkv_block_owner& o);
  cxlkv_block_owner owner(uint64_t off) const;

 private:
  ChunkAllocator(NodeContext& n) : node_(&n) {}
  cxlkv_alloc_state* state() const { return reinterpret_cast<cxlkv_alloc_state*>(base_ + hdr_.state_off); }
  cxlkv_quarantine* quarantine() const {
    return reinterpret_cast<cxlkv_quarantine*>(base_ + hdr_.state_off + sizeof(cxlkv_alloc_state));
  }
  NodeContext* node_;
  std::byte* base_ = nullptr;  // start of the alloc carve
  cxlkv_alloc_header hdr_{};
  AllocGeometry geo_{};
  std::chrono::nanoseconds lock_timeout_ = std::chrono::nanoseconds::max();
};

struct HeapStats {
  uint64_t allocs = 0, frees = 0, remote_frees_sent = 0, remote_frees_drained = 0;
  uint64_t bytes_in_use = 0;     // allocated by this node and not yet freed back to it
  uint64_t chunks_owned = 0;     // chunks this node holds (small + large)
  uint64_t chunk_refills = 0, chunk_returns = 0, enospc = 0;
};

class NodeHeap {
 public:
  static Result<std::unique_ptr<NodeHeap>> open(NodeContext& node);
  ~NodeHeap();
  // 64 B aligned block of at least `bytes` (1 .. pool size); -ENOSPC when exhausted.
  Result<uint64_t> alloc(uint64_t bytes);
  // Free a block from any node.  -EINVAL for an offset that is not an
  // allocated block.  A free that needs a global lock (a LARGE run: ALLOC;
  // another node's block: REMOTE_FREE+owner) it does not get within
  // chunks().lock_timeout() -- at once while earlier ones wait -- is
  // deferred: it succeeds and is done by retry_deferred_frees() (the kv
  // session's drainer calls it each period) or when the heap closes.
  Result<void> free(uint64_t pool_off);
  // Free a block taken from a reservation of (node, incarnation low bits),
  // declared dead: a whole-chunk run goes into quarantine unless that node
  // is a process of this host that is gone; a size-class block goes back
  // to its owner node as free() does (only that node reuses it).
  Result<void> free_taken(uint64_t pool_off, uint32_t node, uint32_t incarnation_lo);
  // Frees deferred for a lock (see free()) and not yet done.
  size_t deferred_frees() const;
  // Do the deferred frees, each waiting at most lock_timeout for its lock
  // (nanoseconds::max(): unbounded; 0: one try).  Returns how many were
  // done; -ETIMEDOUT naming the lock when some still wait (kept for later).
  Result<uint64_t> retry_deferred_frees(std::chrono::nanoseconds lock_timeout);
  // Usable size of an allocated block.
  Result<uint64_t> usable_size(uint64_t pool_off) const;
  // Pull blocks other nodes freed back into this node's free lists; chunks
  // whose blocks are all free again go back to the global bitmap.
  Result<uint64_t> drain_remote_frees();
  // The wait for REMOTE_FREE+self is bounded by chunks().lock_timeout().
  // The same when this node's inbox says remote frees wait (one fresh read,
  // no lock when none do), with a bound on the wait for the REMOTE_FREE
  // lock (nanoseconds::max(): unbounded; 0: one try): the kv session's
  // drainer thread calls it each period, so an idle node gives back the
  // space other nodes freed by evicting its blocks.
  Result<uint64_t> drain_if_posted(std::chrono::nanoseconds lock_timeout);
  // Remote frees posted to node n and not yet usable: not yet drained, or
  // drained into chunks still on their way back to the pool (one fresh read
  // of its inbox line; 0 for a node out of range).
  uint64_t remote_frees_posted(uint32_t n) const;
  HeapStats stats() const;
  ChunkAllocator& chunks() { return chunks_; }
  NodeContext& node() const { return node_; }

  struct Impl;

 private:
  NodeHeap(NodeContext& n, ChunkAllocator c);
  struct PendingFree {
    uint64_t off;
    uint32_t node, inc;  // free_taken()'s; taken false: a plain free
    bool taken;
  };
  // free() / free_taken() now, each global lock waited for at most lock_timeout.
  Result<void> release(const PendingFree& f, std::chrono::nanoseconds lock_timeout);
  Result<void> free_within(uint64_t pool_off, std::chrono::nanoseconds lock_timeout);
  Result<void> release_or_defer(const PendingFree& f);
  NodeContext& node_;
  ChunkAllocator chunks_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlkv
