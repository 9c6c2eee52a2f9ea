// SPDX-License-Identifier: MIT
// Offline repair of children counts (cxlkvctl kv check --repair): a process
// that dies between removing a child and dropping its parent's count in
// another stripe (drop_children, after the child's lock is released) leaves
// a READY parent whose count no child accounts for: never a leaf, never
// evicted, and reclaim_dead cannot tell it from a live writer's count held
// between reserve rounds (prefix_index.cpp, repair_child_counts).  With no
// node live, nobody holds such a count, so the count found is the truth.
#include <cerrno>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"
#include "index/index_check.hpp"
#include "index/index_internal.hpp"
#include "index/lock_set.hpp"
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
  LockSet ls(*this);
  // rule 7: the entry, its ext record and the stripe's lists change only
  // under the stripe's lock; acquire reads them fresh (rule 4) and rebuilds
  // a stripe a dead holder left dirty.
  CXLKV_TRY(ls.acquire({s}, std::span<const uint32_t>(&slot, 1), std::span<const uint32_t>(&slot, 1)));
  cxlkv_index_entry e = read_entry(slot);
  if (!live_index_state(e.state) || e.key_lo != key.lo || e.key_hi != key.hi || e.children != expected) return false;
  // list_dirty first: a repair that dies between the entry and the list
  // leaves the stripe for the next holder to rebuild from the entries.
  ls.mark(s);
  e.children = children;
  write_entry(slot, e, /*bump=*/false);  // rule 1/3: whole line NT with its check; fenced at release (lock_set.hpp)
  // The lists hold exactly the READY memory leaves (uapi "Eviction lists").
  const bool leaf = e.state == CXLKV_ENTRY_READY && children == 0 && e.loc_tier == CXLKV_TIER_MEM;
  const bool linked = read_ext(slot).linked & CXLKV_EXT_LINKED;
  if (leaf && !linked) link_leaf(ls, slot, e);  // as child_dropped links a parent whose last child went
  else if (!leaf && linked) unlink(ls, slot);  // as child_added unlinks a parent that gains one
  if (listed) *listed = leaf;
  log().info("index: slot {}: children count {} -> {} (offline repair{})", slot, expected, children,
             leaf && !linked ? "; linked as an evictable leaf" : "");
  return true;
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
