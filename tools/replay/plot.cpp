// SPDX-License-Identifier: MIT
// cxlkv-replay --sweep --plot FILE.svg: the sweep as a picture.
#include <algorithm>
#include <cstdio>

#include "replay.hpp"
#include "svg_chart.hpp"

namespace replay {

bool write_sweep_plot(const std::string& path, const std::vector<PlotPoint>& points, double theory,
                      uint64_t distinct_blocks, const std::string& workload, std::string* err) {
  cxlkv::svg::LineChart c;
  c.title = "Token hit ratio against cache capacity";
  const std::string base = workload.substr(workload.find_last_of('/') + 1);
  c.subtitle = base + ", " + std::to_string(distinct_blocks) + " distinct blocks";
  c.xlabel = "capacity (% of the workload's distinct blocks)";
  c.ylabel = "token hit ratio";
  c.x_suffix = "%";
  c.xmin = 0;
  c.xmax = 100;
  double ymax = theory;
  for (auto& p : points) ymax = std::max({ymax, p.cxlkv, p.lru});
  c.ymin = 0;
  c.ymax = std::min(1.0, std::max(0.1, std::ceil(ymax * 10 + 0.5) / 10));
  cxlkv::svg::Series cx{"cxlkv (replayed)", {}, "#1f77b4", "", true};
  cxlkv::svg::Series lru{"block-LRU reference", {}, "#ff7f0e", "6,4", true};
  for (auto& p : points) {
    cx.points.emplace_back(p.capacity_pct, p.cxlkv);
    lru.points.emplace_back(p.capacity_pct, p.lru);
  }
  char name[64];
  std::snprintf(name, sizeof name, "theoretical reuse %.3f", theory);
  cxlkv::svg::Series th{name, {{0, theory}, {100, theory}}, "#2ca02c", "2,3", false};
  c.series = {cx, lru, th};
  return cxlkv::svg::Document::save_text(path, cxlkv::svg::render(c), err);
}

}  // namespace replay
