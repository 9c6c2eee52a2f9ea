// SPDX-License-Identifier: MIT
// PrefixIndex batch calls (docs/coherence.md "PrefixIndex batch interface").
//
// Each call takes the stripe locks of all its blocks once, together, in
// ascending order (StripeLockSet), does its work in the given order, and releases
// them; a stripe line changed by the call is written once, at release.
// reserve_chain makes room ahead of demand (pool-wide eviction, one stripe
// lock at a time) before it takes its set; only when the pool is still full
// under the set (a race with other reservers, or payload space that the
// capacity limits do not cover) does it release the set, evict elsewhere and
// take the set of the remaining blocks again (bounded).
#include <algorithm>
#include <string>

#include "index/index_internal.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/node_pins.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

constexpr uint32_t kNo = CXLKV_INDEX_NO_SLOT;
// Lock-set rounds a reserve into a full pool always gets; more only while
// evicting still makes room (reserve_chain_once).
constexpr int kReserveRounds = 8;

// Probes of a sparse table end within a line or two of the home slot: the
// lines a call reads in the StripeLockSet's one sweep (stripe_lock_set.hpp "Line cache").
constexpr uint32_t kPrefetchProbe = 2;

}  // namespace

void PrefixIndex::probe_lines(const BlockKey& key, std::vector<uint32_t>& out) const {
  const uint32_t base = stripe_of(key) * hdr_.stripe_slots, mask = hdr_.stripe_slots - 1;
  const uint32_t off = static_cast<uint32_t>(key.lo & mask);
  for (uint32_t i = 0; i < kPrefetchProbe && i < hdr_.stripe_slots; i++) out.push_back(base + ((off + i) & mask));
}

// Walks key's probe sequence over the lines `ls` has cached: the slot where
// probe() will stop (the key's, or the first free one for a new key), or
// kNo with *missing = the first slot whose line is not cached yet.
static uint32_t walk_cached(const index_detail::StripeLockSet& ls, const BlockKey& key, uint32_t base, uint32_t mask,
                            uint32_t* missing) {
  *missing = kNo;
  uint32_t free_slot = kNo;
  const uint32_t off = static_cast<uint32_t>(key.lo & mask);
  for (uint32_t i = 0; i <= mask; i++) {
    const uint32_t slot = base + ((off + i) & mask);
    const cxlkv_index_entry* e = ls.cached_entry(slot);
    if (!e) {
      *missing = slot;
      return kNo;
    }
    if (e->state == CXLKV_ENTRY_EMPTY) return free_slot != kNo ? free_slot : slot;
    if (e->state == CXLKV_ENTRY_TOMBSTONE) {
      if (free_slot == kNo && e->parent_slot == kNo) free_slot = slot;  // a pending drop is not free
      continue;
    }
    if (e->key_lo == key.lo && e->key_hi == key.hi && live_index_state(e->state)) return slot;
  }
  return free_slot;
}

void PrefixIndex::prefetch_probes(StripeLockSet& ls, const BlockKey* pkey, std::span<const BlockKey> keys) {
  // acquire() read each key's home entry and ext lines.  A probe that runs past the lines
  // read so far gets its next kPrefetchProbe lines in the next sweep; a
  // probe that ends gets the ext line of its slot (a new block's ext record
  // is written as a whole line with its neighbour's; a parent that gains its
  // first child is unlinked).  One fence per sweep, at most kSweeps; what a
  // longer probe still lacks, probe() reads one line at a time.
  constexpr int kSweeps = 3;
  const uint32_t mask = hdr_.stripe_slots - 1;
  std::vector<uint32_t> more, exts;
  for (int sweep = 0; sweep < kSweeps; sweep++) {
    more.clear();
    exts.clear();
    auto plan = [&](const BlockKey& k) {
      if (k.is_zero()) return;
      const uint32_t base = stripe_of(k) * hdr_.stripe_slots;
      uint32_t missing;
      const uint32_t at = walk_cached(ls, k, base, mask, &missing);
      if (at != kNo) exts.push_back(at);
      if (missing == kNo) return;
      for (uint32_t j = 0; j < kPrefetchProbe && j <= mask; j++) more.push_back(base + ((missing - base + j) & mask));
    };
    if (pkey) plan(*pkey);
    for (const BlockKey& k : keys) plan(k);
    ls.prefetch(more, exts);
    if (more.empty()) return;
  }
}

// One reserve_locked call in named steps.  The call's arguments, its
// payload stash and the slot its next block links under (`prev`) live here;
// each step either lets the call go on or ends it at block i, with
// status[i] set (by fail(), or the BUSY block's kBlockBusy).
struct PrefixIndex::ReserveCall {
  // Payload of this call's new blocks, taken before its first entry write:
  // the allocator's lock is an atomic read-modify-write, which waits for the
  // call's pending NT entry writes as a fence does (one wait per call, not
  // one per block).  What is not used goes back on every way out.
  struct Stash {
    PayloadSpace* space;
    std::vector<BlockLocation> locs;
    size_t next = 0;
    ~Stash() {
      for (size_t i = next; i < locs.size(); i++) space->free(locs[i]);
    }
  };
  // What one try at a block leads to: try it again (something was evicted
  // or reclaimed), go on to the next block, or end the call at this one.
  enum class Step { retry, next, stop };

