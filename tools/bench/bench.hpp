// SPDX-License-Identifier: MIT
// cxlkv-bench: benchmark programs register here with CXLKV_BENCH; main.cpp
// runs the selected ones and writes one flat JSON object (metric -> number)
// to --out.  Each benchmark records its own baseline in the same run.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace bench {

class Results {
 public:
  void set(const std::string& metric, double value) { m_[metric] = value; }
  const std::map<std::string, double>& all() const { return m_; }

 private:
  std::map<std::string, double> m_;
};

struct Benchmark {
  std::string name;  // group, e.g. "copy", "index", "kv", "ssd", "gpu"
  std::string help;
  void (*run)(Results&) = nullptr;
};

void register_bench(Benchmark b);

// Scale factor for iteration counts: CXLKV_BENCH_SCALE (default 1.0).
double scale();
// Pool URIs for benchmarks live under this shm prefix and are removed after.
std::string shm_name(const std::string& what);

// cxlkv-bench --report-svg RESULTS OUT: the picture of a results file
// (report_svg.cpp); 0 or 1 with a message.
int write_report_svg(const std::string& results, const std::string& out);

}  // namespace bench

#define CXLKV_BENCH_CONCAT2(a, b) a##b
#define CXLKV_BENCH_CONCAT(a, b) CXLKV_BENCH_CONCAT2(a, b)
#define CXLKV_BENCH(...)                                               \
  static const bool CXLKV_BENCH_CONCAT(cxlkv_bench_reg_, __LINE__) = \
      (::bench::register_bench(::bench::Benchmark __VA_ARGS__), true)
