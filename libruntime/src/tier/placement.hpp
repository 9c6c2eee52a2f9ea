// SPDX-License-Identifier: MIT
// Bandwidth-aware placement (Unified KV Pooling): device i receives a share
// p_i = b_i / sum_j b_j of every offload batch.  For a batch of n blocks it
// gets floor(p_i * n) blocks, and the remainder (fewer than the number of
// devices) goes one block each to the devices with the largest p_i.  Every
// count is therefore within one block of p_i * n.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cxlkv::tier {

// bandwidth[i] <= 0 means device i takes no part (offline or full).
std::vector<uint32_t> place_batch(std::span<const double> bandwidth, uint64_t n);

// The same across calls (docs/eviction.md "The SSD tier"): `credit` (one entry per device,
// kept by the caller, starts at 0) carries each device's fractional share
// from one batch to the next, so a stream of small batches -- the KV store
// demotes one block at a time -- still splits in proportion: device i gets
// exact_i = p_i * n + credit_i rounded by largest remainder, and keeps
// exact_i - count_i.  Over any run of batches, every device's total is
// within one block of p_i times the blocks placed.  A device that takes no
// part has its credit reset.
std::vector<uint32_t> place_batch_carry(std::span<const double> bandwidth, uint64_t n, std::vector<double>* credit);

// p_i for each device (0 for the ones that take no part).
std::vector<double> placement_ratios(std::span<const double> bandwidth);

}  // namespace cxlkv::tier
