// SPDX-License-Identifier: MIT
// Cross-host locking (DESIGN.md "Cross-host locking"; layout in
// uapi/cxlkv_ctrl.h).
//
//   NodeContext   one attached node: region + its MemoryDomain + node id +
//                 node-local shared memory (/dev/shm/cxlkv-node-<pool>-<node>)
//                 + optional heartbeat thread.
//   TwoTierLock   lock id -> node-local robust mutex, then the global slot
//                 granted by the lock manager.  lock() / try_lock_for() / unlock().
//   LockGuard     RAII holder; can also carry a pool range the lock protects
//                 (invalidated after acquire, flushed before release).
//   LockSet       several locks of one node in one call (batches).
//   LockManager   grants global slots round-robin; one per pool (lease);
//                 run_once() for tests, start()/stop() for a thread, or cxlkvd.
//
// Every class takes the MemoryDomain explicitly (default region.domain()),
// so a test can give each simulated node its own NonCoherentSim domain.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv_pool.h"

namespace cxlkv {

// ---- control carve ----------------------------------------------------------

struct ControlFormatOptions {
  uint32_t max_locks = CXLKV_DEFAULT_MAX_LOCKS;  // >= CXLKV_MIN_LOCKS
};
// Bytes the control carve needs (before rounding to 2 MiB).
uint64_t control_carve_bytes(uint32_t max_nodes, uint32_t max_locks);
// Largest max_locks (<= CXLKV_MAX_LOCKS) that fits a carve of `carve_size`.
uint32_t control_max_locks_for(uint64_t carve_size, uint32_t max_nodes);
// Carve initializer called by format_pool(): writes the control header,
// frees the lease, zeroes node table, slots, grants (GRANT_NONE), doorbells.
// If opts.max_locks does not fit the "control" carve, the largest that fits.
Result<void> format_control_carve(Region& region, MemoryDomain& domain,
                                  const ControlFormatOptions& opts = {});

// Validated view of the control carve of an opened pool.
class ControlCarve {
 public:
  static Result<ControlCarve> open(const Region& region, MemoryDomain& domain);
  uint32_t max_nodes() const { return hdr_.max_nodes; }
  uint32_t max_locks() const { return hdr_.max_locks; }
  cxlkv_lock_slot* slot(uint32_t lock, uint32_t node) const {
    return reinterpret_cast<cxlkv_lock_slot*>(base_ + cxlkv_lock_slot_off(&hdr_, lock, node));
  }
  cxlkv_lock_grant* grant(uint32_t lock) const {
    return reinterpret_cast<cxlkv_lock_grant*>(base_ + hdr_.grant_table_off) + lock;
  }
  cxlkv_doorbell* doorbell(uint32_t node) const {
    return reinterpret_cast<cxlkv_doorbell*>(base_ + hdr_.doorbell_off) + node;
  }
  cxlkv_node_entry* node_entry(uint32_t node) const {
    return reinterpret_cast<cxlkv_node_entry*>(base_ + hdr_.node_table_off) + node;
  }
  cxlkv_lease* lease() const { return reinterpret_cast<cxlkv_lease*>(base_ + hdr_.lease_off); }
  const cxlkv_ctrl_header& header() const { return hdr_; }

 private:
  std::byte* base_ = nullptr;
  cxlkv_ctrl_header hdr_{};
};

// ---- nodes and heartbeats -----------------------------------------------------

struct NodeOptions {
  uint32_t node = 0;                // 0 .. max_nodes-1
  bool heartbeat = false;           // run a heartbeat thread (one process per node beats)
  uint32_t heartbeat_ms = 250;
  std::string local_shm_name;       // default "cxlkv-node-<pool id hex>-<node>"
  // Sticky grants: a release keeps the global grant until the manager
  // revokes it for another node (re-acquisition: the node-local lock only,
  // no pool access; the node's watcher thread answers revocations).
  // Ignored on dev: pools (the module owns slots per process file).
  bool sticky = true;
};

struct NodeLocal;  // node-local shared memory (libruntime/src/sync/node_local.hpp)

class NodeContext {
 public:
  static Result<std::unique_ptr<NodeContext>> attach(Region& region, const NodeOptions& opts);
  static Result<std::unique_ptr<NodeContext>> attach(Region& region, MemoryDomain& domain,
                                                     const NodeOptions& opts);
  ~NodeContext();
  NodeContext(const NodeContext&) = delete;
  NodeContext& operator=(const NodeContext&) = delete;

