// SPDX-License-Identifier: MIT
// Index carve layout: format, attach (geometry checks) and the codec of its
// lines (entries, stripe lines, ext records) under the coherence contract.
#include "index/index_internal.hpp"
#include "index/index_check.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/prefix_index.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

namespace cxlkv {

Result<void> index_format(MemoryDomain& d, void* carve, uint64_t bytes, const IndexFormatOptions& o) {
  if (!carve) return Error(-EINVAL, "index format: no carve");
  if (o.max_nodes == 0 || o.max_nodes > 64)
    return Error(-EINVAL, "index format: max_nodes " + std::to_string(o.max_nodes) + " is not 1..64");
  if (o.ndevices == 0 || o.ndevices > CXLKV_INDEX_MAX_DEVICES)
    return Error(-EINVAL, "index format: ndevices " + std::to_string(o.ndevices) + " is not 1..8");
  if (o.interleave_stripe == 0 || o.interleave_stripe % 64)
    return Error(-EINVAL, "index format: interleave stripe must be a non-zero multiple of 64");
  const uint64_t stripe_off = 128;
  if (o.max_stripes == 0) return Error(-EINVAL, "index format: max_stripes is 0");
  const uint64_t stats_off = align_up(stripe_off + uint64_t(o.max_stripes) * 64, 64);
  const uint64_t entry_off = align_up(stats_off + uint64_t(o.max_nodes) * sizeof(cxlkv_index_node_stats), 4096);
  // Each slot takes a 64 B entry and a 32 B ext record (after a 4 KiB boundary).
  if (bytes <= entry_off + 4096 + 64 * 96)
    return Error(-ENOSPC, "index format: carve of " + std::to_string(bytes) + " bytes is too small");
  uint64_t slots_fit = (bytes - entry_off - 4096) / 96;
  uint32_t stripe_slots = o.stripe_slots;
  if (stripe_slots == 0) {
    stripe_slots = 64;
    while (slots_fit / stripe_slots > o.max_stripes) stripe_slots *= 2;
  }
  if (!is_pow2(stripe_slots) || stripe_slots > (1u << 20))
    return Error(-EINVAL, "index format: stripe_slots " + std::to_string(stripe_slots) + " is not a power of two <= 2^20");
  uint64_t nstripes = std::min<uint64_t>(slots_fit / stripe_slots, o.max_stripes);
  if (nstripes == 0) return Error(-ENOSPC, "index format: carve too small for one stripe");

  // Zero everything (rule 3: stores, then flush every line, then the header).
  std::vector<std::byte> zero(1 << 16);
  for (uint64_t off = 0; off < bytes; off += zero.size()) {
    uint64_t n = std::min<uint64_t>(zero.size(), bytes - off);
    d.copy_to_pool(static_cast<std::byte*>(carve) + off, zero.data(), n);
  }
  // Zero lines are empty eviction lists and unlinked, unleased ext records.
  d.fence();  // rule 3: zeroed table in memory before the header says "formatted"

  cxlkv_index_config cfg{};
  cfg.max_blocks = o.max_blocks;
  cfg.max_bytes = o.max_bytes;
  cfg.epoch_ms = realtime_ms();
  cfg.interleave_stripe = o.interleave_stripe;
  cfg.ndevices = o.ndevices;
  for (unsigned i = 0; i < CXLKV_INDEX_MAX_DEVICES; i++) cfg.weights[i] = o.weights[i];
  d.publish_line(static_cast<std::byte*>(carve) + kConfigOff, &cfg);

  cxlkv_index_header h{};
  h.magic = CXLKV_INDEX_MAGIC;
  h.version = CXLKV_INDEX_VERSION;
  h.max_nodes = o.max_nodes;
  h.nslots = nstripes * stripe_slots;
  h.stripe_slots = stripe_slots;
  h.nstripes = static_cast<uint32_t>(nstripes);
  h.stripe_off = stripe_off;
  h.stats_off = stats_off;
  h.entry_off = entry_off;
  h.lock_base = o.lock_base;
  h.checksum = cxlkv_index_header_checksum(&h);  // checked at attach
  d.fence();  // rule 3: config before the header
  d.publish_line(static_cast<std::byte*>(carve) + kHeaderOff, &h);
  d.fence();
  return {};
}

Result<cxlkv_index_config> index_policy(MemoryDomain& d, const void* carve) {
  if (!carve) return Error(-EINVAL, "index: no carve");
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(static_cast<const std::byte*>(carve) + kHeaderOff));
  if (h.magic != CXLKV_INDEX_MAGIC) return Error(-ENODATA, "index carve is not formatted (run `cxlkvctl format`)");
  return d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(static_cast<const std::byte*>(carve) + kConfigOff));
}

Result<void> index_set_policy(MemoryDomain& d, void* carve, const IndexPolicy& p) {
  auto cur = index_policy(d, carve);
  if (!cur) return cur.error();
  if (p.ndevices == 0 || p.ndevices > CXLKV_INDEX_MAX_DEVICES)
    return Error(-EINVAL, "index policy: ndevices " + std::to_string(p.ndevices) + " is not 1..8");
  if (p.interleave_stripe == 0 || p.interleave_stripe % 64)
    return Error(-EINVAL, "index policy: interleave stripe must be a non-zero multiple of 64");
  cxlkv_index_config c = cur.value();
  c.max_blocks = p.max_blocks;
  c.max_bytes = p.max_bytes;
  c.interleave_stripe = p.interleave_stripe;
  c.ndevices = p.ndevices;
  for (unsigned i = 0; i < CXLKV_INDEX_MAX_DEVICES; i++) c.weights[i] = p.weights[i] ? p.weights[i] : 1;
  d.publish_line(static_cast<std::byte*>(carve) + kConfigOff, &c);  // rule 1: whole line, NT
  d.fence();
  return {};
}

// The bound is operator-written while nodes run: an index that kept the
// value it read at attach ignored a bound set after it opened (a KV store
// opened before `cxlkvctl kv ... --mem-capacity` filled the whole kv carve
// and then evicted only when the allocator failed).  One fresh read of the
// config line (rule 4) per kCapacityRefreshMs; the fields are written only
// when they changed (8-byte atomic stores: other threads of this process
// may be reading them in over_capacity()).
void PrefixIndex::refresh_capacity() {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = capacity_read_ms_.load(std::memory_order_relaxed);
  if (now - last < kCapacityRefreshMs || !capacity_read_ms_.compare_exchange_strong(last, now)) return;
  const cxlkv_index_config c = d_->read_fresh(reinterpret_cast<const cxlkv_index_config*>(carve_ + kConfigOff));
  if (c.max_blocks != cfg_.max_blocks) __atomic_store_n(&cfg_.max_blocks, c.max_blocks, __ATOMIC_RELAXED);
  if (c.max_bytes != cfg_.max_bytes) __atomic_store_n(&cfg_.max_bytes, c.max_bytes, __ATOMIC_RELAXED);
}

Result<std::unique_ptr<PrefixIndex>> PrefixIndex::attach(MemoryDomain& d, void* carve, uint64_t bytes,
                                                         uint32_t node, uint64_t incarnation,
                                                         StripeLocks& locks, NodeLiveness& live,
                                                         PayloadSpace& space) {
  if (!carve) return Error(-EINVAL, "index: no index carve");
  if (bytes < 128) return Error(-EINVAL, "index: carve of " + std::to_string(bytes) + " bytes is too small");
  std::unique_ptr<PrefixIndex> ix(new PrefixIndex());
  ix->d_ = &d;
  ix->carve_ = static_cast<std::byte*>(carve);
  ix->bytes_ = bytes;
  ix->hdr_ = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(ix->carve_ + kHeaderOff));  // rule 4
  ix->cfg_ = d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(ix->carve_ + kConfigOff));
  const auto& h = ix->hdr_;
  if (h.magic != CXLKV_INDEX_MAGIC)
    return Error(-ENODATA, "index carve is not formatted (magic 0x" + [&] {
      char b[20];
      std::snprintf(b, sizeof b, "%016llx", (unsigned long long)h.magic);
      return std::string(b);
    }() + ", run `cxlkvctl format`)");
  CXLKV_TRY(check_index_header(h, bytes, "index carve: "));  // fields, then checksum
  if (node >= h.max_nodes)
    return Error(-EINVAL, "index: node " + std::to_string(node) + " >= max_nodes " + std::to_string(h.max_nodes));
  if (ix->cfg_.ndevices == 0 || ix->cfg_.ndevices > CXLKV_INDEX_MAX_DEVICES)
    return Error(-EUCLEAN, "index carve: config names " + std::to_string(ix->cfg_.ndevices) + " devices");
  ix->node_ = node;
  ix->inc_lo_ = static_cast<uint32_t>(incarnation);
  ix->locks_ = &locks;
  ix->live_ = &live;
  ix->space_ = &space;
  ix->ext_off_ = cxlkv_index_ext_off(&h);
  ix->stripe_hands_.assign(h.nstripes, 0);
  return ix;
}

cxlkv_index_entry* PrefixIndex::slot_ptr(uint32_t slot) const {
  return reinterpret_cast<cxlkv_index_entry*>(carve_ + hdr_.entry_off + uint64_t(slot) * 64);
}

