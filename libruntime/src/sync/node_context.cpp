// SPDX-License-Identifier: MIT
// NodeContext: attach a process to a pool as one node; heartbeats; node
// listing and eviction for operators.
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "carve/alloc_layout.hpp"
#include "cxlkv/sync.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "sync/short_slice.hpp"
#include "sync/watcher.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

std::string pool_id_hex(const Region& r) {
  auto sb = r.superblock();
  char buf[33];
  for (int i = 0; i < 16; i++) std::snprintf(buf + 2 * i, 3, "%02x", sb.pool_id[i]);
  return buf;
}
}  // namespace

std::string NodeContext::default_local_name(const Region& region, uint32_t node) {
  return "cxlkv-node-" + pool_id_hex(region) + "-" + std::to_string(node);
}

void NodeContext::unlink_local(const std::string& name) { ::shm_unlink(("/" + name).c_str()); }

NodeContext::NodeContext(Region& r, MemoryDomain& d, uint32_t node, ControlCarve c)
    : region_(r), domain_(d), node_(node), ctrl_(c) {}

Result<std::unique_ptr<NodeContext>> NodeContext::attach(Region& region, const NodeOptions& opts) {
  return attach(region, region.domain(), opts);
}

Result<std::unique_ptr<NodeContext>> NodeContext::attach(Region& region, MemoryDomain& domain,
                                                         const NodeOptions& opts) {
  auto ctrl = ControlCarve::open(region, domain);
  if (!ctrl) return ctrl.error();
  if (opts.node >= ctrl->max_nodes())
    return Error(-EINVAL, "pool " + region.uri() + ": node " + std::to_string(opts.node) +
                              " out of range (max_nodes " + std::to_string(ctrl->max_nodes()) + ")");
  // A beat period of a quarter of the liveness limit or more would leave
  // the node judged dead between beats, and every beat a lapse
  // (docs/locks.md "Heartbeat lapses").
  if (opts.heartbeat && opts.heartbeat_ms >= kNodeStaleMs / 4)
    return Error(-EINVAL, "pool " + region.uri() + ": node " + std::to_string(opts.node) + ": heartbeat period " +
                              std::to_string(opts.heartbeat_ms) + " ms is not below " +
                              std::to_string(kNodeStaleMs / 4) + " ms (a quarter of the " +
                              std::to_string(kNodeStaleMs) + " ms after which another host judges a node dead)");
  auto heap_bytes = alloc::node_heap_local_bytes(region, domain);
  if (!heap_bytes) return heap_bytes.error();
  std::unique_ptr<NodeContext> nc(new NodeContext(region, domain, opts.node, ctrl.value()));
  nc->local_name_ = opts.local_shm_name.empty() ? default_local_name(region, opts.node) : opts.local_shm_name;
  auto sb = region.superblock();
  auto nl = NodeLocal::open(nc->local_name_, opts.node, sb.pool_id, ctrl->max_locks(), ctrl->max_nodes(),
                            heap_bytes.value());
  if (!nl) return nl.error();
  nc->local_.reset(nl.value());
  nc->sticky_ = opts.sticky;
  nc->heartbeat_ms_ = opts.heartbeat ? (opts.heartbeat_ms ? opts.heartbeat_ms : 250) : 0;
  if (getrandom(&nc->incarnation_, sizeof nc->incarnation_, 0) != sizeof nc->incarnation_)
    nc->incarnation_ = realtime_ns() ^ uint64_t(getpid());

  // Announce the node (ACTIVE) so the lock manager watches its doorbell.
  nc->beat();
  if (opts.heartbeat) {
    // One process per node beats: whoever holds heartbeat_mu (robust and
    // owned per thread, so the beating thread itself takes it).  The others
    // retry each period and take over if the beater dies (EOWNERDEAD).
    uint32_t ms = opts.heartbeat_ms ? opts.heartbeat_ms : 250;
    NodeContext* self = nc.get();
    nc->heartbeat_ = std::thread([self, ms] {
      pthread_setname_np(pthread_self(), "cxlkv-heartbeat");
      pthread_mutex_t* mu = &self->local_->hdr->heartbeat_mu;
      bool owner = false;
      while (!self->stop_.load(std::memory_order_relaxed)) {
        if (!owner) {
          auto r = sync::robust_mutex_trylock(mu, "heartbeat");
          if (r.ok()) {
            owner = true;
            if (r.value() == sync::LockOutcome::owner_died) sync::robust_mutex_consistent(mu);
          }
        }
        if (owner) self->beat();
        for (uint32_t slept = 0; slept < ms && !self->stop_.load(std::memory_order_relaxed); slept += 10)
          usleep(10000);
      }
      if (owner) sync::robust_mutex_unlock(mu);
    });
  }
  // Every process of a node runs a watcher candidate (one of them is the
  // watcher): whoever keeps a grant, sticky or not, is answered for while
  // any process of the node lives.  dev: pools keep no grants.
  if (region.kind() != BackendKind::dev) {
    NodeContext* self = nc.get();
    nc->watcher_ = std::thread([self] {
      pthread_setname_np(pthread_self(), "cxlkv-watcher");
      sync::request_short_slice();  // revocations wait for it (short_slice.hpp)
      sync::run_watcher(*self, self->stop_);
    });
  }
  return nc;
}

