// SPDX-License-Identifier: MIT
// SsdPool: the pool organizer of the SSD tier (see cxlkv/tier.hpp).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "cxlkv/tier.hpp"
#include "tier/bandwidth_probe.hpp"
#include "tier/extent_allocator.hpp"
#include "tier/placement.hpp"
#include "tier/ssd_device.hpp"
#include "cxlkv/format/tier_format.h"
#include "util/log.hpp"

#include <xxhash.h>

namespace cxlkv {

const char* tier_name(TierKind t) { return t == TierKind::kSsd ? "ssd" : "mem"; }

using tier::AlignedBuffer;
using tier::ExtentAllocator;
using tier::IoBatch;
using tier::SsdDevice;
using tier::SsdIo;

namespace {

struct DeviceSlot {
  std::unique_ptr<SsdDevice> dev;
  std::unique_ptr<ExtentAllocator> alloc;
  double bandwidth_gbps = 0;
  const char* source = "";
  std::atomic<bool> online{true};
  std::atomic<uint32_t> consecutive_errors{0};
  std::atomic<uint64_t> lost{0};
  std::atomic<uint64_t> foreign_releases{0};
  uint64_t data_begin = 0, data_end = 0;  // the whole data area (all partitions)
  uint64_t own_begin = 0, own_end = 0;    // this process's partition of it

  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> claimed{0};

  // Header block + payload rounded up to the logical block (saturating:
  // a damaged length never wraps to a small extent).
  uint64_t extent_bytes(uint64_t len) const {
    uint64_t p = alloc->round_up(len);
    return p > UINT64_MAX - alloc->unit() ? UINT64_MAX : p + alloc->unit();
  }
  // Overflow-safe: locations come from index entries, which may be damaged.
  bool in_data(uint64_t off, uint64_t len) const {
    return off >= data_begin && off <= data_end && len <= data_end - off && off % alloc->unit() == 0;
  }
  bool owned(uint64_t off) const { return off >= own_begin && off < own_end; }
  // A location read or rewritten here must be allocated when it is ours;
  // another partition's extent is trusted to the index that names it (the
  // block header still has to match on read).
  bool valid(uint64_t off, uint64_t len) const {
    const uint64_t ext = extent_bytes(len);
    return owned(off) ? alloc->is_allocated(off, ext) : in_data(off, ext);
  }
};

// Fills the header block of an extent (the rest of the block stays zero).
void put_block_header(std::byte* extent, const void* payload, uint32_t len, uint64_t key_lo, uint64_t key_hi,
                      uint64_t seq) {
  cxlkv_ssd_block_header h{};
  h.magic = CXLKV_SSD_BLOCK_MAGIC;
  h.key_lo = key_lo;
  h.key_hi = key_hi;
  h.length = len;
  h.payload_hash = XXH3_64bits(payload, len);
  h.write_seq = seq;
  h.header_check = cxlkv_ssd_block_header_check(&h);
  std::memcpy(extent, &h, sizeof h);
}

// Checks an extent read back against the key and length the index names.
// 0, -ESTALE (a valid block of another key or length: the extent was reused)
// or -EBADMSG (not a valid block: damaged, never written, or a hole).
int check_block(const std::byte* extent, uint32_t header_bytes, const SsdRead& r, const char** why) {
  cxlkv_ssd_block_header h;
  std::memcpy(&h, extent, sizeof h);
  if (h.magic != CXLKV_SSD_BLOCK_MAGIC) {
    *why = "no block header (never written, overwritten or a hole)";
    return -EBADMSG;
  }
  if (h.header_check != cxlkv_ssd_block_header_check(&h)) {
    *why = "block header checksum mismatch";
    return -EBADMSG;
  }
  if (h.key_lo != r.key_lo || h.key_hi != r.key_hi) {
    *why = "extent holds another block's key";
    return -ESTALE;
  }
  if (h.length != r.location.length) {
    *why = "block header length differs from the location's";
    return -ESTALE;
  }
  if (XXH3_64bits(extent + header_bytes, h.length) != h.payload_hash) {
    *why = "payload checksum mismatch";
    return -EBADMSG;
  }
  return 0;
}

// One I/O of a batch: which block it serves and the aligned staging buffer
// holding the whole extent (header block + payload).
struct BlockIo {
  size_t block;
  AlignedBuffer bounce;
};

}  // namespace

struct SsdPool::Impl {
  SsdPoolOptions opts;
  std::vector<std::unique_ptr<DeviceSlot>> devs;
  std::atomic<uint64_t> lost{0};
  std::atomic<uint64_t> write_seq{1};
  std::mutex placement_mu;
  std::vector<double> placement_credit;  // per device, see place_batch_carry

