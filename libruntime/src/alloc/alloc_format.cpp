// SPDX-License-Identifier: MIT
// Alloc carve: format initializer (with the object store's empty table,
// which lives in this carve); size classes.  The plan and the header
// validation are in carve/alloc_layout.cpp.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "carve/alloc_layout.hpp"
#include "carve/objstore_layout.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

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


namespace objstore {
namespace {

// The object store's table is part of the alloc carve, so the carve's
// initializer writes it empty.
Result<void> format_objstore(MemoryDomain& d, std::byte* at, uint32_t entries) {
  cxlkv_objstore_header h{};
  h.magic = CXLKV_OBJSTORE_MAGIC;
  h.version = CXLKV_OBJSTORE_VERSION;
  h.nentries = entries;
  h.table_off = sizeof h;
  cxlkv_obj_entry empty{};
  empty.check = cxlkv_obj_entry_check(&empty);
  auto* table = reinterpret_cast<cxlkv_obj_entry*>(at + h.table_off);
  for (uint32_t i = 0; i < entries; i++) d.publish_line(&table[i], &empty);  // rule 1: any node writes entries
  d.fence();  // rule 3: entries before the header
  d.publish_line(at, &h);
  d.fence();
  return {};
}

}  // namespace
}  // namespace objstore

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