  PrefixIndex& ix;
  StripeLockSet& ls;
  std::span<const BlockKey> keys;
  uint64_t bytes;
  std::span<Reservation> out;
  std::span<int32_t> status;
  std::vector<uint32_t>* parents;
  bool* need_reclaim;
  std::vector<std::pair<uint32_t, BlockKey>>* pinned;
  const PoolView& view;
  bool through_busy;
  Stash stash;
  uint32_t prev = kNo;         // the slot of the block above the current one
  uint32_t now = 0;            // the recency stamp of every block the call reserves
  bool parent_linked = false;  // our children count on `prev` is raised (per block)

  ReserveCall(PrefixIndex& ix_, StripeLockSet& ls_, std::span<const BlockKey> keys_, uint64_t bytes_,
              std::span<Reservation> out_, std::span<int32_t> status_, std::vector<uint32_t>* parents_,
              bool* need_reclaim_, std::vector<std::pair<uint32_t, BlockKey>>* pinned_, const PoolView& view_,
              bool through_busy_)
      : ix(ix_), ls(ls_), keys(keys_), bytes(bytes_), out(out_), status(status_), parents(parents_),
        need_reclaim(need_reclaim_), pinned(pinned_), view(view_), through_busy(through_busy_),
        stash{ix_.space_, {}, 0} {}

  size_t fail(size_t i, int32_t code, std::string msg) {
    status[i] = code;
    ix.block_error(code, std::move(msg));
    return i;
  }

  // The stash: one payload block for each key from `from` on that its probe
  // does not find.  false: a failure that asking again per block would not
  // cure, reported at `from` before any entry is written.
  bool take_payload(size_t from) {
    size_t fresh = 0;
    for (size_t i = from; i < keys.size(); i++)
      if (ix.probe(keys[i], nullptr, nullptr) == kNo) fresh++;  // the lines of the set's sweep
    stash.locs.reserve(fresh);
    for (size_t i = 0; i < fresh; i++) {
      auto l = ix.space_->alloc(bytes);
      // A lock out of reach (-ETIMEDOUT: no lock manager) is not cured by
      // asking again per block: fail now, before any entry is written.
      if (!l && l.error().code() != -ENOSPC && l.error().code() != -EFBIG) {
        fail(from, l.error().code(), l.error().message());
        return false;
      }
      if (!l) break;  // full: the blocks that get no stash allocate (and evict) one by one below
      stash.locs.push_back(l.value());
    }
    return true;
  }

  // The chain's parent, when the call has one, is READY or WRITING: `prev`.
  bool find_parent(const BlockKey* pkey, size_t from) {
    if (!pkey) return true;
    cxlkv_index_entry pe;
    const uint32_t ps = ix.probe(*pkey, &pe, nullptr);
    if (ps == kNo || (pe.state != CXLKV_ENTRY_READY && pe.state != CXLKV_ENTRY_WRITING)) {
      fail(from, -ENOENT, "index: parent block " + to_hex(*pkey) + " is not cached");
      return false;
    }
    prev = ps;
    return true;
  }

  void undo() {
    if (parent_linked) ix.child_dropped(ls, prev);
  }

  // Out of space: the caller evicts outside this set and retries below
  // `prev`.  A READY parent is pinned so that this eviction cannot take
  // it; a WRITING one (this call's own block, or a busy one) is never a
  // victim.  The count goes back down here, under the set: carried across
  // the unlock, a count that only this process's memory accounts for
  // stayed raised when the process died before the next round, and the
  // parent was never evicted again (prefix_index.hpp "Children counts").
  // A pin is the node's and goes with a dead process (node pins, liveness).
  void keep() {
    if (!parent_linked) return;
    const bool mine = std::any_of(pinned->begin(), pinned->end(), [&](const auto& p) { return p.first == prev; });
    if (!mine && ix.read_entry(prev).state == CXLKV_ENTRY_READY && ix.pin_locked(ls, prev)) {
      const cxlkv_index_entry pe = ix.read_entry(prev);
      pinned->emplace_back(prev, BlockKey{pe.key_lo, pe.key_hi});
    }
    ix.child_dropped(ls, prev);
  }

  // keys[i] reserved, found, or the call ends at it.  false: it ends.
  bool reserve_one(size_t i) {
    parent_linked = false;
    for (int attempt = 0;; attempt++) {
      cxlkv_index_entry e;
      uint32_t free_slot = kNo;
      bool ghost = false;
      const uint32_t slot = ix.probe(keys[i], &e, &free_slot, &ghost);
      Step step = slot != kNo ? settle_found(i, slot, e, attempt) : room_for_new(i, free_slot, attempt);
      if (step == Step::retry) continue;
      if (slot == kNo && step == Step::next) step = write_new(i, free_slot, ghost);
      if (step == Step::retry) continue;
      return step == Step::next;
    }
  }

