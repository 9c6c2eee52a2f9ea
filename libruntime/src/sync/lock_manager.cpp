// SPDX-License-Identifier: MIT
// The lock manager: grants the global tier of every lock, one waiting node
// at a time, round-robin (DESIGN.md "Cross-host locking").
//
// Per round it reads the doorbell of every attached node (O(nodes)) to
// learn new requests, polls the slot of the current holder of every active
// lock (O(active locks)) to see releases, and grants released locks to the
// next waiting node after the previous holder.  It never scans all slots
// except once at start (to adopt the state a previous manager left) and
// when a node's doorbell ring overflowed.  Everything it knows besides the
// pool is in this process, so a successor rebuilds it from the pool.
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"
#include "sync/backoff.hpp"
#include "sync/short_slice.hpp"
#include "sync/testing.hpp"
#include "sync/watcher.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {
using Clock = std::chrono::steady_clock;

constexpr uint32_t kNone = CXLKV_GRANT_NONE;

uint64_t waiting_word(uint64_t ticket) { return (ticket << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_WAITING; }
uint64_t sticky_word(uint64_t ticket) { return (ticket << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_STICKY; }
}  // namespace

struct LockManager::State {
  struct Lock {
    uint64_t waiters = 0;       // bit n: node n may be waiting (hint; the slot decides)
    uint32_t holder = kNone;
    uint64_t holder_ticket = 0;
    uint32_t last = 0;          // last granted node, for round-robin
    uint64_t grants = 0;
    bool revoked = false;       // the holder's grant carries CXLKV_GRANT_REVOKED
    bool contended = false;     // the holder's grant carries CXLKV_GRANT_CONTENDED (it will not keep it)
    uint64_t polled_req = 0;    // holder's request word read in this round's sweep
    bool active = false;        // in `active`
    Clock::time_point next_live_check{};
  };
  // Per node: what the node table says (refreshed with the node scan) and a
  // cache of the last process check, so a grant costs no /proc read.
  struct NodeInfo {
    cxlkv_node_entry entry{};
    uint32_t pid = 0;
    uint64_t start = 0;
    bool alive = false;
    Clock::time_point checked{};
  };
  uint64_t token = 0;
  uint64_t lease_heartbeat = 0;
  uint64_t epoch = 0;
  Clock::time_point last_renew{};
  Clock::time_point last_lease_check{};
  Clock::time_point last_node_scan{};
  std::vector<Lock> locks;
  std::vector<uint32_t> active;     // lock ids with a holder or waiters
  std::vector<uint64_t> db_seen;    // per node: doorbell seq processed
  std::vector<uint64_t> revokes;    // per node: last value written to its doorbell's `revokes`
  std::unique_ptr<sync::NodeWakers> wakers;  // nodes on this host: futex wake-ups
  uint64_t watch = 0;               // nodes whose doorbells are polled
  std::vector<NodeInfo> nodes;
  bool lease_lost = false;
  bool all_local = false;           // every watched node is on this host and wakes us (NodeWakers)
  std::atomic<uint64_t> rounds{0}, grants{0}, releases{0}, doorbells{0}, rescans{0}, sleeps{0};
  std::atomic<uint64_t> revokes_n{0}, dead_holders{0}, dead_waiters{0}, wakeups{0}, asks{0};
};

LockManager::LockManager(Region& r, MemoryDomain& d, ControlCarve c, LockManagerOptions o)
    : region_(r), domain_(d), ctrl_(c), opts_(o), st_(std::make_unique<State>()) {}

LockManager::~LockManager() {
  stop();
  release_lease();
}

namespace {

// Take the lease or explain who holds it.  No cross-host atomics: write our
// token, wait for racing writers to land, and check we are still the owner.
Result<cxlkv_lease> take_lease(Region& region, MemoryDomain& d, const ControlCarve& ctrl,
                               const LockManagerOptions& o, uint64_t token) {
  cxlkv_lease* lease = ctrl.lease();
  const auto lease_dur = std::chrono::milliseconds(o.lease_ms);
  const auto settle = std::chrono::milliseconds(std::max<uint32_t>(2, o.lease_ms / 50));
  for (;;) {
    cxlkv_lease cur = d.read_fresh(lease);  // rule 4
    bool free = cur.owner == 0;
    if (!free) {
      // Live while (owner, heartbeat) keeps changing within lease_ms.
      auto t0 = Clock::now();
      bool live = false;
      while (Clock::now() - t0 < lease_dur) {
        usleep(std::max<uint32_t>(1000, o.lease_ms * 1000 / 20));
        cxlkv_lease now = d.read_fresh(lease);  // rule 4
        if (now.owner != cur.owner || now.heartbeat != cur.heartbeat) {
          live = now.owner != 0;
          cur = now;
          if (now.owner == 0) free = true;
          break;
        }
      }
      if (live) {
        if (o.wait_for_lease) continue;
        return Error(-EBUSY, "pool " + region.uri() + ": lock manager lease held by a live manager (node " +
                                 std::to_string(cur.node) + ", pid " + std::to_string(cur.pid) + ", epoch " +
                                 std::to_string(cur.epoch) + ")");
      }
      if (!free)
        log().warn("pool {}: lock manager lease of node {} pid {} expired (no renewal for {} ms); taking over",
                   region.uri(), cur.node, cur.pid, o.lease_ms);
    }
    cxlkv_lease mine{};
    mine.owner = token;
    mine.heartbeat = 1;
    mine.node = o.node;
    mine.pid = static_cast<uint32_t>(getpid());
    mine.lease_ms = o.lease_ms;
    mine.epoch = cur.epoch + 1;
    mine.renew_ns = realtime_ns();
    d.publish_line(lease, &mine);  // rule 1: the lease line changes writer -> whole line, NT
    d.fence();
    std::this_thread::sleep_for(settle);
    cxlkv_lease check = d.read_fresh(lease);  // rule 4
    if (check.owner == token) return check;
    if (!o.wait_for_lease)
      return Error(-EBUSY, "pool " + region.uri() + ": lost the race for the lock manager lease to node " +
                               std::to_string(check.node) + " pid " + std::to_string(check.pid));
  }
}

}  // namespace

Result<std::unique_ptr<LockManager>> LockManager::create(Region& region, MemoryDomain& d,
                                                         const LockManagerOptions& opts) {
  auto ctrl = ControlCarve::open(region, d);
  if (!ctrl) return ctrl.error();
  if (opts.lease_ms < LockManagerOptions::kMinLeaseMs)
    return Error(-EINVAL, "lock manager: lease_ms must be at least " + std::to_string(LockManagerOptions::kMinLeaseMs));
  std::unique_ptr<LockManager> m(new LockManager(region, d, ctrl.value(), opts));
  State& s = *m->st_;
  while (s.token == 0)
    if (getrandom(&s.token, sizeof s.token, 0) != sizeof s.token) s.token = realtime_ns() ^ getpid();
  auto lease = take_lease(region, d, ctrl.value(), opts, s.token);
  if (!lease) {
    s.token = 0;  // nothing to release
    return lease.error();
  }
  s.lease_heartbeat = lease->heartbeat;
  s.epoch = lease->epoch;
  s.last_renew = s.last_lease_check = Clock::now();

  // Adopt what the previous manager left: current holders from the grants,
  // waiters from a full slot scan (the only full scan in normal operation).
  const uint32_t nodes = ctrl->max_nodes(), nlocks = ctrl->max_locks();
  s.locks.resize(nlocks);
  s.db_seen.resize(nodes);
  s.nodes.resize(nodes);
  s.revokes.resize(nodes);
  s.wakers = std::make_unique<sync::NodeWakers>(region, nodes);
  for (uint32_t n = 0; n < nodes; n++) {
    s.db_seen[n] = d.read_fresh(&ctrl->doorbell(n)->seq);     // rule 4
    s.revokes[n] = d.read_fresh(&ctrl->doorbell(n)->revokes);  // rule 4
  }
  for (uint32_t l = 0; l < nlocks; l++) {
    auto& L = s.locks[l];
    L.last = nodes - 1;
    cxlkv_lock_grant g = d.read_fresh(ctrl->grant(l));  // rule 4
    L.grants = g.grants;
    if (g.node < nodes) {
      const uint64_t req = d.read_fresh(&ctrl->slot(l, g.node)->request);  // rule 4
      const bool revoked = g.flags & CXLKV_GRANT_REVOKED;
      // In use or kept: the grant stands until the node releases it, revoked
      // or not (a revocation waits for the node's acknowledgement).
      if (req == waiting_word(g.ticket) || req == sticky_word(g.ticket)) {
        L.holder = g.node;
        L.holder_ticket = g.ticket;
        L.revoked = revoked;
        L.contended = g.flags & CXLKV_GRANT_CONTENDED;
        L.last = g.node;
      }
    }
    for (uint32_t n = 0; n < nodes; n++) {
      if (n == L.holder) continue;
      uint64_t req = d.read_fresh(&ctrl->slot(l, n)->request);  // rule 4
      if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_WAITING) L.waiters |= 1ull << n;
    }
    if (L.waiters) {
      L.active = true;
      s.active.push_back(l);
    }
  }
  log().info("pool {}: lock manager started (epoch {}, {} locks, {} nodes, {} active)", region.uri(), s.epoch,
             nlocks, nodes, s.active.size());
  return m;
}

