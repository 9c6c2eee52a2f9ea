// SPDX-License-Identifier: MIT
#include "tier/ssd_device.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/log.hpp"
#include "util/safe_file.hpp"

namespace cxlkv::tier {

namespace {

constexpr uint32_t kMaxRetries = 8;          // -EAGAIN / -EINTR resubmissions per I/O
constexpr size_t kMaxFixedBuffer = 1ull << 30;  // io_uring limits one fixed buffer to 1 GiB

std::string errstr(int neg) { return std::strerror(-neg); }

// Direct-I/O alignment of an open file: statx(STATX_DIOALIGN) where the
// kernel reports it (6.1+), otherwise 4096, which every file system accepts.
void dio_alignment(int fd, uint32_t* offset_align, uint32_t* mem_align) {
  *offset_align = 4096;
  *mem_align = 4096;
#ifdef STATX_DIOALIGN
  struct statx stx {};
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
    *offset_align = stx.stx_dio_offset_align;
    *mem_align = std::max<uint32_t>(stx.stx_dio_mem_align, 1);
  }
#endif
}

}  // namespace

Result<std::unique_ptr<SsdDevice>> SsdDevice::open(const SsdDeviceOptions& opts) {
  std::unique_ptr<SsdDevice> d(new SsdDevice());
  d->path_ = opts.path;
  d->queue_depth_ = std::max<uint32_t>(opts.queue_depth, 1);
  d->faults_ = opts.faults;
  const std::string& p = opts.path;

  {
    // No symbolic links, exclusive creation, owner and mode checked
    // (util/safe_file.hpp): the SSD file may live in a shared directory.
    util::SafeOpenOptions so;
    so.what = "SSD device";
    so.create = opts.create_bytes != 0;
    so.extra_flags = O_DIRECT;
    so.allow_block_device = true;
    auto sf = util::safe_open(p, so);
    if (!sf) {
      if (sf.error().code() == -EINVAL && sf.error().message().find(": open: ") != std::string::npos)
        return Error(-EINVAL, "SSD device " + p + ": the file system does not support O_DIRECT "
                                  "(the SSD tier never reads through the page cache)");
      return sf.error();
    }
    d->fd_ = sf->fd;
    d->created_ = sf->created;
  }
  // A file this open created goes again when the open fails (a full file
  // system left an empty file, which the next open took for a device of
  // 0 bytes: "0 bytes is too small").
  struct RemoveCreated {
    const std::string* path;
    ~RemoveCreated() {
      if (path) ::unlink(path->c_str());
    }
  } remove_created{d->created_ ? &p : nullptr};
  struct stat st {};
  if (fstat(d->fd_, &st) != 0) return Error(-errno, "SSD device " + p + ": fstat: " + std::strerror(errno));
  if (S_ISBLK(st.st_mode)) {
    int lbs = 0;
    uint64_t bytes = 0;
    if (ioctl(d->fd_, BLKSSZGET, &lbs) != 0 || lbs <= 0)
      return Error(-EIO, "SSD device " + p + ": BLKSSZGET failed: " + std::strerror(errno));
    if (ioctl(d->fd_, BLKGETSIZE64, &bytes) != 0)
      return Error(-EIO, "SSD device " + p + ": BLKGETSIZE64 failed: " + std::strerror(errno));
    d->block_device_ = true;
    d->logical_block_ = static_cast<uint32_t>(lbs);
    // Block devices accept buffers aligned to their logical block; statx may say less.
    d->memory_align_ = static_cast<uint32_t>(lbs);
    d->capacity_ = bytes;
  } else if (S_ISREG(st.st_mode)) {
    uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t want = std::max(size, opts.create_bytes);
    // Allocate every block now (unwritten extents), also those of an
    // existing sparse file: a full file system is reported here, at open,
    // not discovered later as failed writes, and the data path never pays
    // for block allocation.  Only a file system without fallocate gets a
    // sparse file (with a warning).
    if (want > 0 && fallocate(d->fd_, 0, 0, static_cast<off_t>(want)) != 0) {
      const int e = errno;
      if (e == ENOSPC || e == EDQUOT || e == EFBIG) {
        std::string free_txt;
        struct statvfs vs {};
        if (fstatvfs(d->fd_, &vs) == 0)
          free_txt = " (" + std::to_string(uint64_t(vs.f_bavail) * vs.f_frsize) + " bytes free)";
        return Error(-e, "SSD device " + p + ": cannot allocate " + std::to_string(want) + " bytes: " +
                             std::strerror(e) + free_txt);
      }
      if (e != EOPNOTSUPP && e != ENOSYS)
        return Error(-e, "SSD device " + p + ": fallocate of " + std::to_string(want) + " bytes: " + std::strerror(e));
      log().warn("SSD device {}: the file system cannot pre-allocate ({}); using a sparse file", p, std::strerror(e));
      if (opts.create_bytes > size && ftruncate(d->fd_, static_cast<off_t>(opts.create_bytes)) != 0)
        return Error(-errno, "SSD device " + p + ": cannot size to " + std::to_string(opts.create_bytes) +
                                 " bytes: " + std::strerror(errno));
    }
    size = want;
    dio_alignment(d->fd_, &d->logical_block_, &d->memory_align_);
    d->capacity_ = size;
  } else {
    return Error(-EINVAL, "SSD device " + p + ": not a regular file or a block device");
  }
  if (d->logical_block_ & (d->logical_block_ - 1))
    return Error(-EINVAL, "SSD device " + p + ": logical block " + std::to_string(d->logical_block_) +
                              " is not a power of two");

  // The ring: entries = queue depth; SQPOLL when asked, falling back to a
  // plain ring when the kernel refuses it (it needs privileges on old kernels).
  io_uring_params params{};
  if (opts.sqpoll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = 50;  // ms the kernel thread spins before it sleeps
  }
  int r = io_uring_queue_init_params(d->queue_depth_, &d->ring_, &params);
  if (r < 0 && opts.sqpoll) {
    log().warn("SSD device {}: SQPOLL ring refused ({}); using a plain ring", p, errstr(r));
    params = io_uring_params{};
    r = io_uring_queue_init_params(d->queue_depth_, &d->ring_, &params);
  }
  if (r < 0) return Error(r, "SSD device " + p + ": io_uring_queue_init: " + errstr(r));
  d->ring_ready_ = true;
  d->sqpoll_ = params.flags & IORING_SETUP_SQPOLL;

  if (io_uring_register_files(&d->ring_, &d->fd_, 1) == 0) d->fixed_file_ = true;

  // Fixed buffers: the caller's memory, cut into pieces of at most 1 GiB.
  std::vector<iovec> iov;
  for (auto& m : opts.registered_memory) {
    for (size_t off = 0; off < m.size(); off += kMaxFixedBuffer) {
      size_t n = std::min(kMaxFixedBuffer, m.size() - off);
      d->fixed_.push_back({reinterpret_cast<uintptr_t>(m.data() + off), n, static_cast<int>(iov.size())});
      iov.push_back({m.data() + off, n});
    }
  }
  if (!iov.empty()) {
    r = io_uring_register_buffers(&d->ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (r < 0) {
      // Typically RLIMIT_MEMLOCK for an unprivileged user: the plain
      // O_DIRECT path still bypasses the page cache, it only pins per I/O.
      log().warn("SSD device {}: cannot register {} fixed buffers ({}); using unregistered I/O", p,
                 iov.size(), errstr(r));
      d->fixed_.clear();
    }
  }
  d->thread_ = std::thread([dev = d.get()] { dev->worker(); });
  log().info("SSD device {}: {} bytes, logical block {}, memory align {}, qd {}{}{}{}", p, d->capacity_,
             d->logical_block_, d->memory_align_, d->queue_depth_, d->sqpoll_ ? ", sqpoll" : "",
             d->fixed_file_ ? ", fixed file" : "", d->fixed_.empty() ? "" : ", fixed buffers");
  remove_created.path = nullptr;
  return d;
}

SsdDevice::~SsdDevice() {
  if (thread_.joinable()) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (fd_ >= 0) ::close(fd_);
}

void SsdDevice::submit(std::span<SsdIo> ios, IoBatch& batch) {
  if (ios.empty()) return;
  batch.add(static_cast<int64_t>(ios.size()));
  {
    std::lock_guard lk(mu_);
    for (SsdIo& io : ios) {
      io.batch = &batch;
      io.status = 0;
      io.transferred = 0;
      io.short_transfer = false;
      io.retries = 0;
      queue_.push_back(&io);
    }
  }
  cv_.notify_one();
}

int SsdDevice::run(std::span<SsdIo> ios) {
  IoBatch batch;
  submit(ios, batch);
  batch.wait();
  for (const SsdIo& io : ios)
    if (io.status) return io.status;
  return 0;
}

int SsdDevice::fixed_index(const void* buf, size_t len) const {
  auto b = reinterpret_cast<uintptr_t>(buf);
  for (const FixedRegion& f : fixed_)
    if (b >= f.base && b + len <= f.base + f.len) return f.index;
  return -1;
}

bool SsdDevice::prepare(SsdIo* io) {
  uint64_t off = io->offset + io->transferred;
  uint32_t len = io->length - io->transferred;
  auto* buf = static_cast<std::byte*>(io->buf) + io->transferred;
  if (off % logical_block_ || len % logical_block_ || reinterpret_cast<uintptr_t>(buf) % memory_align_ ||
      len == 0) {
    io->status = -EINVAL;  // alignment is guaranteed upstream; this is a bug, not a device fault
    log().error("SSD device {}: misaligned I/O (offset {}, length {}, buffer {}) refused", path_, off, len,
                static_cast<void*>(buf));
    complete(io);
    return false;
  }
  if (faults_) {
    FaultInjector::Verdict v = faults_->check(io->op, off, len);
    if (v.error) {
      io->status = v.error;
      complete(io);
      return false;
    }
    if (v.short_bytes >= 0) {
      io->transferred += static_cast<uint32_t>(std::min<int64_t>(v.short_bytes, len));
      io->short_transfer = true;
      io->status = -EIO;
      complete(io);
      return false;
    }
  }
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) {  // cannot happen: in-flight I/Os never exceed the ring size
    io->status = -EBUSY;
    complete(io);
    return false;
  }
  int file = fixed_file_ ? 0 : fd_;
  int idx = fixed_index(buf, len);
  if (io->op == IoOp::kRead) {
    if (idx >= 0) io_uring_prep_read_fixed(sqe, file, buf, len, off, idx);
    else io_uring_prep_read(sqe, file, buf, len, off);
  } else {
    if (idx >= 0) io_uring_prep_write_fixed(sqe, file, buf, len, off, idx);
    else io_uring_prep_write(sqe, file, buf, len, off);
  }
  if (idx >= 0) counters_.fixed_ios.fetch_add(1, std::memory_order_relaxed);
  if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, io);
  return true;
}

