// SPDX-License-Identifier: MIT
// StripeLockSet: the stripe locks one index call holds, taken once each in
// ascending stripe order, with each held stripe's line cached for the call.
//
// Stripe line protocol (uapi cxlkv_index_stripe.list_dirty): before the
// first change to a held stripe's list or counters, mark() publishes the
// line with list_dirty = 1; release() fences the call's entry / ext writes
// (rule 3: data before the line that vouches for them), publishes the line
// with list_dirty = 0, and unlocks.  A holder that dies in between leaves
// list_dirty set; the next acquirer rebuilds the list and counters.
//
// Line cache (docs/api.md "How a batch reads the index"; control cost per block).  Only holders of a
// stripe's lock write its entry and ext lines (rule 7, cxlkv/format/index_format.h),
// so a line invalidated and loaded after the lock was taken stays what
// memory holds until the lock is released, except for this call's own
// writes.  While a set holds a stripe, PrefixIndex::read_entry / read_ext of
// its slots read memory once (rule 4) and are then served from the set's
// copy, which the call's writes keep current; acquire() invalidates the
// held stripe lines and the lines the call says it will read (`prefetch`)
// in one sweep with one fence and loads them all, instead of a fence per
// line.  Entry writes that leave a block WRITING or READY are fenced once,
// at release, before the clean stripe lines and the unlocks (rule 3: every
// write of the critical section is in memory before the release that makes
// it the next holder's to read); removals keep their own fence.  The cache
// dies with the hold: the next hold reads memory again.
#pragma once

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "index/index_internal.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {
namespace index_detail {

class StripeLockSet {
 public:
  struct Held {
    uint32_t stripe;
    cxlkv_index_stripe st;
    bool marked = false;
  };

  explicit StripeLockSet(PrefixIndex& ix) : ix_(ix) {}
  ~StripeLockSet() { release(); }
  StripeLockSet(const StripeLockSet&) = delete;
  StripeLockSet& operator=(const StripeLockSet&) = delete;