namespace {

// One round of the manager (LockManager::run_once), in its steps: the lease,
// the node table, the doorbells, the holders' slots, then each active lock
// in ascending order (its holder, then a grant).  Each step keeps the
// coherence rules it cites (docs/coherence.md); the steps run in the order
// the single function had them.
struct Round {
  using State = LockManager::State;
  State& s;
  MemoryDomain& d;
  Region& region;
  const ControlCarve& ctrl;
  const LockManagerOptions& opts;
  const uint32_t nodes = ctrl.max_nodes();
  const uint32_t nlocks = ctrl.max_locks();
  const Clock::time_point now = Clock::now();
  bool may_grant = false;  // this manager renewed its lease recently enough to grant
  bool did = false;        // something changed: a grant, a release, a doorbell, ...

  Result<void> keep_lease() {
    const auto lease_dur = std::chrono::milliseconds(opts.lease_ms);
    // ---- lease: renew every lease_ms/4, and check ownership at least every ms ----
    if (now - s.last_lease_check >= std::chrono::milliseconds(1) || now - s.last_renew >= lease_dur / 4) {
      cxlkv_lease cur = d.read_fresh(ctrl.lease());  // rule 4
      s.last_lease_check = now;
      if (cur.owner != s.token) {
        s.lease_lost = true;
        log().error("pool {}: lock manager lease taken by node {} pid {} (epoch {}); this manager stops",
                    region.uri(), cur.node, cur.pid, cur.epoch);
        return Error(-ENOLCK, "pool " + region.uri() + ": lock manager lost its lease");
      }
      if (now - s.last_renew >= lease_dur / 4) {
        cur.heartbeat = ++s.lease_heartbeat;
        cur.renew_ns = realtime_ns();
        d.publish_line(ctrl.lease(), &cur);  // rule 1: whole line, NT
        d.fence();                            // rule 3
        s.last_renew = now;
      }
    }
    // Self-fencing: a manager that could not renew for lease_ms/2 (stalled)
    // grants nothing, so a successor never overlaps with it.
    may_grant = now - s.last_renew < lease_dur / 2;
    return {};
  }