  // keys[i] has an entry at `slot`: a leftover of a dead process is cleared
  // (retry), a READY block exists, a WRITING one is busy.
  Step settle_found(size_t i, uint32_t slot, const cxlkv_index_entry& e, int attempt) {
    if (e.state == CXLKV_ENTRY_EVICTING) {  // a dead evictor's leftover: finish it
      ix.remove_locked(ls, slot, e, /*reclaim=*/true, parents);
      return Step::retry;
    }
    if (e.state == CXLKV_ENTRY_WRITING && ix.writer_dead(e)) {
      // The writer died mid-write: nothing was visible; reclaim it.
      if (e.children == 0 && attempt < 8) {
        ix.remove_locked(ls, slot, e, /*reclaim=*/true, parents);
        return Step::retry;
      }
      *need_reclaim = true;  // its chain continues below: unwound after unlocking
      undo();
      fail(i, -EAGAIN, "index: block " + to_hex(keys[i]) + " was being written by dead node " +
                           std::to_string(e.owner_node) + " with blocks below it; reclaiming, retry");
      return Step::stop;
    }
    undo();
    out[i] = Reservation{e.state == CXLKV_ENTRY_READY ? ReserveStatus::exists_ready : ReserveStatus::busy, slot,
                         loc_of(e), e.version};
    if (e.state != CXLKV_ENTRY_READY) {
      status[i] = kBlockBusy;  // never written twice
      if (!through_busy) return Step::stop;
      prev = slot;  // its writer publishes it; the blocks below go on from it
      return Step::next;
    }
    status[i] = kBlockExists;
    prev = slot;
    return Step::next;
  }

  // keys[i] is new: its parent is linked, and room is made when the pool is
  // at its capacity or the stripe has no free slot.  next: write it at
  // free_slot.
  Step room_for_new(size_t i, uint32_t free_slot, int attempt) {
    const BlockKey& key = keys[i];
    // Raise the parent's children count first: from here on the parent is
    // not a leaf, so no eviction (ours included) takes it.
    if (prev != kNo && !parent_linked) {
      ix.child_added(ls, prev);
      parent_linked = true;
    }
    if (attempt > 64) {
      undo();
      fail(i, -ENOSPC, "index: no space for block " + to_hex(key) + " after 64 evictions");
      return Step::stop;
    }
    if (ix.over_capacity(view, &ls, 1, bytes)) {
      auto ev = ix.evict_global(parents, &ls);
      if (ev && ev.value()) return Step::retry;
      keep();
      fail(i, -ENOSPC, "index: no space for block " + to_hex(key) + ": the pool is at its capacity of " +
                           std::to_string(ix.cfg_.max_blocks) + " blocks / " + std::to_string(ix.cfg_.max_bytes) +
                           " bytes and every block is pinned, leased, being written or has cached children");
      return Step::stop;
    }
    if (free_slot == kNo) {
      const uint32_t s = ix.stripe_of(key);
      auto ev = ix.evict_locked(ls, s, parents);
      if (ev && ev.value()) return Step::retry;
      keep();
      fail(i, -ENOSPC, "index: no space for block " + to_hex(key) + ": stripe " + std::to_string(s) +
                           " has no free slot and every block in it is pinned, leased, being written or "
                           "has cached children");
      return Step::stop;
    }
    return Step::next;
  }

  // keys[i]'s payload (from the stash, else allocated: a full payload space
  // evicts and retries) and its WRITING entry at free_slot.
  Step write_new(size_t i, uint32_t free_slot, bool ghost) {
    const BlockKey& key = keys[i];
    Result<BlockLocation> loc = stash.next < stash.locs.size() ? Result<BlockLocation>(stash.locs[stash.next++])
                                                               : ix.space_->alloc(bytes);
    if (!loc) {
      if (loc.error().code() == -ENOSPC) {
        log().debug("index: evicting for space: {}", loc.error().message());
        auto ev = ix.evict_global(parents, &ls);
        if (ev && ev.value()) return Step::retry;
        keep();
      } else {
        undo();
      }
      fail(i, loc.error().code(),
           loc.error().code() == -ENOSPC
               ? "index: no space for block " + to_hex(key) + " (" + std::to_string(bytes) +
                     " bytes): payload space is full and every block is pinned, leased, being written or "
                     "has cached children (" + loc.error().message() + ")"
               : loc.error().message());
      return Step::stop;
    }
    const uint32_t s = ix.stripe_of(key);
    cxlkv_index_entry old = ix.read_entry(free_slot);
    cxlkv_index_entry ne{};
    ne.version = old.version;
    ne.key_lo = key.lo;
    ne.key_hi = key.hi;
    ne.loc_off = loc->offset;
    ne.loc_len = loc->length;
    ne.loc_dev = loc->device;
    ne.loc_tier = loc->tier;
    ne.state = CXLKV_ENTRY_WRITING;
    ne.owner_node = static_cast<uint8_t>(ix.node_);
    ne.owner_inc = ix.inc_lo_;
    ne.parent_slot = prev;
    ne.lru_ms = now;
    ls.mark(s);
    ix.space_->claim(loc.value(), free_slot);  // the block's owner record, before the entry names it
    const uint32_t ver = ix.write_entry(free_slot, ne);
    cxlkv_index_ext x{};  // not listed (WRITING), no lease
    if (ghost) x.linked = CXLKV_EXT_REUSED;  // evicted before and back: one more trip (index_evict.cpp)
    x.lru_prev = x.lru_next = kNo;
    x.lease_node = CXLKV_LEASE_NODE_ANY;
    ix.write_ext(free_slot, x);
    cxlkv_index_stripe& st = ls.st(s);
    if (old.state == CXLKV_ENTRY_TOMBSTONE && st.tombstones) st.tombstones--;
    st.used_blocks++;
    st.used_bytes += loc->length;
    out[i] = Reservation{ReserveStatus::reserved, free_slot, loc.value(), ver};
    status[i] = kBlockReserved;
    prev = free_slot;
    return Step::next;
  }
};

