// SPDX-License-Identifier: MIT
// Eviction: pool-wide capacity, per-stripe hot and cold lists of evictable
// leaves in the pool, the pool-wide victim (oldest list tail, hot tails with
// an age bonus), removal, SSD demotion, and the fallback window scan.
//
// Policy (what goes first and why):
//  * Only READY memory leaves are candidates (prefix closure: a block with
//    cached children stays, so every cached block's whole prefix is cached
//    and can hit; plain block-LRU keeps children whose parent is gone, which
//    can never hit again).
//  * Leaves are on one of two lists per stripe, each in recency order: cold
//    (seen by one request) and hot (reused: read by a later request, which
//    leases it for a second consumer or pins it, found used at a list tail;
//    cached again while its ghost lived; or the parent of a reused block,
//    since every read of a block reads its whole prefix).  Most blocks of a
//    serving trace are seen once; a reused block is likely to be read again.
//  * The victim is the oldest cold tail pool-wide (all stripe lines read in
//    one sweep); a hot tail goes first only once its age exceeds
//    kHotAgeFactor + 1 times that of the oldest cold tail (its key is its
//    link time plus kHotAgeFactor x that age): a reused block outlives blocks
//    seen once by several of their lifetimes, yet one unused for long goes
//    (the bound adapts to capacity and load, no fixed time).
//  * A pin stamps the entry's lru_ms only; the evictor moves a tail whose
//    lru_ms is newer than its linked_ms to the head (second chance), and to
//    the hot list unless the read was its producer's handoff (HANDOFF).
//  * A parent whose last child goes joins its list at the head when it was
//    read more recently than that list's tail, else at the tail: a cold
//    subtree is removed from its leaves up before warmer blocks go.
//  * Scan resistance: an evicted block leaves a ghost (its tombstone keeps
//    the key while the stripe has fewer than stripe_slots / 8 tombstones);
//    a block reserved again whose ghost is found is REUSED (hot list).
//  * Pinned blocks, leased blocks (live lease) and WRITING blocks are never
//    evicted; a reserve evicts instead of refusing while any other block can go.
#include <algorithm>
#include <string>

#include "index/index_internal.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

constexpr uint32_t kEvictWindow = 128;      // fallback scan window (slots)
constexpr uint32_t kTailSteps = 16;         // list tails examined per eviction in one stripe
constexpr uint32_t kCandidateStripes = 4;   // oldest tails tried per pool-wide victim
constexpr uint64_t kNoLimit = UINT64_MAX;
constexpr uint32_t kNo = CXLKV_INDEX_NO_SLOT;
// A slot in remove_locked()'s `parents` (the removed blocks whose parent's
// count is still to drop) with this bit: that block was reused, so its
// parent was too (only in an index of at most 2^31 slots).
constexpr uint32_t kReusedChild = 0x80000000u;
// A hot tail goes before a cold one only once it is this many times older
// than the oldest cold tail (plus one): reused blocks outlive blocks seen once
// by several lifetimes of the latter, yet a hot block unused for long goes.
constexpr uint32_t kHotAgeFactor = 8;

}  // namespace

// ---- the lists ---------------------------------------------------------------

void PrefixIndex::link(StripeLockSet& ls, uint32_t slot, uint32_t ms, bool at_head) {
  const uint32_t s = slot / hdr_.stripe_slots;
  ls.mark(s);
  cxlkv_index_stripe& st = ls.st(s);
  cxlkv_index_ext x = read_ext(slot);
  if (x.linked & CXLKV_EXT_LINKED) {
    unlink(ls, slot);  // a move (perhaps to the other list)
    x = read_ext(slot);
  }
  const bool hot = x.linked & CXLKV_EXT_REUSED;  // reused blocks go on the hot list
  x.linked = static_cast<uint8_t>((x.linked & kExtKeep) | CXLKV_EXT_LINKED |
                                  (hot ? CXLKV_EXT_HOT : 0));
  x.linked_ms = ms;
  if (list_head(st, hot) == kNo || list_tail(st, hot) == kNo) {
    x.lru_prev = x.lru_next = kNo;
    set_list_head(st, hot, slot);
    set_list_tail(st, hot, slot);
    set_list_tail_ms(st, hot, ms);
  } else if (at_head) {
    const uint32_t head = list_head(st, hot);
    cxlkv_index_ext h = read_ext(head);
    h.lru_prev = slot;
    write_ext(head, h);
    x.lru_prev = kNo;
    x.lru_next = head;
    set_list_head(st, hot, slot);
  } else {
    const uint32_t tail = list_tail(st, hot);
    cxlkv_index_ext t = read_ext(tail);
    t.lru_next = slot;
    write_ext(tail, t);
    x.lru_next = kNo;
    x.lru_prev = tail;
    set_list_tail(st, hot, slot);
    set_list_tail_ms(st, hot, ms);
  }
  write_ext(slot, x);
}

