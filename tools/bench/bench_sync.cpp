// SPDX-License-Identifier: MIT
// Benchmarks of the sync area, each beside its baseline in the same run:
//   lock.uncontended_ns_p50 (sticky grant kept) vs lock.pthread_ns_p50
//     (process-shared mutex), lock.uncontended_nosticky_ns_p50 (every
//     acquisition a round trip through the manager, the protocol before
//     sticky grants) and lock.uncontended_floor_ns_p50 (the memory
//     operations of a sticky re-entry + release alone: two NT stores that
//     must reach memory and one fresh read -- what no implementation of
//     this protocol can beat on the machine)
//   lock.handoff_ns_p50 / _p99: 4 nodes contending, time from one node's
//     release to the next waiting node's acquisition;
//   lock.fairness_max_over_min: acquisitions per node in that run
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

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
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
  std::unique_ptr<cxlkv::NodeContext> nosticky;
  {
    cxlkv::NodeOptions no;
    no.node = 4;
    no.sticky = false;
    nosticky = std::move(cxlkv::NodeContext::attach(r, no).value());
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

  {  // uncontended: one node, acquire + release (sticky: the grant stays)
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
  {  // the same without sticky grants: every acquisition asks the manager
    cxlkv::TwoTierLock l(*nosticky, CXLKV_LOCK_FIRST_USER + 3);
    std::vector<double> t;
    for (int i = 0; i < iters; i++) {
      auto t0 = Clock::now();
      (void)l.lock();
      (void)l.unlock();
      t.push_back(ns_since(t0));
    }
    res.set("lock.uncontended_nosticky_ns_p50", p50(t));
  }
  {  // floor of the sticky protocol on this machine: the same MemoryDomain
     // calls the sticky lock + unlock make (robust local mutex, NT slot
     // write, grant invalidate + fence + load, fence, NT slot write, fence)
     // on two scratch lines of the pool, with no lock logic around them
    auto kv = r.carve(CXLKV_CARVE_KV);
    auto* m = static_cast<pthread_mutex_t*>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (kv && m != MAP_FAILED) {
      pthread_mutexattr_t a;
      pthread_mutexattr_init(&a);
      pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
      pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
      pthread_mutex_init(m, &a);
      cxlkv::MemoryDomain& d = nodes[0]->domain();
      auto* slot = r.at<uint64_t>(kv->offset);
      auto* grant = r.at<cxlkv_lock_grant>(kv->offset + 64);
      std::vector<double> t;
      for (int i = 0; i < iters; i++) {
        auto t0 = Clock::now();
        pthread_mutex_lock(m);
        d.write_nt<uint64_t>(slot, 1);
        d.invalidate(grant, sizeof *grant);
        d.fence();
        const cxlkv_lock_grant g = d.read(grant);
        asm volatile("" ::"r"(g.ticket) : "memory");
        d.fence();
        d.write_nt<uint64_t>(slot, 3);
        d.fence();
        pthread_mutex_unlock(m);
        t.push_back(ns_since(t0));
      }
      res.set("lock.uncontended_floor_ns_p50", p50(t));
      munmap(m, 4096);
    }
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
  {  // 4 nodes contending for a fixed time: handoff latency and fairness
    std::atomic<bool> stop{false};
    std::atomic<int64_t> last_release{0};
    std::atomic<int> last_node{-1};
    std::vector<uint64_t> grants(4);
    std::vector<std::vector<double>> hand(4);
    std::vector<std::thread> th;
    auto now_ns = [] { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); };
    for (int n = 0; n < 4; n++)
      th.emplace_back([&, n] {
        cxlkv::TwoTierLock l(*nodes[n], CXLKV_LOCK_FIRST_USER + 2);
        while (!stop.load()) {
          const int64_t asked = now_ns();
          if (!l.lock().ok()) continue;
          const int64_t got = now_ns();
          // A handoff: another node released after we asked.
          const int64_t rel = last_release.load();
          if (last_node.load() != n && rel > asked) hand[n].push_back(double(got - rel));
          grants[n]++;
          last_node.store(n);
          last_release.store(now_ns());
          (void)l.unlock();
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(1000 * bench::scale())));
    stop = true;
    for (auto& x : th) x.join();
    std::vector<double> all;
    for (auto& h : hand) all.insert(all.end(), h.begin(), h.end());
    res.set("lock.handoff_ns_p50", p50(all));
    res.set("lock.handoff_ns_p99", pct(all, 0.99));
    res.set("lock.handoffs", double(all.size()));
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
  cxlkv::NodeContext::unlink_local(nosticky->local_shm_name());
  nosticky.reset();
  nodes.clear();
  rr.value().reset();
  shm_unlink(("/" + name).c_str());
}

}  // namespace

CXLKV_BENCH({"sync", "cross-host lock (uncontended, handoff, fairness) vs pthread; allocator vs malloc", bench_sync});
