// SPDX-License-Identifier: MIT
// Adaptive polling: spin while a change is likely soon, then yield the CPU,
// then sleep with a growing but bounded interval, so an idle poller costs
// (almost) nothing and the added latency stays below max_sleep.
//
// Sleeps are short (microseconds), and Linux delays a normal thread's timer
// wake-up by up to its timer slack (default 50 us) to batch wake-ups: a 2 us
// sleep would then last ~52 us, which is what made lock hand-offs take
// 100-200 us at p99 on a 2-core machine.  So the first sleep lowers the
// calling thread's slack to 1 ns (PR_SET_TIMERSLACK) and the destructor
// puts the thread's previous slack back: the rest of the application keeps
// its own setting.
#pragma once

#include <immintrin.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace cxlkv::sync {

class Backoff {
 public:
  Backoff(uint32_t spins, uint32_t yields, std::chrono::microseconds max_sleep)
      : spins_(spins), yields_(yields), max_sleep_us_(static_cast<uint32_t>(max_sleep.count())) {}
  ~Backoff() {
    if (saved_slack_ > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_slack_), 0, 0, 0);
  }
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;

  // One idle step; returns true if it slept.  With `word`: the sleep is a
  // futex wait while *word == expected (process-shared), so whoever bumps
  // the word and wakes it ends the sleep early; still bounded by the same
  // sleep schedule.
  bool idle(uint32_t* word = nullptr, uint32_t expected = 0) {
    n_++;
    if (n_ <= spins_) {
      for (int i = 0; i < 8; i++) _mm_pause();
      return false;
    }
    if (n_ <= spins_ + yields_) {
      sched_yield();
      return false;
    }
    if (saved_slack_ == 0) {
      // Returns the slack in ns (> 0); -1 where prctl is refused: leave it.
      saved_slack_ = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
      if (saved_slack_ > 1 && prctl(PR_SET_TIMERSLACK, 1ul, 0, 0, 0) != 0) saved_slack_ = -1;
      if (saved_slack_ == 1) saved_slack_ = -1;  // already 1 ns: nothing to restore
    }
    sleep_us_ = std::clamp<uint32_t>(sleep_us_ ? sleep_us_ * 2 : 1, 1, std::max(1u, max_sleep_us_));
    timespec ts{static_cast<time_t>(sleep_us_ / 1000000), static_cast<long>(sleep_us_ % 1000000) * 1000};
    if (word)
      syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
    else
      nanosleep(&ts, nullptr);
    return true;
  }
  bool sleeping() const { return n_ >= spins_ + yields_; }  // the next idle() sleeps
  void reset() {
    n_ = 0;
    sleep_us_ = 0;
  }

 private:
  uint32_t spins_, yields_, max_sleep_us_;
  uint32_t n_ = 0, sleep_us_ = 0;
  long saved_slack_ = 0;  // 0: not yet changed; -1: nothing to restore
};

}  // namespace cxlkv::sync