void PrefixIndex::unlink(StripeLockSet& ls, uint32_t slot) {
  const uint32_t s = slot / hdr_.stripe_slots, base = s * hdr_.stripe_slots;
  cxlkv_index_ext x = read_ext(slot);
  if (!(x.linked & CXLKV_EXT_LINKED)) return;
  auto in_stripe = [&](uint32_t sl) { return sl == kNo || (sl >= base && sl < base + hdr_.stripe_slots); };
  if (!in_stripe(x.lru_prev) || !in_stripe(x.lru_next)) {  // damaged links: rebuild
    repair_stripe(ls, s);
    x = read_ext(slot);
    if (!(x.linked & CXLKV_EXT_LINKED)) return;
  }
  const bool hot = x.linked & CXLKV_EXT_HOT;  // the list it is on
  ls.mark(s);
  cxlkv_index_stripe& st = ls.st(s);
  if (x.lru_prev != kNo) {
    cxlkv_index_ext p = read_ext(x.lru_prev);
    p.lru_next = x.lru_next;
    write_ext(x.lru_prev, p);
  } else {
    set_list_head(st, hot, x.lru_next);
  }
  if (x.lru_next != kNo) {
    cxlkv_index_ext n = read_ext(x.lru_next);
    n.lru_prev = x.lru_prev;
    write_ext(x.lru_next, n);
  } else {
    set_list_tail(st, hot, x.lru_prev);
    set_list_tail_ms(st, hot, x.lru_prev != kNo ? read_ext(x.lru_prev).linked_ms : 0);
  }
  x.linked &= static_cast<uint8_t>(~(CXLKV_EXT_LINKED | CXLKV_EXT_HOT));  // REUSED stays with the block
  x.lru_prev = x.lru_next = kNo;
  write_ext(slot, x);
}

void PrefixIndex::mark_reused(uint32_t slot) {
  cxlkv_index_ext x = read_ext(slot);
  if (x.linked & CXLKV_EXT_REUSED) return;
  x.linked |= CXLKV_EXT_REUSED;  // takes effect when it is next linked
  write_ext(slot, x);
}

void PrefixIndex::child_added(StripeLockSet& ls, uint32_t parent_slot) {
  cxlkv_index_entry e = read_entry(parent_slot);
  e.children++;
  write_entry(parent_slot, e, false);
  if (e.children == 1) unlink(ls, parent_slot);  // no longer a leaf: not evictable
}

void PrefixIndex::child_dropped(StripeLockSet& ls, uint32_t parent_slot, bool reused_child) {
  cxlkv_index_entry e = read_entry(parent_slot);
  if (!live_index_state(e.state) || e.children == 0) return;
  e.children--;
  write_entry(parent_slot, e, false);
  // Every read of a block is a read of its whole prefix: the parent of a
  // reused block was reused too.
  if (reused_child) mark_reused(parent_slot);
  if (e.children == 0 && e.state == CXLKV_ENTRY_READY && e.loc_tier == CXLKV_TIER_MEM) link_leaf(ls, parent_slot, e);
}

void PrefixIndex::link_leaf(StripeLockSet& ls, uint32_t slot, const cxlkv_index_entry& e) {
  // A leaf again, on its list by its last read: at the head when read more
  // recently than that list's tail, else at the tail (usually as cold as the
  // child that just went).
  const bool hot = read_ext(slot).linked & CXLKV_EXT_REUSED;
  const cxlkv_index_stripe& st = ls.st(slot / hdr_.stripe_slots);
  link(ls, slot, e.lru_ms,
       /*at_head=*/list_tail(st, hot) != kNo && static_cast<int32_t>(e.lru_ms - list_tail_ms(st, hot)) > 0);
}

