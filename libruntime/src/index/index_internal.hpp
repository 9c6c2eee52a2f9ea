// SPDX-License-Identifier: MIT
// Helpers shared by the index's source files (not part of its interface).
#pragma once

#include <time.h>

#include <cstdint>

#include "uapi/cxlkv_index.h"

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

inline uint64_t realtime_ms() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}
inline bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }
inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline bool live_index_state(uint8_t s) {
  return s == CXLKV_ENTRY_WRITING || s == CXLKV_ENTRY_READY || s == CXLKV_ENTRY_EVICTING;
}

// Stripe list ends are stored as slot + 1 so that a zeroed line is an empty list.
inline uint32_t lru_head(const cxlkv_index_stripe& st) { return st.lru_head ? st.lru_head - 1 : CXLKV_INDEX_NO_SLOT; }
inline uint32_t lru_tail(const cxlkv_index_stripe& st) { return st.lru_tail ? st.lru_tail - 1 : CXLKV_INDEX_NO_SLOT; }
inline void set_lru_head(cxlkv_index_stripe& st, uint32_t slot) {
  st.lru_head = slot == CXLKV_INDEX_NO_SLOT ? 0 : slot + 1;
}
inline void set_lru_tail(cxlkv_index_stripe& st, uint32_t slot) {
  st.lru_tail = slot == CXLKV_INDEX_NO_SLOT ? 0 : slot + 1;
}

}  // namespace cxlkv
