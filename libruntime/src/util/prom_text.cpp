// SPDX-License-Identifier: MIT
#include "util/prom_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace cxlkv {

void appendf(std::string& s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) s.append(buf, std::min<size_t>(size_t(n), sizeof buf - 1));
}

void append_family_header(std::string& s, const MetricDesc& m) {
  appendf(s, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.type);
}

void append_histogram(std::string& s, const MetricDesc& m, const char* label, unsigned id, const uint32_t* h,
                      unsigned n) {
  uint64_t acc = 0, total = 0;
  double sum_s = 0;
  for (unsigned b = 0; b < n; b++) {
    total += h[b];
    sum_s += h[b] * std::sqrt(std::pow(2.0, b / 2.0) * std::pow(2.0, (b + 1) / 2.0)) * 1e-9;
  }
  unsigned b = 0;
  for (int k = 10; k <= 32; k++) {  // le = 2^k ns: buckets b < 2k end at or below it
    for (; b < 2u * unsigned(k) && b < n; b++) acc += h[b];
    appendf(s, "%s_bucket{%s=\"%u\",le=\"%.9g\"} %llu\n", m.name, label, id, std::ldexp(1.0, k) * 1e-9,
            (unsigned long long)acc);
  }
  appendf(s, "%s_bucket{%s=\"%u\",le=\"+Inf\"} %llu\n", m.name, label, id, (unsigned long long)total);
  appendf(s, "%s_sum{%s=\"%u\"} %.9g\n", m.name, label, id, sum_s);
  appendf(s, "%s_count{%s=\"%u\"} %llu\n", m.name, label, id, (unsigned long long)total);
}

}  // namespace cxlkv
