// SPDX-License-Identifier: MIT
// Where the standard pool format puts its carves (pool/format.hpp formats
// them): a pure function of the pool size and options, with the control
// carve's header.  In carve/ with the other carve planners, below every
// layer whose carve it places (docs/architecture.md "The include rule").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cxlkv/region.hpp"
#include "uapi/cxlkv_ctrl.h"

namespace cxlkv {

struct PoolFormatOptions {
  uint64_t size = 0;                              // as FormatOptions::size
  uint32_t max_nodes = 16;                        // 1 .. CXLKV_MAX_NODES
  uint32_t max_locks = CXLKV_DEFAULT_MAX_LOCKS;   // CXLKV_MIN_LOCKS .. CXLKV_MAX_LOCKS
  uint64_t index_entries = 0;  // 0: one per 64 KiB of kv space; rounded up to a power of two
  bool force = false;          // overwrite a valid pool
  bool standard = true;        // false: superblock only (no carves)
  // More carves (name, bytes rounded up to 2 MiB) placed between alloc and
  // kv, zeroed at format: e.g. the RPC rings (CXLKV_CARVE_RPC,
  // cxlkv/format/rpc_format.h), whose server writes their header on first start.
  std::vector<std::pair<std::string, uint64_t>> extra_carves = {};
};

// Where everything goes; a pure function of the pool size and options.
struct PoolLayout {
  uint64_t control_off = 0, control_size = 0;
  uint64_t index_off = 0, index_size = 0;
  uint64_t alloc_off = 0, alloc_size = 0;
  uint64_t kv_off = 0, kv_size = 0;
  struct Extra {
    std::string name;
    uint64_t off = 0, size = 0;
  };
  std::vector<Extra> extra;  // PoolFormatOptions::extra_carves, in order after alloc
  uint64_t index_entries = 0;
  cxlkv_ctrl_header ctrl{};  // the control carve header to write
};

// Bytes of kv space per default index entry.
inline constexpr uint64_t kIndexBytesPerEntry = 64 * 1024;
// The alloc carve gets 1/kAllocFraction of the space after control: the
// block owner records (1/128 of the kv space; docs/integrity.md "Block owners: overlapping entries"), the remote-free
// bits (1/512) and the bitmaps and tables (under 1/1024 together).
inline constexpr uint64_t kAllocFraction = 80;
// Room in the alloc carve for the object store's named roots.
inline constexpr uint64_t kObjectStoreRoom = 1ull << 20;

// Control carve header for max_nodes / max_locks; `bytes` gets the carve's
// unrounded size.
cxlkv_ctrl_header plan_control(uint32_t max_nodes, uint32_t max_locks, uint64_t* bytes);

// Plan the standard layout of a pool of `pool_size` bytes.  `pool` names the
// pool in errors (-EINVAL bad options, -ENOSPC pool too small).
Result<PoolLayout> plan_pool_layout(std::string_view pool, uint64_t pool_size,
                                    const PoolFormatOptions& opts);

}  // namespace cxlkv
