// SPDX-License-Identifier: MIT
// The main job, cxlkv-replay, as benchmarks (each beside its baseline):
//   replay.block_ops_per_s     default workload (2 MiB blocks, unbounded): blocks written + read per second
//                              (the run's own pool on 2 MiB pages when it can mount a private tmpfs)
//   replay.block_ops_per_s_small_pages  the same with the pool in /dev/shm on 4 KiB pages (--small-pages)
//   replay.page_kib            the page size the first run's pool was on (2048 or 4)
//   replay.hit_vs_lru_10pct    synthetic trace at a capacity of 10% of its distinct blocks: token hit
//                              ratio / the block-LRU reference's at the same capacity (docs/eviction.md "The replay's LRU reference")
//   replay.hit_vs_lru_25pct    the same at 25%
//   replay.hit_vs_lru_5pct / _50pct  the same at 5% and 50% (2 prefill + 2 decode workers)
//   replay.hit_vs_lru_min_2x2 / _4x4  the lowest of the four capacities with 2+2 / 4+4 workers
//   replay.decode_misses       decode pins that found a prompt block gone, summed over every
//                              bounded run of both configurations (must be 0)
// The trace is found by path (../shared/traces/synthetic_trace.jsonl beside the
// source tree, or CXLKV_TRACE); the trace metrics are skipped when it is absent.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <string>

#include "bench.hpp"

namespace {

std::string tool_dir() {
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return ".";
  self[len] = 0;
  std::string dir(self);
  return dir.substr(0, dir.rfind('/'));
}

// `cxlkv-replay --json --quiet ARGS`: its stdout, empty on failure.
std::string replay(const std::string& args) {
  std::string cmd = tool_dir() + "/cxlkv-replay --json --quiet " + args;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "";
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, f)) out.append(buf, k);
  int st = pclose(f);
  if (st != 0) std::fprintf(stderr, "bench replay: '%s' failed (status %d)\n", cmd.c_str(), st);
  return out;
}

// A top-level number of the replay's --json summary; NaN when absent.
double field(const std::string& json, const std::string& name) {
  size_t p = json.find("\"" + name + "\": ");
  if (p == std::string::npos) return std::nan("");
  return std::atof(json.c_str() + p + name.size() + 4);
}

// The synthetic trace: CXLKV_TRACE, else shared/traces/ in a parent of this source file's folder.
std::string find_trace() {
  if (const char* t = std::getenv("CXLKV_TRACE")) return access(t, R_OK) == 0 ? t : "";
  // This source file's folder (when the compiler named it absolutely) and the
  // running binary's folder (the build tree inside the repository).
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string from[2] = {__FILE__, n > 0 ? std::string(exe, size_t(n)) : std::string()};
  for (std::string d : from) {
    if (d.empty() || d[0] != '/') continue;
    for (size_t p; (p = d.rfind('/')) != std::string::npos && p > 0;) {
      d.resize(p);
      std::string cand = d + "/shared/traces/synthetic_trace.jsonl";
      if (access(cand.c_str(), R_OK) == 0) return cand;
    }
  }
  return "";
}

void bench_replay(bench::Results& res) {
  const std::string requests = "--requests " + std::to_string(std::max(50, int(300 * bench::scale())));
  std::string out = replay(requests);
  res.set("replay.block_ops_per_s", field(out, "block_ops_per_s"));
  res.set("replay.page_kib", field(out, "page_bytes") / 1024);
  res.set("replay.block_ops_per_s_small_pages", field(replay(requests + " --small-pages"), "block_ops_per_s"));

  std::string trace = find_trace();
  if (trace.empty()) {
    std::fprintf(stderr, "bench replay: synthetic trace not found (CXLKV_TRACE or ../shared/traces): "
                         "replay.hit_vs_lru_* skipped\n");
    return;
  }
  // 128 KiB blocks (1 layer, 1 KV head) so every capacity fits a small pool;
  // CXLKV_BENCH_SCALE < 1 replays only the first requests of the trace.
  std::string geo = "--trace " + trace + " --layers 1 --kv-heads 1 --head-size 64";
  if (bench::scale() < 1) geo += " --requests " + std::to_string(std::max(200, int(3993 * bench::scale())));
  // One --sweep run per worker configuration: 5%, 10%, 25%, 50% of the
  // distinct blocks (the run's own point is the first 10% one).
  double misses = 0;
  for (int workers : {2, 4}) {
    const std::string w = std::to_string(workers);
    std::string o = replay(geo + " --capacity-fraction 0.1 --sweep --prefill " + w + " --decode " + w);
    const size_t sw = o.find("\"sweep\": [");
    if (sw == std::string::npos) {
      std::fprintf(stderr, "bench replay: %s+%s workers: no sweep in the summary\n", w.c_str(), w.c_str());
      continue;
    }
    misses += field(o, "decode_misses");
    double worst = INFINITY;
    size_t at = sw;
    for (int pct : {5, 10, 25, 50}) {
      size_t p = o.find("\"hit_vs_lru\": ", at);
      if (p == std::string::npos) break;
      const double v = std::atof(o.c_str() + p + 14);
      const size_t m = o.find("\"decode_misses\": ", p);
      const double dm = m == std::string::npos ? std::nan("") : std::atof(o.c_str() + m + 17);
      misses += dm;
      worst = std::min(worst, v);
      if (workers == 2) res.set("replay.hit_vs_lru_" + std::to_string(pct) + "pct", v);
      std::fprintf(stderr, "bench replay: %s+%s workers, %d%% capacity: cxlkv / block-LRU %.3fx, decode misses %.0f\n",
                   w.c_str(), w.c_str(), pct, v, dm);
      at = p + 1;
    }
    res.set("replay.hit_vs_lru_min_" + w + "x" + w, worst);
  }
  res.set("replay.decode_misses", misses);
}

}  // namespace

CXLKV_BENCH({"replay", "the main job: block ops/s; hit ratio beside block-LRU on the synthetic trace", bench_replay});
