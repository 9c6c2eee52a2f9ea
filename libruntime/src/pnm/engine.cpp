// SPDX-License-Identifier: MIT
// Near-memory engines (docs/near-memory.md "A decode step"): a thread pool beside the pool that
// splits one decode step's (layer, KV head) pairs over its threads, and a
// group of engines (one per NUMA node / pool device) serving whole requests
// data-parallel.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cxlkv/pnm.hpp"
#include "pnm/pnm_internal.hpp"
#include "cxlkv/format/pnm_format.h"

namespace cxlkv::pnm {

namespace {

// CPUs of a NUMA node from sysfs ("0-3,8-11"); empty when unknown.
std::vector<int> node_cpus(int node) {
  std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string s;
  std::vector<int> cpus;
  if (!std::getline(f, s)) return cpus;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    try {
      const int a = std::stoi(part.substr(0, dash));
      const int b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      for (int c = a; c <= b; c++) cpus.push_back(c);
    } catch (...) {
      return {};
    }
  }
  return cpus;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct Engine::Impl {
  EngineOptions opts;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::condition_variable cv, done_cv;
  const std::function<void(uint32_t)>* job = nullptr;
  uint32_t n = 0;
  std::atomic<uint32_t> next{0};
  uint32_t running = 0;
  uint64_t epoch = 0;
  bool stop = false;

  void work() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(uint32_t)>* f;
      uint32_t count;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return stop || epoch != seen; });
        if (stop) return;
        seen = epoch;
        // Every index of this job already taken: parallel_for may have
        // returned and destroyed the job, and a new job resets `next`; a
        // worker that woke this late must not join (it would run the new
        // job's indices with the old, dangling function).
        if (next.load() >= n) continue;
        f = job;
        count = n;
        running++;
      }
      for (uint32_t i; (i = next.fetch_add(1)) < count;) (*f)(i);
      std::lock_guard<std::mutex> g(mu);
      if (--running == 0) done_cv.notify_all();
    }
  }
};

Result<void> check_engine_options(const EngineOptions& opts) {
  if (opts.numa_node < -1)
    return Error(-EINVAL, "pnm engine: NUMA node " + std::to_string(opts.numa_node) + " (a node id, or -1: no binding)");
  if (opts.numa_node >= 0 && node_cpus(opts.numa_node).empty()) {
    const bool exists = access(("/sys/devices/system/node/node" + std::to_string(opts.numa_node)).c_str(), F_OK) == 0;
    return Error(-EINVAL, "pnm engine: NUMA node " + std::to_string(opts.numa_node) +
                              (exists ? " has no CPUs to bind the engine's threads to (a memory-only node: bind to "
                                        "the node of the CPUs next to it)"
                                      : " does not exist on this host (/sys/devices/system/node)"));
  }
  return {};
}

Engine::Engine(const EngineOptions& opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  const uint32_t nt = std::max<uint32_t>(1, opts.threads);
  const std::vector<int> cpus = opts.numa_node >= 0 ? node_cpus(opts.numa_node) : std::vector<int>{};
  // The calling thread is worker 0 (parallel_for joins in); nt - 1 more.
  for (uint32_t i = 1; i < nt; i++) {
    impl_->threads.emplace_back([this] { impl_->work(); });
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : cpus) CPU_SET(c, &set);
      pthread_setaffinity_np(impl_->threads.back().native_handle(), sizeof set, &set);  // best effort
    }
  }
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

uint32_t Engine::threads() const { return uint32_t(impl_->threads.size()) + 1; }
int Engine::numa_node() const { return impl_->opts.numa_node; }

void Engine::parallel_for(uint32_t n, const std::function<void(uint32_t)>& f) {
  if (impl_->threads.empty() || n <= 1) {
    for (uint32_t i = 0; i < n; i++) f(i);
    return;
  }
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->job = &f;
    impl_->n = n;
    impl_->next = 0;
    impl_->epoch++;
  }
  impl_->cv.notify_all();
  for (uint32_t i; (i = impl_->next.fetch_add(1)) < n;) f(i);
  std::unique_lock<std::mutex> g(impl_->mu);
  // Every worker that picked up this epoch has finished its share.
  impl_->done_cv.wait(g, [&] { return impl_->running == 0 && impl_->next.load() >= n; });
  impl_->job = nullptr;
}

