// SPDX-License-Identifier: MIT
// Checks of the index carve from outside a KV store (docs/integrity.md "Checked metadata"): which entry
// names a range of pool memory, payload locations, children counts.
// Lock-free snapshots (rule 4).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cxlkv/keys.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"
#include "cxlkv/format/index_format.h"

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

// The index carve header of a carve of `carve_bytes`, checked
// field by field with overflow-safe arithmetic (errors name the field,
// prefixed with `who`, e.g. "pool shm:a: index carve: "), then its checksum.
// The magic is checked by the caller (an unformatted carve is not damage).
Result<void> check_index_header(const cxlkv_index_header& h, uint64_t carve_bytes, const std::string& who);

// The pool's index carve header, read fresh (rule 4) and checked before a
// lock-free reader (cxlkvctl, the metrics) follows its offsets: errors say
// whether the carve is missing, unformatted (all zero), damaged (bad magic)
// or inconsistent (check_index_header names the field).
Result<cxlkv_index_header> read_index_header(const Region& pool, MemoryDomain& d);

// A lock-free audit of every WRITING / READY / EVICTING entry's
// location: memory-tier entries (not interleaved) must lie inside the kv
// carve and overlap no other entry.  One line per finding, naming the
// block, the slot and the cause; empty when the index is sound; an error
// when it cannot be read (read_index_header).
Result<std::vector<std::string>> index_audit_locations(const Region& pool, MemoryDomain& d);

// "block <key> (slot N, READY, bytes [a, b))" for messages.
std::string describe_named_block(const NamedBlock& b);

// A live entry whose `children` count differs from the number of live
// (WRITING / READY / EVICTING) entries and pending drops (tombstones that
// still name their parent: prefix_index.hpp "Children counts") whose
// parent_slot names it.  A count above the children found keeps the block
// from ever being evicted (a process killed inside a change under the
// stripe lock, until the online repair's next run); one below lets it be
// evicted while its children stay cached.
struct ChildCountMismatch {
  uint32_t slot = 0;
  BlockKey key;
  uint32_t state = 0;
  uint32_t stored = 0;  // the entry's children field
  uint32_t found = 0;   // live entries and pending drops naming it as parent
  friend bool operator==(const ChildCountMismatch&, const ChildCountMismatch&) = default;
};

// One lock-free snapshot (rule 4) of the index carve at `carve` of `bytes`
// (header checked with check_index_header, errors prefixed with `who`):
// every live entry with a valid check whose stored count differs from the
// live entries naming it.  An entry stores no parent key (its key is a hash
// of the parent's and cannot be traced back), so a child is counted for the
// slot its parent_slot names.  Torn or damaged lines are skipped; a count in
// flux (a writer between raising a count and writing the child, a dropper
// between removing a child and dropping the count) can show here: see
// index_audit_child_counts.
Result<std::vector<ChildCountMismatch>> index_child_count_snapshot(MemoryDomain& d, const void* carve,
                                                                   uint64_t bytes, const std::string& who);

// The pool's index (read_index_header first): a snapshot, then, `settle`
// later, a second one; only mismatches seen identically in both (same slot,
// key, state, stored and found counts) are returned, so a count that live
// writers change in between is not reported.  settle 0: one snapshot (a
// pool no process writes).
Result<std::vector<ChildCountMismatch>> index_audit_child_counts(const Region& pool, MemoryDomain& d,
                                                                 std::chrono::milliseconds settle);

// "block <key> (index slot N, READY): children count 2, but 1 live block
// names it as parent ..." for messages.
std::string describe_child_count_mismatch(const ChildCountMismatch& m);

// ---- offline repair (index_repair.cpp; cxlkvctl kv check --repair) ---------

// One children count rewritten: `was` as the snapshot found it (stored: the
// old count; found: the count written).
struct ChildCountRepair {
  ChildCountMismatch was;
  bool listed = false;  // a READY memory leaf now, on its stripe's eviction list (evictable)
};
struct ChildCountRepairReport {
  std::vector<ChildCountRepair> repaired;
  std::vector<ChildCountMismatch> changed;  // changed since the snapshot: not rewritten
  std::string attached_meanwhile;           // nodes found live after the repair ("node 3 (...)"), if any
  size_t now_evictable() const;
};

// Like fsck on an unmounted file system: with no node of the pool live (the
// node table judged by list_nodes / judge_node, as `cxlkvctl node list`
// shows it; a lock manager is no node and may run), one exact snapshot
// (index_child_count_snapshot: nothing writes, so no settle), then every
// live entry whose count differs from the live entries naming it gets the
// count found (PrefixIndex::set_children on an index attached offline:
// its stripe-lock protocol and line writes, no lock manager needed).  A
// READY memory block left without children joins its eviction list, so it
// can be evicted as soon as a node attaches.  Errors: -EBUSY while a node
// is live (naming each node and how to stop it), the node table or the
// index header unreadable (nothing written then).
Result<ChildCountRepairReport> index_repair_child_counts(const Region& pool, MemoryDomain& d);

// "block <key> (index slot N, READY): children 1 -> 0, a leaf on its
// stripe's eviction list (evictable)" for messages.
std::string describe_child_count_repair(const ChildCountRepair& r);

// What `cxlkvctl kv check` reports: the location findings
// (index_audit_locations) and the child counts (index_audit_child_counts).
struct IndexAudit {
  std::vector<std::string> locations;
  std::vector<ChildCountMismatch> child_counts;
  size_t children_mismatches() const { return child_counts.size(); }
  size_t problems() const { return locations.size() + child_counts.size(); }
  // One line per finding, each prefixed "pool <uri>: index carve: ".
  std::vector<std::string> lines(const Region& pool) const;
};
Result<IndexAudit> index_audit(const Region& pool, MemoryDomain& d, std::chrono::milliseconds settle);

}  // namespace cxlkv
