// SPDX-License-Identifier: MIT
// Object store table inside the alloc carve (uapi/cxlkv_objstore.h).
#pragma once

#include <cstdint>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv_objstore.h"

namespace cxlkv::objstore {

inline uint64_t objstore_bytes(uint32_t entries) {
  return sizeof(cxlkv_objstore_header) + uint64_t(entries) * sizeof(cxlkv_obj_entry);
}
inline uint32_t objstore_entries_for(uint64_t bytes) {
  return static_cast<uint32_t>((bytes - sizeof(cxlkv_objstore_header)) / sizeof(cxlkv_obj_entry));
}
// Write the header and empty entries at `at` (the carve's flush covers data).
Result<void> format_objstore(MemoryDomain& d, std::byte* at, uint32_t entries);

}  // namespace cxlkv::objstore
