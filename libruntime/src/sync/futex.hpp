// SPDX-License-Identifier: MIT
// Process-shared futex waits and wakes on words in node-local shared memory
// (a lock manager on the same host wakes a node's waiters and watcher; see
// NodeLocalHeader).  Every wait is bounded: the pool is polled as well, so
// a missing wake (a manager on another host) only costs latency.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

namespace cxlkv::sync {

// Sleep while *word == expected, at most `ns` (returns early on a wake or a
// changed word).
inline void futex_wait(uint32_t* word, uint32_t expected, uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

}  // namespace cxlkv::sync
