// SPDX-License-Identifier: MIT
// The two-tier lock (DESIGN.md "Cross-host locking"; slot protocol in
// uapi/cxlkv_ctrl.h).
//
// acquire:  local robust mutex (at most one process per node competes
//           globally) -> ticket + 1 -> slot := (ticket<<2)|WAITING (NT) ->
//           doorbell -> poll the grant until it names (node, ticket).
// release:  a grant that may be kept (not CONTENDED, not revoked) is kept:
//           nothing is written to the pool (uapi "Sticky grants"); else
//           slot := (ticket<<2)|IDLE (NT) -> local mutex unlock.
// dev: pools: the process's device file owns the slot from before WAITING
//           until after the release (kernel_slots.hpp), so the module sets
//           it IDLE if the process dies in between.
// recovery: a local locker that gets EOWNERDEAD finds in the local entry
//           what the dead process left in the pool (phase + ticket) and
//           writes (ticket<<2)|IDLE itself, exactly as the kernel module does
//           for a closed file on a dev: pool; the write is idempotent.
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "cxlkv/sync.hpp"
#include "sync/backoff.hpp"
#include "sync/doorbell.hpp"
#include "sync/kernel_slots.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "sync/testing.hpp"
#include "sync/watcher.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace sync {

void ring_doorbell(NodeContext& n, std::span<const uint32_t> ids) {
  if (ids.empty()) return;
  MemoryDomain& d = n.domain();
  NodeLocalHeader* h = n.local().hdr;
  sync::RobustLock g(&h->doorbell_mu, "doorbell");
  cxlkv_doorbell* db = n.control().doorbell(n.node());
  if (!h->doorbell_valid || g.owner_died()) {
    // rule 4: the pool's seq is authoritative after (re)creation or a crash mid-post.
    h->doorbell_seq = d.read_fresh(&db->seq);
    h->doorbell_valid = 1;
  }
  uint64_t seq = h->doorbell_seq;
  // rule 1 + rule 3: entries first (NT), fence, then the seq that publishes them.
  for (uint32_t id : ids.first(std::min<size_t>(ids.size(), kMaxHints + 1))) d.write_nt(&db->pending[seq++ % CXLKV_DOORBELL_RING], id);
  d.fence();
  d.write_nt<__u64>(&db->seq, seq);
  d.fence();
  h->doorbell_seq = seq;
  sync::wake_manager(h);  // a manager on this host sleeping for lack of work
}

}  // namespace sync

namespace sync::testing {
namespace {
std::atomic<bool> g_break_lock_flush{false};
std::atomic<bool> g_break_watcher_local{false};
std::atomic<bool> g_break_doorbell_invalidate{false};
std::atomic<void (*)(uint32_t)> g_grant_seen_hook{nullptr};
std::atomic<bool> g_watcher_no_resweep{false};
std::atomic<bool> g_break_set_order{false};
std::atomic<bool> g_break_set_grant_invalidate{false};
std::atomic<bool> g_manager_on_another_host{false};
std::atomic<bool> g_break_ask_remote{false};
std::atomic<bool> g_break_kept_grant_check{false};
}
void set_break_kept_grant_check(bool on) { g_break_kept_grant_check.store(on); }
bool break_kept_grant_check() { return g_break_kept_grant_check.load(std::memory_order_relaxed); }
std::atomic<bool> g_break_lapse_check{false};
std::atomic<uint64_t> g_keeper_checks{0};
void count_keeper_check() { g_keeper_checks.fetch_add(1, std::memory_order_relaxed); }
uint64_t keeper_checks() { return g_keeper_checks.load(std::memory_order_relaxed); }
void set_break_lapse_check(bool on) { g_break_lapse_check.store(on); }
bool break_lapse_check() { return g_break_lapse_check.load(std::memory_order_relaxed); }
void set_manager_on_another_host(bool on) { g_manager_on_another_host.store(on); }
bool manager_on_another_host() { return g_manager_on_another_host.load(std::memory_order_relaxed); }
void set_break_ask_remote(bool on) { g_break_ask_remote.store(on); }
bool break_ask_remote() { return g_break_ask_remote.load(std::memory_order_relaxed); }
void set_break_set_grant_invalidate(bool on) { g_break_set_grant_invalidate.store(on); }
bool break_set_grant_invalidate() { return g_break_set_grant_invalidate.load(std::memory_order_relaxed); }
void set_break_set_order(bool on) { g_break_set_order.store(on); }
bool break_set_order() { return g_break_set_order.load(std::memory_order_relaxed); }
void set_grant_seen_hook(void (*hook)(uint32_t)) { g_grant_seen_hook.store(hook); }
void grant_seen_hook(uint32_t lock_id) {
  if (auto h = g_grant_seen_hook.load(std::memory_order_relaxed)) h(lock_id);
}
void set_watcher_no_resweep(bool on) { g_watcher_no_resweep.store(on); }
bool watcher_no_resweep() { return g_watcher_no_resweep.load(std::memory_order_relaxed); }
void set_break_doorbell_invalidate(bool on) { g_break_doorbell_invalidate.store(on); }
bool break_doorbell_invalidate() { return g_break_doorbell_invalidate.load(std::memory_order_relaxed); }
void set_break_watcher_local(bool on) { g_break_watcher_local.store(on); }
bool break_watcher_local() { return g_break_watcher_local.load(std::memory_order_relaxed); }
void set_break_lock_flush(bool on) { g_break_lock_flush.store(on); }
bool break_lock_flush() { return g_break_lock_flush.load(std::memory_order_relaxed); }
}  // namespace sync::testing

