// SPDX-License-Identifier: MIT
// The RPC carve: geometry, header, liveness of its parties (cxlkv/format/rpc_format.h).
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "rpc/rpc_internal.hpp"

namespace cxlkv {
namespace {

constexpr uint64_t kLine = 64;
constexpr uint64_t kRingsOff = 2 * kLine;  // header line, server line

bool pow2(uint32_t v) { return v && !(v & (v - 1)); }

Result<void> check_geometry(const RpcGeometry& g, const std::string& what) {
  if (g.rings == 0 || g.rings > CXLKV_RPC_MAX_RINGS)
    return Error(-EINVAL, what + "rings " + std::to_string(g.rings) + " outside 1.." + std::to_string(CXLKV_RPC_MAX_RINGS));
  if (!pow2(g.depth) || g.depth > CXLKV_RPC_MAX_DEPTH)
    return Error(-EINVAL, what + "depth " + std::to_string(g.depth) + " is not a power of two up to " +
                              std::to_string(CXLKV_RPC_MAX_DEPTH));
  if (g.req_lines == 0 || g.req_lines > CXLKV_RPC_MAX_LINES || g.resp_lines == 0 || g.resp_lines > CXLKV_RPC_MAX_LINES)
    return Error(-EINVAL, what + "slot lines " + std::to_string(g.req_lines) + "/" + std::to_string(g.resp_lines) +
                              " outside 1.." + std::to_string(CXLKV_RPC_MAX_LINES));
  return {};
}

// How an operator gets a missing rpc carve (the index service's has a cxlkvctl flag).
std::string how_to_format(std::string_view name) {
  return name == CXLKV_CARVE_RPC ".index"
             ? "format the pool with it: cxlkvctl format --index-service (PoolFormatOptions::extra_carves from C++)"
             : "format the pool with it (PoolFormatOptions::extra_carves)";
}

std::string carve_what(const Region& r, std::string_view name) {
  return "pool " + r.uri() + ": rpc carve '" + std::string(name) + "': ";
}

}  // namespace

uint64_t rpc_carve_bytes(const RpcGeometry& g) {
  return kRingsOff + uint64_t(g.rings) * cxlkv_rpc_ring_bytes(g.depth, g.req_lines, g.resp_lines);
}

RpcGeometry rpc_geometry_for(uint64_t carve_size, RpcGeometry g) {
  uint64_t ring = cxlkv_rpc_ring_bytes(g.depth, g.req_lines, g.resp_lines);
  uint64_t fit = carve_size > kRingsOff ? (carve_size - kRingsOff) / ring : 0;
  g.rings = static_cast<uint32_t>(std::min<uint64_t>({fit, g.rings, CXLKV_RPC_MAX_RINGS}));
  return g;
}

Result<RpcCarve> RpcCarve::open(const Region& region, MemoryDomain& d, std::string_view name) {
  const std::string what = carve_what(region, name);
  auto ci = region.carve(name);
  if (!ci) return Error(-ENOENT, what + "absent (" + how_to_format(name) + ")");
  RpcCarve c;
  c.name_ = std::string(name);
  c.base_ = region.at(ci->offset);
  // rule 4: the header was written by whoever formatted the carve.
  c.hdr_ = d.read_fresh(reinterpret_cast<const cxlkv_rpc_header*>(c.base_));
  const cxlkv_rpc_header& h = c.hdr_;
  if (h.magic == 0) return Error(-ENODATA, what + "not formatted (no server has started on it)");
  if (h.magic != CXLKV_RPC_MAGIC)
    return Error(-EINVAL, what + "bad magic " + std::to_string(h.magic));
  if (h.version != CXLKV_RPC_VERSION)
    return Error(-EINVAL, what + "layout version " + std::to_string(h.version) + ", this library knows " +
                              std::to_string(CXLKV_RPC_VERSION));
  uint32_t ck = static_cast<uint32_t>(
      cxlkv_hdr_checksum(&h, sizeof h, __builtin_offsetof(cxlkv_rpc_header, checksum), 4));
  if (ck != h.checksum)
    return Error(-EINVAL, what + "header checksum mismatch (stored " + std::to_string(h.checksum) + ", computed " +
                              std::to_string(ck) + ")");
  CXLKV_TRY(check_geometry(RpcGeometry{h.nrings, h.depth, h.req_lines, h.resp_lines}, what));
  if (h.server_off != kLine || h.rings_off != kRingsOff ||
      h.ring_bytes != cxlkv_rpc_ring_bytes(h.depth, h.req_lines, h.resp_lines) ||
      h.rings_off + uint64_t(h.nrings) * h.ring_bytes > ci->size)
    return Error(-EINVAL, what + "header geometry does not match the carve (" + std::to_string(h.nrings) + " rings of " +
                              std::to_string(h.ring_bytes) + " B in " + std::to_string(ci->size) + " B)");
  return c;
}

Result<RpcCarve> RpcCarve::open_or_format(Region& region, MemoryDomain& d, std::string_view name,
                                          const RpcGeometry& want) {
  const std::string what = carve_what(region, name);
  CXLKV_TRY(check_geometry(want, what));
  auto ci = region.carve(name);
  if (!ci) {
    auto made = region.carve_create(name, rpc_carve_bytes(want), MemType::wb);
    if (!made)
      return Error(made.error().code(), what + "absent and cannot be created (" + made.error().message() +
                                            "); " + how_to_format(name));
    ci = made;
    // A carve made here may hold old bytes: zero it before the header.
    std::vector<std::byte> zero(1 << 16);
    for (uint64_t off = 0; off < ci->size; off += zero.size())
      d.copy_to_pool(region.at(ci->offset + off), zero.data(), std::min<uint64_t>(zero.size(), ci->size - off));
  }
  auto opened = open(region, d, name);
  if (opened || opened.error().code() != -ENODATA) return opened;

  RpcGeometry g = rpc_geometry_for(ci->size, want);
  if (g.rings == 0)
    return Error(-ENOSPC, what + std::to_string(ci->size) + " B hold no ring of " +
                              std::to_string(cxlkv_rpc_ring_bytes(want.depth, want.req_lines, want.resp_lines)) + " B");
  cxlkv_rpc_header h{};
  h.magic = CXLKV_RPC_MAGIC;
  h.version = CXLKV_RPC_VERSION;
  h.nrings = g.rings;
  h.depth = g.depth;
  h.req_lines = g.req_lines;
  h.resp_lines = g.resp_lines;
  h.server_off = kLine;
  h.rings_off = kRingsOff;
  h.ring_bytes = cxlkv_rpc_ring_bytes(g.depth, g.req_lines, g.resp_lines);
  h.checksum = static_cast<uint32_t>(cxlkv_hdr_checksum(&h, sizeof h, __builtin_offsetof(cxlkv_rpc_header, checksum), 4));
  // rule 3: the zeroed rings (zeroed at format or above, NT) are in memory;
  // the header that makes the carve valid goes last, as one line, and is
  // flushed and fenced.
  d.fence();
  d.publish_line(region.at(ci->offset), &h);
  d.fence();
  return open(region, d, name);
}

namespace rpc {

bool party_alive(NodeContext& node, uint32_t pid, uint64_t start_time, uint32_t host_id, uint32_t party_node,
                 std::string* why, HeartbeatWatch* watch) {
  if (host_id == this_host_id()) {
    if (process_alive(pid, start_time)) return true;
    if (why) *why = "process " + std::to_string(pid) + " is gone";
    return false;
  }
  if (party_node >= node.control().max_nodes()) {
    if (why) *why = "node " + std::to_string(party_node) + " out of range";
    return false;
  }
  // rule 4: the node entry is written by that node's heartbeat.
  cxlkv_node_entry e = node.domain().read_fresh(node.control().node_entry(party_node));
  if (watch) {
    if (e.state != CXLKV_NODE_ACTIVE) {
      if (why) *why = "node " + std::to_string(party_node) + " is not attached";
      return false;
    }
    const uint64_t now = monotonic_ns();
    if (watch->changed_ns == 0 || e.heartbeat != watch->heartbeat) {
      watch->heartbeat = e.heartbeat;
      watch->changed_ns = now;
    }
    const uint64_t still_ms = (now - watch->changed_ns) / 1000000;
    if (still_ms < uint64_t(kNodeStaleMs)) return true;
    if (why) *why = "node " + std::to_string(party_node) + ": heartbeat unchanged for " + std::to_string(still_ms) + " ms";
    return false;
  }
  NodeVerdict v = judge_node(e);
  if (!v.alive && why) *why = "node " + std::to_string(party_node) + ": " + v.why;
  return v.alive;
}

uint64_t random_u64() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  return v ^ (monotonic_ns() * 0x9e3779b97f4a7c15ull) ^ (uint64_t(getpid()) << 17) ^ counter.fetch_add(0x1234567ull);
}

namespace testing {
namespace {
std::atomic<bool> g_req_inv{false}, g_reply_inv{false}, g_reply_flush{false}, g_stamps{false}, g_two_phase{false};
}
void set_break_request_invalidate(bool on) { g_req_inv = on; }
bool break_request_invalidate() { return g_req_inv.load(std::memory_order_relaxed); }
void set_break_reply_invalidate(bool on) { g_reply_inv = on; }
bool break_reply_invalidate() { return g_reply_inv.load(std::memory_order_relaxed); }
void set_break_reply_flush(bool on) { g_reply_flush = on; }
bool break_reply_flush() { return g_reply_flush.load(std::memory_order_relaxed); }
void set_break_stamp_check(bool on) { g_stamps = on; }
bool break_stamp_check() { return g_stamps.load(std::memory_order_relaxed); }
void set_force_two_phase(bool on) { g_two_phase = on; }
bool force_two_phase() { return g_two_phase.load(std::memory_order_relaxed); }
}  // namespace testing

}  // namespace rpc
}  // namespace cxlkv
