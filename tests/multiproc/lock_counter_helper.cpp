// SPDX-License-Identifier: MIT
// Helper process for the multi-process lock tests: attaches to a pool as one
// node and increments a non-atomic counter in the pool under a cross-host lock.
//   lock_counter_helper URI NODE ITERS          count ITERS times, exit 0
//   lock_counter_helper URI NODE ITERS BURST    pause 1-3 ms after every BURST iterations
//   lock_counter_helper URI NODE hold           take the lock, print "held", sleep forever
//   lock_counter_helper URI NODE mgrhold        also host the pool's lock manager (lease 300 ms)
//   lock_counter_helper URI NODE idle           attach, print "attached", sleep forever
//   lock_counter_helper URI NODE inside         take the lock again and again (keeping the grant
//                                               between turns), each time check that nobody else
//                                               is inside (word 1 of the kv carve is 0), mark it
//                                               2 while inside; "looping" after the first turn;
//                                               exit 3 at once when another holder's mark is seen
// Exit 0 ok, 1 error, 4 lock acquired by recovery (EOWNERDEAD) at least once.
// With CXLKV_HELPER_OWN_PIDNS=1 the helper runs in a pid namespace of its
// own (another host as far as liveness can tell: this_host_id differs):
// it first prints "PID <pid>" (the worker's pid outside the namespace, the
// one to kill), then the worker's lines; it exits with the worker's status.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "multiproc/lock_helper.hpp"

using namespace std::chrono_literals;

namespace {
int work(int argc, char** argv) {
  const auto args = lock_helper::parse(argc, argv, "usage: lock_counter_helper URI NODE ITERS|hold [BURST]");
  if (!args) return 2;
  // Another host (own pid namespace) is alive only while its node beats.
  auto at = lock_helper::attach(*args, std::getenv("CXLKV_HELPER_OWN_PIDNS") != nullptr);
  if (!at) return 1;
  cxlkv::Region& region = *at->region;
  cxlkv::MemoryDomain& d = region.domain();
  auto kv = region.carve(CXLKV_CARVE_KV).value();
  auto* counter = region.at<uint64_t>(kv.offset);
  cxlkv::TwoTierLock lock(*at->node, CXLKV_LOCK_FIRST_USER);
  std::unique_ptr<cxlkv::LockManager> mgr;
  if (args->mode == "mgrhold") {
    cxlkv::LockManagerOptions mo;
    mo.node = args->node;
    mo.lease_ms = 300;
    auto m = cxlkv::LockManager::create(region, mo);
    if (!m) {
      std::fprintf(stderr, "helper: %s\n", m.error().message().c_str());
      return 1;
    }
    mgr = std::move(m.value());
    mgr->start();
  }
  if (args->mode == "idle") {
    std::printf("attached\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  if (args->mode == "inside") {
    // Word 1: who is inside (0 nobody, 1 the test's node, 2 this helper).
    for (long turn = 0;; turn++) {
      auto g = cxlkv::LockGuard::take_for(lock, 30s, {counter, 64});
      if (!g) {
        std::fprintf(stderr, "helper node %u: %s\n", args->node, g.error().message().c_str());
        return 1;
      }
      const uint64_t mark = d.read(counter + 1);  // the guard invalidated the line (rule 4)
      if (mark != 0) {
        std::printf("TWO HOLDERS: mark %llu found inside\n", static_cast<unsigned long long>(mark));
        std::fflush(stdout);
        return 3;
      }
      d.write(counter + 1, uint64_t{2});
      usleep(200);
      d.write(counter + 1, uint64_t{0});  // the guard flushes it before release (rule 3)
      (void)g.value().release();
      if (turn == 0) {
        std::printf("looping\n");
        std::fflush(stdout);
      }
      usleep(2000);
    }
  }
  const bool hold = args->mode == "hold" || mgr;
  const long iters = hold ? 1 : std::atol(args->mode.c_str());
  const long burst = args->burst;
  bool recovered = false;
  for (long i = 0; i < iters; i++) {
    auto g = cxlkv::LockGuard::take_for(lock, 30s, {counter, 64});
    if (!g) {
      std::fprintf(stderr, "helper node %u: %s\n", args->node, g.error().message().c_str());
      return 1;
    }
    if (g.value().how() == cxlkv::Acquired::recovered) recovered = true;
    uint64_t v = d.read(counter);  // the guard invalidated the line (rule 4)
    d.write(counter, v + 1);       // the guard flushes it before release (rule 3)
    if (burst > 0 && i % burst == burst - 1) {
      (void)g.value().release();
      usleep(static_cast<useconds_t>(1000 + 1000 * ((i / burst + args->node) % 3)));
      continue;
    }
    if (hold) {
      std::printf("held\n");
      std::fflush(stdout);
      for (;;) pause();
    }
  }
  return recovered ? 4 : 0;
}
}  // namespace

int main(int argc, char** argv) {
  const char* ns = std::getenv("CXLKV_HELPER_OWN_PIDNS");
  if (!ns || std::strcmp(ns, "1") != 0) return work(argc, argv);
  if (unshare(CLONE_NEWPID) != 0) {
    std::fprintf(stderr, "lock_counter_helper: no pid namespace of its own: %s\n", std::strerror(errno));
    return 1;  // the test needs another host: a failure, not a skip
  }
  pid_t child = fork();  // the first child is the new namespace's init
  if (child < 0) return 1;
  if (child == 0) _exit(work(argc, argv));
  std::printf("PID %d\n", static_cast<int>(child));
  std::fflush(stdout);
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
