// SPDX-License-Identifier: MIT
// Layouts of the allocator: the alloc carve plan (cxlkv/format/alloc_format.h) and
// the node heap's state in node-local shared memory.  Below sync/ and
// alloc/: the node context sizes node-local memory with
// node_heap_local_bytes (docs/architecture.md "The include rule").
#pragma once

#include <cstdint>
#include <string>

#include "cxlkv/alloc.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"

namespace cxlkv::alloc {

// The alloc carve's header for nchunks chunks; `bytes` gets the space used.
cxlkv_alloc_header plan_alloc(uint64_t nchunks, uint64_t chunk_size, uint64_t arena_off, uint32_t max_nodes,
                              uint32_t objstore_entries, uint64_t* bytes);

// Validated alloc header of an opened pool (rule 4: read fresh).
Result<cxlkv_alloc_header> read_alloc_header(const Region& region, MemoryDomain& d);

// Bytes of node-local memory a node heap needs for this pool (0 when the
// pool has no alloc carve, e.g. a superblock-only pool).
Result<uint64_t> node_heap_local_bytes(const Region& region, MemoryDomain& d);

constexpr uint32_t kNoChunk = 0xffffffffu;

// Per pool chunk, in node-local memory; meaningful while this node owns it.
struct LocalChunk {
  uint32_t owned;      // 1: SMALL chunk owned by this node
  uint32_t cls;        // size class
  uint32_t bump;       // blocks [0, bump) have been handed out at least once
  uint32_t free_count; // set bits in the free bitmap
  uint32_t prev, next; // partial list of the class (chunks with free bits), kNoChunk ends
  uint32_t in_partial;
  uint32_t hint;       // free-bitmap word to scan from
  // Leading free-bitmap words in use: zeroed when a free first needs one,
  // never read beyond.  Taking a chunk touches none of its bitmap, whose
  // page in node-local memory would fault in on the first write (about
  // 25 us inside a put, measured in vLLM's worker): blocks [0, bump) come
  // from the bump pointer until one is freed.
  uint32_t bits_words;
};

struct HeapLocalHeader {
  uint64_t nchunks, chunk_size, bits_stride;  // bits_stride: bytes of free bitmap per chunk
  uint32_t cur[kSizeClasses];                 // chunk blocks come from first
  uint32_t partial[kSizeClasses];             // head of the partial list
  HeapStats stats;
};

// Offsets inside the heap area of node-local memory.
struct HeapLocalLayout {
  uint64_t chunks_off, bits_off, total;
};
HeapLocalLayout heap_local_layout(uint64_t nchunks, uint64_t chunk_size);

}  // namespace cxlkv::alloc