  // Lock `stripes` (any order, duplicates allowed) in ascending order, then
  // read their stripe lines and the entry lines of `prefetch` (slots of the
  // held stripes the call is about to read; others are ignored) fresh in one
  // sweep: invalidate all, one fence, load all (rule 4).
  // `prefetch_ext`: slots whose ext records (whole lines: both records of
  // the line) are read in the same sweep.
  Result<void> acquire(std::vector<uint32_t> stripes, std::span<const uint32_t> prefetch = {},
                       std::span<const uint32_t> prefetch_ext = {}) {
    std::sort(stripes.begin(), stripes.end());
    stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
    MemoryDomain& d = *ix_.d_;
    const size_t first = held_.size();
    if (first) return Error(-EBUSY, "index: a lock set takes its stripes in one acquire");
    if (auto r = ix_.locks_->lock_many(stripes); !r) return r.error();  // one multi-lock acquire
    for (uint32_t s : stripes) {
      held_.push_back(Held{s, {}});
      set_bit(s);
    }
    stripes_ = std::move(stripes);
    activate();
    // The line cache's room for what the call says it reads (no regrowth
    // of the table or the lines while the call works).
    reserve_lines(prefetch.size() + prefetch_ext.size() + 16);
    // rule 4 (+ rule 7: nobody but a holder writes these lines): one sweep.
    for (size_t i = first; i < held_.size(); i++) d.invalidate_clean(ix_.stripe_ptr(held_[i].stripe), 64);
    size_t want = 0;
    for (uint32_t slot : prefetch)
      if (slot < ix_.hdr_.nslots && holds(slot / ix_.hdr_.stripe_slots) && !cached_entry(slot)) {
        d.invalidate_clean(ix_.slot_ptr(slot), 64);
        want++;
      }
    for (uint32_t slot : prefetch_ext)
      if (slot < ix_.hdr_.nslots && holds(slot / ix_.hdr_.stripe_slots) && !cached_ext(slot))
        d.invalidate_clean(ix_.ext_ptr(slot & ~1u), 64);
    d.fence();
    for (size_t i = first; i < held_.size(); i++) d.load(&held_[i].st, ix_.stripe_ptr(held_[i].stripe), 64);
    if (want) {
      // All the loads first (their misses overlap), then check and keep them.
      std::vector<std::pair<uint32_t, cxlkv_index_entry>> got;
      got.reserve(want);
      for (uint32_t slot : prefetch) {
        if (slot >= ix_.hdr_.nslots || !holds(slot / ix_.hdr_.stripe_slots) || cached_entry(slot)) continue;
        got.emplace_back(slot, cxlkv_index_entry{});
        d.load(&got.back().second, ix_.slot_ptr(slot), sizeof(cxlkv_index_entry));
      }
      static const cxlkv_index_entry zero{};
      for (auto& [slot, e] : got) {
        const bool valid = e.check ? e.check == cxlkv_index_entry_check(&e) : std::memcmp(&e, &zero, sizeof e) == 0;
        if (valid && !cached_entry(slot)) put_entry(slot, e);  // else: read_entry's careful path when read
      }
      // One count for the sweep: an atomic add per line would be a locked
      // instruction between the loads (a full barrier each).
      ix_.probes_.fetch_add(want, std::memory_order_relaxed);
    }
    for (uint32_t slot : prefetch_ext)
      if (slot < ix_.hdr_.nslots && holds(slot / ix_.hdr_.stripe_slots) && !cached_ext(slot)) {
        cxlkv_index_ext x[2];
        d.load(x, ix_.ext_ptr(slot & ~1u), sizeof x);
        put_ext(slot & ~1u, x[0]);  // both records of the line: the same stripe (stripe_slots is even)
        put_ext(slot | 1u, x[1]);
      }
    for (size_t i = first; i < held_.size(); i++)
      if (held_[i].st.list_dirty) {
        ix_.repair_stripe(*this, held_[i].stripe);  // a holder died mid-change
        ix_.ctr_.list_repairs++;
      }
    return {};
  }
  // More lines of held stripes read fresh after acquire, in one sweep with
  // one fence (rule 4; rule 7 keeps them valid for the hold, as acquire's):
  // the entry lines of `slots` and the ext lines of `ext_slots` that the set
  // has not read yet.  For calls that learn which lines they need only from
  // the first sweep (PrefixIndex::prefetch_probes, publish_many's leaves).
  // Before the call's own writes to those lines (a cached line is skipped).
  void prefetch(std::span<const uint32_t> slots, std::span<const uint32_t> ext_slots) {
    MemoryDomain& d = *ix_.d_;
    const uint32_t ns = ix_.hdr_.nslots, ss = ix_.hdr_.stripe_slots;
    std::vector<uint32_t> es, xs;
    for (uint32_t slot : slots)
      if (slot < ns && holds(slot / ss) && !cached_entry(slot)) es.push_back(slot);
    for (uint32_t slot : ext_slots)
      if (slot < ns && holds(slot / ss) && !cached_ext(slot)) xs.push_back(slot & ~1u);
    if (es.empty() && xs.empty()) return;
    reserve_lines(lines_.size() + es.size() + 2 * xs.size());
    for (uint32_t slot : es) d.invalidate_clean(ix_.slot_ptr(slot), 64);  // rule 4 (+ rule 1: NT-only lines)
    for (uint32_t slot : xs) d.invalidate_clean(ix_.ext_ptr(slot), 64);
    d.fence();  // rule 4: every invalidation before the loads below
    std::vector<cxlkv_index_entry> got(es.size());
    for (size_t i = 0; i < es.size(); i++) d.load(&got[i], ix_.slot_ptr(es[i]), sizeof(cxlkv_index_entry));
    static const cxlkv_index_entry zero{};
    for (size_t i = 0; i < es.size(); i++) {
      const cxlkv_index_entry& e = got[i];
      const bool valid = e.check ? e.check == cxlkv_index_entry_check(&e) : std::memcmp(&e, &zero, sizeof e) == 0;
      if (valid && !cached_entry(es[i])) put_entry(es[i], e);  // else: read_entry's careful path when read
    }
    if (!es.empty()) ix_.probes_.fetch_add(es.size(), std::memory_order_relaxed);
    for (uint32_t even : xs) {
      cxlkv_index_ext x[2];
      d.load(x, ix_.ext_ptr(even), sizeof x);
      if (!cached_ext(even)) put_ext(even, x[0]);  // both records of the line: one stripe (stripe_slots is even)
      if (!cached_ext(even | 1u)) put_ext(even | 1u, x[1]);
    }
  }
  bool holds(uint32_t s) const { return s / 64 < bits_.size() && (bits_[s / 64] >> (s % 64) & 1); }
  Held& at(uint32_t s) {
    for (auto& h : held_)
      if (h.stripe == s) return h;
    return held_.front();  // callers check holds() first
  }
  cxlkv_index_stripe& st(uint32_t s) { return at(s).st; }
  const std::vector<Held>& held() const { return held_; }
  // Before the first change of stripe s's list or counters in this call.
  void mark(uint32_t s) {
    Held& h = at(s);
    if (h.marked) return;
    h.st.list_dirty = 1;
    ix_.write_stripe(s, h.st);  // rule 1 + 3: whole line, NT, fenced
    h.marked = true;
  }
  // mark() of every held stripe, with one fence for all of them (a call
  // that will change most of its stripes, e.g. a reserve of a chain).
  void mark_all() {
    bool any = false;
    for (auto& h : held_) {
      if (h.marked) continue;
      h.st.list_dirty = 1;
      ix_.d_->publish_line(ix_.stripe_ptr(h.stripe), &h.st);  // rule 1: whole line, NT
      h.marked = any = true;
    }
    if (any) ix_.d_->fence();  // rule 3: dirty marks in memory before the changes they cover
  }
  void release() {
    if (held_.empty()) {
      deactivate();
      return;
    }
    MemoryDomain& d = *ix_.d_;
    bool any = false;
    for (auto& h : held_) any |= h.marked;
    if (any || fence_due_) d.fence();  // rule 3: ext / entry writes before the clean stripe lines and the unlocks
    if (any) {
      for (auto& h : held_)
        if (h.marked) {
          h.st.list_dirty = 0;
          d.publish_line(ix_.stripe_ptr(h.stripe), &h.st);  // rule 1: whole line, NT
        }
      d.fence();  // rule 3: clean lines in memory before the locks are released
    }
    ix_.locks_->unlock_many(stripes_);
    held_.clear();
    stripes_.clear();
    std::fill(bits_.begin(), bits_.end(), 0);
    lines_.clear();
    std::fill(table_.begin(), table_.end(), 0);
    fence_due_ = false;
    deactivate();
  }

