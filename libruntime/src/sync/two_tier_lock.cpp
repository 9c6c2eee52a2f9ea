// SPDX-License-Identifier: MIT
// The two-tier lock (DESIGN.md "Cross-host locking"; slot protocol in
// uapi/cxlkv_ctrl.h).
//
// acquire:  local robust mutex (at most one process per node competes
//           globally) -> ticket + 1 -> slot := (ticket<<2)|WAITING (NT) ->
//           doorbell -> poll the grant until it names (node, ticket).
// release:  slot := (ticket<<2)|IDLE (NT) -> local mutex unlock.
// dev: pools: the process's device file owns the slot from before WAITING
//           until after the release (kernel_slots.hpp), so the module sets
//           it IDLE if the process dies in between.
// recovery: a local locker that gets EOWNERDEAD finds in the local entry
//           what the dead process left in the pool (phase + ticket) and
//           writes (ticket<<2)|IDLE itself, exactly as the kernel module does
//           for a closed file on a dev: pool; the write is idempotent.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "cxlkv/sync.hpp"
#include "sync/backoff.hpp"
#include "sync/kernel_slots.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "sync/testing.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace sync::testing {
namespace {
std::atomic<bool> g_break_lock_flush{false};
}
void set_break_lock_flush(bool on) { g_break_lock_flush.store(on); }
bool break_lock_flush() { return g_break_lock_flush.load(std::memory_order_relaxed); }
}  // namespace sync::testing

namespace {

constexpr uint64_t request_word(uint64_t ticket, uint64_t state) {
  return (ticket << CXLKV_SLOT_TICKET_SHIFT) | state;
}

std::string lock_name(const NodeContext& n, uint32_t id) {
  return "pool " + n.region().uri() + ": lock " + std::to_string(id) + " (node " + std::to_string(n.node()) + ")";
}

// Post "node waits for lock `id`" on the node's doorbell, so the manager
// finds the request without scanning every lock.
void ring_doorbell(NodeContext& n, uint32_t id) {
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
  // rule 1 + rule 3: entry first (NT), fence, then the seq that publishes it.
  d.write_nt(&db->pending[seq % CXLKV_DOORBELL_RING], id);
  d.fence();
  d.write_nt<__u64>(&db->seq, seq + 1);
  d.fence();
  h->doorbell_seq = seq + 1;
}

}  // namespace

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
  const std::string what = "node-local lock " + std::to_string(id_);
  auto lr = bounded ? sync::robust_mutex_lock_until(&e.mu, deadline, what.c_str())
                    : sync::robust_mutex_lock(&e.mu, what.c_str());
  if (!lr) {
    if (lr.error().code() == -ETIMEDOUT)
      return Error(-ETIMEDOUT, lock_name(node_, id_) + ": not acquired within the timeout (held on this node)");
    return lr.error();
  }
  Acquired how = Acquired::clean;
  if (lr.value() == sync::LockOutcome::owner_died) {
    how = Acquired::recovered;
    if (e.phase != LockPhase::idle) {
      // The dead process requested or held the global lock: withdraw /
      // release its request (rule 1: the request word is multi-writer -> NT).
      d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));
      d.fence();  // rule 3
    }
    log().warn("{}: previous holder pid {} died ({}); global slot released, lock recovered",
               lock_name(node_, id_), e.holder_pid,
               e.phase == LockPhase::held ? "holding" : e.phase == LockPhase::requested ? "waiting" : "idle");
    e.phase = LockPhase::idle;
    sync::robust_mutex_consistent(&e.mu);
  }

  // ---- global tier ----
  // dev: pools: own the slot before posting WAITING.  After a dead holder
  // this waits (bounded) until the module has released its slot, so its
  // IDLE write cannot land on top of our request.
  if (auto o = sync::own_slot(node_, id_, deadline); !o) {
    e.phase = LockPhase::idle;
    sync::robust_mutex_unlock(&e.mu);
    if (bounded && std::chrono::steady_clock::now() >= deadline)
      return Error(-ETIMEDOUT, lock_name(node_, id_) + ": not acquired within the timeout: " + o.error().message());
    return Error(o.error().code(), lock_name(node_, id_) + ": " + o.error().message());
  }
  if (e.ticket == 0) {
    // First use since the node-local memory was created: continue from the
    // ticket in the pool so a ticket is never reused (rule 4: fresh read).
    e.ticket = d.read_fresh(&slot->request) >> CXLKV_SLOT_TICKET_SHIFT;
  }
  const uint64_t ticket = ++e.ticket;
  e.holder_pid = static_cast<uint32_t>(getpid());
  e.phase = LockPhase::requested;  // before the pool write: a crash after it is recovered
  d.write_nt(&slot->owner_pid, e.holder_pid);
  d.write_nt<__u64>(&slot->request, request_word(ticket, CXLKV_SLOT_WAITING));  // rule 1
  d.fence();  // rule 3: the request is in memory before the doorbell points at it
  ring_doorbell(node_, id_);

  sync::Backoff backoff(2000, 200, std::chrono::microseconds(50));
  for (uint64_t polls = 0;; polls++) {
    cxlkv_lock_grant g = d.read_fresh(grant);  // rule 4: invalidate before every poll read
    if (g.node == node_.node() && g.ticket == ticket) break;
    if (bounded && (polls & 15) == 15 && std::chrono::steady_clock::now() >= deadline) {
      // Withdraw: same word as a release, so a grant racing with us is
      // seen by the manager as an immediate release (rule 1: NT).
      d.write_nt<__u64>(&slot->request, request_word(ticket, CXLKV_SLOT_IDLE));
      d.fence();  // rule 3
      auto dis = sync::disown_slot(node_, id_);  // after the withdrawal is in memory
      if (!dis) log().error("{}: {}", lock_name(node_, id_), dis.error().message());
      e.phase = LockPhase::idle;
      sync::robust_mutex_unlock(&e.mu);
      return Error(-ETIMEDOUT, lock_name(node_, id_) + ": not granted within the timeout (is a lock manager "
                                                      "running for this pool? `cxlkvd --pool " +
                                   node_.region().uri() + "`)");
    }
    backoff.idle();
  }
  e.phase = LockPhase::held;
  return how;
}

Result<void> TwoTierLock::unlock() {
  LocalLockEntry& e = node_.local().locks[id_ < node_.control().max_locks() ? id_ : 0];
  if (id_ >= node_.control().max_locks() || e.phase != LockPhase::held ||
      e.holder_pid != static_cast<uint32_t>(getpid()))
    return Error(-EPERM, lock_name(node_, id_) + ": unlock of a lock this process does not hold");
  MemoryDomain& d = node_.domain();
  cxlkv_lock_slot* slot = node_.control().slot(id_, node_.node());
  d.fence();  // rule 3: the critical section's flushed writes are ordered before the release
  d.write_nt<__u64>(&slot->request, request_word(e.ticket, CXLKV_SLOT_IDLE));  // rule 1
  d.fence();  // rule 3: release visible before another local process can start
  // dev: pools: give the slot back after the release, before the next local
  // process may take it (it would otherwise retry on -EBUSY).
  auto dis = sync::disown_slot(node_, id_);
  e.phase = LockPhase::idle;
  sync::robust_mutex_unlock(&e.mu);
  if (!dis) return Error(dis.error().code(), lock_name(node_, id_) + ": released, but " + dis.error().message());
  return {};
}

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
