// SPDX-License-Identifier: MIT
// Checks of the index carve from outside a KV store (issue 12): which entry
// names a range of pool memory.  Lock-free snapshots (rule 4).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cxlkv/keys.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv_index.h"

namespace cxlkv {

struct NamedBlock {
  uint32_t slot = 0;
  BlockKey key;
  uint32_t state = 0;
  uint64_t loc_off = 0, loc_len = 0;
};

// The first WRITING / READY / EVICTING memory-tier entry of the pool's
// index whose payload overlaps pool bytes [off, off + len), if any.  A pool
// without an index carve names nothing; an unreadable index is an error.
Result<std::optional<NamedBlock>> index_entry_naming(const Region& pool, MemoryDomain& d, uint64_t off, uint64_t len);

// Issue 12: the index carve header of a carve of `carve_bytes`, checked
// field by field with overflow-safe arithmetic (errors name the field,
// prefixed with `who`, e.g. "pool shm:a: index carve: "), then its checksum.
// The magic is checked by the caller (an unformatted carve is not damage).
Result<void> check_index_header(const cxlkv_index_header& h, uint64_t carve_bytes, const std::string& who);

// The pool's index carve header, read fresh (rule 4) and checked before a
// lock-free reader (cxlkvctl, the metrics) follows its offsets: errors say
// whether the carve is missing, unformatted (all zero), damaged (bad magic)
// or inconsistent (check_index_header names the field).
Result<cxlkv_index_header> read_index_header(const Region& pool, MemoryDomain& d);

// Issue 12: a lock-free audit of every WRITING / READY / EVICTING entry's
// location: memory-tier entries (not interleaved) must lie inside the kv
// carve and overlap no other entry.  One line per finding, naming the
// block, the slot and the cause; empty when the index is sound; an error
// when it cannot be read (read_index_header).
Result<std::vector<std::string>> index_audit_locations(const Region& pool, MemoryDomain& d);

// "block <key> (slot N, READY, bytes [a, b))" for messages.
std::string describe_named_block(const NamedBlock& b);

}  // namespace cxlkv
