// SPDX-License-Identifier: MIT
// Alloc carve: plan, format initializer, header validation; size classes.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "alloc/heap_layout.hpp"
#include "objstore/objstore_format.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
uint64_t lines(uint64_t bytes) { return (bytes + CXLKV_LINE_SIZE - 1) / CXLKV_LINE_SIZE * CXLKV_LINE_SIZE; }
uint64_t bitmap_bytes(uint64_t bits) { return lines((bits + 63) / 64 * 8); }
std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

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
  // The state line: the checksum of the all-free bitmap (docs/integrity.md "Checked metadata").
  cxlkv_alloc_state state{};
  for (uint64_t i = 0; i < (nchunks + 63) / 64; i++) state.bitmap_sum ^= cxlkv_bitmap_word_sum(i, 0);
  d.publish_line(base + h.state_off, &state);  // rule 1: written by any node later
  d.fence();  // rule 3: tables in memory before the header that makes them valid
  d.store(base, &h, sizeof h);
  d.flush(base, sizeof h);
  d.fence();
  return {};
}

}  // namespace cxlkv