cxlkv_index_stripe* PrefixIndex::stripe_ptr(uint32_t stripe) const {
  return reinterpret_cast<cxlkv_index_stripe*>(carve_ + hdr_.stripe_off + uint64_t(stripe) * 64);
}

uint32_t PrefixIndex::stripe_of(const BlockKey& k) const { return static_cast<uint32_t>(k.hi % hdr_.nstripes); }

uint32_t PrefixIndex::home(const BlockKey& k) const {
  return stripe_of(k) * hdr_.stripe_slots + static_cast<uint32_t>(k.lo & (hdr_.stripe_slots - 1));
}

uint32_t PrefixIndex::now_ms() const { return static_cast<uint32_t>(realtime_ms() - cfg_.epoch_ms); }

cxlkv_index_entry PrefixIndex::read_entry(uint32_t slot) const {
  // Under a lock set holding the slot's stripe: memory once per hold, then
  // the set's copy (stripe_lock_set.hpp "Line cache": rule 4 + rule 7).
  StripeLockSet* ls = StripeLockSet::holding(this, slot);
  if (ls)
    if (const cxlkv_index_entry* c = ls->cached_entry(slot)) return *c;
  cxlkv_index_entry e = read_entry_fresh(slot);
  if (ls && e.state != kStateDamaged) ls->put_entry(slot, e);
  return e;
}

cxlkv_index_entry PrefixIndex::read_entry_fresh(uint32_t slot) const {
  cxlkv_index_entry e;
  const cxlkv_index_entry* p = slot_ptr(slot);
  for (uint32_t tries = 0;; tries++) {
    probes_.fetch_add(1, std::memory_order_relaxed);
    // rule 4: invalidate the line and fence before loading it.
    d_->invalidate(p, sizeof e);
    d_->fence();
    d_->load(&e, p, sizeof e);
    if (e.check == 0) {
      // Only an all-zero line (never used) is valid without a checksum.
      static const cxlkv_index_entry zero{};
      if (std::memcmp(&e, &zero, sizeof e) == 0) return e;
    } else if (e.check == cxlkv_index_entry_check(&e)) {
      return e;
    }
    // Torn line: a writer's NT stores are landing right now; read again a
    // few times, then settle it (index_damage.cpp: one bounded retry, then
    // remembered as damaged: never 2^20 re-reads, never a hang).
    if (tries == 0 && damaged_known(slot, e)) return damaged_entry();
    if (tries >= kTornRereads) {
      if (settle_bad_line(slot, &e)) return e;
      return damaged_entry();
    }
  }
}

uint32_t PrefixIndex::write_entry(uint32_t slot, cxlkv_index_entry e, bool bump) {
  // The version changes with the block's identity, state or location only
  // (not with pins, children, recency), so a pin or reservation stays valid
  // (still_valid) while only bookkeeping changes.
  if (bump) e.version++;
  e.check = cxlkv_index_entry_check(&e);
  // rule 1: entry lines have many writers over time: one whole-line NT publish.
  d_->publish_line(slot_ptr(slot), &e);
  if (StripeLockSet* ls = StripeLockSet::holding(this, slot)) {
    ls->put_entry(slot, e);
    // rule 3: a block left WRITING or READY is fenced with the set's other
    // writes at release, before the unlock; a removal (EVICTING, TOMBSTONE)
    // is fenced now, before the payload it named is freed.
    if (e.state == CXLKV_ENTRY_WRITING || e.state == CXLKV_ENTRY_READY) {
      ls->defer_fence();
      return e.version;
    }
  }
  d_->fence();  // rule 3: the entry is visible before the lock is released
  return e.version;
}

void PrefixIndex::write_empty(uint32_t slot) {
  static const cxlkv_index_entry zero{};
  d_->publish_line(slot_ptr(slot), &zero);  // rule 1: whole-line NT publish
  d_->fence();
  if (StripeLockSet* ls = StripeLockSet::holding(this, slot)) ls->put_entry(slot, zero);
}

cxlkv_index_stripe PrefixIndex::read_stripe(uint32_t stripe) const {
  return d_->read_fresh(stripe_ptr(stripe));  // rule 4
}

void PrefixIndex::write_stripe(uint32_t stripe, const cxlkv_index_stripe& s) {
  d_->publish_line(stripe_ptr(stripe), &s);  // rule 1: written by many nodes
  d_->fence();
}

bool PrefixIndex::writer_dead(const cxlkv_index_entry& e) {
  if (e.owner_node == node_ && e.owner_inc == inc_lo_) return false;
  return !live_->alive(e.owner_node, e.owner_inc);
}