void PrefixIndex::repair_stripe(StripeLockSet& ls, uint32_t s) {
  // A holder died mid-change (list_dirty) or links are damaged: rebuild the
  // lists and the counters from the entries, which are self-consistent lines.
  StripeLockSet::Held& h = ls.at(s);
  h.marked = true;  // release() writes the line back clean
  cxlkv_index_stripe& st = h.st;
  const uint32_t base = s * hdr_.stripe_slots;
  std::vector<std::pair<uint32_t, uint32_t>> leaves[2];  // (lru_ms, slot): cold, hot
  uint64_t blocks = 0, bytes = 0, tombs = 0;
  for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
    const uint32_t slot = base + i;
    cxlkv_index_entry e = read_entry(slot);
    if (live_index_state(e.state) && e.loc_tier == CXLKV_TIER_MEM) {
      blocks++;
      bytes += e.loc_len;
    }
    if (e.state == CXLKV_ENTRY_TOMBSTONE) tombs++;
    if (e.state == CXLKV_ENTRY_READY && e.children == 0 && e.loc_tier == CXLKV_TIER_MEM) {
      leaves[(read_ext(slot).linked & CXLKV_EXT_REUSED) ? 1 : 0].emplace_back(e.lru_ms, slot);
    } else {
      cxlkv_index_ext x = read_ext(slot);
      if (x.linked & CXLKV_EXT_LINKED) {
        x.linked &= static_cast<uint8_t>(~(CXLKV_EXT_LINKED | CXLKV_EXT_HOT));
        x.lru_prev = x.lru_next = kNo;
        write_ext(slot, x);
      }
    }
  }
  for (const bool hot : {false, true}) {
    auto& lv = leaves[hot];
    std::sort(lv.begin(), lv.end());  // oldest first = tail
    for (size_t i = 0; i < lv.size(); i++) {
      cxlkv_index_ext x = read_ext(lv[i].second);
      x.linked = static_cast<uint8_t>((x.linked & kExtKeep) | CXLKV_EXT_LINKED |
                                      (hot ? CXLKV_EXT_HOT : 0));
      x.linked_ms = lv[i].first;
      x.lru_next = i ? lv[i - 1].second : kNo;                // older
      x.lru_prev = i + 1 < lv.size() ? lv[i + 1].second : kNo;  // newer
      write_ext(lv[i].second, x);
    }
    set_list_tail(st, hot, lv.empty() ? kNo : lv.front().second);
    set_list_head(st, hot, lv.empty() ? kNo : lv.back().second);
    set_list_tail_ms(st, hot, lv.empty() ? 0 : lv.front().first);
  }
  st.used_blocks = blocks;
  st.used_bytes = bytes;
  st.tombstones = static_cast<uint32_t>(tombs);
  log().info("index: stripe {} rebuilt after an interrupted change ({} cold and {} hot leaves listed)", s,
             leaves[0].size(), leaves[1].size());
}

// ---- removal -------------------------------------------------------------------

