// SPDX-License-Identifier: MIT
// Benchmarks of the sync area, each beside its baseline in the same run:
//   lock.uncontended_ns_p50 vs lock.pthread_ns_p50 (process-shared mutex)
//   lock.handoff_ns_p50 (two nodes alternating), lock.fairness_max_over_min (4 nodes)
//   alloc.mops vs alloc.malloc_mops (alloc + free pairs, 64 B .. 4 KiB)
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "cxlkv/alloc.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double p50(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

void bench_sync(bench::Results& res) {
  const std::string name = bench::shm_name("sync");
  const std::string uri = "shm:" + name + ":256M";
  cxlkv::PoolFormatOptions fo;
  fo.max_nodes = 8;
  fo.force = true;
  auto rr = cxlkv::format_pool(uri, fo);
  if (!rr) {
    std::fprintf(stderr, "bench sync: %s\n", rr.error().message().c_str());
    return;
  }
  cxlkv::Region& r = *rr.value();
  std::vector<std::unique_ptr<cxlkv::NodeContext>> nodes;
  for (uint32_t n = 0; n < 4; n++) {
    cxlkv::NodeOptions no;
    no.node = n;
    nodes.push_back(std::move(cxlkv::NodeContext::attach(r, no).value()));
  }
  cxlkv::LockManagerOptions mo;
  mo.node = 7;
  auto mgr = cxlkv::LockManager::create(r, mo);
  if (!mgr) {
    std::fprintf(stderr, "bench sync: %s\n", mgr.error().message().c_str());
    return;
  }
  mgr.value()->start();
  const int iters = static_cast<int>(3000 * bench::scale());

  {  // uncontended: one node, acquire + release
    cxlkv::TwoTierLock l(*nodes[0], CXLKV_LOCK_FIRST_USER);
    std::vector<double> t;
    for (int i = 0; i < iters; i++) {
      auto t0 = Clock::now();
      (void)l.lock();
      (void)l.unlock();
      t.push_back(ns_since(t0));
    }
    res.set("lock.uncontended_ns_p50", p50(t));
  }
  {  // baseline: process-shared pthread mutex in shared memory
    auto* m = static_cast<pthread_mutex_t*>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(m, &a);
    std::vector<double> t;
    for (int i = 0; i < iters; i++) {
      auto t0 = Clock::now();
      pthread_mutex_lock(m);
      pthread_mutex_unlock(m);
      t.push_back(ns_since(t0));
    }
    res.set("lock.pthread_ns_p50", p50(t));
    munmap(m, 4096);
  }
  {  // handoff: two nodes alternating on one lock; per acquisition latency
    std::vector<double> t[2];
    std::vector<std::thread> th;
    for (int n = 0; n < 2; n++)
      th.emplace_back([&, n] {
        cxlkv::TwoTierLock l(*nodes[n], CXLKV_LOCK_FIRST_USER + 1);
        for (int i = 0; i < iters / 2; i++) {
          auto t0 = Clock::now();
          (void)l.lock();
          t[n].push_back(ns_since(t0));
          (void)l.unlock();
        }
      });
    for (auto& x : th) x.join();
    t[0].insert(t[0].end(), t[1].begin(), t[1].end());
    res.set("lock.handoff_ns_p50", p50(t[0]));
  }
  {  // fairness: four nodes contending for a fixed time
    std::atomic<bool> stop{false};
    std::vector<uint64_t> grants(4);
    std::vector<std::thread> th;
    for (int n = 0; n < 4; n++)
      th.emplace_back([&, n] {
        cxlkv::TwoTierLock l(*nodes[n], CXLKV_LOCK_FIRST_USER + 2);
        while (!stop.load()) {
          if (l.lock().ok()) {
            grants[n]++;
            (void)l.unlock();
          }
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(1000 * bench::scale())));
    stop = true;
    for (auto& x : th) x.join();
    auto [mn, mx] = std::minmax_element(grants.begin(), grants.end());
    res.set("lock.fairness_max_over_min", *mn ? double(*mx) / double(*mn) : 1e9);
  }
  {  // allocator vs glibc malloc: alloc + free pairs of 64 B .. 4 KiB
    auto heap = cxlkv::NodeHeap::open(*nodes[0]);
    if (heap) {
      const int n = static_cast<int>(200000 * bench::scale());
      std::mt19937 rng(1);
      std::vector<uint64_t> sizes(1024);
      for (auto& s : sizes) s = 64u << (rng() % 7);
      std::vector<uint64_t> held(64, 0);
      (void)heap.value()->free(heap.value()->alloc(64).value());  // warm: first chunk
      auto t0 = Clock::now();
      for (int i = 0; i < n; i++) {
        auto& slot = held[i & 63];
        if (slot) (void)heap.value()->free(slot);
        auto o = heap.value()->alloc(sizes[i & 1023]);
        slot = o ? o.value() : 0;
      }
      double ns = ns_since(t0);
      for (auto o : held)
        if (o) (void)heap.value()->free(o);
      res.set("alloc.mops", n / ns * 1e3);
      std::vector<void*> mh(64, nullptr);
      t0 = Clock::now();
      for (int i = 0; i < n; i++) {
        auto& slot = mh[i & 63];
        std::free(slot);
        slot = std::malloc(sizes[i & 1023]);
        asm volatile("" ::"r"(slot) : "memory");
      }
      ns = ns_since(t0);
      for (auto p : mh) std::free(p);
      res.set("alloc.malloc_mops", n / ns * 1e3);
    }
  }
  mgr.value()->stop();
  mgr.value().reset();
  for (uint32_t n = 0; n < 4; n++) cxlkv::NodeContext::unlink_local(nodes[n]->local_shm_name());
  nodes.clear();
  rr.value().reset();
  shm_unlink(("/" + name).c_str());
}

}  // namespace

CXLKV_BENCH({"sync", "cross-host lock (uncontended, handoff, fairness) vs pthread; allocator vs malloc", bench_sync});
