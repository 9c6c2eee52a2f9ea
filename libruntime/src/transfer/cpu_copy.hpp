// SPDX-License-Identifier: MIT
// CPU gather-write / scatter-read between an engine's chunk list (tensor
// slices in process memory) and one contiguous pool block.
//
//   gather_write  chunk 0 | chunk 1 | ... -> pool block, with the domain's
//                 copy_to_pool (non-temporal stores in flush mode: the
//                 payload never sits dirty in our cache, rule 1/3), then one
//                 fence, so the block is in memory when this returns and the
//                 caller may publish the index entry that points to it.
//   scatter_read  pool block -> chunks: the whole block is invalidated in
//                 one sweep, one fence, then each chunk is loaded (rules
//                 4/6; one fence per block, not per chunk).
//
// Both return the number of bytes moved, or an Error (-EINVAL for a null
// pointer with a non-zero length, -EOVERFLOW when the lengths overflow);
// nothing is copied when the list is rejected.
#pragma once

#include <cstddef>
#include <span>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "cxlkv/types.hpp"

namespace cxlkv {

Result<size_t> gather_write(MemoryDomain& d, void* pool_dst, std::span<const Chunk> chunks);
Result<size_t> scatter_read(MemoryDomain& d, const void* pool_src, std::span<const Chunk> chunks);

// Total length of a chunk list, or the error gather/scatter would report.
Result<size_t> chunk_list_bytes(std::span<const Chunk> chunks);

}  // namespace cxlkv
