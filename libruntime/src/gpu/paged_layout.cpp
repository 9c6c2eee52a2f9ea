// SPDX-License-Identifier: MIT
// Engine KV layouts on the GPU and the descriptor batches that move whole
// blocks between them and pool blocks.
#include <cerrno>
#include <string>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "cxlkv/layout.hpp"

namespace cxlkv::gpu {

uint64_t PagedLayout::chunk_bytes() const {
  return static_cast<uint64_t>(block_tokens) * num_kv_heads * head_size * elem_bytes;
}
uint64_t PagedLayout::block_bytes() const { return 2ull * num_layers * chunk_bytes(); }
uint64_t PagedLayout::stride() const {
  if (block_stride) return block_stride;
  return kind == LayoutKind::layer_first ? chunk_bytes() : block_bytes();
}

Result<void> PagedLayout::validate() const {
  if (kind != LayoutKind::layer_first && kind != LayoutKind::block_first)
    return Error(-EINVAL, "GPU layout: unknown kind " + std::to_string(static_cast<uint32_t>(kind)));
  if (!num_layers || !num_kv_heads || !head_size || !block_tokens || !elem_bytes || !num_blocks)
    return Error(-EINVAL, "GPU layout: layers, heads, head size, block tokens, element bytes and block count "
                          "must all be non-zero");
  // Geometry far beyond any model, so the products below cannot overflow.
  if (num_layers > 4096 || num_kv_heads > 4096 || head_size > 65536 || block_tokens > 65536 || elem_bytes > 16)
    return Error(-EINVAL, "GPU layout: geometry out of range");
  const size_t want = kind == LayoutKind::layer_first ? 2ull * num_layers : 1;
  if (tensors.size() != want)
    return Error(-EINVAL, "GPU layout: " + std::to_string(tensors.size()) + " tensor pointers, expected " +
                              std::to_string(want));
  for (size_t i = 0; i < tensors.size(); i++)
    if (!tensors[i]) return Error(-EINVAL, "GPU layout: tensor " + std::to_string(i) + " is NULL");
  const uint64_t per_block = kind == LayoutKind::layer_first ? chunk_bytes() : block_bytes();
  if (stride() < per_block)
    return Error(-EINVAL, "GPU layout: block stride " + std::to_string(stride()) + " is smaller than a block's " +
                              std::to_string(per_block) + " bytes");
  if (num_blocks > UINT64_MAX / stride()) return Error(-EINVAL, "GPU layout: tensor size overflows");
  return {};
}

PagedLayout PagedLayout::from_c(const cxlkv_gpu_layout& l) {
  PagedLayout p;
  p.kind = static_cast<LayoutKind>(l.kind);
  p.num_layers = l.num_layers;
  p.num_kv_heads = l.num_kv_heads;
  p.head_size = l.head_size;
  p.block_tokens = l.block_tokens;
  p.elem_bytes = l.elem_bytes;
  p.num_blocks = l.num_blocks;
  p.block_stride = l.block_stride;
  if (l.tensors) p.tensors.assign(l.tensors, l.tensors + l.ntensors);
  return p;
}

PagedLayout PagedLayout::from_engine(const EngineLayout& e) {
  PagedLayout p;
  p.kind = e.order == LayoutOrder::block_first ? LayoutKind::block_first : LayoutKind::layer_first;
  p.num_layers = e.num_layers;
  p.num_kv_heads = e.num_kv_heads;
  p.head_size = e.head_size;
  p.block_tokens = e.block_size;
  p.elem_bytes = e.dtype_bytes;
  p.num_blocks = e.num_blocks;
  for (std::byte* b : e.bases) p.tensors.push_back(reinterpret_cast<uintptr_t>(b));
  return p;
}

PagedLayout PagedLayout::llama31_8b(LayoutKind kind, uint64_t num_blocks, std::vector<uint64_t> tensors,
                                    uint32_t block_tokens) {
  PagedLayout p;
  p.kind = kind;
  p.num_layers = 32;
  p.num_kv_heads = 8;
  p.head_size = 128;
  p.block_tokens = block_tokens;
  p.elem_bytes = 2;
  p.num_blocks = num_blocks;
  p.tensors = std::move(tensors);
  return p;
}

void block_slices(const PagedLayout& layout, uint64_t block_id, std::vector<DevicePiece>& out) {
  const uint64_t off = block_id * layout.stride();
  if (layout.kind == LayoutKind::block_first) {
    out.push_back({layout.tensors[0] + off, layout.block_bytes()});
    return;
  }
  const uint64_t n = layout.chunk_bytes();
  const size_t first = out.size();
  for (uint64_t t : layout.tensors) {
    const uint64_t dev = t + off;
    if (out.size() > first && out.back().dev + out.back().len == dev) out.back().len += n;
    else out.push_back({dev, n});
  }
}

Result<std::vector<cxlkv_copy_desc>> plan_blocks(const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                                 std::span<const uint64_t> pool_offs, const PoolPin& pin,
                                                 Direction dir) {
  CXLKV_TRY(layout.validate());
  if (block_ids.size() != pool_offs.size())
    return Error(-EINVAL, "GPU transfer: " + std::to_string(block_ids.size()) + " block ids but " +
                              std::to_string(pool_offs.size()) + " pool blocks");
  std::vector<cxlkv_copy_desc> descs;
  descs.reserve(block_ids.size() * (layout.kind == LayoutKind::layer_first ? 2 * layout.num_layers : 1));
  std::vector<DevicePiece> gpu, pool;
  for (size_t i = 0; i < block_ids.size(); i++) {
    if (block_ids[i] >= layout.num_blocks)
      return Error(-EINVAL, "GPU transfer: block id " + std::to_string(block_ids[i]) + " is out of range (layout has " +
                                std::to_string(layout.num_blocks) + " blocks)");
    gpu.clear();
    pool.clear();
    block_slices(layout, block_ids[i], gpu);
    if (auto r = pin.to_device(pool_offs[i], layout.block_bytes(), pool); !r)
      return Error(r.error().code(), "GPU transfer of block " + std::to_string(block_ids[i]) + ": " +
                                         r.error().message());
    // Zip the two piece lists: a descriptor ends wherever either side's piece ends.
    size_t a = 0, b = 0;
    uint64_t ia = 0, ib = 0;
    while (a < gpu.size() && b < pool.size()) {
      const uint64_t n = std::min(gpu[a].len - ia, pool[b].len - ib);
      const uint64_t g = gpu[a].dev + ia, p = pool[b].dev + ib;
      descs.push_back(dir == Direction::gather ? cxlkv_copy_desc{g, p, n} : cxlkv_copy_desc{p, g, n});
      if ((ia += n) == gpu[a].len) a++, ia = 0;
      if ((ib += n) == pool[b].len) b++, ib = 0;
    }
  }
  return descs;
}

}  // namespace cxlkv::gpu
