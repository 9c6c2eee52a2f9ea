// SPDX-License-Identifier: MIT
// FaultInjector: the seam tests use to make an SSD device fail without a
// device-mapper error target (which needs a kernel this CI may not have).
// The device's I/O worker asks it about every I/O before issuing it; an
// injected fault completes that I/O with the error (or as a short transfer)
// and the device is never touched, exactly as a failing device would look
// to the layers above.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace cxlkv {

enum class IoOp : uint8_t { kRead, kWrite };

class FaultInjector {
 public:
  struct Verdict {
    int error = 0;              // negative errno to complete the I/O with, or 0
    int64_t short_bytes = -1;   // >= 0: the I/O transfers only this many bytes
  };

  // Every I/O of `op` that overlaps [offset, offset + length) fails with neg_errno.
  void fail(IoOp op, uint64_t offset, uint64_t length, int neg_errno);
  // Every read overlapping the range transfers only up to the range start (a short read).
  void shorten_reads(uint64_t offset, uint64_t length);
  // The device is gone: every I/O fails with -ENODEV.
  void set_gone(bool gone);
  void clear();

  Verdict check(IoOp op, uint64_t offset, uint64_t length) const;
  uint64_t injected() const;

 private:
  struct Rule {
    IoOp op;
    uint64_t offset, length;
    int error;      // 0: shorten
  };
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  bool gone_ = false;
  mutable uint64_t injected_ = 0;
};

}  // namespace cxlkv
