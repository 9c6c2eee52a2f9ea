// SPDX-License-Identifier: MIT
#include "tier/extent_allocator.hpp"

#include <algorithm>

namespace cxlkv::tier {

ExtentAllocator::ExtentAllocator(uint64_t base, uint64_t bytes, uint32_t unit) : unit_(unit) {
  uint64_t start = round_up(base);
  uint64_t end = (base + bytes) & ~uint64_t(unit - 1);
  base_ = start;
  capacity_ = end > start ? end - start : 0;
  free_bytes_ = capacity_;
  if (capacity_) free_.emplace(base_, capacity_);
}

std::optional<Extent> ExtentAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  uint64_t want = round_up(bytes);
  std::lock_guard lk(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    Extent e{it->first, want};
    uint64_t rest = it->second - want;
    uint64_t rest_off = it->first + want;
    free_.erase(it);
    if (rest) free_.emplace(rest_off, rest);
    free_bytes_ -= want;
    return e;
  }
  return std::nullopt;
}

// [offset, offset + length) lies in the managed range; no sum can wrap
// (offsets come from index entries, which may be damaged).
bool ExtentAllocator::inside(uint64_t offset, uint64_t length) const {
  const uint64_t end = base_ + capacity_;
  return offset >= base_ && offset <= end && length <= end - offset;
}

bool ExtentAllocator::overlaps_free(uint64_t offset, uint64_t length) const {
  // The free run starting at or before `offset`, and any that starts inside.
  auto it = free_.upper_bound(offset);
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second > offset) return true;
  }
  return it != free_.end() && it->first < offset + length;
}

bool ExtentAllocator::free(uint64_t offset, uint64_t length) {
  length = round_up(length);
  if (length == 0 || offset % unit_ || !inside(offset, length)) return false;
  std::lock_guard lk(mu_);
  if (overlaps_free(offset, length)) return false;  // double free: keep the map consistent
  uint64_t start = offset, len = length;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + length) {
    len += next->second;
    free_.erase(next);
  }
  free_.emplace(start, len);
  free_bytes_ += length;
  return true;
}

bool ExtentAllocator::reserve(uint64_t offset, uint64_t length) {
  length = round_up(length);
  if (length == 0 || offset % unit_ || !inside(offset, length)) return false;
  std::lock_guard lk(mu_);
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) return false;
  --it;  // the free run starting at or before offset
  const uint64_t run_off = it->first, run_len = it->second;
  if (run_off + run_len < offset + length) return false;  // not wholly inside one free run
  free_.erase(it);
  if (offset > run_off) free_.emplace(run_off, offset - run_off);
  if (run_off + run_len > offset + length) free_.emplace(offset + length, run_off + run_len - offset - length);
  free_bytes_ -= length;
  return true;
}

bool ExtentAllocator::is_allocated(uint64_t offset, uint64_t length) const {
  length = round_up(length);
  if (length == 0 || !inside(offset, length)) return false;
  std::lock_guard lk(mu_);
  return !overlaps_free(offset, length);
}

uint64_t ExtentAllocator::free_bytes() const {
  std::lock_guard lk(mu_);
  return free_bytes_;
}

uint64_t ExtentAllocator::largest_free() const {
  std::lock_guard lk(mu_);
  uint64_t m = 0;
  for (auto& [o, l] : free_) m = std::max(m, l);
  return m;
}

}  // namespace cxlkv::tier
