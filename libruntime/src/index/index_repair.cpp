// SPDX-License-Identifier: MIT
// Repair of what dead processes leave in the index: children counts,
// pending drops, WRITING blocks of dead writers.
//
// Online (repair_index; prefix_index.hpp "Children counts"): under the
// stripe locks of the suspects and their parents, with every other node
// working.  A count is exact while its stripe is held: a child is added
// only under its parent's stripe lock, and a removed child keeps naming its
// parent (a pending drop) until a holder of both stripes settles it.  So
// no count held by a live process is ever taken for a stale one.
//
// Offline (index_repair_child_counts; cxlkvctl kv check --repair): the
// same counts on an index no node is attached to, set entry by entry
// (set_children) from one snapshot.
#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"
#include "index/index_check.hpp"
#include "index/index_internal.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {

Result<bool> PrefixIndex::set_children(uint32_t slot, const BlockKey& key, uint32_t expected, uint32_t children,
                                       bool* listed) {
  if (listed) *listed = false;
  if (slot >= hdr_.nslots)
    return Error(-EINVAL, "index: slot " + std::to_string(slot) + " out of range (" + std::to_string(hdr_.nslots) +
                              " slots)");
  const uint32_t s = slot / hdr_.stripe_slots;
  StripeLockSet ls(*this);
  // rule 7: the entry, its ext record and the stripe's lists change only
  // under the stripe's lock; acquire reads them fresh (rule 4) and rebuilds
  // a stripe a dead holder left dirty.
  CXLKV_TRY(ls.acquire({s}, std::span<const uint32_t>(&slot, 1), std::span<const uint32_t>(&slot, 1)));
  cxlkv_index_entry e = read_entry(slot);
  if (!live_index_state(e.state) || e.key_lo != key.lo || e.key_hi != key.hi || e.children != expected) return false;
  // list_dirty first: a repair that dies between the entry and the list
  // leaves the stripe for the next holder to rebuild from the entries.
  ls.mark(s);
  const bool linked = read_ext(slot).linked & CXLKV_EXT_LINKED;
  const bool leaf = set_count_locked(ls, slot, e, children);
  if (listed) *listed = leaf;
  log().info("index: slot {}: children count {} -> {} (offline repair{})", slot, expected, children,
             leaf && !linked ? "; linked as an evictable leaf" : "");
  return true;
}

bool PrefixIndex::set_count_locked(StripeLockSet& ls, uint32_t slot, cxlkv_index_entry e, uint32_t children) {
  e.children = children;
  // rule 1/3: whole line NT with its check; fenced at release (stripe_lock_set.hpp)
  write_entry(slot, e, /*bump=*/false);
  // The lists hold exactly the READY memory leaves (uapi "Eviction lists").
  const bool leaf = e.state == CXLKV_ENTRY_READY && children == 0 && e.loc_tier == CXLKV_TIER_MEM;
  const bool linked = read_ext(slot).linked & CXLKV_EXT_LINKED;
  if (leaf && !linked) link_leaf(ls, slot, e);  // as child_dropped links a parent whose last child went
  else if (!leaf && linked) unlink(ls, slot);  // as child_added unlinks a parent that gains one
  return leaf;
}

// ---- online repair -------------------------------------------------------------

namespace {
constexpr int kRepairRounds = 4;      // lock-free sweep + locked pass, while passes fix something
constexpr uint32_t kSweepLines = 512;  // entry lines per invalidation sweep
// A WRITING block whose (node, incarnation) is not the node's live one
// while the node itself lives: its writer was killed and the node has a
// successor, or it is another process of the node (the node table names
// one process per node, sync/liveness.cpp).  The repair takes it only once
// its reservation is this old, so a live writer of a node with several
// processes is not robbed mid-write.
constexpr uint32_t kSiblingWritingMs = 2000;
}  // namespace

bool PrefixIndex::dead_writing(const cxlkv_index_entry& e, uint32_t now) {
  if (e.state != CXLKV_ENTRY_WRITING || !writer_dead(e)) return false;
  if (!live_->node_alive(e.owner_node)) return true;
  return static_cast<int32_t>(now - e.lru_ms) >= static_cast<int32_t>(kSiblingWritingMs);  // stamped at reserve
}

