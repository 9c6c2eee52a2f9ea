// SPDX-License-Identifier: MIT
// Optimistic reads (docs/coherence.md "Optimistic reads"): a get's lookups
// of blocks whose stripe this node does not keep, without the stripe lock
// and without a pin; the KV store checks after its copy that the entry did
// not change.  Their recency stamps are written later, a batch at a time.
#include <algorithm>
#include <string>

#include "index/index_internal.hpp"
#include "index/prefix_index.hpp"
#include "index/stripe_lock_set.hpp"

namespace cxlkv {

namespace {

// Stamps are written once the oldest is the caller's min_age_ms old (the
// session's drainer: kv_session.cpp) or once this many are owed.
constexpr uint32_t kOwedBatch = 4096;
constexpr size_t kOwedMax = 1 << 16;  // stamps kept at most

}  // namespace

Result<size_t> IndexBatchOps::read_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                        std::span<int32_t> status, std::span<uint8_t> pinned, bool /*optimistic*/) {
  std::fill(pinned.begin(), pinned.begin() + std::min(pinned.size(), keys.size()), uint8_t{1});
  return pin_many(keys, out, status);
}

Result<size_t> PrefixIndex::read_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                      std::span<int32_t> status, std::span<uint8_t> pinned, bool optimistic) {
  const size_t n = keys.size();
  if (out.size() < n || status.size() < n || pinned.size() < n)
    return Error(-EINVAL, "index: read_many: fewer results, statuses or pin flags than keys");
  // Which keys go without the lock: only where taking it would ask another
  // node for the grant (a cross-host round trip; docs/locks.md "Two tiers
  // and sticky grants").  A kept stripe is cheaper locked, and the pin
  // stamps recency at once.
  static thread_local std::vector<size_t> locked, free;
  locked.clear();
  free.clear();
  for (size_t i = 0; i < n; i++)
    ((optimistic && !keys[i].is_zero() && !locks_->cheap(stripe_of(keys[i]))) ? free : locked).push_back(i);
  if (free.empty()) {
    std::fill(pinned.begin(), pinned.begin() + n, uint8_t{1});
    return pin_many(keys, out, status);
  }
  // The lock-free probes first; the keys they leave to the locked path
  // (READY on the SSD tier, whose reads hold their pin) join the pinned
  // ones in one pin_many, which begins the batch; the probes' refusals are
  // reported after it, so the batch keeps the first message.
  const uint32_t now = now_ms();
  std::vector<OwedRead> owe;
  owe.reserve(free.size());
  std::vector<std::pair<int32_t, std::string>> refused;
  size_t good = 0;
  for (size_t i : free) {
    out[i] = PinnedBlock{};
    status[i] = kBlockMiss;
    pinned[i] = 0;
    // rule 4: probe() reads each line fresh (invalidate, fence, load) and
    // re-reads a torn one.  A READY entry's payload was fenced before it
    // (rule 3), and a removal or a move fences the changed entry before the
    // space is freed, so the check after the copy sees any change that
    // could have reached the bytes.
    cxlkv_index_entry e;
    const uint32_t slot = probe(keys[i], &e, nullptr);
    if (slot == CXLKV_INDEX_NO_SLOT || e.state != CXLKV_ENTRY_READY) continue;  // MISS
    if (e.loc_tier != CXLKV_TIER_MEM) {
      locked.push_back(i);
      continue;
    }
    // Not the block the allocator handed out (index_owner.cpp): without the
    // lock that may also be a block evicted and its space reused since the
    // probe, a miss; damage only while the entry still reads the same.
    if (!space_->owner_check(loc_of(e), slot).ok) {
      const cxlkv_index_entry now_e = read_entry_fresh(slot);
      if (now_e.state != CXLKV_ENTRY_READY || now_e.version != e.version || now_e.key_lo != e.key_lo ||
          now_e.key_hi != e.key_hi)
        continue;  // MISS
      if (auto own = owner_ok(slot, now_e); !own) {
        status[i] = own.error().code();
        refused.emplace_back(own.error().code(), own.error().message());
        continue;
      }
    }
    out[i] = PinnedBlock{slot, loc_of(e), e.version};
    status[i] = kBlockReserved;
    good++;
    owe.push_back(OwedRead{slot, e.version, now, keys[i]});
  }
  if (!locked.empty()) {
    std::vector<BlockKey> k(locked.size());
    std::vector<PinnedBlock> o(locked.size());
    std::vector<int32_t> st(locked.size());
    for (size_t j = 0; j < locked.size(); j++) k[j] = keys[locked[j]];
    auto r = pin_many(k, o, st);
    if (!r) return r.error();
    good += r.value();
    for (size_t j = 0; j < locked.size(); j++) {
      out[locked[j]] = o[j];
      status[locked[j]] = st[j];
      pinned[locked[j]] = 1;
    }
  } else {
    begin_batch();
  }
  for (auto& [code, msg] : refused) block_error(code, std::move(msg));
  if (!owe.empty()) {
    std::lock_guard<std::mutex> lk(owed_mu_);
    if (owed_.empty()) owed_since_ms_ = now;
    // Bounded where nothing settles (a store without a drainer): past the
    // bound the newest stamps are dropped, which costs recency only.
    const size_t room = owed_.size() < kOwedMax ? kOwedMax - owed_.size() : 0;
    owed_.insert(owed_.end(), owe.begin(), owe.begin() + std::min(room, owe.size()));
  }
  return good;
}

