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
};
inline PoolFault g_pool_fault;

inline void on_pool_sigbus(int sig, siginfo_t* si, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  if (a >= g_pool_fault.lo && a < g_pool_fault.hi) {
    ssize_t w = ::write(2, g_pool_fault.msg, g_pool_fault.len);  // async-signal-safe
    (void)w;
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