size_t PrefixIndex::reserve_locked(StripeLockSet& ls, const BlockKey* pkey, std::span<const BlockKey> keys, size_t from,
                                   uint64_t bytes, std::span<Reservation> out, std::span<int32_t> status,
                                   std::vector<uint32_t>* parents, bool* need_reclaim,
                                   std::vector<std::pair<uint32_t, BlockKey>>* pinned,
                                   const PoolView& view, bool through_busy) {
  ReserveCall call(*this, ls, keys, bytes, out, status, parents, need_reclaim, pinned, view, through_busy);
  if (!call.take_payload(from) || !call.find_parent(pkey, from)) return from;
  // One clock read per call: the recency stamp of every block it reserves
  // (milliseconds; a clock_gettime per block cost more than the stamp is worth).
  call.now = now_ms();
  for (size_t i = from; i < keys.size(); i++)
    if (!call.reserve_one(i)) return i;
  return keys.size();
}

void PrefixIndex::lock_ahead(std::span<const BlockKey> keys) {
  std::vector<uint32_t> stripes;
  stripes.reserve(keys.size());
  for (const BlockKey& k : keys) stripes.push_back(stripe_of(k));
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  // Its point is one manager round trip for the stripes the node lacks
  // instead of one per later call: where the node has every grant already,
  // taking and dropping them all is pure cost (about 60 us for 30 stripes
  // inside vLLM's worker).  A hint; a stripe lost since costs the later
  // call its own round trip, nothing more.
  if (std::all_of(stripes.begin(), stripes.end(), [&](uint32_t s) { return locks_->node_has(s); })) return;
  // No line is read or written under these locks, so no stripe line is
  // marked and nothing needs a fence before the release (rules 3 and 7
  // concern the changes a holder makes; this holder makes none).
  if (locks_->lock_many(stripes)) locks_->unlock_many(stripes);
}

Result<size_t> PrefixIndex::reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                          std::span<Reservation> out, std::span<int32_t> status, bool through_busy) {
  auto n = reserve_chain_once(parent, keys, bytes, out, status, through_busy);
  if (!n || n.value() >= keys.size() || status[n.value()] != -ENOSPC) return n;
  // Full, and nothing could go: what dead processes left (stale counts,
  // pending drops, WRITING blocks of dead writers) may be what holds the
  // space.  The online repair, at most every kRepairGapMs per index; the
  // blocks not reserved get one more try when it changed something.
  const int64_t now = static_cast<int64_t>(realtime_ms());
  int64_t last = repair_ms_.load(std::memory_order_relaxed);
  if (now - last < kRepairGapMs || !repair_ms_.compare_exchange_strong(last, now)) return n;
  const BatchFailure first = batch_failure();
  auto rep = repair_index();
  if (!rep || rep->total() == 0) {
    set_batch_failure(first);
    return n;
  }
  const size_t done = n.value();
  auto more = reserve_chain_once(done ? &keys[done - 1] : parent, keys.subspan(done), bytes, out.subspan(done),
                                 status.subspan(done), through_busy);
  if (!more) return more.error();
  return done + more.value();
}