namespace {

constexpr uint64_t request_word(uint64_t ticket, uint64_t state) {
  return (ticket << CXLKV_SLOT_TICKET_SHIFT) | state;
}

// A waiter counted in its node's grant_sleepers (node-local, one host:
// plain atomics) from its first sleep until it stops waiting, so a manager
// on this host knows to wake it after a grant (see the poll loops below).
class GrantSleeper {
 public:
  explicit GrantSleeper(NodeLocalHeader* h) : h_(h) {}
  ~GrantSleeper() {
    if (counted_) __atomic_fetch_sub(&h_->grant_sleepers, 1u, __ATOMIC_SEQ_CST);
  }
  GrantSleeper(const GrantSleeper&) = delete;
  GrantSleeper& operator=(const GrantSleeper&) = delete;
  // Counts this waiter once (later calls do nothing).
  void count() {
    if (counted_) return;
    __atomic_fetch_add(&h_->grant_sleepers, 1u, __ATOMIC_SEQ_CST);
    counted_ = true;
  }

 private:
  NodeLocalHeader* h_;
  bool counted_ = false;
};

std::string lock_name(const NodeContext& n, uint32_t id) {
  return "pool " + n.region().uri() + ": lock " + std::to_string(id) + " (node " + std::to_string(n.node()) + ")";
}

// The slot's owner (pid + start time): the manager on this host judges a
// holder or waiter dead by it (rule 1: the line is also written by the
// module on dev: pools -> NT).
void write_owner(MemoryDomain& d, cxlkv_lock_slot* slot, uint32_t pid) {
  d.write_nt(&slot->owner_pid, pid);
  d.write_nt<__u64>(&slot->owner_start, self_start_time());
}

// A fast-path attempt that failed left (ticket<<2)|WAITING with the old
// ticket; withdraw it before giving up (rule 1: NT; rule 3: fence).
void withdraw_after_fast_path(MemoryDomain& d, cxlkv_lock_slot* slot, const LocalLockEntry& e) {
  if (e.phase != LockPhase::requested) return;
  d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));
  d.fence();
}

// The sticky fast path's question, under lock `id`'s node-local mutex with
// its phase `cached` and not revoked: is the kept grant still this node's?
// Node-local memory says so only while the process that kept it lives.  The
// manager takes a kept grant back without the node's answer from a node it
// judges dead (uapi/cxlkv_ctrl.h "Sticky grants"), and a node whose process
// was killed is dead until a successor beats; the successor (or a sibling
// process, while the node entry still names the dead one) then found
// `cached` in node-local memory for a grant another node held: two holders.
// A grant this process kept itself is its own (process memory; a successor
// that reuses the dead keeper's pid has none).  Another process's is its
// keeper's while that keeper lives (pid + start time from the slot's owner
// record: the liveness rule, docs/coherence.md#liveness); else false, and
// the caller asks anew.  Either way this process is the slot's owner after.
//
// In two halves, so that a lock set asks about each keeper once
// (acquire_set): enter_kept writes our owner record and says whose grant it
// was; the verdict on that keeper comes after a fence.  The order is what
// makes it safe: a manager that judged the keeper dead reads the slot again
// before it passes the grant on (lock_manager.cpp), so it never passes a
// grant whose new owner record was in memory before a verdict that found
// the keeper alive -- one verdict after all of a set's owner records serves
// them all.
struct KeptEntry {
  bool own = false;            // this process kept it: no verdict needed
  bool owner_matches = false;  // the slot's owner record still names the keeper
  uint32_t keeper = 0;
  uint64_t keeper_start = 0;
};
KeptEntry enter_kept(NodeContext& n, uint32_t id, LocalLockEntry& e, uint32_t me) {
  if (e.holder_pid == me && n.local().kept_here[id]) return {true};  // no pool access: the fast path stays fast
  MemoryDomain& d = n.domain();
  cxlkv_lock_slot* slot = n.control().slot(id, n.node());
  const cxlkv_lock_slot cur = d.read_fresh(slot);  // rule 4: the keeper's owner record
  KeptEntry k{false, cur.owner_pid == e.holder_pid, e.holder_pid, cur.owner_start};
  write_owner(d, slot, me);  // rule 1: NT; the caller fences before the verdict (rule 3)
  e.holder_pid = me;
  return k;
}

