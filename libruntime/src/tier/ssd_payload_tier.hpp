// SPDX-License-Identifier: MIT
// SsdPayloadTier: the SSD tier as the KV store sees it (PlacingTier, the
// plug-in point of cxlkv/kv.hpp).  It turns the index's locations into
// SsdPool locations and back:
//
//   index entry  loc_tier = CXLKV_TIER_SSD, loc_dev = device_base + i,
//                loc_off = LBA in 512 B sectors, loc_len = payload bytes
//   SsdPool      device i, byte offset = LBA * 512 (always a multiple of
//                the device's logical block, so the conversion is exact)
//
// Extent allocators live in process memory.  Processes that share SSD
// devices open them with the same paths in the same order and disjoint
// SsdPoolOptions::partition values: each places in its own share and reads
// any block the index names.  Processes with private devices give each a
// different device_base instead, so a location placed by another process is
// refused (-EREMOTE) rather than read from the wrong device.
#pragma once

#include <atomic>
#include <mutex>

#include "cxlkv/kv.hpp"
#include "cxlkv/tier.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

struct SsdTierStats {
  uint64_t placed = 0, placed_bytes = 0;      // blocks written to the tier (demotions)
  uint64_t reads = 0, read_bytes = 0;         // blocks read from it (SSD hits)
  uint64_t released = 0, lost = 0, full = 0;  // extents freed; reads that failed; place() refused for space
};

class SsdPayloadTier final : public PlacingTier {
 public:
  explicit SsdPayloadTier(SsdPool& pool, uint8_t device_base = 0);

  Result<BlockLocation> place(std::span<const Chunk> chunks) override;
  void release(const BlockLocation& loc) override;
  Result<void> write(const BlockLocation& loc, std::span<const Chunk> chunks) override;
  Result<void> read(const BlockLocation& loc, std::span<const Chunk> chunks) override;

  SsdTierStats stats() const;
  SsdPool& pool() { return pool_; }

  static constexpr uint32_t kSectorBytes = 512;  // unit of loc_off for CXLKV_TIER_SSD
  Result<TierLocation> to_tier(const BlockLocation& loc) const;
  BlockLocation to_index(const TierLocation& loc) const;

 private:
  SsdPool& pool_;
  uint8_t base_;
  mutable std::mutex mu_;
  SsdTierStats st_;
};

}  // namespace cxlkv