  // ---- line cache (hooks of PrefixIndex's codec, index_entry.cpp) ----------
  // The set of this thread holding the stripe of `slot` of `ix`, if any.
  static StripeLockSet* holding(const PrefixIndex* ix, uint32_t slot) {
    if (slot >= ix->hdr_.nslots) return nullptr;
    for (StripeLockSet* p = active_; p; p = p->prev_)
      if (&p->ix_ == ix && p->holds(slot / ix->hdr_.stripe_slots)) return p;
    return nullptr;
  }
  const cxlkv_index_entry* cached_entry(uint32_t slot) const {
    const Line* l = find(slot);
    return l && l->has_e ? &l->e : nullptr;
  }
  const cxlkv_index_ext* cached_ext(uint32_t slot) const {
    const Line* l = find(slot);
    return l && l->has_x ? &l->x : nullptr;
  }
  void put_entry(uint32_t slot, const cxlkv_index_entry& e) {
    Line& l = line(slot);
    l.e = e;
    l.has_e = true;
  }
  void put_ext(uint32_t slot, const cxlkv_index_ext& x) {
    Line& l = line(slot);
    l.x = x;
    l.has_x = true;
  }
  // An entry write whose fence release() gives (see the header comment).
  void defer_fence() { fence_due_ = true; }

 private:
  struct Line {
    uint32_t slot;
    bool has_e = false, has_x = false;
    cxlkv_index_entry e{};
    cxlkv_index_ext x{};
  };
  void reserve_lines(size_t n) {
    lines_.reserve(n);
    if (!lines_.empty()) return;  // a filled table grows (and rehashes) in line()
    size_t t = 256;
    while (t < 2 * n) t *= 2;
    if (table_.size() < t) table_.assign(t, 0);  // empty here: nothing to rehash
  }
  void set_bit(uint32_t s) {
    if (s / 64 >= bits_.size()) bits_.resize(s / 64 + 1, 0);
    bits_[s / 64] |= 1ull << (s % 64);
  }
  static uint32_t hash(uint32_t slot) { return slot * 2654435761u; }
  const Line* find(uint32_t slot) const {
    if (table_.empty()) return nullptr;
    const uint32_t mask = uint32_t(table_.size() - 1);
    for (uint32_t h = hash(slot) & mask;; h = (h + 1) & mask) {
      if (!table_[h]) return nullptr;
      if (lines_[table_[h] - 1].slot == slot) return &lines_[table_[h] - 1];
    }
  }
  Line& line(uint32_t slot) {
    if (const Line* l = find(slot)) return const_cast<Line&>(*l);
    if ((lines_.size() + 1) * 2 > table_.size()) {
      table_.assign(std::max<size_t>(256, table_.size() * 2), 0);
      const uint32_t mask = uint32_t(table_.size() - 1);
      for (uint32_t i = 0; i < lines_.size(); i++) {
        uint32_t h = hash(lines_[i].slot) & mask;
        while (table_[h]) h = (h + 1) & mask;
        table_[h] = i + 1;
      }
    }
    const uint32_t mask = uint32_t(table_.size() - 1);
    uint32_t h = hash(slot) & mask;
    while (table_[h]) h = (h + 1) & mask;
    lines_.push_back(Line{slot, false, false, {}, {}});
    table_[h] = uint32_t(lines_.size());
    return lines_.back();
  }
  void activate() {
    for (StripeLockSet* p = active_; p; p = p->prev_)
      if (p == this) return;
    prev_ = active_;
    active_ = this;
  }
  void deactivate() {
    if (active_ == this) {
      active_ = prev_;
    } else {
      for (StripeLockSet* p = active_; p; p = p->prev_)
        if (p->prev_ == this) {
          p->prev_ = prev_;
          break;
        }
    }
    prev_ = nullptr;
  }

  PrefixIndex& ix_;
  std::vector<Held> held_;
  std::vector<uint32_t> stripes_;  // held, ascending (as lock_many took them)
  std::vector<uint64_t> bits_;     // held stripes
  std::vector<Line> lines_;        // cached lines of held stripes
  std::vector<uint32_t> table_;    // slot -> 1 + index in lines_ (0: empty), open addressing
  bool fence_due_ = false;
  StripeLockSet* prev_ = nullptr;        // the set that was active on this thread before this one
  static inline thread_local StripeLockSet* active_ = nullptr;
};

}  // namespace index_detail
}  // namespace cxlkv