size_t PrefixIndex::reads_owed() const {
  std::lock_guard<std::mutex> lk(owed_mu_);
  return owed_.size();
}

// The recency stamps a pin would have written (pin_many: lru_ms = now, the
// evictor's second chance), for the blocks read optimistically, under their
// stripe locks (rule 7) and only where the entry is still the block that
// was read (same slot, key, version).  Not a version change: a stamp is
// bookkeeping (write_entry), so it does not fail other readers' checks.
void PrefixIndex::settle_reads(uint32_t min_age_ms) {
  std::vector<OwedRead> todo;
  {
    std::lock_guard<std::mutex> lk(owed_mu_);
    if (owed_.empty()) return;
    const bool due = min_age_ms == 0 || owed_.size() >= kOwedBatch ||
                     static_cast<int32_t>(now_ms() - owed_since_ms_) >= static_cast<int32_t>(min_age_ms);
    if (!due) return;
    todo.swap(owed_);
  }
  // The newest stamp per slot.
  std::sort(todo.begin(), todo.end(), [](const OwedRead& a, const OwedRead& b) {
    return a.slot != b.slot ? a.slot < b.slot : static_cast<int32_t>(a.ms - b.ms) > 0;
  });
  todo.erase(std::unique(todo.begin(), todo.end(), [](const OwedRead& a, const OwedRead& b) { return a.slot == b.slot; }),
             todo.end());
  std::vector<uint32_t> stripes, lines;
  stripes.reserve(todo.size());
  lines.reserve(todo.size());
  for (const OwedRead& t : todo) {
    stripes.push_back(t.slot / hdr_.stripe_slots);
    lines.push_back(t.slot);
  }
  StripeLockSet ls(*this);
  if (!ls.acquire(stripes, lines)) return;  // a lock that does not come: the stamps are dropped (recency only)
  for (const OwedRead& t : todo) {
    cxlkv_index_entry e = read_entry(t.slot);
    if (e.state != CXLKV_ENTRY_READY || e.key_lo != t.key.lo || e.key_hi != t.key.hi || e.version != t.version)
      continue;
    if (static_cast<int32_t>(t.ms - e.lru_ms) <= 0) continue;
    e.lru_ms = t.ms;
    write_entry(t.slot, e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
  }
}

}  // namespace cxlkv
