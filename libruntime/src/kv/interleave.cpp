// SPDX-License-Identifier: MIT
#include "kv/interleave.hpp"

#include <algorithm>

namespace cxlkv {

InterleaveSet::InterleaveSet(uint32_t stripe, uint32_t ndev, const uint8_t* weights)
    : stripe_(stripe ? stripe : 65536), ndev_(ndev ? ndev : 1) {
  weight_.resize(ndev_);
  for (uint32_t d = 0; d < ndev_; d++) {
    weight_[d] = weights && weights[d] ? weights[d] : 1;
    for (uint32_t i = 0; i < weight_[d]; i++) {
      rank_.push_back(i);
      pattern_.push_back(static_cast<uint8_t>(d));
    }
  }
}

uint64_t InterleaveSet::extent(uint64_t len) const {
  const uint64_t W = pattern_.size();
  const uint64_t nstripes = (len + stripe_ - 1) / stripe_;
  uint64_t best = 0;
  for (uint32_t d = 0; d < ndev_; d++) {
    // Full cycles give weight_[d] stripes each; the partial cycle adds the
    // positions of d below nstripes % W.
    uint64_t n = (nstripes / W) * weight_[d];
    for (uint64_t p = 0; p < nstripes % W; p++) n += pattern_[p] == d;
    best = std::max(best, n * stripe_);
  }
  return best;
}

void InterleaveSet::map(uint64_t x, uint32_t* dev, uint64_t* dev_off, uint64_t* run) const {
  const uint64_t W = pattern_.size();
  const uint64_t k = x / stripe_, within = x % stripe_;
  const uint64_t pos = k % W, cycle = k / W;
  *dev = pattern_[pos];
  *dev_off = (cycle * weight_[*dev] + rank_[pos]) * stripe_ + within;
  *run = stripe_ - within;
}

}  // namespace cxlkv
