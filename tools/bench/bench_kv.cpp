// SPDX-License-Identifier: MIT
// KV block transfer benchmarks, 2 MiB blocks (Llama-3.1-8B geometry: 64
// chunks of 32 KiB per 16-token block), flush-mode domain over shm pools:
//   kv.memcpy_baseline_gbps      plain memcpy of the same bytes into the pool (baseline)
//   kv.gather_write_gbps         the same chunks gathered into pool blocks, no index (baseline of publish)
//   kv.scatter_read_gbps         pool blocks scattered into the same chunks, no index (baseline of fetch)
//   kv.publish_gbps              reserve + gather-write + publish (single-block calls)
//   kv.fetch_gbps                pin + scatter-read + unpin (single-block calls)
// (publish / fetch and their baselines run interleaved in rounds of 32
// blocks; each figure is the median of its rounds)
//   kv.interleave2_publish_gbps  publish with payload striped over two pools
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench.hpp"
#include "cxlkv/layout.hpp"
#include "kv_bench_support.hpp"
#include "transfer/cpu_copy.hpp"

namespace {

using clk = std::chrono::steady_clock;
constexpr uint64_t kBlock = 2ull << 20;

struct Engine {
  Engine() : layout(cxlkv::llama31_8b_layout(16)) {
    size_t per = layout.chunk_bytes() * layout.num_blocks;
    store.resize(per * 2 * layout.num_layers);
    for (size_t i = 0; i < store.size(); i += 4096) store[i] = std::byte(i >> 12);
    for (uint32_t i = 0; i < 2 * layout.num_layers; i++) layout.bases.push_back(store.data() + i * per);
  }
  std::vector<cxlkv::Chunk> chunks(uint32_t b) {
    uint32_t id = b % layout.num_blocks;
    return cxlkv::chunks_for_blocks(layout, {&id, 1}).value();
  }
  cxlkv::EngineLayout layout;
  std::vector<std::byte> store;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Publishes `n` blocks (capacity-bounded pool evicts as it goes); GB/s.
double publish_rate(bench::BenchPool& p, Engine& e, uint64_t tag, size_t n) {
  size_t done = 0;
  auto t0 = clk::now();
  for (size_t i = 0; i < n; i++) {
    uint64_t id = tag + i;
    auto k = cxlkv::keys_from_ids({&id, 1})[0];
    auto r = p.kv->reserve(k, nullptr, kBlock);
    if (!r || !r->reserved()) continue;
    auto ch = e.chunks(uint32_t(i));
    if (p.kv->write(*r, ch) && p.kv->publish(*r)) done++;
  }
  double sec = std::chrono::duration<double>(clk::now() - t0).count();
  return double(done * kBlock) / sec / 1e9;
}

void bench_kv(bench::Results& res) {
  Engine e;
  const size_t n = std::max<size_t>(64, size_t(512 * bench::scale()));
  {
    bench::BenchPool p;
    // 1 GiB pool, at most 192 blocks cached (older ones are evicted as in service).
    if (!p.open("kv", 1ull << 30, 1, 0, 192)) {
      std::fprintf(stderr, "bench kv: %s\n", p.error.c_str());
      return;
    }
    // Baseline: memcpy of the same 64 chunks into the pool's kv carve.
    auto kc = p.regions[0]->carve(CXLKV_CARVE_KV).value();
    std::byte* dst = p.regions[0]->at(kc.offset);
    const size_t slots = std::min<size_t>(192, kc.size / kBlock);
    // Warm-up pass: fault in the destination pages, as the pool's are below.
    for (size_t i = 0; i < slots; i++) std::memset(dst + i * kBlock, 0, kBlock);
    auto t0 = clk::now();
    for (size_t i = 0; i < n; i++) {
      std::byte* d = dst + (i % slots) * kBlock;
      for (auto& c : e.chunks(uint32_t(i))) {
        std::memcpy(d, c.addr, c.len);
        d += c.len;
      }
    }
    double sec = std::chrono::duration<double>(clk::now() - t0).count();
    res.set("kv.memcpy_baseline_gbps", double(n * kBlock) / sec / 1e9);

    // publish / fetch beside their baselines, the raw copy of the same
    // engine chunks into / out of the same pool (flush-mode domain, no
    // index work): interleaved in rounds of 32 blocks so that each pair
    // runs under the same load, each figure the median of its rounds.
    cxlkv::MemoryDomain& dom = p.regions[0]->domain();
    (void)publish_rate(p, e, 0x5000000, 256);  // warm-up: fault in the pool pages
    constexpr size_t kRound = 32;
    std::vector<double> gw, sr, pub, fet;
    for (size_t r = 0; r * kRound < n; r++) {
      t0 = clk::now();
      for (size_t i = 0; i < kRound; i++)
        (void)cxlkv::gather_write(dom, dst + ((r * kRound + i) % slots) * kBlock, e.chunks(uint32_t(i)));
      gw.push_back(double(kRound * kBlock) / std::chrono::duration<double>(clk::now() - t0).count() / 1e9);
      pub.push_back(publish_rate(p, e, 0x6000000 + r * kRound, kRound));
      t0 = clk::now();
      for (size_t i = 0; i < kRound; i++)
        (void)cxlkv::scatter_read(dom, dst + ((r * kRound + i) % slots) * kBlock, e.chunks(uint32_t(i)));
      sr.push_back(double(kRound * kBlock) / std::chrono::duration<double>(clk::now() - t0).count() / 1e9);
      // Fetch: the blocks this round published (cached: the pool holds 192).
      size_t got = 0;
      t0 = clk::now();
      for (size_t i = 0; i < kRound; i++) {
        uint64_t id = 0x6000000 + r * kRound + i;
        auto pin = p.kv->pin(cxlkv::keys_from_ids({&id, 1})[0]);
        if (!pin) continue;
        if (p.kv->fetch(*pin, e.chunks(uint32_t(i)))) got++;
        (void)p.kv->unpin(*pin);
      }
      fet.push_back(double(got * kBlock) / std::chrono::duration<double>(clk::now() - t0).count() / 1e9);
    }
    res.set("kv.gather_write_gbps", median(gw));
    res.set("kv.publish_gbps", median(pub));
    res.set("kv.scatter_read_gbps", median(sr));
    res.set("kv.fetch_gbps", median(fet));
  }
  {
    bench::BenchPool p;
    if (!p.open("kv2", 1ull << 30, 2, 0, 192)) {
      std::fprintf(stderr, "bench kv interleave: %s\n", p.error.c_str());
      return;
    }
    (void)publish_rate(p, e, 0x7000000, 256);
    res.set("kv.interleave2_publish_gbps", publish_rate(p, e, 0x8000000, n));
  }
}

}  // namespace

CXLKV_BENCH({"kv", "KV block publish / fetch (2 MiB, 64 chunks) beside memcpy; two-pool interleave", bench_kv});
