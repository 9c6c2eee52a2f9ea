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
// Extent allocators live in process memory, rebuilt at attach from the
// index (KvStore::create calls claim() for every SSD location an entry
// names), so the index in the pool is the one crash-consistent record of
// which extents hold blocks: an extent is in use exactly while an entry
// names it, and a demotion that died before its entry was written leaves
// nothing behind.  Every block's header carries its key and checksums
// (cxlkv/format/tier_format.h); a read that finds another key or a bad checksum is
// a clean miss (SsdTierStats::bad), never data.
//
// Processes that share SSD devices open them with the same paths in the
// same order and disjoint SsdPoolOptions::partition values: each places in
// its own share and reads any block the index names.  Processes with
// private devices (per host) give each a different device_base instead:
// readable() is false for a location outside [device_base, device_base +
// devices), so lookups do not count another host's SSD blocks as hits and
// a fetch of one is refused (-EREMOTE) rather than read from the wrong
// device.
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
  uint64_t bad = 0;                           // reads refused by the block header or checksum (clean misses)
  uint64_t claimed = 0, claim_refused = 0;    // locations claimed at attach; refused (invalid or doubly named)
};

class SsdPayloadTier final : public PlacingTier {
 public:
  explicit SsdPayloadTier(SsdPool& pool, uint8_t device_base = 0);

  Result<BlockLocation> place(const BlockKey& key, std::span<const Chunk> chunks) override;
  void release(const BlockLocation& loc) override;
  Result<void> read_block(const BlockKey& key, const BlockLocation& loc, std::span<const Chunk> chunks) override;
  void read_many(std::span<const BlockRead> blocks, std::span<int32_t> status) override;
  void claim(const BlockLocation& loc) override;
  bool readable(const BlockLocation& loc) const override;
  // Places a batch in one SsdPool::write_blocks call (bandwidth-proportional
  // split, devices written in parallel).  status[i] = 0 and out[i] set, or
  // a negative errno.
  void place_many(std::span<const BlockKey> keys, std::span<const std::span<const Chunk>> blocks,
                  std::span<BlockLocation> out, std::span<int32_t> status);
  // The PayloadTier calls carry no key: rewriting an SSD block in place is
  // not supported (-EOPNOTSUPP; blocks enter by place()), and read() is
  // refused (-EINVAL) because an unkeyed read cannot be checked.
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
