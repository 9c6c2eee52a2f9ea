// SPDX-License-Identifier: MIT
// Alloc carve: plan, format initializer, header validation; size classes.
#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "alloc/heap_layout.hpp"
#include "objstore/objstore_format.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
uint64_t lines(uint64_t bytes) { return (bytes + CXLKV_LINE_SIZE - 1) / CXLKV_LINE_SIZE * CXLKV_LINE_SIZE; }
uint64_t bitmap_bytes(uint64_t bits) { return lines((bits + 63) / 64 * 8); }

// 64 B .. 64 KiB, four classes per doubling, all multiples of the line size;
// then powers of two 128 KiB .. 1 MiB for mid-size blocks (KV blocks), so a
// block of up to half a chunk wastes less than half its class and carves a
// chunk exactly.  Chunk descriptors store class indices: append only.
constexpr uint32_t kClassBytes[kSizeClasses] = {
    64,    128,   192,   256,   320,   384,   448,   512,   640,   768,   896,   1024,
    1280,  1536,  1792,  2048,  2560,  3072,  3584,  4096,  5120,  6144,  7168,  8192,
    10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768, 40960, 49152, 57344, 65536,
    131072, 262144, 524288, 1048576};
static_assert(std::is_sorted(kClassBytes, kClassBytes + kSizeClasses));
}  // namespace

uint32_t size_class_bytes(uint32_t c) { return c < kSizeClasses ? kClassBytes[c] : 0; }

uint32_t size_class_for(uint64_t bytes, uint64_t chunk_size) {
  if (bytes == 0) bytes = 1;
  // A class must give a chunk at least 2 blocks; otherwise whole chunks.
  if (bytes > chunk_size / 2) return kSizeClasses;
  const uint32_t* p = std::lower_bound(kClassBytes, kClassBytes + kSizeClasses, bytes);
  if (p == kClassBytes + kSizeClasses || *p > chunk_size / 2) return kSizeClasses;
  return static_cast<uint32_t>(p - kClassBytes);
}

namespace alloc {

cxlkv_alloc_header plan_alloc(uint64_t nchunks, uint64_t chunk_size, uint64_t arena_off, uint32_t max_nodes,
                              uint32_t objstore_entries, uint64_t* bytes) {
  cxlkv_alloc_header h{};
  h.magic = CXLKV_ALLOC_MAGIC;
  h.version = CXLKV_ALLOC_VERSION;
  h.max_nodes = max_nodes;
  h.chunk_size = chunk_size;
  h.arena_off = arena_off;
  h.nchunks = nchunks;
  uint64_t off = sizeof(cxlkv_alloc_header);
  h.bitmap_off = off;
  off += bitmap_bytes(nchunks);
  h.chunk_table_off = off;
  off += lines(nchunks * sizeof(cxlkv_chunk_desc));
  h.inbox_off = off;
  off += uint64_t(max_nodes) * sizeof(cxlkv_remote_inbox);
  h.pending_off = off;
  h.pending_stride = bitmap_bytes(nchunks);
  off += h.pending_stride * max_nodes;
  h.remote_bits_off = off;
  h.remote_bits_stride = bitmap_bytes(chunk_size / CXLKV_ALLOC_MIN_BLOCK);
  off += h.remote_bits_stride * nchunks;
  h.objstore_off = off;
  h.objstore_bytes = objstore::objstore_bytes(objstore_entries);
  off += h.objstore_bytes;
  if (bytes) *bytes = off;
  return h;
}

Result<cxlkv_alloc_header> read_alloc_header(const Region& region, MemoryDomain& d) {
  auto carve = region.carve(CXLKV_CARVE_ALLOC);
  if (!carve) return carve.error();
  auto h = d.read_fresh(region.at<cxlkv_alloc_header>(carve->offset));  // rule 4
  const std::string who = "pool " + region.uri() + ": alloc carve: ";
  if (h.magic != CXLKV_ALLOC_MAGIC) return Error(-EUCLEAN, who + "not formatted (bad magic; run `cxlkvctl format`)");
  if (h.version != CXLKV_ALLOC_VERSION)
    return Error(-EPROTO, who + "layout version " + std::to_string(h.version) + " unknown");
  // Issue 12: the arena is the kv carve, checked field by field before any
  // arithmetic on them (a huge nchunks would wrap plan_alloc's sizes and
  // nchunks * chunk_size).
  if (h.chunk_size < CXLKV_MIN_CHUNK_SIZE || h.chunk_size > CXLKV_MAX_CHUNK_SIZE || (h.chunk_size & (h.chunk_size - 1)))
    return Error(-EUCLEAN, who + "chunk_size " + std::to_string(h.chunk_size) + " is not a power of two in range");
  auto kv = region.carve(CXLKV_CARVE_KV);
  if (!kv) return Error(-EUCLEAN, who + "the pool has no kv carve for the allocator's arena");
  if (h.arena_off != kv->offset)
    return Error(-EUCLEAN, who + "arena_off " + std::to_string(h.arena_off) + " is not the kv carve's offset " +
                               std::to_string(kv->offset));
  if (h.nchunks == 0 || h.nchunks > kv->size / h.chunk_size)
    return Error(-EUCLEAN, who + "nchunks " + std::to_string(h.nchunks) + " of " + std::to_string(h.chunk_size) +
                               " bytes do not fit the kv carve of " + std::to_string(kv->size) + " bytes");
  uint64_t need = 0;
  auto expect = plan_alloc(h.nchunks, h.chunk_size, h.arena_off, h.max_nodes,
                           objstore::objstore_entries_for(h.objstore_bytes), &need);
  if (h.chunk_size < CXLKV_MIN_CHUNK_SIZE || h.chunk_size > CXLKV_MAX_CHUNK_SIZE ||
      (h.chunk_size & (h.chunk_size - 1)) || h.max_nodes != region.max_nodes() || need > carve->size ||
      expect.bitmap_off != h.bitmap_off || expect.chunk_table_off != h.chunk_table_off ||
      expect.inbox_off != h.inbox_off || expect.pending_off != h.pending_off ||
      expect.remote_bits_off != h.remote_bits_off || expect.objstore_off != h.objstore_off ||
      !region.contains(h.arena_off, h.nchunks * h.chunk_size))
    return Error(-EUCLEAN, who + "header inconsistent (chunk size " + std::to_string(h.chunk_size) + ", " +
                               std::to_string(h.nchunks) + " chunks, carve " + std::to_string(carve->size) +
                               " bytes)");
  return h;
}

HeapLocalLayout heap_local_layout(uint64_t nchunks, uint64_t chunk_size) {
  HeapLocalLayout l{};
  l.chunks_off = (sizeof(HeapLocalHeader) + 63) / 64 * 64;
  l.bits_off = (l.chunks_off + nchunks * sizeof(LocalChunk) + 4095) / 4096 * 4096;
  l.total = l.bits_off + nchunks * bitmap_bytes(chunk_size / CXLKV_ALLOC_MIN_BLOCK);
  return l;
}

Result<uint64_t> node_heap_local_bytes(const Region& region, MemoryDomain& d) {
  if (!region.carve(CXLKV_CARVE_ALLOC)) return uint64_t{0};
  auto h = read_alloc_header(region, d);
  if (!h) return h.error();
  return heap_local_layout(h->nchunks, h->chunk_size).total;
}

}  // namespace alloc

