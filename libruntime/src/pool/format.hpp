// SPDX-License-Identifier: MIT
// The standard pool format: a superblock plus the four system carves every
// cxlkv layer expects, in this order from the start of the pool:
//
//   [0, 2 MiB)   superblock area
//   control      uapi/cxlkv_ctrl.h: header, lease, node table, lock slots,
//                grants, doorbells (sized by max_nodes and max_locks)
//   index        prefix index: one header line + index_entries 64 B entries
//   alloc        chunk allocator bitmap + object store roots
//   kv           KV block data: the rest of the pool
//
// All four carry CXLKV_CARVE_F_SYSTEM and memory type WB.  format_pool()
// zeroes control/index/alloc, writes the control header, then calls each
// layer's initializer explicitly (see format.cpp).  Where the carves go
// (plan_pool_layout) is in carve/pool_layout.hpp, below every layer whose
// carve it places (docs/architecture.md "The include rule").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "carve/pool_layout.hpp"
#include "cxlkv/region.hpp"

namespace cxlkv {

// -EBUSY naming the live nodes and the lock manager when the pool at `uri`
// is in use (what opts.force may not overwrite); nothing when it is not,
// or holds no readable pool.
Result<void> refuse_live_pool(std::string_view uri);

// Region::format + the standard carves and their initial contents.  With
// opts.force, refuses a pool in use (refuse_live_pool).
Result<std::unique_ptr<Region>> format_pool(std::string_view uri, const PoolFormatOptions& opts,
                                            const OpenOptions& open_opts = {});

// The same on caller memory (Region::format_memory; opts.size is ignored):
// tests format a standard pool in a buffer and open it from several
// NonCoherentSim nodes with Region::open_memory.
Result<std::unique_ptr<Region>> format_pool_memory(std::string_view name, void* base, uint64_t size,
                                                   const PoolFormatOptions& opts,
                                                   const OpenOptions& open_opts = {});

// Create the standard carves of plan `L` on a freshly formatted, empty pool
// and initialize their contents (used by both functions above).
Result<void> lay_out_standard_pool(Region& r, const PoolLayout& L);

}  // namespace cxlkv
