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

}  // namespace cxlkv
