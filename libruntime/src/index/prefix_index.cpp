// SPDX-License-Identifier: MIT
// PrefixIndex: lock-free lookups, the single-block calls (thin wrappers over
// the batch calls of index_batch.cpp), SSD relocation, reclaim, inspection.
// Layout and codec: index_entry.cpp; eviction: index_evict.cpp; leases:
// index_lease.cpp.  The rules all of them follow are in prefix_index.hpp.
#include "index/prefix_index.hpp"

#include <algorithm>
#include <string>

#include "index/index_internal.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/node_pins.hpp"
#include "util/log.hpp"

namespace cxlkv {

uint32_t PrefixIndex::find_state(const BlockKey& key, uint32_t* slot_out) const {
  cxlkv_index_entry e;
  uint32_t slot = probe(key, &e, nullptr);
  if (slot == CXLKV_INDEX_NO_SLOT) return CXLKV_ENTRY_EMPTY;
  if (slot_out) *slot_out = slot;
  return e.state;
}

uint32_t PrefixIndex::find_ready(const BlockKey& key, BlockLocation* loc) const {
  cxlkv_index_entry e;
  uint32_t slot = probe(key, &e, nullptr);
  if (slot == CXLKV_INDEX_NO_SLOT || e.state != CXLKV_ENTRY_READY) return CXLKV_INDEX_NO_SLOT;
  if (loc) *loc = BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  return slot;
}

size_t PrefixIndex::longest_prefix(std::span<const BlockKey> chain) const {
  // Prefix closure: READY(i) implies READY(j) for all j < i, so the READY
  // blocks are a prefix and the boundary is found by binary search.
  size_t lo = 0, hi = chain.size();  // answer in [lo, hi]
  while (lo < hi) {
    size_t mid = lo + (hi - lo + 1) / 2;  // test block mid-1
    if (find_ready(chain[mid - 1]) != CXLKV_INDEX_NO_SLOT) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

size_t PrefixIndex::longest_prefix_linear(std::span<const BlockKey> chain) const {
  size_t n = 0;
  while (n < chain.size() && find_ready(chain[n]) != CXLKV_INDEX_NO_SLOT) n++;
  return n;
}

// ---- single-block calls: one-element batches ---------------------------------

namespace {
thread_local std::string t_block_msg;  // message of the first failed block of this thread's last batch
thread_local int32_t t_block_code = 0;

Error block_failure(int32_t code) {
  if (code == t_block_code && !t_block_msg.empty()) return Error(code, t_block_msg);
  return Error(code, "index: operation failed (errno " + std::to_string(-code) + ")");
}
}  // namespace

void PrefixIndex::begin_batch() {
  t_block_code = 0;
  t_block_msg.clear();
}

std::string PrefixIndex::last_block_message() { return t_block_msg; }

Result<size_t> IndexBatchOps::publish_many(std::span<const Reservation>, std::span<const BlockKey>,
                                           std::span<int32_t>) {
  return Error(-ENOTSUP, std::string("index: the ") + mode() + " index path cannot check versions at publish");
}

std::string IndexBatchOps::block_message(const char*, const BlockKey&, int32_t) const {
  return PrefixIndex::last_block_message();
}

PrefixIndex::BatchFailure PrefixIndex::batch_failure() { return BatchFailure{t_block_code, t_block_msg}; }

void PrefixIndex::set_batch_failure(const BatchFailure& f) {
  t_block_code = f.code;
  t_block_msg = f.msg;
}

void PrefixIndex::block_error(int32_t code, std::string msg) {
  if (t_block_code != 0) return;  // keep the first
  t_block_code = code;
  t_block_msg = std::move(msg);
}

Result<Reservation> PrefixIndex::reserve(const BlockKey& key, const BlockKey* parent, uint64_t bytes) {
  if (key.is_zero()) return Error(-EINVAL, "index: the all-zero block key is reserved");
  if (parent && parent->is_zero()) return Error(-EINVAL, "index: the all-zero parent key is reserved");
  if (parent && *parent == key) return Error(-EINVAL, "index: block " + to_hex(key) + " is its own parent");
  if (bytes == 0 || bytes > UINT32_MAX)
    return Error(-EINVAL, "index: block " + to_hex(key) + ": payload length " + std::to_string(bytes) +
                              " is not 1 .. 4 GiB-1");
  Reservation r;
  int32_t st = 0;
  for (int attempt = 0;; attempt++) {
    auto n = reserve_chain(parent, std::span(&key, 1), bytes, std::span(&r, 1), std::span(&st, 1));
    if (!n) return n.error();
    if (st >= 0) return r;
    // A dead writer's chain below this block was unwound: try again.
    if (st == -EAGAIN && attempt < 4) continue;
    return block_failure(st);
  }
}

Result<void> PrefixIndex::publish(uint32_t slot, const BlockKey& key) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: publish of slot " + std::to_string(slot) + " out of range");
  int32_t st = 0;
  auto n = publish_many(std::span(&slot, 1), std::span(&key, 1), std::span(&st, 1));
  if (!n) return n.error();
  if (st < 0) return block_failure(st);
  return {};
}

Result<void> PrefixIndex::abort(uint32_t slot, const BlockKey& key) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: abort of slot " + std::to_string(slot) + " out of range");
  int32_t st = 0;
  auto n = abort_many(std::span(&slot, 1), std::span(&key, 1), std::span(&st, 1));
  if (!n) return n.error();
  if (st < 0) return block_failure(st);
  return {};
}

Result<BlockLocation> PrefixIndex::pin(const BlockKey& key, uint32_t* slot_out) {
  if (key.is_zero()) return Error(-EINVAL, "index: the all-zero block key is reserved");
  PinnedBlock pb;
  int32_t st = 0;
  auto n = pin_many(std::span(&key, 1), std::span(&pb, 1), std::span(&st, 1));
  if (!n) return n.error();
  if (st == kBlockMiss) return Error(-ENOENT, "index: block " + to_hex(key) + " is not cached");
  if (st < 0) return block_failure(st);
  if (slot_out) *slot_out = pb.slot;
  return pb.loc;
}

Result<void> PrefixIndex::unpin(uint32_t slot, const BlockKey& key) {
  int32_t st = 0;
  auto n = unpin_many(std::span(&slot, 1), std::span(&key, 1), std::span(&st, 1));
  if (!n) return n.error();
  if (st < 0) return block_failure(st);
  return {};
}

// ---- SSD tier, reclaim -------------------------------------------------------

Result<bool> PrefixIndex::relocate(uint32_t slot, const BlockKey& key, const BlockLocation& from,
                                   const BlockLocation& to) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: slot " + std::to_string(slot) + " out of range");
  const uint32_t s = slot / hdr_.stripe_slots;
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire({s}));
  cxlkv_index_entry e = read_entry(slot);
  if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_READY || e.loc_off != from.offset ||
      e.loc_dev != from.device || e.loc_tier != from.tier)
    return false;  // evicted or moved meanwhile
  // pin_mu_ keeps this process's lock-free pin fast path from handing out
  // `from` while the entry changes.
  std::lock_guard<std::mutex> lk(pin_mu_);
  auto it = local_pins_.find(slot);
  if (e.pin_mask != (1ULL << node_) || it == local_pins_.end() || it->second != 1) return false;
  if (node_pins_ && node_pins_->pinned_by_others(slot)) return false;  // another process of this node reads it
  if (to.tier == CXLKV_TIER_MEM && over_capacity(&ls, 1, to.length))
    return false;  // would exceed the pool-wide memory capacity
  e.loc_off = to.offset;
  e.loc_len = to.length;
  e.loc_dev = to.device;
  e.loc_tier = to.tier;
  ls.mark(s);
  if (to.tier == CXLKV_TIER_MEM) space_->claim(to, slot);  // owner record before the entry names it
  write_entry(slot, e);  // rule 3: the caller fenced the new payload before this
  if (to.tier == CXLKV_TIER_MEM) {
    ls.st(s).used_blocks++;
    ls.st(s).used_bytes += to.length;
    if (e.children == 0) link(ls, slot, now_ms(), /*at_head=*/true);
  }
  ctr_.promotions++;
  return true;
}

Result<bool> PrefixIndex::drop_damaged(uint32_t slot, const BlockKey& key, const BlockLocation& at) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: slot " + std::to_string(slot) + " out of range");
  const uint32_t s = slot / hdr_.stripe_slots;
  std::vector<uint32_t> parents;
  {
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire({s}));
    cxlkv_index_entry e = read_entry(slot);
    if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_READY || e.loc_off != at.offset ||
        e.loc_dev != at.device || e.loc_tier != at.tier || e.children != 0)
      return false;  // moved, evicted, or a parent (prefix closure): not ours to drop
    std::lock_guard<std::mutex> lk(pin_mu_);
    auto it = local_pins_.find(slot);
    bool changed = false;
    pins_live(e, &changed);
    const uint64_t others = e.pin_mask & ~(1ULL << node_);
    if (others != 0 || (it != local_pins_.end() && it->second > 1)) return false;  // someone else reads it
    if (node_pins_ && node_pins_->pinned_by_others(slot)) return false;  // another process of this node reads it
    if (it != local_pins_.end()) {
      local_pins_.erase(it);
      if (node_pins_) {
        uint8_t node_free = 0;
        node_pins_->remove({&slot, 1}, &node_free);
      }
    }
    remove_locked(ls, slot, e, /*reclaim=*/false, &parents);
  }
  CXLKV_TRY(drop_children(parents));
  return true;
}

