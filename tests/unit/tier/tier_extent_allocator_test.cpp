// SPDX-License-Identifier: MIT
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tier/extent_allocator.hpp"

using cxlkv::tier::Extent;
using cxlkv::tier::ExtentAllocator;

TEST(TierExtentAllocator, ExtentsAreAlignedToTheUnitByConstruction) {
  ExtentAllocator a(1000, 1 << 20, 512);  // an unaligned base is trimmed inwards
  for (uint64_t bytes : {1ull, 511ull, 512ull, 513ull, 4097ull, 100000ull}) {
    auto e = a.allocate(bytes);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->offset % 512, 0u);
    EXPECT_EQ(e->length % 512, 0u);
    EXPECT_GE(e->length, bytes);
    EXPECT_LT(e->length, bytes + 512);
    EXPECT_GE(e->offset, 1000u);
  }
}

TEST(TierExtentAllocator, ExtentsAreContiguousAndDoNotOverlap) {
  ExtentAllocator a(0, 64 * 4096, 4096);
  auto x = a.allocate(3 * 4096), y = a.allocate(5 * 4096);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(y->offset, x->offset + x->length);  // first fit keeps a batch together
  EXPECT_EQ(a.free_bytes(), 56u * 4096);
}

TEST(TierExtentAllocator, FreedNeighboursMergeIntoOneRun) {
  ExtentAllocator a(0, 8 * 4096, 4096);
  std::vector<Extent> e;
  for (int i = 0; i < 8; i++) e.push_back(*a.allocate(4096));
  EXPECT_FALSE(a.allocate(4096));
  for (int i : {1, 3, 2, 0, 7, 5, 6, 4}) ASSERT_TRUE(a.free(e[i].offset, e[i].length));
  EXPECT_EQ(a.largest_free(), 8u * 4096);
  auto all = a.allocate(8 * 4096);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->offset, 0u);
}

TEST(TierExtentAllocator, PartOfAnExtentCanBeFreedOnItsOwn) {
  ExtentAllocator a(0, 16 * 4096, 4096);
  auto run = a.allocate(4 * 4096);  // a batch's run
  ASSERT_TRUE(run);
  ASSERT_TRUE(a.free(run->offset + 4096, 4096));  // one block of it
  EXPECT_TRUE(a.is_allocated(run->offset, 4096));
  EXPECT_FALSE(a.is_allocated(run->offset + 4096, 4096));
  EXPECT_TRUE(a.is_allocated(run->offset + 2 * 4096, 2 * 4096));
}

TEST(TierExtentAllocator, DoubleFreeAndForeignRangesAreRefusedWithoutDamage) {
  ExtentAllocator a(4096, 8 * 4096, 4096);
  auto e = a.allocate(2 * 4096);
  ASSERT_TRUE(e);
  EXPECT_TRUE(a.free(e->offset, e->length));
  EXPECT_FALSE(a.free(e->offset, e->length));        // already free
  EXPECT_FALSE(a.free(0, 4096));                     // below the managed range
  EXPECT_FALSE(a.free(4096 + 100, 4096));            // not on a unit boundary
  EXPECT_FALSE(a.free(4096 + 8 * 4096, 4096));       // past the end
  EXPECT_EQ(a.free_bytes(), 8u * 4096);
  EXPECT_EQ(a.largest_free(), 8u * 4096);
}

TEST(TierExtentAllocator, RequestLargerThanAnyFreeRunFails) {
  ExtentAllocator a(0, 4 * 4096, 4096);
  auto x = a.allocate(4096), y = a.allocate(4096), z = a.allocate(4096);
  ASSERT_TRUE(x && y && z);
  ASSERT_TRUE(a.free(y->offset, y->length));
  EXPECT_EQ(a.free_bytes(), 2u * 4096);
  EXPECT_FALSE(a.allocate(2 * 4096));  // two free units, but not adjacent
  EXPECT_TRUE(a.allocate(4096));
}

TEST(TierExtentAllocator, RandomWorkloadMatchesAUnitBitmapModel) {
  const uint32_t unit = 512, units = 2048;
  ExtentAllocator a(0, uint64_t(units) * unit, unit);
  std::vector<bool> used(units, false);
  std::vector<Extent> live;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; step++) {
    if (live.empty() || rng() % 2) {
      uint64_t bytes = 1 + rng() % (16 * unit);
      auto e = a.allocate(bytes);
      if (!e) continue;
      for (uint64_t u = e->offset / unit; u < (e->offset + e->length) / unit; u++) {
        ASSERT_FALSE(used[u]) << "unit " << u << " handed out twice";
        used[u] = true;
      }
      live.push_back(*e);
    } else {
      size_t k = rng() % live.size();
      ASSERT_TRUE(a.free(live[k].offset, live[k].length));
      for (uint64_t u = live[k].offset / unit; u < (live[k].offset + live[k].length) / unit; u++) used[u] = false;
      live.erase(live.begin() + static_cast<long>(k));
    }
    uint64_t model_free = 0;
    for (bool b : used) model_free += b ? 0 : unit;
    ASSERT_EQ(a.free_bytes(), model_free);
  }
}

TEST(TierExtentAllocator, ReserveTakesExactlyAFreeRangeAndRefusesAnyOther) {
  ExtentAllocator a(0, 64 * 4096, 4096);
  ASSERT_TRUE(a.reserve(8 * 4096, 2 * 4096));
  EXPECT_TRUE(a.is_allocated(8 * 4096, 2 * 4096));
  EXPECT_EQ(a.free_bytes(), 62u * 4096);
  EXPECT_FALSE(a.reserve(9 * 4096, 4096));        // already taken
  EXPECT_FALSE(a.reserve(7 * 4096, 2 * 4096));    // overlaps a taken unit
  EXPECT_FALSE(a.reserve(100, 4096));             // misaligned
  EXPECT_FALSE(a.reserve(63 * 4096, 2 * 4096));   // past the end
  EXPECT_FALSE(a.reserve(UINT64_MAX - 4095, 8192));  // would wrap
  EXPECT_EQ(a.free_bytes(), 62u * 4096);
  // First fit goes around the reserved range.
  auto e = a.allocate(8 * 4096);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 0u);
  e = a.allocate(4096);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 10u * 4096);
  EXPECT_TRUE(a.free(8 * 4096, 2 * 4096));
}