void PrefixIndex::remove_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, bool reclaim,
                                std::vector<uint32_t>* parents) {
  const uint32_t stripe = slot / hdr_.stripe_slots;
  const BlockLocation loc{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  const bool was_writing = e.state == CXLKV_ENTRY_WRITING;
  const bool reused = read_ext(slot).linked & CXLKV_EXT_REUSED;  // passed on to the parent
  ls.mark(stripe);
  unlink(ls, slot);
  // EVICTING first: lock-free readers stop treating it as READY, and if we
  // die here the next holder of this stripe lock finds EVICTING (nobody else
  // can be mid-eviction while it holds the lock) and finishes the removal.
  if (e.state != CXLKV_ENTRY_EVICTING) {
    e.state = CXLKV_ENTRY_EVICTING;
    e.version = write_entry(slot, e);
  }
  const uint32_t parent = e.parent_slot;
  // The parent's count drops now when its stripe is held; else the removal
  // leaves a pending drop (a tombstone that still names the parent), which
  // drop_children() -- or whoever holds both stripes first, the online
  // repair included -- settles.  So a process killed between the two
  // stripes leaves a count that an entry accounts for (prefix_index.hpp
  // "Children counts"), never one that only its memory did.
  const bool defer = parent < hdr_.nslots && !ls.holds(parent / hdr_.stripe_slots);
  cxlkv_index_stripe& st = ls.st(stripe);
  const uint32_t base = stripe * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  // An evicted block leaves a ghost: its tombstone keeps the key, so a
  // reserve of the same key finds it and marks the new block REUSED.  Ghosts
  // are kept while the stripe holds fewer than stripe_slots / 8 tombstones
  // (probe lengths stay short); beyond that, or for a reclaim / abort, the
  // slot is emptied when it can be.
  const bool ghost = !reclaim && st.tombstones < hdr_.stripe_slots / 8;
  if (!ghost && !defer && read_entry(base + ((slot - base + 1) & mask)).state == CXLKV_ENTRY_EMPTY) {
    write_empty(slot);
    trim_tombstones(ls, base + ((slot - base + mask) & mask));
  } else {
    e.state = CXLKV_ENTRY_TOMBSTONE;
    e.pin_mask = 0;
    e.children = 0;
    e.parent_slot = defer ? parent : CXLKV_INDEX_NO_SLOT;
    write_entry(slot, e);
    st.tombstones++;
  }
  if (loc.tier == CXLKV_TIER_MEM) {  // the capacity counts memory-tier blocks only
    st.used_blocks -= std::min<uint64_t>(st.used_blocks, 1);
    st.used_bytes -= std::min<uint64_t>(st.used_bytes, loc.length);
  }
  if (reclaim) {
    st.reclaims++;
    ctr_.reclaims++;
  } else {
    st.evictions++;
    ctr_.evictions++;
  }
  // The payload is handed back only once no entry points to it.
  if (loc.tier == CXLKV_TIER_SSD) {
    if (demotion_) demotion_->release(loc);  // an SSD block leaves the SSD tier
  } else if (!space_->owner_check(loc, slot).ok) {
    // A damaged or forged entry names another block's space:
    // freeing it would hand that block out again.  Leak it instead.
    log().error("index: slot {} named bytes [{}, +{}) that the allocator records for another block: "
                "not freed", slot, loc.offset, loc.length);
  } else if (reclaim && was_writing && (e.owner_node != node_ || e.owner_inc != inc_lo_)) {
    // Taken from a writer declared dead, which may only be paused.
    space_->free_taken(loc, e.owner_node, e.owner_inc);
  } else {
    space_->free(loc);
  }
  if (defer) parents->push_back(slot | (reused && hdr_.nslots <= kReusedChild ? kReusedChild : 0));
  else if (parent < hdr_.nslots) child_dropped(ls, parent, reused);
}

void PrefixIndex::trim_tombstones(StripeLockSet& ls, uint32_t slot) {
  // A tombstone followed by EMPTY ends no probe that could reach further:
  // make it EMPTY, and so on backwards, so probe lengths do not grow.  A
  // pending drop stays (it still counts as its parent's child).
  const uint32_t stripe = slot / hdr_.stripe_slots, base = stripe * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  cxlkv_index_stripe& st = ls.st(stripe);
  uint32_t p = slot;
  for (uint32_t k = 0; k < hdr_.stripe_slots - 1; k++, p = base + ((p - base + mask) & mask)) {
    const cxlkv_index_entry e = read_entry(p);
    if (e.state != CXLKV_ENTRY_TOMBSTONE || pending_drop(e, hdr_.nslots)) break;
    write_empty(p);
    if (st.tombstones) st.tombstones--;
  }
}

bool PrefixIndex::settle_drop(StripeLockSet& ls, uint32_t child, bool reused) {
  if (child >= hdr_.nslots || !ls.holds(child / hdr_.stripe_slots)) return false;
  cxlkv_index_entry e = read_entry(child);
  if (!pending_drop(e, hdr_.nslots) || !ls.holds(e.parent_slot / hdr_.stripe_slots)) return false;
  const uint32_t parent = e.parent_slot, s = child / hdr_.stripe_slots;
  // rule 7: both lines change under their stripes' locks, in one hold, so
  // the count and the tombstone that accounts for it never disagree for
  // another holder; a second settler finds a plain tombstone and stops.
  ls.mark(s);
  child_dropped(ls, parent, reused);
  e.parent_slot = CXLKV_INDEX_NO_SLOT;
  write_entry(child, e, false);  // rule 1/3: whole line NT; fenced at release (stripe_lock_set.hpp)
  // A plain tombstone now: a ghost while the stripe has room for one.
  const uint32_t base = s * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  if (ls.st(s).tombstones > hdr_.stripe_slots / 8 &&
      read_entry(base + ((child - base + 1) & mask)).state == CXLKV_ENTRY_EMPTY)
    trim_tombstones(ls, child);
  return true;
}

Result<void> PrefixIndex::drop_children(std::vector<uint32_t>& removed, PoolView* view) {
  if (removed.empty()) return {};
  // `removed`: slots whose removal left a pending drop.  Each names its
  // parent (read without the lock: only a settle changes it, and a settle
  // needs both locks; what is read is checked again under them).
  const uint32_t flag = hdr_.nslots <= kReusedChild ? kReusedChild : 0;
  std::vector<uint32_t> stripes;
  for (uint32_t c : removed) {
    const uint32_t child = c & ~flag;
    if (child >= hdr_.nslots) continue;
    const cxlkv_index_entry e = read_entry_fresh(child);  // rule 4
    if (!pending_drop(e, hdr_.nslots)) continue;  // settled already (the online repair)
    stripes.push_back(child / hdr_.stripe_slots);
    stripes.push_back(e.parent_slot / hdr_.stripe_slots);
  }
  if (stripes.empty()) {
    removed.clear();
    return {};
  }
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes));
  for (uint32_t c : removed) (void)settle_drop(ls, c & ~flag, c & flag);
  removed.clear();
  if (view) view->take(ls);
  return {};
}

void PrefixIndex::PoolView::take(const StripeLockSet& ls) {
  for (const auto& h : ls.held())
    if (h.stripe < st.size()) st[h.stripe] = h.st;
}

// ---- victims -------------------------------------------------------------------

bool PrefixIndex::lease_live(cxlkv_index_ext& x, uint32_t now, bool* ended_dead) {
  if (x.lease_count == 0) return false;
  if (static_cast<int32_t>(now - x.lease_expiry_ms) >= 0) return false;  // expired
  if (x.lease_node != CXLKV_LEASE_NODE_ANY && x.lease_node != node_ && !live_->node_alive(x.lease_node)) {
    *ended_dead = true;  // the consumer's node is dead
    return false;
  }
  return true;
}