void PrefixIndex::sweep_entries(std::vector<cxlkv_index_entry>& all) const {
  all.resize(hdr_.nslots);
  // rule 4 for the table: windows invalidated and fenced once each; a torn
  // or damaged line takes read_entry's careful path (read_window).
  for (uint32_t first = 0; first < hdr_.nslots; first += kSweepLines)
    read_window(first, std::min<uint32_t>(kSweepLines, hdr_.nslots - first), all.data() + first);
}

// Entries naming each slot as parent: live ones and pending drops.
static void count_named(const std::vector<cxlkv_index_entry>& all, uint32_t nslots, std::vector<uint32_t>& named) {
  named.assign(nslots, 0);
  for (uint32_t i = 0; i < nslots; i++) {
    const cxlkv_index_entry& e = all[i];
    if (!live_index_state(e.state) && !pending_drop(e, nslots)) continue;
    if (e.parent_slot < nslots && e.parent_slot != i) named[e.parent_slot]++;  // a line naming itself is damaged
  }
}

bool PrefixIndex::dead_pins(const cxlkv_index_entry& e) {
  if (e.state != CXLKV_ENTRY_READY || !(e.pin_mask & ~(1ULL << node_))) return false;
  cxlkv_index_entry copy = e;
  bool changed = false;
  pins_live(copy, &changed);
  return changed;
}

uint64_t PrefixIndex::repair_locked(StripeLockSet& ls, RepairReport& rep, std::vector<uint32_t>* parents) {
  const uint32_t ns = hdr_.nslots, ss = hdr_.stripe_slots;
  // The exact view: other stripes swept from memory (no entry naming a
  // held slot can appear or go in them while we hold it, "Children
  // counts"), the held stripes' lines through the set (read in one sweep).
  std::vector<cxlkv_index_entry> all;
  sweep_entries(all);
  std::vector<uint32_t> mine;
  for (const auto& h : ls.held())
    for (uint32_t i = 0; i < ss; i++) mine.push_back(h.stripe * ss + i);
  ls.prefetch(mine, {});
  for (uint32_t slot : mine) all[slot] = read_entry(slot);
  std::vector<uint32_t> named;
  count_named(all, ns, named);
  uint64_t fixed = 0;
  auto held = [&](uint32_t slot) { return slot < ns && ls.holds(slot / ss); };
  // 1. Pending drops whose both stripes are held: settled (the dropper is
  // dead, or will find them settled).
  for (uint32_t slot : mine) {
    const cxlkv_index_entry e = read_entry(slot);
    if (!pending_drop(e, ns) || !held(e.parent_slot)) continue;
    const uint32_t parent = e.parent_slot;
    if (!settle_drop(ls, slot, read_ext(slot).linked & CXLKV_EXT_REUSED)) continue;
    if (named[parent]) named[parent]--;
    rep.drops_settled++;
    fixed++;
  }
  // 2. Every held live count to the entries naming it.
  for (uint32_t slot : mine) {
    const cxlkv_index_entry e = read_entry(slot);
    if (!live_index_state(e.state) || e.children == named[slot]) continue;
    log().info("index: slot {}: children count {} but {} entries name it as parent: set to {} (online repair; "
               "left by a process that died mid-change)",
               slot, e.children, named[slot], named[slot]);
    ls.mark(slot / ss);
    (void)set_count_locked(ls, slot, e, named[slot]);
    rep.counts_fixed++;
    fixed++;
  }
  // 3. Leftovers of dead processes, leaf first: EVICTING entries (an
  // evictor died: only a holder evicts) and dead writers' WRITING blocks
  // without children; a parent in a held stripe loses its child at once and
  // may become such a leaf itself.
  std::vector<uint32_t> work;
  const uint32_t now = now_ms();
  for (uint32_t slot : mine) work.push_back(slot);
  while (!work.empty()) {
    const uint32_t slot = work.back();
    work.pop_back();
    const cxlkv_index_entry e = read_entry(slot);
    const bool evicting = e.state == CXLKV_ENTRY_EVICTING;
    if (!evicting && !(e.children == 0 && dead_writing(e, now))) continue;
    remove_locked(ls, slot, e, /*reclaim=*/true, parents);
    (evicting ? rep.evicting_finished : rep.writing_reclaimed)++;
    fixed++;
    if (held(e.parent_slot)) work.push_back(e.parent_slot);
  }
  // 4. Pin bits of dead nodes on READY blocks (as eviction clears them).
  for (uint32_t slot : mine) {
    cxlkv_index_entry e = read_entry(slot);
    if (!dead_pins(e)) continue;
    bool changed = false;
    pins_live(e, &changed);
    write_entry(slot, e, false);  // rule 1/3: NT line; fenced at release (stripe_lock_set.hpp)
    rep.pins_cleared++;
    fixed++;
  }
  return fixed;
}

