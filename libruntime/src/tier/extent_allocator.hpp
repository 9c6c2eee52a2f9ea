// SPDX-License-Identifier: MIT
// ExtentAllocator: contiguous byte extents of one SSD device's data area.
// Every extent starts and ends on a multiple of the allocation unit (the
// device's logical block), so every I/O it hands out is O_DIRECT-aligned by
// construction.  Free space is a map of free runs, merged with both
// neighbours on free; allocation is first fit (lowest offset), which keeps
// a batch's blocks together and the device's write pattern sequential.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace cxlkv::tier {

struct Extent {
  uint64_t offset = 0;  // bytes from the device start
  uint64_t length = 0;  // bytes, a multiple of the unit
};

class ExtentAllocator {
 public:
  // Manages [base, base + bytes) in units of `unit` (a power of two); base
  // and bytes are trimmed inwards to whole units.
  ExtentAllocator(uint64_t base, uint64_t bytes, uint32_t unit);

  uint32_t unit() const { return unit_; }
  // Saturates instead of wrapping (a damaged length must not round to 0).
  uint64_t round_up(uint64_t bytes) const {
    return bytes > UINT64_MAX - unit_ ? UINT64_MAX & ~uint64_t(unit_ - 1) : (bytes + unit_ - 1) & ~uint64_t(unit_ - 1);
  }

  // A contiguous extent of round_up(bytes), or nothing when no free run is large enough.
  std::optional<Extent> allocate(uint64_t bytes);
  // Returns [offset, offset + length) (rounded up to the unit), which must be
  // allocated; a part of an allocated extent may be freed on its own.
  // Returns false (and changes nothing) if any of it is already free or
  // outside the managed range.
  bool free(uint64_t offset, uint64_t length);
  // Takes exactly [offset, offset + round_up(length)) out of the free
  // space; false (nothing changed) unless all of it is free and inside.
  bool reserve(uint64_t offset, uint64_t length);
  // True when every byte of the range is allocated.
  bool is_allocated(uint64_t offset, uint64_t length) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t free_bytes() const;
  uint64_t largest_free() const;

 private:
  bool overlaps_free(uint64_t offset, uint64_t length) const;
  bool inside(uint64_t offset, uint64_t length) const;

  mutable std::mutex mu_;
  uint64_t base_;
  uint64_t capacity_;
  uint32_t unit_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length of each free run
};

}  // namespace cxlkv::tier
