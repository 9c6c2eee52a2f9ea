// SPDX-License-Identifier: MIT
// The one definition of cxlkv's Prometheus metrics: names (with units:
// _seconds, _bytes, _total), help texts, types, and the exposition of every
// node's KV counters and latency histograms.  `cxlkvctl stats --prometheus`
// prints it, the C call cxlkv_stats_prometheus() returns it (the Python
// package's Pool.prometheus()), so operators see one set of names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cxlkv/kv.hpp"

namespace cxlkv {

class Region;
struct LockManagerStats;

struct MetricDesc {
  const char* name;  // full Prometheus name
  const char* type;  // "counter", "gauge" or "histogram"
  const char* help;
};

// Counter CXLKV_CTR_* c as a Prometheus counter.
const MetricDesc& counter_metric(int c);
// Latency histogram CXLKV_LAT_* l as a Prometheus histogram in seconds.
const MetricDesc& latency_metric(int l);
// The node's SSD tier counter CXLKV_SSD_* s (cxlkv/format/index_format.h) as a Prometheus counter.
const MetricDesc& ssd_metric(int s);
// The node's remote tier counter CXLKV_REMOTE_* r (docs/remote.md "Counters") as a
// Prometheus counter, cxlkv_remote_<name>_total; its <name> ("hit_blocks",
// ...: cxlkvctl stats, cxlkv_kv_remote_count()), empty for no counter; the
// counter of a name, or -1.
const MetricDesc& remote_metric(int r);
std::string_view remote_counter_name(int r);
int remote_counter_index(std::string_view name);

// Prometheus text exposition (format 0.0.4) of every node's statistics,
// labelled node="N"; latency histograms have one bucket per octave
// (le = 2^k ns, 1 us .. 4.3 s) and an estimated _sum (bucket midpoints).
std::string prometheus_exposition(const std::vector<NodeKvStats>& nodes);

// Pool-wide handoff-lease ends, summed over the index carve's stripe
// counters (cxlkv_index_stripe.lease_expiries / lease_dead; lock-free fresh
// reads, rule 4).  Zeros when the carve is not a formatted index.
struct PoolLeaseStats {
  uint64_t expiries = 0;  // leases ended by their ttl or their consumer node's death
  uint64_t dead = 0;      // of which by the consumer node's death
};
PoolLeaseStats read_pool_lease_stats(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes);
// CXLKV_METRIC_LEASE_* as a Prometheus counter (pool-wide: no node label).
enum { CXLKV_METRIC_LEASE_EXPIRIES = 0, CXLKV_METRIC_LEASE_DEAD = 1, CXLKV_METRIC_LEASE_COUNT = 2 };
const MetricDesc& lease_metric(int which);
// The pool's whole exposition, what `cxlkvctl stats --prometheus` prints and
// cxlkv_stats_prometheus() returns: every node's counters and histograms
// (prometheus_exposition), then the pool-wide lease counters.
std::string prometheus_pool_exposition(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes);

// ---- Pool state (libruntime/src/capi/metrics_region.cpp) ----------------------
// Families read from the control, alloc and index carves (fresh reads, rule
// 4; nothing is written): nodes, global locks, the chunk allocator, KV blocks
// per tier and the pool-wide bounds.  Per-node families carry node="N".
enum {
  CXLKV_METRIC_NODE_UP = 0,               // cxlkv_node_up{node}
  CXLKV_METRIC_NODE_HEARTBEAT,            // cxlkv_node_heartbeat_timestamp_seconds{node}
  CXLKV_METRIC_LOCK_WAITS,                // cxlkv_lock_waits_total{node}
  CXLKV_METRIC_LOCK_WAITING,              // cxlkv_lock_waiting{node}
  CXLKV_METRIC_LOCK_HELD,                 // cxlkv_lock_held{node}
  CXLKV_METRIC_LOCK_GRANTS,               // cxlkv_lock_grants_total
  CXLKV_METRIC_MANAGER_EPOCH,             // cxlkv_lock_manager_epoch
  CXLKV_METRIC_ALLOC_CAPACITY,            // cxlkv_alloc_capacity_bytes
  CXLKV_METRIC_ALLOC_CHUNK_SIZE,          // cxlkv_alloc_chunk_size_bytes
  CXLKV_METRIC_ALLOC_CHUNKS,              // cxlkv_alloc_chunks{kind}
  CXLKV_METRIC_ALLOC_USED,                // cxlkv_alloc_used_bytes
  CXLKV_METRIC_ALLOC_OWNED,               // cxlkv_alloc_owned_chunks{node}
  CXLKV_METRIC_ALLOC_REMOTE_FREES,        // cxlkv_alloc_remote_frees_total{node}
  CXLKV_METRIC_ALLOC_REMOTE_PENDING,      // cxlkv_alloc_remote_frees_pending{node}
  CXLKV_METRIC_ALLOC_QUARANTINE_RELEASES, // cxlkv_alloc_quarantine_releases_total
  CXLKV_METRIC_KV_CACHED_BLOCKS,          // cxlkv_kv_cached_blocks{tier="mem"|"ssd"}
  CXLKV_METRIC_KV_CACHED_BYTES,           // cxlkv_kv_cached_bytes{tier}
  CXLKV_METRIC_KV_CAPACITY_BLOCKS,        // cxlkv_kv_capacity_blocks
  CXLKV_METRIC_KV_CAPACITY_BYTES,         // cxlkv_kv_capacity_bytes
  CXLKV_METRIC_KV_INDEX_SLOTS,            // cxlkv_kv_index_slots
  CXLKV_METRIC_KV_POOL_EVICTIONS,         // cxlkv_kv_pool_evictions_total
  CXLKV_METRIC_KV_POOL_RECLAIMS,          // cxlkv_kv_pool_reclaims_total
  CXLKV_METRIC_STATE_COUNT
};
const MetricDesc& state_metric(int which);
std::string prometheus_state_exposition(Region& r);
// Everything about a pool: prometheus_pool_exposition (node KV counters,
// latency histograms, lease ends), prometheus_state_exposition, then
// prometheus_pnm_exposition, prometheus_rpc_exposition.  What
// cxlkvd's metrics endpoint, `cxlkvctl stats --prometheus` and
// cxlkv_stats_prometheus() return.
std::string prometheus_region_exposition(Region& r);

// ---- Near-memory long contexts (libruntime/src/capi/metrics_pnm.cpp) ----------
// The pnm family: per writer partition of the "pnm" carve (label
// partition="P"), read fresh from its stats lines (cxlkv/format/pnm_format.h): digest
// builds, select and attention steps of the near-memory engines, bytes read
// near memory against bytes that crossed (or would have crossed) the link.
// Counter CXLKV_PNM_CTR_* c as a Prometheus counter; histogram
// CXLKV_PNM_LAT_* l in seconds.  Nothing when the pool has no pnm carve.
const MetricDesc& pnm_counter_metric(int c);
const MetricDesc& pnm_latency_metric(int l);
std::string prometheus_pnm_exposition(Region& r);

// ---- Shared-memory RPC (libruntime/src/capi/metrics_rpc.cpp) -------------------
// Per RPC carve (label carve="rpc", "rpc.index" for the index service, ...),
// read fresh from its server and client lines.  Nothing when the pool has
// no RPC carve (or none ever served).
enum {
  CXLKV_METRIC_RPC_SERVER_RUNNING = 0,  // cxlkv_rpc_server_running{carve}
  CXLKV_METRIC_RPC_SERVER_EPOCH,        // cxlkv_rpc_server_epoch{carve}
  CXLKV_METRIC_RPC_RINGS,               // cxlkv_rpc_rings{carve}
  CXLKV_METRIC_RPC_RING_DEPTH,          // cxlkv_rpc_ring_depth{carve}
  CXLKV_METRIC_RPC_CLIENTS,             // cxlkv_rpc_clients{carve}
  CXLKV_METRIC_RPC_COUNT
};
const MetricDesc& rpc_metric(int which);
std::string prometheus_rpc_exposition(Region& r);

// The lock manager's own counters (one process: cxlkvd's endpoint adds them).
enum {
  CXLKV_METRIC_MANAGER_ROUNDS = 0,
  CXLKV_METRIC_MANAGER_GRANTS,
  CXLKV_METRIC_MANAGER_RELEASES,
  CXLKV_METRIC_MANAGER_REVOKES,
  CXLKV_METRIC_MANAGER_DEAD_HOLDERS,
  CXLKV_METRIC_MANAGER_DEAD_WAITERS,
  CXLKV_METRIC_MANAGER_SLEEPS,
  CXLKV_METRIC_MANAGER_COUNT
};
const MetricDesc& manager_metric(int which);
std::string prometheus_manager_exposition(const LockManagerStats& s);

}  // namespace cxlkv
