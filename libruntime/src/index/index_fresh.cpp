// SPDX-License-Identifier: MIT
// PrefixIndex::entries_fresh: many entry lines read fresh at once (rule 4),
// for the KV store's handle checks (docs/integrity.md "Fencing: handles carry the entry version") of a batch call.
#include <algorithm>
#include <cstring>

#include "index/index_internal.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

void PrefixIndex::entries_fresh(std::span<const uint32_t> slots, std::span<IndexEntryView> out) const {
  const size_t n = std::min(slots.size(), out.size());
  // rule 4: every line is invalidated, then one fence orders all of the
  // invalidations before the loads below (the same rule as read_entry,
  // one fence for the batch instead of one per line).
  bool any = false;
  for (size_t i = 0; i < n; i++)
    if (slots[i] < hdr_.nslots) {
      d_->invalidate_clean(slot_ptr(slots[i]), sizeof(cxlkv_index_entry));  // rule 4 (+ rule 1: NT-only lines)
      any = true;
    }
  if (any) d_->fence();
  // One count for the sweep: an atomic add per line is a locked instruction
  // between the loads, which also waits for this thread's pending NT stores.
  probes_.fetch_add(n, std::memory_order_relaxed);
  for (size_t i = 0; i < n; i++) {
    IndexEntryView& v = out[i];
    v = IndexEntryView{};
    if (slots[i] >= hdr_.nslots) continue;
    cxlkv_index_entry e;
    d_->load(&e, slot_ptr(slots[i]), sizeof e);
    static const cxlkv_index_entry zero{};
    const bool valid = e.check ? e.check == cxlkv_index_entry_check(&e) : std::memcmp(&e, &zero, sizeof e) == 0;
    if (!valid) e = read_entry(slots[i]);  // torn by a writer's NT stores landing now: read it again alone
    v.key = BlockKey{e.key_lo, e.key_hi};
    v.state = e.state;
    v.loc = BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
    v.parent_slot = e.parent_slot;
    v.children = e.children;
    v.pin_mask = e.pin_mask;
    v.owner_node = e.owner_node;
    v.owner_inc = e.owner_inc;
    v.lru_ms = e.lru_ms;
    v.version = e.version;
  }
}

}  // namespace cxlkv