Result<PrefixIndex::RepairReport> PrefixIndex::repair_index() {
  RepairReport rep;
  ctr_.repair_runs++;
  const uint32_t ns = hdr_.nslots, ss = hdr_.stripe_slots;
  std::vector<cxlkv_index_entry> all;
  std::vector<uint32_t> named;
  const uint32_t now = now_ms();
  for (int round = 0; round < kRepairRounds; round++) {
    // Lock-free: suspects.  A live holder's change in progress may look
    // like one; the locked pass below finds it settled (cost, not harm).
    sweep_entries(all);
    count_named(all, ns, named);
    std::vector<uint32_t> stripes;
    for (uint32_t i = 0; i < ns; i++) {
      const cxlkv_index_entry& e = all[i];
      bool suspect = false, with_parent = false;
      if (pending_drop(e, ns)) {
        suspect = with_parent = true;
      } else if (live_index_state(e.state)) {
        suspect = e.children != named[i] || dead_pins(e);
        if (e.state == CXLKV_ENTRY_EVICTING || dead_writing(e, now))
          suspect = with_parent = true;
      }
      if (!suspect) continue;
      stripes.push_back(i / ss);
      if (with_parent && e.parent_slot < ns) stripes.push_back(e.parent_slot / ss);
    }
    // A stripe line left dirty (its holder died mid-change, or one is in
    // its critical section now): its acquirer rebuilds the lists and
    // counters (stripe_lock_set.hpp), so the capacity counts the truth again.
    const std::vector<cxlkv_index_stripe> lines = read_stripes();
    for (uint32_t st = 0; st < lines.size(); st++)
      if (lines[st].list_dirty) stripes.push_back(st);
    if (stripes.empty()) break;
    std::sort(stripes.begin(), stripes.end());
    stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
    std::vector<uint32_t> parents;
    uint64_t fixed = 0;
    {
      StripeLockSet ls(*this);
      // rule 7: every change below is made under the lock of its stripe;
      // acquire rebuilds the lists of a stripe a dead holder left dirty.
      CXLKV_TRY(ls.acquire(stripes));
      fixed = repair_locked(ls, rep, &parents);
    }
    CXLKV_TRY(drop_children(parents));
    if (fixed == 0) break;  // what looked stale was a live holder's change in progress
  }
  ctr_.stale_counts_fixed += rep.counts_fixed;
  ctr_.dead_writes_reclaimed += rep.writing_reclaimed;
  ctr_.drops_settled += rep.drops_settled;
  if (rep.total())
    log().info("index: node {}: online repair: {} pending drops settled, {} children counts set, {} dead writers' "
               "blocks and {} interrupted evictions removed, {} dead nodes' pins cleared",
               node_, rep.drops_settled, rep.counts_fixed, rep.writing_reclaimed, rep.evicting_finished,
               rep.pins_cleared);
  return rep;
}

