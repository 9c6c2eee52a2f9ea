// SPDX-License-Identifier: MIT
#include "tier/ssd_payload_tier.hpp"

#include <cstring>
#include <vector>

#include "tier/ssd_device.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
uint64_t total_bytes(std::span<const Chunk> chunks) {
  uint64_t n = 0;
  for (const Chunk& c : chunks) n += c.len;
  return n;
}

void gather(std::byte* dst, std::span<const Chunk> chunks) {
  for (const Chunk& c : chunks) {
    std::memcpy(dst, c.addr, c.len);
    dst += c.len;
  }
}

void scatter(std::span<const Chunk> chunks, const std::byte* src) {
  for (const Chunk& c : chunks) {
    std::memcpy(c.addr, src, c.len);
    src += c.len;
  }
}

// A block the tier refused by its header or checksum: a clean miss.
bool is_bad_block(int err) { return err == -ESTALE || err == -EBADMSG; }
}  // namespace

SsdPayloadTier::SsdPayloadTier(SsdPool& pool, uint8_t device_base) : pool_(pool), base_(device_base) {}

bool SsdPayloadTier::readable(const BlockLocation& loc) const {
  if (loc.tier != CXLKV_TIER_SSD) return true;
  return loc.device >= base_ && static_cast<size_t>(loc.device - base_) < pool_.device_count();
}

Result<TierLocation> SsdPayloadTier::to_tier(const BlockLocation& loc) const {
  if (loc.tier != CXLKV_TIER_SSD) return Error(-EINVAL, "ssd tier: location is not on the SSD tier");
  if (!readable(loc))
    return Error(-EREMOTE, "ssd tier: SSD device " + std::to_string(loc.device) +
                               " is not attached to this process (its devices are " + std::to_string(base_) + ".." +
                               std::to_string(base_ + pool_.device_count() - 1) + ")");
  if (loc.offset > UINT64_MAX / kSectorBytes)  // a damaged entry: the byte offset would wrap
    return Error(-EINVAL, "ssd tier: LBA " + std::to_string(loc.offset) + " is beyond any device");
  return TierLocation{static_cast<uint16_t>(loc.device - base_), TierKind::kSsd, loc.offset * kSectorBytes,
                      loc.length};
}

BlockLocation SsdPayloadTier::to_index(const TierLocation& l) const {
  return BlockLocation{l.offset / kSectorBytes, l.length, static_cast<uint8_t>(base_ + l.device), CXLKV_TIER_SSD};
}

void SsdPayloadTier::place_many(std::span<const BlockKey> keys, std::span<const std::span<const Chunk>> blocks,
                                std::span<BlockLocation> out, std::span<int32_t> status) {
  const size_t n = blocks.size();
  // Gather each block into one aligned buffer: one O_DIRECT write per block.
  std::vector<tier::AlignedBuffer> bufs(n);
  std::vector<SsdWrite> w(n);
  for (size_t i = 0; i < n; i++) {
    uint64_t len = total_bytes(blocks[i]);
    if (len == 0 || len > UINT32_MAX) continue;  // data = nullptr: write_blocks reports -EINVAL
    bufs[i] = tier::AlignedBuffer(len);
    gather(bufs[i].data(), blocks[i]);
    w[i] = SsdWrite{bufs[i].data(), static_cast<uint32_t>(len), keys[i].lo, keys[i].hi};
  }
  std::vector<TierLocation> loc(n);
  std::vector<int> st(n, -EIO);
  pool_.write_blocks(w, loc, st);
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < n; i++) {
    status[i] = st[i];
    if (st[i] == -ENOSPC) st_.full++;
    if (st[i]) continue;
    out[i] = to_index(loc[i]);
    st_.placed++;
    st_.placed_bytes += w[i].length;
  }
}

Result<BlockLocation> SsdPayloadTier::place(const BlockKey& key, std::span<const Chunk> chunks) {
  uint64_t n = total_bytes(chunks);
  if (n == 0 || n > UINT32_MAX) return Error(-EINVAL, "ssd tier: block of " + std::to_string(n) + " bytes");
  std::span<const Chunk> one[1] = {chunks};
  BlockLocation loc;
  int32_t st = -EIO;
  place_many({&key, 1}, one, {&loc, 1}, {&st, 1});
  if (st == -ENOSPC) return Error(-ENOSPC, "ssd tier: no device has room for " + std::to_string(n) + " bytes");
  if (st) return Error(st, std::string("ssd tier: write failed: ") + std::strerror(-st));
  return loc;
}

