// SPDX-License-Identifier: MIT
// NonCoherentSim: a test domain that gives each simulated node a private
// write-back cache of 64-byte lines over one shared pool mapping, so that a
// protocol that forgets a flush, an invalidate or an NT store fails in a
// unit test instead of on a CXL rack.
//
// Per node and per line: {64 bytes, dirty}.  Semantics (node i's domain):
//   load        hit: the cached bytes, possibly stale; miss: fill from memory
//   store       write-allocate: fill the line, change the bytes, mark dirty
//   store_nt    drop node i's copy of each line (write back first if dirty),
//               then write just the given bytes to memory
//   flush / flush_bulk / invalidate
//               write back the whole line if dirty, then drop it (clflush)
//   fence       no-op: every access is already sequential (one global mutex)
//   copy_to_pool = store_nt; copy_from_pool = invalidate + load;
//   publish_line = store_nt of 64 aligned bytes.
// Random evictions: after each line access a node evicts one random line of
// its own cache with probability evict_probability (writing it back whole if
// dirty), from a per-node RNG seeded with seed + node.  Whole-line write-back
// is what makes a plain store to a shared line clobber another node's bytes.
//
// With buffer_until_fence (off by default) the sim also checks fences: the
// bytes of store_nt() and the write-backs of flush() / flush_bulk() /
// invalidate() wait in a per-node buffer (write-combining buffer, pending
// clflushopt) and reach memory at the node's next fence(), when the node
// itself touches that line again (as hardware drains a WC buffer on a hit),
// or at random moments, line by line in random order (probability
// evict_probability per access) -- so a flag published without a fence after
// its payload can become visible first.
//
// With prefetch_probability > 0 (off by default) a node also pulls random
// lines of the pool into its cache, clean, at random moments (probability
// per access), as hardware prefetchers and speculative loads do: a reader
// that invalidates a payload before it has seen the flag, instead of after,
// can end up holding a stale copy.
//
// Accesses outside the simulated pool throw std::out_of_range (a protocol
// bug: it touched pool memory it does not own through the domain).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cxlkv/memory_domain.hpp"

namespace cxlkv {

struct NonCoherentSimOptions {
  uint32_t nodes = 4;
  double evict_probability = 0.0;
  uint64_t seed = 1;
  bool buffer_until_fence = false;  // see above: NT stores / write-backs wait for fence()
  double prefetch_probability = 0.0;  // see above: random clean fills of pool lines
};

// Per-node counters (snapshot).
struct SimCounters {
  uint64_t loads = 0;        // load() calls
  uint64_t cached_loads = 0; // line reads served from the cache (stale-capable)
  uint64_t stale_loads = 0;  // ... of which returned bytes that differ from memory
  uint64_t stores = 0;       // store() calls
  uint64_t nt_stores = 0;    // store_nt() / copy_to_pool() / publish_line() calls
  uint64_t writebacks = 0;   // dirty lines written back (flush, invalidate, eviction)
  uint64_t evictions = 0;    // random evictions
  uint64_t dropped = 0;      // dirty lines (and buffered writes) lost by drop_all()
  uint64_t fences = 0;       // fence() calls
  uint64_t early_drains = 0; // buffered lines that reached memory before a fence
  uint64_t prefetches = 0;   // random clean fills
};

class NonCoherentSim {
 public:
  // memory: the shared pool bytes, 64-byte aligned, bytes a multiple of 64.
  NonCoherentSim(void* memory, size_t bytes, NonCoherentSimOptions opts);
  ~NonCoherentSim();
  NonCoherentSim(const NonCoherentSim&) = delete;
  NonCoherentSim& operator=(const NonCoherentSim&) = delete;

  // Node i's domain (mode flush).  Different nodes may be used from different
  // threads concurrently; one node from one thread at a time.
  MemoryDomain& node(uint32_t i);
  uint32_t nodes() const { return static_cast<uint32_t>(nodes_.size()); }

  void writeback_all(uint32_t i);  // write back + drop every dirty line of node i
                                   // (and drain its buffered writes)
  void drop_all(uint32_t i);       // crash: node i loses its dirty lines and buffered writes

  SimCounters counters(uint32_t i) const;
  SimCounters total() const;  // summed over nodes

 private:
  class Node;
  friend class Node;
  char* mem_;
  size_t bytes_;
  NonCoherentSimOptions opts_;
  mutable std::mutex mu_;  // guards memory accesses and every node's cache
  std::vector<std::unique_ptr<Node>> nodes_;
};

}  // namespace cxlkv
