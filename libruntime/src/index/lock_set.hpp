// SPDX-License-Identifier: MIT
// LockSet: the stripe locks one index call holds, taken once each in
// ascending stripe order, with each held stripe's line cached for the call.
//
// Stripe line protocol (uapi cxlkv_index_stripe.list_dirty): before the
// first change to a held stripe's list or counters, mark() publishes the
// line with list_dirty = 1; release() fences the call's entry / ext writes
// (rule 3: data before the line that vouches for them), publishes the line
// with list_dirty = 0, and unlocks.  A holder that dies in between leaves
// list_dirty set; the next acquirer rebuilds the list and counters.
#pragma once

#include <algorithm>
#include <vector>

#include "index/prefix_index.hpp"

namespace cxlkv {

class LockSet {
 public:
  struct Held {
    uint32_t stripe;
    cxlkv_index_stripe st;
    bool marked = false;
  };

  explicit LockSet(PrefixIndex& ix) : ix_(ix) {}
  ~LockSet() { release(); }
  LockSet(const LockSet&) = delete;
  LockSet& operator=(const LockSet&) = delete;

  // Lock `stripes` (any order, duplicates allowed) in ascending order.
  Result<void> acquire(std::vector<uint32_t> stripes) {
    std::sort(stripes.begin(), stripes.end());
    stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
    for (uint32_t s : stripes) {
      if (auto r = ix_.locks_->lock(s); !r) {
        release();
        return r.error();
      }
      held_.push_back(Held{s, ix_.read_stripe(s)});  // rule 4
      if (held_.back().st.list_dirty) {
        ix_.repair_stripe(*this, s);  // a holder died mid-change
        ix_.ctr_.list_repairs++;
      }
    }
    return {};
  }
  bool holds(uint32_t s) const {
    for (auto& h : held_)
      if (h.stripe == s) return true;
    return false;
  }
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
  void release() {
    if (held_.empty()) return;
    bool any = false;
    for (auto& h : held_) any |= h.marked;
    if (any) ix_.d_->fence();  // rule 3: ext / entry writes before the clean stripe lines
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
      if (it->marked) {
        it->st.list_dirty = 0;
        ix_.write_stripe(it->stripe, it->st);
      }
      ix_.locks_->unlock(it->stripe);
    }
    held_.clear();
  }

 private:
  PrefixIndex& ix_;
  std::vector<Held> held_;
};

}  // namespace cxlkv
