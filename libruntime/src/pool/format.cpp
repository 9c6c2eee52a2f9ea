// SPDX-License-Identifier: MIT
#include "pool/format.hpp"


#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "cxlkv/alloc.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "region/backend.hpp"
#include "region/superblock.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

// The pool size format_pool will end up with, without touching the pool.
Result<uint64_t> expected_pool_size(std::string_view uri, const PoolFormatOptions& o) {
  auto pu = region::parse_pool_uri(uri);
  if (!pu) return pu.error();
  if (o.size) return o.size;
  if (pu->kind == BackendKind::shm && pu->size) return pu->size;
  auto be = region::open_backend(pu.value(), {});
  if (!be && be.error().code() == -ENOENT && (pu->kind == BackendKind::shm || pu->kind == BackendKind::file))
    return region::needs_size_error(pu.value());
  if (!be) return be.error();
  return be.value()->size();
}

// Zero [off, off+len) of the pool through the domain, as bulk data: the
// fence in the caller's next publish covers it (rule 3).
void zero_range(Region& r, MemoryDomain& d, uint64_t off, uint64_t len) {
  static const std::vector<std::byte> zeros(1 << 20);
  while (len) {
    uint64_t n = std::min<uint64_t>(len, zeros.size());
    d.copy_to_pool(r.at(off), zeros.data(), n);
    off += n;
    len -= n;
  }
}

}  // namespace

// The standard carves and their initial contents, on a freshly formatted pool.
Result<void> lay_out_standard_pool(Region& r, const PoolLayout& L) {
  struct Want {
    std::string name;
    uint64_t off, size;
    uint32_t flags;
  };
  std::vector<Want> wants = {{CXLKV_CARVE_CONTROL, L.control_off, L.control_size, CXLKV_CARVE_F_SYSTEM},
                             {CXLKV_CARVE_INDEX, L.index_off, L.index_size, CXLKV_CARVE_F_SYSTEM},
                             {CXLKV_CARVE_ALLOC, L.alloc_off, L.alloc_size, CXLKV_CARVE_F_SYSTEM}};
  for (const auto& x : L.extra) wants.push_back({x.name, x.off, x.size, 0});
  wants.push_back({CXLKV_CARVE_KV, L.kv_off, L.kv_size, CXLKV_CARVE_F_SYSTEM});
  for (const Want& w : wants) {
    auto c = r.carve_create(w.name, w.size, MemType::wb, w.flags);
    if (!c) return c.error();
    if (c->offset != w.off)
      return Error(-EIO, "pool " + r.uri() + ": carve '" + w.name + "' placed at " + std::to_string(c->offset) +
                             " instead of the planned " + std::to_string(w.off));
  }

  MemoryDomain& d = r.domain();
  // Fresh metadata: every state in control, index and alloc starts as zero
  // (ABSENT nodes, IDLE slots, EMPTY index entries, free chunks).
  zero_range(r, d, L.control_off, L.control_size);
  zero_range(r, d, L.index_off, L.index_size);
  zero_range(r, d, L.alloc_off, L.alloc_size);
  for (const auto& x : L.extra) zero_range(r, d, x.off, x.size);
  // rule 3: the zeroed carves are in memory before the header that makes
  // the control carve valid.
  d.fence();
  // The control header is read by the kernel module and every node: one
  // line, written whole and flushed (rule 3).
  d.store(r.at(L.control_off), &L.ctrl, sizeof L.ctrl);
  d.flush(r.at(L.control_off), sizeof L.ctrl);
  d.fence();

  // ---- layer initializers, called explicitly in this order --------------
  // sync area: lease, node table, lock slots, grants (GRANT_NONE), doorbells.
  CXLKV_TRY(format_control_carve(r, d, ControlFormatOptions{L.ctrl.max_locks}));
  // sync area: chunk bitmap, chunk table, remote-free bitmaps, object store.
  CXLKV_TRY(format_alloc_carve(r, d, AllocFormatOptions{}));
  // kvstore area: the prefix index (cxlkv/format/index_format.h) over the whole index carve.
  {
    IndexFormatOptions io;
    io.max_nodes = L.ctrl.max_nodes;  // the superblock's max_nodes
    CXLKV_TRY(index_format(d, r.at(L.index_off), L.index_size, io));
  }
  // -----------------------------------------------------------------------

  log().info("pool {}: standard layout: control {} at {:#x}, index {} ({} entries) at {:#x}, "
             "alloc {} at {:#x}, kv {} at {:#x}",
             r.uri(), region::human_size(L.control_size), L.control_off, region::human_size(L.index_size),
             L.index_entries, L.index_off, region::human_size(L.alloc_size), L.alloc_off,
             region::human_size(L.kv_size), L.kv_off);
  return {};
}