  Region& region() const { return region_; }
  MemoryDomain& domain() const { return domain_; }
  uint32_t node() const { return node_; }
  const ControlCarve& control() const { return ctrl_; }
  NodeLocal& local() const { return *local_; }
  const std::string& local_shm_name() const { return local_name_; }
  bool sticky() const { return sticky_; }

  // Publish one heartbeat now (the heartbeat thread calls this).
  void beat();
  // Default node-local shm name of (pool, node); unlink it (tests, `node evict`).
  static std::string default_local_name(const Region& region, uint32_t node);
  static void unlink_local(const std::string& name);

 private:
  NodeContext(Region& r, MemoryDomain& d, uint32_t node, ControlCarve c);
  Region& region_;
  MemoryDomain& domain_;
  uint32_t node_;
  ControlCarve ctrl_;
  std::unique_ptr<NodeLocal> local_;
  std::string local_name_;
  uint64_t incarnation_ = 0;
  uint64_t beats_ = 0;
  uint32_t heartbeat_ms_ = 0;
  bool sticky_ = true;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
  std::thread watcher_;  // candidate for the node's watcher (sync/watcher.hpp)
};

// ---- liveness (docs/coherence.md "Liveness"; rule in uapi/cxlkv_ctrl.h) ---------------

// This host (boot + pid namespace) as recorded in node entries' host_id.
uint32_t this_host_id();
// Start time of process `pid` (/proc/PID/stat field 22); 0: no such process
// or a zombie.  self_start_time(): this process's, read once.
uint64_t process_start_time(uint32_t pid);
uint64_t self_start_time();
uint32_t self_pid();  // getpid(), cached (refreshed in a forked child)
// Is the process (pid, start_time) of this host still running?  A stopped
// process is running; a reused pid (other start time) is not.
bool process_alive(uint32_t pid, uint64_t start_time);

struct NodeVerdict {
  bool alive = false;
  bool local = false;  // on this host: judged by its process, not its heartbeat
  std::string why;     // "process 123 gone", "heartbeat 4100 ms ago (stale)", ...
};
// The one liveness rule: ACTIVE, and on this host its process runs, on
// another host its heartbeat is younger than kNodeStaleMs.
NodeVerdict judge_node(const cxlkv_node_entry& e);

struct NodeStatus {
  uint32_t node = 0;
  cxlkv_node_state state = CXLKV_NODE_ABSENT;
  uint32_t pid = 0;
  uint64_t heartbeat = 0;
  uint64_t heartbeat_ns = 0;
  int64_t age_ms = -1;  // now - heartbeat_ns on this host's clock, -1 if never beat
  bool alive = false;   // judge_node(): process on this host, heartbeat elsewhere
  bool local = false;   // on this host
  std::string why;      // judge_node()'s reason
  std::string host;
  uint32_t waiting_or_holding = 0;  // slots of this node not IDLE
};
constexpr int64_t kNodeStaleMs = 3000;

std::vector<NodeStatus> list_nodes(const Region& region, MemoryDomain& domain);
// Operator action for a dead node: release every global slot it holds or
// waits on ((ticket << 2) | IDLE, as the kernel module does for a closed
// file) and mark it EVICTED.  Refuses a node that looks alive unless force.
// Returns the number of slots released.
Result<uint32_t> evict_node(Region& region, MemoryDomain& domain, uint32_t node, bool force);

// ---- node-local files ------------------------------------------------------------

// One /dev/shm/cxlkv-node-<pool id>-<node> file looked at by gc_node_local().
struct NodeLocalGc {
  std::string name;      // file name in /dev/shm
  std::string pool_id;   // hex, from the name
  uint32_t node = 0;
  bool removed = false;
  std::string why;       // "pool exists", "pool not found; removed", ...
};
// Remove node-local files of pools that no longer exist: a file is kept when
// its pool id is that of an shm pool in /dev/shm or one of `keep_pools`
// (pools on files or devices the caller knows), or when a process maps it.
std::vector<NodeLocalGc> gc_node_local(const std::vector<std::array<uint8_t, 16>>& keep_pools, bool dry_run);
// Remove this host's node-local file of (pool, node), e.g. after a tool's
// last process of that node detached.  Missing is not an error.
Result<void> remove_node_local(const Region& region, uint32_t node);

// ---- the two-tier lock ----------------------------------------------------------

// Who holds or last held lock `id`, whether that holder is alive, and the
// lock manager's lease: what a timed-out acquire reports.
std::string describe_lock(NodeContext& node, uint32_t id);

enum class Acquired {
  clean,      // normal acquisition
  recovered,  // a previous holder on this node died holding the lock (EOWNERDEAD):
              // its global slot was released; data it protected may be half-updated
};

class TwoTierLock {
 public:
  TwoTierLock(NodeContext& node, uint32_t lock_id);
  Result<Acquired> lock();
  // -ETIMEDOUT if not granted within `timeout` (the request is withdrawn).
  Result<Acquired> try_lock_for(std::chrono::nanoseconds timeout);
  Result<void> unlock();
  // A hint, read without the local mutex: this process kept the global
  // grant at its last release and no revocation is pending, so an acquire
  // is the sticky fast path (node-local memory only; no manager round trip,
  // no check of another keeper).  It may change at once; callers only
  // choose a cheaper path by it.
  bool kept() const;
  // A hint, read as kept() is: the node has the global grant (a process of
  // the node keeps or holds it) and no revocation is pending, so an acquire
  // needs no round trip through the lock manager (at most the verdict on
  // another process's keeper, or a wait on this node's holder).
  bool node_has_grant() const;
  uint32_t id() const { return id_; }
  NodeContext& node() const { return node_; }

