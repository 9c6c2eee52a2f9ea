// SPDX-License-Identifier: MIT
// Engine KV layouts on the GPU and the descriptor batches that move whole
// blocks between them and pool blocks.
#include <algorithm>
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

Result<void> plan_block(const PagedLayout& layout, uint64_t block_id, uint32_t layer_lo, uint32_t layer_hi,
                        const PoolResolver& pool, Direction dir, std::vector<cxlkv_copy_desc>& out) {
  if (block_id >= layout.num_blocks)
    return Error(-EINVAL, "GPU transfer: block id " + std::to_string(block_id) + " is out of range (layout has " +
                              std::to_string(layout.num_blocks) + " blocks)");
  if (layer_lo >= layer_hi || layer_hi > layout.num_layers)
    return Error(-EINVAL, "GPU transfer: layers [" + std::to_string(layer_lo) + ", " + std::to_string(layer_hi) +
                              ") outside the layout's " + std::to_string(layout.num_layers));
  const uint64_t n = layout.chunk_bytes();
  const uint64_t off = block_id * layout.stride();
  // GPU side of the layers, in pool order (layer, K|V), adjacent slices merged.
  std::vector<DevicePiece> gpu;
  if (layout.kind == LayoutKind::block_first) {
    gpu.push_back({layout.tensors[0] + off + 2ull * layer_lo * n, 2ull * (layer_hi - layer_lo) * n});
  } else {
    for (uint32_t t = 2 * layer_lo; t < 2 * layer_hi; t++) {
      const uint64_t dev = layout.tensors[t] + off;
      if (!gpu.empty() && gpu.back().dev + gpu.back().len == dev) gpu.back().len += n;
      else gpu.push_back({dev, n});
    }
  }
  std::vector<DevicePiece> pl;
  CXLKV_TRY(pool(2ull * layer_lo * n, 2ull * (layer_hi - layer_lo) * n, pl));
  // Zip the two piece lists: a descriptor ends wherever either side's piece ends.
  size_t a = 0, b = 0;
  uint64_t ia = 0, ib = 0;
  while (a < gpu.size() && b < pl.size()) {
    const uint64_t len = std::min(gpu[a].len - ia, pl[b].len - ib);
    const uint64_t g = gpu[a].dev + ia, p = pl[b].dev + ib;
    out.push_back(dir == Direction::gather ? cxlkv_copy_desc{g, p, len} : cxlkv_copy_desc{p, g, len});
    if ((ia += len) == gpu[a].len) a++, ia = 0;
    if ((ib += len) == pl[b].len) b++, ib = 0;
  }
  if (a != gpu.size() || b != pl.size())
    return Error(-EINVAL, "GPU transfer of block " + std::to_string(block_id) + ": pool pieces do not cover its bytes");
  return {};
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
  for (size_t i = 0; i < block_ids.size(); i++) {
    const uint64_t base = pool_offs[i];
    PoolResolver r = [&pin, base](uint64_t x, uint64_t len, std::vector<DevicePiece>& out) -> Result<void> {
      if (base > UINT64_MAX - x) return Error(-ERANGE, "pool offset overflows");
      return pin.to_device(base + x, len, out);
    };
    if (block_ids[i] < layout.num_blocks) {
      // The whole block's range first, so a block partly outside the pool is refused before any planning.
      if (base > pin.size() || layout.block_bytes() > pin.size() - base)
        return Error(-ERANGE, "GPU transfer of block " + std::to_string(block_ids[i]) + ": pool range " +
                                  std::to_string(base) + "+" + std::to_string(layout.block_bytes()) +
                                  " is outside the pinned " + std::to_string(pin.size()) + " bytes");
    }
    if (auto p = plan_block(layout, block_ids[i], 0, layout.num_layers, r, dir, descs); !p)
      return Error(p.error().code(), p.error().message().rfind("GPU transfer", 0) == 0
                                         ? p.error().message()
                                         : "GPU transfer of block " + std::to_string(block_ids[i]) + ": " +
                                               p.error().message());
  }
  return descs;
}

}  // namespace cxlkv::gpu