bool PrefixIndex::evict_from_list(StripeLockSet& ls, uint32_t s, bool hot, std::vector<uint32_t>* parents,
                                  uint64_t limit, uint64_t bonus) {
  cxlkv_index_stripe& st = ls.st(s);
  const uint32_t now = now_ms(), base = s * hdr_.stripe_slots;
  bool repaired = false;
  for (uint32_t step = 0; step < kTailSteps && list_tail(st, hot) != kNo; step++) {
    const uint32_t slot = list_tail(st, hot);
    if (slot < base || slot >= base + hdr_.stripe_slots) {
      if (repaired) return false;
      repair_stripe(ls, s);
      repaired = true;
      continue;
    }
    cxlkv_index_entry e = read_entry(slot);
    cxlkv_index_ext x = read_ext(slot);
    ctr_.victim_reads += 2;
    if (!(x.linked & CXLKV_EXT_LINKED) || bool(x.linked & CXLKV_EXT_HOT) != hot || e.state != CXLKV_ENTRY_READY ||
        e.children || e.loc_tier != CXLKV_TIER_MEM) {
      if (repaired) return false;
      repair_stripe(ls, s);  // the list disagrees with the entries
      repaired = true;
      continue;
    }
    if (static_cast<int32_t>(e.lru_ms - x.linked_ms) > 0) {
      // Used since linked: second chance at its list's head.  A read by
      // another request than its producer's handoff is a reuse: the block
      // moves to the hot list.
      if (!(x.linked & CXLKV_EXT_HANDOFF) && !(x.linked & CXLKV_EXT_REUSED)) {
        x.linked |= CXLKV_EXT_REUSED;
        write_ext(slot, x);
      }
      link(ls, slot, e.lru_ms, /*at_head=*/true);
      ctr_.second_chances++;
      continue;
    }
    if (!hot && (x.linked & CXLKV_EXT_REUSED)) {  // marked while listed: to the hot list
      link(ls, slot, x.linked_ms, /*at_head=*/true);
      continue;
    }
    if (uint64_t(x.linked_ms) + (hot ? bonus : 0) > limit) return false;  // another tail goes first
    bool changed = false, dead = false;
    const bool pinned = pins_live(e, &changed);
    if (changed) write_entry(slot, e, false);  // dead nodes' pins cleared
    if (pinned || lease_live(x, now, &dead)) {
      link(ls, slot, now, /*at_head=*/true);  // in use: not a victim now
      continue;
    }
    if (x.lease_count) {  // its lease ended by ttl or by the consumer node's death
      ls.mark(s);
      st.lease_expiries++;
      if (dead) st.lease_dead++;
      ctr_.lease_expiries++;
    }
    if (demotion_ && demote_locked(ls, slot, e, parents)) return true;  // kept on the SSD tier
    remove_locked(ls, slot, e, /*reclaim=*/false, parents);
    return true;
  }
  return false;
}

Result<bool> PrefixIndex::evict_locked(StripeLockSet& ls, uint32_t stripe, std::vector<uint32_t>* parents) {
  // This stripe's cold tail, else its hot tail (no pool-wide view here).
  if (evict_from_list(ls, stripe, false, parents, kNoLimit, 0)) return true;
  if (evict_from_list(ls, stripe, true, parents, kNoLimit, 0)) return true;
  // With an SSD tier, a memory block is chosen first (and demoted);
  // an SSD block is dropped only when no memory block can go.
  if (demotion_) {
    auto r = evict_pass(ls, stripe, parents, EvictFrom::mem);
    if (!r || r.value()) return r;
  }
  return evict_pass(ls, stripe, parents, EvictFrom::any);
}

