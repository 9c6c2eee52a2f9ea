// SPDX-License-Identifier: MIT
// The SSD tier: SSD pool devices (files or raw block devices, read and
// written with io_uring + O_DIRECT, never through the page cache) organised
// as one pool with bandwidth-aware placement, as in Unified KV Pooling.
//
//   SsdPool::open      open every device, read its header, probe (or reuse
//                      the cached) bandwidth b_i, start one I/O worker each
//   write_blocks       place a batch of blocks (floor(p_i * n) per device,
//                      p_i = b_i / sum b_j, the remainder to the largest p_i),
//                      write all devices in parallel, return each block's
//                      location
//   read_blocks        group reads per device, issue all devices in parallel;
//                      a failed or short read reports that block lost
//   release            give a block's extent back
//   claim              mark an extent a surviving index entry names as in
//                      use (at attach: the index is the record of which
//                      extents are allocated, so a restart never hands out
//                      an extent that still holds a published block)
//
// Every extent starts with a header block (cxlkv/format/tier_format.h: key, length,
// payload checksum); a read whose header or payload does not match what the
// caller expects is a clean miss (-ESTALE: the extent holds another block;
// -EBADMSG: damaged or truncated), counted and logged, never data.
//
// A location (device, tier, offset, length) is what the prefix index stores
// for a block: the global lookup table of the tiered pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"

namespace cxlkv {

// Where a block's payload lives.  The values are the ones the prefix index
// stores in its location's tier field.
enum class TierKind : uint8_t { kMem = 0, kSsd = 1 };

const char* tier_name(TierKind t);

struct TierLocation {
  uint16_t device = 0;        // index of the device within its tier
  TierKind tier = TierKind::kMem;
  uint64_t offset = 0;        // MEM: pool offset; SSD: byte offset (a multiple of the logical block)
  uint32_t length = 0;        // payload bytes (the extent is rounded up to the logical block)
};

struct SsdDeviceConfig {
  std::string path;             // regular file or block device
  uint64_t create_bytes = 0;    // regular file: create / grow to this size (0: use as is)
  double bandwidth_gbps = 0;    // > 0: use this bandwidth instead of the probe (configuration override)
  bool reprobe = false;         // ignore the bandwidth cached in the device header
};

class FaultInjector;  // libruntime/src/tier/fault_injector.hpp (tests)

struct SsdPoolOptions {
  std::vector<SsdDeviceConfig> devices;
  uint32_t queue_depth = 32;            // in-flight I/Os per device
  bool sqpoll = false;                  // kernel thread polls the submission queue (IORING_SETUP_SQPOLL)
  uint64_t probe_bytes = 32ull << 20;   // bandwidth probe size per device (capped by capacity / 8)
  // Memory the caller reads into / writes from (e.g. the pool's kv carve):
  // registered with every device's ring as fixed buffers, so I/O on it
  // skips per-I/O page pinning (IORING_OP_READ_FIXED / WRITE_FIXED).
  std::vector<std::span<std::byte>> registered_memory;
  // A device is taken out of placement after this many consecutive I/O
  // errors, or at once on ENODEV / ENXIO (the device disappeared).
  uint32_t offline_after_errors = 3;
  // Processes sharing the devices (same paths in the same order; the
  // medium is coherent because nothing is cached): process `partition` of
  // `partitions` places blocks only in its own equal share of every device's
  // data area and reads blocks anywhere in the data area.  An extent of
  // another share released here is only counted (foreign_releases); its
  // space returns when its owner restarts.
  uint32_t partition = 0, partitions = 1;
  // Tests: per-device fault injection (index = device), may be shorter / empty.
  std::vector<std::shared_ptr<FaultInjector>> faults;
};

struct SsdDeviceInfo {
  std::string path;
  bool block_device = false;
  uint32_t logical_block = 0;     // extent alignment (BLKSSZGET, or statx dio alignment / 4096 for files)
  uint32_t memory_align = 0;      // buffer alignment O_DIRECT needs
  uint64_t capacity = 0;          // bytes
  uint64_t data_bytes = 0;        // bytes available for extents
  uint64_t used_bytes = 0;
  double bandwidth_gbps = 0;      // b_i used for placement
  const char* bandwidth_source = "";  // "probe", "cached", "config"
  double placement_ratio = 0;     // p_i (0 when offline)
  bool online = true;
  // counters
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t io_errors = 0, short_reads = 0, lost_blocks = 0, foreign_releases = 0;
  uint64_t bad_blocks = 0;        // reads refused by the block header / payload checksum
  uint64_t claimed = 0;           // extents claimed at attach (named by the index)
  uint64_t submits = 0;           // io_uring submissions (one per batch of queued I/Os)
  uint64_t peak_in_flight = 0;    // most I/Os in flight on the device at once
};

struct SsdWrite {
  const void* data = nullptr;
  uint32_t length = 0;
  uint64_t key_lo = 0, key_hi = 0;  // recorded in the block header
};

struct SsdRead {
  TierLocation location;
  void* data = nullptr;   // receives location.length bytes
  uint64_t key_lo = 0, key_hi = 0;  // the key the block must hold (read_blocks) / write (write_at)
};

class SsdPool {
 public:
  static Result<std::unique_ptr<SsdPool>> open(const SsdPoolOptions& opts);
  ~SsdPool();
  SsdPool(const SsdPool&) = delete;
  SsdPool& operator=(const SsdPool&) = delete;

  size_t device_count() const;
  SsdDeviceInfo device_info(size_t i) const;

  // Blocks each online device with free space receives for a batch of n
  // (floor(p_i * n), the remainder one each to the largest p_i).
  std::vector<uint32_t> placement(size_t n) const;

  // Writes a batch (blocks in layer-wise order: consecutive blocks go to the
  // same device in one contiguous extent).  status[i] = 0 and loc[i] set, or
  // a negative errno: -ENOSPC when no online device has room (the caller
  // evicts instead), -EIO when the write failed.  Devices are written in
  // parallel; returns when every write has completed.
  void write_blocks(std::span<const SsdWrite> blocks, std::span<TierLocation> loc,
                    std::span<int> status);

  // Reads a batch, grouped per device, devices in parallel.  status[i] = 0
  // and data filled (the block header holds reads[i]'s key and length and
  // both checksums match), or a negative errno and its buffer must not be
  // used: -ESTALE the extent holds another block or is not allocated,
  // -EBADMSG damaged (no header, bad checksum, short read of a truncated
  // file), -EIO / -ENODEV the device failed, -EINVAL not a location here.
  void read_blocks(std::span<const SsdRead> reads, std::span<int> status);

  // Rewrites blocks in place at locations this pool handed out (status as
  // read_blocks: 0, or a negative errno and the block must be treated as lost).
  void write_at(std::span<const SsdRead> targets, std::span<int> status);

  // Returns the block's extent to its device's free space.
  void release(const TierLocation& loc);

  // Marks the extent of a block that an index entry names as allocated
  // (this process's partition only; others are their owners' business).
  // false when the location is not a valid extent of this pool or the
  // extent is already allocated (two entries naming one extent).
  bool claim(const TierLocation& loc);

  // Bytes an extent of a `length`-byte block takes on device `device`
  // (the header block plus the payload rounded up to the logical block).
  uint64_t extent_bytes(size_t device, uint64_t length) const;

  // Blocks reported lost by read_blocks so far.
  uint64_t lost_blocks() const;

 private:
  struct Impl;
  explicit SsdPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlkv
