// SPDX-License-Identifier: MIT
// A pool whose file shrinks under a process (truncated, replaced, its
// device gone) turns every later access of the lost pages into SIGBUS: the
// tool died with "Bus error" and a core, naming nothing.  A tool that maps a
// pool calls report_pool_faults() once after opening it; a SIGBUS inside that
// mapping then ends the process with exit status 1 and one line naming the
// pool and the cause.  Faults anywhere else keep their default action.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace cxlkv_tools {

struct PoolFault {
  char msg[768];
  size_t len = 0;
  uintptr_t lo = 0, hi = 0;
  // Files the process made that its destructors would remove (a pool of its
  // own, a writer's lock file): _exit skips them, so the handler unlinks
  // them (unlink is async-signal-safe).  Written before they can be needed.
  static constexpr int kMaxFiles = 4;
  char files[kMaxFiles][256] = {};
};
inline PoolFault g_pool_fault;

// Remove `path` too when a pool fault ends the process.  A lock whose holder
// dies needs no clean-up (an flock ends with the process, and a later writer
// reuses the file it finds); this only keeps /dev/shm free of what a run
// made.  False when the table is full or the path too long (then it stays).
inline bool remove_on_pool_fault(const std::string& path) {
  for (auto& f : g_pool_fault.files)
    if (f[0] == '\0' && path.size() < sizeof f) {
      std::memcpy(f, path.c_str(), path.size() + 1);
      return true;
    }
  return false;
}

inline void on_pool_sigbus(int sig, siginfo_t* si, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  if (a >= g_pool_fault.lo && a < g_pool_fault.hi) {
    ssize_t w = ::write(2, g_pool_fault.msg, g_pool_fault.len);  // async-signal-safe
    (void)w;
    for (const auto& f : g_pool_fault.files)
      if (f[0]) ::unlink(f);
    _exit(1);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

// tool: "cxlkvd"; the pool `uri` mapped at [base, base + size).
inline void report_pool_faults(const char* tool, const std::string& uri, const void* base, uint64_t size) {
  int n = std::snprintf(g_pool_fault.msg, sizeof g_pool_fault.msg,
                        "%s: pool %s: bus error on the pool's memory: the pool file was truncated, or its "
                        "device failed, while in use (a pool must keep its size while any process maps it)\n",
                        tool, uri.c_str());
  g_pool_fault.len = n < 0 ? 0 : std::min<size_t>(size_t(n), sizeof g_pool_fault.msg - 1);
  g_pool_fault.lo = reinterpret_cast<uintptr_t>(base);
  g_pool_fault.hi = g_pool_fault.lo + size;
  struct sigaction sa {};
  sa.sa_sigaction = on_pool_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace cxlkv_tools
