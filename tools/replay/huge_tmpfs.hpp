// SPDX-License-Identifier: MIT
// The run's own pools on 2 MiB pages: a private tmpfs mounted huge=always,
// as a CXL pool is mapped (device-dax maps 2 MiB pages).  /dev/shm is
// usually mounted huge=never, so a shm: pool gets 4 KiB pages, and every
// worker then builds (and at exit tears down) 512 page-table entries per
// 2 MiB block it touches: on a 2-core VM that was a quarter of the workers'
// CPU time in cxlkv-replay.
//
// The mount is detached (fsopen / fsmount, Linux 5.2+): it has no mount
// point, nothing outside the run sees it, and it is gone with the last
// process that holds its descriptor -- the parent and its workers, which
// inherit it (not close-on-exec) and reach its files by the same path,
// /proc/self/fd/N/NAME.  A kill -9 of the run leaves nothing behind.
// Needs CAP_SYS_ADMIN (root); without it the run uses /dev/shm as before.
#pragma once

#include <cstdint>
#include <string>

namespace replay {

class HugeTmpfs {
 public:
  // A tmpfs of at most `bytes` with 2 MiB pages; !ok() with why_not() set
  // when the kernel or the caller's privileges refuse it.
  static HugeTmpfs mount(uint64_t bytes);
  HugeTmpfs() = default;
  HugeTmpfs(HugeTmpfs&& o) noexcept : fd_(o.fd_), why_not_(std::move(o.why_not_)) { o.fd_ = -1; }
  HugeTmpfs& operator=(HugeTmpfs&& o) noexcept;
  HugeTmpfs(const HugeTmpfs&) = delete;
  HugeTmpfs& operator=(const HugeTmpfs&) = delete;
  ~HugeTmpfs();

  bool ok() const { return fd_ >= 0; }
  const std::string& why_not() const { return why_not_; }
  // A pool file in it: "file:/proc/self/fd/N/NAME", valid in this process
  // and in every child that inherits the descriptor.
  std::string pool_uri(const std::string& name) const;
  // Remove NAME (once every worker has it mapped: its pages live on until
  // the last mapping goes).
  void unlink(const std::string& name) const;

 private:
  int fd_ = -1;
  std::string why_not_;
};

}  // namespace replay
