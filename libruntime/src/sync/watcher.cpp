// SPDX-License-Identifier: MIT
// The node's watcher and the manager's same-host wake-ups (sync/watcher.hpp).
#include "sync/watcher.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "sync/futex.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "sync/testing.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv::sync {

namespace {

constexpr uint64_t idle_word(uint64_t ticket) { return (ticket << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_IDLE; }

// A revoked grant not yet acknowledged: lock id, the grant's ticket and
// flags (CONTENDED: the manager asks whether a holder of this node lives,
// uapi "Dead processes of live nodes").
struct Pending {
  uint32_t lock;
  uint64_t ticket;
  uint32_t flags;
};

// Acknowledge one revocation.  True when done (acknowledged here, released
// by its holder, or no longer this node's grant); false: retry next round.
bool acknowledge(NodeContext& n, const Pending& p) {
  MemoryDomain& d = n.domain();
  LocalLockEntry& e = n.local().locks[p.lock];
  cxlkv_lock_slot* slot = n.control().slot(p.lock, n.node());
  if (testing::break_watcher_local()) {
    // Broken variant (tests only): release in the pool, but leave the
    // node-local phase `cached`, so the node re-enters without checking.
    d.write_nt<__u64>(&slot->request, idle_word(p.ticket));
    d.fence();
    return true;
  }
  auto r = robust_mutex_trylock(&e.mu, "node-local lock");
  if (!r) {
    // A live process of this node holds the mutex (inside its critical
    // section, or entering).  A CONTENDED grant: its release writes IDLE
    // anyway; the manager asks again while the grant stands.  A kept one:
    // its release writes IDLE when it finds the flag.
    if (p.flags & CXLKV_GRANT_CONTENDED) return true;
    if (__atomic_load_n(&e.ticket, __ATOMIC_RELAXED) != p.ticket) return true;
    __atomic_store_n(&e.revoke, 1u, __ATOMIC_RELEASE);
    return false;
  }
  if (r.value() == LockOutcome::owner_died) {
    // Its holder died inside the critical section (or entering it): release
    // the global slot for it; the next local locker reports `recovered`.
    if (e.phase != LockPhase::idle && e.phase != LockPhase::orphaned) {
      d.write_nt<__u64>(&slot->request, idle_word(e.ticket));  // rule 1
      d.fence();                                                 // rule 3
      log().warn("pool {}: lock {} (node {}): holder pid {} died holding it; released for the lock manager's request",
                 n.region().uri(), p.lock, n.node(), e.holder_pid);
      e.phase = LockPhase::orphaned;
    }
    robust_mutex_consistent(&e.mu);
  } else if (e.ticket == p.ticket && e.phase == LockPhase::cached) {
    // Kept and not in use: give it back.  rule 1: NT; rule 3: the fence makes
    // the release visible before the node-local phase lets anyone ask anew.
    d.write_nt<__u64>(&slot->request, idle_word(p.ticket));
    d.fence();
    e.phase = LockPhase::idle;
    __atomic_store_n(&e.revoke, 0u, __ATOMIC_RELEASE);
    wake_manager(n.local().hdr);  // the node that waits for it gets its grant now
  }
  robust_mutex_unlock(&e.mu);
  return true;
}

// Find revoked grants among the locks this node keeps or holds: one sweep
// of invalidations, one fence, then the loads (rule 4).
void sweep(NodeContext& n, std::vector<uint32_t>& cand, std::vector<Pending>& pending) {
  MemoryDomain& d = n.domain();
  const ControlCarve& c = n.control();
  cand.clear();
  for (uint32_t l = 0; l < c.max_locks(); l++) {
    // `requested` too: a process that read its grant before the manager
    // flagged it REVOKED, and has not yet marked itself `held`, would
    // otherwise be skipped by the one sweep this revocation's bump causes,
    // then keep the grant at release, unrevoked for good (a replay of 4+4
    // workers hung so, every node waiting on a grant kept by another).
    const auto ph = __atomic_load_n(&n.local().locks[l].phase, __ATOMIC_RELAXED);
    if (ph == LockPhase::cached || ph == LockPhase::held || ph == LockPhase::requested) cand.push_back(l);
  }
  // rule 4 (+ rule 1: grant lines are written by the manager with whole-line NT stores only).
  for (uint32_t l : cand) d.invalidate_clean(c.grant(l), sizeof(cxlkv_lock_grant));
  d.fence();  // rule 4: every invalidation completes before the loads below
  for (uint32_t l : cand) {
    const cxlkv_lock_grant g = d.read(c.grant(l));  // invalidated above
    if (g.node != n.node() || !(g.flags & CXLKV_GRANT_REVOKED)) continue;
    if (g.ticket != __atomic_load_n(&n.local().locks[l].ticket, __ATOMIC_RELAXED)) continue;
    bool dup = false;
    for (auto& p : pending) dup |= p.lock == l && p.ticket == g.ticket;
    if (!dup) pending.push_back({l, g.ticket, g.flags});
  }
}

}  // namespace

void release_kept_grants(NodeContext& n) {
  MemoryDomain& d = n.domain();
  for (uint32_t l = 0; l < n.control().max_locks(); l++) {
    LocalLockEntry& e = n.local().locks[l];
    if (__atomic_load_n(&e.phase, __ATOMIC_RELAXED) != LockPhase::cached) continue;
    auto r = robust_mutex_trylock(&e.mu, "node-local lock");
    if (!r) continue;  // another process of this node is using it: its watcher answers
    if (r.value() == LockOutcome::owner_died) robust_mutex_consistent(&e.mu);
    if (e.phase == LockPhase::cached) {
      // rule 1: the slot is written NT, as every release.
      d.write_nt<__u64>(&n.control().slot(l, n.node())->request, idle_word(e.ticket));
      d.fence();  // rule 3: the release is visible before the phase lets anyone of this node ask anew
      e.phase = LockPhase::idle;
      __atomic_store_n(&e.revoke, 0u, __ATOMIC_RELEASE);
    }
    robust_mutex_unlock(&e.mu);
  }
}

uint64_t beat_clock_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

bool heartbeat_lapsed(const NodeContext& n) {
  if (testing::break_lapse_check()) return false;
  // acquire: pairs with end_lapse's flags, stored before the beat (release).
  const uint64_t at = __atomic_load_n(&n.local().hdr->beat_mono_ns, __ATOMIC_ACQUIRE);
  return at != 0 && beat_clock_ns() - at > kBeatLapseNs;
}

void end_lapse(NodeContext& n, bool attaching) {
  const uint64_t at = __atomic_load_n(&n.local().hdr->beat_mono_ns, __ATOMIC_ACQUIRE);
  const uint64_t now = beat_clock_ns();
  if (at == 0 || now - at <= kBeatLapseNs || testing::break_lapse_check()) return;
  MemoryDomain& d = n.domain();
  uint32_t given = 0, flagged = 0;
  for (uint32_t l = 0; l < n.control().max_locks(); l++) {
    LocalLockEntry& e = n.local().locks[l];
    const LockPhase ph = __atomic_load_n(&e.phase, __ATOMIC_RELAXED);
    if (ph != LockPhase::cached && ph != LockPhase::held) continue;
    auto r = robust_mutex_trylock(&e.mu, "node-local lock");
    if (!r) {
      // In use (a process inside, or on the fast path right now): its
      // release writes IDLE, its fast path asks anew.  release: before the beat.
      __atomic_store_n(&e.revoke, 1u, __ATOMIC_RELEASE);
      flagged++;
      continue;
    }
    if (r.value() == LockOutcome::owner_died) {
      // Its holder died inside: release for it, as the watcher does.
      if (e.phase != LockPhase::idle && e.phase != LockPhase::orphaned) {
        d.write_nt<__u64>(&n.control().slot(l, n.node())->request, idle_word(e.ticket));  // rule 1
        d.fence();                                                                       // rule 3
        e.phase = LockPhase::orphaned;
        given++;
      }
      robust_mutex_consistent(&e.mu);
    } else if (e.phase == LockPhase::cached) {
      // rule 1: NT, as every release; rule 3: visible before the phase lets
      // this node ask anew.
      d.write_nt<__u64>(&n.control().slot(l, n.node())->request, idle_word(e.ticket));
      d.fence();
      e.phase = LockPhase::idle;
      __atomic_store_n(&e.revoke, 0u, __ATOMIC_RELEASE);
      given++;
    }
    robust_mutex_unlock(&e.mu);
  }
  const uint64_t ms = (now - at) / 1000000;
  if (attaching)
    log().info("pool {}: node {}: last beat {} ms ago; {} kept grant(s) given up, {} in use flagged",
               n.region().uri(), n.node(), ms, given, flagged);
  else
    log().warn("pool {}: node {}: heartbeat lapsed ({} ms since the last beat; another host judges a node dead "
               "after {} ms): {} kept lock grant(s) given up and {} in use flagged before beating again",
               n.region().uri(), n.node(), ms, kNodeStaleMs, given, flagged);
}

void run_watcher(NodeContext& n, const std::atomic<bool>& stop) {
  NodeLocalHeader* h = n.local().hdr;
  // Election: one watcher per node; a waiting candidate takes over when the
  // watcher's process dies (robust mutex: EOWNERDEAD).
  bool owner = false;
  while (!stop.load(std::memory_order_relaxed) && !owner) {
    auto r = robust_mutex_lock_until(&h->watcher_mu, std::chrono::steady_clock::now() + std::chrono::milliseconds(20),
                                     "node watcher");
    if (r) {
      owner = true;
      if (r.value() == LockOutcome::owner_died) robust_mutex_consistent(&h->watcher_mu);
    } else if (r.error().code() != -ETIMEDOUT) {
      log().error("pool {}: node {}: watcher: {}", n.region().uri(), n.node(), r.error().message());
      usleep(50000);
    }
  }
  if (!owner) return;
  // Exact short waits (the default 50 us timer slack would stretch them).
  prctl(PR_SET_TIMERSLACK, 1ul, 0, 0, 0);
  MemoryDomain& d = n.domain();
  cxlkv_doorbell* db = n.control().doorbell(n.node());
  std::vector<uint32_t> cand;
  std::vector<Pending> pending;
  bool first = true;
  uint64_t seen = 0;
  auto swept = std::chrono::steady_clock::now();
  while (!stop.load(std::memory_order_relaxed)) {
    const uint32_t w = __atomic_load_n(&h->revoke_wake, __ATOMIC_ACQUIRE);
    const uint64_t rv = d.read_fresh(&db->revokes);  // rule 4
    const auto now = std::chrono::steady_clock::now();
    // Besides every bump, a sweep every kWatcherResweep: a revocation this
    // node failed to notice must delay other nodes, never stop them.
    if (first || rv != seen || (now - swept >= kWatcherResweep && !testing::watcher_no_resweep())) {
      swept = now;
      // The manager wrote REVOKED grants (fenced) before this bump: the
      // sweep's fresh reads see them.
      sweep(n, cand, pending);
      seen = rv;
      first = false;
    }
    for (size_t i = 0; i < pending.size();)
      if (acknowledge(n, pending[i])) {
        pending[i] = pending.back();
        pending.pop_back();
      } else {
        i++;
      }
    // A holder inside its critical section: look again soon; else wait for
    // a wake from a manager on this host, or poll again after kWatcherPoll.
    const auto poll = woken_by_local_manager(h) ? kWatcherPollWoken : kWatcherPoll;
    futex_wait(&h->revoke_wake, w, pending.empty() ? uint64_t(std::chrono::nanoseconds(poll).count()) : 20000);
  }
  robust_mutex_unlock(&h->watcher_mu);
}

// ---- NodeWakers ----

NodeWakers::NodeWakers(const Region& region, uint32_t max_nodes) : nodes_(max_nodes) {
  pool_prefix_ = NodeContext::default_local_name(region, 0);
  pool_prefix_.pop_back();  // "...-0" -> "...-"
}

NodeWakers::~NodeWakers() {
  for (auto& e : nodes_) close(e);
}

void NodeWakers::close(Entry& e) {
  if (e.hdr) ::munmap(e.hdr, 4096);
  e.hdr = nullptr;
}

void NodeWakers::refresh(uint32_t n, const cxlkv_node_entry& ne) {
  if (n >= nodes_.size()) return;
  Entry& e = nodes_[n];
  const bool here = ne.state == CXLKV_NODE_ACTIVE && ne.host_id != 0 && ne.host_id == this_host_id();
  if (!here) {
    close(e);
    e.tried = false;
    return;
  }
  if (e.tried && e.incarnation == ne.incarnation) return;
  close(e);
  e.tried = true;
  e.incarnation = ne.incarnation;
  // None under the default name (NodeOptions::local_shm_name), or not one
  // this manager may map: the node polls.
  e.hdr = map_node_local_header(pool_prefix_ + std::to_string(n), n);
}

void NodeWakers::wake_grant(uint32_t n) {
  if (n >= nodes_.size() || !nodes_[n].hdr) return;
  NodeLocalHeader* h = nodes_[n].hdr;
  // Dekker with a waiter (two_tier_lock.cpp): it counts itself in
  // grant_sleepers, then reads grant_wake, then the grant; we bump
  // grant_wake (after the grant's fence), then read grant_sleepers.
  __atomic_fetch_add(&h->grant_wake, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->grant_sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake_all(&h->grant_wake);
}

void NodeWakers::stamp(uint64_t now_ns) {
  for (auto& e : nodes_)
    if (e.hdr) __atomic_store_n(&e.hdr->waker_ns, now_ns, __ATOMIC_RELAXED);
}

bool NodeWakers::all_open(uint64_t watch) const {
  if (!waitv_ok_) return false;  // no futex_waitv: nothing can wake the manager
  for (uint64_t w = watch; w; w &= w - 1) {
    const uint32_t n = static_cast<uint32_t>(__builtin_ctzll(w));
    if (n >= nodes_.size() || !nodes_[n].hdr) return false;
  }
  return true;
}

void NodeWakers::arm() {
  armed_.clear();
  for (auto& e : nodes_) {
    if (!e.hdr || armed_.size() == kFutexWaitvMax) continue;
    // Dekker with wake_manager(): flag (seq_cst), then the caller's fresh
    // pool reads; the node writes the pool, fences, then reads the flag.
    __atomic_store_n(&e.hdr->mgr_sleeping, 1u, __ATOMIC_SEQ_CST);
    armed_.push_back({__atomic_load_n(&e.hdr->mgr_wake, __ATOMIC_SEQ_CST),
                      reinterpret_cast<uint64_t>(&e.hdr->mgr_wake), kFutex32, 0});
  }
}

bool NodeWakers::sleep(uint64_t ns) {
  static_assert(sizeof(FutexWaitvSlot) == sizeof(FutexWaitv));
  if (!armed_.empty() && waitv_ok_) {
    const int r = futex_waitv(reinterpret_cast<FutexWaitv*>(armed_.data()), static_cast<uint32_t>(armed_.size()), ns);
    if (r >= 0) return r == 1;
    waitv_ok_ = false;  // refused: sleep without wakes from now on
    log().warn("lock manager: futex_waitv refused ({}); sleeping {} us per idle round instead", std::strerror(errno),
               ns / 1000);
  }
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
  return false;
}

void NodeWakers::disarm() {
  for (auto& e : nodes_)
    if (e.hdr) __atomic_store_n(&e.hdr->mgr_sleeping, 0u, __ATOMIC_RELAXED);
  armed_.clear();
}

void wake_manager(NodeLocalHeader* h) {
  // Dekker with NodeWakers::arm(): our pool write (NT stores, fenced by the
  // caller) is ordered before the load of the flag by a full fence.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->mgr_sleeping, __ATOMIC_SEQ_CST) == 0) return;
  __atomic_fetch_add(&h->mgr_wake, 1u, __ATOMIC_SEQ_CST);
  futex_wake_all(&h->mgr_wake);
}

bool woken_by_local_manager(const NodeLocalHeader* h) {
  const uint64_t t = __atomic_load_n(&h->waker_ns, __ATOMIC_RELAXED);
  if (t == 0) return false;
  return monotonic_ns() - t < uint64_t(std::chrono::nanoseconds(kWakerFresh).count());
}

void NodeWakers::wake_revoke(uint32_t n) {
  if (n >= nodes_.size() || !nodes_[n].hdr) return;
  NodeLocalHeader* h = nodes_[n].hdr;
  __atomic_fetch_add(&h->revoke_wake, 1u, __ATOMIC_SEQ_CST);
  futex_wake_all(&h->revoke_wake);
}

}  // namespace cxlkv::sync