Result<size_t> PrefixIndex::reserve_chain_once(const BlockKey* parent, std::span<const BlockKey> keys,
                                               uint64_t bytes, std::span<Reservation> out, std::span<int32_t> status,
                                               bool through_busy) {
  begin_batch();
  refresh_capacity();  // a bound set since this node attached applies (index_entry.cpp)
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: reserve_chain of " + std::to_string(keys.size()) + " blocks with " +
                              std::to_string(out.size()) + " results / " + std::to_string(status.size()) + " statuses");
  const size_t n = keys.size();
  for (size_t i = 0; i < n; i++) {
    status[i] = -ECANCELED;
    out[i] = Reservation{};
  }
  if (n == 0) return size_t(0);
  // Bad arguments end the chain at the first bad block.
  size_t m = n;
  if (bytes == 0 || bytes > UINT32_MAX) {
    status[0] = -EINVAL;
    block_error(-EINVAL, "index: payload length " + std::to_string(bytes) + " is not 1 .. 4 GiB-1");
    return size_t(0);
  }
  if (parent && parent->is_zero()) {
    status[0] = -EINVAL;
    block_error(-EINVAL, "index: the all-zero parent key is reserved");
    return size_t(0);
  }
  for (size_t i = 0; i < n; i++) {
    const BlockKey* p = i ? &keys[i - 1] : parent;
    if (keys[i].is_zero() || (p && *p == keys[i])) {
      m = i;
      status[i] = -EINVAL;
      block_error(-EINVAL, keys[i].is_zero() ? std::string("index: the all-zero block key is reserved")
                                             : "index: block " + to_hex(keys[i]) + " is its own parent");
      break;
    }
  }
  auto settled = [&](size_t upto) {  // leading RESERVED / EXISTS (a BUSY block ends the count)
    size_t good = 0;
    while (good < upto && (status[good] == kBlockReserved || status[good] == kBlockExists)) good++;
    return good;
  };
  // 1. Lock-free: the leading blocks already cached (the shared prefix).
  size_t lr = 0;
  auto ready_prefix = [&] {
    lr = 0;
    for (; lr < m; lr++) {
      cxlkv_index_entry e;
      uint32_t sl = probe(keys[lr], &e, nullptr);
      if (sl == kNo || e.state != CXLKV_ENTRY_READY) break;
      out[lr] = Reservation{ReserveStatus::exists_ready, sl, loc_of(e), e.version};
      status[lr] = kBlockExists;
    }
    for (size_t i = lr; i < m; i++) status[i] = -ECANCELED;
  };
  ready_prefix();
  if (lr == m) return settled(m);
  // 2. Room ahead of demand, one stripe lock at a time; the stripe lines
  // are swept once for the whole call (PoolView).
  // Without a capacity limit nothing reads the view: no sweep.
  const bool limited = cfg_.max_blocks || cfg_.max_bytes;
  PoolView view;
  if (limited) view = pool_view();
  CXLKV_TRY(make_room(m - lr, (m - lr) * bytes, &view));
  if (lr > 0 && find_ready(keys[lr - 1]) == kNo) ready_prefix();  // our eviction took the prefix's end
  // 3. The rest under one lock set.
  size_t next = lr;
  std::vector<uint32_t> parents;
  bool need_reclaim = false;
  // Parents a full round pinned (see reserve_locked), unpinned on every way out.
  struct Pinned {
    PrefixIndex& ix;
    std::vector<std::pair<uint32_t, BlockKey>> v;
    ~Pinned() { release(); }
    void release() {
      if (v.empty()) return;
      std::vector<uint32_t> ps;
      std::vector<BlockKey> pk;
      for (const auto& [slot, key] : v) {
        ps.push_back(slot);
        pk.push_back(key);
      }
      std::vector<int32_t> us(ps.size());
      const BatchFailure first = batch_failure();  // the reserve's first failure stays its caller's to read
      if (auto u = ix.unpin_many(ps, pk, us); !u)
        log().warn("index: unpinning a reserve's parents: {}", u.error().message());
      set_batch_failure(first);
      v.clear();
    }
  } pinned{*this, {}};
  // Rounds past kReserveRounds (docs/eviction.md "Remote frees"): space an
  // eviction frees in another node's chunk comes back as a whole chunk only
  // once every block of that chunk is gone, and the oldest blocks need not
  // share chunks, so one block's room may take more evictions than there are
  // rounds.  A reserve goes on evicting while that still makes room: while
  // the payload space waits for no node that does not drain, and for at most
  // as many evictions as the pool held blocks when this call ran out.
  uint64_t evicted_total = 0, evict_budget = 0;
  for (int round = 0; next < m; round++) {
    const BlockKey* pkey = next ? &keys[next - 1] : parent;
    std::vector<uint32_t> stripes, lines;
    stripes.reserve(m - next + 1);
    lines.reserve(m - next + 1);
    for (size_t i = next; i < m; i++) {
      stripes.push_back(stripe_of(keys[i]));
      lines.push_back(home(keys[i]));
    }
    if (pkey) {
      stripes.push_back(stripe_of(*pkey));
      lines.push_back(home(*pkey));
    }
    {
      StripeLockSet ls(*this);
      // Stripe lines, home entry lines and their ext lines (a new block
      // usually lands at its home slot): one sweep.
      if (auto a = ls.acquire(stripes, lines, lines); !a) {
        status[next] = a.error().code();
        block_error(a.error().code(), a.error().message());
        break;
      }
      // The rest of each probe and the ext lines of the slots the probes
      // end at, in as few more sweeps as the probes need (usually none).
      prefetch_probes(ls, pkey, keys.subspan(next, m - next));
      ls.mark_all();  // a new block changes its stripe's counters: one fence for every dirty mark
      next = reserve_locked(ls, pkey, keys.first(m), next, bytes, out, status, &parents, &need_reclaim,
                            &pinned.v, view, through_busy);
      view.take(ls);
    }
    CXLKV_TRY(drop_children(parents, &view));
    if (next >= m || status[next] != -ENOSPC) break;
    if (round + 1 >= kReserveRounds) {
      if (round + 1 == kReserveRounds) {  // what the pool held when this call ran out (ours evicted since)
        uint64_t blocks = 0, used_bytes = 0;
        pool_used(nullptr, &blocks, &used_bytes);  // one sweep of the stripe lines (rule 4)
        evict_budget = blocks + evicted_total;
      }
      // No more rounds: the last round's -ENOSPC and its message stand, and
      // no block is evicted for a round that will not come.
      if (evicted_total >= evict_budget || !space_->evicting_can_help()) break;
    }
    // Still full under the set: evict anywhere (lists of other stripes, the
    // window scan), then take the set of the remaining blocks again.  Room
    // for every block still to reserve, not one: with the victims outside
    // the set, a round per eviction ran out of rounds long before a chain
    // longer than kReserveRounds fitted into a full pool.
    size_t evicted = 0;
    for (const size_t want = m - next; evicted < want; evicted++) {
      auto ev = evict_global(&parents, nullptr, nullptr);  // a fresh sweep: the pool changed under us
      if (ev) {
        // A parent left childless is a candidate for the very next victim.
        if (auto d = drop_children(parents); !d) return d.error();
      }
      if (!ev || !ev.value()) break;
    }
    if (evicted == 0) break;
    evicted_total += evicted;
    if (limited) view = pool_view();
    begin_batch();
    status[next] = -ECANCELED;
  }
  pinned.release();  // before the reclaim and the room-making below: nothing of ours stays pinned
  if (need_reclaim) (void)reclaim_dead();
  // Over the capacity by what this call added (its view has its own changes):
  // bring the pool back under it.
  if (cfg_.max_blocks || cfg_.max_bytes) (void)make_room(0, 0, &view);
  return settled(m);
}

