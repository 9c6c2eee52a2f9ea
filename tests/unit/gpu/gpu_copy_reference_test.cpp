// SPDX-License-Identifier: MIT
// The CPU reference of the GPU copy kernels (the oracle of the GPU tests)
// against plain memcpy: random batches, every relative misalignment, tails,
// tile boundaries, and the sparse-read index arithmetic.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/copy_core.h"
#include "gpu/reference_backend.hpp"

using namespace cxlkv::gpu;
namespace cc = cxlkv::copycore;

namespace {

uint64_t addr(const std::vector<unsigned char>& v, size_t off) { return reinterpret_cast<uintptr_t>(v.data() + off); }

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(r());
  return v;
}

// A batch of non-overlapping descriptors from src to dst at random
// offsets and lengths; returns the descriptors and the expected dst image.
struct Batch {
  std::vector<cxlkv_copy_desc> descs;
  std::vector<unsigned char> expect;
};

Batch random_batch(const std::vector<unsigned char>& src, std::vector<unsigned char>& dst, size_t n, uint64_t max_len,
                   uint64_t seed) {
  std::mt19937_64 r(seed);
  Batch b;
  b.expect = dst;
  // Destinations in disjoint slots of dst, sources anywhere in src.
  const size_t slot = dst.size() / n;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = r() % (max_len + 1);
    if (len > slot - 16) len = slot - 16;
    const size_t d = i * slot + r() % 16;
    const size_t s = r() % (src.size() - len);
    b.descs.push_back({addr(src, s), addr(dst, d), len});
    std::memcpy(b.expect.data() + d, src.data() + s, len);  // the naive oracle of the oracle
  }
  return b;
}

}  // namespace

TEST(GpuCopyReference, RandomBatchesEqualMemcpy) {
  auto src = random_bytes(1 << 20, 1);
  for (uint64_t seed = 1; seed <= 20; seed++) {
    std::vector<unsigned char> dst(1 << 20, 0xEE);
    auto b = random_batch(src, dst, 1 + seed * 3, 40000, seed);
    reference_copy(b.descs.data(), b.descs.size());
    ASSERT_EQ(0, std::memcmp(dst.data(), b.expect.data(), dst.size())) << "seed " << seed;
  }
}

TEST(GpuCopyReference, EveryRelativeMisalignmentAndTailIsExact) {
  auto src = random_bytes(4 * cc::kTileBytes, 2);
  // Lengths around vector, unroll-round and tile boundaries.
  const uint64_t lens[] = {0, 1, 15, 16, 17, 255, 4095, 4096, 4097, cc::kTileBytes - 1, cc::kTileBytes,
                           cc::kTileBytes + 1, 2 * cc::kTileBytes + 7, 3 * cc::kTileBytes};
  for (size_t so = 0; so < 16; so++) {
    for (size_t doff = 0; doff < 16; doff++) {
      for (uint64_t len : lens) {
        std::vector<unsigned char> dst(4 * cc::kTileBytes + 64, 0xA5);
        auto expect = dst;
        std::memcpy(expect.data() + doff, src.data() + so, len);
        cxlkv_copy_desc d{addr(src, so), addr(dst, doff), len};
        reference_copy(&d, 1);
        ASSERT_EQ(0, std::memcmp(dst.data(), expect.data(), dst.size()))
            << "src offset " << so << " dst offset " << doff << " len " << len;
      }
    }
  }
}

TEST(GpuCopyReference, AccessWidthIsTheWidestCoAlignment) {
  EXPECT_EQ(16u, cc::coalign(0x1000, 0x2000));
  EXPECT_EQ(16u, cc::coalign(0x1003, 0x2003));  // same misalignment: head, then 16-byte vectors
  EXPECT_EQ(8u, cc::coalign(0x1008, 0x2000));
  EXPECT_EQ(4u, cc::coalign(0x1004, 0x2000));
  EXPECT_EQ(2u, cc::coalign(0x1002, 0x2000));
  EXPECT_EQ(1u, cc::coalign(0x1001, 0x2000));
}

TEST(GpuCopyReference, TilesCoverEachDescriptorExactlyOnce) {
  cxlkv_copy_desc d[] = {{0x10000, 0x90000, 3 * cc::kTileBytes + 5}, {0x20000, 0xA0000, 0}, {0x30003, 0xB0003, 7}};
  const uint64_t n = cc::count_tiles(d, 3);
  ASSERT_EQ(5u, n);
  std::vector<cxlkv_copy_desc> t(n);
  cc::plan_tiles(d, 3, t.data());
  EXPECT_EQ(0x10000u, t[0].src);
  EXPECT_EQ(0x90000u + 3 * cc::kTileBytes, t[3].dst);
  EXPECT_EQ(5u, t[3].len);
  EXPECT_EQ(0x30003u, t[4].src);
  EXPECT_EQ(7u, t[4].len);
}

