// SPDX-License-Identifier: MIT
// Engine KV layouts -> chunk lists (see cxlkv/layout.hpp).
#include <string>

#include "cxlkv/layout.hpp"

namespace cxlkv {

const char* to_string(LayoutOrder o) {
  return o == LayoutOrder::layer_first ? "layer_first" : "block_first";
}

uint64_t EngineLayout::chunk_bytes() const {
  return uint64_t(block_size) * num_kv_heads * head_size * dtype_bytes;
}

uint64_t EngineLayout::block_bytes() const { return chunk_bytes() * 2 * num_layers; }

namespace {
EngineLayout make(uint32_t layers, uint32_t heads, uint32_t head, uint32_t num_blocks,
                  uint32_t block_size, LayoutOrder order) {
  EngineLayout l;
  l.num_layers = layers;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = heads;
  l.head_size = head;
  l.dtype_bytes = 2;
  l.order = order;
  return l;
}
}  // namespace

EngineLayout llama31_8b_layout(uint32_t num_blocks, uint32_t block_size, LayoutOrder order) {
  return make(32, 8, 128, num_blocks, block_size, order);
}

EngineLayout qwen32b_layout(uint32_t num_blocks, uint32_t block_size, LayoutOrder order) {
  return make(64, 8, 128, num_blocks, block_size, order);
}

Result<void> validate(const EngineLayout& l) {
  auto bad = [](const std::string& what) {
    return Error(-EINVAL, "engine layout: " + what);
  };
  if (l.num_layers == 0) return bad("num_layers is 0");
  if (l.num_blocks == 0) return bad("num_blocks is 0");
  if (l.block_size == 0) return bad("block_size is 0");
  if (l.num_kv_heads == 0) return bad("num_kv_heads is 0");
  if (l.head_size == 0) return bad("head_size is 0");
  if (l.dtype_bytes == 0 || l.dtype_bytes > 8) return bad("dtype_bytes " + std::to_string(l.dtype_bytes) + " is not 1..8");
  if (l.order != LayoutOrder::layer_first && l.order != LayoutOrder::block_first)
    return bad("unknown order " + std::to_string(uint32_t(l.order)));
  // Sizes are products of four u32s; keep every tensor under 2^56 bytes.
  unsigned __int128 tensor = (unsigned __int128)l.chunk_bytes() * l.num_blocks * 2 * l.num_layers;
  if (tensor >> 56) return bad("tensor size overflows");
  size_t want = l.order == LayoutOrder::layer_first ? 2 * size_t(l.num_layers) : 1;
  if (l.bases.size() != want)
    return bad(std::string(to_string(l.order)) + " needs " + std::to_string(want) + " base pointers, got " +
               std::to_string(l.bases.size()));
  for (size_t i = 0; i < l.bases.size(); i++)
    if (!l.bases[i]) return bad("base pointer " + std::to_string(i) + " is null");
  return {};
}

Result<std::vector<Chunk>> chunks_for_blocks(const EngineLayout& l, std::span<const uint32_t> block_ids) {
  CXLKV_TRY(validate(l));
  const uint64_t cb = l.chunk_bytes();
  std::vector<Chunk> out;
  out.reserve(block_ids.size() * l.chunks_per_block());
  for (uint32_t b : block_ids) {
    if (b >= l.num_blocks)
      return Error(-EINVAL, "engine layout: block id " + std::to_string(b) + " >= num_blocks " +
                                std::to_string(l.num_blocks));
    for (uint32_t layer = 0; layer < l.num_layers; layer++) {
      for (uint32_t kv = 0; kv < 2; kv++) {
        std::byte* p;
        if (l.order == LayoutOrder::layer_first) {
          p = l.bases[2 * layer + kv] + uint64_t(b) * cb;
        } else {
          // [num_blocks, num_layers, 2, block_size, heads, head]
          p = l.bases[0] + ((uint64_t(b) * l.num_layers + layer) * 2 + kv) * cb;
        }
        out.push_back(Chunk{p, static_cast<size_t>(cb)});
      }
    }
  }
  return out;
}

std::vector<Chunk> coalesce(std::span<const Chunk> chunks) {
  std::vector<Chunk> out;
  for (const Chunk& c : chunks) {
    if (c.len == 0) continue;
    if (!out.empty() && static_cast<std::byte*>(out.back().addr) + out.back().len == c.addr)
      out.back().len += c.len;
    else
      out.push_back(c);
  }
  return out;
}

}  // namespace cxlkv