// The verdict on a keeper enter_kept named, after the fence that put our
// owner record in memory.
bool keeper_lives(const KeptEntry& k) {
  sync::testing::count_keeper_check();
  if (sync::testing::break_kept_grant_check()) return true;
  return k.owner_matches && process_alive(k.keeper, k.keeper_start);
}

bool kept_grant_is_ours(NodeContext& n, uint32_t id, LocalLockEntry& e, uint32_t me) {
  const KeptEntry k = enter_kept(n, id, e, me);
  if (k.own) return true;
  n.domain().fence();  // rule 3: our owner record is in memory before the verdict
  return keeper_lives(k);
}

constexpr uint32_t kSpinPolls = 0;   // see the poll loop in acquire()
constexpr auto kReRing = std::chrono::seconds(1);  // waiting this long: ring the doorbell again
constexpr uint32_t kYieldPolls = 64;
constexpr std::chrono::microseconds kMaxSleep{20};

// The local tier of lock `id`: its node-local robust mutex (bounded by
// `deadline` when `bounded`).  A local holder that died holding it left its
// request, grant or kept grant in the pool: released here (recovered).
Result<Acquired> take_local(NodeContext& n, uint32_t id, std::chrono::steady_clock::time_point deadline,
                            bool bounded) {
  MemoryDomain& d = n.domain();
  LocalLockEntry& e = n.local().locks[id];
  cxlkv_lock_slot* slot = n.control().slot(id, n.node());
  auto lr = bounded ? sync::robust_mutex_lock_until(&e.mu, deadline, "node-local lock")
                    : sync::robust_mutex_lock(&e.mu, "node-local lock");
  if (!lr) {
    if (lr.error().code() == -ETIMEDOUT)
      return Error(-ETIMEDOUT, lock_name(n, id) + ": not acquired within the timeout (held on this node by pid " +
                                   std::to_string(e.holder_pid) + ")");
    return Error(lr.error().code(), lock_name(n, id) + ": " + lr.error().message());
  }
  Acquired how = Acquired::clean;
  if (lr.value() == sync::LockOutcome::owner_died) {
    how = Acquired::recovered;
    if (e.phase != LockPhase::idle) {
      // The dead process requested, held or kept the global lock: withdraw /
      // release it, sticky grant included (rule 1: the request word is
      // multi-writer -> NT).
      d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));
      d.fence();  // rule 3
    }
    log().warn("{}: previous holder pid {} died ({}); global slot released, lock recovered", lock_name(n, id),
               e.holder_pid,
               e.phase == LockPhase::held ? "holding" : e.phase == LockPhase::requested ? "waiting" : "idle");
    e.phase = LockPhase::idle;
    sync::robust_mutex_consistent(&e.mu);
  }
  if (e.phase == LockPhase::orphaned) {
    // A holder of this node died in its critical section and the node's
    // watcher released the global slot for it (sync/watcher.cpp).
    how = Acquired::recovered;
    e.phase = LockPhase::idle;
  }
  return how;
}

// Write a new request of this process for lock `id` (its node-local mutex
// held, not kept): the next ticket, the owner and the set link (prev_lock,
// prev_ticket: uapi "Lock sets"; 0 for a single lock), then WAITING.  No
// doorbell (the caller posts it).  Returns the ticket.
uint64_t post_request(NodeContext& n, uint32_t id, uint32_t prev_lock, uint64_t prev_ticket) {
  MemoryDomain& d = n.domain();
  LocalLockEntry& e = n.local().locks[id];
  cxlkv_lock_slot* slot = n.control().slot(id, n.node());
  const uint32_t me = self_pid();
  const cxlkv_lock_slot cur = d.read_fresh(slot);  // rule 4
  if (e.ticket == 0) {
    // First use since the node-local memory was created: continue from the
    // ticket in the pool so a ticket is never reused.
    e.ticket = cur.request >> CXLKV_SLOT_TICKET_SHIFT;
  }
  const uint64_t ticket = ++e.ticket;
  __atomic_store_n(&e.revoke, 0u, __ATOMIC_RELEASE);  // a revocation named an older ticket
  e.phase = LockPhase::requested;  // before the pool write: a crash after it is recovered
  bool wrote = false;
  if (e.holder_pid != me || cur.owner_pid != me) {
    write_owner(d, slot, me);
    wrote = true;
  }
  if (cur.prev_lock != prev_lock || (prev_lock && cur.prev_ticket != prev_ticket)) {
    d.write_nt<__u32>(&slot->prev_lock, prev_lock);        // rule 1: the slot line is NT-only
    d.write_nt<__u64>(&slot->prev_ticket, prev_ticket);
    wrote = true;
  }
  if (wrote) d.fence();  // rule 3: owner and set link are in memory before the request that they qualify
  e.holder_pid = me;
  d.write_nt<__u64>(&slot->request, request_word(ticket, CXLKV_SLOT_WAITING));  // rule 1
  return ticket;
}

}  // namespace