namespace {

// The index attached with no node live: no other party takes a stripe
// lock, so the stripe-lock protocol (list_dirty, fences, line cache) runs
// with locks that exclude nothing, and without a lock manager.
class OfflineStripeLocks final : public StripeLocks {
 public:
  Result<void> lock(uint32_t) override { return {}; }
  void unlock(uint32_t) override {}
};

// No node is live (checked before the attach).  set_children asks nothing
// about liveness; were it asked, every node is dead, as the check found.
class NoLiveNodes final : public NodeLiveness {
 public:
  bool alive(uint32_t, uint32_t) override { return false; }
  bool node_alive(uint32_t) override { return false; }
};

// A repair neither allocates nor frees payload.
class NoPayloadSpace final : public PayloadSpace {
 public:
  Result<BlockLocation> alloc(uint64_t bytes) override {
    return Error(-EPERM, "index repair: allocates no payload (" + std::to_string(bytes) + " bytes asked)");
  }
  void free(const BlockLocation& loc) override {
    log().error("index repair: asked to free bytes [{}, +{}): left as they are", loc.offset, loc.length);
  }
};

// "node 1 (pid 4242 on host a: process 4242 running on this host)", ...;
// empty when no node is live.
std::string live_nodes(const Region& pool, MemoryDomain& d) {
  std::string out;
  for (const NodeStatus& n : list_nodes(pool, d)) {
    if (!n.alive) continue;
    if (!out.empty()) out += ", ";
    out += "node " + std::to_string(n.node) + " (pid " + std::to_string(n.pid) + " on " +
           (n.host.empty() ? std::string("?") : n.host) + ": " + n.why + ")";
  }
  return out;
}

}  // namespace

Result<ChildCountRepairReport> index_repair_child_counts(const Region& pool, MemoryDomain& d) {
  const std::string who = "pool " + pool.uri() + ": ";
  // The node table (the liveness rule of `cxlkvctl node list`): a lock
  // manager holds the lease, not a node, so it does not count.
  if (auto ctrl = ControlCarve::open(pool, d); !ctrl)
    return Error(ctrl.error().code(), who + "cannot tell whether a node is live (" + ctrl.error().message() +
                                          "): children counts not repaired");
  if (std::string live = live_nodes(pool, d); !live.empty())
    return Error(-EBUSY, who + "refusing to repair children counts while nodes are live: " + live +
                             ".  The repair is offline (like fsck on an unmounted file system): stop every "
                             "process attached as a node of the pool (serving engines and KV sessions, "
                             "cxlkvctl kv commands, cxlkvd --index-service); a lock manager alone (cxlkvd) may "
                             "keep running.  `cxlkvctl node list` shows the nodes");
  auto hr = read_index_header(pool, d);  // missing, unformatted, damaged: named
  if (!hr) return hr.error();
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  // One exact snapshot: no node writes, so nothing is in flux (no settle).
  auto snap = index_child_count_snapshot(d, pool.at(ic->offset), ic->size, who + "index carve: ");
  if (!snap) return snap.error();
  ChildCountRepairReport rep;
  if (snap->empty()) return rep;
  OfflineStripeLocks locks;
  NoLiveNodes nobody;
  NoPayloadSpace space;
  // Node 0, incarnation 0: the attach needs an identity; set_children uses
  // none of it (no pins, no reservations, no liveness questions).
  auto ix = PrefixIndex::attach(d, pool.at(ic->offset), ic->size, 0, 0, locks, nobody, space);
  if (!ix) return Error(ix.error().code(), who + ix.error().message());
  for (const ChildCountMismatch& m : *snap) {
    bool listed = false;
    auto r = ix.value()->set_children(m.slot, m.key, m.stored, m.found, &listed);
    if (!r)
      return Error(r.error().code(), who + "index carve: block " + to_hex(m.key) + " (index slot " +
                                         std::to_string(m.slot) + "): " + r.error().message() + " (" +
                                         std::to_string(rep.repaired.size()) + " counts repaired before it)");
    if (r.value()) rep.repaired.push_back(ChildCountRepair{m, listed});
    else rep.changed.push_back(m);
  }
  // A node that attached while the repair ran may have changed what it
  // read: say so (the operator runs kv check again).
  rep.attached_meanwhile = live_nodes(pool, d);
  return rep;
}

}  // namespace cxlkv