 private:
  Result<Acquired> acquire(std::chrono::nanoseconds timeout, bool bounded);
  NodeContext& node_;
  uint32_t id_;
};

// A pool range the lock protects: invalidated after acquire (rule 4) and
// flushed before release (rule 3), so the critical section sees the last
// holder's writes and leaves its own for the next holder.
struct PoolRange {
  void* ptr = nullptr;
  size_t len = 0;
};

class [[nodiscard]] LockGuard {
 public:
  static Result<LockGuard> take(TwoTierLock& lock, PoolRange protect = {});
  // As take(), -ETIMEDOUT if not acquired within `timeout`.
  static Result<LockGuard> take_for(TwoTierLock& lock, std::chrono::nanoseconds timeout,
                                    PoolRange protect = {});
  LockGuard(LockGuard&& o) noexcept;
  LockGuard& operator=(LockGuard&&) = delete;
  ~LockGuard();
  Acquired how() const { return how_; }
  Result<void> release();  // early release; the destructor does it otherwise

 private:
  LockGuard(TwoTierLock* l, PoolRange r, Acquired how) : lock_(l), range_(r), how_(how) {}
  static Result<LockGuard> entered(TwoTierLock& lock, Result<Acquired> r, PoolRange protect);
  TwoTierLock* lock_;
  PoolRange range_;
  Acquired how_;
};

// ---- several locks in one call (batches) --------------------------------------------

// A set of locks of one node taken together, e.g. the index stripes of a
// batch.  lock(ids) sorts and deduplicates `ids` and takes them in
// ascending order (one global order: two sets never deadlock; a lock taken
// singly with TwoTierLock is a set of one).  A lock whose grant this node
// keeps (sticky) costs node-local memory only; the others are requested
// from the manager together, in one doorbell post, and the manager grants
// them in ascending order (uapi/cxlkv_ctrl.h "Lock sets"), so the set waits
// once instead of once per lock.  All or nothing: on an
// error the set holds nothing.  unlock() releases all of them (descending
// order); the destructor does it if the caller did not.  One LockSet per
// thread at a time; it is reusable after unlock().
class LockSet {
 public:
  explicit LockSet(NodeContext& node) : node_(node) {}
  ~LockSet();
  LockSet(const LockSet&) = delete;
  LockSet& operator=(const LockSet&) = delete;