void SsdPayloadTier::release(const BlockLocation& loc) {
  auto t = to_tier(loc);
  if (!t) return;
  pool_.release(*t);
  std::lock_guard lk(mu_);
  st_.released++;
}

void SsdPayloadTier::claim(const BlockLocation& loc) {
  auto t = to_tier(loc);
  if (!t) return;  // another host's device: not ours to account
  bool ok = pool_.claim(*t);
  std::lock_guard lk(mu_);
  if (ok) {
    st_.claimed++;
  } else {
    st_.claim_refused++;
    log().warn("ssd tier: index names device {} LBA {} length {}, which is not a free extent of this tier "
               "(invalid or named twice); reads of it will fail their checks",
               loc.device, loc.offset, loc.length);
  }
}

Result<void> SsdPayloadTier::write(const BlockLocation&, std::span<const Chunk>) {
  return Error(-EOPNOTSUPP, "ssd tier: blocks enter the SSD tier by place(), not by rewriting a location");
}

Result<void> SsdPayloadTier::read(const BlockLocation&, std::span<const Chunk>) {
  return Error(-EINVAL, "ssd tier: a read must name the block key (read_block) so the block can be checked");
}

void SsdPayloadTier::read_many(std::span<const BlockRead> blocks, std::span<int32_t> status) {
  const size_t n = blocks.size();
  std::vector<SsdRead> rd;
  std::vector<size_t> which;
  std::vector<tier::AlignedBuffer> bufs;
  rd.reserve(n);
  which.reserve(n);
  bufs.reserve(n);
  for (size_t i = 0; i < n; i++) {
    const BlockLocation& loc = *blocks[i].loc;
    auto t = to_tier(loc);
    if (!t) {
      status[i] = t.error().code();
      continue;
    }
    if (total_bytes(blocks[i].chunks) != loc.length) {
      status[i] = -EINVAL;
      continue;
    }
    // One chunk: straight into it (the pool verifies in its staging buffer
    // and copies only checked payload).  Several: read whole, then scatter.
    void* dst = nullptr;
    if (blocks[i].chunks.size() == 1) {
      dst = blocks[i].chunks[0].addr;
      bufs.emplace_back();
    } else {
      bufs.emplace_back(loc.length);
      dst = bufs.back().data();
    }
    rd.push_back(SsdRead{*t, dst, blocks[i].key.lo, blocks[i].key.hi});
    which.push_back(i);
  }
  std::vector<int> st(rd.size(), -EIO);
  pool_.read_blocks(rd, st);  // all blocks in flight together, devices in parallel
  std::lock_guard lk(mu_);
  for (size_t k = 0; k < rd.size(); k++) {
    const size_t i = which[k];
    status[i] = st[k];
    if (st[k]) {
      // The block is lost or holds something else: never returned as data.
      (is_bad_block(st[k]) ? st_.bad : st_.lost)++;
      continue;
    }
    if (bufs[k].data()) scatter(blocks[i].chunks, bufs[k].data());
    st_.reads++;
    st_.read_bytes += blocks[i].loc->length;
  }
}

Result<void> SsdPayloadTier::read_block(const BlockKey& key, const BlockLocation& loc, std::span<const Chunk> chunks) {
  if (auto t = to_tier(loc); !t) return t.error();
  if (total_bytes(chunks) != loc.length)
    return Error(-EINVAL, "ssd tier: chunk list holds " + std::to_string(total_bytes(chunks)) + " bytes, block has " +
                              std::to_string(loc.length));
  BlockRead b{key, &loc, chunks};
  int32_t st = -EIO;
  read_many({&b, 1}, {&st, 1});
  if (st == 0) return {};
  if (is_bad_block(st))
    return Error(st, "ssd tier: block " + to_hex(key) + " at device " + std::to_string(loc.device) + " LBA " +
                         std::to_string(loc.offset) + " fails its checks (" +
                         (st == -ESTALE ? "the extent holds another block" : "damaged") + "): a miss");
  return Error(st, "ssd tier: block at device " + std::to_string(loc.device) + " LBA " + std::to_string(loc.offset) +
                       " lost: " + std::strerror(-st));
}

SsdTierStats SsdPayloadTier::stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

}  // namespace cxlkv
