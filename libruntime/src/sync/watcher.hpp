// SPDX-License-Identifier: MIT
// The node's watcher and the manager's same-host wake-ups.
//
// Watcher: one thread per node (elected through NodeLocalHeader::watcher_mu;
// every NodeContext on a non-dev pool runs a candidate) that acknowledges
// the manager's revocations of grants the node keeps (sticky): it polls its
// doorbell's `revokes` counter (one fresh read per round; a manager on this
// host also wakes it through NodeLocalHeader::revoke_wake), finds the
// revoked grants among the locks the node keeps, and for each takes the
// lock's node-local mutex and writes the slot IDLE -- or, when a process is
// inside the critical section, flags the entry so that the release writes
// IDLE.  uapi/cxlkv_ctrl.h "Sticky grants" has the protocol.
//
// NodeWakers: the lock manager's view of the node-local headers of nodes on
// its own host (opened by their default name), to wake waiters after a grant
// and watchers after a revocation without waiting for their next poll.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"

namespace cxlkv {
struct NodeLocalHeader;

namespace sync {

struct FutexWaitvSlot {  // sync/futex.hpp FutexWaitv
  uint64_t val, uaddr;
  uint32_t flags, reserved;
};

// How often the watcher polls the pool when nothing wakes it, and (slow)
// while a lock manager on this host stamps the node's header: that manager
// wakes the watcher after each revocation, so the poll is only a safety net.
constexpr std::chrono::microseconds kWatcherPoll{500};
constexpr std::chrono::microseconds kWatcherPollWoken{10000};
// A stamp younger than this says a manager on this host wakes the node (it
// stamps every node-table scan, 20 ms).
constexpr std::chrono::milliseconds kWakerFresh{100};

// After writing a request (doorbell) or a release to the pool: wake a lock
// manager on this host that sleeps for lack of work (NodeLocalHeader::
// mgr_sleeping).  Costs a fence and a load when none sleeps.
void wake_manager(NodeLocalHeader* h);
// Whether a manager on this host stamped `h` within kWakerFresh.
bool woken_by_local_manager(const NodeLocalHeader* h);
// Longest time between two sweeps for revoked grants with no bump seen.
constexpr std::chrono::milliseconds kWatcherResweep{20};

// Run the watcher candidate of `node` until `stop` (NodeContext's thread).
void run_watcher(NodeContext& node, const std::atomic<bool>& stop);

// Heartbeat lapses (docs/locks.md "Heartbeat lapses"): a node of another
// host is judged dead once its heartbeat is kNodeStaleMs old, and the
// manager then gives the grants it keeps to others.  A node paused that
// long (SIGSTOP, a stopped VM, a stall) must not re-enter them when it
// resumes: a kept grant is trusted only while the node's last beat is
// younger than kBeatLapseNs (half of kNodeStaleMs: the manager's verdict
// waits twice as long, which covers clock drift between the hosts), and a
// beat that follows a lapse first gives up every kept grant.
constexpr uint64_t kBeatLapseNs = uint64_t(kNodeStaleMs / 2) * 1000000;
// The clock of NodeLocalHeader::beat_mono_ns (CLOCK_MONOTONIC_COARSE: a
// few ns from the vDSO, 1-4 ms resolution).
uint64_t beat_clock_ns();
// Whether this node's last beat is older than kBeatLapseNs (false while no
// process of it beats).  Read before the lock's revoke flag (acquire),
// in the opposite order to end_lapse's stores.
bool heartbeat_lapsed(const NodeContext& node);
// Called by NodeContext::beat before it publishes a beat: when the node's
// previous beat is older than kBeatLapseNs, give up every kept grant (slot
// IDLE, as a revocation's answer) and flag every one in use (its release
// or fast path gives it up), so none is re-entered after the beat makes
// the node alive again.  `attaching`: the first beat of this process (a
// successor finding its predecessor's old beat: logged at info level).
void end_lapse(NodeContext& node, bool attaching);

// Give back every grant this node keeps but nobody uses (phase `cached`),
// as a revocation's answer would: called when a process detaches, so a
// grant is never kept by a node with no watcher left to answer for it
// (the process lives on, so liveness would not free it).
void release_kept_grants(NodeContext& node);

class NodeWakers {
 public:
  NodeWakers(const Region& region, uint32_t max_nodes);
  ~NodeWakers();
  NodeWakers(const NodeWakers&) = delete;
  NodeWakers& operator=(const NodeWakers&) = delete;
  // Node n's entry as last read by the manager: (re)opens the node's local
  // header when n is on this host and its incarnation changed.
  void refresh(uint32_t n, const cxlkv_node_entry& e);
  void wake_grant(uint32_t n);   // a grant for node n was written (after the fence)
  void wake_revoke(uint32_t n);  // a kept grant of node n was revoked (after the fence)
  // Stamp every open header with `now_ns` (CLOCK_MONOTONIC): its node may
  // poll slowly (NodeLocalHeader::waker_ns).
  void stamp(uint64_t now_ns);
  // Whether every node of the `watch` mask has its header open here: then a
  // request or release of any of them comes with a wake.
  bool all_open(uint64_t watch) const;
  // Sleeping for lack of work, in three steps: arm() sets mgr_sleeping in
  // every open header (seq_cst) and notes their mgr_wake words; the caller
  // then looks at the pool once more (a request or release written before
  // the flag was seen is found there; one written after it bumps the word);
  // sleep() waits until a word moves (true) or `ns` pass; disarm() clears
  // the flags.
  void arm();
  bool sleep(uint64_t ns);
  void disarm();

 private:
  struct Entry {
    NodeLocalHeader* hdr = nullptr;
    uint64_t incarnation = 0;
    bool tried = false;
  };
  void close(Entry& e);
  std::string pool_prefix_;
  std::vector<Entry> nodes_;
  std::vector<FutexWaitvSlot> armed_;
  bool waitv_ok_ = true;  // the kernel has futex_waitv
};

}  // namespace sync
}  // namespace cxlkv
