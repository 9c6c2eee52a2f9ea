// SPDX-License-Identifier: MIT
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tier/placement.hpp"

using cxlkv::tier::place_batch;
using cxlkv::tier::placement_ratios;

TEST(TierPlacement, EveryDeviceGetsWithinOneBlockOfItsBandwidthShare) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; trial++) {
    size_t k = 1 + rng() % 6;
    std::vector<double> bw(k);
    for (double& b : bw) b = 0.1 + static_cast<double>(rng() % 10000) / 1000.0;
    uint64_t n = rng() % 300;
    auto c = place_batch(bw, n);
    auto p = placement_ratios(bw);
    ASSERT_EQ(std::accumulate(c.begin(), c.end(), uint64_t{0}), n);
    for (size_t i = 0; i < k; i++) {
      EXPECT_LT(std::fabs(static_cast<double>(c[i]) - p[i] * static_cast<double>(n)), 1.0 + 1e-9)
          << "device " << i << " of " << k << ", n = " << n;
      EXPECT_GE(static_cast<double>(c[i]), std::floor(p[i] * static_cast<double>(n) - 1e-9));
    }
  }
}

TEST(TierPlacement, RemainderGoesToTheLargestShares) {
  // p = 0.2, 0.5, 0.3; n = 7: floors 1, 3, 2 = 6, the one left goes to device 1.
  std::vector<double> bw{2, 5, 3};
  auto c = place_batch(bw, 7);
  EXPECT_EQ(c, (std::vector<uint32_t>{1, 4, 2}));
  // n = 9: floors 1, 4, 2 = 7; two left: device 1, then device 2.
  EXPECT_EQ(place_batch(bw, 9), (std::vector<uint32_t>{1, 5, 3}));
}

TEST(TierPlacement, EqualBandwidthSplitsEvenly) {
  std::vector<double> bw{1.5, 1.5};
  EXPECT_EQ(place_batch(bw, 64), (std::vector<uint32_t>{32, 32}));
  EXPECT_EQ(place_batch(bw, 3), (std::vector<uint32_t>{2, 1}));  // tie: the lower index
}

TEST(TierPlacement, DeviceWithoutBandwidthTakesNoPart) {
  std::vector<double> bw{3, 0, 1};  // device 1 is offline or full
  auto c = place_batch(bw, 8);
  EXPECT_EQ(c, (std::vector<uint32_t>{6, 0, 2}));
  EXPECT_EQ(place_batch(std::vector<double>{0, 0}, 5), (std::vector<uint32_t>{0, 0}));
}

TEST(TierPlacement, SingleBlockBatchesCarryTheirShareAndSplitInProportion) {
  using cxlkv::tier::place_batch_carry;
  for (auto bw : {std::vector<double>{2, 1}, std::vector<double>{1, 2, 3}, std::vector<double>{5, 0, 1}}) {
    std::vector<double> credit;
    std::vector<uint64_t> total(bw.size(), 0);
    double sum = 0;
    for (double b : bw) sum += b;
    for (uint64_t placed = 1; placed <= 600; placed++) {
      auto c = place_batch_carry(bw, 1, &credit);
      for (size_t i = 0; i < c.size(); i++) total[i] += c[i];
      for (size_t i = 0; i < bw.size(); i++)  // at every point, within one block of the share
        ASSERT_LT(std::fabs(double(total[i]) - bw[i] / sum * double(placed)), 1.0 + 1e-9)
            << "device " << i << " after " << placed;
    }
  }
  std::vector<double> credit;
  std::vector<uint64_t> total(2, 0);
  for (int k = 0; k < 30; k++) {
    auto c = place_batch_carry(std::vector<double>{2, 1}, 1, &credit);
    total[0] += c[0], total[1] += c[1];
  }
  EXPECT_EQ(total, (std::vector<uint64_t>{20, 10}));  // not 30/0
  // Mixed batch sizes keep the running split too.
  std::vector<uint64_t> t2(3, 0);
  uint64_t placed = 0;
  credit.clear();
  for (uint64_t n : {1u, 2u, 7u, 1u, 1u, 13u, 3u, 1u}) {
    auto c = place_batch_carry(std::vector<double>{1, 2, 3}, n, &credit);
    placed += n;
    for (size_t i = 0; i < 3; i++) t2[i] += c[i];
    for (size_t i = 0; i < 3; i++) ASSERT_LT(std::fabs(double(t2[i]) - (i + 1) / 6.0 * double(placed)), 1.0 + 1e-9);
  }
}