  // The bandwidth each device takes part in placement with: 0 when it is
  // offline or has no free extent left for a block of min_free payload bytes.
  std::vector<double> live_bandwidth(uint64_t min_free) const {
    std::vector<double> bw(devs.size(), 0.0);
    for (size_t i = 0; i < devs.size(); i++)
      if (devs[i]->online.load() && devs[i]->alloc->largest_free() >= devs[i]->extent_bytes(min_free))
        bw[i] = devs[i]->bandwidth_gbps;
    return bw;
  }

  // Records an I/O error of device i; a device that has disappeared
  // (ENODEV / ENXIO) or keeps failing is taken out of placement.
  void note_error(size_t i, int err, bool short_transfer) {
    DeviceSlot& s = *devs[i];
    if (short_transfer || err == -EINVAL) return;  // the device answered; only that data is gone
    uint32_t n = s.consecutive_errors.fetch_add(1) + 1;
    if ((err == -ENODEV || err == -ENXIO || n >= opts.offline_after_errors) && s.online.exchange(false))
      log().error("SSD device {}: taken out of placement after {} ({} consecutive errors)", s.dev->path(),
                  std::strerror(-err), n);
  }
  std::vector<size_t> issue_writes(std::span<const SsdWrite> blocks, const std::vector<size_t>& idx,
                                   const std::vector<int>& dev_of, std::span<TierLocation> loc,
                                   std::span<int> status, bool free_on_error = true);
  void note_ok(size_t i) { devs[i]->consecutive_errors.store(0, std::memory_order_relaxed); }

  // Device for a block that did not fit where placement put it: the online
  // device with the most bandwidth that has room.
  std::optional<std::pair<size_t, tier::Extent>> spill(uint64_t bytes) {
    std::vector<size_t> order(devs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return devs[a]->bandwidth_gbps > devs[b]->bandwidth_gbps; });
    for (size_t i : order) {
      if (!devs[i]->online.load()) continue;
      if (auto e = devs[i]->alloc->allocate(devs[i]->extent_bytes(bytes))) return std::make_pair(i, *e);
    }
    return std::nullopt;
  }
};

// Writes blocks `idx` to the devices and extents already chosen for them,
// every device in parallel; returns the blocks whose write failed (their
// extent is freed again and their status holds the error).
std::vector<size_t> SsdPool::Impl::issue_writes(std::span<const SsdWrite> blocks, const std::vector<size_t>& idx,
                                                const std::vector<int>& dev_of, std::span<TierLocation> loc,
                                                std::span<int> status, bool free_on_error) {
  const size_t ndev = devs.size();
  std::vector<std::vector<SsdIo>> ios(ndev);
  std::vector<std::vector<BlockIo>> meta(ndev);
  for (size_t i : idx) {
    DeviceSlot& s = *devs[dev_of[i]];
    SsdIo io;
    io.op = IoOp::kWrite;
    io.offset = loc[i].offset;
    io.length = static_cast<uint32_t>(s.extent_bytes(blocks[i].length));
    // Stage header block + payload (zero-padded) in one aligned buffer: one
    // O_DIRECT write per block, header and payload land together.
    const uint32_t hb = s.alloc->unit();
    BlockIo b{i, AlignedBuffer(io.length, std::max<size_t>(4096, s.dev->memory_align()))};
    std::memset(b.bounce.data(), 0, hb);
    std::memcpy(b.bounce.data() + hb, blocks[i].data, blocks[i].length);
    std::memset(b.bounce.data() + hb + blocks[i].length, 0, io.length - hb - blocks[i].length);
    put_block_header(b.bounce.data(), blocks[i].data, blocks[i].length, blocks[i].key_lo, blocks[i].key_hi,
                     write_seq.fetch_add(1, std::memory_order_relaxed));
    io.buf = b.bounce.data();
    ios[dev_of[i]].push_back(io);
    meta[dev_of[i]].push_back(std::move(b));
  }
  // All devices are submitted before any is waited for.
  IoBatch batch;
  for (size_t dv = 0; dv < ndev; dv++) devs[dv]->dev->submit(ios[dv], batch);
  batch.wait();
  std::vector<size_t> failed;
  for (size_t dv = 0; dv < ndev; dv++) {
    for (size_t k = 0; k < ios[dv].size(); k++) {
      size_t i = meta[dv][k].block;
      const SsdIo& io = ios[dv][k];
      if (io.status == 0) {
        status[i] = 0;
        note_ok(dv);
        continue;
      }
      status[i] = io.short_transfer ? -EIO : io.status;
      if (free_on_error) devs[dv]->alloc->free(loc[i].offset, devs[dv]->extent_bytes(loc[i].length));
      note_error(dv, io.status, io.short_transfer);
      failed.push_back(i);
    }
  }
  return failed;
}

