// SPDX-License-Identifier: MIT
// The runtime's two clocks, in nanoseconds, one definition each.
//
// realtime_ns (CLOCK_REALTIME) is the clock whose readings go into the pool
// and are compared across hosts: node heartbeats, lock-manager lease
// renewals, quarantine deadlines, format and probe times (docs/locks.md,
// "One liveness rule"; docs/on-pool-format.md).  monotonic_ns
// (CLOCK_MONOTONIC) is for intervals measured on this host only: RPC
// timeouts and liveness watches, futex deadlines, the watcher's wake stamps
// in node-local memory (docs/rpc.md).  It is the clock std::chrono's
// steady_clock reads on Linux/glibc.
#pragma once

#include <time.h>

#include <cstdint>

namespace cxlkv {

inline uint64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline uint64_t realtime_ns() { return clock_ns(CLOCK_REALTIME); }
inline uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }
// Milliseconds of realtime_ns: the index's lease and age stamps, the store's
// statistics time.
inline uint64_t realtime_ms() { return realtime_ns() / 1000000; }

}  // namespace cxlkv
