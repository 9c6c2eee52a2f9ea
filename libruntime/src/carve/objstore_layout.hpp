// SPDX-License-Identifier: MIT
// Size of the object store's table inside the alloc carve
// (cxlkv/format/objstore_format.h): the alloc carve's plan counts it.
#pragma once

#include <cstdint>

#include "cxlkv/format/objstore_format.h"

namespace cxlkv::objstore {

inline uint64_t objstore_bytes(uint32_t entries) {
  return sizeof(cxlkv_objstore_header) + uint64_t(entries) * sizeof(cxlkv_obj_entry);
}
inline uint32_t objstore_entries_for(uint64_t bytes) {
  return static_cast<uint32_t>((bytes - sizeof(cxlkv_objstore_header)) / sizeof(cxlkv_obj_entry));
}

}  // namespace cxlkv::objstore