SsdPool::SsdPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SsdPool::~SsdPool() = default;

Result<std::unique_ptr<SsdPool>> SsdPool::open(const SsdPoolOptions& opts) {
  if (opts.devices.empty()) return Error(-EINVAL, "SSD pool: no devices configured");
  if (opts.devices.size() > UINT16_MAX) return Error(-EINVAL, "SSD pool: too many devices");
  const uint32_t parts = std::max<uint32_t>(opts.partitions, 1);
  if (opts.partition >= parts)
    return Error(-EINVAL, "SSD pool: partition " + std::to_string(opts.partition) + " of " + std::to_string(parts));
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  // Files this call created are removed when it fails (one too small for
  // its header and probe area, say): a leftover empty or short file would
  // turn the next attempt's error into a misleading one.
  struct RemoveCreated {
    std::vector<std::string> paths;
    ~RemoveCreated() {
      for (auto& p : paths) ::unlink(p.c_str());
    }
  } created;
  for (size_t i = 0; i < opts.devices.size(); i++) {
    const SsdDeviceConfig& c = opts.devices[i];
    tier::SsdDeviceOptions o;
    o.path = c.path;
    o.create_bytes = c.create_bytes;
    o.queue_depth = opts.queue_depth;
    o.sqpoll = opts.sqpoll;
    o.registered_memory = opts.registered_memory;
    if (i < opts.faults.size()) o.faults = opts.faults[i];
    auto dev = SsdDevice::open(o);
    if (!dev) return dev.error();
    if ((*dev)->created()) created.paths.push_back(c.path);
    auto slot = std::make_unique<DeviceSlot>();
    slot->dev = std::move(*dev);
    SsdDevice& d = *slot->dev;
    auto layout = tier::plan_layout(d, opts.probe_bytes);
    if (!layout) return layout.error();

    cxlkv_tier_dev_header h{};
    bool valid = tier::read_header(d, *layout, &h);
    if (c.bandwidth_gbps > 0) {
      slot->bandwidth_gbps = c.bandwidth_gbps;
      slot->source = "config";
      if (!valid) CXLKV_TRY(tier::write_header(d, *layout, {}));
    } else if (valid && !c.reprobe && h.probe_read_bps > 0) {
      slot->bandwidth_gbps = static_cast<double>(h.probe_read_bps) / 1e9;
      slot->source = "cached";
    } else {
      auto pr = tier::probe_bandwidth(d, *layout);
      if (!pr) return pr.error();
      slot->bandwidth_gbps = pr->read_gbps;
      slot->source = "probe";
      CXLKV_TRY(tier::write_header(d, *layout, *pr));
    }
    // This process's share of the data area (all of it unless partitioned),
    // on 1 MiB boundaries so every share stays aligned for any block size.
    const uint64_t align = std::max<uint64_t>(1ull << 20, d.logical_block());
    slot->data_begin = layout->data_offset;
    slot->data_end = d.capacity() / d.logical_block() * d.logical_block();
    const uint64_t share = (slot->data_end - slot->data_begin) / parts / align * align;
    slot->own_begin = slot->data_begin + share * opts.partition;
    slot->own_end = opts.partition + 1 == parts ? slot->data_end : slot->own_begin + share;
    if (slot->own_end <= slot->own_begin)
      return Error(-ENOSPC, "SSD device " + d.path() + ": data area too small for " + std::to_string(parts) +
                                " partitions");
    slot->alloc = std::make_unique<ExtentAllocator>(slot->own_begin, slot->own_end - slot->own_begin,
                                                    d.logical_block());
    log().info("SSD pool: device {} = {}: {:.2f} GB/s ({}), {} data bytes", i, d.path(), slot->bandwidth_gbps,
               slot->source, slot->alloc->capacity());
    impl->devs.push_back(std::move(slot));
  }
  created.paths.clear();
  return std::unique_ptr<SsdPool>(new SsdPool(std::move(impl)));
}