std::string describe_lock(NodeContext& n, uint32_t id) {
  MemoryDomain& d = n.domain();
  const ControlCarve& c = n.control();
  if (id >= c.max_locks()) return "no such lock";
  std::string out;
  const cxlkv_lock_grant g = d.read_fresh(c.grant(id));  // rule 4
  if (g.node >= c.max_nodes()) {
    out = "not granted to any node";
  } else {
    const cxlkv_lock_slot s = d.read_fresh(c.slot(id, g.node));  // rule 4
    const cxlkv_node_entry e = d.read_fresh(c.node_entry(g.node));  // rule 4
    const uint64_t st = s.request & CXLKV_SLOT_STATE_MASK;
    const bool holds = (s.request >> CXLKV_SLOT_TICKET_SHIFT) == g.ticket && st == CXLKV_SLOT_WAITING;
    const bool keeps = (s.request >> CXLKV_SLOT_TICKET_SHIFT) == g.ticket && st == CXLKV_SLOT_STICKY;
    out = holds ? "held by node " : keeps ? "kept idle (sticky) by node " : "last granted to node ";
    out += std::to_string(g.node);
    NodeVerdict v = judge_node(e);
    if (holds && v.local) {
      bool alive = process_alive(s.owner_pid, s.owner_start);
      out += " (pid " + std::to_string(s.owner_pid) + (alive ? ", alive" : ", dead: process gone") + ")";
    } else {
      out += std::string(" (node ") + (v.alive ? "alive" : "dead") + ": " + v.why + ")";
    }
  }
  const cxlkv_lease l = d.read_fresh(c.lease());  // rule 4
  if (l.owner == 0) {
    out += "; no lock manager holds the pool's lease (start one: `cxlkvd --pool " + n.region().uri() + "`)";
  } else {
    int64_t age = (int64_t(realtime_ns()) - int64_t(l.renew_ns)) / 1000000;
    out += "; lock manager: node " + std::to_string(l.node) + " pid " + std::to_string(l.pid) + ", lease renewed " +
           std::to_string(age) + " ms ago" + (age > int64_t(l.lease_ms) ? " (expired: is it still running?)" : "");
  }
  return out;
}

TwoTierLock::TwoTierLock(NodeContext& node, uint32_t lock_id) : node_(node), id_(lock_id) {}

Result<Acquired> TwoTierLock::lock() { return acquire(std::chrono::nanoseconds::max(), false); }

Result<Acquired> TwoTierLock::try_lock_for(std::chrono::nanoseconds timeout) { return acquire(timeout, true); }

