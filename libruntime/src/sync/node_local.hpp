// SPDX-License-Identifier: MIT
// Node-local shared memory: state that the processes of one host share for
// one pool and that other hosts never see (DESIGN: "Node-local state ...
// lives in node-local shared memory, not in the pool").  A /dev/shm file
// "cxlkv-node-<pool id hex>-<node>" holds:
//
//   NodeLocalHeader   doorbell / heartbeat / heap mutexes, doorbell seq
//   LocalLockEntry    [max_locks]: the local tier of every lock
//   heap area         NodeHeap's free-list state (alloc/node_heap.cpp)
//
// All mutexes are process-shared and robust.  The file is created and
// initialised under flock(), so racing processes of one node agree.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlkv/result.hpp"

namespace cxlkv {

// Phase of a node's request for one lock; tells a recovering process what a
// dead holder left behind in the pool.
enum class LockPhase : uint32_t {
  idle = 0,       // global slot IDLE (or released)
  requested = 1,  // slot written WAITING with `ticket`, not yet granted
  held = 2,       // granted: holds the global lock with `ticket`
  cached = 3,     // released with a sticky grant: slot (ticket<<2)|STICKY, re-entry
                  // needs only the slot write and one fresh read of the grant
};

struct alignas(64) LocalLockEntry {
  pthread_mutex_t mu;   // the local tier
  uint64_t ticket;      // last ticket this node used for the lock; 0: not yet read from the slot
  LockPhase phase;
  uint32_t holder_pid;
  uint32_t grant_flags;  // flags of the grant this node holds (CXLKV_GRANT_CONTENDED: do not keep it)
};
static_assert(sizeof(LocalLockEntry) == 64);

constexpr uint64_t kNodeLocalMagic = 0x314c4e564b4c5843ULL;  // "CXLKVNL1"
constexpr uint32_t kNodeLocalVersion = 1;

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
};

struct NodeLocal {
  static Result<NodeLocal*> open(const std::string& name, uint32_t node, const uint8_t pool_id[16],
                                 uint32_t max_locks, uint32_t max_nodes, uint64_t heap_bytes);
  ~NodeLocal();
  NodeLocalHeader* hdr = nullptr;
  LocalLockEntry* locks = nullptr;
  std::byte* heap = nullptr;
  uint64_t heap_bytes = 0;
  size_t map_len = 0;
  std::string name;
};

}  // namespace cxlkv
