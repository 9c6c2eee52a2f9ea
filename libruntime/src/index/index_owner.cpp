// SPDX-License-Identifier: MIT
// An index entry whose location overlaps another entry's block is
// refused at pin, without a scan.  The payload space records, per block,
// the index slot that holds it (cxlkv/format/alloc_format.h "Block owners": written
// with the reservation, cleared when the block is freed); a pin of a memory
// block checks that the record at its start names this slot and length.
// Two live entries whose extents overlap cannot both pass: allocator blocks
// do not overlap, a block's record names one slot, and a location that is
// not the start of a block has no record naming it -- except inside the
// block's own 1 KiB granule, which one record covers: so the start must
// also be exact, where the allocator starts blocks of that length
// (docs/integrity.md "Block owners: overlapping entries"; the space's owner_check does the arithmetic, no
// read), and a location moved by 1..1023 bytes is refused with -EBADMSG.
// So the check costs one fresh read of one record line per pin (rule 4).
#include <cerrno>
#include <string>

#include "index/index_internal.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
std::string extent(uint64_t off, uint64_t len) {
  return "bytes [" + std::to_string(off) + ", " + std::to_string(off + len) + ")";
}
}  // namespace

Result<void> PrefixIndex::owner_ok(uint32_t slot, const cxlkv_index_entry& e) {
  if (e.loc_tier != CXLKV_TIER_MEM) return {};  // SSD blocks: the tier's headers check them (docs/integrity.md "The SSD tier")
  const BlockLocation loc{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  const PayloadSpace::Owner o = space_->owner_check(loc, slot);
  if (o.ok) return {};
  std::string msg = "index: block " + to_hex(BlockKey{e.key_lo, e.key_hi}) + " (slot " + std::to_string(slot) +
                    ", " + extent(e.loc_off, e.loc_len) + ") is not the block the allocator records for it: " + o.why;
  if (o.slot < hdr_.nslots && o.slot != slot) {
    // Name the recorded holder and its extent (a cold path: one more fresh read).
    const cxlkv_index_entry h = read_entry(o.slot);
    if (live_index_state(h.state))
      msg += "; it overlaps block " + to_hex(BlockKey{h.key_lo, h.key_hi}) + " (slot " + std::to_string(o.slot) +
             ", " + extent(h.loc_off, h.loc_len) + ")";
    else
      msg += "; the recorded holder, slot " + std::to_string(o.slot) + ", holds no block now";
  }
  msg += ": damaged or forged entry, refused (never served)";
  ctr_.overlap_refusals++;
  log().error("{}", msg);
  return Error(o.code, msg);
}

}  // namespace cxlkv
