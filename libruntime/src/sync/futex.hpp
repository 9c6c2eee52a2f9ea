// SPDX-License-Identifier: MIT
// Process-shared futex waits and wakes on words in node-local shared memory
// (a lock manager on the same host wakes a node's waiters and watcher, and
// they wake it; see NodeLocalHeader).  Every wait is bounded: the pool is
// polled as well, so a missing wake (a manager on another host) only costs
// latency.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "util/clock.hpp"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449  // Linux 5.16, every architecture
#endif

namespace cxlkv::sync {

// Sleep while *word == expected, at most `ns` (returns early on a wake or a
// changed word).
inline void futex_wait(uint32_t* word, uint32_t expected, uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

// One word of a futex_waitv() call (struct futex_waitv of linux/futex.h,
// spelled out for older headers).
struct FutexWaitv {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kFutexWaitvMax = 128;
constexpr uint32_t kFutex32 = 2;  // FUTEX2_SIZE_U32, process-shared

// Sleep until one of the words differs from its value or is woken, at most
// `ns`.  1: a word moved or was woken; 0: time up (or a signal, or a word
// unmapped meanwhile); -1: the call is refused (no futex_waitv before Linux
// 5.16, or a seccomp filter): nothing slept, the caller sleeps another way.
inline int futex_waitv(FutexWaitv* w, uint32_t n, uint64_t ns) {
  const uint64_t end = monotonic_ns() + ns;
  timespec abs{static_cast<time_t>(end / 1000000000), static_cast<long>(end % 1000000000)};
  if (syscall(SYS_futex_waitv, w, n, 0, &abs, CLOCK_MONOTONIC) >= 0 || errno == EAGAIN) return 1;
  return errno == ETIMEDOUT || errno == EINTR || errno == EFAULT ? 0 : -1;
}

}  // namespace cxlkv::sync
