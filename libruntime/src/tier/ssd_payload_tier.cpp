// SPDX-License-Identifier: MIT
#include "tier/ssd_payload_tier.hpp"

#include <cstring>
#include <vector>

#include "tier/ssd_device.hpp"

namespace cxlkv {

namespace {
uint64_t total_bytes(std::span<const Chunk> chunks) {
  uint64_t n = 0;
  for (const Chunk& c : chunks) n += c.len;
  return n;
}
}  // namespace

SsdPayloadTier::SsdPayloadTier(SsdPool& pool, uint8_t device_base) : pool_(pool), base_(device_base) {}

Result<TierLocation> SsdPayloadTier::to_tier(const BlockLocation& loc) const {
  if (loc.tier != CXLKV_TIER_SSD) return Error(-EINVAL, "ssd tier: location is not on the SSD tier");
  if (loc.device < base_ || static_cast<size_t>(loc.device - base_) >= pool_.device_count())
    return Error(-EREMOTE, "ssd tier: SSD device " + std::to_string(loc.device) +
                               " is not attached to this process (its devices are " + std::to_string(base_) + ".." +
                               std::to_string(base_ + pool_.device_count() - 1) + ")");
  return TierLocation{static_cast<uint16_t>(loc.device - base_), TierKind::kSsd, loc.offset * kSectorBytes,
                      loc.length};
}

BlockLocation SsdPayloadTier::to_index(const TierLocation& l) const {
  return BlockLocation{l.offset / kSectorBytes, l.length, static_cast<uint8_t>(base_ + l.device), CXLKV_TIER_SSD};
}

Result<BlockLocation> SsdPayloadTier::place(std::span<const Chunk> chunks) {
  uint64_t n = total_bytes(chunks);
  if (n == 0 || n > UINT32_MAX) return Error(-EINVAL, "ssd tier: block of " + std::to_string(n) + " bytes");
  // Gather into one aligned buffer: one O_DIRECT write per block.
  tier::AlignedBuffer buf(n);
  uint64_t at = 0;
  for (const Chunk& c : chunks) {
    std::memcpy(buf.data() + at, c.addr, c.len);
    at += c.len;
  }
  SsdWrite w{buf.data(), static_cast<uint32_t>(n)};
  TierLocation loc;
  int st = 1;
  pool_.write_blocks({&w, 1}, {&loc, 1}, {&st, 1});
  std::lock_guard lk(mu_);
  if (st == -ENOSPC) {
    st_.full++;
    return Error(-ENOSPC, "ssd tier: no device has room for " + std::to_string(n) + " bytes");
  }
  if (st) return Error(st, std::string("ssd tier: write failed: ") + std::strerror(-st));
  st_.placed++;
  st_.placed_bytes += n;
  return to_index(loc);
}

void SsdPayloadTier::release(const BlockLocation& loc) {
  auto t = to_tier(loc);
  if (!t) return;
  pool_.release(*t);
  std::lock_guard lk(mu_);
  st_.released++;
}

Result<void> SsdPayloadTier::write(const BlockLocation& loc, std::span<const Chunk> chunks) {
  auto t = to_tier(loc);
  if (!t) return t.error();
  if (total_bytes(chunks) != loc.length)
    return Error(-EINVAL, "ssd tier: chunk list holds " + std::to_string(total_bytes(chunks)) + " bytes, block has " +
                              std::to_string(loc.length));
  tier::AlignedBuffer buf(loc.length);
  uint64_t at = 0;
  for (const Chunk& c : chunks) {
    std::memcpy(buf.data() + at, c.addr, c.len);
    at += c.len;
  }
  SsdRead target{*t, buf.data()};
  int st = 1;
  pool_.write_at({&target, 1}, {&st, 1});
  if (st) return Error(st, std::string("ssd tier: rewrite failed: ") + std::strerror(-st));
  return {};
}

Result<void> SsdPayloadTier::read(const BlockLocation& loc, std::span<const Chunk> chunks) {
  auto t = to_tier(loc);
  if (!t) return t.error();
  if (total_bytes(chunks) != loc.length)
    return Error(-EINVAL, "ssd tier: chunk list holds " + std::to_string(total_bytes(chunks)) + " bytes, block has " +
                              std::to_string(loc.length));
  // One chunk: straight into it (the pool bounces if it is not aligned).
  // Several: read whole, then scatter.
  tier::AlignedBuffer buf;
  void* dst = chunks.size() == 1 ? chunks[0].addr : nullptr;
  if (!dst) {
    buf = tier::AlignedBuffer(loc.length);
    dst = buf.data();
  }
  SsdRead r{*t, dst};
  int st = 1;
  pool_.read_blocks({&r, 1}, {&st, 1});
  std::lock_guard lk(mu_);
  if (st) {
    // The block is lost: never returned as data (the caller's chunks may hold garbage).
    st_.lost++;
    return Error(st, "ssd tier: block at device " + std::to_string(loc.device) + " LBA " + std::to_string(loc.offset) +
                         " lost: " + std::strerror(-st));
  }
  if (buf.data()) {
    uint64_t at = 0;
    for (const Chunk& c : chunks) {
      std::memcpy(c.addr, buf.data() + at, c.len);
      at += c.len;
    }
  }
  st_.reads++;
  st_.read_bytes += loc.length;
  return {};
}

SsdTierStats SsdPayloadTier::stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

}  // namespace cxlkv