size_t SsdPool::device_count() const { return impl_->devs.size(); }

SsdDeviceInfo SsdPool::device_info(size_t i) const {
  const DeviceSlot& s = *impl_->devs.at(i);
  const SsdDevice& d = *s.dev;
  SsdDeviceInfo info;
  info.path = d.path();
  info.block_device = d.block_device();
  info.logical_block = d.logical_block();
  info.memory_align = d.memory_align();
  info.capacity = d.capacity();
  info.data_bytes = s.alloc->capacity();
  info.used_bytes = s.alloc->capacity() - s.alloc->free_bytes();
  info.bandwidth_gbps = s.bandwidth_gbps;
  info.bandwidth_source = s.source;
  std::vector<double> bw(impl_->devs.size());
  for (size_t j = 0; j < bw.size(); j++) bw[j] = impl_->devs[j]->online ? impl_->devs[j]->bandwidth_gbps : 0;
  info.placement_ratio = tier::placement_ratios(bw)[i];
  info.online = s.online.load();
  const auto& c = d.counters();
  info.reads = c.reads;
  info.writes = c.writes;
  info.bytes_read = c.bytes_read;
  info.bytes_written = c.bytes_written;
  info.io_errors = c.errors;
  info.short_reads = c.short_reads;
  info.lost_blocks = s.lost;
  info.foreign_releases = s.foreign_releases;
  info.bad_blocks = s.bad;
  info.claimed = s.claimed;
  info.submits = c.submits;
  info.peak_in_flight = c.peak_in_flight;
  return info;
}

std::vector<uint32_t> SsdPool::placement(size_t n) const {
  return tier::place_batch(impl_->live_bandwidth(1), n);
}

