// SPDX-License-Identifier: MIT
// Engine layouts -> chunk lists.
#include <gtest/gtest.h>

#include "cxlkv/layout.hpp"

using namespace cxlkv;

namespace {
struct Tensors {
  explicit Tensors(EngineLayout& l) {
    size_t per = l.chunk_bytes() * l.num_blocks;
    if (l.order == LayoutOrder::layer_first) {
      store.resize(2 * l.num_layers * per);
      for (uint32_t i = 0; i < 2 * l.num_layers; i++) l.bases.push_back(store.data() + i * per);
    } else {
      store.resize(2 * l.num_layers * per);
      l.bases.push_back(store.data());
    }
  }
  std::vector<std::byte> store;
};
}  // namespace

TEST(EngineLayout, Llama8BBlockIs64ChunksOf32KiB) {
  auto l = llama31_8b_layout(8);
  Tensors t(l);
  uint32_t ids[] = {5};
  auto c = chunks_for_blocks(l, ids);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->size(), 64u);
  EXPECT_EQ((*c)[0].len, 16u * 8 * 128 * 2);
  EXPECT_EQ(l.block_bytes(), 2u << 20);
  // layer 1, V of block 5 lives in tensor 3 at block offset 5
  EXPECT_EQ((*c)[3].addr, l.bases[3] + 5 * l.chunk_bytes());
}

TEST(EngineLayout, Qwen32BBlockIs128Chunks) {
  auto l = qwen32b_layout(4);
  Tensors t(l);
  uint32_t ids[] = {0, 3};
  auto c = chunks_for_blocks(l, ids);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 256u);
}

TEST(EngineLayout, BlockFirstBlockIsContiguousAndCoalescesToOneChunk) {
  auto l = llama31_8b_layout(4, 16, LayoutOrder::block_first);
  Tensors t(l);
  uint32_t ids[] = {2};
  auto c = chunks_for_blocks(l, ids);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 64u);
  auto one = coalesce(*c);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].len, l.block_bytes());
  EXPECT_EQ(one[0].addr, l.bases[0] + 2 * l.block_bytes());
}

TEST(EngineLayout, BadLayoutsAndBlockIdsAreRejectedWithTheField) {
  auto l = llama31_8b_layout(4);
  uint32_t ids[] = {0};
  auto r = chunks_for_blocks(l, ids);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("base pointers"), std::string::npos);
  Tensors t(l);
  uint32_t bad[] = {4};
  r = chunks_for_blocks(l, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("block id 4"), std::string::npos);
  auto z = l;
  z.head_size = 0;
  EXPECT_NE(validate(z).error().message().find("head_size"), std::string::npos);
  auto n = l;
  n.bases[7] = nullptr;
  EXPECT_FALSE(validate(n).ok());
  auto big = l;
  big.num_blocks = 0xffffffffu;
  big.num_layers = 0xffffffffu;
  EXPECT_FALSE(validate(big).ok());
}