// Move an unpinned READY block's payload to the SSD tier; the entry
// stays READY (only its location changes), so lock-free readers and the
// prefix closure never see a gap.  false: not demoted, evict it instead.
bool PrefixIndex::demote_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, std::vector<uint32_t>* parents) {
  const uint32_t stripe = slot / hdr_.stripe_slots;
  const BlockLocation mem{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  auto to = demotion_->demote(BlockKey{e.key_lo, e.key_hi}, mem);  // the SSD block records its key
  if (!to && to.error().code() == -ENOSPC) {
    // SSD tier full: drop this stripe's least recently used SSD leaf, retry once.
    auto r = evict_pass(ls, stripe, parents, EvictFrom::ssd);
    if (r && r.value()) to = demotion_->demote(BlockKey{e.key_lo, e.key_hi}, mem);
  }
  if (!to) return false;
  ls.mark(stripe);
  unlink(ls, slot);  // leaves the memory tier
  e = read_entry(slot);
  e.loc_off = to->offset;
  e.loc_len = to->length;
  e.loc_dev = to->device;
  e.loc_tier = to->tier;
  write_entry(slot, e);  // rule 3: the SSD copy is complete (DMA done) before the entry names it
  // rule 3: the moved entry is in memory before its old space can be handed
  // out again: an optimistic reader of the memory copy (docs/coherence.md
  // "Optimistic reads") then sees the move in its check after the copy.
  d_->fence();
  space_->free(mem);
  cxlkv_index_stripe& st = ls.st(stripe);
  st.used_blocks -= std::min<uint64_t>(st.used_blocks, 1);  // capacity counts memory-tier blocks
  st.used_bytes -= std::min<uint64_t>(st.used_bytes, mem.length);
  ctr_.demotions++;
  return true;
}

void PrefixIndex::read_window(uint32_t first, uint32_t n, cxlkv_index_entry* out) const {
  // rule 4 for a window: invalidate all its lines, one fence, load them all.
  // Safe under the stripe lock: only lock holders write entries, so nothing
  // changes between the sweep and the loads but lock-free readers' nothing.
  d_->invalidate(slot_ptr(first), uint64_t(n) * 64);
  d_->fence();
  d_->load(out, slot_ptr(first), uint64_t(n) * 64);
  probes_.fetch_add(n, std::memory_order_relaxed);
  static const cxlkv_index_entry zero{};
  for (uint32_t i = 0; i < n; i++) {
    const cxlkv_index_entry& e = out[i];
    bool ok = e.check ? e.check == cxlkv_index_entry_check(&e) : std::memcmp(&e, &zero, sizeof e) == 0;
    if (!ok) out[i] = read_entry(first + i);  // damaged line: the careful path
  }
}

Result<bool> PrefixIndex::evict_pass(StripeLockSet& ls, uint32_t stripe, std::vector<uint32_t>* parents,
                                     EvictFrom from) {
  // Fallback (what the lists do not hold): windows of kEvictWindow slots from
  // a rotating hand, each read in one sweep; finishes EVICTING leftovers,
  // reclaims dead writers' leaves, demotes non-leaves (docs/eviction.md "The SSD tier"), drops SSD
  // leaves, else evicts the least recently used unpinned, unleased READY leaf.
  const uint32_t base = stripe * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  const uint32_t now = now_ms();
  uint32_t& hand = stripe_hands_[stripe];
  uint32_t scanned = 0;
  std::vector<cxlkv_index_entry> win(std::min(kEvictWindow, hdr_.stripe_slots));
  while (scanned < hdr_.stripe_slots) {
    uint32_t victim = kNo, best_age = 0;
    hand &= mask;
    const uint32_t window = std::min({kEvictWindow, hdr_.stripe_slots - scanned, hdr_.stripe_slots - hand});
    read_window(base + hand, window, win.data());
    ctr_.victim_reads += window;
    for (uint32_t i = 0; i < window; i++) {
      const uint32_t slot = base + hand + i;
      cxlkv_index_entry& e = win[i];
      if (e.state == CXLKV_ENTRY_EVICTING) {
        // Only a holder of this lock evicts: an EVICTING entry is the
        // leftover of an evictor that died; finish its removal.
        remove_locked(ls, slot, e, /*reclaim=*/true, parents);
        return true;
      }
      // prefix closure: only leaves go (docs/eviction.md "The SSD tier"; any block may be demoted,
      // it stays cached; a non-leaf that cannot be demoted stays put below)
      if (e.children != 0 && from != EvictFrom::mem) continue;
      if (e.state == CXLKV_ENTRY_WRITING && e.children == 0 && writer_dead(e)) {
        remove_locked(ls, slot, e, /*reclaim=*/true, parents);  // dead writer: reclaim first
        return true;
      }
      if (e.state != CXLKV_ENTRY_READY) continue;
      if ((from == EvictFrom::mem && e.loc_tier != CXLKV_TIER_MEM) ||
          (from == EvictFrom::ssd && e.loc_tier != CXLKV_TIER_SSD))
        continue;  // this pass looks at one tier only
      bool changed = false, dead = false;
      if (pins_live(e, &changed)) continue;
      if (changed) write_entry(slot, e, false);  // dead nodes' pins cleared
      cxlkv_index_ext x = read_ext(slot);
      if (lease_live(x, now, &dead)) continue;
      uint32_t age = now - e.lru_ms;
      if (victim == kNo || age > best_age) {
        victim = slot;
        best_age = age;
      }
    }
    hand = (hand + window) & mask;
    scanned += window;
    if (victim != kNo) {
      cxlkv_index_entry ve = read_entry(victim);
      ctr_.scan_evictions++;
      if (demotion_ && from != EvictFrom::ssd && ve.loc_tier == CXLKV_TIER_MEM &&
          demote_locked(ls, victim, ve, parents))
        return true;  // kept on the SSD tier instead of dropped
      if (ve.children != 0) return false;  // a block with cached children is never dropped
      remove_locked(ls, victim, ve, /*reclaim=*/false, parents);
      return true;
    }
  }
  return false;
}

Result<bool> PrefixIndex::evict_global(std::vector<uint32_t>* parents, StripeLockSet* held, PoolView* view) {
  // Candidates: every stripe's cold tail, keyed by its link time, and its
  // hot tail, keyed by its link time plus a bonus of kHotAgeFactor times the
  // age of the oldest cold tail: a reused block goes only once it has gone
  // unused several times as long as a block seen once lives here.
  struct Cand {
    uint64_t key;
    uint32_t stripe;
    bool hot;
    bool operator<(const Cand& o) const { return key < o.key; }
  };
  std::vector<Cand> cand;
  PoolView own;
  std::vector<std::pair<uint32_t, const cxlkv_index_stripe*>> lines;  // (stripe, line)
  if (held) {
    for (const auto& h : held->held()) lines.emplace_back(h.stripe, &h.st);
  } else {
    if (!view) own = pool_view();  // one sweep, one fence (rule 4)
    const std::vector<cxlkv_index_stripe>& v = view ? view->st : own.st;
    for (uint32_t s = 0; s < hdr_.nstripes && s < v.size(); s++) lines.emplace_back(s, &v[s]);
  }
  const uint32_t now = now_ms();
  uint32_t oldest_cold = now;
  for (const auto& [s, st] : lines)
    if (list_tail(*st, false) != kNo && static_cast<int32_t>(list_tail_ms(*st, false) - oldest_cold) < 0)
      oldest_cold = list_tail_ms(*st, false);
  const uint64_t bonus = uint64_t(kHotAgeFactor) * (now - oldest_cold);
  for (const auto& [s, st] : lines) {
    if (list_tail(*st, false) != kNo) cand.push_back({list_tail_ms(*st, false), s, false});
    if (list_tail(*st, true) != kNo) cand.push_back({uint64_t(list_tail_ms(*st, true)) + bonus, s, true});
  }
  // The few oldest tails, without sorting them all.
  const size_t k = std::min<size_t>(cand.size(), kCandidateStripes);
  std::partial_sort(cand.begin(), cand.begin() + k, cand.end());
  cand.resize(k);
  auto try_list = [&](const Cand& c, uint64_t limit) -> Result<bool> {
    if (held) return evict_from_list(*held, c.stripe, c.hot, parents, limit, bonus);
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire({c.stripe}));
    auto r = evict_from_list(ls, c.stripe, c.hot, parents, limit, bonus);
    if (view) view->take(ls);  // the line as this eviction leaves it (read fresh under the lock)
    return r;
  };
  for (size_t i = 0; i < cand.size(); i++) {
    auto r = try_list(cand[i], i + 1 < cand.size() ? cand[i + 1].key : kNoLimit);
    if (!r || r.value()) return r;
  }
  if (!cand.empty()) {
    auto r = try_list(cand[0], kNoLimit);
    if (!r || r.value()) return r;
  }
  // Nothing on the lists could go: dead writers, EVICTING leftovers, SSD
  // blocks and (docs/eviction.md "The SSD tier") non-leaf demotion are found by the window scan.
  if (held) {
    for (const auto& h : held->held()) {
      auto r = evict_locked(*held, h.stripe, parents);
      if (!r || r.value()) return r;
    }
    return false;
  }
  for (uint32_t k = 0; k < hdr_.nstripes; k++) {
    const uint32_t s = evict_hand_.fetch_add(1, std::memory_order_relaxed) % hdr_.nstripes;
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire({s}));
    auto r = evict_locked(ls, s, parents);
    if (view) view->take(ls);
    if (!r || r.value()) return r;
  }
  return false;
}