Result<Acquired> TwoTierLock::acquire(std::chrono::nanoseconds timeout, bool bounded) {
  const ControlCarve& ctrl = node_.control();
  if (id_ >= ctrl.max_locks())
    return Error(-EINVAL, lock_name(node_, id_) + ": id out of range (max_locks " +
                              std::to_string(ctrl.max_locks()) + ")");
  MemoryDomain& d = node_.domain();
  LocalLockEntry& e = node_.local().locks[id_];
  cxlkv_lock_slot* slot = ctrl.slot(id_, node_.node());
  cxlkv_lock_grant* grant = ctrl.grant(id_);
  const auto deadline = bounded ? std::chrono::steady_clock::now() + timeout
                                : std::chrono::steady_clock::time_point::max();

  // ---- local tier ----
  auto lr = take_local(node_, id_, deadline, bounded);
  if (!lr) return lr.error();
  Acquired how = lr.value();
  const uint32_t me = self_pid();

  // ---- sticky fast path: this node kept the grant at its last release ----
  // Node-local memory only when this process kept it: the manager takes a
  // kept grant back from a live node only after the node acknowledges
  // (uapi/cxlkv_ctrl.h "Sticky grants"), and the acknowledgement ends the
  // `cached` phase under this same mutex.  Kept by another process: only
  // while that process lives (kept_grant_is_ours).
  if (e.phase == LockPhase::cached) {
    // The beat before the flag (docs/locks.md "Heartbeat lapses"): a beat
    // after a lapse is stored after the flags it set (sync::end_lapse).
    const bool lapsed = sync::heartbeat_lapsed(node_);
    const bool revoked = __atomic_load_n(&e.revoke, __ATOMIC_ACQUIRE) != 0;
    const uint32_t keeper = e.holder_pid;
    if (!lapsed && !revoked && kept_grant_is_ours(node_, id_, e, me)) {
      e.phase = LockPhase::held;
      return how;
    }
    // Revoked while kept (the watcher could not take this mutex then), kept
    // across a heartbeat lapse, or kept by a process that died (the manager
    // may have given it to another node): release it here -- the
    // acknowledgement the manager waits for, harmless if it moved on --
    // then ask anew.
    if (lapsed)
      log().info("{}: the node's heartbeat lapsed; its kept grant is asked for anew", lock_name(node_, id_));
    else if (!revoked)
      log().info("{}: the grant kept by pid {} (gone) is asked for anew", lock_name(node_, id_), keeper);
    d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));  // rule 1
    d.fence();  // rule 3
    __atomic_store_n(&e.revoke, 0u, __ATOMIC_RELEASE);
    e.phase = LockPhase::idle;
  }

  // ---- global tier ----
  // dev: pools: own the slot before posting WAITING.  After a dead holder
  // this waits (bounded) until the module has released its slot, so its
  // IDLE write cannot land on top of our request.
  if (auto o = sync::own_slot(node_, id_, deadline); !o) {
    withdraw_after_fast_path(d, slot, e);
    e.phase = LockPhase::idle;
    sync::robust_mutex_unlock(&e.mu);
    if (bounded && std::chrono::steady_clock::now() >= deadline)
      return Error(-ETIMEDOUT, lock_name(node_, id_) + ": not acquired within the timeout: " + o.error().message());
    return Error(o.error().code(), lock_name(node_, id_) + ": " + o.error().message());
  }
  const uint64_t ticket = post_request(node_, id_, 0, 0);
  d.fence();  // rule 3: the request is in memory before the doorbell points at it
  sync::ring_doorbell(node_, {&id_, 1});

  // No spinning: nothing can grant this request before the manager has run
  // a round after our doorbell, so yield at once (where the manager shares
  // our CPU it runs now; where it has a CPU of its own the yield returns at
  // once), then sleep (bounded).  Spinning first made the manager see each
  // release ~7 us late on a 2-core machine (hand-off p50 10.5 -> ~8 us).
  // Sleeps are futex waits on the node-local grant_wake word: a manager on
  // this host bumps it and wakes us right after writing a grant for this
  // node (sync/watcher.hpp NodeWakers); from another host nothing wakes
  // us and the bounded sleep is the poll period.  Lost wake-ups: we count
  // ourselves in grant_sleepers, then load grant_wake, then read the grant;
  // the manager writes the grant (fence), bumps grant_wake, then reads
  // grant_sleepers (seq_cst both sides): either we see the grant or the
  // word moved (the wait returns at once) or the manager wakes us.
  NodeLocalHeader* h = node_.local().hdr;
  GrantSleeper sleeper(h);
  sync::Backoff backoff(kSpinPolls, kYieldPolls, kMaxSleep);
  auto rung = std::chrono::steady_clock::now();
  for (uint64_t polls = 0;; polls++) {
    if (backoff.sleeping()) sleeper.count();
    const uint32_t woke = __atomic_load_n(&h->grant_wake, __ATOMIC_SEQ_CST);
    cxlkv_lock_grant g = d.read_fresh(grant);  // rule 4: invalidate before every poll read
    if (g.node == node_.node() && g.ticket == ticket) {
      e.grant_flags = g.flags;
      break;
    }
    // Ring again now and then: a manager that judged this node dead while
    // it was paused (another host, heartbeat rule) stopped watching it and
    // forgot the request; it sees the node again after its next heartbeat,
    // and this ring names the lock again.  Ringing twice is harmless (the
    // manager notes a waiter per lock once).
    if ((polls & 63) == 63) {
      const auto t = std::chrono::steady_clock::now();
      if (t - rung >= kReRing) {
        sync::ring_doorbell(node_, {&id_, 1});
        rung = t;
      }
    }
    if (bounded && (polls & 15) == 15 && std::chrono::steady_clock::now() >= deadline) {
      std::string why = describe_lock(node_, id_);
      // Withdraw: same word as a release, so a grant racing with us is
      // seen by the manager as an immediate release (rule 1: NT).
      d.write_nt<__u64>(&slot->request, request_word(ticket, CXLKV_SLOT_IDLE));
      d.fence();  // rule 3
      auto dis = sync::disown_slot(node_, id_);  // after the withdrawal is in memory
      if (!dis) log().error("{}: {}", lock_name(node_, id_), dis.error().message());
      e.phase = LockPhase::idle;
      sync::robust_mutex_unlock(&e.mu);
      return Error(-ETIMEDOUT, lock_name(node_, id_) + ": not granted within the timeout: " + why);
    }
    backoff.idle(&h->grant_wake, woke);
  }
  sync::testing::grant_seen_hook(id_);
  e.phase = LockPhase::held;
  return how;
}

