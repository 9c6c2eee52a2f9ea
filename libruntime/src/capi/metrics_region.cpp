// SPDX-License-Identifier: MIT
// The pool-state part of the Prometheus definition (cxlkv/metrics.hpp):
// families read from the control, alloc and index carves of a pool (nodes,
// global locks, chunk allocator, KV capacity per tier), and the lock
// manager's own counters (cxlkvd).  Every read is a fresh read (rule 4);
// nothing here writes to the pool.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <vector>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/metrics.hpp"
#include "util/prom_text.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "uapi/cxlkv_pool.h"
#include "cxlkv/format/alloc_format.h"
#include "uapi/cxlkv_ctrl.h"
#include "cxlkv/format/index_format.h"

namespace cxlkv {
namespace {

// ---- the families (names, types, help texts) --------------------------------
const MetricDesc kState[CXLKV_METRIC_STATE_COUNT] = {
    {"cxlkv_node_up", "gauge", "1 when the node's entry in the node table is ACTIVE, per node"},
    {"cxlkv_node_heartbeat_timestamp_seconds", "gauge",
     "Unix time of the node's last heartbeat (its writer's clock; age: time() - this), per node with a heartbeat "
     "thread"},
    {"cxlkv_lock_waits_total", "counter",
     "Global lock requests the node posted to the lock manager (each waited for a grant), per node"},
    {"cxlkv_lock_waiting", "gauge", "Global locks the node is waiting for now (requested, not granted), per node"},
    {"cxlkv_lock_held", "gauge", "Global locks granted to the node now (held or kept sticky), per node"},
    {"cxlkv_lock_grants_total", "counter", "Global lock grants made by the lock manager, pool-wide"},
    {"cxlkv_lock_manager_epoch", "gauge", "Lock manager lease acquisitions so far (a takeover adds one), pool-wide"},
    {"cxlkv_alloc_capacity_bytes", "gauge", "Bytes of the chunk allocator's arena (the kv carve), pool-wide"},
    {"cxlkv_alloc_chunk_size_bytes", "gauge", "Bytes per allocator chunk"},
    {"cxlkv_alloc_chunks", "gauge",
     "Allocator chunks by kind (free, small: size-class blocks, large: whole-chunk runs, quarantine: runs of "
     "dead nodes held back), pool-wide"},
    {"cxlkv_alloc_used_bytes", "gauge", "Bytes of allocator chunks not free (small + large + quarantine), pool-wide"},
    {"cxlkv_alloc_owned_chunks", "gauge", "Size-class chunks the node owns (its node heap), per node"},
    {"cxlkv_alloc_remote_frees_total", "counter",
     "Blocks of the node's chunks freed by other nodes (posted to its inbox), per node"},
    {"cxlkv_alloc_remote_frees_pending", "gauge",
     "Remote frees posted to the node and not yet drained (or drained into chunks not yet back in the pool), per node"},
    {"cxlkv_alloc_quarantine_releases_total", "counter", "Quarantined runs released back to the allocator, pool-wide"},
    {"cxlkv_kv_cached_blocks", "gauge", "Blocks the index names, by tier (mem: pool memory, ssd: SSD tier), pool-wide"},
    {"cxlkv_kv_cached_bytes", "gauge", "Payload bytes of the blocks the index names, by tier, pool-wide"},
    {"cxlkv_kv_capacity_blocks", "gauge", "Pool-wide memory-tier bound in blocks (0: bounded by index slots only)"},
    {"cxlkv_kv_capacity_bytes", "gauge", "Pool-wide memory-tier bound in bytes (0: bounded by the allocator only)"},
    {"cxlkv_kv_index_slots", "gauge", "Slots of the prefix index (the most blocks it can name), pool-wide"},
    {"cxlkv_kv_pool_evictions_total", "counter", "Blocks evicted from pool memory, pool-wide (sum over the index stripes)"},
    {"cxlkv_kv_pool_reclaims_total", "counter", "Reservations of dead writers reclaimed, pool-wide"},
};
const MetricDesc kManager[CXLKV_METRIC_MANAGER_COUNT] = {
    {"cxlkv_lock_manager_rounds_total", "counter", "Rounds of this lock manager (doorbells, releases, grants)"},
    {"cxlkv_lock_manager_grants_total", "counter", "Global lock grants made by this lock manager"},
    {"cxlkv_lock_manager_releases_total", "counter", "Global lock releases this lock manager saw"},
    {"cxlkv_lock_manager_revokes_total", "counter", "Sticky grants this lock manager took back for a waiting node"},
    {"cxlkv_lock_manager_dead_holders_total", "counter", "Locks this lock manager took from a dead holder"},
    {"cxlkv_lock_manager_dead_waiters_total", "counter", "Requests of dead waiters this lock manager skipped"},
    {"cxlkv_lock_manager_sleeps_total", "counter", "Idle sleeps of this lock manager's polling loop"},
};
const MetricDesc kBadState{"cxlkv_unknown", "gauge", "?"};

void family(std::string& out, int which, double v) {
  append_family_header(out, kState[which]);
  appendf(out, "%s %.17g\n", kState[which].name, v);
}

template <typename F>
void per_node(std::string& out, int which, const std::vector<uint32_t>& nodes, F value) {
  append_family_header(out, kState[which]);
  for (uint32_t n : nodes) appendf(out, "%s{node=\"%u\"} %.17g\n", kState[which].name, n, double(value(n)));
}

// A fresh copy (rule 4) of n lines starting at p, in pieces: one
// invalidation sweep and one fence per piece instead of a fence per line.
std::vector<std::byte> fresh_lines(MemoryDomain& d, const std::byte* p, uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  constexpr uint64_t kPiece = 1ull << 20;
  for (uint64_t o = 0; o < bytes; o += kPiece) {
    uint64_t n = std::min<uint64_t>(kPiece, bytes - o);
    d.invalidate(p + o, n);  // rule 4
    d.fence();
    d.load(out.data() + o, p + o, n);
  }
  return out;
}

// Whether [off, off + n * line) lies inside a carve of `size` bytes (overflow-safe).
bool inside(uint64_t off, uint64_t n, uint64_t line, uint64_t size) {
  return off <= size && (line == 0 || n <= (size - off) / line);
}

void control_families(std::string& out, Region& r) {
  auto c = r.carve(CXLKV_CARVE_CONTROL);
  if (!c) return;
  MemoryDomain& d = r.domain();
  const std::byte* base = r.at(c->offset);
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_ctrl_header*>(base));  // rule 4
  if (h.magic != CXLKV_CTRL_MAGIC || h.max_nodes == 0 || h.max_nodes > CXLKV_MAX_NODES ||
      h.max_locks > CXLKV_MAX_LOCKS)
    return;
  const uint32_t N = h.max_nodes, L = h.max_locks;
  if (!inside(h.node_table_off, N, sizeof(cxlkv_node_entry), c->size) ||
      !inside(h.doorbell_off, N, sizeof(cxlkv_doorbell), c->size) ||
      !inside(h.grant_table_off, L, sizeof(cxlkv_lock_grant), c->size) ||
      !inside(h.lock_table_off, uint64_t(L) * N, sizeof(cxlkv_lock_slot), c->size) ||
      !inside(h.lease_off, 1, sizeof(cxlkv_lease), c->size))
    return;
  auto nt = fresh_lines(d, base + h.node_table_off, uint64_t(N) * sizeof(cxlkv_node_entry));
  auto db = fresh_lines(d, base + h.doorbell_off, uint64_t(N) * sizeof(cxlkv_doorbell));
  auto gr = fresh_lines(d, base + h.grant_table_off, uint64_t(L) * sizeof(cxlkv_lock_grant));
  auto sl = fresh_lines(d, base + h.lock_table_off, uint64_t(L) * N * sizeof(cxlkv_lock_slot));
  auto lease = d.read_fresh(reinterpret_cast<const cxlkv_lease*>(base + h.lease_off));  // rule 4
  auto node = [&](uint32_t n) { return reinterpret_cast<const cxlkv_node_entry*>(nt.data())[n]; };
  auto grant = [&](uint32_t l) { return reinterpret_cast<const cxlkv_lock_grant*>(gr.data())[l]; };
  auto slot = [&](uint32_t l, uint32_t n) {
    return reinterpret_cast<const cxlkv_lock_slot*>(sl.data())[uint64_t(l) * N + n];
  };
  // Nodes listed: every node that ever attached (a non-zero incarnation).
  std::vector<uint32_t> nodes;
  for (uint32_t n = 0; n < N; n++)
    if (node(n).incarnation != 0 || node(n).state != CXLKV_NODE_ABSENT) nodes.push_back(n);
  std::vector<uint64_t> waiting(N), held(N);
  uint64_t grants = 0;
  for (uint32_t l = 0; l < L; l++) {
    const cxlkv_lock_grant g = grant(l);
    grants += g.grants;
    for (uint32_t n : nodes) {
      const uint64_t req = slot(l, n).request;
      const uint64_t st = req & CXLKV_SLOT_STATE_MASK, ticket = req >> CXLKV_SLOT_TICKET_SHIFT;
      const bool granted = g.node == n && g.ticket == ticket && ticket != 0;
      if (st == CXLKV_SLOT_WAITING && !granted) waiting[n]++;
      if (granted && (st == CXLKV_SLOT_WAITING || st == CXLKV_SLOT_STICKY)) held[n]++;
    }
  }
  per_node(out, CXLKV_METRIC_NODE_UP, nodes, [&](uint32_t n) { return node(n).state == CXLKV_NODE_ACTIVE ? 1 : 0; });
  append_family_header(out, kState[CXLKV_METRIC_NODE_HEARTBEAT]);
  for (uint32_t n : nodes) {
    const cxlkv_node_entry e = node(n);
    if (e.heartbeat_ms == 0 || e.heartbeat_ns == 0) continue;  // no heartbeat thread
    appendf(out, "%s{node=\"%u\"} %.3f\n", kState[CXLKV_METRIC_NODE_HEARTBEAT].name, n,
            double(e.heartbeat_ns) * 1e-9);
  }
  per_node(out, CXLKV_METRIC_LOCK_WAITS, nodes,
           [&](uint32_t n) { return reinterpret_cast<const cxlkv_doorbell*>(db.data())[n].seq; });
  per_node(out, CXLKV_METRIC_LOCK_WAITING, nodes, [&](uint32_t n) { return waiting[n]; });
  per_node(out, CXLKV_METRIC_LOCK_HELD, nodes, [&](uint32_t n) { return held[n]; });
  family(out, CXLKV_METRIC_LOCK_GRANTS, double(grants));
  family(out, CXLKV_METRIC_MANAGER_EPOCH, double(lease.epoch));
}

void alloc_families(std::string& out, Region& r) {
  auto c = r.carve(CXLKV_CARVE_ALLOC);
  if (!c) return;
  MemoryDomain& d = r.domain();
  const std::byte* base = r.at(c->offset);
  if (c->size < sizeof(cxlkv_alloc_header)) return;
  cxlkv_alloc_header h;
  d.invalidate(base, sizeof h);  // rule 4
  d.fence();
  d.load(&h, base, sizeof h);
  if (h.magic != CXLKV_ALLOC_MAGIC || h.max_nodes == 0 || h.max_nodes > CXLKV_MAX_NODES) return;
  if (!inside(h.chunk_table_off, h.nchunks, sizeof(cxlkv_chunk_desc), c->size) ||
      !inside(h.inbox_off, h.max_nodes, sizeof(cxlkv_remote_inbox), c->size) ||
      !inside(h.state_off, 1, sizeof(cxlkv_alloc_state), c->size))
    return;
  auto table = fresh_lines(d, base + h.chunk_table_off, h.nchunks * sizeof(cxlkv_chunk_desc));
  auto inbox = fresh_lines(d, base + h.inbox_off, uint64_t(h.max_nodes) * sizeof(cxlkv_remote_inbox));
  auto st = d.read_fresh(reinterpret_cast<const cxlkv_alloc_state*>(base + h.state_off));  // rule 4
  uint64_t kinds[4] = {0, 0, 0, 0};  // free, small, large, quarantine
  std::vector<uint64_t> owned(h.max_nodes);
  const auto* desc = reinterpret_cast<const cxlkv_chunk_desc*>(table.data());
  for (uint64_t i = 0; i < h.nchunks; i++) {
    switch (desc[i].kind) {
      case CXLKV_CHUNK_FREE: kinds[0]++; break;
      case CXLKV_CHUNK_SMALL:
        kinds[1]++;
        if (desc[i].owner < h.max_nodes) owned[desc[i].owner]++;
        break;
      case CXLKV_CHUNK_QUARANTINE:  // the head names the run; its tails read LARGE_TAIL
        kinds[3] += std::min<uint64_t>(std::max<uint32_t>(1, desc[i].run), h.nchunks - i);
        break;
      default: break;
    }
  }
  // Large: every other chunk (heads and tails of runs in use).
  kinds[2] = h.nchunks - std::min<uint64_t>(h.nchunks, kinds[0] + kinds[1] + kinds[3]);
  std::vector<uint32_t> nodes;
  for (uint32_t n = 0; n < h.max_nodes; n++) {
    const auto& in = reinterpret_cast<const cxlkv_remote_inbox*>(inbox.data())[n];
    if (owned[n] || in.posted || in.pending) nodes.push_back(n);
  }
  family(out, CXLKV_METRIC_ALLOC_CAPACITY, double(h.nchunks) * double(h.chunk_size));
  family(out, CXLKV_METRIC_ALLOC_CHUNK_SIZE, double(h.chunk_size));
  append_family_header(out, kState[CXLKV_METRIC_ALLOC_CHUNKS]);
  const char* kind_name[4] = {"free", "small", "large", "quarantine"};
  for (int k = 0; k < 4; k++)
    appendf(out, "%s{kind=\"%s\"} %llu\n", kState[CXLKV_METRIC_ALLOC_CHUNKS].name, kind_name[k],
            (unsigned long long)kinds[k]);
  family(out, CXLKV_METRIC_ALLOC_USED, double(h.nchunks - kinds[0]) * double(h.chunk_size));
  per_node(out, CXLKV_METRIC_ALLOC_OWNED, nodes, [&](uint32_t n) { return owned[n]; });
  per_node(out, CXLKV_METRIC_ALLOC_REMOTE_FREES, nodes,
           [&](uint32_t n) { return reinterpret_cast<const cxlkv_remote_inbox*>(inbox.data())[n].posted; });
  per_node(out, CXLKV_METRIC_ALLOC_REMOTE_PENDING, nodes,
           [&](uint32_t n) { return reinterpret_cast<const cxlkv_remote_inbox*>(inbox.data())[n].pending; });
  family(out, CXLKV_METRIC_ALLOC_QUARANTINE_RELEASES, double(st.releases));
}

void index_families(std::string& out, Region& r) {
  auto c = r.carve(CXLKV_CARVE_INDEX);
  if (!c || c->size < 128) return;
  MemoryDomain& d = r.domain();
  const std::byte* base = r.at(c->offset);
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(base));         // rule 4
  auto cfg = d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(base + 64));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC) return;
  if (!inside(h.stripe_off, h.nstripes, sizeof(cxlkv_index_stripe), c->size) ||
      !inside(h.entry_off, h.nslots, sizeof(cxlkv_index_entry), c->size))
    return;
  auto stripes = fresh_lines(d, base + h.stripe_off, uint64_t(h.nstripes) * sizeof(cxlkv_index_stripe));
  uint64_t evictions = 0, reclaims = 0;
  for (uint32_t s = 0; s < h.nstripes; s++) {
    const auto& st = reinterpret_cast<const cxlkv_index_stripe*>(stripes.data())[s];
    evictions += st.evictions;
    reclaims += st.reclaims;
  }
  // Blocks per tier: one sweep over the entries (lock-free; an entry torn
  // by a concurrent writer fails its check and is skipped).
  uint64_t blocks[2] = {0, 0}, bytes[2] = {0, 0};
  constexpr uint64_t kPiece = 16384;  // entries per fresh copy (1 MiB)
  for (uint64_t lo = 0; lo < h.nslots; lo += kPiece) {
    const uint64_t n = std::min<uint64_t>(kPiece, h.nslots - lo);
    auto e = fresh_lines(d, base + h.entry_off + lo * sizeof(cxlkv_index_entry), n * sizeof(cxlkv_index_entry));
    for (uint64_t i = 0; i < n; i++) {
      const auto* en = reinterpret_cast<const cxlkv_index_entry*>(e.data()) + i;
      if (en->state != CXLKV_ENTRY_READY && en->state != CXLKV_ENTRY_WRITING) continue;
      if (en->check != cxlkv_index_entry_check(en) || en->loc_tier > CXLKV_TIER_SSD) continue;
      blocks[en->loc_tier]++;
      bytes[en->loc_tier] += en->loc_len;
    }
  }
  const char* tier[2] = {"mem", "ssd"};
  append_family_header(out, kState[CXLKV_METRIC_KV_CACHED_BLOCKS]);
  for (int t = 0; t < 2; t++)
    appendf(out, "%s{tier=\"%s\"} %llu\n", kState[CXLKV_METRIC_KV_CACHED_BLOCKS].name, tier[t],
            (unsigned long long)blocks[t]);
  append_family_header(out, kState[CXLKV_METRIC_KV_CACHED_BYTES]);
  for (int t = 0; t < 2; t++)
    appendf(out, "%s{tier=\"%s\"} %llu\n", kState[CXLKV_METRIC_KV_CACHED_BYTES].name, tier[t],
            (unsigned long long)bytes[t]);
  family(out, CXLKV_METRIC_KV_CAPACITY_BLOCKS, double(cfg.max_blocks));
  family(out, CXLKV_METRIC_KV_CAPACITY_BYTES, double(cfg.max_bytes));
  family(out, CXLKV_METRIC_KV_INDEX_SLOTS, double(h.nslots));
  family(out, CXLKV_METRIC_KV_POOL_EVICTIONS, double(evictions));
  family(out, CXLKV_METRIC_KV_POOL_RECLAIMS, double(reclaims));
}

}  // namespace