TEST(GpuCopyReference, SparseReadEqualsNaiveGather) {
  // 2 layers x 3 heads of 64 tokens; pieces of 160 bytes with a 256-byte token stride.
  const uint64_t piece = 160, stride = 256, ntok = 64;
  const size_t nlists = 6;
  auto pool = random_bytes(nlists * ntok * stride, 3);
  std::mt19937_64 r(4);
  std::vector<cxlkv_sparse_list> lists;
  std::vector<uint32_t> tokens;
  for (size_t k = 0; k < nlists; k++) {
    const uint32_t count = k == 2 ? 0 : static_cast<uint32_t>(1 + r() % 16);  // one empty list
    lists.push_back({addr(pool, k * ntok * stride), 0, stride, piece, static_cast<uint32_t>(tokens.size()), count});
    for (uint32_t i = 0; i < count; i++) tokens.push_back(static_cast<uint32_t>(r() % ntok));
  }
  std::vector<unsigned char> out(tokens.size() * piece, 0), expect(out.size(), 0);
  for (auto& l : lists) l.dst_base = addr(out, l.first * piece);
  for (const auto& l : lists)
    for (uint32_t i = 0; i < l.count; i++)
      std::memcpy(expect.data() + (l.first + i) * piece,
                  reinterpret_cast<const unsigned char*>(l.src_base) + tokens[l.first + i] * stride, piece);
  ASSERT_EQ(0, reference_sparse_copy(lists.data(), lists.size(), tokens.data(), tokens.size(), piece));
  EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), out.size()));
  EXPECT_EQ(16u, cc::sparse_width(lists.data(), lists.size(), piece));
}

TEST(GpuCopyReference, SparseReadOfOddPiecesUsesByteUnits) {
  auto pool = random_bytes(4096, 5);
  std::vector<unsigned char> out(3 * 13, 0);
  std::vector<uint32_t> tokens = {7, 0, 30};
  cxlkv_sparse_list l{addr(pool, 3), addr(out, 0), 101, 13, 0, 3};
  ASSERT_EQ(1u, cc::sparse_width(&l, 1, 13));
  ASSERT_EQ(0, reference_sparse_copy(&l, 1, tokens.data(), tokens.size(), 13));
  for (size_t i = 0; i < 3; i++)
    EXPECT_EQ(0, std::memcmp(out.data() + i * 13, pool.data() + 3 + tokens[i] * 101, 13)) << "piece " << i;
}

TEST(GpuCopyReference, SparseListsThatAreNotAPrefixSumAreRefused) {
  std::vector<unsigned char> pool(1024), out(1024);
  uint32_t tokens[4] = {0, 1, 2, 3};
  cxlkv_sparse_list gap[2] = {{addr(pool, 0), addr(out, 0), 16, 16, 0, 2}, {addr(pool, 0), addr(out, 64), 16, 16, 3, 1}};
  EXPECT_EQ(-EINVAL, reference_sparse_copy(gap, 2, tokens, 4, 16));
  cxlkv_sparse_list short_of_tokens{addr(pool, 0), addr(out, 0), 16, 16, 0, 3};
  EXPECT_EQ(-EINVAL, reference_sparse_copy(&short_of_tokens, 1, tokens, 4, 16));
  cxlkv_sparse_list ok{addr(pool, 0), addr(out, 0), 16, 16, 0, 4};
  EXPECT_EQ(-EINVAL, reference_sparse_copy(&ok, 1, tokens, 4, 0));  // zero-byte pieces
  EXPECT_EQ(0, reference_sparse_copy(&ok, 1, tokens, 4, 16));
}

// ---- launch shapes for small chunks and small batches (docs/gpu.md "Launch shapes") ----

