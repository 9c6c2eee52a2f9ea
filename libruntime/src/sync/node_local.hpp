// SPDX-License-Identifier: MIT
// Node-local shared memory: state that the processes of one host share for
// one pool and that other hosts never see (DESIGN: "Node-local state ...
// lives in node-local shared memory, not in the pool").  A /dev/shm file
// "cxlkv-node-<pool id hex>-<node>" holds:
//
//   NodeLocalHeader   doorbell / heartbeat / heap / watcher mutexes, doorbell seq,
//                     futex words a manager on this host wakes
//   LocalLockEntry    [max_locks]: the local tier of every lock
//   heap area         NodeHeap's free-list state (alloc/node_heap.cpp)
//   pin section       the node's pins by process (index/node_pins.cpp): a
//                     robust mutex (initialised here), then the index
//                     layer's tables (zero until its first use)
//
// All mutexes are process-shared and robust.  A file is made whole before
// it gets its name (an unnamed O_TMPFILE file, then linked), so no process
// ever opens one half-made, and none is ever truncated while in use: one
// of another layout is replaced by a new file.  Racing processes of one
// node agree on whichever file the name holds.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"

namespace cxlkv {

// Phase of a node's request for one lock; tells a recovering process what a
// dead holder left behind in the pool.
enum class LockPhase : uint32_t {
  idle = 0,       // global slot IDLE (or released)
  requested = 1,  // slot written WAITING with `ticket`, not yet granted
  held = 2,       // granted: holds the global lock with `ticket`
  cached = 3,     // released, the node keeps the grant (sticky): the slot still
                  // reads (ticket<<2)|WAITING; re-entry touches node-local memory only
  orphaned = 4,   // a holder died inside its critical section and the node's
                  // watcher released the global slot for it: the next locker
                  // reports Acquired::recovered
};

struct alignas(64) LocalLockEntry {
  pthread_mutex_t mu;   // the local tier
  uint64_t ticket;      // last ticket this node used for the lock; 0: not yet read from the slot
  LockPhase phase;
  uint32_t holder_pid;
  uint32_t grant_flags;  // flags of the grant this node holds (CXLKV_GRANT_CONTENDED: do not keep it)
  // Set (atomically, without `mu`) by the node's watcher when the manager
  // revoked the kept grant of `ticket` while a process held `mu`: the
  // release then writes IDLE instead of keeping the grant.  Cleared under `mu`.
  uint32_t revoke;
};
static_assert(sizeof(LocalLockEntry) == 64);

constexpr uint64_t kNodeLocalMagic = 0x314c4e564b4c5843ULL;  // "CXLKVNL1"
constexpr uint32_t kNodeLocalVersion = 3;  // 2: watcher, wake words, LocalLockEntry::revoke; 3: LocalChunk::bits_words

struct alignas(64) NodeLocalHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t node;
  uint8_t pool_id[16];
  uint32_t max_locks;
  uint32_t max_nodes;
  uint64_t total_size;
  uint64_t locks_off;
  uint64_t heap_off;
  uint64_t heap_bytes;
  alignas(64) pthread_mutex_t doorbell_mu;
  uint64_t doorbell_seq;     // this node's doorbell seq (authoritative; under doorbell_mu)
  uint32_t doorbell_valid;   // doorbell_seq was read from the pool
  alignas(64) pthread_mutex_t heartbeat_mu;  // held by the process that beats
  alignas(64) pthread_mutex_t heap_mu;       // NodeHeap state
  // The node's watcher (sync/watcher.cpp): held by the one thread of this
  // node that acknowledges revocations of kept (sticky) grants.
  alignas(64) pthread_mutex_t watcher_mu;
  // Futex words (process-shared): a lock manager on this host bumps them and
  // wakes the node's waiters (grant_wake: a grant was written for this node)
  // and its watcher (revoke_wake: a kept grant of this node was revoked).
  // Waiters and the watcher also poll the pool (bounded waits), so a manager
  // on another host, which cannot reach them, only adds latency.
  alignas(64) uint32_t grant_wake;
  uint32_t grant_sleepers;  // waiters blocked on grant_wake (the manager skips the syscall at 0)
  alignas(64) uint32_t revoke_wake;
  // The other direction: a lock manager on this host that found nothing to
  // do sleeps on mgr_wake of every node it maps (futex_waitv) after setting
  // mgr_sleeping; a process of this node that posts a request or releases a
  // lock others wait for bumps mgr_wake and wakes it (wake_manager()).
  // waker_ns: CLOCK_MONOTONIC time at which such a manager last stamped this
  // header (every node-table scan): while recent, every grant and revocation
  // for this node comes with a wake, and the node's polls (the fallback for a
  // manager on another host) can be slow.  Zero in files of older versions.
  uint32_t mgr_wake;
  uint32_t mgr_sleeping;
  uint64_t waker_ns;
  // CLOCK_MONOTONIC_COARSE time of this node's last heartbeat, stored
  // (release) after the beat is in the pool; zero while no process of the
  // node beats, and in files of older versions.  A kept grant is not
  // trusted while it is older than kBeatLapseNs (docs/locks.md "Heartbeat
  // lapses"; sync/watcher.hpp).
  uint64_t beat_mono_ns;
};

static_assert(sizeof(NodeLocalHeader) <= 4096, "a lock manager maps the first page (sync/watcher.hpp)");

// The pin section (index/node_pins.hpp): node-wide pin counts of the index,
// by process.  Only its mutex is this file's business.
struct alignas(64) NodePinSectionHead {
  pthread_mutex_t mu;
};
constexpr uint64_t kNodePinSectionBytes = (uint64_t(512) << 10) + 4096;

struct NodeLocal {
  static Result<NodeLocal*> open(const std::string& name, uint32_t node, const uint8_t pool_id[16],
                                 uint32_t max_locks, uint32_t max_nodes, uint64_t heap_bytes);
  ~NodeLocal();
  NodeLocalHeader* hdr = nullptr;
  LocalLockEntry* locks = nullptr;
  std::byte* heap = nullptr;
  uint64_t heap_bytes = 0;
  std::byte* pins = nullptr;  // kNodePinSectionBytes, starts with NodePinSectionHead
  size_t map_len = 0;
  std::string name;
  // Per lock id: this process itself kept the lock's grant at its last
  // release (phase `cached`).  Process memory, not the shared file: a
  // successor process of the node, even one with the dead keeper's pid,
  // finds none of its own (two_tier_lock.cpp, kept_grant_is_ours).  Read
  // and written under the lock's node-local mutex.
  std::vector<uint8_t> kept_here;
};

// Page 0 (the header) of node `node`'s local file /dev/shm/NAME, mapped
// read/write for the wake-up words, or nullptr when there is none of this
// layout version.  Opened as NodeLocal::open opens (util::safe_open: a file
// of another user, which could shrink under the mapping, is not mapped)
// and its header read before any mapping, so a short file never raises
// SIGBUS.  munmap(p, 4096) when done.
NodeLocalHeader* map_node_local_header(const std::string& name, uint32_t node);

}  // namespace cxlkv