void SsdDevice::complete(SsdIo* io) {
  bool rd = io->op == IoOp::kRead;
  (rd ? counters_.reads : counters_.writes).fetch_add(1, std::memory_order_relaxed);
  (rd ? counters_.bytes_read : counters_.bytes_written).fetch_add(io->transferred, std::memory_order_relaxed);
  if (io->status) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    if (io->short_transfer && rd) counters_.short_reads.fetch_add(1, std::memory_order_relaxed);
  }
  IoBatch* b = io->batch;
  b->complete_one();  // io may be gone after this
}

void SsdDevice::worker() {
  std::vector<SsdIo*> take;
  uint32_t inflight = 0;
  for (;;) {
    take.clear();
    {
      std::unique_lock lk(mu_);
      // Sleep only when nothing is in flight; otherwise new work is picked
      // up after the next completion.
      if (inflight == 0) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty() && inflight == 0) return;
      while (!queue_.empty() && inflight + take.size() < queue_depth_) {
        take.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    for (SsdIo* io : take)
      if (prepare(io)) inflight++;
    if (inflight == 0) continue;
    if (inflight > counters_.peak_in_flight.load(std::memory_order_relaxed))
      counters_.peak_in_flight.store(inflight, std::memory_order_relaxed);  // only this thread writes it

    // One system call submits everything prepared and waits for a completion.
    // `submits` counts the calls that submitted something (the passes that
    // only wait for the next completion of I/Os already in flight do not:
    // how many of those a batch takes depends on how its completions spread).
    int r = io_uring_submit_and_wait(&ring_, 1);
    if (r > 0) counters_.submits.fetch_add(1, std::memory_order_relaxed);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      log().error("SSD device {}: io_uring_submit: {}", path_, errstr(r));
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      seen++;
      auto* io = static_cast<SsdIo*>(io_uring_cqe_get_data(cqe));
      int res = cqe->res;
      if ((res == -EAGAIN || res == -EINTR) && io->retries++ < kMaxRetries) {
        if (!prepare(io)) inflight--;  // resubmitted on the next pass
        continue;
      }
      if (res < 0) {
        io->status = res;
        log().warn("SSD device {}: {} at offset {} length {} failed: {}", path_,
                   io->op == IoOp::kRead ? "read" : "write", io->offset, io->length, errstr(res));
      } else if (res == 0) {
        // End of file or device before the request was satisfied.
        io->status = -EIO;
        io->short_transfer = true;
        log().warn("SSD device {}: short {} at offset {}: {} of {} bytes", path_,
                   io->op == IoOp::kRead ? "read" : "write", io->offset, io->transferred, io->length);
      } else {
        io->transferred += static_cast<uint32_t>(res);
        if (io->transferred < io->length) {  // partial: issue the rest
          if (!prepare(io)) inflight--;
          continue;
        }
      }
      inflight--;
      complete(io);
    }
    io_uring_cq_advance(&ring_, seen);
  }
}

AlignedBuffer::AlignedBuffer(size_t bytes, size_t align) : n_(bytes) {
  void* p = nullptr;
  size_t rounded = (bytes + align - 1) / align * align;
  if (posix_memalign(&p, align, rounded ? rounded : align) != 0) throw std::bad_alloc();
  p_ = static_cast<std::byte*>(p);
}

AlignedBuffer::~AlignedBuffer() { std::free(p_); }

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

}  // namespace cxlkv::tier
