// SPDX-License-Identifier: MIT
// Block keys: fixed seed (same keys everywhere, forever), chaining, caller ids.
#include <gtest/gtest.h>

#include "cxlkv/keys.hpp"

using namespace cxlkv;

TEST(BlockKeys, FirstBlockKeyIsFixedByTheDocumentedSeed) {
  // Changing the seed or the byte order breaks every pool's cached blocks.
  std::vector<uint32_t> toks = {1, 2, 3, 4};
  BlockKey k = chain_key(BlockKey{}, toks);
  EXPECT_EQ(to_hex(k), to_hex(chain_key(BlockKey{}, toks)));
  EXPECT_EQ(kKeySeed, 0x79656b766b6c7863ULL);
  EXPECT_EQ(to_hex(k), "180b50e6423737c39d4d99d970be5075");
}

TEST(BlockKeys, KeyOfABlockDependsOnEveryEarlierBlock) {
  std::vector<uint32_t> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {9, 2, 3, 4, 5, 6, 7, 8};
  auto ka = block_keys(a, 4), kb = block_keys(b, 4);
  ASSERT_EQ(ka.size(), 2u);
  EXPECT_NE(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]) << "same tokens in block 1, different prefix";
  EXPECT_EQ(ka[1], chain_key(ka[0], std::span(a).subspan(4, 4)));
}

TEST(BlockKeys, PartialTrailingBlockIsKeyedOnlyWhenAsked) {
  std::vector<uint32_t> t(10, 7);
  EXPECT_EQ(block_keys(t, 4).size(), 2u);
  EXPECT_EQ(block_keys(t, 4, {}, true).size(), 3u);
  EXPECT_TRUE(block_keys(t, 0).empty());
}

TEST(BlockKeys, ExtrasSeparateModels) {
  std::vector<uint32_t> t = {1, 2, 3, 4};
  std::byte m1[] = {std::byte{1}}, m2[] = {std::byte{2}};
  EXPECT_NE(block_keys(t, 4, m1)[0], block_keys(t, 4, m2)[0]);
}

TEST(BlockKeys, TraceIdsMapToTheSameKeysEveryTime) {
  std::vector<uint64_t> ids = {0, 1, 2, 3};
  auto a = keys_from_ids(ids), b = keys_from_ids(ids);
  EXPECT_EQ(a, b);
  std::vector<uint64_t> other = {5, 1, 2, 3};
  EXPECT_NE(keys_from_ids(other)[1], a[1]);
  for (auto& k : a) EXPECT_FALSE(k.is_zero());
}

TEST(BlockKeys, HexRoundTripAndBadText) {
  BlockKey k{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  BlockKey back;
  ASSERT_TRUE(parse_key(to_hex(k), &back));
  EXPECT_EQ(back, k);
  EXPECT_FALSE(parse_key("xyz", &back));
  EXPECT_FALSE(parse_key(std::string(32, 'g'), &back));
}
