// SPDX-License-Identifier: MIT
// Logging: one spdlog logger named "cxlkv", level from CXLKV_LOG
// (trace|debug|info|warn|error|off; default warn).
#pragma once

#include <spdlog/spdlog.h>

namespace cxlkv {
spdlog::logger& log();
}  // namespace cxlkv