Result<size_t> PrefixIndex::publish_many(std::span<const Reservation> handles, std::span<const BlockKey> keys,
                                         std::span<int32_t> status) {
  if (handles.size() != keys.size())
    return Error(-EINVAL, "index: publish_many: " + std::to_string(handles.size()) + " reservations for " +
                              std::to_string(keys.size()) + " keys");
  std::vector<uint32_t> slots(handles.size());
  for (size_t i = 0; i < handles.size(); i++) slots[i] = handles[i].slot;
  return publish_checked(slots, keys, handles, status);
}

Result<size_t> PrefixIndex::publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                         std::span<int32_t> status) {
  return publish_checked(slots, keys, {}, status);
}

// `handles` empty: no fencing by version and location (the plain call).
Result<size_t> PrefixIndex::publish_checked(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                            std::span<const Reservation> handles, std::span<int32_t> status) {
  begin_batch();
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: publish_many: slots, keys and statuses differ in length");
  std::vector<uint32_t> stripes;
  for (uint32_t sl : slots)
    if (sl < hdr_.nslots) stripes.push_back(sl / hdr_.stripe_slots);
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes, slots));  // entries in the same sweep as the stripe lines
  {
    // Ext records are read and written only for blocks that become leaves
    // of their stripe's list (link: theirs and the list head's): those
    // lines in a second sweep, once the entries say which they are (a
    // chain's blocks have children but its last).
    std::vector<uint32_t> exts;
    for (uint32_t sl : slots) {
      if (sl >= hdr_.nslots) continue;
      const cxlkv_index_entry* e = ls.cached_entry(sl);
      if (!e || e->children != 0 || e->loc_tier != CXLKV_TIER_MEM) continue;
      exts.push_back(sl);
      const uint32_t s = sl / hdr_.stripe_slots;
      if (ls.holds(s)) exts.push_back(list_head(ls.st(s), false));  // the cold list's (a new block is cold unless it came back)
    }
    ls.prefetch({}, exts);
  }
  size_t good = 0;
  const uint32_t now = now_ms();
  uint32_t last_published = kNo;
  for (size_t i = 0; i < keys.size(); i++) {
    const uint32_t slot = slots[i];
    const BlockKey& key = keys[i];
    auto fail = [&](int32_t code, std::string msg) {
      status[i] = code;
      block_error(code, std::move(msg));
    };
    if (slot >= hdr_.nslots) {
      fail(-EINVAL, "index: publish of slot " + std::to_string(slot) + " out of range");
      continue;
    }
    cxlkv_index_entry e = read_entry(slot);
    if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_WRITING || e.owner_node != node_ ||
        e.owner_inc != inc_lo_) {
      fail(-ESTALE, "index: block " + to_hex(key) + " at slot " + std::to_string(slot) +
                        " is not reserved by this node (state " + std::to_string(e.state) + ")");
      continue;
    }
    if (!handles.empty() && (e.version != handles[i].version || e.loc_off != handles[i].loc.offset ||
                             e.loc_len != handles[i].loc.length || e.loc_dev != handles[i].loc.device ||
                             e.loc_tier != handles[i].loc.tier)) {
      fail(-ESTALE, "index: block " + to_hex(key) + " at slot " + std::to_string(slot) +
                        " changed since it was reserved (reclaimed and reserved again): not published");
      continue;
    }
    if (e.parent_slot != kNo) {
      // Prefix closure: a child becomes READY only after its parent.  The
      // parent cannot disappear (our children count holds it); its line is
      // read fresh (rule 4) and, if this call published it, already READY.
      if (e.parent_slot >= hdr_.nslots) {
        fail(-EUCLEAN, "index: block " + to_hex(key) + " names parent slot " + std::to_string(e.parent_slot));
        continue;
      }
      // A parent this call published just before (a chain, parent first)
      // is READY under our lock: no need to read it again.
      cxlkv_index_entry p{};
      if (e.parent_slot == last_published) p.state = CXLKV_ENTRY_READY;
      else p = read_entry(e.parent_slot);
      if (p.state == CXLKV_ENTRY_WRITING) {
        if (!live_->alive(p.owner_node, p.owner_inc) && !(p.owner_node == node_ && p.owner_inc == inc_lo_))
          fail(-EOWNERDEAD, "index: parent of block " + to_hex(key) + " was being written by dead node " +
                                std::to_string(p.owner_node));
        else
          fail(-EAGAIN, "index: parent of block " + to_hex(key) + " is not published yet");
        continue;
      }
      if (p.state != CXLKV_ENTRY_READY) {
        fail(-EUCLEAN, "index: parent of block " + to_hex(key) + " is in state " + std::to_string(p.state));
        continue;
      }
    }
    // rule 3 / rule 5: the caller flushed and fenced the payload; this entry
    // write is the visibility boundary.
    e.state = CXLKV_ENTRY_READY;
    e.lru_ms = now;
    write_entry(slot, e);
    if (e.children == 0 && e.loc_tier == CXLKV_TIER_MEM) link(ls, slot, now, /*at_head=*/true);
    status[i] = kBlockReserved;
    last_published = slot;
    good++;
  }
  return good;
}

