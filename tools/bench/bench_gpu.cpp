// SPDX-License-Identifier: MIT
// cxlkv-bench gpu: batched gather / scatter kernels against cudaMemcpyAsync.
//
//   gpu.gather_gbps             64 Llama-3.1-8B 16-token blocks (64 chunks x 32 KiB
//                               each) from a layer-first paged GPU cache into
//                               pinned pool blocks, one launch per batch
//   gpu.scatter_gbps            the same batch back from the pool
//   gpu.memcpy_per_chunk_gbps   baseline: one cudaMemcpyAsync per chunk (GPU -> pool)
//   gpu.memcpy_bulk_gbps        baseline: one contiguous GPU -> pinned copy (the link)
//   gpu.memcpy_per_chunk_h2d_gbps, gpu.memcpy_bulk_h2d_gbps: the same, pool -> GPU
//   gpu.sparse_read_us          16 sparse tokens of every (layer, KV head, K|V) of
//                               Llama-3-8B (32 x 8 x 2 lists, 160-byte pieces)
//   gpu.sparse_memcpy_us        baseline: one cudaMemcpyAsync per piece
//
// The GPU path's tiers, pinning and layer-wise transfers (docs/gpu.md; each
// beside its baseline in the same run):
//   gpu.gather_gbps_chunk_{4,16,32}k, gpu.scatter_gbps_chunk_{4,16,32}k
//                               paged caches whose (layer, K|V) slice of a
//                               block is 4, 16, 32 KiB (24 layers), ~128 MiB
//                               batches; beside gpu.memcpy_per_chunk_gbps_chunk_*
//                               (one cudaMemcpyAsync per chunk), gpu.two_step_gbps_chunk_*
//                               (gather into a contiguous device buffer, then one
//                               copy; the reverse for scatter: *_h2d_*) and bulk
//   gpu.kv_publish_gbps, gpu.kv_fetch_gbps
//                               cxlkv_kv_gpu_put_chain / _get_many of 32 Llama
//                               blocks (index work included) beside gpu.memcpy_bulk_gbps
//   gpu.first_fetch_after_open_ms  open a sparse 64 GiB pool for the GPU and
//                               scatter one block from its middle (on-demand pin
//                               of one chunk included)
//   gpu.layerwise_first_layer_ms, gpu.layerwise_full_fetch_ms
//                               a 32K-token Llama-3.1-8B prefix (2048 blocks, 4 GiB):
//                               until layer 0 is usable / until every layer is
//                               (target first <= full / 16)
//   gpu.fetch_one_block_us      cxlkv_kv_gpu_get_many of one 2 MiB block, beside
//                               gpu.memcpy_one_block_us (one cudaMemcpyAsync)
//
// The bench links libcxlkv only and reaches CUDA through the runtime loader;
// without a GPU it says why and records no metric.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "bench.hpp"
#include "cxlkv/cxlkv.h"
#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"

namespace {

using namespace cxlkv::gpu;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct DeviceTensors {
  explicit DeviceTensors(const cxlkv_cuda_ops& o) : ops(o) {}
  ~DeviceTensors() {
    for (void* p : ptrs) ops.device_free(p);
  }
  const cxlkv_cuda_ops& ops;
  std::vector<void*> ptrs;
};

struct PoolMapping {
  explicit PoolMapping(size_t n) : size(n) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<unsigned char*>(m);
  }
  ~PoolMapping() {
    if (p) munmap(p, size);
  }
  unsigned char* p;
  size_t size;
};

