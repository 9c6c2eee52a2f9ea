// SPDX-License-Identifier: MIT
// Helpers shared by the index's source files (not part of its interface).
#pragma once

#include <cstdint>

#include "cxlkv/format/index_format.h"
#include "index/prefix_index.hpp"
#include "util/clock.hpp"

namespace cxlkv {

constexpr uint32_t kHeaderOff = 0;
constexpr uint32_t kConfigOff = 64;
constexpr uint8_t kStateDamaged = 0xff;  // in-memory only: a line whose checksum never validates
constexpr uint32_t kTornRereads = 64;     // quick re-reads of a line that fails its checksum
// What a damaged line reads as: unusable, so probes skip it and nobody reuses it.
inline cxlkv_index_entry damaged_entry() {
  cxlkv_index_entry bad{};
  bad.state = kStateDamaged;
  return bad;
}

inline BlockLocation loc_of(const cxlkv_index_entry& e) { return BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier}; }
inline bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }
inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline bool live_index_state(uint8_t s) {
  return s == CXLKV_ENTRY_WRITING || s == CXLKV_ENTRY_READY || s == CXLKV_ENTRY_EVICTING;
}

// A removed block whose parent's children count is still to be dropped
// (prefix_index.hpp "Children counts"): a TOMBSTONE that still names its
// parent.  It counts as a child of that parent until whoever holds both
// stripe locks settles it (drops the count, clears the name), and no
// reserve reuses its slot before that.  A plain tombstone names no parent.
inline bool pending_drop(const cxlkv_index_entry& e, uint32_t nslots) {
  return e.state == CXLKV_ENTRY_TOMBSTONE && e.parent_slot < nslots;
}

// ext.linked bits a block keeps when it is (re)linked or unlinked.
constexpr uint8_t kExtKeep = CXLKV_EXT_REUSED | CXLKV_EXT_HANDOFF | CXLKV_EXT_LEASED;

// Stripe list ends are stored as slot + 1 so that a zeroed line is an empty
// list.  Each stripe has two lists (uapi cxlkv_index_stripe): cold (hot =
// false) and hot.
inline uint32_t list_head(const cxlkv_index_stripe& st, bool hot) {
  const uint32_t v = hot ? st.hot_head : st.lru_head;
  return v ? v - 1 : CXLKV_INDEX_NO_SLOT;
}
inline uint32_t list_tail(const cxlkv_index_stripe& st, bool hot) {
  const uint32_t v = hot ? st.hot_tail : st.lru_tail;
  return v ? v - 1 : CXLKV_INDEX_NO_SLOT;
}
inline uint32_t list_tail_ms(const cxlkv_index_stripe& st, bool hot) { return hot ? st.hot_tail_ms : st.tail_ms; }
inline void set_list_head(cxlkv_index_stripe& st, bool hot, uint32_t slot) {
  (hot ? st.hot_head : st.lru_head) = slot == CXLKV_INDEX_NO_SLOT ? 0 : slot + 1;
}
inline void set_list_tail(cxlkv_index_stripe& st, bool hot, uint32_t slot) {
  (hot ? st.hot_tail : st.lru_tail) = slot == CXLKV_INDEX_NO_SLOT ? 0 : slot + 1;
}
inline void set_list_tail_ms(cxlkv_index_stripe& st, bool hot, uint32_t ms) { (hot ? st.hot_tail_ms : st.tail_ms) = ms; }

}  // namespace cxlkv
