// SPDX-License-Identifier: MIT
// Internals shared by the RPC server and client (libruntime/src/rpc/).
#pragma once

#include <time.h>

#include <cstdint>
#include <string>

#include "cxlkv/rpc.hpp"
#include "cxlkv/sync.hpp"

namespace cxlkv::rpc {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// What an observer remembers of a remote node's heartbeat: the last value
// seen and when (on the observer's own clock) it last changed.
struct HeartbeatWatch {
  uint64_t heartbeat = 0;
  uint64_t changed_ns = 0;  // 0: never looked
};

// A party (server or client) recorded in the pool: alive by the liveness
// rule (uapi/cxlkv_ctrl.h): its process on this host, its node's heartbeat
// on another host.  With a watch, a remote node is judged by heartbeat
// progress on this host's clock (dead when its heartbeat has not advanced
// for kNodeStaleMs), so the hosts' clocks need not agree; without one by the
// heartbeat's wall-clock age (judge_node).  `why` gets the reason when dead.
bool party_alive(NodeContext& node, uint32_t pid, uint64_t start_time, uint32_t host_id, uint32_t party_node,
                 std::string* why, HeartbeatWatch* watch = nullptr);

// A random 64-bit value (token, start sequence).
uint64_t random_u64();

// Read one 64-byte line fresh (rule 4: invalidate, fence, load).
template <class T>
T read_line_fresh(MemoryDomain& d, const T* p) {
  static_assert(sizeof(T) == 64);
  return d.read_fresh(p);
}

}  // namespace cxlkv::rpc

// Test-only switches (see sync/testing.hpp for the pattern): they exist so a
// test can show that the NonCoherentSim tests catch a broken RPC protocol.
namespace cxlkv::rpc::testing {
// The server loads request slots without invalidating them first (rule 4).
void set_break_request_invalidate(bool on);
bool break_request_invalidate();
// The client polls reply headers without invalidating them first (rule 4).
void set_break_reply_invalidate(bool on);
bool break_reply_invalidate();
// The server writes reply payloads with plain stores and no flush (rule 3):
// the bytes may stay in its cache after the flag is out.
void set_break_reply_flush(bool on);
bool break_reply_flush();
}  // namespace cxlkv::rpc::testing
