// SPDX-License-Identifier: MIT
// Adaptive polling: spin while a change is likely soon, then yield the CPU,
// then sleep with a growing but bounded interval, so an idle poller costs
// (almost) nothing and the added latency stays below max_sleep.
#pragma once

#include <immintrin.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace cxlkv::sync {

class Backoff {
 public:
  Backoff(uint32_t spins, uint32_t yields, std::chrono::microseconds max_sleep)
      : spins_(spins), yields_(yields), max_sleep_us_(static_cast<uint32_t>(max_sleep.count())) {}
  // One idle step; returns true if it slept.
  bool idle() {
    n_++;
    if (n_ <= spins_) {
      for (int i = 0; i < 8; i++) _mm_pause();
      return false;
    }
    if (n_ <= spins_ + yields_) {
      sched_yield();
      return false;
    }
    sleep_us_ = std::clamp<uint32_t>(sleep_us_ ? sleep_us_ * 2 : 1, 1, std::max(1u, max_sleep_us_));
    timespec ts{0, static_cast<long>(sleep_us_) * 1000};
    nanosleep(&ts, nullptr);
    return true;
  }
  void reset() {
    n_ = 0;
    sleep_us_ = 0;
  }

 private:
  uint32_t spins_, yields_, max_sleep_us_;
  uint32_t n_ = 0, sleep_us_ = 0;
};

}  // namespace cxlkv::sync
