// SPDX-License-Identifier: MIT
#include "util/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace cxlkv {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("cxlkv");
    l->set_pattern("[%H:%M:%S.%e] [%n] [%l] [pid %P] %v");
    // spdlog reads an unknown name (a typo, "warning", "") as "off": that
    // silenced every warning.  Unknown names keep the default and say so.
    l->set_level(spdlog::level::warn);
    const char* lv = std::getenv("CXLKV_LOG");
    const std::string want = lv ? lv : "";
    bool known = false;
    for (const char* n : {"trace", "debug", "info", "warn", "warning", "error", "err", "critical", "off"})
      known = known || want == n;
    if (known) l->set_level(want == "warning" ? spdlog::level::warn : spdlog::level::from_str(want));
    else if (!want.empty())
      l->warn("CXLKV_LOG='{}' is not a log level (trace, debug, info, warn, error, critical, off); using warn",
              want);
    return l;
  }();
  return *logger;
}

}  // namespace cxlkv