Result<size_t> PrefixIndex::abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                       std::span<int32_t> status) {
  begin_batch();
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: abort_many: slots, keys and statuses differ in length");
  std::vector<uint32_t> stripes, parents;
  for (uint32_t sl : slots)
    if (sl < hdr_.nslots) stripes.push_back(sl / hdr_.stripe_slots);
  size_t good = 0;
  {
    StripeLockSet ls(*this);
    CXLKV_TRY(ls.acquire(stripes, slots));
    // Leaf first: a chain given parent first is aborted from its end, and a
    // parent in a held stripe loses its child at once.
    for (size_t j = keys.size(); j-- > 0;) {
      const uint32_t slot = slots[j];
      const BlockKey& key = keys[j];
      if (slot >= hdr_.nslots) {
        status[j] = -EINVAL;
        block_error(-EINVAL, "index: abort of slot " + std::to_string(slot) + " out of range");
        continue;
      }
      cxlkv_index_entry e = read_entry(slot);
      if (e.key_lo != key.lo || e.key_hi != key.hi || e.state != CXLKV_ENTRY_WRITING || e.owner_node != node_ ||
          e.owner_inc != inc_lo_) {
        status[j] = -ESTALE;
        block_error(-ESTALE, "index: abort of block " + to_hex(key) + ": not reserved by this node");
        continue;
      }
      if (e.children) {
        status[j] = -EBUSY;
        block_error(-EBUSY, "index: abort of block " + to_hex(key) + ": " + std::to_string(e.children) +
                                " children reserved below it (abort them first)");
        continue;
      }
      remove_locked(ls, slot, e, /*reclaim=*/true, &parents);
      status[j] = kBlockReserved;
      good++;
    }
  }
  CXLKV_TRY(drop_children(parents));
  return good;
}

Result<size_t> PrefixIndex::pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                     std::span<int32_t> status) {
  begin_batch();
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: pin_many: fewer results or statuses than keys");
  size_t good = 0;
  std::vector<size_t> todo;
  {
    // Lock-free fast path: a block this process already pins (our node bit is set).
    std::lock_guard<std::mutex> lk(pin_mu_);
    for (size_t i = 0; i < keys.size(); i++) {
      out[i] = PinnedBlock{};
      status[i] = kBlockMiss;
      if (keys[i].is_zero()) {
        status[i] = -EINVAL;
        block_error(-EINVAL, "index: the all-zero block key is reserved");
        continue;
      }
      if (local_pins_.empty()) {  // no pin of ours to share: the probe under the lock decides
        todo.push_back(i);
        continue;
      }
      cxlkv_index_entry e;
      uint32_t slot = probe(keys[i], &e, nullptr);
      if (slot != kNo && e.state == CXLKV_ENTRY_READY) {
        auto it = local_pins_.find(slot);
        if (it != local_pins_.end() && it->second > 0 && (e.pin_mask >> node_ & 1)) {
          it->second++;
          out[i] = PinnedBlock{slot, loc_of(e), e.version};
          status[i] = kBlockReserved;
          good++;
          continue;
        }
        todo.push_back(i);  // READY: pin it under the lock
      }
    }
  }
  if (todo.empty()) return good;
  std::vector<uint32_t> stripes, lines;
  stripes.reserve(todo.size());
  lines.reserve(todo.size() * kPrefetchProbe);
  for (size_t i : todo) {
    stripes.push_back(stripe_of(keys[i]));
    probe_lines(keys[i], lines);
  }
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes, lines));
  const uint32_t now = now_ms();
  struct Cand {
    size_t i;
    uint32_t slot;
    cxlkv_index_entry e;
    bool ok;
  };
  // Scratch of this thread's calls (no allocation per call once warm).
  static thread_local std::vector<Cand> cand;
  static thread_local std::vector<uint32_t> firsts;
  static thread_local std::vector<uint8_t> ok;
  cand.clear();
  for (size_t i : todo) {
    cxlkv_index_entry e;
    uint32_t slot = probe(keys[i], &e, nullptr);
    if (slot == kNo || e.state != CXLKV_ENTRY_READY) continue;  // MISS
    if (auto own = owner_ok(slot, e); !own) {  // not the block the allocator handed out (index_owner.cpp)
      status[i] = own.error().code();
      block_error(own.error().code(), own.error().message());
      continue;
    }
    cand.push_back(Cand{i, slot, e, true});
  }
  if (cand.empty()) return good;
  {
    // This index's pin counts: one mutex acquisition for the batch, before
    // the entry writes (a lock is a locked instruction, which would wait for
    // pending NT entry writes).  The counts go up before the node's bit is
    // written: both happen under the stripe lock, which every process of
    // this node needs to unpin the slot or evict it, and this process's
    // fast path shares a pin only once it reads the bit set.  A first pin
    // of a slot by this index is recorded in the node's pin table too
    // (node_pins.hpp), so that another process's last unpin keeps the bit.
    std::lock_guard<std::mutex> lk(pin_mu_);
    if (node_pins_) {
      firsts.clear();
      for (const Cand& c : cand) {
        auto it = local_pins_.find(c.slot);
        if (it != local_pins_.end() && it->second > 0) continue;
        if (std::find(firsts.begin(), firsts.end(), c.slot) == firsts.end()) firsts.push_back(c.slot);
      }
      if (!firsts.empty()) {
        ok.assign(firsts.size(), 1);
        node_pins_->add(firsts, ok.data());
        for (size_t f = 0; f < firsts.size(); f++)
          if (!ok[f])
            for (Cand& c : cand)
              if (c.slot == firsts[f]) c.ok = false;
      }
    }
    for (const Cand& c : cand)
      if (c.ok) local_pins_[c.slot]++;
  }
  for (Cand& c : cand) {
    const size_t i = c.i;
    if (!c.ok) {
      status[i] = -ENOSPC;
      block_error(-ENOSPC, "index: pin of block " + to_hex(keys[i]) + ": " + node_pins_->what() + " is full (" +
                               std::to_string(NodePins::kMaxSlots) + " blocks pinned by this node's processes)");
      continue;
    }
    cxlkv_index_entry& e = c.e;
    e.pin_mask |= 1ULL << node_;
    e.lru_ms = now;  // recency: the evictor gives this leaf a second chance
    write_entry(c.slot, e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
    out[i] = PinnedBlock{c.slot, loc_of(e), e.version};
    status[i] = kBlockReserved;
    good++;
  }
  return good;
}