const MetricDesc& state_metric(int which) {
  return which >= 0 && which < CXLKV_METRIC_STATE_COUNT ? kState[which] : kBadState;
}
const MetricDesc& manager_metric(int which) {
  return which >= 0 && which < CXLKV_METRIC_MANAGER_COUNT ? kManager[which] : kBadState;
}

std::string prometheus_state_exposition(Region& r) {
  std::string out;
  control_families(out, r);
  alloc_families(out, r);
  index_families(out, r);
  return out;
}

std::string prometheus_region_exposition(Region& r) {
  std::string out;
  if (auto c = r.carve(CXLKV_CARVE_INDEX)) out = prometheus_pool_exposition(r.domain(), r.at(c->offset), c->size);
  return out + prometheus_state_exposition(r) + prometheus_pnm_exposition(r) + prometheus_rpc_exposition(r);
}

std::string prometheus_manager_exposition(const LockManagerStats& s) {
  const uint64_t v[CXLKV_METRIC_MANAGER_COUNT] = {s.rounds,       s.grants,       s.releases, s.revokes,
                                                  s.dead_holders, s.dead_waiters, s.sleeps};
  std::string out;
  for (int i = 0; i < CXLKV_METRIC_MANAGER_COUNT; i++) {
    append_family_header(out, kManager[i]);
    appendf(out, "%s %llu\n", kManager[i].name, (unsigned long long)v[i]);
  }
  return out;
}

}  // namespace cxlkv
