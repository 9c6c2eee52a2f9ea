// SPDX-License-Identifier: MIT
// Damaged index lines (docs/integrity.md "Checked metadata"): an entry line whose checksum fails is
// first taken for a torn line (a writer's NT stores landing right now) and
// re-read a few times (kTornRereads); if it still fails, it gets one bounded
// retry after a short pause, and is then remembered as damaged: later reads
// of the same bad image return "damaged" at once.  A damaged line is never
// trusted (probes skip it, nobody reuses it) and never costs 2^20 re-reads.
#include <unistd.h>

#include <cstring>

#include "index/index_internal.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {

bool PrefixIndex::damaged_known(uint32_t slot, const cxlkv_index_entry& seen) const {
  std::lock_guard<std::mutex> g(damaged_mu_);
  auto it = damaged_.find(slot);
  return it != damaged_.end() && it->second == seen.check;
}

// After kTornRereads failed reads of `slot`: one more read after a pause
// long enough for any in-flight line write to land (a 64 B NT store takes
// nanoseconds).  True with *e valid; false: remembered as damaged.
bool PrefixIndex::settle_bad_line(uint32_t slot, cxlkv_index_entry* e) const {
  usleep(100);
  const cxlkv_index_entry* p = slot_ptr(slot);
  d_->invalidate(p, sizeof *e);  // rule 4
  d_->fence();
  d_->load(e, p, sizeof *e);
  static const cxlkv_index_entry zero{};
  if (e->check ? e->check == cxlkv_index_entry_check(e) : std::memcmp(e, &zero, sizeof *e) == 0) return true;
  bool first;
  {
    std::lock_guard<std::mutex> g(damaged_mu_);
    first = damaged_.insert_or_assign(slot, e->check).second;
  }
  if (first) {
    damaged_lines_.fetch_add(1, std::memory_order_relaxed);
    log().error("index: entry line {} (stripe {}) fails its checksum (stored 0x{:08x}, computed 0x{:08x}): "
                "damaged; skipped and never reused", slot, slot / hdr_.stripe_slots, e->check,
                cxlkv_index_entry_check(e));
  }
  return false;
}

}  // namespace cxlkv
