// SPDX-License-Identifier: MIT
// The pnm part of the Prometheus definition (cxlkv/metrics.hpp): per writer
// partition of the "pnm" carve, what its writer process built (digests) and
// what its near-memory engines did (select / attention steps, bytes read
// near memory, bytes over the link).  Read fresh (rule 4) from the
// partitions' stats lines (cxlkv/format/pnm_format.h); nothing is written.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/metrics.hpp"
#include "cxlkv/region.hpp"
#include "pnm/pnm_internal.hpp"
#include "uapi/cxlkv_pool.h"
#include "cxlkv/format/pnm_format.h"
#include "util/prom_text.hpp"

namespace cxlkv {
namespace {

// Indexed by enum cxlkv_pnm_counter (cxlkv/format/pnm_format.h).
const MetricDesc kPnmCounters[CXLKV_PNM_CTR_COUNT] = {
    {"cxlkv_pnm_digest_builds_total", "counter",
     "Appends to long contexts that built and published page digests, per pnm partition"},
    {"cxlkv_pnm_gpu_digest_builds_total", "counter",
     "Digest builds whose digests the GPU kernel computed (part of cxlkv_pnm_digest_builds_total), per pnm partition"},
    {"cxlkv_pnm_appended_tokens_total", "counter", "Tokens appended to long contexts, per pnm partition"},
    {"cxlkv_pnm_digest_written_bytes_total", "counter", "Page digest bytes written to the pool, per pnm partition"},
    {"cxlkv_pnm_select_steps_total", "counter",
     "Decode steps that scored page digests and selected the top pages (all layers and heads), per pnm partition"},
    {"cxlkv_pnm_selected_pages_total", "counter",
     "Pages selected by those steps, summed over (layer, KV head), per pnm partition"},
    {"cxlkv_pnm_attention_steps_total", "counter",
     "Decode steps that computed near-memory attention (output + log-sum-exp), per pnm partition"},
    {"cxlkv_pnm_step_errors_total", "counter", "Near-memory steps that failed, per pnm partition"},
    {"cxlkv_pnm_digest_read_bytes_total", "counter",
     "Page digest bytes the near-memory engines read from the pool, per pnm partition"},
    {"cxlkv_pnm_kv_read_bytes_total", "counter",
     "K and V bytes the near-memory engines read from the pool, per pnm partition"},
    {"cxlkv_pnm_link_bytes_total", "counter",
     "Bytes that crossed the link to the GPU for near-memory attention (queries in, output and log-sum-exp out), "
     "per pnm partition"},
    {"cxlkv_pnm_link_selected_recall_bytes_total", "counter",
     "Bytes that would have crossed the link recalling the selected pages' K and V instead, per pnm partition"},
    {"cxlkv_pnm_link_full_recall_bytes_total", "counter",
     "Bytes that would have crossed the link recalling every page's K and V instead, per pnm partition"},
    {"cxlkv_pnm_hybrid_steps_total", "counter", "Hybrid steady-token decode steps, per pnm partition"},
    {"cxlkv_pnm_hybrid_recall_bytes_total", "counter",
     "Bytes recalled pool -> GPU by hybrid steady-token steps, per pnm partition"},
};
// Indexed by enum cxlkv_pnm_latency.
const MetricDesc kPnmLatencies[CXLKV_PNM_LAT_COUNT] = {
    {"cxlkv_pnm_digest_build_seconds", "histogram",
     "Latency of one append to a long context (pages, digests, publish), per pnm partition"},
    {"cxlkv_pnm_select_seconds", "histogram",
     "Latency of the score + top-K selection of one decode step (all layers and heads), per pnm partition"},
    {"cxlkv_pnm_attention_seconds", "histogram",
     "Latency of the near-memory attention of one decode step (all layers and heads), per pnm partition"},
};
const MetricDesc kBadPnm{"cxlkv_unknown", "counter", "?"};

struct PartStats {
  uint32_t part;
  cxlkv_pnm_part_stats s;
};

// Every partition's stats lines that a writer has stored (updated_ms != 0).
std::vector<PartStats> read_parts(Region& r) {
  std::vector<PartStats> out;
  auto c = r.carve(CXLKV_CARVE_PNM);
  if (!c || c->size < sizeof(cxlkv_pnm_header)) return out;
  MemoryDomain& d = r.domain();
  auto h = d.read_fresh(reinterpret_cast<const cxlkv_pnm_header*>(r.at(c->offset)));  // rule 4
  if (h.magic != CXLKV_PNM_MAGIC || h.checksum != cxlkv_pnm_header_checksum(&h) || h.stats_off == 0 ||
      h.stats_off % 64 || h.nparts == 0 || h.stats_off > c->size ||
      h.nparts > (c->size - h.stats_off) / sizeof(cxlkv_pnm_part_stats))
    return out;
  for (uint32_t p = 0; p < h.nparts; p++) {
    const std::byte* src = r.at(c->offset + h.stats_off + uint64_t(p) * sizeof(cxlkv_pnm_part_stats));
    PartStats ps{p, {}};
    if (!pnm::testing::faults().skip_reader_invalidate) {
      d.invalidate(src, sizeof ps.s);  // rule 4: the partition's writer stores these lines
      d.fence();
    }
    d.load(&ps.s, src, sizeof ps.s);
    if (ps.s.updated_ms) out.push_back(ps);
  }
  return out;
}

}  // namespace

const MetricDesc& pnm_counter_metric(int c) { return c >= 0 && c < int(CXLKV_PNM_CTR_COUNT) ? kPnmCounters[c] : kBadPnm; }
const MetricDesc& pnm_latency_metric(int l) {
  return l >= 0 && l < int(CXLKV_PNM_LAT_COUNT) ? kPnmLatencies[l] : kBadPnm;
}

std::string prometheus_pnm_exposition(Region& r) {
  std::string out;
  if (!r.carve(CXLKV_CARVE_PNM)) return out;
  const std::vector<PartStats> parts = read_parts(r);
  for (int c = 0; c < int(CXLKV_PNM_CTR_COUNT); c++) {
    const MetricDesc& m = kPnmCounters[c];
    append_family_header(out, m);
    for (const auto& p : parts)
      appendf(out, "%s{partition=\"%u\"} %llu\n", m.name, p.part, (unsigned long long)p.s.counters[c]);
  }
  // Bucket b counts [2^(b/2), 2^((b+1)/2)) ns; Prometheus buckets are
  // cumulative at le = 2^k ns (1 us .. 4.3 s), like the KV histograms.
  for (int l = 0; l < int(CXLKV_PNM_LAT_COUNT); l++) {
    const MetricDesc& m = kPnmLatencies[l];
    append_family_header(out, m);
    for (const auto& p : parts)
      append_histogram(out, m, "partition", p.part, p.s.latency[l], CXLKV_PNM_LAT_BUCKETS);
  }
  return out;
}

}  // namespace cxlkv