bool TwoTierLock::kept() const {
  if (id_ >= node_.control().max_locks()) return false;
  const LocalLockEntry& e = node_.local().locks[id_];
  const auto phase = static_cast<LockPhase>(__atomic_load_n(reinterpret_cast<const uint32_t*>(&e.phase), __ATOMIC_RELAXED));
  // Kept by this very process: the sticky fast path (node-local memory
  // only).  A grant another process of the node kept costs its keeper's
  // liveness check and an owner record in the pool (kept_grant_is_ours).
  return phase == LockPhase::cached && __atomic_load_n(&e.revoke, __ATOMIC_RELAXED) == 0 &&
         __atomic_load_n(&e.holder_pid, __ATOMIC_RELAXED) == self_pid() && node_.local().kept_here[id_];
}

bool TwoTierLock::node_has_grant() const {
  if (id_ >= node_.control().max_locks()) return false;
  const LocalLockEntry& e = node_.local().locks[id_];
  const auto phase = static_cast<LockPhase>(__atomic_load_n(reinterpret_cast<const uint32_t*>(&e.phase), __ATOMIC_RELAXED));
  return (phase == LockPhase::cached || phase == LockPhase::held) && __atomic_load_n(&e.revoke, __ATOMIC_RELAXED) == 0;
}

namespace {

// The release of lock `id` (TwoTierLock::unlock).  `fenced`: the caller
// fenced after the critical section's last flush (release_set, one fence
// for a whole set), so the sticky path needs no fence of its own.
Result<void> release_one(NodeContext& n, uint32_t id, bool fenced) {
  LocalLockEntry& e = n.local().locks[id < n.control().max_locks() ? id : 0];
  if (id >= n.control().max_locks() || e.phase != LockPhase::held || e.holder_pid != self_pid())
    return Error(-EPERM, lock_name(n, id) + ": unlock of a lock this process does not hold");
  MemoryDomain& d = n.domain();
  cxlkv_lock_slot* slot = n.control().slot(id, n.node());
  // Sticky release: keep the grant and write nothing to the pool (the
  // manager revokes it through the node's watcher when another node waits).
  // Not on dev: pools, whose module owns the slot per process file and sets
  // it IDLE when the file gives it up.  A grant given while others waited
  // (CONTENDED), or one revoked while we held it, is handed on at once.
  const bool revoked = __atomic_exchange_n(&e.revoke, 0u, __ATOMIC_ACQ_REL) != 0;
  const bool sticky = n.sticky() && n.region().kind() != BackendKind::dev &&
                      !(e.grant_flags & (CXLKV_GRANT_CONTENDED | CXLKV_GRANT_REVOKED)) && !revoked;
  // rule 3: the critical section's flushes complete before the release --
  // ours below, or the one the watcher or the next local locker writes
  // after taking over the node-local mutex.
  if (!fenced) d.fence();
  if (sticky) {
    e.phase = LockPhase::cached;
    n.local().kept_here[id] = 1;  // kept by this very process (kept_grant_is_ours)
    sync::robust_mutex_unlock(&e.mu);
    return {};
  }
  d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));  // rule 1
  d.fence();  // rule 3: release visible before another local process can start
  sync::wake_manager(n.local().hdr);  // others may wait: a sleeping manager on this host grants now
  Result<void> dis;
  // dev: pools: give the slot back after the release, before the next local
  // process may take it (it would otherwise retry on -EBUSY).
  dis = sync::disown_slot(n, id);
  e.phase = LockPhase::idle;
  sync::robust_mutex_unlock(&e.mu);
  if (!dis) return Error(dis.error().code(), lock_name(n, id) + ": released, but " + dis.error().message());
  return {};
}

}  // namespace

Result<void> TwoTierLock::unlock() { return release_one(node_, id_, false); }

Result<void> sync::release_set(NodeContext& n, std::span<const uint32_t> held) {
  // rule 3: one fence orders every flush of the set's critical section
  // before the first release (each release_one would otherwise fence).
  if (!held.empty()) n.domain().fence();
  Result<void> first;
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    auto r = release_one(n, *it, true);
    if (!r && first) first = r.error();
  }
  return first;
}

