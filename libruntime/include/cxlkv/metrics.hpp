// SPDX-License-Identifier: MIT
// The one definition of cxlkv's Prometheus metrics: names (with units:
// _seconds, _bytes, _total), help texts, types, and the exposition of every
// node's KV counters and latency histograms.  `cxlkvctl stats --prometheus`
// prints it, the C call cxlkv_stats_prometheus() returns it (the Python
// package's Pool.prometheus()), so operators see one set of names.
#pragma once

#include <string>
#include <vector>

#include "cxlkv/kv.hpp"

namespace cxlkv {

struct MetricDesc {
  const char* name;  // full Prometheus name
  const char* type;  // "counter" or "histogram"
  const char* help;
};

// Counter CXLKV_CTR_* c as a Prometheus counter.
const MetricDesc& counter_metric(int c);
// Latency histogram CXLKV_LAT_* l as a Prometheus histogram in seconds.
const MetricDesc& latency_metric(int l);

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

}  // namespace cxlkv
