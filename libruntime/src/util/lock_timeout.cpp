// SPDX-License-Identifier: MIT
#include "util/lock_timeout.hpp"

#include <cstdlib>
#include <string>

#include "util/log.hpp"

namespace cxlkv {

std::chrono::nanoseconds lock_timeout() {
  uint64_t ms = 30000;
  if (const char* e = std::getenv("CXLKV_LOCK_TIMEOUT_MS"); e && *e) {
    // Digits only: strtoull read a typo as 0, which means "wait forever".
    const std::string v = e;
    if (v.size() <= 12 && v.find_first_not_of("0123456789") == std::string::npos)
      ms = std::strtoull(e, nullptr, 10);
    else
      log().warn("CXLKV_LOCK_TIMEOUT_MS='{}' is not a number of milliseconds (0: wait forever); using {}", v, ms);
  }
  return ms ? std::chrono::nanoseconds(std::chrono::milliseconds(ms)) : std::chrono::nanoseconds::max();
}

}  // namespace cxlkv
