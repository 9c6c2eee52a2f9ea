// SPDX-License-Identifier: MIT
// Prometheus names and exposition of the KV statistics (cxlkv/metrics.hpp).
#include "cxlkv/metrics.hpp"
#include "util/prom_text.hpp"

#include <cmath>
#include <cstdio>
#include <string_view>

namespace cxlkv {
namespace {

// Indexed by enum cxlkv_index_counter (cxlkv/format/index_format.h).
const MetricDesc kCounters[CXLKV_CTR_COUNT] = {
    {"cxlkv_kv_lookups_total", "counter", "Prefix lookups (chains queried)"},
    {"cxlkv_kv_hit_blocks_total", "counter", "Blocks found by lookups (hit blocks)"},
    {"cxlkv_kv_miss_blocks_total", "counter", "Blocks queried by lookups and not found"},
    {"cxlkv_kv_reserves_total", "counter", "Blocks reserved for writing"},
    {"cxlkv_kv_reserve_exists_total", "counter", "Reservations answered: already cached"},
    {"cxlkv_kv_publishes_total", "counter", "Blocks published"},
    {"cxlkv_kv_aborts_total", "counter", "Reservations aborted"},
    {"cxlkv_kv_fetches_total", "counter", "Blocks read"},
    {"cxlkv_kv_pins_total", "counter", "Blocks pinned"},
    {"cxlkv_kv_pin_misses_total", "counter", "Pins of blocks not cached"},
    {"cxlkv_kv_evictions_total", "counter", "Blocks evicted"},
    {"cxlkv_kv_reclaims_total", "counter", "Entries of dead writers reclaimed"},
    {"cxlkv_kv_store_bytes_total", "counter", "Payload bytes written into the pool"},
    {"cxlkv_kv_load_bytes_total", "counter", "Payload bytes read from the pool"},
    {"cxlkv_kv_nospc_total", "counter", "Operations refused for lack of space"},
    {"cxlkv_kv_errors_total", "counter", "Failed operations"},
};
const MetricDesc kLatencies[CXLKV_LAT_COUNT] = {
    {"cxlkv_kv_lookup_seconds", "histogram", "Latency of a prefix lookup"},
    {"cxlkv_kv_reserve_seconds", "histogram", "Latency of a block reserve"},
    {"cxlkv_kv_write_seconds", "histogram", "Latency of a block payload write"},
    {"cxlkv_kv_publish_seconds", "histogram", "Latency of a block publish (the index entry)"},
    {"cxlkv_kv_pin_seconds", "histogram", "Latency of a block pin"},
    {"cxlkv_kv_fetch_seconds", "histogram", "Latency of a block payload fetch"},
    {"cxlkv_kv_unpin_seconds", "histogram", "Latency of a block unpin"},
    {"cxlkv_kv_put_seconds", "histogram", "Latency of a whole publish (reserve + write + publish of a put_chain call)"},
    {"cxlkv_kv_get_seconds", "histogram", "Latency of a whole fetch (pin + fetch + unpin of a get_many call)"},
};
// Indexed by enum cxlkv_index_ssd_counter (cxlkv/format/index_format.h).
const MetricDesc kSsd[CXLKV_SSD_COUNT] = {
    {"cxlkv_ssd_demoted_blocks_total", "counter", "Blocks the node demoted from pool memory to its SSD tier"},
    {"cxlkv_ssd_demoted_bytes_total", "counter", "Payload bytes the node wrote to its SSD tier"},
    {"cxlkv_ssd_read_blocks_total", "counter", "Blocks the node read from its SSD tier (SSD hits)"},
    {"cxlkv_ssd_read_bytes_total", "counter", "Payload bytes the node read from its SSD tier"},
    {"cxlkv_ssd_read_failures_total", "counter",
     "SSD tier reads that failed or were refused by the block header or checksum (clean misses)"},
    {"cxlkv_ssd_full_total", "counter", "Demotions refused for lack of space on the node's SSD tier"},
};
// Indexed by enum cxlkv_index_remote_counter (cxlkv/format/index_format.h); docs/remote.md "Counters".
const MetricDesc kRemote[CXLKV_REMOTE_COUNT] = {
    {"cxlkv_remote_hit_blocks_total", "counter",
     "Blocks the node's remote tier fetched, checked and put into the pool (remote hits)"},
    {"cxlkv_remote_hit_bytes_total", "counter", "Payload bytes of the node's remote hits"},
    {"cxlkv_remote_miss_blocks_total", "counter", "Blocks the node asked of its remote tier that it did not hold"},
    {"cxlkv_remote_fetch_failures_total", "counter",
     "Remote fetches that failed: lookup-path calls that failed or ran late, blocks refused by their header"},
    {"cxlkv_remote_degraded_total", "counter",
     "Times the node's remote tier went local-only (its store unreachable or late)"},
    {"cxlkv_remote_pushed_blocks_total", "counter", "Published blocks the node put into its remote tier"},
    {"cxlkv_remote_pushed_bytes_total", "counter", "Payload bytes the node put into its remote tier"},
    {"cxlkv_remote_push_dropped_blocks_total", "counter",
     "Published blocks the node did not push (the sum of the four cxlkv_remote_push_*_blocks reasons)"},
    {"cxlkv_remote_push_evicted_blocks_total", "counter",
     "Published blocks not pushed: evicted from the pool before their push read them"},
    {"cxlkv_remote_push_store_full_blocks_total", "counter",
     "Published blocks not pushed: refused by a full store (after one retry)"},
    {"cxlkv_remote_push_queue_full_blocks_total", "counter", "Published blocks not pushed: the push queue was full"},
    {"cxlkv_remote_push_failed_blocks_total", "counter",
     "Published blocks not pushed: the tier degraded, a failed put or read, or closing"},
    {"cxlkv_remote_push_skipped_blocks_total", "counter",
     "Published blocks the push policy kept back at their publish (a choice, not a drop)"},
    {"cxlkv_remote_push_present_blocks_total", "counter",
     "Published blocks the remote store held already (not sent again)"},
    {"cxlkv_remote_timeouts_total", "counter", "Remote calls that ran past the tier's timeout"},
    {"cxlkv_remote_recovered_total", "counter", "Times the node's remote tier came back after being degraded"},
};
constexpr std::string_view kRemotePrefix = "cxlkv_remote_", kTotal = "_total";
const MetricDesc kBad{"cxlkv_unknown", "counter", "?"};

}  // namespace

const MetricDesc& counter_metric(int c) { return c >= 0 && c < int(CXLKV_CTR_COUNT) ? kCounters[c] : kBad; }
const MetricDesc& latency_metric(int l) { return l >= 0 && l < int(CXLKV_LAT_COUNT) ? kLatencies[l] : kBad; }
const MetricDesc& ssd_metric(int s) { return s >= 0 && s < int(CXLKV_SSD_COUNT) ? kSsd[s] : kBad; }
const MetricDesc& remote_metric(int r) { return r >= 0 && r < int(CXLKV_REMOTE_COUNT) ? kRemote[r] : kBad; }

std::string_view remote_counter_name(int r) {
  if (r < 0 || r >= int(CXLKV_REMOTE_COUNT)) return {};
  std::string_view n = kRemote[r].name;
  return n.substr(kRemotePrefix.size(), n.size() - kRemotePrefix.size() - kTotal.size());
}

int remote_counter_index(std::string_view name) {
  for (int r = 0; r < int(CXLKV_REMOTE_COUNT); r++)
    if (remote_counter_name(r) == name) return r;
  return -1;
}

std::string prometheus_exposition(const std::vector<NodeKvStats>& nodes) {
  std::string out;
  for (int c = 0; c < int(CXLKV_CTR_COUNT); c++) {
    const MetricDesc& m = kCounters[c];
    append_family_header(out, m);
    for (auto& n : nodes)
      appendf(out, "%s{node=\"%u\"} %llu\n", m.name, n.node, (unsigned long long)n.stats.counters[c]);
  }
  // Bucket b of the pool histograms counts [2^(b/2), 2^((b+1)/2)) ns
  // (cxlkv/format/index_format.h); Prometheus buckets are cumulative at le = 2^k ns.
  for (int l = 0; l < int(CXLKV_LAT_COUNT); l++) {
    const MetricDesc& m = kLatencies[l];
    append_family_header(out, m);
    for (auto& n : nodes) append_histogram(out, m, "node", n.node, n.stats.latency[l], CXLKV_LAT_BUCKETS);
  }
  for (int s = 0; s < int(CXLKV_SSD_COUNT); s++) {
    const MetricDesc& m = kSsd[s];
    append_family_header(out, m);
    for (auto& n : nodes) appendf(out, "%s{node=\"%u\"} %llu\n", m.name, n.node, (unsigned long long)n.ssd[s]);
  }
  for (int r = 0; r < int(CXLKV_REMOTE_COUNT); r++) {
    const MetricDesc& m = kRemote[r];
    append_family_header(out, m);
    for (auto& n : nodes) appendf(out, "%s{node=\"%u\"} %llu\n", m.name, n.node, (unsigned long long)n.remote[r]);
  }
  return out;
}

}  // namespace cxlkv
