// SPDX-License-Identifier: MIT
// cxlkv-bench --report-svg RESULTS.json OUT.svg (make bench writes
// build/bench/report.svg): each metric against its baseline of the same run
// and its target, one bar per row on a log scale (tools/common/svg_chart.hpp).
// The targets are defined here, once (docs/benchmarks.md quotes them).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "svg_chart.hpp"

namespace bench {
namespace {

// One row: `metric` against `baseline` of the same run.  The bar is the
// ratio oriented so that more is better (baseline / metric when lower is
// better); `ratio_key`, when the results have it, is that ratio measured
// directly (paired batch by batch, say) and wins over metric / baseline.
// Target: a ratio (kRatio), or an absolute bound on the metric (kAbs),
// drawn as the ratio it means against the same run's baseline (or, with no
// baseline, as metric against the bound itself).
enum TargetKind { kNone, kRatio, kAbs };
struct Row {
  const char* metric;
  const char* baseline;   // "" none
  const char* ratio_key;  // "" none
  bool lower_is_better;
  TargetKind kind;
  double target;
  const char* unit;
};

const Row kRows[] = {
    {"copy.ntstore_gbps", "copy.memcpy_gbps", "", false, kRatio, 0.8, "GB/s"},
    {"copy.ntstore_gbps", "copy.memcpy_clflush_gbps", "", false, kRatio, 1.5, "GB/s"},
    {"kv.publish_gbps", "kv.gather_write_gbps", "", false, kRatio, 0.85, "GB/s"},
    {"kv.fetch_gbps", "kv.scatter_read_gbps", "", false, kRatio, 0.85, "GB/s"},
    {"kv.batch64_publish_us_per_block", "kv.single_publish_us_per_block", "", true, kAbs, 1.5, "us"},
    {"kv.batch64_fetch_us_per_block", "kv.single_fetch_us_per_block", "", true, kAbs, 1.5, "us"},
    {"py.publish_gbps", "py.kv_capi_publish_gbps_interleaved", "py.publish_vs_kv_capi", false, kRatio, 0.9, "GB/s"},
    {"py.fetch_gbps", "py.kv_capi_fetch_gbps_interleaved", "py.fetch_vs_kv_capi", false, kRatio, 0.9, "GB/s"},
    {"lock.uncontended_ns_p50", "lock.pthread_ns_p50", "", true, kAbs, 500, "ns"},
    {"lock.handoff_ns_p99", "", "", true, kAbs, 50000, "ns"},
    {"lock.fairness_max_over_min", "", "", true, kAbs, 1.5, ""},
    {"replay.hit_vs_lru_5pct", "", "", false, kAbs, 1.0, "x LRU"},
    {"replay.hit_vs_lru_10pct", "", "", false, kAbs, 1.0, "x LRU"},
    {"replay.hit_vs_lru_25pct", "", "", false, kAbs, 1.0, "x LRU"},
    {"replay.hit_vs_lru_50pct", "", "", false, kAbs, 1.0, "x LRU"},
    {"replay.hit_vs_lru_min_4x4", "", "", false, kAbs, 1.0, "x LRU"},
    {"index.lookup_chain8192_us_p99", "index.lookup_linear_chain8192_us_p99", "", true, kRatio, 10, "us"},
    {"index.reserve_evict_us", "index.reserve_noevict_us", "", true, kNone, 0, "us"},
    {"alloc.mops", "alloc.malloc_mops", "", false, kNone, 0, "Mops"},
    {"ssd.uring_direct_read_gbps", "ssd.fio_read_gbps", "", false, kRatio, 0.9, "GB/s"},
    {"tier.aggregate_read_gbps", "tier.device_sum_gbps", "", false, kRatio, 0.85, "GB/s"},
    {"gpu.gather_gbps", "gpu.memcpy_bulk_gbps", "", false, kRatio, 0.85, "GB/s"},
    {"gpu.scatter_gbps", "gpu.memcpy_bulk_h2d_gbps", "", false, kRatio, 0.85, "GB/s"},
    // remote group (tools/bench/remote_bench.py, docs/remote.md): a 64-block
    // prefix from the other rack into this pool against a socket copy of the
    // same bytes over the same link; the local put with the tier on and off.
    {"remote.fill_b64.gbps", "remote.socket_b64.gbps", "remote.fill_vs_socket", false, kRatio, 0.8, "GB/s"},
    {"remote.publish_on_us", "remote.publish_off_us", "", true, kRatio, 0.9, "us"},
};

// The results file is one flat JSON object of metric name to number (or
// null), as main.cpp and py_bench.py write it.  A strict reader of exactly
// that: anything else is an error naming the byte offset.
bool parse_flat_json(const std::string& s, std::map<std::string, double>* out, std::string* err) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && std::strchr(" \t\r\n", s[i])) i++;
  };
  auto fail = [&](const std::string& what) {
    *err = what + " at byte " + std::to_string(i);
    return false;
  };
  ws();
  if (i >= s.size() || s[i] != '{') return fail("expected '{'");
  i++;
  ws();
  if (i < s.size() && s[i] == '}') return true;
  for (;;) {
    ws();
    if (i >= s.size() || s[i] != '"') return fail("expected a metric name");
    size_t e = s.find('"', i + 1);
    if (e == std::string::npos) return fail("unterminated name");
    std::string key = s.substr(i + 1, e - i - 1);
    if (key.find('\\') != std::string::npos) return fail("escapes in a metric name");
    i = e + 1;
    ws();
    if (i >= s.size() || s[i] != ':') return fail("expected ':'");
    i++;
    ws();
    if (s.compare(i, 4, "null") == 0) {
      (*out)[key] = NAN;
      i += 4;
    } else {
      const char* b = s.c_str() + i;
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(b, &end);
      if (end == b || errno == ERANGE) return fail("expected a number for " + key);
      (*out)[key] = v;
      i += size_t(end - b);
    }
    ws();
    if (i < s.size() && s[i] == ',') {
      i++;
      continue;
    }
    if (i < s.size() && s[i] == '}') {
      i++;
      ws();
      return i == s.size() ? true : fail("text after the object");
    }
    return fail("expected ',' or '}'");
  }
}

