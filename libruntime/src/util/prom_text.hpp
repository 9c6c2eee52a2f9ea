// SPDX-License-Identifier: MIT
// Pieces of the Prometheus text exposition (format 0.0.4) that every family
// writer shares (kv_metrics.cpp and capi/metrics_*.cpp): printf-style
// appending, the HELP/TYPE header of a family, and one labelled latency
// histogram from the pool's half-octave buckets.
#pragma once

#include <cstdint>
#include <string>

#include "cxlkv/metrics.hpp"

namespace cxlkv {

// Appends printf(fmt, ...) to s (a line longer than 511 bytes is cut there).
void appendf(std::string& s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// "# HELP name help\n# TYPE name type\n".
void append_family_header(std::string& s, const MetricDesc& m);

// The sample lines of histogram m for one series labelled label="id":
// bucket b of `buckets` (n of them) counts latencies in [2^(b/2),
// 2^((b+1)/2)) ns, as every pool histogram does (cxlkv/format/index_format.h,
// cxlkv/format/pnm_format.h); Prometheus buckets are cumulative at le = 2^k ns
// (k = 10..32: 1 us .. 4.3 s) plus +Inf, with _sum estimated from the
// buckets' geometric midpoints, and _count.
void append_histogram(std::string& s, const MetricDesc& m, const char* label, unsigned id, const uint32_t* buckets,
                      unsigned n);

}  // namespace cxlkv
