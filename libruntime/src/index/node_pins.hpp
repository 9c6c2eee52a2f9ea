// SPDX-License-Identifier: MIT
// NodePins: which processes of this node pin which index slots, in the
// node-local shared memory (DESIGN: "Node-local state that several
// processes of one host share ... lives in node-local shared memory"; the
// pin section of sync/node_local.hpp).
//
// Why: a pin is one bit per node in the pool entry (pin_mask), and several
// processes of one host may attach as the same node (an engine's scheduler
// and its workers).  Each PrefixIndex counts its own pins of a slot
// (PrefixIndex::local_pins_); the node's bit may be cleared only when no
// index of the node pins the slot any more, and the pins of a process that
// died (or closed its store) must not keep the bit for ever.
//
// What: each PrefixIndex attached with node pins holds a record (one of
// kRecords: pid, process start time); a table maps slot -> the set of
// records that pin it (one bit per record).  A record's bit for a slot is
// set on its first pin of the slot and cleared on its last unpin, both
// under the slot's stripe lock (the two-tier lock, whose local tier already
// excludes every process of the node), so whoever holds that lock sees the
// whole node's pins of the slot.  Repeat pins by the same index stay in its
// process (the lock-free fast path is untouched).
//
// Concurrency: everything here runs under the section's robust mutex
// (same host: no pool line is involved; the coherence contract concerns
// the pool's lines).  Lock order: stripe locks -> PrefixIndex::pin_mu_ ->
// this mutex; nothing here takes a stripe lock.  Each step leaves the table
// valid for a process that dies mid-way (a bucket's set is written before
// its key; a rebuild writes the spare table and then switches to it); the
// next locker recounts the table's counters.
//
// Death: a record whose process is gone (pid + start time, the rule of
// docs/coherence.md "Liveness") or whose index closed with pins left is
// "gone"; the node's live indexes drop its bits
// (PrefixIndex::reclaim_node_pins, under the stripe locks) and clear the
// node's pool bit of every slot no live record pins any more, then free the
// record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"

namespace cxlkv {

class NodePins {
 public:
  // Sized so that the whole node-local file stays under 1 MiB (a process
  // under a small RLIMIT_FSIZE still attaches): 8-byte buckets (one 32-bit
  // set per slot), two tables of 256 KiB, at most 5/8 of a table in use.
  static constexpr uint32_t kRecords = 32;                 // one bit each in a slot's set
  static constexpr uint32_t kBuckets = 1u << 15;           // per table (two: live + spare)
  static constexpr uint32_t kMaxSlots = kBuckets / 8 * 5;  // distinct slots the node may pin at once

  // Claim a record in the pin section `section` (NodeLocal::pins) for one
  // index.  -EUSERS when all kRecords are held (by live processes, or by
  // gone ones whose pins are not reclaimed yet).  `what` names the section.
  static Result<std::unique_ptr<NodePins>> open(std::byte* section, std::string what);
  // Frees the record if it names no slot, else marks it closed: the node's
  // other indexes drop its pins (reclaim) as for a dead process.
  ~NodePins();
  NodePins(const NodePins&) = delete;
  NodePins& operator=(const NodePins&) = delete;

  uint32_t record() const { return rec_; }
  const std::string& what() const { return what_; }

  // The caller holds the stripe locks of `slots` (each call below).
  // This index's first pin of each slot: ok[i] = 0 when the table has no
  // room for it (kMaxSlots distinct slots pinned by the node).
  void add(std::span<const uint32_t> slots, uint8_t* ok);
  // Its last pin of each slot: node_free[i] = 1 when no record pins the slot
  // any more (the node's pool bit may go).
  void remove(std::span<const uint32_t> slots, uint8_t* node_free);
  // Does a record other than this one pin `slot`?
  bool pinned_by_others(uint32_t slot);

  // Records of processes that are gone or of indexes closed with pins left,
  // with the slots they pin (no stripe lock needed).
  struct Gone {
    uint32_t record = 0;
    uint32_t pid = 0;
    uint64_t token = 0;  // the record's claim (drop / forget of a record claimed anew do nothing)
    std::vector<uint32_t> slots;
  };
  std::vector<Gone> gone();
  // Under the stripe locks of `slots`: drop the gone record's pins of them;
  // node_free as for remove().
  void drop(const Gone& g, std::span<const uint32_t> slots, uint8_t* node_free);
  // Free a gone record once no slot names it (false: some still do).
  bool forget(const Gone& g);

  // Liveness of another node of this host (NodeLiveness): does a live
  // process hold a record in the pin section of node-local file
  // /dev/shm/`shm_name`?  The node table names one process per node (the
  // last to beat), which may be gone while the node's other processes --
  // and their pins -- live on.  Read without the section's mutex (a
  // snapshot of the records); false when the file is missing or not a
  // node-local file of this layout.
  static bool any_live_record(const std::string& shm_name);

  // Inspection (tests): distinct slots in the table; records in use.
  uint32_t slots_pinned();
  uint32_t records_in_use();

 private:
  NodePins() = default;
  std::byte* sec_ = nullptr;
  uint32_t rec_ = 0;
  std::string what_;
};

}  // namespace cxlkv
