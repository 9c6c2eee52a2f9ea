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

#include "bench.hpp"
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
  ops.stream_destroy(stream);
}

}  // namespace

CXLKV_BENCH({"gpu", "batched GPU gather/scatter kernels vs cudaMemcpyAsync; sparse read", run_gpu});