namespace {
StepResult run_step(Engine& eng, const StepRequest& req, Isa isa) {
  StepResult r;
  if (!req.ctx) {
    r.status = Error(-EINVAL, "pnm engine step: no context");
    return r;
  }
  Context& ctx = *req.ctx;
  const Geometry& g = ctx.geometry();
  const std::string C = "pnm context " + std::to_string(ctx.request_id()) + ": step: ";
  uint64_t ntokens = req.ntokens;
  if (ntokens == 0) {
    auto n = ctx.refresh();  // rule 4: the published count, fresh
    if (!n.ok()) {
      r.status = n.error();
      return r;
    }
    ntokens = *n;
  }
  if (auto e = detail::check_step(ctx, req.queries, req.q_heads, ntokens); !e.empty()) {
    r.status = Error(-EINVAL, C + e);
    return r;
  }
  r.ntokens = ntokens;
  const uint32_t group = req.q_heads / g.kv_heads, np = ctx.pages_for(ntokens);
  const uint32_t pairs = g.layers * g.kv_heads;
  const size_t es = dtype_size(g.dtype);
  std::vector<Error> errs(pairs, Error(0, ""));
  std::vector<uint8_t> failed(pairs, 0);
  std::vector<uint64_t> read(pairs, 0);

  auto t0 = std::chrono::steady_clock::now();
  r.selection.layers = g.layers;
  r.selection.kv_heads = g.kv_heads;
  r.selection.pages.resize(pairs);
  if (req.all_pages) {
    std::vector<uint32_t> all(np);
    for (uint32_t p = 0; p < np; p++) all[p] = p;
    for (auto& v : r.selection.pages) v = all;
  } else {
    eng.parallel_for(pairs, [&](uint32_t i) {
      const uint32_t l = i / g.kv_heads, h = i % g.kv_heads;
      const float* q = req.queries.data() + (size_t(l) * req.q_heads + size_t(h) * group) * g.head_dim;
      auto p = detail::select_head(ctx, q, group, l, h, ntokens, req.select, isa, nullptr, &read[i]);
      if (p.ok()) {
        r.selection.pages[i] = std::move(p.value());
      } else {
        errs[i] = p.error();
        failed[i] = 1;
      }
    });
    for (uint64_t b : read) r.digest_bytes += b;
    r.selection.digest_bytes = r.digest_bytes;
  }
  r.select_ms = ms_since(t0);
  for (uint32_t i = 0; i < pairs; i++)
    if (failed[i]) {
      r.status = errs[i];
      return r;
    }

  t0 = std::chrono::steady_clock::now();
  std::vector<uint64_t> table(np);
  if (auto t = ctx.read_page_table(0, np, table.data()); !t.ok()) {
    r.status = t.error();
    return r;
  }
  r.partial.layers = g.layers;
  r.partial.q_heads = req.q_heads;
  r.partial.head_dim = g.head_dim;
  r.partial.out.assign(size_t(g.layers) * req.q_heads * g.head_dim, 0.f);
  r.partial.lse.assign(size_t(g.layers) * req.q_heads, -INFINITY);
  const float scale = 1.f / std::sqrt(float(g.head_dim));
  // Work items of a layer's KV heads together (attend_heads reads a page's
  // stretch of the layer in order): whole layers, or, where the engine has
  // more threads than a quarter of the layers, layers split into blocks of
  // heads so that every thread has items to take.
  const uint32_t blocks = std::min<uint32_t>(g.kv_heads, (4 * eng.threads() + g.layers - 1) / g.layers);
  const uint32_t per_block = (g.kv_heads + blocks - 1) / blocks;
  const uint32_t nblocks = (g.kv_heads + per_block - 1) / per_block;
  std::vector<std::span<const uint32_t>> spans(pairs);
  for (uint32_t i = 0; i < pairs; i++) spans[i] = r.selection.pages[i];
  eng.parallel_for(g.layers * nblocks, [&](uint32_t item) {
    const uint32_t l = item / nblocks, h0 = item % nblocks * per_block;
    const uint32_t nh = std::min(per_block, g.kv_heads - h0), i = l * g.kv_heads + h0;
    const size_t qh0 = size_t(l) * req.q_heads + size_t(h0) * group;
    auto a = detail::attend_heads(ctx, table.data(), spans.data() + i, l, h0, nh,
                                  req.queries.data() + qh0 * g.head_dim, group, ntokens, scale, isa,
                                  r.partial.out.data() + qh0 * g.head_dim, r.partial.lse.data() + qh0);
    if (!a.ok()) {
      errs[i] = a.error();
      failed[i] = 1;
    }
  });
  r.attend_ms = ms_since(t0);
  for (uint32_t i = 0; i < pairs; i++)
    if (failed[i]) {
      r.status = errs[i];
      return r;
    }
  // A context destroyed while we read it may have had its pages reused.
  if (!ctx.still_valid()) {
    r.status = Error(-ESTALE, C + "destroyed while the step read it");
    return r;
  }
  uint64_t sel_tokens = 0;
  for (uint32_t i = 0; i < pairs; i++)
    for (uint32_t p : r.selection.pages[i])
      sel_tokens += std::min<uint64_t>(g.page_tokens, ntokens - uint64_t(p) * g.page_tokens);
  const uint64_t row = uint64_t(g.head_dim) * es;
  r.kv_bytes = sel_tokens * 2 * row;
  r.link_bytes_near = uint64_t(g.layers) * req.q_heads * (2 * g.head_dim * sizeof(float) + sizeof(float));
  r.link_bytes_selected = sel_tokens * 2 * row;
  r.link_bytes_all = ntokens * g.layers * g.kv_heads * 2 * row;
  return r;
}
}  // namespace

StepResult Engine::step(const StepRequest& req, Isa isa) {
  StepResult r = run_step(*this, req, isa);
  // The pnm metrics family: counted by the store the context was opened through.
  if (req.ctx) req.ctx->store().record_step(r, !req.all_pages);
  return r;
}


EngineGroup::EngineGroup(std::vector<EngineOptions> engines) {
  if (engines.empty()) engines.push_back({});
  for (auto& o : engines) engines_.push_back(std::make_unique<Engine>(o));
}

std::vector<EngineOptions> EngineGroup::per_numa_node(uint32_t threads_per_engine) {
  std::vector<EngineOptions> v;
  for (int node = 0; node < 64; node++)
    if (!node_cpus(node).empty()) v.push_back({threads_per_engine, node});
  if (v.empty()) v.push_back({threads_per_engine, -1});
  return v;
}

std::vector<StepResult> EngineGroup::step(std::span<const StepRequest> reqs, Isa isa) {
  std::vector<StepResult> out(reqs.size());
  // Request i to engine i mod n; each engine runs its requests one after
  // another on its own pool, the engines side by side.
  std::vector<std::thread> drivers;
  for (size_t e = 0; e < engines_.size(); e++)
    drivers.emplace_back([&, e] {
      for (size_t i = e; i < reqs.size(); i += engines_.size()) out[i] = engines_[e]->step(reqs[i], isa);
    });
  for (auto& t : drivers) t.join();
  return out;
}

}  // namespace cxlkv::pnm
