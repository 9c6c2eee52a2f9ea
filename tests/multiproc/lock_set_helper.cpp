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
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: lock_set_helper URI NODE ITERS|full:ITERS|hold [BURST]\n");
    return 2;
  }
  constexpr uint32_t kLocks = 5;
  auto region = cxlkv::Region::open(argv[1]);
  if (!region) {
    std::fprintf(stderr, "helper: %s\n", region.error().message().c_str());
    return 1;
  }
  cxlkv::NodeOptions no;
  no.node = static_cast<uint32_t>(std::atoi(argv[2]));
  auto node = cxlkv::NodeContext::attach(*region.value(), no);
  if (!node) {
    std::fprintf(stderr, "helper: %s\n", node.error().message().c_str());
    return 1;
  }
  cxlkv::MemoryDomain& d = region.value()->domain();
  auto kv = region.value()->carve(CXLKV_CARVE_KV).value();
  auto* counters = region.value()->at<uint64_t>(kv.offset);  // counter k at counters[8 * k]
  const std::string mode = argv[3];
  const bool hold = mode == "hold";
  const bool full = hold || mode.rfind("full:", 0) == 0;
  const long iters = hold ? 1 : std::atol(mode.c_str() + (full ? 5 : 0));
  const long burst = argc == 5 ? std::atol(argv[4]) : 0;
  cxlkv::LockSet set(*node.value());
  bool recovered = false;
  for (long i = 0; i < iters; i++) {
    std::vector<uint32_t> ids;
    for (uint32_t k = 0; k < kLocks; k++)
      if (full || k != (no.node + i) % kLocks) ids.push_back(CXLKV_LOCK_FIRST_USER + kLocks - 1 - k);  // any order
    auto r = set.try_lock_for(ids, 30s);
    if (!r) {
      std::fprintf(stderr, "helper node %u: %s\n", no.node, r.error().message().c_str());
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
      usleep(static_cast<useconds_t>(1000 + 1000 * ((i / burst + no.node) % 3)));
  }
  return recovered ? 4 : 0;
}