void SsdPool::write_blocks(std::span<const SsdWrite> blocks, std::span<TierLocation> loc,
                           std::span<int> status) {
  Impl& m = *impl_;
  const size_t n = blocks.size();
  const size_t ndev = m.devs.size();
  std::fill(status.begin(), status.end(), -ENOSPC);
  std::vector<int> dev_of(n, -1);
  for (size_t i = 0; i < n; i++)
    if (blocks[i].length == 0 || !blocks[i].data) status[i] = -EINVAL;

  // Placement: consecutive (layer-wise ordered) blocks go to the same
  // device, and each device's run gets one contiguous extent when possible.
  std::vector<uint32_t> count;
  {
    // The split carries over from batch to batch, so the
    // KV store's one-block demotions still land in proportion.
    std::lock_guard lk(m.placement_mu);
    count = tier::place_batch_carry(m.live_bandwidth(1), n, &m.placement_credit);
  }
  std::vector<size_t> spilled;
  size_t next = 0;
  for (size_t dv = 0; dv < ndev; dv++) {
    size_t first = next, last = next + count[dv];
    next = last;
    if (count[dv] == 0) continue;
    ExtentAllocator& a = *m.devs[dv]->alloc;
    uint64_t total = 0;
    for (size_t i = first; i < last; i++)
      if (status[i] != -EINVAL) total += m.devs[dv]->extent_bytes(blocks[i].length);
    std::optional<tier::Extent> run = total ? a.allocate(total) : std::nullopt;
    uint64_t at = run ? run->offset : 0;
    for (size_t i = first; i < last; i++) {
      if (status[i] == -EINVAL) continue;
      std::optional<tier::Extent> e;
      if (run) {
        e = tier::Extent{at, m.devs[dv]->extent_bytes(blocks[i].length)};
        at += e->length;
      } else {
        e = a.allocate(m.devs[dv]->extent_bytes(blocks[i].length));  // fragmented: block by block
      }
      if (!e) {
        spilled.push_back(i);
        continue;
      }
      dev_of[i] = static_cast<int>(dv);
      loc[i] = TierLocation{static_cast<uint16_t>(dv), TierKind::kSsd, e->offset, blocks[i].length};
    }
  }
  for (size_t i : spilled) {
    if (auto s = m.spill(blocks[i].length)) {
      dev_of[i] = static_cast<int>(s->first);
      loc[i] = TierLocation{static_cast<uint16_t>(s->first), TierKind::kSsd, s->second.offset, blocks[i].length};
    }  // else stays -ENOSPC: the SSD tier is full, the caller evicts instead
  }

  std::vector<size_t> todo;
  for (size_t i = 0; i < n; i++)
    if (dev_of[i] >= 0) todo.push_back(i);
  std::vector<size_t> failed = m.issue_writes(blocks, todo, dev_of, loc, status);
  // A block whose device failed under it is placed once more on the devices
  // still online, so one bad device does not fail the batch.
  std::vector<size_t> again;
  for (size_t i : failed) {
    if (m.devs[dev_of[i]]->online.load()) continue;  // the device still serves: the error stands
    if (auto s = m.spill(blocks[i].length)) {
      dev_of[i] = static_cast<int>(s->first);
      loc[i] = TierLocation{static_cast<uint16_t>(s->first), TierKind::kSsd, s->second.offset, blocks[i].length};
      again.push_back(i);
    }
  }
  if (!again.empty()) m.issue_writes(blocks, again, dev_of, loc, status);
}

void SsdPool::read_blocks(std::span<const SsdRead> reads, std::span<int> status) {
  Impl& m = *impl_;
  const size_t ndev = m.devs.size();
  std::vector<std::vector<SsdIo>> ios(ndev);
  std::vector<std::vector<BlockIo>> meta(ndev);
  auto lose = [&](size_t i, int err, const char* why) {
    status[i] = err;
    m.lost.fetch_add(1, std::memory_order_relaxed);
    const TierLocation& l = reads[i].location;
    if (l.device < ndev) m.devs[l.device]->lost.fetch_add(1, std::memory_order_relaxed);
    log().warn("SSD pool: block at device {} offset {} length {} lost: {}", l.device, l.offset, l.length, why);
  };
  for (size_t i = 0; i < reads.size(); i++) {
    const TierLocation& l = reads[i].location;
    status[i] = 0;
    if (l.tier != TierKind::kSsd || l.device >= ndev || l.length == 0 || !reads[i].data) {
      lose(i, -EINVAL, "not an SSD location of this pool");
      continue;
    }
    DeviceSlot& s = *m.devs[l.device];
    if (!s.online.load()) {
      lose(i, -ENODEV, "device is offline");
      continue;
    }
    if (!s.valid(l.offset, l.length)) {
      lose(i, -ESTALE, "extent is not allocated");
      continue;
    }
    SsdIo io;
    io.op = IoOp::kRead;
    io.offset = l.offset;
    io.length = static_cast<uint32_t>(s.extent_bytes(l.length));
    // The whole extent (header block + payload) into one staging buffer;
    // the caller's buffer receives only verified payload.
    BlockIo b{i, AlignedBuffer(io.length, std::max<size_t>(4096, s.dev->memory_align()))};
    io.buf = b.bounce.data();
    ios[l.device].push_back(io);
    meta[l.device].push_back(std::move(b));
  }
  IoBatch batch;
  for (size_t dv = 0; dv < ndev; dv++) m.devs[dv]->dev->submit(ios[dv], batch);
  batch.wait();
  for (size_t dv = 0; dv < ndev; dv++) {
    for (size_t k = 0; k < ios[dv].size(); k++) {
      const SsdIo& io = ios[dv][k];
      BlockIo& b = meta[dv][k];
      if (io.status == 0) {
        m.note_ok(dv);
        const char* why = "";
        int bad = check_block(b.bounce.data(), m.devs[dv]->alloc->unit(), reads[b.block], &why);
        if (bad) {
          m.devs[dv]->bad.fetch_add(1, std::memory_order_relaxed);
          lose(b.block, bad, why);
          continue;
        }
        std::memcpy(reads[b.block].data, b.bounce.data() + m.devs[dv]->alloc->unit(),
                    reads[b.block].location.length);
        continue;
      }
      // Never hand out what a failed or short read left in the buffer.  A
      // short read means the extent is not there any more (the file was
      // truncated): like a bad checksum, the block is gone (-EBADMSG).
      if (io.short_transfer) m.devs[dv]->bad.fetch_add(1, std::memory_order_relaxed);
      lose(b.block, io.short_transfer ? -EBADMSG : io.status,
           io.short_transfer ? "short read: the extent lies past the end of the device (truncated?)"
                             : std::strerror(-io.status));
      m.note_error(dv, io.status, io.short_transfer);
    }
  }
}

