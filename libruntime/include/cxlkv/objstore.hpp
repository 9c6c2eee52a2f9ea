// SPDX-License-Identifier: MIT
// Object store: named roots (string key -> pool offset) in a pool hash table
// (layout and protocol in cxlkv/format/objstore_format.h).  put/destroy take the
// global lock CXLKV_LOCK_OBJSTORE; get reads without locking and validates
// each entry's checksum.
#pragma once

#include <cstdint>
#include <string_view>

#include "cxlkv/result.hpp"
#include "cxlkv/sync.hpp"
#include "cxlkv/format/objstore_format.h"

namespace cxlkv {

class ObjectStore {
 public:
  static Result<ObjectStore> open(NodeContext& node);
  // Insert or replace `name` -> off.  -ENAMETOOLONG / -EINVAL for a bad name,
  // -ERANGE for an offset outside the pool, -ENOSPC when the table is full.
  Result<void> put(std::string_view name, uint64_t off);
  // -ENOENT if absent.
  Result<uint64_t> get(std::string_view name) const;
  // -ENOENT if absent.
  Result<void> destroy(std::string_view name);
  uint32_t capacity() const { return nentries_; }

 private:
  explicit ObjectStore(NodeContext& n) : node_(&n) {}
  NodeContext* node_;
  cxlkv_obj_entry* table_ = nullptr;
  uint32_t nentries_ = 0;
};

}  // namespace cxlkv
