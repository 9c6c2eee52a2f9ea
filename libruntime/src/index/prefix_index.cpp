// SPDX-License-Identifier: MIT
// PrefixIndex protocol (see prefix_index.hpp for the rules it follows).
#include "index/prefix_index.hpp"
#include "util/log.hpp"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace cxlkv {
namespace {

constexpr uint32_t kHeaderOff = 0;
constexpr uint32_t kConfigOff = 64;

uint64_t realtime_ms() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Stripe guard: unlocks on scope exit.
class StripeGuard {
 public:
  StripeGuard(StripeLocks& l, uint32_t s) : l_(l), s_(s) {}
  ~StripeGuard() { if (held_) l_.unlock(s_); }
  Result<void> lock() {
    CXLKV_TRY(l_.lock(s_));
    held_ = true;
    return {};
  }
  void unlock() {
    if (held_) l_.unlock(s_);
    held_ = false;
  }

 private:
  StripeLocks& l_;
  uint32_t s_;
  bool held_ = false;
};

constexpr uint8_t kStateDamaged = 0xff;  // in-memory only: a line whose checksum never validates

// Slots examined per eviction decision (sampled LRU over a rotating window).
constexpr uint32_t kEvictWindow = 128;

bool live_state(uint8_t s) {
  return s == CXLKV_ENTRY_WRITING || s == CXLKV_ENTRY_READY || s == CXLKV_ENTRY_EVICTING;
}

}  // namespace

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
  if (bytes <= entry_off + 64 * 64)
    return Error(-ENOSPC, "index format: carve of " + std::to_string(bytes) + " bytes is too small");
  uint64_t slots_fit = (bytes - entry_off) / 64;
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
  if (h.version != CXLKV_INDEX_VERSION)
    return Error(-EPROTO, "index carve: layout version " + std::to_string(h.version) + ", this build reads " +
                              std::to_string(CXLKV_INDEX_VERSION));
  if (!is_pow2(h.stripe_slots) || h.nstripes == 0 || h.nslots != uint64_t(h.nstripes) * h.stripe_slots ||
      h.entry_off + h.nslots * 64 > bytes || h.stats_off + uint64_t(h.max_nodes) * sizeof(cxlkv_index_node_stats) > h.entry_off ||
      h.stripe_off + uint64_t(h.nstripes) * 64 > h.stats_off || h.max_nodes == 0 || h.max_nodes > 64)
    return Error(-EUCLEAN, "index carve: inconsistent geometry (nslots " + std::to_string(h.nslots) + ", stripes " +
                               std::to_string(h.nstripes) + " x " + std::to_string(h.stripe_slots) + ")");
  if (node >= h.max_nodes)
    return Error(-EINVAL, "index: node " + std::to_string(node) + " >= max_nodes " + std::to_string(h.max_nodes));
  if (ix->cfg_.ndevices == 0 || ix->cfg_.ndevices > CXLKV_INDEX_MAX_DEVICES)
    return Error(-EUCLEAN, "index carve: config names " + std::to_string(ix->cfg_.ndevices) + " devices");
  ix->node_ = node;
  ix->inc_lo_ = static_cast<uint32_t>(incarnation);
  ix->locks_ = &locks;
  ix->live_ = &live;
  ix->space_ = &space;
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
  cxlkv_index_entry e;
  const cxlkv_index_entry* p = slot_ptr(slot);
  for (uint32_t tries = 0;; tries++) {
    probes_++;
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
    // Torn line: a writer's NT stores are landing right now; read again.
    if (tries > (1u << 20)) {
      // Not torn but damaged: report it as unusable so probes skip it and
      // nobody reuses it (bad data never crashes or hangs a reader).
      cxlkv_index_entry bad{};
      bad.state = kStateDamaged;
      return bad;
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
  d_->fence();  // rule 3: the entry is visible before the lock is released
  return e.version;
}

void PrefixIndex::write_empty(uint32_t slot) {
  static const cxlkv_index_entry zero{};
  d_->publish_line(slot_ptr(slot), &zero);  // rule 1: whole-line NT publish
  d_->fence();
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

uint32_t PrefixIndex::find_state(const BlockKey& key, uint32_t* slot_out) const {
  if (key.is_zero()) return CXLKV_ENTRY_EMPTY;
  const uint32_t s = stripe_of(key), base = s * hdr_.stripe_slots;
  uint32_t off = static_cast<uint32_t>(key.lo & (hdr_.stripe_slots - 1));
  for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
    uint32_t slot = base + ((off + i) & (hdr_.stripe_slots - 1));
    cxlkv_index_entry e = read_entry(slot);
    if (e.state == CXLKV_ENTRY_EMPTY) break;
    if (e.key_lo == key.lo && e.key_hi == key.hi && live_state(e.state)) {
      if (slot_out) *slot_out = slot;
      return e.state;
    }
  }
  return CXLKV_ENTRY_EMPTY;
}

uint32_t PrefixIndex::find_ready(const BlockKey& key, BlockLocation* loc) const {
  if (key.is_zero()) return CXLKV_INDEX_NO_SLOT;
  const uint32_t s = stripe_of(key), base = s * hdr_.stripe_slots;
  uint32_t off = static_cast<uint32_t>(key.lo & (hdr_.stripe_slots - 1));
  for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
    uint32_t slot = base + ((off + i) & (hdr_.stripe_slots - 1));
    cxlkv_index_entry e = read_entry(slot);
    if (e.state == CXLKV_ENTRY_EMPTY) break;
    if (e.key_lo == key.lo && e.key_hi == key.hi && live_state(e.state)) {
      if (e.state != CXLKV_ENTRY_READY) return CXLKV_INDEX_NO_SLOT;
      if (loc) *loc = BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
      return slot;
    }
  }
  return CXLKV_INDEX_NO_SLOT;
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

bool PrefixIndex::over_capacity(const cxlkv_index_stripe& s, uint64_t add_bytes) const {
  if (cfg_.max_blocks) {
    uint64_t per = (cfg_.max_blocks + hdr_.nstripes - 1) / hdr_.nstripes;
    if (s.used_blocks + 1 > per) return true;
  }
  if (cfg_.max_bytes) {
    uint64_t per = (cfg_.max_bytes + hdr_.nstripes - 1) / hdr_.nstripes;
    if (s.used_bytes + add_bytes > per) return true;
  }
  return false;
}

void PrefixIndex::remove_locked(uint32_t stripe, uint32_t slot, cxlkv_index_entry e, bool reclaim,
                                std::vector<uint32_t>* parents) {
  const BlockLocation loc{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  // EVICTING first: lock-free readers stop treating it as READY, and if we
  // die here the next holder of this stripe lock finds EVICTING (nobody else
  // can be mid-eviction while it holds the lock) and finishes the removal.
  if (e.state != CXLKV_ENTRY_EVICTING) {
    e.state = CXLKV_ENTRY_EVICTING;
    write_entry(slot, e);
    e.version++;
  }
  const uint32_t parent = e.parent_slot;
  cxlkv_index_stripe st = read_stripe(stripe);
  // A tombstone followed by EMPTY ends no probe that could reach further:
  // make it EMPTY, and so on backwards, so probe lengths do not grow.
  const uint32_t base = stripe * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  auto next_of = [&](uint32_t sl) { return base + ((sl - base + 1) & mask); };
  auto prev_of = [&](uint32_t sl) { return base + ((sl - base + mask) & mask); };
  if (read_entry(next_of(slot)).state == CXLKV_ENTRY_EMPTY) {
    write_empty(slot);
    uint32_t p = prev_of(slot);
    for (uint32_t k = 0; k < hdr_.stripe_slots - 1; k++, p = prev_of(p)) {
      if (read_entry(p).state != CXLKV_ENTRY_TOMBSTONE) break;
      write_empty(p);
      if (st.tombstones) st.tombstones--;
    }
  } else {
    e.state = CXLKV_ENTRY_TOMBSTONE;
    e.pin_mask = 0;
    e.children = 0;
    e.parent_slot = CXLKV_INDEX_NO_SLOT;
    write_entry(slot, e);
    st.tombstones++;
  }
  if (loc.tier == CXLKV_TIER_MEM) {  // issue 6: the capacity counts memory-tier blocks only
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
  write_stripe(stripe, st);
  // The payload is handed back only once no entry points to it.
  if (loc.tier == CXLKV_TIER_SSD) {
    if (demotion_) demotion_->release(loc);  // issue 6: an SSD block leaves the SSD tier
  } else {
    space_->free(loc);
  }
  if (parent != CXLKV_INDEX_NO_SLOT) parents->push_back(parent);
}

Result<bool> PrefixIndex::evict_locked(uint32_t stripe, std::vector<uint32_t>* parents) {
  // Issue 6: with an SSD tier, a memory block is chosen first (and demoted);
  // an SSD block is dropped only when no memory block can go.
  if (demotion_) {
    auto r = evict_pass(stripe, parents, EvictFrom::mem);
    if (!r || r.value()) return r;
  }
  return evict_pass(stripe, parents, EvictFrom::any);
}

// Issue 6: move an unpinned READY leaf's payload to the SSD tier; the entry
// stays READY (only its location changes), so lock-free readers and the
// prefix closure never see a gap.  false: not demoted, evict it instead.
bool PrefixIndex::demote_locked(uint32_t stripe, uint32_t slot, cxlkv_index_entry e,
                                std::vector<uint32_t>* parents) {
  const BlockLocation mem{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
  auto to = demotion_->demote(mem);
  if (!to && to.error().code() == -ENOSPC) {
    // SSD tier full: drop this stripe's least recently used SSD leaf, retry once.
    auto r = evict_pass(stripe, parents, EvictFrom::ssd);
    if (r && r.value()) to = demotion_->demote(mem);
  }
  if (!to) return false;
  e.loc_off = to->offset;
  e.loc_len = to->length;
  e.loc_dev = to->device;
  e.loc_tier = to->tier;
  write_entry(slot, e);  // rule 3: the SSD copy is complete (DMA done) before the entry names it
  space_->free(mem);
  cxlkv_index_stripe st = read_stripe(stripe);
  st.used_blocks -= std::min<uint64_t>(st.used_blocks, 1);  // capacity counts memory-tier blocks
  st.used_bytes -= std::min<uint64_t>(st.used_bytes, mem.length);
  write_stripe(stripe, st);
  ctr_.demotions++;
  return true;
}

Result<bool> PrefixIndex::evict_pass(uint32_t stripe, std::vector<uint32_t>* parents, EvictFrom from) {
  // Sampled LRU: examine windows of kEvictWindow slots from a rotating hand
  // and evict the least recently used unpinned READY leaf of the first
  // window that has one.  A dead writer's leaf entry is reclaimed at once.
  const uint32_t base = stripe * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  const uint32_t now = now_ms();
  uint32_t& hand = stripe_hands_[stripe];
  uint32_t scanned = 0;
  while (scanned < hdr_.stripe_slots) {
    uint32_t victim = CXLKV_INDEX_NO_SLOT;
    uint32_t best_age = 0;
    const uint32_t window = std::min(kEvictWindow, hdr_.stripe_slots - scanned);
    for (uint32_t i = 0; i < window; i++) {
      uint32_t slot = base + ((hand + i) & mask);
      cxlkv_index_entry e = read_entry(slot);
      if (e.state == CXLKV_ENTRY_EVICTING) {
        // Only a holder of this lock evicts: an EVICTING entry is the
        // leftover of an evictor that died; finish its removal.
        remove_locked(stripe, slot, e, /*reclaim=*/true, parents);
        return true;
      }
      // prefix closure: only leaves go (issue 6: any block may be demoted,
      // it stays cached; a non-leaf that cannot be demoted stays put below)
      if (e.children != 0 && from != EvictFrom::mem) continue;
      if (e.state == CXLKV_ENTRY_WRITING && e.children == 0 && writer_dead(e)) {
        remove_locked(stripe, slot, e, /*reclaim=*/true, parents);  // dead writer: reclaim first
        return true;
      }
      if (e.state != CXLKV_ENTRY_READY) continue;
      if ((from == EvictFrom::mem && e.loc_tier != CXLKV_TIER_MEM) ||
          (from == EvictFrom::ssd && e.loc_tier != CXLKV_TIER_SSD))
        continue;  // issue 6: this pass looks at one tier only
      bool changed = false;
      if (pins_live(e, &changed)) continue;
      if (changed) write_entry(slot, e, false);  // dead nodes' pins cleared
      uint32_t age = now - e.lru_ms;
      if (victim == CXLKV_INDEX_NO_SLOT || age > best_age) {
        victim = slot;
        best_age = age;
      }
    }
    hand = (hand + window) & mask;
    scanned += window;
    if (victim != CXLKV_INDEX_NO_SLOT) {
      cxlkv_index_entry ve = read_entry(victim);
      if (demotion_ && from != EvictFrom::ssd && ve.loc_tier == CXLKV_TIER_MEM &&
          demote_locked(stripe, victim, ve, parents))
        return true;  // issue 6: kept on the SSD tier instead of dropped
      if (ve.children != 0) return false;  // issue 6: a block with cached children is never dropped
      remove_locked(stripe, victim, ve, /*reclaim=*/false, parents);
      return true;
    }
  }
  return false;
}

Result<void> PrefixIndex::drop_child(uint32_t parent_slot) {
  if (parent_slot >= hdr_.nslots) return {};
  const uint32_t s = parent_slot / hdr_.stripe_slots;
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  cxlkv_index_entry e = read_entry(parent_slot);
  if (live_state(e.state) && e.children > 0) {
    e.children--;
    write_entry(parent_slot, e, false);
  }
  return {};
}

Result<uint32_t> PrefixIndex::add_child(const BlockKey& parent) {
  const uint32_t s = stripe_of(parent);
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  uint32_t slot;
  uint32_t st = find_state(parent, &slot);
  if (st != CXLKV_ENTRY_READY && st != CXLKV_ENTRY_WRITING)
    return Error(-ENOENT, "index: parent block " + to_hex(parent) + " is not cached");
  cxlkv_index_entry e = read_entry(slot);
  e.children++;
  write_entry(slot, e, false);
  return slot;
}

Result<Reservation> PrefixIndex::reserve(const BlockKey& key, const BlockKey* parent, uint64_t bytes) {
  if (key.is_zero()) return Error(-EINVAL, "index: the all-zero block key is reserved");
  if (parent && parent->is_zero()) return Error(-EINVAL, "index: the all-zero parent key is reserved");
  if (parent && *parent == key) return Error(-EINVAL, "index: block " + to_hex(key) + " is its own parent");
  if (bytes == 0 || bytes > UINT32_MAX)
    return Error(-EINVAL, "index: block " + to_hex(key) + ": payload length " + std::to_string(bytes) +
                              " is not 1 .. 4 GiB-1");
  // Cheap lock-free pre-check: most reserves of a shared prefix find it cached.
  uint32_t pre = find_state(key);
  if (pre == CXLKV_ENTRY_READY) {
    Reservation r;
    r.status = ReserveStatus::exists_ready;
    r.slot = find_ready(key, &r.loc);
    if (r.slot != CXLKV_INDEX_NO_SLOT) {
      r.version = entry(r.slot).version;
      return r;
    }
  }

  uint32_t parent_slot = CXLKV_INDEX_NO_SLOT;
  if (parent) {
    auto ps = add_child(*parent);  // parent cannot be evicted from here on
    if (!ps) return ps.error();
    parent_slot = ps.value();
  }
  std::vector<uint32_t> parents;
  auto finish = [&](Result<Reservation> r) -> Result<Reservation> {
    bool keep_link = r.ok() && r.value().status == ReserveStatus::reserved;
    if (parent_slot != CXLKV_INDEX_NO_SLOT && !keep_link) parents.push_back(parent_slot);
    for (uint32_t p : parents) (void)drop_child(p);
    return r;
  };

  const uint32_t s = stripe_of(key), base = s * hdr_.stripe_slots;
  const uint32_t off = static_cast<uint32_t>(key.lo & (hdr_.stripe_slots - 1));
  for (int attempt = 0;; attempt++) {
    StripeGuard g(*locks_, s);
    // Parent links are dropped with no stripe lock held (one lock at a time).
    auto done = [&](Result<Reservation> r) -> Result<Reservation> {
      g.unlock();
      return finish(std::move(r));
    };
    if (auto l = g.lock(); !l) return done(l.error());
    // Probe: the key if present, else the first reusable slot.
    uint32_t free_slot = CXLKV_INDEX_NO_SLOT;
    bool found = false;
    for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
      uint32_t slot = base + ((off + i) & (hdr_.stripe_slots - 1));
      cxlkv_index_entry e = read_entry(slot);
      if (e.state == CXLKV_ENTRY_EMPTY) {
        if (free_slot == CXLKV_INDEX_NO_SLOT) free_slot = slot;
        break;
      }
      if (e.state == CXLKV_ENTRY_TOMBSTONE) {
        if (free_slot == CXLKV_INDEX_NO_SLOT) free_slot = slot;
        continue;
      }
      if (e.key_lo != key.lo || e.key_hi != key.hi) continue;
      found = true;
      if (e.state == CXLKV_ENTRY_WRITING && writer_dead(e)) {
        // The writer died mid-write: nothing was visible; reclaim and retry.
        if (e.children == 0) {
          remove_locked(s, slot, e, /*reclaim=*/true, &parents);
        } else if (attempt < 4) {
          // Its chain continues below: unwind the dead writer's leaves first.
          g.unlock();
          (void)reclaim_dead();
        }
        if (attempt < 4) break;
      }
      Reservation r;
      r.slot = slot;
      r.loc = BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
      r.status = e.state == CXLKV_ENTRY_READY ? ReserveStatus::exists_ready : ReserveStatus::busy;
      r.version = e.version;
      return done(r);  // never written twice
    }
    if (found) continue;  // reclaimed a dead writer's entry: probe again

    cxlkv_index_stripe st = read_stripe(s);
    if (free_slot == CXLKV_INDEX_NO_SLOT || over_capacity(st, bytes)) {
      auto ev = evict_locked(s, &parents);
      if (!ev) return done(ev.error());
      if (ev.value()) continue;
      return done(Error(-ENOSPC, "index: no space for block " + to_hex(key) + ": stripe " + std::to_string(s) +
                                       (free_slot == CXLKV_INDEX_NO_SLOT ? " has no free slot" : " is at its capacity share") +
                                       " and every block in it is pinned, being written or has cached children"));
    }
    auto loc = space_->alloc(bytes);
    if (!loc) {
      if (loc.error().code() != -ENOSPC) return done(loc.error());
      log().debug("index: evicting for space: {}", loc.error().message());
      // Payload space is full: evict here first, then elsewhere (one stripe lock at a time).
      auto ev = evict_locked(s, &parents);
      if (!ev) return done(ev.error());
      if (ev.value()) continue;
      g.unlock();
      bool freed = false;
      for (uint32_t k = 0; k < hdr_.nstripes && !freed; k++) {
        uint32_t other = (evict_hand_++) % hdr_.nstripes;
        if (other == s) continue;
        StripeGuard og(*locks_, other);
        if (auto l = og.lock(); !l) return done(l.error());
        auto oe = evict_locked(other, &parents);
        if (!oe) return done(oe.error());
        freed = oe.value();
      }
      if (freed && attempt < 64) continue;
      return done(Error(-ENOSPC, "index: no space for block " + to_hex(key) + " (" + std::to_string(bytes) +
                                       " bytes): payload space is full and every block is pinned, being written "
                                       "or has cached children"));
    }
    cxlkv_index_entry e{};
    cxlkv_index_entry old = read_entry(free_slot);
    e.version = old.version;
    e.key_lo = key.lo;
    e.key_hi = key.hi;
    e.loc_off = loc->offset;
    e.loc_len = loc->length;
    e.loc_dev = loc->device;
    e.loc_tier = loc->tier;
    e.state = CXLKV_ENTRY_WRITING;
    e.owner_node = static_cast<uint8_t>(node_);
    e.owner_inc = inc_lo_;
    e.parent_slot = parent_slot;
    e.lru_ms = now_ms();
    const uint32_t ver = write_entry(free_slot, e);
    if (old.state == CXLKV_ENTRY_TOMBSTONE && st.tombstones) st.tombstones--;
    st.used_blocks++;
    st.used_bytes += loc->length;
    write_stripe(s, st);
    Reservation r;
    r.status = ReserveStatus::reserved;
    r.slot = free_slot;
    r.loc = loc.value();
    r.version = ver;
    return done(r);
  }
}

Result<void> PrefixIndex::publish(uint32_t slot, const BlockKey& key) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: publish of slot " + std::to_string(slot) + " out of range");
  const uint32_t s = slot / hdr_.stripe_slots;
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  cxlkv_index_entry e = read_entry(slot);
  if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_WRITING || e.owner_node != node_ ||
      e.owner_inc != inc_lo_)
    return Error(-ESTALE, "index: block " + to_hex(key) + " at slot " + std::to_string(slot) +
                              " is not reserved by this node (state " + std::to_string(e.state) + ")");
  if (e.parent_slot != CXLKV_INDEX_NO_SLOT) {
    // Prefix closure: a child becomes READY only after its parent.  The
    // parent cannot disappear (our children count pins it).
    cxlkv_index_entry p = read_entry(e.parent_slot);
    if (p.state == CXLKV_ENTRY_WRITING) {
      if (!live_->alive(p.owner_node, p.owner_inc) && !(p.owner_node == node_ && p.owner_inc == inc_lo_))
        return Error(-EOWNERDEAD, "index: parent of block " + to_hex(key) + " was being written by dead node " +
                                      std::to_string(p.owner_node));
      return Error(-EAGAIN, "index: parent of block " + to_hex(key) + " is not published yet");
    }
    if (p.state != CXLKV_ENTRY_READY)
      return Error(-EUCLEAN, "index: parent of block " + to_hex(key) + " is in state " + std::to_string(p.state));
  }
  // rule 3 / rule 5: the caller flushed and fenced the payload; this entry
  // write is the visibility boundary.
  e.state = CXLKV_ENTRY_READY;
  e.lru_ms = now_ms();
  write_entry(slot, e);
  return {};
}

Result<void> PrefixIndex::abort(uint32_t slot, const BlockKey& key) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: abort of slot " + std::to_string(slot) + " out of range");
  const uint32_t s = slot / hdr_.stripe_slots;
  std::vector<uint32_t> parents;
  {
    StripeGuard g(*locks_, s);
    CXLKV_TRY(g.lock());
    cxlkv_index_entry e = read_entry(slot);
    if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_WRITING || e.owner_node != node_ ||
        e.owner_inc != inc_lo_)
      return Error(-ESTALE, "index: abort of block " + to_hex(key) + ": not reserved by this node");
    if (e.children)
      return Error(-EBUSY, "index: abort of block " + to_hex(key) + ": " + std::to_string(e.children) +
                               " children reserved below it (abort them first)");
    remove_locked(s, slot, e, /*reclaim=*/true, &parents);
  }
  for (uint32_t p : parents) CXLKV_TRY(drop_child(p));
  return {};
}