// Drop pin bits of dead nodes; true if live pins remain.
bool PrefixIndex::pins_live(cxlkv_index_entry& e, bool* changed) {
  uint64_t m = e.pin_mask;
  while (m) {
    unsigned n = __builtin_ctzll(m);
    m &= m - 1;
    if (n == node_) continue;  // our own bit: we are alive
    if (!live_->node_alive(n)) {
      e.pin_mask &= ~(1ULL << n);
      *changed = true;
    }
  }
  return e.pin_mask != 0;
}

cxlkv_index_ext* PrefixIndex::ext_ptr(uint32_t slot) const {
  return reinterpret_cast<cxlkv_index_ext*>(carve_ + ext_off_ + uint64_t(slot) * sizeof(cxlkv_index_ext));
}

std::vector<cxlkv_index_stripe> PrefixIndex::read_stripes() const {
  std::vector<cxlkv_index_stripe> v(hdr_.nstripes);
  // rule 4 for a range: invalidate every line of it, one fence, then load.
  // The fence orders all the invalidations before all the loads, so one
  // sweep serves every line (this is how any window is read in one go).
  d_->invalidate(stripe_ptr(0), uint64_t(hdr_.nstripes) * 64);
  d_->fence();
  d_->load(v.data(), stripe_ptr(0), uint64_t(hdr_.nstripes) * 64);
  return v;
}

cxlkv_index_ext PrefixIndex::read_ext(uint32_t slot) const {
  StripeLockSet* ls = StripeLockSet::holding(this, slot);  // line cache (stripe_lock_set.hpp)
  if (ls)
    if (const cxlkv_index_ext* c = ls->cached_ext(slot)) return *c;
  // rule 4: only lock holders write ext records, and the caller holds the
  // stripe lock, so one invalidate + fence + load sees the last holder's NT
  // stores.  The whole line: its other record is of the same stripe.
  cxlkv_index_ext x[2];
  const uint32_t even = slot & ~1u;
  d_->invalidate(ext_ptr(even), sizeof x);
  d_->fence();
  d_->load(x, ext_ptr(even), sizeof x);
  if (ls) {
    ls->put_ext(even, x[0]);
    ls->put_ext(even | 1u, x[1]);
  }
  return x[slot & 1u];
}

void PrefixIndex::write_ext(uint32_t slot, const cxlkv_index_ext& x) {
  StripeLockSet* ls = StripeLockSet::holding(this, slot);
  const cxlkv_index_ext* other = ls ? ls->cached_ext(slot ^ 1u) : nullptr;
  if (other) {
    // rule 1: the line's two records are of one stripe, written only under
    // its lock (rule 7), which this set holds, and the other record is
    // known as memory has it: the whole line in one NT store writes back
    // exactly that (a partial-line NT store costs a partial write-combining
    // flush, ~0.2 us here).
    cxlkv_index_ext line[2];
    line[slot & 1u] = x;
    line[(slot & 1u) ^ 1u] = *other;
    d_->store_nt(ext_ptr(slot & ~1u), line, sizeof line);  // one aligned line: one full-line NT store
  } else {
    // rule 1: a line of two records with many writers over time: NT stores only.
    d_->store_nt(ext_ptr(slot), &x, sizeof x);
  }
  // Fenced by StripeLockSet::release() before the stripe line is cleaned (rule 3).
  if (ls) {
    ls->put_ext(slot, x);
    ls->defer_fence();
  }
}

uint32_t PrefixIndex::probe(const BlockKey& key, cxlkv_index_entry* out, uint32_t* free_slot, bool* ghost) const {
  if (free_slot) *free_slot = CXLKV_INDEX_NO_SLOT;
  if (ghost) *ghost = false;
  if (key.is_zero()) return CXLKV_INDEX_NO_SLOT;
  const uint32_t base = stripe_of(key) * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  const uint32_t off = static_cast<uint32_t>(key.lo & mask);
  for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
    uint32_t slot = base + ((off + i) & mask);
    cxlkv_index_entry e = read_entry(slot);
    if (e.state == CXLKV_ENTRY_EMPTY) {
      if (free_slot && *free_slot == CXLKV_INDEX_NO_SLOT) *free_slot = slot;
      break;
    }
    if (e.state == CXLKV_ENTRY_TOMBSTONE) {
      // A pending drop is not free: it still counts as its parent's child.
      if (free_slot && *free_slot == CXLKV_INDEX_NO_SLOT && !pending_drop(e, hdr_.nslots)) *free_slot = slot;
      if (ghost && e.key_lo == key.lo && e.key_hi == key.hi) *ghost = true;  // evicted before (index_evict.cpp)
      continue;
    }
    if (e.key_lo == key.lo && e.key_hi == key.hi && live_index_state(e.state)) {
      if (out) *out = e;
      return slot;
    }
  }
  return CXLKV_INDEX_NO_SLOT;
}
}  // namespace cxlkv