Result<bool> PrefixIndex::evict_one(uint32_t stripe) {
  if (stripe >= hdr_.nstripes) return Error(-EINVAL, "index: stripe " + std::to_string(stripe) + " out of range");
  std::vector<uint32_t> parents;
  Result<bool> r = false;
  {
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire({stripe}));
    r = evict_locked(ls, stripe, &parents);
  }
  CXLKV_TRY(drop_children(parents));
  return r;
}

Result<bool> PrefixIndex::evict_any() {
  std::vector<uint32_t> parents;
  auto r = evict_global(&parents, nullptr);
  CXLKV_TRY(drop_children(parents));
  return r;
}

// ---- capacity ------------------------------------------------------------------

void PrefixIndex::pool_used(const StripeLockSet* ls, uint64_t* blocks, uint64_t* bytes) const {
  *blocks = *bytes = 0;
  std::vector<cxlkv_index_stripe> v = read_stripes();  // one sweep, one fence (rule 4)
  for (uint32_t s = 0; s < hdr_.nstripes; s++) {
    const cxlkv_index_stripe* st = &v[s];
    if (ls) {
      for (const auto& h : ls->held())
        if (h.stripe == s) st = &h.st;  // our own uncommitted changes
    }
    *blocks += st->used_blocks;
    *bytes += st->used_bytes;
  }
}