Result<BlockLocation> PrefixIndex::pin(const BlockKey& key, uint32_t* slot_out) {
  if (key.is_zero()) return Error(-EINVAL, "index: the all-zero block key is reserved");
  // Lock-free fast path: our node bit already pins it.
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    BlockLocation loc;
    uint32_t slot = find_ready(key, &loc);
    if (slot != CXLKV_INDEX_NO_SLOT) {
      auto it = local_pins_.find(slot);
      if (it != local_pins_.end() && it->second > 0) {
        it->second++;
        if (slot_out) *slot_out = slot;
        return loc;
      }
    }
  }
  const uint32_t s = stripe_of(key);
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  uint32_t slot;
  if (find_state(key, &slot) != CXLKV_ENTRY_READY)
    return Error(-ENOENT, "index: block " + to_hex(key) + " is not cached");
  cxlkv_index_entry e = read_entry(slot);
  e.pin_mask |= 1ULL << node_;
  e.lru_ms = now_ms();
  write_entry(slot, e, false);
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    local_pins_[slot]++;
  }
  if (slot_out) *slot_out = slot;
  return BlockLocation{e.loc_off, e.loc_len, e.loc_dev, e.loc_tier};
}

Result<void> PrefixIndex::unpin(uint32_t slot, const BlockKey& key) {
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    auto it = local_pins_.find(slot);
    if (it == local_pins_.end() || it->second == 0)
      return Error(-EINVAL, "index: unpin of block " + to_hex(key) + " that this process has not pinned");
    if (--it->second > 0) return {};
    local_pins_.erase(it);
  }
  const uint32_t s = slot / hdr_.stripe_slots;
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  cxlkv_index_entry e = read_entry(slot);
  if (e.key_lo != key.lo || e.key_hi != key.hi)
    return Error(-ESTALE, "index: unpin of block " + to_hex(key) + ": slot now holds another block");
  e.pin_mask &= ~(1ULL << node_);
  write_entry(slot, e, false);
  return {};
}

