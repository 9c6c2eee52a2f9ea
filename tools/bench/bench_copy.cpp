// SPDX-License-Identifier: MIT
// copy: gather-writing one KV block (64 chunks of 32 KiB = 2 MiB, one 16-token
// Llama-3.1-8B block: 32 layers x K/V x 8 KV heads x 128 x bf16 x 16 tokens)
// into a shm pool, three ways over the same sources and destinations:
//
//   copy.memcpy_gbps          plain memcpy, no flush (not visible to other
//                             hosts: the baseline for raw copy speed)
//   copy.memcpy_clflush_gbps  memcpy then clflush every line + mfence (the
//                             naive correct way, rule 3)
//   copy.ntstore_gbps         gather_write() on the pool's flush-mode domain
//                             (non-temporal stores + mfence, rule 3)
//
// The destination cycles over 256 distinct blocks (512 MiB, far beyond the
// LLC), so every block is cold, as a pool block being filled is.  Each method
// runs a warm-up pass, then several passes interleaved with the others; the
// figure is the median pass.  Also reported: the NT path with odd chunk
// sizes and alignments (copy.ntstore_unaligned_gbps), each NT instruction
// path the CPU has (copy.ntstore_<path>_gbps) and the read side
// (copy.read_memcpy_gbps, copy.scatter_read_gbps: invalidate + load, rules 4/6).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "coherence/cpu_paths.hpp"
#include "cxlkv/region.hpp"
#include "transfer/cpu_copy.hpp"

