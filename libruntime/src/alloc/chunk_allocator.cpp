// SPDX-License-Identifier: MIT
// The global tier of the allocator: a bitmap of chunks in the alloc carve,
// read-modify-written only under the global lock CXLKV_LOCK_ALLOC (rule 7),
// every changed word written back with an 8-byte NT store (rule 1: any node
// may hold the lock next).
#include <cerrno>
#include <string>

#include "alloc/heap_layout.hpp"
#include "util/log.hpp"

namespace cxlkv {

Result<ChunkAllocator> ChunkAllocator::open(NodeContext& node) {
  auto carve = node.region().carve(CXLKV_CARVE_ALLOC);
  if (!carve) return carve.error();
  auto h = alloc::read_alloc_header(node.region(), node.domain());
  if (!h) return h.error();
  ChunkAllocator a(node);
  a.base_ = node.region().at(carve->offset);
  a.hdr_ = h.value();
  a.geo_ = {h->chunk_size, h->nchunks, h->arena_off};
  return a;
}

cxlkv_chunk_desc ChunkAllocator::desc(uint64_t chunk) const {
  auto* d = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off) + chunk;
  return node_->domain().read_fresh(d);  // rule 4
}

uint64_t ChunkAllocator::free_chunks() const {
  MemoryDomain& d = node_->domain();
  auto* words = reinterpret_cast<const uint64_t*>(base_ + hdr_.bitmap_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  d.invalidate(words, nw * 8);  // rule 4
  d.fence();
  uint64_t used = 0;
  for (uint64_t i = 0; i < nw; i++) used += __builtin_popcountll(d.read(&words[i]));
  return geo_.nchunks - used;
}

Result<uint64_t> ChunkAllocator::alloc_run(uint64_t n, bool small, uint32_t size_class) {
  MemoryDomain& d = node_->domain();
  if (n == 0 || n > geo_.nchunks)
    return Error(-ENOSPC, "pool " + node_->region().uri() + ": allocation of " + std::to_string(n) +
                              " chunks exceeds the kv carve (" + std::to_string(geo_.nchunks) + " chunks of " +
                              std::to_string(geo_.chunk_size) + " bytes)");
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  // The guard invalidates the bitmap after acquiring (rule 4) and flushes
  // it before releasing (rule 3); we also write changed words NT (rule 1).
  auto g = LockGuard::take(lock, {words, nw * 8});
  if (!g) return g.error();

  auto bit = [&](uint64_t i) { return (d.read(&words[i / 64]) >> (i % 64)) & 1; };
  uint64_t first = geo_.nchunks, run = 0, used = 0;
  for (uint64_t i = 0; i < geo_.nchunks; i++) {
    if ((i % 64) == 0 && run == 0 && n == 1 && d.read(&words[i / 64]) == ~0ull && i + 64 <= geo_.nchunks) {
      used += 64;
      i += 63;
      continue;
    }
    if (bit(i)) {
      used++;
      run = 0;
      continue;
    }
    if (++run == n) {
      first = i + 1 - n;
      break;
    }
  }
  if (first == geo_.nchunks) {
    uint64_t free_now = 0;
    for (uint64_t i = 0; i < nw; i++) free_now += __builtin_popcountll(d.read(&words[i]));
    free_now = geo_.nchunks - free_now;
    return Error(-ENOSPC, "pool " + node_->region().uri() + ": kv carve exhausted: no free run of " +
                              std::to_string(n) + " chunk(s) of " + std::to_string(geo_.chunk_size) + " bytes (" +
                              std::to_string(free_now) + " of " + std::to_string(geo_.nchunks) + " chunks free)");
  }
  for (uint64_t i = first; i < first + n; i++) {
    uint64_t w = d.read(&words[i / 64]) | (1ull << (i % 64));
    d.write_nt(&words[i / 64], w);  // rule 1
  }
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  for (uint64_t i = first; i < first + n; i++) {
    cxlkv_chunk_desc cd{};
    cd.owner = static_cast<uint16_t>(node_->node());
    if (small) {
      cd.kind = CXLKV_CHUNK_SMALL;
      cd.size_class = static_cast<uint8_t>(size_class);
      cd.run = 1;
    } else {
      cd.kind = i == first ? CXLKV_CHUNK_LARGE_HEAD : CXLKV_CHUNK_LARGE_TAIL;
      cd.run = static_cast<uint32_t>(i == first ? n : i - first);
    }
    d.write_nt(&descs[i], cd);  // rule 1: eight descriptors share a line
  }
  d.fence();  // rule 3: descriptors in memory before the lock is released
  return first;
}

Result<void> ChunkAllocator::free_run(uint64_t first) {
  MemoryDomain& d = node_->domain();
  if (first >= geo_.nchunks)
    return Error(-EINVAL, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) + " out of range");
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  auto g = LockGuard::take(lock, {words, nw * 8});
  if (!g) return g.error();
  cxlkv_chunk_desc cd = d.read_fresh(&descs[first]);  // rule 4
  uint64_t n;
  if (cd.kind == CXLKV_CHUNK_SMALL) n = 1;
  else if (cd.kind == CXLKV_CHUNK_LARGE_HEAD) n = cd.run;
  else
    return Error(-EINVAL, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) +
                              " is not the start of an allocation (" +
                              (cd.kind == CXLKV_CHUNK_FREE ? "free" : "inside a larger run") + ")");
  if (first + n > geo_.nchunks)
    return Error(-EUCLEAN, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) + " run of " +
                               std::to_string(n) + " overruns the table");
  const cxlkv_chunk_desc none{CXLKV_CHUNK_NO_OWNER, CXLKV_CHUNK_FREE, 0, 0};
  for (uint64_t i = first; i < first + n; i++) {
    d.write_nt(&descs[i], none);  // rule 1
    uint64_t w = d.read(&words[i / 64]) & ~(1ull << (i % 64));
    d.write_nt(&words[i / 64], w);  // rule 1
  }
  d.fence();  // rule 3
  return {};
}

}  // namespace cxlkv