uint64_t alloc_carve_bytes(uint64_t kv_bytes, uint32_t max_nodes, const AllocFormatOptions& o) {
  uint64_t bytes = 0;
  alloc::plan_alloc(kv_bytes / o.chunk_size, o.chunk_size, 0, max_nodes, o.objstore_entries, &bytes);
  return bytes;
}

Result<void> format_alloc_carve(Region& region, MemoryDomain& d, const AllocFormatOptions& o) {
  const std::string who = "pool " + region.uri() + ": alloc carve: ";
  if (o.chunk_size < CXLKV_MIN_CHUNK_SIZE || o.chunk_size > CXLKV_MAX_CHUNK_SIZE || (o.chunk_size & (o.chunk_size - 1)))
    return Error(-EINVAL, who + "chunk size " + std::to_string(o.chunk_size) + " is not a power of two in 64 KiB .. 1 GiB");
  if (o.objstore_entries < 16 || (o.objstore_entries & (o.objstore_entries - 1)))
    return Error(-EINVAL, who + "object store entries " + std::to_string(o.objstore_entries) +
                              " is not a power of two >= 16");
  auto carve = region.carve(CXLKV_CARVE_ALLOC);
  if (!carve) return carve.error();
  auto kv = region.carve(CXLKV_CARVE_KV);
  if (!kv) return kv.error();
  const uint32_t nodes = region.max_nodes();
  uint64_t nchunks = kv->size / o.chunk_size;
  uint64_t bytes = 0;
  // Fewer chunks if the carve cannot describe them all (the rest of kv stays unused).
  while (nchunks > 0) {
    alloc::plan_alloc(nchunks, o.chunk_size, kv->offset, nodes, o.objstore_entries, &bytes);
    if (bytes <= carve->size) break;
    nchunks = nchunks * 15 / 16;
  }
  if (nchunks == 0)
    return Error(-ENOSPC, who + "no room for a single chunk of " + std::to_string(o.chunk_size) + " bytes (kv carve " +
                              std::to_string(kv->size) + " bytes, alloc carve " + std::to_string(carve->size) + ")");
  if (nchunks < kv->size / o.chunk_size)
    log().warn("pool {}: alloc carve describes only {} of {} chunks", region.uri(), nchunks, kv->size / o.chunk_size);
  auto h = alloc::plan_alloc(nchunks, o.chunk_size, kv->offset, nodes, o.objstore_entries, &bytes);
  std::byte* base = region.at(carve->offset);
  // Single writer at format: plain zero stores + flush (rule 3), header last.
  std::vector<std::byte> zero(1 << 16);
  for (uint64_t off = sizeof h; off < bytes; off += zero.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(zero.size(), bytes - off));
    d.store(base + off, zero.data(), n);
    d.flush(base + off, n);
  }
  cxlkv_chunk_desc none{CXLKV_CHUNK_NO_OWNER, CXLKV_CHUNK_FREE, 0, 0};
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base + h.chunk_table_off);
  for (uint64_t c = 0; c < nchunks; c++) d.write_nt(&descs[c], none);  // rule 1: multi-writer words
  CXLKV_TRY(objstore::format_objstore(d, base + h.objstore_off, o.objstore_entries));
  d.fence();  // rule 3: tables in memory before the header that makes them valid
  d.store(base, &h, sizeof h);
  d.flush(base, sizeof h);
  d.fence();
  return {};
}

}  // namespace cxlkv