TEST(GpuCopyShapes, EveryShapeCopiesEveryChunkSizeAndBatchSizeExactly) {
  // Chunk sizes of small models' 16-token blocks (2-64 KiB, plus odd ones
  // around the warp tile) and batches of 1 to 1024 chunks, the kernels'
  // thread emulation in each shape against memcpy.
  const uint64_t chunks[] = {2048, 4096, 4095, 4097, 8192, 16384, 16400, 32768, 65536};
  const size_t batches[] = {1, 3, 64, 128, 129, 1024};
  const uint32_t shapes[] = {CXLKV_CUDA_SHAPE_AUTO, CXLKV_CUDA_SHAPE_BLOCK, CXLKV_CUDA_SHAPE_WARP};
  auto src = random_bytes(4 << 20, 11);
  uint64_t seed = 100;
  for (uint64_t chunk : chunks) {
    for (size_t n : batches) {
      if (n * chunk > (16u << 20)) continue;  // keep the test quick
      for (uint32_t shape : shapes) {
        std::vector<unsigned char> dst(n * (chunk + 32), 0xC3);
        std::mt19937_64 r(seed++);
        std::vector<cxlkv_copy_desc> d;
        auto expect = dst;
        for (size_t i = 0; i < n; i++) {
          const size_t doff = i * (chunk + 32) + (r() % 2 ? 0 : r() % 16);  // aligned and misaligned
          const size_t soff = r() % (src.size() - chunk);
          d.push_back({addr(src, soff), addr(dst, doff), chunk});
          std::memcpy(expect.data() + doff, src.data() + soff, chunk);
        }
        ASSERT_EQ(0, reference_copy_shaped(d.data(), d.size(), shape));
        ASSERT_EQ(0, std::memcmp(dst.data(), expect.data(), dst.size()))
            << "chunk " << chunk << " batch " << n << " shape " << shape;
      }
    }
  }
}

TEST(GpuCopyShapes, SmallChunksGetAWarpPerTileLargeOnesABlock) {
  std::vector<cxlkv_copy_desc> small(10, cxlkv_copy_desc{0, 0, 4096}), large(10, cxlkv_copy_desc{0, 0, 32768});
  EXPECT_EQ(CXLKV_CUDA_SHAPE_WARP, cc::choose_shape(small.data(), small.size(), CXLKV_CUDA_SHAPE_AUTO).id);
  EXPECT_EQ(CXLKV_CUDA_SHAPE_BLOCK, cc::choose_shape(large.data(), large.size(), CXLKV_CUDA_SHAPE_AUTO).id);
  EXPECT_EQ(CXLKV_CUDA_SHAPE_BLOCK, cc::choose_shape(small.data(), small.size(), CXLKV_CUDA_SHAPE_BLOCK).id);
  // Empty descriptors do not drag the mean down.
  std::vector<cxlkv_copy_desc> mixed = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 65536}};
  EXPECT_EQ(CXLKV_CUDA_SHAPE_BLOCK, cc::choose_shape(mixed.data(), mixed.size(), CXLKV_CUDA_SHAPE_AUTO).id);
  // A warp-shape thread block holds 8 tiles: 1024 4-KiB chunks need 128 blocks.
  EXPECT_EQ(128u, cc::grid_for(1024, cc::kWarpShape));
  EXPECT_EQ(1u, cc::grid_for(1, cc::kWarpShape));
  EXPECT_EQ(64u, cc::grid_for(64, cc::kBlockShape));
  // Bytes in flight per round: a whole 4 KiB tile per warp, 16 KiB per block.
  EXPECT_EQ(cc::kWarpTileBytes, uint64_t(cc::kWarpThreads) * cc::kWarpUnroll * 16);
  EXPECT_EQ(cc::kTileBytes, uint64_t(cc::kThreads) * cc::kUnroll * 16);
}

TEST(GpuCopyShapes, TilePrefixFindsEveryTilesDescriptor) {
  // Descriptors of 0, 1, 3 tiles and empty ones between: tile_at returns the
  // right piece of the right descriptor for every tile index.
  cxlkv_copy_desc d[] = {{0x1000, 0x9000, 0}, {0x2000, 0xA000, 100}, {0x3000, 0xB000, 0},
                         {0x4000, 0xC000, 2 * 4096 + 5}, {0x5000, 0xD000, 0}};
  uint32_t first[6];
  ASSERT_EQ(4u, cc::tile_prefix(d, 5, 4096, first));
  auto t0 = cc::tile_at(d, first, 5, 0, 4096);
  EXPECT_EQ(0x2000u, t0.src);
  EXPECT_EQ(100u, t0.len);
  auto t3 = cc::tile_at(d, first, 5, 3, 4096);
  EXPECT_EQ(0x4000u + 2 * 4096, t3.src);
  EXPECT_EQ(0xC000u + 2 * 4096, t3.dst);
  EXPECT_EQ(5u, t3.len);
  EXPECT_EQ(4096u, cc::tile_at(d, first, 5, 1, 4096).len);
}
