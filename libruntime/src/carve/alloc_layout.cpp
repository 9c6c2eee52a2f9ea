// SPDX-License-Identifier: MIT
// Where the alloc carve's structures go (plan_alloc), reading its header
// back validated, and the node heap's area in node-local memory.  Pure
// layout over cxlkv/format/alloc_format.h: the allocator (alloc/) and the node
// context that sizes node-local memory (sync/) both read it, so it sits
// below both (docs/architecture.md "The include rule").
#include "carve/alloc_layout.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <string>

#include "carve/objstore_layout.hpp"

namespace cxlkv {

namespace {
uint64_t lines(uint64_t bytes) { return (bytes + CXLKV_LINE_SIZE - 1) / CXLKV_LINE_SIZE * CXLKV_LINE_SIZE; }
uint64_t bitmap_bytes(uint64_t bits) { return lines((bits + 63) / 64 * 8); }
std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}
}  // namespace

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
  h.state_off = off;
  off += sizeof(cxlkv_alloc_state) + lines(nchunks * sizeof(cxlkv_quarantine));
  // Block owner records (docs/integrity.md "Block owners: overlapping entries"): cxlkv_alloc_owner_off() is where this
  // plan puts them, one per CXLKV_OWNER_GRANULE bytes of the arena.
  off += cxlkv_alloc_owner_bytes(&h);
  if (bytes) *bytes = off;
  h.checksum = cxlkv_hdr_checksum(&h, sizeof h, offsetof(cxlkv_alloc_header, checksum), 8);
  return h;
}

Result<cxlkv_alloc_header> read_alloc_header(const Region& region, MemoryDomain& d) {
  auto carve = region.carve(CXLKV_CARVE_ALLOC);
  if (!carve) return carve.error();
  auto h = d.read_fresh(region.at<cxlkv_alloc_header>(carve->offset));  // rule 4
  const std::string who = "pool " + region.uri() + ": alloc carve: ";
  if (h.magic != CXLKV_ALLOC_MAGIC) return Error(-EUCLEAN, who + "not formatted (bad magic; run `cxlkvctl format`)");
  if (h.version != CXLKV_ALLOC_VERSION)
    return Error(-EPROTO, who + "layout version " + std::to_string(h.version) +
                              (h.version < CXLKV_ALLOC_VERSION ? " is older than this runtime's " : " is newer than this runtime's ") +
                              std::to_string(CXLKV_ALLOC_VERSION) + "; reformat the pool (cxlkvctl format --force) or use a matching runtime");
  // The arena is the kv carve, checked field by field before any
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
  if (h.max_nodes != region.max_nodes())
    return Error(-EUCLEAN, who + "max_nodes " + std::to_string(h.max_nodes) + " is not the superblock's " +
                               std::to_string(region.max_nodes()));
  if (need > carve->size)
    return Error(-EUCLEAN, who + "objstore_bytes " + std::to_string(h.objstore_bytes) + " with " +
                               std::to_string(h.nchunks) + " chunks needs " + std::to_string(need) +
                               " bytes, the carve has " + std::to_string(carve->size));
  const struct {
    const char* field;
    uint64_t got, want;
  } derived[] = {{"bitmap_off", h.bitmap_off, expect.bitmap_off},
                 {"chunk_table_off", h.chunk_table_off, expect.chunk_table_off},
                 {"inbox_off", h.inbox_off, expect.inbox_off},
                 {"pending_off", h.pending_off, expect.pending_off},
                 {"pending_stride", h.pending_stride, expect.pending_stride},
                 {"remote_bits_off", h.remote_bits_off, expect.remote_bits_off},
                 {"remote_bits_stride", h.remote_bits_stride, expect.remote_bits_stride},
                 {"objstore_off", h.objstore_off, expect.objstore_off},
                 {"state_off", h.state_off, expect.state_off}};
  for (const auto& f : derived)
    if (f.got != f.want)
      return Error(-EUCLEAN, who + f.field + " " + std::to_string(f.got) + " is not where the layout puts it (" +
                                 std::to_string(f.want) + " for " + std::to_string(h.nchunks) + " chunks of " +
                                 std::to_string(h.chunk_size) + " bytes)");
  if (!region.contains(h.arena_off, h.nchunks * h.chunk_size))
    return Error(-EUCLEAN, who + "the arena (" + std::to_string(h.nchunks) + " chunks at " +
                               std::to_string(h.arena_off) + ") runs past the pool");
  // Last, so that a field out of range is named above; this catches a
  // damaged field whose value still looks plausible.
  const uint64_t sum = cxlkv_hdr_checksum(&h, sizeof h, offsetof(cxlkv_alloc_header, checksum), 8);
  if (sum != h.checksum)
    return Error(-EUCLEAN, who + "header checksum mismatch (stored " + hex64(h.checksum) + ", computed " + hex64(sum) +
                               "): the header is damaged");
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

}  // namespace cxlkv
