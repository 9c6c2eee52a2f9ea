// SPDX-License-Identifier: MIT
// Short scheduler slices for the threads every cross-node lock hand-off
// waits on: the lock manager and each node's watcher.  They run for
// microseconds when woken, then sleep again.  On a machine whose CPUs are
// busy with payload copies, a woken thread with the default slice waits for
// the running task to use up its protected slice (EEVDF run-to-parity,
// about 1-3 ms), and a revocation takes several such hops (requester ->
// manager -> holder's watcher -> manager -> requester): hand-offs of
// milliseconds.  A short requested slice (sched_attr.sched_runtime of a
// SCHED_OTHER thread, Linux 6.12+, no privilege needed) lets the kernel run
// such a thread at its wake-up instead.  Best effort: an older kernel
// refuses it (EINVAL) or ignores it, and nothing else changes (the thread's
// policy and nice value are kept).
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>

namespace cxlkv::sync {

struct SchedAttr {  // struct sched_attr (include/uapi/linux/sched/types.h), SCHED_ATTR_SIZE_VER1
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
  uint32_t sched_util_min, sched_util_max;
};

// Asks for a `slice` slice for the calling thread; false where the kernel
// refused (or the thread is not SCHED_OTHER / SCHED_BATCH: left as it is).
inline bool request_short_slice(std::chrono::microseconds slice = std::chrono::microseconds(100)) {
#if defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
  SchedAttr a;
  std::memset(&a, 0, sizeof a);
  if (syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) != 0) return false;
  if (a.sched_policy != 0 /* SCHED_OTHER */ && a.sched_policy != 3 /* SCHED_BATCH */) return false;
  a.size = sizeof a;
  a.sched_flags = 0;
  a.sched_runtime = static_cast<uint64_t>(std::chrono::nanoseconds(slice).count());
  return syscall(SYS_sched_setattr, 0, &a, 0) == 0;
#else
  (void)slice;
  return false;
#endif
}

}  // namespace cxlkv::sync