Result<bool> PrefixIndex::relocate(uint32_t slot, const BlockKey& key, const BlockLocation& from,
                                   const BlockLocation& to) {
  if (slot >= hdr_.nslots) return Error(-EINVAL, "index: slot " + std::to_string(slot) + " out of range");
  const uint32_t s = slot / hdr_.stripe_slots;
  StripeGuard g(*locks_, s);
  CXLKV_TRY(g.lock());
  cxlkv_index_entry e = read_entry(slot);
  if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_READY || e.loc_off != from.offset ||
      e.loc_dev != from.device || e.loc_tier != from.tier)
    return false;  // evicted or moved meanwhile
  // pin_mu_ keeps this process's lock-free pin fast path from handing out
  // `from` while the entry changes.
  std::lock_guard<std::mutex> lk(pin_mu_);
  auto it = local_pins_.find(slot);
  if (e.pin_mask != (1ULL << node_) || it == local_pins_.end() || it->second != 1) return false;
  cxlkv_index_stripe st = read_stripe(s);
  if (to.tier == CXLKV_TIER_MEM && over_capacity(st, to.length))
    return false;  // would exceed the memory capacity share
  e.loc_off = to.offset;
  e.loc_len = to.length;
  e.loc_dev = to.device;
  e.loc_tier = to.tier;
  write_entry(slot, e);  // rule 3: the caller fenced the new payload before this
  if (to.tier == CXLKV_TIER_MEM) {
    st.used_blocks++;
    st.used_bytes += to.length;
    write_stripe(s, st);
  }
  ctr_.promotions++;
  return true;
}