  void scan_nodes() {
    // ---- which nodes to watch: attached ones (node table), refreshed every 20 ms ----
    // One sweep as well: invalidate the whole node table, one fence, load.
    if (now - s.last_node_scan >= std::chrono::milliseconds(20)) {
      s.last_node_scan = now;
      d.invalidate(ctrl.node_entry(0), size_t(nodes) * sizeof(cxlkv_node_entry));
      d.fence();  // rule 4: the invalidations complete before the loads below
      uint64_t w = 0;
      for (uint32_t n = 0; n < nodes; n++) {
        s.nodes[n].entry = d.read(ctrl.node_entry(n));  // invalidated above (rule 4)
        if (s.nodes[n].entry.state == CXLKV_NODE_ACTIVE) w |= 1ull << n;
        s.wakers->refresh(n, s.nodes[n].entry);
      }
      s.watch = w;
      s.wakers->stamp(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()));
      s.all_local = s.wakers->all_open(w);
    }
  }

  void read_doorbells() {
    // ---- doorbells: new requests.  One sweep: invalidate every watched
    // doorbell, one fence, then load them (rule 4 for all of them at once). ----
    if (!sync::testing::break_doorbell_invalidate())
      for (uint64_t w = s.watch; w; w &= w - 1) {
        const uint32_t n = static_cast<uint32_t>(__builtin_ctzll(w));
        d.invalidate_clean(ctrl.doorbell(n), sizeof(cxlkv_doorbell));  // rule 4 (doorbells: NT-only, rule 1)
      }
    d.fence();  // rule 4: the invalidations complete before the loads below
    for (uint64_t w = s.watch; w; w &= w - 1) {
      const uint32_t n = static_cast<uint32_t>(__builtin_ctzll(w));
      cxlkv_doorbell* db = ctrl.doorbell(n);
      const uint64_t seq = d.read(&db->seq);  // seq before pending[]: the poster wrote them in the other order
      if (seq == s.db_seen[n]) continue;
      did = true;
      s.doorbells.fetch_add(1, std::memory_order_relaxed);
      auto note_waiter = [&](uint32_t l) {
        if (l >= nlocks) return;
        auto& L = s.locks[l];
        L.waiters |= 1ull << n;
        if (!L.active) {
          L.active = true;
          s.active.push_back(l);
        }
      };
      if (seq - s.db_seen[n] >= CXLKV_DOORBELL_RING) {
        // Fell behind the ring (or the node's seq restarted): rescan its slots.
        s.rescans.fetch_add(1, std::memory_order_relaxed);
        for (uint32_t l = 0; l < nlocks; l++) {
          uint64_t req = d.read_fresh(&ctrl.slot(l, n)->request);  // rule 4
          if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_WAITING) note_waiter(l);
        }
      } else {
        uint32_t pending[CXLKV_DOORBELL_RING];
        d.load(pending, db->pending, sizeof pending);  // same line as seq: invalidated above
        for (uint64_t q = s.db_seen[n]; q != seq; q++) note_waiter(pending[q % CXLKV_DOORBELL_RING]);
      }
      s.db_seen[n] = seq;
    }
  }

  void poll_holders() {
    // ---- holders of active locks (locks somebody waits for): one sweep of
    // invalidations, one fence, then the loads (rule 4). ----
    bool any_polled = false;
    for (uint32_t l : s.active)
      if (s.locks[l].holder != kNone) {
        any_polled = true;
        d.invalidate_clean(ctrl.slot(l, s.locks[l].holder), sizeof(cxlkv_lock_slot));  // rule 4 (slots: NT-only, rule 1)
      }
    if (any_polled) d.fence();  // rule 4: all invalidations complete before the loads
    for (uint32_t l : s.active)
      if (s.locks[l].holder != kNone) s.locks[l].polled_req = d.read(&ctrl.slot(l, s.locks[l].holder)->request);
  }

  // Whether this manager can judge node n's processes: only on their host
  // (pid + start time mean nothing elsewhere).
  bool judges_processes(uint32_t n) {
    const cxlkv_node_entry& e = s.nodes[n].entry;
    return e.host_id != 0 && e.host_id == this_host_id() && !sync::testing::manager_on_another_host();
  }
  // Liveness of the owner of node n's slot of lock l (a waiting or holding
  // request): on this host its process (pid + start time), else the node's
  // heartbeat.  Cached per node for opts.liveness_check.
  bool owner_alive(uint32_t n, const cxlkv_lock_slot& sl) {
    State::NodeInfo& ni = s.nodes[n];
    const bool local = judges_processes(n);
    if (local) {
      if (ni.pid == sl.owner_pid && ni.start == sl.owner_start && now - ni.checked < opts.liveness_check)
        return ni.alive;
      ni.pid = sl.owner_pid;
      ni.start = sl.owner_start;
      ni.alive = process_alive(sl.owner_pid, sl.owner_start);
    } else {
      if (ni.pid == 0 && now - ni.checked < opts.liveness_check) return ni.alive;
      ni.pid = 0;
      ni.entry = d.read_fresh(ctrl.node_entry(n));  // rule 4
      ni.alive = judge_node(ni.entry).alive;
    }
    ni.checked = now;
    return ni.alive;
  }
  void write_grant(uint32_t l, uint32_t n, uint64_t ticket, uint32_t flags) {
    cxlkv_lock_grant g{};
    g.ticket = ticket;
    g.node = n;
    g.flags = flags;
    g.grants = s.locks[l].grants;
    d.publish_line(ctrl.grant(l), &g);  // rule 1: the grant line changes writer at takeover -> NT
  }
  // Ask node n's watcher to look at the grants it keeps or holds: bump the
  // revocation counter of its doorbell (rule 1: NT, manager-only bytes),
  // fence (rule 3), and wake it where it is on this host.
  void bump_revokes(uint32_t n) {
    d.write_nt<__u64>(&ctrl.doorbell(n)->revokes, ++s.revokes[n]);
    d.fence();
    s.wakers->wake_revoke(n);
  }
  // Ask the holder of lock l to give its grant back: the grant first
  // (REVOKED, whole line), fence (rule 3: a watcher that sees the counter
  // move reads the revoked grant), then the counter.
  void ask_node(uint32_t l, uint32_t flags) {
    write_grant(l, s.locks[l].holder, s.locks[l].holder_ticket, flags);
    d.fence();
    bump_revokes(s.locks[l].holder);
  }

  // A lock with a holder: released, asked back for a waiter, or its holder
  // judged alive or dead.
  void check_holder(uint32_t l) {
    auto& L = s.locks[l];
    const uint64_t req = L.polled_req;  // read fresh in the sweep above (rule 4)
    // WAITING: in use or kept; STICKY: kept (protocol version 1).  Either
    // way the node holds the grant until it writes something else.
    const bool holds = req == waiting_word(L.holder_ticket) || req == sticky_word(L.holder_ticket);
    const bool others = (L.waiters & ~(1ull << L.holder)) != 0;
    if (!holds) {
      // IDLE (released / acknowledged / withdrawn / module), or a newer request.
      if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_WAITING) L.waiters |= 1ull << L.holder;
      L.holder = kNone;
      did = true;
      s.releases.fetch_add(1, std::memory_order_relaxed);
    } else if (others && !L.revoked && !L.contended && may_grant) {
      // Another node waits for a grant the holder may keep: ask its node
      // to give it back.  The lock moves on only when the node writes its
      // slot IDLE (uapi "Sticky grants").
      ask_node(l, CXLKV_GRANT_REVOKED);
      L.revoked = true;
      did = true;
      s.revokes_n.fetch_add(1, std::memory_order_relaxed);
      L.next_live_check = now + opts.liveness_check;
    } else if (others && now >= L.next_live_check) {
      // Others wait: is the holder alive?
      L.next_live_check = now + opts.liveness_check;
      const cxlkv_lock_slot held_by = d.read_fresh(ctrl.slot(l, L.holder));  // rule 4
      const bool alive = owner_alive(L.holder, held_by);
      if (alive && L.contended && !judges_processes(L.holder) && may_grant && !sync::testing::break_ask_remote()) {
        // Its node lives, on another host: this manager cannot see the
        // holder's process, its node can (uapi "Dead processes of live
        // nodes").  Ask it, as for a kept grant: its watcher releases for
        // a holder that died (robust node-local mutex); a live holder
        // releases IDLE anyway (CONTENDED).  Asked again at every check
        // while the grant stands: a watcher that found the holder alive
        // answered once, and the holder may die later.
        if (!L.revoked) {
          ask_node(l, CXLKV_GRANT_REVOKED | CXLKV_GRANT_CONTENDED);
          L.revoked = true;
        } else {
          bump_revokes(L.holder);
        }
        s.asks.fetch_add(1, std::memory_order_relaxed);
      } else if (!alive) {
        // A CONTENDED grant is never kept: its dead holder's lock moves on.
        // A grant the node may keep moves on only with the node's answer
        // (its watcher recovers the dead process's node-local mutex and
        // releases) or when the whole node is dead.
        bool pass = L.contended;
        if (!pass) {
          State::NodeInfo& ni = s.nodes[L.holder];
          ni.entry = d.read_fresh(ctrl.node_entry(L.holder));  // rule 4
          pass = !judge_node(ni.entry).alive;
          if (pass) {
            // The slot once more (rule 4): a process of the node that
            // re-entered on the kept grant meanwhile wrote its owner
            // record before it judged the keeper alive
            // (two_tier_lock.cpp, kept_grant_is_ours); it holds the
            // grant now and is judged at the next check.
            const cxlkv_lock_slot again = d.read_fresh(ctrl.slot(l, L.holder));
            pass = again.owner_pid == held_by.owner_pid && again.owner_start == held_by.owner_start;
          }
        }
        if (pass) {
          log().warn("pool {}: lock {}: holder node {} (ticket {}) is dead; granting the next waiter",
                     region.uri(), l, L.holder, L.holder_ticket);
          L.holder = kNone;
          did = true;
          s.dead_holders.fetch_add(1, std::memory_order_relaxed);
        } else if (L.revoked) {
          s.wakers->wake_revoke(L.holder);  // its watcher releases for the dead process
        }
      }
    }
  }

  // A free lock somebody waits for: grant it to the next live, eligible
  // waiter after the last holder (round-robin).
  void grant_next(uint32_t l) {
    auto& L = s.locks[l];
    uint64_t later = 0;  // waiters whose set has not got its lower lock yet: they stay
    for (uint32_t k = 1; k <= nodes && L.waiters; k++) {
      const uint32_t n = (L.last + k) % nodes;
      if (!(L.waiters & (1ull << n))) continue;
      L.waiters &= ~(1ull << n);
      const cxlkv_lock_slot sl = d.read_fresh(ctrl.slot(l, n));  // rule 4: grant only a live request
      const uint64_t req = sl.request;
      if ((req & CXLKV_SLOT_STATE_MASK) != CXLKV_SLOT_WAITING) continue;
      // Liveness first: a dead waiter is dropped, also one that is not yet
      // eligible (kept as a waiter, it would keep the lock contended and
      // revoke every grant of it for ever).
      if (!owner_alive(n, sl)) {
        s.dead_waiters.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // A set's request: only once the node holds the set's previous lock
      // with the very request that links to it (uapi "Lock sets").  A link
      // that does not point below this lock is not one our runtime writes:
      // it is ignored (the request is granted as a single lock).
      if (sl.prev_lock != 0 && sl.prev_lock - 1 < l && !sync::testing::break_set_order()) {
        const auto& P = s.locks[sl.prev_lock - 1];
        if (P.holder != n || P.holder_ticket != sl.prev_ticket) {
          later |= 1ull << n;
          continue;
        }
      }
      ++L.grants;
      // Others still waiting: tell the holder not to keep the grant.
      write_grant(l, n, req >> CXLKV_SLOT_TICKET_SHIFT, (L.waiters | later) ? CXLKV_GRANT_CONTENDED : 0u);
      d.fence();  // rule 3
      s.wakers->wake_grant(n);  // after the fence: a woken waiter reads the grant
      L.holder = n;
      L.holder_ticket = req >> CXLKV_SLOT_TICKET_SHIFT;
      L.revoked = false;
      L.contended = (L.waiters | later) != 0;
      L.last = n;
      L.next_live_check = now + opts.liveness_check;
      did = true;
      s.grants.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    L.waiters |= later;
  }

  // ---- releases, revocations, dead holders, grants ----
  // In ascending lock order: a set's requests (uapi "Lock sets") become
  // eligible one after the other as the lower one is granted, so a set whose
  // locks are free is granted whole in this one round.
  void settle_locks() {
    std::sort(s.active.begin(), s.active.end());
    bool retired = false;
    for (size_t i = 0; i < s.active.size(); i++) {
      const uint32_t l = s.active[i];
      auto& L = s.locks[l];
      if (L.holder != kNone) check_holder(l);
      if (L.holder == kNone && L.waiters && may_grant) grant_next(l);
      if (!L.waiters) {
        // Nobody waits: stop polling.  A kept or held grant stays in L.holder
        // and is looked at again when a doorbell names this lock.
        L.active = false;
        retired = true;
      }
    }
    if (retired) std::erase_if(s.active, [&](uint32_t l) { return !s.locks[l].active; });
  }
};

}  // namespace

