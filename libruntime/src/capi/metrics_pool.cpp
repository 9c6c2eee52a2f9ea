// SPDX-License-Identifier: MIT
// The pool-wide part of the Prometheus definition (cxlkv/metrics.hpp): lease
// ends counted by the index per stripe, and the whole exposition shared by
// `cxlkvctl stats --prometheus` and cxlkv_stats_prometheus().
#include <algorithm>
#include <cstddef>
#include <cstdio>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/metrics.hpp"
#include "util/prom_text.hpp"
#include "cxlkv/format/index_format.h"

namespace cxlkv {
namespace {

const MetricDesc kLease[CXLKV_METRIC_LEASE_COUNT] = {
    {"cxlkv_kv_lease_expiries_total", "counter",
     "Handoff leases that ended before their consumer released them (ttl or consumer node death), pool-wide"},
    {"cxlkv_kv_lease_dead_consumer_total", "counter",
     "Handoff leases ended by their consumer node's death (part of cxlkv_kv_lease_expiries_total), pool-wide"},
};
const MetricDesc kBadLease{"cxlkv_unknown", "counter", "?"};

}  // namespace

const MetricDesc& lease_metric(int which) {
  return which >= 0 && which < CXLKV_METRIC_LEASE_COUNT ? kLease[which] : kBadLease;
}

PoolLeaseStats read_pool_lease_stats(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes) {
  PoolLeaseStats out;
  if (!index_carve || carve_bytes < sizeof(cxlkv_index_header)) return out;
  auto* base = static_cast<const std::byte*>(index_carve);
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(base));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC) return out;
  // Overflow-safe bounds of the stripe array within the carve.
  const uint64_t line = sizeof(cxlkv_index_stripe);
  if (h.stripe_off > carve_bytes || h.nstripes > (carve_bytes - h.stripe_off) / line) return out;
  for (uint32_t s = 0; s < h.nstripes; s++) {
    // rule 4: each stripe line read fresh (other nodes' lock holders write it)
    auto st = d.read_fresh(reinterpret_cast<const cxlkv_index_stripe*>(base + h.stripe_off + uint64_t(s) * line));
    out.expiries += st.lease_expiries;
    out.dead += st.lease_dead;
  }
  return out;
}

std::string prometheus_pool_exposition(MemoryDomain& d, const void* index_carve, uint64_t carve_bytes) {
  std::string out = prometheus_exposition(read_pool_stats(d, index_carve, carve_bytes));
  const PoolLeaseStats ls = read_pool_lease_stats(d, index_carve, carve_bytes);
  const uint64_t v[CXLKV_METRIC_LEASE_COUNT] = {ls.expiries, ls.dead};
  for (int i = 0; i < CXLKV_METRIC_LEASE_COUNT; i++) {
    const MetricDesc& m = kLease[i];
    append_family_header(out, m);
    appendf(out, "%s %llu\n", m.name, (unsigned long long)v[i]);
  }
  return out;
}

}  // namespace cxlkv
