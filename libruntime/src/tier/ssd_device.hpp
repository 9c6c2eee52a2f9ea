// SPDX-License-Identifier: MIT
// SsdDevice: one SSD pool device (a regular file or a raw block device)
// opened with O_DIRECT, driven by one io_uring that belongs to one worker
// thread.  Callers queue I/Os from any thread; the worker takes as many as
// the queue depth allows, prepares them all and submits them with one
// system call (batched submission), then reaps completions.  The device file
// and the caller's long-lived memory are registered with the ring (fixed
// file, fixed buffers), so the kernel does not look them up or pin pages on
// every I/O.  Nothing on this path goes through the page cache.
//
// Every I/O must be aligned: offset and length to logical_block(), the
// buffer to memory_align().  The extent allocator and the pool guarantee
// that by construction; a misaligned I/O fails with -EINVAL.
#pragma once

#include <liburing.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/result.hpp"
#include "tier/fault_injector.hpp"

namespace cxlkv::tier {

// Counts down the I/Os of one caller's batch; the caller waits for zero.
class IoBatch {
 public:
  void add(int64_t n) { pending_.fetch_add(n, std::memory_order_relaxed); }
  void complete_one() {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_all();
  }
  void wait() {
    for (int64_t v; (v = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(v);
  }

 private:
  std::atomic<int64_t> pending_{0};
};

struct SsdIo {
  IoOp op = IoOp::kRead;
  uint64_t offset = 0;   // bytes, multiple of logical_block()
  void* buf = nullptr;   // aligned to memory_align()
  uint32_t length = 0;   // bytes, multiple of logical_block()
  // Set when the I/O completes:
  int32_t status = 0;          // 0, or a negative errno (-EIO for a short transfer)
  uint32_t transferred = 0;    // bytes actually moved
  bool short_transfer = false; // the device returned fewer bytes than asked (end of file / device)
  // Worker-private:
  IoBatch* batch = nullptr;
  uint32_t retries = 0;
};

struct SsdDeviceOptions {
  std::string path;
  uint64_t create_bytes = 0;      // regular file: create / grow to this size
  uint32_t queue_depth = 32;
  bool sqpoll = false;
  std::vector<std::span<std::byte>> registered_memory;
  std::shared_ptr<FaultInjector> faults;
};

class SsdDevice {
 public:
  static Result<std::unique_ptr<SsdDevice>> open(const SsdDeviceOptions& opts);
  ~SsdDevice();  // finishes queued I/O, then stops the worker
  SsdDevice(const SsdDevice&) = delete;
  SsdDevice& operator=(const SsdDevice&) = delete;

  // Queues the I/Os; each completes into its SsdIo and counts `batch` down.
  // The SsdIo objects must stay alive until batch.wait() returns.
  void submit(std::span<SsdIo> ios, IoBatch& batch);
  // submit + wait; returns the first error (0 if all succeeded).
  int run(std::span<SsdIo> ios);

  const std::string& path() const { return path_; }
  bool block_device() const { return block_device_; }
  uint32_t logical_block() const { return logical_block_; }
  uint32_t memory_align() const { return memory_align_; }
  uint64_t capacity() const { return capacity_; }
  bool fixed_buffers() const { return !fixed_.empty(); }
  bool fixed_file() const { return fixed_file_; }
  bool sqpoll() const { return sqpoll_; }
  // This open created the file (SsdPool::open removes it again when it fails).
  bool created() const { return created_; }

  struct Counters {
    std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0};
    std::atomic<uint64_t> errors{0}, short_reads{0}, fixed_ios{0}, submits{0};
    std::atomic<uint64_t> peak_in_flight{0};  // most I/Os the ring has held at once
  };
  const Counters& counters() const { return counters_; }

 private:
  SsdDevice() = default;
  void worker();
  bool prepare(SsdIo* io);   // false: completed at once (fault, bad alignment)
  void complete(SsdIo* io);
  int fixed_index(const void* buf, size_t len) const;

  std::string path_;
  int fd_ = -1;
  bool block_device_ = false;
  bool created_ = false;
  uint32_t logical_block_ = 4096;
  uint32_t memory_align_ = 4096;
  uint64_t capacity_ = 0;
  uint32_t queue_depth_ = 32;
  bool sqpoll_ = false;
  bool fixed_file_ = false;
  bool ring_ready_ = false;
  struct FixedRegion {
    uintptr_t base;
    size_t len;
    int index;
  };
  std::vector<FixedRegion> fixed_;
  std::shared_ptr<FaultInjector> faults_;
  io_uring ring_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SsdIo*> queue_;
  bool stop_ = false;
  std::thread thread_;
  Counters counters_;
};

// Page-aligned heap memory for staging and probes.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, size_t align = 4096);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  std::byte* data() const { return p_; }
  size_t size() const { return n_; }
  std::span<std::byte> span() const { return {p_, n_}; }

 private:
  std::byte* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace cxlkv::tier
