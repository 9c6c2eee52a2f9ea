// SPDX-License-Identifier: MIT
#include "util/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace cxlkv {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("cxlkv");
    const char* lv = std::getenv("CXLKV_LOG");
    l->set_level(lv ? spdlog::level::from_str(lv) : spdlog::level::warn);
    l->set_pattern("[%H:%M:%S.%e] [%n] [%l] [pid %P] %v");
    return l;
  }();
  return *logger;
}

}  // namespace cxlkv