  // recovered if any lock of the set was recovered from a dead local holder.
  // -EBUSY if the set already holds locks; -EINVAL for an id out of range.
  Result<Acquired> lock(std::span<const uint32_t> ids);
  // As lock(); -ETIMEDOUT if the whole set is not held within `timeout`.
  Result<Acquired> try_lock_for(std::span<const uint32_t> ids, std::chrono::nanoseconds timeout);
  Result<void> unlock();
  // Held lock ids, ascending (empty when nothing is held).
  std::span<const uint32_t> held() const { return held_; }
  bool holds(uint32_t id) const;
  NodeContext& node() const { return node_; }

 private:
  Result<Acquired> acquire(std::span<const uint32_t> ids, std::chrono::nanoseconds timeout, bool bounded);
  NodeContext& node_;
  std::vector<uint32_t> held_;
};

// ---- the lock manager ------------------------------------------------------------

struct PollPolicy {
  uint32_t spin_rounds = 8;                 // busy rounds after the last activity (few: a waiter may share the CPU)
  uint32_t yield_rounds = 2000;             // then sched_yield() rounds
  std::chrono::microseconds max_sleep{200};  // then sleeps doubling up to this (added latency bound)
};

struct LockManagerOptions {
  uint32_t node = 0;          // informational: recorded in the lease
  uint32_t lease_ms = 2000;   // a successor takes over after this long without renewal
  static constexpr uint32_t kMinLeaseMs = 20;  // create() refuses a shorter lease (-EINVAL)
  bool wait_for_lease = false;  // create(): wait until the lease can be taken instead of -EBUSY
  PollPolicy poll{};
  // How often the liveness of a holder that others wait for (and of waiters
  // before a grant) is re-checked; a dead holder's lock moves on within
  // this plus the liveness rule's own delay (process: at once; remote
  // heartbeat: kNodeStaleMs).
  std::chrono::milliseconds liveness_check{10};
};

struct LockManagerStats {
  uint64_t rounds = 0, grants = 0, releases = 0, doorbells = 0, rescans = 0, sleeps = 0;
  uint64_t revokes = 0;       // sticky grants taken back for another node
  uint64_t dead_holders = 0;  // locks taken from a dead holder
  uint64_t dead_waiters = 0;  // requests of dead waiters skipped
  uint64_t asks = 0;          // contended grants of live nodes on other hosts: the node asked whether the holder lives
  uint64_t wakeups = 0;       // idle sleeps a node on this host ended (request or release)
  uint64_t epoch = 0;
};

class LockManager {
 public:
  // Takes the pool's manager lease: free -> taken at once; held by a live
  // manager -> -EBUSY (after watching it for up to lease_ms); expired -> taken over.
  static Result<std::unique_ptr<LockManager>> create(Region& region, MemoryDomain& domain,
                                                     const LockManagerOptions& opts = {});
  static Result<std::unique_ptr<LockManager>> create(Region& region,
                                                     const LockManagerOptions& opts = {}) {
    return create(region, region.domain(), opts);
  }
  ~LockManager();  // stops the thread and frees the lease

  // One round: doorbells, releases, grants, lease renewal.  True if it
  // granted or released something or saw a new request.  Error: lease lost.
  Result<bool> run_once();
  // Run rounds with adaptive polling on a thread until stop().
  void start();
  void stop();
  bool running() const { return thread_.joinable(); }
  // Run rounds on the calling thread until `stop` becomes true (cxlkvd).
  Result<void> run(const std::atomic<bool>& stop);
  // Free the lease (clean shutdown); idempotent.
  void release_lease();
  LockManagerStats stats() const;

  struct State;

 private:
  LockManager(Region& r, MemoryDomain& d, ControlCarve c, LockManagerOptions o);
  Region& region_;
  MemoryDomain& domain_;
  ControlCarve ctrl_;
  LockManagerOptions opts_;
  std::unique_ptr<State> st_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cxlkv
