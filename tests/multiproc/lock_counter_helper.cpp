// SPDX-License-Identifier: MIT
// Helper process for the multi-process lock tests: attaches to a pool as one
// node and increments a non-atomic counter in the pool under a cross-host lock.
//   lock_counter_helper URI NODE ITERS          count ITERS times, exit 0
//   lock_counter_helper URI NODE ITERS BURST    pause 1-3 ms after every BURST iterations
//   lock_counter_helper URI NODE hold           take the lock, print "held", sleep forever
//   lock_counter_helper URI NODE mgrhold        also host the pool's lock manager (lease 300 ms)
// Exit 0 ok, 1 error, 4 lock acquired by recovery (EOWNERDEAD) at least once.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: lock_counter_helper URI NODE ITERS|hold [BURST]\n");
    return 2;
  }
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
  auto* counter = region.value()->at<uint64_t>(kv.offset);
  cxlkv::TwoTierLock lock(*node.value(), CXLKV_LOCK_FIRST_USER);
  std::unique_ptr<cxlkv::LockManager> mgr;
  if (std::strcmp(argv[3], "mgrhold") == 0) {
    cxlkv::LockManagerOptions mo;
    mo.node = no.node;
    mo.lease_ms = 300;
    auto m = cxlkv::LockManager::create(*region.value(), mo);
    if (!m) {
      std::fprintf(stderr, "helper: %s\n", m.error().message().c_str());
      return 1;
    }
    mgr = std::move(m.value());
    mgr->start();
  }
  const bool hold = std::strcmp(argv[3], "hold") == 0 || mgr;
  const long iters = hold ? 1 : std::atol(argv[3]);
  const long burst = argc == 5 ? std::atol(argv[4]) : 0;
  bool recovered = false;
  for (long i = 0; i < iters; i++) {
    auto g = cxlkv::LockGuard::take_for(lock, 30s, {counter, 64});
    if (!g) {
      std::fprintf(stderr, "helper node %u: %s\n", no.node, g.error().message().c_str());
      return 1;
    }
    if (g.value().how() == cxlkv::Acquired::recovered) recovered = true;
    uint64_t v = d.read(counter);  // the guard invalidated the line (rule 4)
    d.write(counter, v + 1);       // the guard flushes it before release (rule 3)
    if (burst > 0 && i % burst == burst - 1) {
      (void)g.value().release();
      usleep(static_cast<useconds_t>(1000 + 1000 * ((i / burst + no.node) % 3)));
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