void SsdPool::write_at(std::span<const SsdRead> targets, std::span<int> status) {
  Impl& m = *impl_;
  std::vector<SsdWrite> blocks(targets.size());
  std::vector<TierLocation> loc(targets.size());
  std::vector<int> dev_of(targets.size(), -1);
  std::vector<size_t> todo;
  for (size_t i = 0; i < targets.size(); i++) {
    const TierLocation& l = targets[i].location;
    blocks[i] = {targets[i].data, l.length, targets[i].key_lo, targets[i].key_hi};
    loc[i] = l;
    if (l.tier != TierKind::kSsd || l.device >= m.devs.size() || !l.length || !targets[i].data) {
      status[i] = -EINVAL;
    } else if (!m.devs[l.device]->online.load()) {
      status[i] = -ENODEV;
    } else if (!m.devs[l.device]->valid(l.offset, l.length)) {
      status[i] = -ESTALE;
    } else {
      dev_of[i] = l.device;
      todo.push_back(i);
    }
  }
  // The extent stays allocated on failure: the block owns it until released.
  m.issue_writes(blocks, todo, dev_of, loc, status, /*free_on_error=*/false);
}

void SsdPool::release(const TierLocation& loc) {
  if (loc.tier != TierKind::kSsd || loc.device >= impl_->devs.size()) return;
  DeviceSlot& s = *impl_->devs[loc.device];
  if (!s.owned(loc.offset)) {
    s.foreign_releases.fetch_add(1, std::memory_order_relaxed);  // another process's share
    return;
  }
  if (!s.alloc->free(loc.offset, s.extent_bytes(loc.length)))
    log().error("SSD pool: release of device {} offset {} length {}: extent was not allocated", loc.device,
                loc.offset, loc.length);
}

bool SsdPool::claim(const TierLocation& loc) {
  if (loc.tier != TierKind::kSsd || loc.device >= impl_->devs.size() || loc.length == 0) return false;
  DeviceSlot& s = *impl_->devs[loc.device];
  const uint64_t ext = s.extent_bytes(loc.length);
  if (!s.in_data(loc.offset, ext)) return false;
  if (!s.owned(loc.offset)) return true;  // another partition's: its owner claims it
  if (!s.alloc->reserve(loc.offset, ext)) return false;
  s.claimed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t SsdPool::extent_bytes(size_t device, uint64_t length) const {
  return impl_->devs.at(device)->extent_bytes(length);
}

uint64_t SsdPool::lost_blocks() const { return impl_->lost.load(); }

}  // namespace cxlkv