Result<bool> LockManager::run_once() {
  State& s = *st_;
  if (s.lease_lost) return Error(-ENOLCK, "pool " + region_.uri() + ": lock manager lost its lease");
  s.rounds.fetch_add(1, std::memory_order_relaxed);
  Round round{s, domain_, region_, ctrl_, opts_};
  if (auto r = round.keep_lease(); !r) return r.error();
  round.scan_nodes();
  round.read_doorbells();
  round.poll_holders();
  round.settle_locks();
  return round.did;
}

Result<void> LockManager::run(const std::atomic<bool>& stop) {
  State& s = *st_;
  sync::request_short_slice();  // every grant and revocation waits for this thread (short_slice.hpp)
  sync::Backoff backoff(opts_.poll.spin_rounds, opts_.poll.yield_rounds, opts_.poll.max_sleep);
  // Nodes on this host wake a sleeping manager when they post a request or
  // release a lock (sync::wake_manager): it then sleeps in the kernel instead
  // of polling -- after a short yield phase, and up to kWokenSleep when every
  // watched node can wake it (else max_sleep: a node on another host is
  // only seen by polling).  The sleep stays bounded for the lease renewal
  // and the liveness checks of holders others wait for.
  constexpr uint32_t kWokenYields = 16;
  constexpr auto kWokenSleep = std::chrono::milliseconds(2);
  uint32_t idle_rounds = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    auto r = run_once();
    if (!r) return r.error();
    if (r.value()) {
      backoff.reset();
      idle_rounds = 0;
      // Something changed (a grant, a release): let a waiter that shares
      // this CPU run now instead of after our spin phase (2-core machines).
      sched_yield();
      continue;
    }
    idle_rounds++;
    if (s.all_local && idle_rounds > opts_.poll.spin_rounds + std::min(kWokenYields, opts_.poll.yield_rounds)) {
      s.wakers->arm();
      auto again = run_once();  // what was written before our flag was seen
      if (!again || again.value()) {
        s.wakers->disarm();
        if (!again) return again.error();
        backoff.reset();
        idle_rounds = 0;
        continue;
      }
      s.sleeps.fetch_add(1, std::memory_order_relaxed);
      if (s.wakers->sleep(uint64_t(std::chrono::nanoseconds(kWokenSleep).count())))
        s.wakeups.fetch_add(1, std::memory_order_relaxed);
      s.wakers->disarm();
      continue;
    }
    if (backoff.idle()) s.sleeps.fetch_add(1, std::memory_order_relaxed);
  }
  return {};
}

