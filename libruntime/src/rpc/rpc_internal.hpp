// SPDX-License-Identifier: MIT
// Internals shared by the RPC server and client (libruntime/src/rpc/).
#pragma once


#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cxlkv/rpc.hpp"
#include "cxlkv/sync.hpp"
#include "util/clock.hpp"

namespace cxlkv::rpc {

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

// ---- messages in slots (cxlkv/format/rpc_format.h, version 2) ------------------------

static_assert(offsetof(cxlkv_rpc_req_hdr, op) == offsetof(cxlkv_rpc_resp_hdr, status) &&
                  offsetof(cxlkv_rpc_req_hdr, len) == offsetof(cxlkv_rpc_resp_hdr, len) &&
                  offsetof(cxlkv_rpc_req_hdr, data) == offsetof(cxlkv_rpc_resp_hdr, data),
              "requests and responses share the line-0 layout");

// Writes one message into its slot: the continuation lines, then line 0,
// each line with one publish_line (rule 1/2: the slot is this writer's
// alone; whole lines, non-temporal, nothing left dirty in our cache).
// whole: every line carries the flag (line 0) or its stamp, and each lands
// in one piece (MemoryDomain::publish_line_whole), so one fence after the
// batch publishes it (rule 3).  Otherwise line 0 goes out with flag word 0
// and the caller writes the flag after a fence (rule 3: data, fence, flag).
// plain_cont (test switch break_reply_flush only): continuation lines with
// plain stores and no flush -- rule 3 broken on purpose.
inline void put_message(MemoryDomain& d, void* slot, uint64_t flag, uint32_t word, const std::byte* payload,
                        uint32_t len, bool whole, bool plain_cont = false) {
  std::byte* base = static_cast<std::byte*>(slot);
  alignas(64) cxlkv_rpc_cont_line c;
  c.stamp = flag;
  uint32_t k = 1;
  for (uint32_t off = CXLKV_RPC_INLINE; off < len; off += CXLKV_RPC_CONT, k++) {
    const uint32_t n = std::min<uint32_t>(CXLKV_RPC_CONT, len - off);
    std::memcpy(c.data, payload + off, n);
    if (n < CXLKV_RPC_CONT) std::memset(c.data + n, 0, CXLKV_RPC_CONT - n);
    if (plain_cont)
      d.store(base + 64ull * k, &c, 64);  // test only: rule 3 broken
    else
      d.publish_line(base + 64ull * k, &c);
  }
  alignas(64) cxlkv_rpc_req_hdr h;
  h.flag = whole ? flag : 0;
  h.op = word;
  h.len = len | (whole ? CXLKV_RPC_LEN_WHOLE : 0u);
  const uint32_t n0 = std::min<uint32_t>(len, CXLKV_RPC_INLINE);
  std::memcpy(h.data, payload, n0);
  if (n0 < CXLKV_RPC_INLINE) std::memset(h.data + n0, 0, CXLKV_RPC_INLINE - n0);
  d.publish_line(base, &h);
}

// Loads continuation lines [from, lines) of the message at `slot` (rule 4:
// the caller invalidated them and fenced) and copies the first `cap`
// payload bytes into dst (payload offset 0 = line 0's data).  False when a
// line does not carry `flag` as its stamp yet (an older message's line, or
// one still on its way): the message is not complete.
inline bool load_cont(MemoryDomain& d, const void* slot, uint64_t flag, uint32_t from, uint32_t lines, std::byte* dst,
                      uint32_t cap, bool check_stamps = true) {
  const std::byte* base = static_cast<const std::byte*>(slot);
  alignas(64) cxlkv_rpc_cont_line c;
  for (uint32_t k = from; k < lines; k++) {
    d.load(&c, base + 64ull * k, 64);
    if (c.stamp != flag && check_stamps) return false;
    const uint32_t off = CXLKV_RPC_INLINE + (k - 1) * CXLKV_RPC_CONT;
    if (off < cap) std::memcpy(dst + off, c.data, std::min<uint32_t>(CXLKV_RPC_CONT, cap - off));
  }
  return true;
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
// Readers take continuation lines without checking their stamps: a line of
// an older message, or one still on its way, is taken as this message's.
void set_break_stamp_check(bool on);
bool break_stamp_check();
// Writers use the two-phase publication (data, fence, flag, fence) even
// where publish_line lands whole: the path of CPUs without movdir64b.
void set_force_two_phase(bool on);
bool force_two_phase();
}  // namespace cxlkv::rpc::testing