Result<bool> PrefixIndex::evict_one(uint32_t stripe) {
  if (stripe >= hdr_.nstripes) return Error(-EINVAL, "index: stripe " + std::to_string(stripe) + " out of range");
  std::vector<uint32_t> parents;
  Result<bool> r = false;
  {
    StripeGuard g(*locks_, stripe);
    CXLKV_TRY(g.lock());
    r = evict_locked(stripe, &parents);
  }
  for (uint32_t p : parents) CXLKV_TRY(drop_child(p));
  return r;
}

Result<uint64_t> PrefixIndex::reclaim_dead() {
  uint64_t n = 0;
  // Leaves first; a dead writer's chain unwinds over repeated passes.
  for (int pass = 0; pass < 64; pass++) {
    uint64_t this_pass = 0;
    for (uint32_t s = 0; s < hdr_.nstripes; s++) {
      std::vector<uint32_t> parents;
      {
        StripeGuard g(*locks_, s);
        CXLKV_TRY(g.lock());
        for (uint32_t i = 0; i < hdr_.stripe_slots; i++) {
          uint32_t slot = s * hdr_.stripe_slots + i;
          cxlkv_index_entry e = read_entry(slot);
          if (e.state == CXLKV_ENTRY_WRITING && e.children == 0 && writer_dead(e)) {
            remove_locked(s, slot, e, true, &parents);
            this_pass++;
          } else if (e.state == CXLKV_ENTRY_READY && e.pin_mask) {
            bool changed = false;
            pins_live(e, &changed);
            if (changed) {
              write_entry(slot, e, false);
              this_pass++;
            }
          }
        }
      }
      for (uint32_t p : parents) CXLKV_TRY(drop_child(p));
    }
    n += this_pass;
    if (this_pass == 0) break;
  }
  return n;
}

IndexUsage PrefixIndex::usage() const {
  IndexUsage u;
  u.slots = hdr_.nslots;
  u.stripes = hdr_.nstripes;
  for (uint32_t s = 0; s < hdr_.nstripes; s++) {
    cxlkv_index_stripe st = read_stripe(s);
    u.used_blocks += st.used_blocks;
    u.used_bytes += st.used_bytes;
    u.evictions += st.evictions;
    u.reclaims += st.reclaims;
    u.tombstones += st.tombstones;
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
  return v;
}

}  // namespace cxlkv