std::string fmt(double v, const char* unit) {
  char b[64];
  std::snprintf(b, sizeof b, "%.3g%s%s", v, unit[0] ? " " : "", unit);
  return b;
}

}  // namespace

int write_report_svg(const std::string& results, const std::string& out) {
  std::ifstream f(results);
  if (!f) {
    std::fprintf(stderr, "cxlkv-bench: --report-svg: cannot read %s: %s\n", results.c_str(), std::strerror(errno));
    return 1;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  std::map<std::string, double> r;
  std::string err;
  if (!parse_flat_json(ss.str(), &r, &err)) {
    std::fprintf(stderr, "cxlkv-bench: --report-svg: %s: %s\n", results.c_str(), err.c_str());
    return 1;
  }
  auto get = [&](const char* k) {
    auto it = r.find(k);
    return k[0] && it != r.end() ? it->second : NAN;
  };
  std::vector<cxlkv::svg::RatioRow> rows;
  size_t met = 0, targets = 0;
  for (const Row& w : kRows) {
    const double m = get(w.metric), b = get(w.baseline), direct = get(w.ratio_key);
    if (!std::isfinite(m)) continue;  // not measured in this run (no GPU, group not run)
    cxlkv::svg::RatioRow row;
    row.label = w.metric;
    const bool has_base = std::isfinite(b) && b > 0 && m > 0;
    if (std::isfinite(direct)) row.ratio = direct;
    else if (has_base) row.ratio = w.lower_is_better ? b / m : m / b;
    else if (w.kind == kAbs && m > 0) row.ratio = w.lower_is_better ? w.target / m : m / w.target;
    if (w.kind == kRatio) row.target = w.target;
    if (w.kind == kAbs) row.target = has_base && !std::isfinite(direct) ? (w.lower_is_better ? b / w.target : w.target / b) : 1.0;
    row.detail = fmt(m, w.unit);
    if (has_base) row.detail += std::string(" vs ") + w.baseline + " " + fmt(b, w.unit);
    else if (w.kind == kAbs) row.detail += std::string(" vs target ") + (w.lower_is_better ? "<= " : ">= ") + fmt(w.target, w.unit);
    if (w.kind == kAbs && has_base) row.detail += std::string("; target ") + (w.lower_is_better ? "<= " : ">= ") + fmt(w.target, w.unit);
    if (!std::isfinite(row.ratio)) continue;
    if (std::isfinite(row.target)) {
      targets++;
      met += row.ratio >= row.target * (1 - 1e-9);
    }
    rows.push_back(row);
  }
  if (rows.empty()) {
    std::fprintf(stderr, "cxlkv-bench: --report-svg: %s has none of the report's metrics\n", results.c_str());
    return 1;
  }
  const std::string sub = results + ": bar = metric vs its same-run baseline (more is better); " +
                          std::to_string(met) + " of " + std::to_string(targets) + " targets met";
  std::string text = cxlkv::svg::render("cxlkv benchmarks against their baselines and targets", sub, rows);
  if (!cxlkv::svg::Document::save_text(out, text, &err)) {
    std::fprintf(stderr, "cxlkv-bench: --report-svg: %s\n", err.c_str());
    return 1;
  }
  std::fprintf(stderr, "cxlkv-bench: wrote %s (%zu metrics, %zu of %zu targets met)\n", out.c_str(), rows.size(), met,
               targets);
  return 0;
}

}  // namespace bench