// Median seconds of `iters` runs of fn (each ends with a stream sync).
template <class F>
double median_seconds(int iters, F&& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < iters; i++) {
    auto t0 = Clock::now();
    if (!fn()) return -1;
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

bool ok(int rc, const cxlkv_cuda_ops& ops, const char* what) {
  if (rc < 0) std::fprintf(stderr, "gpu: %s failed: %s\n", what, ops.last_error());
  return rc >= 0;
}

// ---- tiers, pinning and layer-wise transfers (docs/gpu.md) ---------------------

void put_metric(bench::Results& res, const std::string& prefix, const std::string& m, double v, const char* unit) {
  res.set(prefix + m, v);
  std::fprintf(stderr, "gpu: %-40s %10.3f %s\n", (prefix + m).c_str(), v, unit);
}

// Small-chunk gather / scatter beside per-chunk memcpy, two-step and bulk.
void small_chunks(bench::Results& res, const std::shared_ptr<CudaLibrary>& lib, const std::string& prefix,
                  void* stream, int iters, bool reference) {
  const cxlkv_cuda_ops& ops = lib->ops();
  for (uint32_t kib : {4u, 16u, 32u}) {
    // 24 layers x 2 KV heads x 64 x fp16: 16 tokens give 4 KiB slices.
    PagedLayout l;
    l.kind = LayoutKind::layer_first;
    l.num_layers = 24;
    l.num_kv_heads = 2;
    l.head_size = 64;
    l.elem_bytes = 2;
    l.block_tokens = 16 * kib / 4;
    const uint64_t target = reference ? (4ull << 20) : (128ull << 20);
    const uint64_t batch = std::max<uint64_t>(1, target / l.block_bytes());
    l.num_blocks = 2 * batch;
    DeviceTensors dev(ops);
    for (uint32_t t = 0; t < 2 * l.num_layers; t++) {
      void* p = nullptr;
      if (!ok(ops.device_alloc(&p, l.num_blocks * l.chunk_bytes()), ops, "device_alloc")) return;
      dev.ptrs.push_back(p);
      l.tensors.push_back(reinterpret_cast<uintptr_t>(p));
    }
    const uint64_t bytes = batch * l.block_bytes();
    PoolMapping pool(bytes);
    void* contig = nullptr;
    if (!pool.p || !ok(ops.device_alloc(&contig, bytes), ops, "device_alloc")) return;
    dev.ptrs.push_back(contig);
    auto gp = GpuPool::open(lib, pool.p, pool.size);
    if (!gp) return (void)std::fprintf(stderr, "gpu: %s\n", gp.error().message().c_str());
    GpuPool& g = *gp.value();
    std::vector<uint64_t> ids(l.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(kib));
    ids.resize(batch);
    std::vector<uint64_t> offs(batch);
    for (uint64_t i = 0; i < batch; i++) offs[i] = i * l.block_bytes();
    // The two-step baseline's device-side gather (index_select-like) into a contiguous buffer.
    std::vector<cxlkv_copy_desc> d2d;
    for (uint64_t i = 0; i < batch; i++)
      for (uint32_t t = 0; t < 2 * l.num_layers; t++)
        d2d.push_back({l.tensors[t] + ids[i] * l.chunk_bytes(),
                       reinterpret_cast<uintptr_t>(contig) + i * l.block_bytes() + t * l.chunk_bytes(), l.chunk_bytes()});
    std::vector<cxlkv_copy_desc> d2d_back = d2d;
    for (auto& d : d2d_back) std::swap(d.src, d.dst);
    auto per_chunk = [&](bool d2h) {
      for (uint64_t i = 0; i < batch; i++)
        for (uint32_t t = 0; t < 2 * l.num_layers; t++) {
          void* gpu = reinterpret_cast<void*>(l.tensors[t] + ids[i] * l.chunk_bytes());
          void* host = pool.p + offs[i] + t * l.chunk_bytes();
          if (ops.memcpy_async(d2h ? host : gpu, d2h ? gpu : host, l.chunk_bytes(), stream) < 0) return false;
        }
      return ops.stream_sync(stream) == 0;
    };
    const double tg = median_seconds(iters, [&] { return g.gather(l, ids, offs, stream).ok() && g.sync(stream).ok(); });
    const double ts = median_seconds(iters, [&] { return g.scatter(l, ids, offs, stream).ok() && g.sync(stream).ok(); });
    const double tpc = median_seconds(iters, [&] { return per_chunk(true); });
    const double tpc_h = median_seconds(iters, [&] { return per_chunk(false); });
    const double t2 = median_seconds(iters, [&] {
      return ops.copy(d2d.data(), d2d.size(), stream) == 0 && ops.memcpy_async(pool.p, contig, bytes, stream) == 0 &&
             ops.stream_sync(stream) == 0;
    });
    const double t2_h = median_seconds(iters, [&] {
      return ops.memcpy_async(contig, pool.p, bytes, stream) == 0 &&
             ops.copy(d2d_back.data(), d2d_back.size(), stream) == 0 && ops.stream_sync(stream) == 0;
    });
    const double tb = median_seconds(iters, [&] {
      return ops.memcpy_async(pool.p, contig, bytes, stream) == 0 && ops.stream_sync(stream) == 0;
    });
    if (tg < 0 || ts < 0 || tpc < 0 || tpc_h < 0 || t2 < 0 || t2_h < 0 || tb < 0) {
      std::fprintf(stderr, "gpu: chunk %uk: a copy failed: %s\n", kib, ops.last_error());
      continue;
    }
    auto gb = [&](double t) { return bytes / t / 1e9; };
    const std::string k = "_chunk_" + std::to_string(kib) + "k";
    put_metric(res, prefix, "gather_gbps" + k, gb(tg), "GB/s");
    put_metric(res, prefix, "scatter_gbps" + k, gb(ts), "GB/s");
    put_metric(res, prefix, "memcpy_per_chunk_gbps" + k, gb(tpc), "GB/s");
    put_metric(res, prefix, "memcpy_per_chunk_h2d_gbps" + k, gb(tpc_h), "GB/s");
    put_metric(res, prefix, "two_step_gbps" + k, gb(t2), "GB/s");
    put_metric(res, prefix, "two_step_h2d_gbps" + k, gb(t2_h), "GB/s");
    put_metric(res, prefix, "memcpy_bulk_gbps" + k, gb(tb), "GB/s");
    std::fprintf(stderr, "gpu: chunk %2u KiB: gather %.2fx bulk, %.2fx two-step; scatter %.2fx two-step "
                 "(targets >= 0.85x bulk, >= 1x two-step)\n", kib, tb / tg, t2 / tg, t2_h / ts);
  }
}

// A formatted shm pool with a lock manager, a KV store and the GPU opened over it (C API).
struct KvPool {
  KvPool(const char* tag, uint64_t size, bool reference) {
    name = std::string("cxlkv-bench-gpu-") + tag + "-" + std::to_string(getpid());
    uri = "shm:" + name + ":" + std::to_string(size);
    cxlkv_format_opts fo{};
    fo.size = sizeof fo;
    fo.max_nodes = 4;
    if (cxlkv_pool_format(uri.c_str(), &fo) || cxlkv_pool_open(uri.c_str(), &pool)) { fail(); return; }
    cxlkv_lock_manager_opts mo{};
    mo.size = sizeof mo;
    if (cxlkv_lock_manager_start(pool, &mo, &mgr)) { fail(); return; }
    cxlkv_kv_opts ko{};
    ko.size = sizeof ko;
    ko.node = 1;
    if (cxlkv_kv_open(pool, &ko, &kv)) { fail(); return; }
    cxlkv_gpu_opts go{sizeof go, reference ? CXLKV_GPU_F_CPU_REFERENCE : 0u, 0, 0};
    if (cxlkv_gpu_open_pool(pool, &go, &gpu)) { fail(); return; }
    ready = true;
  }
  void fail() { std::fprintf(stderr, "gpu: kv pool %s: %s\n", uri.c_str(), cxlkv_last_error()); }
  ~KvPool() {
    if (gpu) cxlkv_gpu_close(gpu);
    if (kv) cxlkv_kv_close(kv);
    if (mgr) cxlkv_lock_manager_stop(mgr);
    if (pool) {
      cxlkv_node_remove_local(pool, 1);
      cxlkv_pool_close(pool);
    }
    shm_unlink(("/" + name).c_str());
  }
  std::string name, uri;
  cxlkv_pool* pool = nullptr;
  cxlkv_lock_manager* mgr = nullptr;
  cxlkv_kv* kv = nullptr;
  cxlkv_gpu* gpu = nullptr;
  bool ready = false;
};

cxlkv_gpu_layout c_layout(const PagedLayout& l) {
  cxlkv_gpu_layout c{};
  c.size = sizeof c;
  c.kind = static_cast<uint32_t>(l.kind);
  c.num_layers = l.num_layers;
  c.num_kv_heads = l.num_kv_heads;
  c.head_size = l.head_size;
  c.block_tokens = l.block_tokens;
  c.elem_bytes = l.elem_bytes;
  c.num_blocks = l.num_blocks;
  c.tensors = l.tensors.data();
  c.ntensors = l.tensors.size();
  return c;
}

void run_issue15(bench::Results& res, const std::shared_ptr<CudaLibrary>& lib, GpuPool& g0, const std::string& prefix,
                 void* stream, int iters, bool reference) {
  (void)g0;
  const cxlkv_cuda_ops& ops = lib->ops();
  small_chunks(res, lib, prefix, stream, iters, reference);

  // ---- KV store batches, one block, layer-wise: a Llama-3.1-8B cache on the GPU.
  const uint64_t prefix_blocks = reference ? 16 : 2048;  // 32K tokens of 16-token blocks
  const uint64_t kv_batch = reference ? 4 : 32;
  PagedLayout l = PagedLayout::llama31_8b(LayoutKind::block_first, prefix_blocks + kv_batch, {});
  DeviceTensors dev(ops);
  void* cache = nullptr;
  if (!ok(ops.device_alloc(&cache, l.num_blocks * l.block_bytes()), ops, "device_alloc (Llama cache)")) return;
  dev.ptrs.push_back(cache);
  l.tensors.push_back(reinterpret_cast<uintptr_t>(cache));
  const cxlkv_gpu_layout cl = c_layout(l);
  const uint64_t pool_bytes = (prefix_blocks + 8 * kv_batch) * l.block_bytes() + (512ull << 20);
  KvPool kp("kv", pool_bytes, reference);
  if (!kp.ready) return;
  std::vector<cxlkv_kv_key> keys(prefix_blocks + 8 * kv_batch);
  for (size_t i = 0; i < keys.size(); i++) keys[i] = {0x15000000ull + i, 0xc0ffee};
  std::vector<uint64_t> ids(l.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int32_t> st(keys.size());

  // Publish: fresh keys each round (chains below the previous round's last block).
  int round = 0;
  const double tpub = median_seconds(std::min(iters, 7), [&] {
    const size_t at = prefix_blocks + (round++ % 8) * kv_batch;
    if (round > 8) return true;  // the pool holds 8 rounds; later rounds are warm-up repeats
    int n = cxlkv_kv_gpu_put_chain(kp.kv, kp.gpu, &cl, nullptr, keys.data() + at, ids.data(), kv_batch, stream, st.data());
    return n == static_cast<int>(kv_batch);
  });
  const double tfetch = median_seconds(iters, [&] {
    return cxlkv_kv_gpu_get_many(kp.kv, kp.gpu, &cl, keys.data() + prefix_blocks, ids.data(), kv_batch, stream,
                                 st.data()) == static_cast<int>(kv_batch);
  });
  void* bulk = nullptr;
  PoolMapping host(kv_batch * l.block_bytes());
  double tbulk = -1;
  if (host.p && ok(ops.device_alloc(&bulk, kv_batch * l.block_bytes()), ops, "device_alloc")) {
    dev.ptrs.push_back(bulk);
    auto hp = GpuPool::open(lib, host.p, host.size);  // registered like the pool
    if (hp && hp.value()->pin().pin_all()) {
      tbulk = median_seconds(iters, [&] {
        return ops.memcpy_async(host.p, bulk, host.size, stream) == 0 && ops.stream_sync(stream) == 0;
      });
    }
  }
  if (tpub > 0 && tfetch > 0 && tbulk > 0) {
    const double b = double(kv_batch * l.block_bytes());
    put_metric(res, prefix, "kv_publish_gbps", b / tpub / 1e9, "GB/s");
    put_metric(res, prefix, "kv_fetch_gbps", b / tfetch / 1e9, "GB/s");
    put_metric(res, prefix, "kv_memcpy_bulk_gbps", b / tbulk / 1e9, "GB/s");
    std::fprintf(stderr, "gpu: kv publish %.2fx bulk, kv fetch %.2fx bulk (targets >= 0.9x)\n", tbulk / tpub,
                 tbulk / tfetch);
  } else {
    std::fprintf(stderr, "gpu: kv publish / fetch failed: %s\n", cxlkv_last_error());
  }

  // One block: the engine's smallest fetch.
  const double tone = median_seconds(iters * 10, [&] {
    return cxlkv_kv_gpu_get_many(kp.kv, kp.gpu, &cl, keys.data() + prefix_blocks, ids.data(), 1, stream, st.data()) == 1;
  });
  const double tone_memcpy = median_seconds(iters * 10, [&] {
    return host.p && ops.memcpy_async(bulk, host.p, l.block_bytes(), stream) == 0 && ops.stream_sync(stream) == 0;
  });
  if (tone > 0 && tone_memcpy > 0) {
    put_metric(res, prefix, "fetch_one_block_us", tone * 1e6, "us");
    put_metric(res, prefix, "memcpy_one_block_us", tone_memcpy * 1e6, "us");
  }

  // Layer-wise: a 32K-token prefix, layer groups of 1.
  if (cxlkv_kv_gpu_put_chain(kp.kv, kp.gpu, &cl, nullptr, keys.data(), ids.data(), prefix_blocks, stream, st.data()) ==
      static_cast<int>(prefix_blocks)) {
    std::vector<double> first, full;
    for (int it = 0; it < std::min(iters, 7); it++) {
      cxlkv_gpu_load* load = nullptr;
      const auto t0 = Clock::now();
      int n = cxlkv_kv_gpu_load_layers(kp.kv, kp.gpu, &cl, keys.data(), ids.data(), prefix_blocks, 1, stream,
                                       st.data(), &load);
      if (n != static_cast<int>(prefix_blocks) || !load) break;
      if (cxlkv_gpu_load_wait(load, 0)) break;
      first.push_back(seconds_since(t0));
      if (cxlkv_gpu_load_wait(load, l.num_layers - 1)) break;
      full.push_back(seconds_since(t0));
      cxlkv_gpu_load_finish(load, st.data());
    }
    if (!first.empty() && full.size() == first.size()) {
      std::sort(first.begin(), first.end());
      std::sort(full.begin(), full.end());
      const double f = first[first.size() / 2], a = full[full.size() / 2];
      put_metric(res, prefix, "layerwise_first_layer_ms", f * 1e3, "ms");
      put_metric(res, prefix, "layerwise_full_fetch_ms", a * 1e3, "ms");
      std::fprintf(stderr, "gpu: layer 0 usable after %.3f of the whole fetch (target <= 1/16 = 0.0625)\n", f / a);
    } else {
      std::fprintf(stderr, "gpu: layer-wise load failed: %s\n", cxlkv_last_error());
    }
  } else {
    std::fprintf(stderr, "gpu: publishing the layer-wise prefix failed: %s\n", cxlkv_last_error());
  }

  // First fetch after opening a sparse 64 GiB pool (on-demand pinning).
  if (!reference) {
    const uint64_t big = 64ull << 30;
    const std::string nm = "/cxlkv-bench-gpu-open-" + std::to_string(getpid());
    int fd = shm_open(nm.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(big)) == 0) {
      void* m = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
      if (m != MAP_FAILED) {
        {  // the GpuPool unregisters before the unmap
          const auto t0 = Clock::now();
          auto gp = GpuPool::open(lib, m, big);
          std::vector<uint64_t> one = {0}, off = {big / 2 + 4096};
          bool good = gp && gp.value()->scatter(l, one, off, stream).ok() && gp.value()->sync(stream).ok();
          const double t = seconds_since(t0);
          if (good) put_metric(res, prefix, "first_fetch_after_open_ms", t * 1e3, "ms");
              else std::fprintf(stderr, "gpu: first fetch after open failed: %s\n", gp ? ops.last_error() : gp.error().message().c_str());
        }
        munmap(m, big);
      }
    }
    if (fd >= 0) close(fd);
    shm_unlink(nm.c_str());
  }
}

void run_gpu(bench::Results& res) {
  // CXLKV_GPU_BENCH_BACKEND=cpu-reference runs this harness on the CPU
  // stand-in to check it without a GPU; its figures go under gpu_cpuref.*.
  const char* backend = std::getenv("CXLKV_GPU_BENCH_BACKEND");
  const bool reference = backend && std::string(backend) == "cpu-reference";
  std::shared_ptr<CudaLibrary> lib;
  Status s;
  if (reference) {
    lib = CudaLibrary::cpu_reference();
    s.message = "cpu-reference stand-in (figures are not GPU figures)";
  } else {
    s = probe();
    if (s.availability != Availability::ready) {
      std::fprintf(stderr, "gpu: skipped, no GPU path (%s): %s\n", to_string(s.availability), s.message.c_str());
      return;
    }
    auto libr = CudaLibrary::load();
    if (!libr) {
      std::fprintf(stderr, "gpu: skipped: %s\n", libr.error().message().c_str());
      return;
    }
    lib = libr.value();
  }
  const std::string prefix = reference ? "gpu_cpuref." : "gpu.";
  const cxlkv_cuda_ops& ops = lib->ops();
  std::fprintf(stderr, "gpu: %s\n", s.message.c_str());

  // Layer-first Llama-3.1-8B cache of 256 blocks (64 tensors x 8 MiB) on the GPU.
  const uint64_t cache_blocks = 256, batch = 64;
  PagedLayout l = PagedLayout::llama31_8b(LayoutKind::layer_first, cache_blocks, {});
  DeviceTensors dev(ops);
  for (int i = 0; i < 64; i++) {
    void* p = nullptr;
    if (!ok(ops.device_alloc(&p, cache_blocks * l.chunk_bytes()), ops, "device_alloc")) return;
    dev.ptrs.push_back(p);
    l.tensors.push_back(reinterpret_cast<uintptr_t>(p));
  }
  const uint64_t batch_bytes = batch * l.block_bytes();  // 128 MiB
  PoolMapping pool(batch_bytes);
  if (!pool.p) {
    std::fprintf(stderr, "gpu: skipped: cannot map %llu bytes\n", static_cast<unsigned long long>(batch_bytes));
    return;
  }
  auto gp = GpuPool::open(lib, pool.p, pool.size);
  if (!gp) {
    std::fprintf(stderr, "gpu: skipped: %s\n", gp.error().message().c_str());
    return;
  }
  GpuPool& g = *gp.value();
  std::fprintf(stderr, "gpu: pool pinned by %s\n", to_string(g.pin().method()));
  void* stream = nullptr;
  if (!ok(ops.stream_create(&stream), ops, "stream_create")) return;

  std::vector<uint64_t> ids(cache_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(1));
  ids.resize(batch);
  std::vector<uint64_t> offs(batch);
  for (uint64_t i = 0; i < batch; i++) offs[i] = i * l.block_bytes();

  const int iters = std::max(5, static_cast<int>(20 * bench::scale()));
  auto gbps = [&](double sec) { return sec > 0 ? batch_bytes / sec / 1e9 : 0.0; };
  auto report = [&](const char* m, double v, const char* unit) {
    const std::string name = prefix + (m + 4);  // m is "gpu.<metric>"
    res.set(name, v);
    std::fprintf(stderr, "gpu: %-32s %10.2f %s\n", name.c_str(), v, unit);
  };

  double t_gather = median_seconds(iters, [&] {
    return g.gather(l, ids, offs, stream).ok() && g.sync(stream).ok();
  });
  double t_scatter = median_seconds(iters, [&] {
    return g.scatter(l, ids, offs, stream).ok() && g.sync(stream).ok();
  });

  // Baselines: one cudaMemcpyAsync per 32 KiB chunk, each way.
  auto per_chunk = [&](bool d2h) {
    for (uint64_t i = 0; i < batch; i++)
      for (uint32_t t = 0; t < 64; t++) {
        void* gpu = reinterpret_cast<void*>(l.tensors[t] + ids[i] * l.chunk_bytes());
        void* host = pool.p + offs[i] + t * l.chunk_bytes();
        if (ops.memcpy_async(d2h ? host : gpu, d2h ? gpu : host, l.chunk_bytes(), stream) < 0) return false;
      }
    return ops.stream_sync(stream) == 0;
  };
  double t_chunk_d2h = median_seconds(iters, [&] { return per_chunk(true); });
  double t_chunk_h2d = median_seconds(iters, [&] { return per_chunk(false); });

  // The link's practical limit: one contiguous copy of the batch's size.
  void* bulk = nullptr;
  if (!ok(ops.device_alloc(&bulk, batch_bytes), ops, "device_alloc (bulk)")) return;
  dev.ptrs.push_back(bulk);
  double t_bulk_d2h = median_seconds(iters, [&] {
    return ops.memcpy_async(pool.p, bulk, batch_bytes, stream) == 0 && ops.stream_sync(stream) == 0;
  });
  double t_bulk_h2d = median_seconds(iters, [&] {
    return ops.memcpy_async(bulk, pool.p, batch_bytes, stream) == 0 && ops.stream_sync(stream) == 0;
  });

  if (t_gather < 0 || t_scatter < 0 || t_chunk_d2h < 0 || t_chunk_h2d < 0 || t_bulk_d2h < 0 || t_bulk_h2d < 0) {
    std::fprintf(stderr, "gpu: a copy failed: %s; no metrics recorded\n", ops.last_error());
    ops.stream_destroy(stream);
    return;
  }
  report("gpu.gather_gbps", gbps(t_gather), "GB/s");
  report("gpu.scatter_gbps", gbps(t_scatter), "GB/s");
  report("gpu.memcpy_per_chunk_gbps", gbps(t_chunk_d2h), "GB/s");
  report("gpu.memcpy_per_chunk_h2d_gbps", gbps(t_chunk_h2d), "GB/s");
  report("gpu.memcpy_bulk_gbps", gbps(t_bulk_d2h), "GB/s");
  report("gpu.memcpy_bulk_h2d_gbps", gbps(t_bulk_h2d), "GB/s");
  std::fprintf(stderr, "gpu: gather %.2fx bulk, %.2fx per-chunk; scatter %.2fx bulk, %.2fx per-chunk "
               "(targets: >= 0.8x bulk, >= 3x per-chunk)\n",
               t_bulk_d2h / t_gather, t_chunk_d2h / t_gather, t_bulk_h2d / t_scatter, t_chunk_h2d / t_scatter);

  // Sparse read: Llama-3-8B, 32 layers x 8 KV heads x K|V lists of a
  // 1024-token context laid out token-major (256 B per token and head) in
  // the pool; 16 sparse tokens each, 160-byte pieces.
  const uint64_t ctx = 1024, stride = 256, piece = 160, per_list = 16;
  const size_t nlists = 32 * 8 * 2;
  void* out = nullptr;
  if (!ok(ops.device_alloc(&out, nlists * per_list * piece), ops, "device_alloc (sparse)")) return;
  dev.ptrs.push_back(out);
  std::vector<SparseList> lists;
  std::vector<uint32_t> tokens;
  std::mt19937_64 r(2);
  for (size_t k = 0; k < nlists; k++) {
    lists.push_back({(k * ctx * stride) % (pool.size - ctx * stride), stride,
                     reinterpret_cast<uintptr_t>(out) + k * per_list * piece, piece, per_list, 0});
    for (uint64_t i = 0; i < per_list; i++) tokens.push_back(static_cast<uint32_t>(r() % ctx));
  }
  double t_sparse = median_seconds(iters * 5, [&] {
    return g.sparse_read(lists, tokens, piece, stream).ok() && g.sync(stream).ok();
  });
  double t_sparse_memcpy = median_seconds(iters, [&] {
    size_t p = 0;
    for (const auto& li : lists)
      for (uint32_t i = 0; i < li.count; i++, p++) {
        void* dst = reinterpret_cast<void*>(li.dst + i * li.dst_stride);
        const void* src = pool.p + li.pool_off + tokens[p] * li.pool_stride;
        if (ops.memcpy_async(dst, src, piece, stream) < 0) return false;
      }
    return ops.stream_sync(stream) == 0;
  });
  if (t_sparse > 0 && t_sparse_memcpy > 0) {
    report("gpu.sparse_read_us", t_sparse * 1e6, "us");
    report("gpu.sparse_memcpy_us", t_sparse_memcpy * 1e6, "us");
  }
  run_issue15(res, lib, g, prefix, stream, iters, reference);
  ops.stream_destroy(stream);
}

}  // namespace

CXLKV_BENCH({"gpu", "batched GPU gather/scatter kernels vs cudaMemcpyAsync; sparse read", run_gpu});