NodeContext::~NodeContext() {
  stop_.store(true);
  if (heartbeat_.joinable()) heartbeat_.join();
  if (watcher_.joinable()) watcher_.join();
  // A detaching process keeps no grant: no watcher of it would answer a
  // revocation, and its process being alive, liveness would not free it.
  // No node-local memory (attach failed opening it): no grant was kept.
  if (local_ && region_.kind() != BackendKind::dev) sync::release_kept_grants(*this);
}

void NodeContext::beat() {
  // docs/locks.md "Heartbeat lapses": kept grants of a node that was silent
  // long enough to be judged dead are given up before it is alive again.
  NodeLocalHeader* lh = local_ ? local_->hdr : nullptr;
  if (lh && region_.kind() != BackendKind::dev) sync::end_lapse(*this, beats_ == 0);
  cxlkv_node_entry e{};
  e.heartbeat = ++beats_ + (incarnation_ & 0xffffffff00000000ull);
  e.heartbeat_ns = realtime_ns();
  e.state = CXLKV_NODE_ACTIVE;
  e.pid = self_pid();
  e.incarnation = incarnation_;
  e.start_time = self_start_time();  // liveness on this host: pid + start time
  e.host_id = this_host_id();
  e.heartbeat_ms = heartbeat_ms_;
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  std::memcpy(e.host, h, sizeof e.host - 1);
  // rule 1: the entry is also written by operators (evict): whole line, NT.
  domain_.publish_line(ctrl_.node_entry(node_), &e);
  domain_.fence();
  // After the beat is in the pool (the fence above); release: after
  // end_lapse's flags (sync/watcher.hpp heartbeat_lapsed).
  // Only a process that beats periodically stamps it: a node none of whose
  // processes beat has no lapse to detect (its stamp stays 0).
  if (lh && heartbeat_ms_) __atomic_store_n(&lh->beat_mono_ns, sync::beat_clock_ns(), __ATOMIC_RELEASE);
}

std::vector<NodeStatus> list_nodes(const Region& region, MemoryDomain& d) {
  std::vector<NodeStatus> out;
  auto ctrl = ControlCarve::open(region, d);
  if (!ctrl) return out;
  const uint64_t now = realtime_ns();
  for (uint32_t n = 0; n < ctrl->max_nodes(); n++) {
    auto e = d.read_fresh(ctrl->node_entry(n));  // rule 4
    NodeStatus s;
    s.node = n;
    s.state = static_cast<cxlkv_node_state>(e.state);
    s.pid = e.pid;
    s.heartbeat = e.heartbeat;
    s.heartbeat_ns = e.heartbeat_ns;
    s.age_ms = e.heartbeat_ns ? static_cast<int64_t>((int64_t(now) - int64_t(e.heartbeat_ns)) / 1000000) : -1;
    NodeVerdict v = judge_node(e);
    s.alive = v.alive;
    s.local = v.local;
    s.why = v.why;
    s.host = std::string(e.host, strnlen(e.host, sizeof e.host));
    if (s.state != CXLKV_NODE_ABSENT) {
      for (uint32_t l = 0; l < ctrl->max_locks(); l++) {
        uint64_t req = d.read_fresh(&ctrl->slot(l, n)->request);  // rule 4
        if ((req & CXLKV_SLOT_STATE_MASK) != CXLKV_SLOT_IDLE) s.waiting_or_holding++;
      }
    }
    out.push_back(s);
  }
  return out;
}

Result<uint32_t> evict_node(Region& region, MemoryDomain& d, uint32_t node, bool force) {
  auto ctrl = ControlCarve::open(region, d);
  if (!ctrl) return ctrl.error();
  if (node >= ctrl->max_nodes())
    return Error(-EINVAL, "pool " + region.uri() + ": node " + std::to_string(node) + " out of range (max_nodes " +
                              std::to_string(ctrl->max_nodes()) + ")");
  auto st = list_nodes(region, d);
  if (st[node].alive && !force)
    return Error(-EBUSY, "pool " + region.uri() + ": node " + std::to_string(node) + " is alive (" + st[node].why +
                             ", pid " + std::to_string(st[node].pid) + " on " + st[node].host +
                             "); use --force to evict anyway");
  uint32_t released = 0;
  for (uint32_t l = 0; l < ctrl->max_locks(); l++) {
    auto* slot = ctrl->slot(l, node);
    uint64_t req = d.read_fresh(&slot->request);  // rule 4
    if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_IDLE) continue;
    // Same write the kernel module does for a closed file: keep the
    // ticket, state IDLE; rule 1: the request word has several writers -> NT.
    uint64_t idle = (req & ~CXLKV_SLOT_STATE_MASK) | CXLKV_SLOT_IDLE;
    d.write_nt<__u64>(&slot->request, idle);
    released++;
  }
  d.fence();  // rule 3: releases visible before the node is marked evicted
  auto e = d.read_fresh(ctrl->node_entry(node));
  e.state = CXLKV_NODE_EVICTED;
  d.publish_line(ctrl->node_entry(node), &e);  // rule 1: whole line, NT
  d.fence();
  log().warn("pool {}: node {} evicted by operator; {} global lock slots released", region.uri(), node, released);
  return released;
}

}  // namespace cxlkv