namespace {

using namespace cxlkv;

constexpr size_t kChunks = 64;
constexpr size_t kChunkBytes = 32 << 10;
constexpr size_t kBlockBytes = kChunks * kChunkBytes;  // 2 MiB
constexpr size_t kBlocks = 256;                        // 512 MiB of destinations
constexpr size_t kPoolBytes = kBlocks * kBlockBytes + (64 << 20);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds for one pass: fn(block pointer) over every destination block.
double pass(std::byte* dst, const std::function<void(void*)>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < kBlocks; b++) fn(dst + b * kBlockBytes);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_copy(bench::Results& res) {
  const std::string name = bench::shm_name("copy");
  const std::string uri = "shm:" + name + ":" + std::to_string(kPoolBytes >> 20) + "M";
  auto pool = Region::format(uri, {.size = kPoolBytes});
  if (!pool) {
    std::fprintf(stderr, "bench copy: %s\n", pool.error().message().c_str());
    return;
  }
  auto carve = (*pool)->carve_create("bench", kBlocks * kBlockBytes, MemType::wb);
  if (!carve) {
    std::fprintf(stderr, "bench copy: %s\n", carve.error().message().c_str());
    (*pool).reset();
    unlink(("/dev/shm/" + name).c_str());
    return;
  }
  std::byte* dst = (*pool)->at(carve->offset);

  // Sources: 64 separate 32 KiB tensor slices (page aligned, as engine
  // allocations are), random contents.
  std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> src;
  std::vector<Chunk> chunks;
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < kChunks; i++) {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, kChunkBytes));
    for (size_t j = 0; j < kChunkBytes; j += 8) {
      const uint64_t v = rng();
      std::memcpy(p + j, &v, 8);
    }
    src.emplace_back(p, &std::free);
    chunks.push_back({p, kChunkBytes});
  }
  std::vector<std::byte> readback(kBlockBytes);
  std::vector<Chunk> read_chunks;
  for (size_t i = 0; i < kChunks; i++) read_chunks.push_back({readback.data() + i * kChunkBytes, kChunkBytes});

  // Fault in the whole destination once, so no method pays for page faults.
  std::memset(dst, 0, kBlocks * kBlockBytes);

  // The pool's own domain: flush mode, make_host_domain's CPUID choice (or
  // the CXLKV_FLUSH / CXLKV_NTCOPY override).
  MemoryDomain& pool_domain = (*pool)->domain();
  std::fprintf(stderr, "bench copy: pool %s, domain %s\n", uri.c_str(),
               pool_domain.describe().c_str());

  struct Method {
    std::string metric;
    std::function<void(void*)> fn;
    std::vector<double> gbps;
  };
  std::vector<Method> methods;
  methods.push_back({"copy.memcpy_gbps", [&](void* blk) {
                       auto* d = static_cast<std::byte*>(blk);
                       for (auto& c : chunks) {
                         std::memcpy(d, c.addr, c.len);
                         d += c.len;
                       }
                     }, {}});
  methods.push_back({"copy.memcpy_clflush_gbps", [&](void* blk) {
                       auto* d = static_cast<std::byte*>(blk);
                       for (auto& c : chunks) {
                         std::memcpy(d, c.addr, c.len);
                         d += c.len;
                       }
                       pool_domain.flush(blk, kBlockBytes);  // rule 3: clflush every line
                       pool_domain.fence();
                     }, {}});
  methods.push_back({"copy.ntstore_gbps", [&](void* blk) {
                       if (!gather_write(pool_domain, blk, chunks)) std::abort();
                     }, {}});
  // Odd chunk sizes and source alignments: every chunk boundary in the block
  // falls mid-line, so each chunk pays the NT head/tail path (movnti /
  // maskmovdqu) on top of the whole-line loop.
  std::vector<Chunk> odd_chunks;
  for (size_t i = 0; i < kChunks; i++)
    odd_chunks.push_back({static_cast<std::byte*>(chunks[i].addr) + 3, kChunkBytes - 5});
  methods.push_back({"copy.ntstore_unaligned_gbps", [&](void* blk) {
                       if (!gather_write(pool_domain, blk, odd_chunks)) std::abort();
                     }, {}});
  // Every NT path this CPU has, for the record.
  std::vector<std::unique_ptr<MemoryDomain>> paths;
  for (auto insn : {NtCopyInsn::sse2, NtCopyInsn::avx2, NtCopyInsn::avx512}) {
    if (!coherence::cpu_has(insn)) continue;
    paths.push_back(make_host_domain({.force_ntcopy = coherence::ntcopy_name(insn)}));
    MemoryDomain* d = paths.back().get();
    methods.push_back({std::string("copy.ntstore_") + coherence::ntcopy_name(insn) + "_gbps",
                       [d, &chunks](void* blk) {
                         if (!gather_write(*d, blk, chunks)) std::abort();
                       }, {}});
  }
  // Read side: plain memcpy out (stale-capable) vs scatter_read (invalidate first).
  methods.push_back({"copy.read_memcpy_gbps", [&](void* blk) {
                       auto* s = static_cast<std::byte*>(blk);
                       for (auto& c : read_chunks) {
                         std::memcpy(c.addr, s, c.len);
                         s += c.len;
                       }
                     }, {}});
  methods.push_back({"copy.scatter_read_gbps", [&](void* blk) {
                       if (!scatter_read(pool_domain, blk, read_chunks)) std::abort();
                     }, {}});

  const int reps = std::max(3, static_cast<int>(7 * bench::scale()));
  for (auto& m : methods) pass(dst, m.fn);  // warm-up
  for (int r = 0; r < reps; r++)
    for (auto& m : methods) {
      const double bytes = m.metric == "copy.ntstore_unaligned_gbps"
                               ? double(kBlocks) * kChunks * (kChunkBytes - 5)
                               : double(kBlocks) * kBlockBytes;
      m.gbps.push_back(bytes / pass(dst, m.fn) / 1e9);
    }

  // Check the copy really happened: the last pass of every method left block 0
  // equal to the sources.
  if (!gather_write(pool_domain, dst, chunks)) std::abort();
  for (size_t i = 0; i < kChunks; i++)
    if (std::memcmp(dst + i * kChunkBytes, chunks[i].addr, kChunkBytes) != 0) {
      std::fprintf(stderr, "bench copy: block content mismatch at chunk %zu\n", i);
      std::abort();
    }

  for (auto& m : methods) {
    const double med = median(m.gbps);
    res.set(m.metric, med);
    std::fprintf(stderr, "bench copy: %-28s median %6.2f GB/s (min %.2f max %.2f, %d passes)\n",
                 m.metric.c_str(), med, *std::min_element(m.gbps.begin(), m.gbps.end()),
                 *std::max_element(m.gbps.begin(), m.gbps.end()), reps);
  }
  const double memcpy_g = median(methods[0].gbps), clflush_g = median(methods[1].gbps),
               nt_g = median(methods[2].gbps);
  res.set("copy.ntstore_vs_memcpy", nt_g / memcpy_g);
  res.set("copy.ntstore_vs_clflush", nt_g / clflush_g);
  std::fprintf(stderr, "bench copy: ntstore/memcpy %.2f (target >= 0.8), ntstore/(memcpy+clflush) %.2f (target >= 1.5)\n",
               nt_g / memcpy_g, nt_g / clflush_g);

  paths.clear();
  (*pool).reset();
  unlink(("/dev/shm/" + name).c_str());
}

}  // namespace

CXLKV_BENCH({"copy", "gather-write 64 x 32 KiB chunks into a shm pool: memcpy, memcpy+clflush, NT stores",
             run_copy});
