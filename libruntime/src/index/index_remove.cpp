// SPDX-License-Identifier: MIT
// PrefixIndex::remove: an operator drops one cached block by key (cxlkvctl kv
// rm).  The same removal as an eviction of that block (EVICTING, then
// TOMBSTONE / EMPTY, payload freed, parent's child count dropped), refused
// where an eviction would be: a block with cached children (the cache stays
// prefix-closed), one that a live node pins, or one under a live lease.
#include <cerrno>
#include <string>
#include <vector>

#include "index/stripe_lock_set.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

Result<void> PrefixIndex::remove(const BlockKey& key) {
  if (key.is_zero()) return Error(-EINVAL, "index: the all-zero block key is reserved");
  const uint32_t s = stripe_of(key);
  std::vector<uint32_t> parents;
  {
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire({s}));  // rule 7: entries of stripe s change only under its lock
    uint32_t slot = CXLKV_INDEX_NO_SLOT;
    if (find_state(key, &slot) != CXLKV_ENTRY_READY)
      return Error(-ENOENT, "index: block " + to_hex(key) + " is not cached");
    cxlkv_index_entry e = read_entry(slot);
    if (e.children != 0)
      return Error(-ENOTEMPTY, "index: block " + to_hex(key) + " has " + std::to_string(e.children) +
                                   " cached child block(s); remove them first (the cache is prefix-closed)");
    bool changed = false;
    if (pins_live(e, &changed))
      return Error(-EBUSY, "index: block " + to_hex(key) + " is pinned by a live node");
    cxlkv_index_ext x = read_ext(slot);
    bool consumer_dead = false;
    if (lease_live(x, now_ms(), &consumer_dead))
      return Error(-EBUSY, "index: block " + to_hex(key) + " is leased to consumer " +
                               std::to_string(x.lease_consumer) + " (a handoff not yet consumed)");
    remove_locked(ls, slot, e, /*reclaim=*/false, &parents);
  }
  CXLKV_TRY(drop_children(parents));
  return {};
}

}  // namespace cxlkv
