// SPDX-License-Identifier: MIT
// The standard pool layout (carve/pool_layout.hpp).
#include "carve/pool_layout.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "region/superblock.hpp"

namespace cxlkv {

namespace {

constexpr uint64_t kAlign = CXLKV_CARVE_ALIGN;
constexpr uint64_t kLine = CXLKV_LINE_SIZE;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t pow2_ceil(uint64_t v) {
  uint64_t p = 1;
  while (p < v && p < (1ull << 62)) p <<= 1;
  return p;
}

}  // namespace

cxlkv_ctrl_header plan_control(uint32_t max_nodes, uint32_t max_locks, uint64_t* bytes) {
  cxlkv_ctrl_header h{};
  h.magic = CXLKV_CTRL_MAGIC;
  h.version = CXLKV_CTRL_VERSION;
  h.max_nodes = max_nodes;
  h.max_locks = max_locks;
  uint64_t off = sizeof(cxlkv_ctrl_header);
  h.lease_off = off;
  off += sizeof(cxlkv_lease);
  h.node_table_off = off;
  off += uint64_t(max_nodes) * sizeof(cxlkv_node_entry);
  h.lock_table_off = off;
  off += uint64_t(max_locks) * max_nodes * sizeof(cxlkv_lock_slot);
  h.grant_table_off = off;
  off += uint64_t(max_locks) * sizeof(cxlkv_lock_grant);
  h.doorbell_off = off;
  off += uint64_t(max_nodes) * sizeof(cxlkv_doorbell);
  if (bytes) *bytes = off;
  // The uapi's own formula must agree, or the kernel and we disagree on
  // where the control carve ends.
  if (off != cxlkv_ctrl_carve_bytes(max_nodes, max_locks)) std::abort();
  h.checksum = cxlkv_ctrl_header_checksum(&h);
  return h;
}

Result<PoolLayout> plan_pool_layout(std::string_view pool, uint64_t pool_size,
                                    const PoolFormatOptions& o) {
  const std::string P = "pool " + std::string(pool) + ": ";
  if (o.max_nodes < 1 || o.max_nodes > CXLKV_MAX_NODES)
    return Error(-EINVAL, P + "max_nodes " + std::to_string(o.max_nodes) + " out of range 1.." +
                              std::to_string(CXLKV_MAX_NODES));
  if (o.max_locks < CXLKV_MIN_LOCKS || o.max_locks > CXLKV_MAX_LOCKS)
    return Error(-EINVAL, P + "max_locks " + std::to_string(o.max_locks) + " out of range " +
                              std::to_string(CXLKV_MIN_LOCKS) + ".." +
                              std::to_string(CXLKV_MAX_LOCKS));
  if (o.index_entries > (1ull << 32))
    return Error(-EINVAL, P + "index_entries " + std::to_string(o.index_entries) + " too large (max 2^32)");

  if (pool_size % kAlign != 0 || pool_size < CXLKV_MIN_POOL_SIZE)
    return Error(-EINVAL, P + "size " + std::to_string(pool_size) + " is not a multiple of 2 MiB of at least " +
                              region::human_size(CXLKV_MIN_POOL_SIZE));

  PoolLayout L;
  uint64_t ctrl_bytes = 0;
  L.ctrl = plan_control(o.max_nodes, o.max_locks, &ctrl_bytes);
  L.control_off = CXLKV_FIRST_CARVE_OFF;
  L.control_size = round_up(ctrl_bytes, kAlign);

  // What is left for index + alloc + kv.
  uint64_t used = L.control_off + L.control_size;
  if (pool_size < used + 3 * kAlign)
    return Error(-ENOSPC, P + region::human_size(pool_size) + " is too small for the standard layout (control carve " +
                              region::human_size(L.control_size) + " + index, alloc and kv of at least 2 MiB each)");
  uint64_t rest = pool_size - used;

  // alloc (cxlkv/format/alloc_format.h): the per-chunk remote-free bits are
  // 1/512 of the kv space whatever the chunk size; bitmap, chunk table and
  // per-node pending bits stay under 1/4096 each at the smallest chunk
  // size (64 KiB); the block owner records (docs/integrity.md "Block owners: overlapping entries") are 1/128.  1/80
  // of the rest covers them all; the object store gets its own room.
  L.alloc_size = round_up(rest / kAllocFraction + kObjectStoreRoom, kAlign);

  L.index_entries = o.index_entries ? pow2_ceil(o.index_entries)
                                    : pow2_ceil(std::max<uint64_t>(1024, rest / kIndexBytesPerEntry));
  L.index_size = round_up(kLine + L.index_entries * kLine, kAlign);  // header line + entries

  uint64_t extra_total = 0;
  for (const auto& [name, bytes] : o.extra_carves) {
    if (bytes == 0) return Error(-EINVAL, P + "extra carve '" + name + "' of size 0");
    L.extra.push_back({name, 0, round_up(bytes, kAlign)});
    extra_total += L.extra.back().size;
  }
  if (L.index_size + L.alloc_size + extra_total + kAlign > rest)
    return Error(-ENOSPC, P + region::human_size(pool_size) + " is too small: control " +
                              region::human_size(L.control_size) + ", index " +
                              region::human_size(L.index_size) + " (" + std::to_string(L.index_entries) +
                              " entries), alloc " + region::human_size(L.alloc_size) +
                              " leave no 2 MiB for kv");
  L.index_off = used;
  L.alloc_off = L.index_off + L.index_size;
  uint64_t next = L.alloc_off + L.alloc_size;
  for (auto& x : L.extra) {
    x.off = next;
    next += x.size;
  }
  L.kv_off = next;
  L.kv_size = pool_size - L.kv_off;
  return L;
}

}  // namespace cxlkv