bool PrefixIndex::pin_locked(StripeLockSet& ls, uint32_t slot) {
  (void)ls;  // the caller holds the slot's stripe (rule 7)
  cxlkv_index_entry e = read_entry(slot);
  if (e.state != CXLKV_ENTRY_READY) return false;
  {
    // As pin_many: this index's count first, and the node's pin table for
    // a first pin of the slot by this index (node_pins.hpp).
    std::lock_guard<std::mutex> lk(pin_mu_);
    auto it = local_pins_.find(slot);
    if (node_pins_ && (it == local_pins_.end() || it->second == 0)) {
      uint8_t ok = 1;
      node_pins_->add(std::span<const uint32_t>(&slot, 1), &ok);
      if (!ok) return false;  // the node's pin table is full: not kept
    }
    local_pins_[slot]++;
  }
  if (!(e.pin_mask >> node_ & 1)) {
    e.pin_mask |= 1ULL << node_;  // no recency stamp: the reserve does not read it
    write_entry(slot, e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
  }
  return true;
}

Result<size_t> PrefixIndex::unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                       std::span<int32_t> status) {
  begin_batch();
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: unpin_many: slots, keys and statuses differ in length");
  size_t good = 0;
  std::vector<size_t> todo;
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    for (size_t i = 0; i < keys.size(); i++) {
      auto it = local_pins_.find(slots[i]);
      if (it == local_pins_.end() || it->second == 0) {
        status[i] = -EINVAL;
        block_error(-EINVAL, "index: unpin of block " + to_hex(keys[i]) + " that this process has not pinned");
        continue;
      }
      if (--it->second > 0) {
        status[i] = kBlockReserved;
        good++;
        continue;
      }
      local_pins_.erase(it);
      todo.push_back(i);
    }
  }
  if (todo.empty()) return good;
  std::vector<uint32_t> stripes, lines;
  stripes.reserve(todo.size());
  lines.reserve(todo.size());
  for (size_t i : todo) {
    stripes.push_back(slots[i] / hdr_.stripe_slots);
    lines.push_back(slots[i]);
  }
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes, lines));
  // Under the stripe locks: which of these slots does the node still pin?
  // Not those this index pinned again meanwhile (its count went up under
  // the lock after ours went to zero), nor those another index of the node
  // pins (node_pins.hpp).
  static thread_local std::vector<uint8_t> clear, node_free;  // this thread's scratch
  static thread_local std::vector<uint32_t> last;
  static thread_local std::vector<size_t> last_at;
  clear.assign(todo.size(), 1);
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    last.clear();
    last_at.clear();
    for (size_t t = 0; t < todo.size(); t++) {
      auto it = local_pins_.find(slots[todo[t]]);
      if (it != local_pins_.end() && it->second > 0) {
        clear[t] = 0;
        continue;
      }
      last.push_back(slots[todo[t]]);
      last_at.push_back(t);
    }
    if (node_pins_ && !last.empty()) {
      node_free.assign(last.size(), 0);
      node_pins_->remove(last, node_free.data());
      for (size_t k = 0; k < last.size(); k++) clear[last_at[k]] = node_free[k];
    }
  }
  for (size_t t = 0; t < todo.size(); t++) {
    const size_t i = todo[t];
    cxlkv_index_entry e = read_entry(slots[i]);
    if (e.key_lo != keys[i].lo || e.key_hi != keys[i].hi) {
      status[i] = -ESTALE;
      block_error(-ESTALE, "index: unpin of block " + to_hex(keys[i]) + ": slot now holds another block");
      continue;
    }
    status[i] = kBlockReserved;
    good++;
    if (!clear[t]) continue;  // the node still pins it
    e.pin_mask &= ~(1ULL << node_);
    write_entry(slots[i], e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
  }
  return good;
}

bool PrefixIndex::still_valid(uint32_t slot, const BlockKey& key, uint32_t state, uint32_t version) const {
  if (slot >= hdr_.nslots) return false;
  cxlkv_index_entry e = read_entry(slot);  // rule 4: one fresh read
  return e.key_lo == key.lo && e.key_hi == key.hi && e.state == state && e.version == version;
}

}  // namespace cxlkv