namespace {

// Who uses the pool at `uri` now: its live nodes (the one liveness rule,
// judge_node) and a lock manager renewing its lease.  "" when nobody (or
// when there is no readable pool or control carve to ask: nothing there can
// be in use as a cxlkv pool).
std::string live_users(std::string_view uri) {
  auto pu = region::parse_pool_uri(uri);
  if (!pu) return "";
  // The pool as it is, whatever size the URI names (a force at another
  // size destroys it just the same).
  const std::string at = pu->kind == BackendKind::shm ? "shm:" + pu->path.substr(pu->path.rfind('/') + 1) : pu->uri;
  OpenOptions oo;
  oo.prefault = false;
  auto r = Region::open(at, oo);
  if (!r) return "";
  Region& region = *r.value();
  auto ctrl = ControlCarve::open(region, region.domain());
  if (!ctrl) return "";
  std::string live;
  for (const NodeStatus& n : list_nodes(region, region.domain())) {
    if (n.state != CXLKV_NODE_ACTIVE || !n.alive) continue;
    live += (live.empty() ? "" : ", ") + std::string("node ") + std::to_string(n.node) + " (" +
            (n.local ? "pid " + std::to_string(n.pid) + " on this host" : "host " + n.host + ", " + n.why) + ")";
  }
  // The manager's lease is live while its heartbeat moves: watched for its
  // lease time (renewals come every quarter of it), at most kNodeStaleMs;
  // a longer lease counts as live while its last renewal is younger than it.
  MemoryDomain& d = region.domain();
  const cxlkv_lease first = d.read_fresh(ctrl->lease());  // rule 4
  bool manager = false;
  if (first.owner != 0) {
    const auto watch = std::chrono::milliseconds(std::min<int64_t>(first.lease_ms, kNodeStaleMs));
    const auto t0 = std::chrono::steady_clock::now();
    while (!manager && std::chrono::steady_clock::now() - t0 < watch) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const cxlkv_lease now = d.read_fresh(ctrl->lease());  // rule 4
      manager = now.owner != 0 && (now.owner != first.owner || now.heartbeat != first.heartbeat);
    }
    if (!manager && first.lease_ms > kNodeStaleMs) {
      const int64_t age_ms = (int64_t(realtime_ns()) - int64_t(first.renew_ns)) / 1000000;
      manager = age_ms < int64_t(first.lease_ms);
    }
  }
  if (manager)
    live += (live.empty() ? "" : ", ") + std::string("a lock manager (cxlkvd, node ") + std::to_string(first.node) +
            " pid " + std::to_string(first.pid) + ") renewing its lease";
  return live;
}

}  // namespace

Result<void> refuse_live_pool(std::string_view uri) {
  const std::string live = live_users(uri);
  if (live.empty()) return {};
  // No override: a store attached to a reformatted pool keeps writing into
  // what are now other structures.  A node that died is no obstacle (its
  // liveness ends with its process or its heartbeat), so stopping the users
  // is all it takes.
  return Error(-EBUSY, "pool " + std::string(uri) + ": in use by " + live +
                           "; formatting would pull the pool out from under them: stop them first "
                           "(--force overwrites a pool only while nothing uses it)");
}

Result<std::unique_ptr<Region>> format_pool(std::string_view uri, const PoolFormatOptions& o,
                                            const OpenOptions& open_opts) {
  FormatOptions fo;
  fo.size = o.size;
  fo.max_nodes = o.max_nodes;
  fo.force = o.force;
  // DESIGN.md "The pool": formatting is explicit, and never of a live pool.
  if (o.force) CXLKV_TRY(refuse_live_pool(uri));
  if (!o.standard) return Region::format(uri, fo, open_opts);

  // Plan before touching the pool, so bad options leave it as it was.
  auto size = expected_pool_size(uri, o);
  if (!size) return size.error();
  auto plan = plan_pool_layout(uri, size.value(), o);
  if (!plan) return plan.error();

  auto rr = Region::format(uri, fo, open_opts);
  if (!rr) return rr;
  if (rr.value()->size() != size.value())
    return Error(-EIO, "pool " + rr.value()->uri() + ": size changed while formatting");
  CXLKV_TRY(lay_out_standard_pool(*rr.value(), plan.value()));
  return rr;
}

Result<std::unique_ptr<Region>> format_pool_memory(std::string_view name, void* base, uint64_t size,
                                                   const PoolFormatOptions& o, const OpenOptions& open_opts) {
  FormatOptions fo;
  fo.max_nodes = o.max_nodes;
  fo.force = o.force;
  std::string uri = "mem:" + std::string(name);
  std::optional<PoolLayout> plan;
  if (o.standard) {
    auto p = plan_pool_layout(uri, size, o);
    if (!p) return p.error();
    plan = p.value();
  }
  auto rr = Region::format_memory(name, base, size, fo, open_opts);
  if (!rr) return rr;
  if (plan) CXLKV_TRY(lay_out_standard_pool(*rr.value(), *plan));
  return rr;
}

}  // namespace cxlkv
