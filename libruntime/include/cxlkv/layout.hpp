// SPDX-License-Identifier: MIT
// Engine KV layouts -> chunk lists.
//
// A serving engine keeps its KV cache in paged tensors; vLLM's geometry is,
// per layer, a K and a V tensor of [num_blocks, block_size, num_kv_heads,
// head_size].  Two placements are described:
//
//   layer_first  each (layer, K|V) is its own tensor; the caller gives one
//                base pointer per (layer, K|V): bases[2*layer + kv]
//   block_first  one tensor [num_blocks, num_layers, 2, block_size,
//                num_kv_heads, head_size]; bases[0] is its start
//
// A pool block always stores one engine block in the same, engine-independent
// order: layer 0 K, layer 0 V, layer 1 K, ... each block_size*heads*head_size
// elements.  So a block written by a layer-first engine can be read by a
// block-first one.  chunks_for_blocks() returns that order: 2*num_layers
// chunks per engine block (64 for Llama-3.1-8B's 32 layers, 128 for
// Qwen-32B's 64 layers); coalesce() merges neighbours that are adjacent in
// memory (a block-first block becomes one chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"
#include "cxlkv/types.hpp"

namespace cxlkv {

enum class LayoutOrder : uint32_t { layer_first = 0, block_first = 1 };
const char* to_string(LayoutOrder o);

struct EngineLayout {
  uint32_t num_layers = 0;
  uint32_t num_blocks = 0;    // engine blocks in the paged cache
  uint32_t block_size = 0;    // tokens per engine block
  uint32_t num_kv_heads = 0;
  uint32_t head_size = 0;
  uint32_t dtype_bytes = 2;   // fp16 / bf16
  LayoutOrder order = LayoutOrder::layer_first;
  // layer_first: 2*num_layers pointers (K then V of each layer); block_first: 1.
  std::vector<std::byte*> bases;

  // Bytes of one (layer, K|V) slice of one engine block.
  uint64_t chunk_bytes() const;
  // Bytes one engine block occupies in the pool (all layers, K and V).
  uint64_t block_bytes() const;
  uint32_t chunks_per_block() const { return 2 * num_layers; }
};

// Known geometries (bases left empty): Llama-3.1-8B (32 layers, 8 KV heads,
// head 128) and Qwen-32B (64 layers, 8 KV heads, head 128).
EngineLayout llama31_8b_layout(uint32_t num_blocks, uint32_t block_size = 16,
                               LayoutOrder order = LayoutOrder::layer_first);
EngineLayout qwen32b_layout(uint32_t num_blocks, uint32_t block_size = 16,
                            LayoutOrder order = LayoutOrder::layer_first);

// Checks dimensions (non-zero, no overflow), the number of base pointers and
// that none is null.  The error names the field.
Result<void> validate(const EngineLayout& l);

// Chunk list for the given engine block ids, in pool order, block after block.
// Fails on an invalid layout or a block id >= num_blocks.
Result<std::vector<Chunk>> chunks_for_blocks(const EngineLayout& l, std::span<const uint32_t> block_ids);

// Merge chunks that are adjacent in memory (order kept).
std::vector<Chunk> coalesce(std::span<const Chunk> chunks);

}  // namespace cxlkv
