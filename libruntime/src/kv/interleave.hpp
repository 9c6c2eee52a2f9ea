// SPDX-License-Identifier: MIT
// Striping one block's payload over several pool devices (Beluga O9: add the
// devices' bandwidth).  The block's logical bytes are cut into stripes of
// `stripe` bytes; stripe k goes to device pattern[k % W] where the pattern
// holds device d weights[d] times (W = sum of weights).  Every device keeps
// its stripes of the block contiguously at the same offset (the location's
// offset), so one allocation on device 0 names the block on all of them; the
// other devices' kv areas are reserved for this and must be as large.
#pragma once

#include <cstdint>
#include <vector>

#include "cxlkv/format/index_format.h"

namespace cxlkv {

class InterleaveSet {
 public:
  InterleaveSet(uint32_t stripe, uint32_t ndev, const uint8_t* weights);
  uint32_t devices() const { return ndev_; }
  uint32_t stripe() const { return stripe_; }
  // Bytes the busiest device holds for a block of `len` bytes (allocation size).
  uint64_t extent(uint64_t len) const;
  // Where logical byte `x` of a block lives: device and offset within that
  // device's extent; `run` = bytes until the stripe ends.
  void map(uint64_t x, uint32_t* dev, uint64_t* dev_off, uint64_t* run) const;

 private:
  uint32_t stripe_;
  uint32_t ndev_;
  std::vector<uint8_t> pattern_;        // device per position
  std::vector<uint32_t> rank_;          // position's index among its device's positions
  std::vector<uint32_t> weight_;        // per device
};

}  // namespace cxlkv
