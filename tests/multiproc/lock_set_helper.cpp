// SPDX-License-Identifier: MIT
// Helper process for the multi-process lock set tests: attaches to a pool as
// one node and takes sets of the locks CXLKV_LOCK_FIRST_USER + 0..4 with one
// LockSet (uapi/cxlkv_ctrl.h "Lock sets"), incrementing a non-atomic pool
// counter per lock (counter k on line k of the kv carve) under each set.
//   lock_set_helper URI NODE ITERS [BURST]   ITERS sets of 4: iteration i skips lock (NODE + i) % 5;
//                                            BURST: pause 1-3 ms after every BURST sets
//   lock_set_helper URI NODE full:ITERS      ITERS sets of all 5 locks
//   lock_set_helper URI NODE hold            take all 5, count once, print "held", sleep forever
// Exit 0 ok, 1 error, 4 a set was acquired by recovery (EOWNERDEAD) at least once.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "multiproc/lock_helper.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const auto args = lock_helper::parse(argc, argv, "usage: lock_set_helper URI NODE ITERS|full:ITERS|hold [BURST]");
  if (!args) return 2;
  constexpr uint32_t kLocks = 5;
  auto at = lock_helper::attach(*args);
  if (!at) return 1;
  cxlkv::Region& region = *at->region;
  cxlkv::MemoryDomain& d = region.domain();
  auto kv = region.carve(CXLKV_CARVE_KV).value();
  auto* counters = region.at<uint64_t>(kv.offset);  // counter k at counters[8 * k]
  const std::string& mode = args->mode;
  const bool hold = mode == "hold";
  const bool full = hold || mode.rfind("full:", 0) == 0;
  const long iters = hold ? 1 : std::atol(mode.c_str() + (full ? 5 : 0));
  const long burst = args->burst;
  cxlkv::LockSet set(*at->node);
  bool recovered = false;
  for (long i = 0; i < iters; i++) {
    std::vector<uint32_t> ids;
    for (uint32_t k = 0; k < kLocks; k++)
      if (full || k != (args->node + i) % kLocks) ids.push_back(CXLKV_LOCK_FIRST_USER + kLocks - 1 - k);  // any order
    auto r = set.try_lock_for(ids, 30s);
    if (!r) {
      std::fprintf(stderr, "helper node %u: %s\n", args->node, r.error().message().c_str());
      return 1;
    }
    if (r.value() == cxlkv::Acquired::recovered) recovered = true;
    for (uint32_t id : set.held()) {
      uint64_t* c = counters + 8 * (id - CXLKV_LOCK_FIRST_USER);
      d.invalidate(c, 64);  // rule 4: the previous holder's value
      d.fence();
      d.write(c, d.read(c) + 1);
      d.flush(c, 64);  // rule 3: in memory before the release
    }
    if (hold) {
      std::printf("held\n");
      std::fflush(stdout);
      for (;;) pause();
    }
    if (!set.unlock().ok()) return 1;
    if (burst > 0 && i % burst == burst - 1)
      usleep(static_cast<useconds_t>(1000 + 1000 * ((i / burst + args->node) % 3)));
  }
  return recovered ? 4 : 0;
}