Result<uint64_t> PrefixIndex::reclaim_dead() {
  uint64_t n = 0;
  if (auto r = reclaim_node_pins(); r) n += r.value();
  else log().warn("index: node {}: reclaiming gone processes' pins: {}", node_, r.error().message());
  // Pending drops, counts, dead writers' chains (leaf first), EVICTING
  // leftovers and dead nodes' pin bits: the online repair (index_repair.cpp).
  auto r = repair_index();
  if (!r) return r.error();
  return n + r->total();
}

// ---- pins of this node's processes (node_pins.hpp) ----------------------------

PrefixIndex::PrefixIndex() = default;
PrefixIndex::~PrefixIndex() = default;  // node_pins_ gives its record back (node_pins.hpp)

Result<void> PrefixIndex::set_node_pins(std::unique_ptr<NodePins> pins) {
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    if (!local_pins_.empty())
      return Error(-EBUSY, "index: node pins set while this index holds pins");
    node_pins_ = std::move(pins);
  }
  if (auto r = reclaim_node_pins(); !r)
    log().warn("index: node {}: reclaiming gone processes' pins: {}", node_, r.error().message());
  return {};
}

Result<uint64_t> PrefixIndex::reclaim_node_pins() {
  if (!node_pins_) return uint64_t{0};
  uint64_t cleared = 0;
  for (const NodePins::Gone& g : node_pins_->gone()) {
    // Stripe by stripe: the record's pins of a slot go under the slot's
    // stripe lock, as every change of the node's pins of it does.
    std::vector<uint32_t> slots = g.slots;
    std::sort(slots.begin(), slots.end());
    for (size_t a = 0; a < slots.size();) {
      const uint32_t s = slots[a] / hdr_.stripe_slots;
      size_t b = a;
      while (b < slots.size() && slots[b] / hdr_.stripe_slots == s) b++;
      std::span<const uint32_t> these(slots.data() + a, b - a);
      a = b;
      if (s >= hdr_.nstripes) continue;
      StripeLockSet ls(*this);
      CXLKV_TRY(ls.acquire({s}, these));
      std::vector<uint8_t> node_free(these.size(), 0);
      node_pins_->drop(g, these, node_free.data());
      for (size_t k = 0; k < these.size(); k++) {
        if (!node_free[k]) continue;  // a live index of this node still pins it
        cxlkv_index_entry e = read_entry(these[k]);
        if (!(e.pin_mask >> node_ & 1)) continue;
        e.pin_mask &= ~(1ULL << node_);
        write_entry(these[k], e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
        cleared++;
      }
    }
    if (node_pins_->forget(g))
      log().info("index: node {}: dropped the pins of {} slot(s) held by gone process {} ({})", node_, g.slots.size(),
                 g.pid, node_pins_->what());
  }
  return cleared;
}

// ---- inspection ----------------------------------------------------------------

IndexUsage PrefixIndex::usage() const {
  IndexUsage u;
  u.slots = hdr_.nslots;
  u.stripes = hdr_.nstripes;
  for (const cxlkv_index_stripe& st : read_stripes()) {
    u.used_blocks += st.used_blocks;
    u.used_bytes += st.used_bytes;
    u.evictions += st.evictions;
    u.reclaims += st.reclaims;
    u.tombstones += st.tombstones;
    u.lease_expiries += st.lease_expiries;
    u.lease_dead += st.lease_dead;
  }
  for (uint64_t i = 0; i < hdr_.nslots; i++) {
    cxlkv_index_entry e = read_entry(static_cast<uint32_t>(i));
    if (e.state < 5) u.by_state[e.state]++;
  }
  return u;
}

IndexEntryView PrefixIndex::entry(uint32_t slot) const {
  IndexEntryView v;
  if (slot >= hdr_.nslots) return v;
  cxlkv_index_entry e = read_entry(slot);
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
  // Lock-free read of the ext record: a display snapshot (rule 4 read).
  cxlkv_index_ext x = read_ext(slot);
  v.linked = (x.linked & CXLKV_EXT_LINKED) != 0;
  v.lease_count = x.lease_count;
  v.lease_node = x.lease_node;
  v.lease_start_ms = x.lease_start_ms;
  v.lease_expiry_ms = x.lease_expiry_ms;
  v.lease_consumer = x.lease_consumer;
  return v;
}

}  // namespace cxlkv