bool PrefixIndex::over_capacity(const StripeLockSet* ls, uint64_t add_blocks, uint64_t add_bytes) const {
  if (!cfg_.max_blocks && !cfg_.max_bytes) return false;
  uint64_t blocks, bytes;
  pool_used(ls, &blocks, &bytes);
  return (cfg_.max_blocks && blocks + add_blocks > cfg_.max_blocks) ||
         (cfg_.max_bytes && bytes + add_bytes > cfg_.max_bytes);
}

bool PrefixIndex::over_capacity(const PoolView& view, const StripeLockSet* ls, uint64_t add_blocks,
                                uint64_t add_bytes) const {
  if (!cfg_.max_blocks && !cfg_.max_bytes) return false;
  uint64_t blocks = 0, bytes = 0;
  for (uint32_t s = 0; s < view.st.size(); s++) {
    const cxlkv_index_stripe* st = &view.st[s];
    if (ls) {
      for (const auto& h : ls->held())
        if (h.stripe == s) st = &h.st;  // held: read fresh under the lock, with our uncommitted changes
    }
    blocks += st->used_blocks;
    bytes += st->used_bytes;
  }
  return (cfg_.max_blocks && blocks + add_blocks > cfg_.max_blocks) ||
         (cfg_.max_bytes && bytes + add_bytes > cfg_.max_bytes);
}

Result<void> PrefixIndex::make_room(uint64_t blocks, uint64_t bytes, PoolView* view) {
  if (!cfg_.max_blocks && !cfg_.max_bytes) return {};
  PoolView own;
  if (!view) {
    own = pool_view();  // one sweep for the whole call (rule 4)
    view = &own;
  }
  std::vector<uint32_t> parents;
  for (uint64_t i = 0; i < 2 * blocks + 8 && over_capacity(*view, nullptr, blocks, bytes); i++) {
    auto r = evict_global(&parents, nullptr, view);
    if (!r) return r.error();
    // A parent left childless is a candidate for the very next victim.
    CXLKV_TRY(drop_children(parents, view));
    if (!r.value()) break;
  }
  return {};
}

}  // namespace cxlkv

namespace cxlkv {

uint64_t PrefixIndex::audit_lists(std::string* first) const {
  uint64_t bad = 0;
  auto problem = [&](std::string m) {
    if (bad++ == 0 && first) *first = std::move(m);
  };
  const std::vector<cxlkv_index_stripe> v = read_stripes();
  for (uint32_t s = 0; s < hdr_.nstripes; s++) {
    const uint32_t base = s * hdr_.stripe_slots;
    uint64_t leaves = 0, linked_flags = 0;
    for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
      cxlkv_index_entry e = read_entry(base + i);
      if (e.state == CXLKV_ENTRY_READY && e.children == 0 && e.loc_tier == CXLKV_TIER_MEM) leaves++;
      if (read_ext(base + i).linked & CXLKV_EXT_LINKED) linked_flags++;
    }
    if (v[s].list_dirty) problem("stripe " + std::to_string(s) + ": list_dirty set");
    uint64_t walked = 0;
    for (const bool hot : {false, true}) {
      const std::string name = "stripe " + std::to_string(s) + (hot ? " hot list" : " cold list");
      uint32_t prev = kNo, slot = list_head(v[s], hot);
      while (slot != kNo && walked <= hdr_.stripe_slots) {
        if (slot < base || slot >= base + hdr_.stripe_slots) {
          problem(name + ": link to slot " + std::to_string(slot) + " outside it");
          break;
        }
        cxlkv_index_entry e = read_entry(slot);
        cxlkv_index_ext x = read_ext(slot);
        if (!(x.linked & CXLKV_EXT_LINKED) || x.lru_prev != prev)
          problem(name + ": slot " + std::to_string(slot) + " badly linked");
        if (bool(x.linked & CXLKV_EXT_HOT) != hot)
          problem(name + ": slot " + std::to_string(slot) + " flagged for the other list");
        if (e.state != CXLKV_ENTRY_READY || e.children || e.loc_tier != CXLKV_TIER_MEM)
          problem(name + ": slot " + std::to_string(slot) + " listed but not an evictable leaf");
        walked++;
        prev = slot;
        slot = x.lru_next;
      }
      if (prev != list_tail(v[s], hot)) problem(name + ": tail does not end the list");
    }
    if (walked != leaves || linked_flags != leaves)
      problem("stripe " + std::to_string(s) + ": " + std::to_string(walked) + " listed, " +
              std::to_string(linked_flags) + " flagged, " + std::to_string(leaves) + " READY memory leaves");
  }
  return bad;
}

}  // namespace cxlkv
