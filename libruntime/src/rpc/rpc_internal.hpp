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

// A party (server or client) recorded in the pool: alive by the liveness
// rule (uapi/cxlkv_ctrl.h): its process on this host, its node's heartbeat
// on another host.  `why` gets the reason when it is dead.
bool party_alive(NodeContext& node, uint32_t pid, uint64_t start_time, uint32_t host_id, uint32_t party_node,
                 std::string* why);

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