void LockManager::start() {
  if (thread_.joinable()) return;
  stop_.store(false);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "cxlkv-lockmgr");
    auto r = run(stop_);
    if (!r) log().error("{}", r.error().message());
  });
}

void LockManager::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void LockManager::release_lease() {
  State& s = *st_;
  if (s.token == 0 || s.lease_lost) return;
  cxlkv_lease cur = domain_.read_fresh(ctrl_.lease());  // rule 4
  if (cur.owner == s.token) {
    cur.owner = 0;
    cur.renew_ns = realtime_ns();
    domain_.publish_line(ctrl_.lease(), &cur);  // rule 1
    domain_.fence();
  }
  s.token = 0;
}

LockManagerStats LockManager::stats() const {
  LockManagerStats o;
  o.rounds = st_->rounds.load();
  o.grants = st_->grants.load();
  o.releases = st_->releases.load();
  o.doorbells = st_->doorbells.load();
  o.rescans = st_->rescans.load();
  o.sleeps = st_->sleeps.load();
  o.revokes = st_->revokes_n.load();
  o.dead_holders = st_->dead_holders.load();
  o.dead_waiters = st_->dead_waiters.load();
  o.asks = st_->asks.load();
  o.wakeups = st_->wakeups.load();
  o.epoch = st_->epoch;
  return o;
}

}  // namespace cxlkv