// ---- a set of locks asked for together (LockSet; uapi "Lock sets") ----

namespace sync {

// Post `ids` on the doorbell, kMaxHints + 1 per post.
static void ring_all(NodeContext& n, std::span<const uint32_t> ids) {
  for (size_t i = 0; i < ids.size(); i += kMaxHints + 1)
    ring_doorbell(n, ids.subspan(i, std::min<size_t>(kMaxHints + 1, ids.size() - i)));
}

Result<Acquired> acquire_set(NodeContext& n, std::span<const uint32_t> want,
                             std::chrono::steady_clock::time_point deadline, bool bounded,
                             std::vector<uint32_t>& held) {
  MemoryDomain& d = n.domain();
  const ControlCarve& c = n.control();
  const uint32_t me = self_pid();
  Acquired how = Acquired::clean;
  std::vector<uint32_t> ids;      // the locks asked for, ascending (after the kept prefix)
  std::vector<uint64_t> tickets;  // their tickets
  size_t entered = 0;             // ids[0 .. entered) are held (in `held` too)
  // Give up: withdraw every request not yet granted and seen -- the same
  // word as a release, so a grant racing with us reads as released at once
  // (rule 1: NT; rule 3: fence) -- and leave their node-local mutexes; the
  // caller releases `held`.
  auto withdraw = [&](Error err) -> Error {
    for (size_t k = entered; k < ids.size(); k++)
      d.write_nt<__u64>(&c.slot(ids[k], n.node())->request, request_word(tickets[k], CXLKV_SLOT_IDLE));
    d.fence();  // rule 3
    for (size_t k = entered; k < ids.size(); k++) {
      LocalLockEntry& e = n.local().locks[ids[k]];
      e.phase = LockPhase::idle;
      sync::robust_mutex_unlock(&e.mu);
    }
    if (entered < ids.size()) wake_manager(n.local().hdr);
    return err;
  };

  // Ask for lock `id` (its node-local mutex held), linked to the set's
  // previous request.
  auto ask = [&](uint32_t id) {
    const uint32_t prev = ids.empty() ? 0 : ids.back() + 1;
    const uint64_t prev_ticket = ids.empty() ? 0 : tickets.back();
    tickets.push_back(post_request(n, id, prev, prev_ticket));
    ids.push_back(id);
  };
  // Kept grants of other processes of the node entered in the kept prefix,
  // awaiting the verdict on their keepers (enter_kept): one fence for all
  // their owner records, then one verdict per keeper, before the set asks
  // for anything.  From the first whose keeper is gone on, the prefix's
  // locks are asked for anew in order, as if found there after the first
  // request (below).
  std::vector<std::pair<size_t, KeptEntry>> unverified;  // (index in `held`, whose grant)
  auto verify_prefix = [&] {
    if (unverified.empty()) return;
    d.fence();  // rule 3: every owner record is in memory before the verdicts
    size_t cut = held.size();
    std::vector<std::pair<const KeptEntry*, bool>> verdicts;  // one per keeper
    for (const auto& [at, k] : unverified) {
      auto v = std::find_if(verdicts.begin(), verdicts.end(), [&](const auto& x) {
        return x.first->keeper == k.keeper && x.first->keeper_start == k.keeper_start;
      });
      if (v == verdicts.end()) v = verdicts.insert(verdicts.end(), {&k, keeper_lives(k)});
      if (!v->second) cut = std::min(cut, at);
    }
    for (size_t j = cut; j < held.size(); j++) ask(held[j]);
    held.resize(cut);
    unverified.clear();
  };

  // ---- local tier, ascending; kept grants before the first lock to ask for are entered at once ----
  // The set's node-local entries are read and written one after the other
  // below (a cache miss each once a batch's copy has run through the
  // caches): their loads are started together.
  for (uint32_t id : want) __builtin_prefetch(&n.local().locks[id], 1);
  for (uint32_t id : want) {
    auto lr = take_local(n, id, deadline, bounded);
    if (!lr) {
      // The caller releases `held` sticky: no grant of a keeper that died
      // may stay there (asked for, then withdrawn).
      verify_prefix();
      return withdraw(lr.error());
    }
    if (lr.value() == Acquired::recovered) how = Acquired::recovered;
    LocalLockEntry& e = n.local().locks[id];
    // The beat before the flag, as in TwoTierLock::acquire.
    if (ids.empty() && e.phase == LockPhase::cached && !sync::heartbeat_lapsed(n) &&
        __atomic_load_n(&e.revoke, __ATOMIC_ACQUIRE) == 0) {
      // The sticky fast path (TwoTierLock::acquire): still this node's
      // grant, or another process's awaiting its keeper's verdict.
      const KeptEntry k = enter_kept(n, id, e, me);
      if (k.own || k.owner_matches) {
        if (!k.own) unverified.emplace_back(held.size(), k);
        e.phase = LockPhase::held;
        held.push_back(id);
        continue;
      }
    }
    // Ask for it.  A grant this node keeps (cached; revoked, kept by a
    // process that died since, or, past the first request, any) is asked
    // for anew: the newer ticket is its release (the revocation's answer)
    // and a request at once, so the set never uses a kept higher lock while
    // it waits for a lower one, nor a grant the manager may have given
    // another node.
    if (ids.empty()) verify_prefix();
    ask(id);
  }
  if (ids.empty()) verify_prefix();
  if (ids.empty()) return how;  // every lock was kept
  d.fence();  // rule 3: the requests are in memory before the doorbell names them
  ring_all(n, ids);

  // ---- wait for the grants, which come in ascending order: one sweep of
  // the grant lines still awaited per poll (rule 4), the same back-off and
  // wake-ups as TwoTierLock::acquire's poll loop (one sleep for the set). ----
  NodeLocalHeader* h = n.local().hdr;
  GrantSleeper sleeper(h);
  sync::Backoff backoff(kSpinPolls, kYieldPolls, kMaxSleep);
  auto rung = std::chrono::steady_clock::now();
  for (uint64_t polls = 0;; polls++) {
    if (backoff.sleeping()) sleeper.count();
    const uint32_t woke = __atomic_load_n(&h->grant_wake, __ATOMIC_SEQ_CST);
    // rule 4 (+ rule 1: grant lines are written whole with NT stores only).
    if (!sync::testing::break_set_grant_invalidate())
      for (size_t k = entered; k < ids.size(); k++) d.invalidate_clean(c.grant(ids[k]), sizeof(cxlkv_lock_grant));
    d.fence();  // rule 4: every invalidation completes before the loads below
    while (entered < ids.size()) {
      const cxlkv_lock_grant g = d.read(c.grant(ids[entered]));  // invalidated above
      if (g.node != n.node() || g.ticket != tickets[entered]) break;
      LocalLockEntry& e = n.local().locks[ids[entered]];
      e.grant_flags = g.flags;
      sync::testing::grant_seen_hook(ids[entered]);
      e.phase = LockPhase::held;
      held.push_back(ids[entered]);
      entered++;
    }
    if (entered == ids.size()) return how;
    // Ring again now and then (TwoTierLock::acquire says why).
    if ((polls & 63) == 63) {
      const auto t = std::chrono::steady_clock::now();
      if (t - rung >= kReRing) {
        ring_all(n, std::span(ids).subspan(entered));
        rung = t;
      }
    }
    if (bounded && (polls & 15) == 15 && std::chrono::steady_clock::now() >= deadline) {
      const uint32_t id = ids[entered];
      const std::string why = describe_lock(n, id);
      return withdraw(Error(-ETIMEDOUT, lock_name(n, id) + ": not granted within the timeout: " + why));
    }
    backoff.idle(&h->grant_wake, woke);
  }
}

}  // namespace sync

// ---- LockGuard ----

Result<LockGuard> LockGuard::take(TwoTierLock& lock, PoolRange protect) {
  return entered(lock, lock.lock(), protect);
}

Result<LockGuard> LockGuard::take_for(TwoTierLock& lock, std::chrono::nanoseconds timeout, PoolRange protect) {
  return entered(lock, lock.try_lock_for(timeout), protect);
}

Result<LockGuard> LockGuard::entered(TwoTierLock& lock, Result<Acquired> r, PoolRange protect) {
  if (!r) return r.error();
  if (protect.len) {
    // rule 4: drop any stale copy of the protected data before the
    // critical section reads it.
    lock.node().domain().invalidate(protect.ptr, protect.len);
    lock.node().domain().fence();
  }
  return LockGuard(&lock, protect, r.value());
}

LockGuard::LockGuard(LockGuard&& o) noexcept : lock_(o.lock_), range_(o.range_), how_(o.how_) { o.lock_ = nullptr; }

Result<void> LockGuard::release() {
  if (!lock_) return {};
  TwoTierLock* l = lock_;
  lock_ = nullptr;
  if (range_.len && !sync::testing::break_lock_flush()) {
    // rule 3: the protected data reaches memory before the release that
    // lets another node read it.
    l->node().domain().flush(range_.ptr, range_.len);
  }
  return l->unlock();
}

LockGuard::~LockGuard() {
  auto r = release();
  if (!r) log().error("{}", r.error().message());
}

}  // namespace cxlkv
