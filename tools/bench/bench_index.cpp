// SPDX-License-Identifier: MIT
// Prefix index benchmarks (flush-mode domain over a shm pool):
//   index.lookup_chain8192_us_p99         longest cached prefix of an 8192-block chain, binary search
//   index.lookup_linear_chain8192_us_p99  the same by linear scan (the baseline)
//   index.insert_mops                     reserve + publish of root blocks (no payload copy)
//   index.lookup_mops                     lock-free find of a cached key
//   index.evict_reads_per_eviction        entry + ext reads spent choosing each victim (pool-wide lists)
//     (the window scan the lists replaced read about 191 entries per victim)
//   index.reserve_evict_us                reserve + publish of a root block that evicts one (lists)
//   index.reserve_noevict_us              the same in the same pool while it fills (no eviction): the baseline
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "bench.hpp"
#include "kv_bench_support.hpp"
#include "kv/store_index.hpp"

namespace {

using clk = std::chrono::steady_clock;

double p99(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(double(v.size()) * 0.99))];
}

// Eviction cost: a pool capped at 4096 blocks in a 131072-slot table, full;
// every further root reserve evicts one block.
void bench_eviction(bench::Results& res) {
  bench::BenchPool p;
  if (!p.open("index-evict", 512ull << 20, 1, 1u << 17, 4096)) {
    std::fprintf(stderr, "bench index: %s\n", p.error.c_str());
    return;
  }
  cxlkv::KvStore& kv = *p.kv;
  cxlkv::PrefixIndex& ix = store_index(kv);
  auto put_roots = [&](uint64_t base, size_t n) {
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
      uint64_t id = base + i;
      auto k = cxlkv::keys_from_ids({&id, 1})[0];
      auto r = kv.reserve(k, nullptr, 64);
      if (r && r->reserved() && kv.publish(*r)) ok++;
    }
    return ok;
  };
  // Filling the empty pool: reserves that do not evict (the baseline).
  auto tf = clk::now();
  const size_t filled = put_roots(0x5e0000000000ull, 4096);
  const double fill_us = std::chrono::duration<double, std::micro>(clk::now() - tf).count();
  res.set("index.reserve_noevict_us", filled ? fill_us / double(filled) : 0);
  const size_t n = std::max<size_t>(500, size_t(8000 * bench::scale()));
  cxlkv::IndexCounters c0 = ix.counters();
  auto t0 = clk::now();
  size_t ok = put_roots(0x5e1000000000ull, n);
  double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
  cxlkv::IndexCounters c1 = ix.counters();
  const double ev = double(c1.evictions - c0.evictions);
  if (ok != n || ev < double(n)) std::fprintf(stderr, "bench index: %zu of %zu evicting inserts, %.0f evictions\n", ok, n, ev);
  res.set("index.evict_reads_per_eviction", ev ? double(c1.victim_reads - c0.victim_reads) / ev : 0);
  res.set("index.reserve_evict_us", ok ? us / double(ok) : 0);
}

void bench_index(bench::Results& res) {
  bench::BenchPool p;
  if (!p.open("index", 512ull << 20, 1, 1u << 17)) {
    std::fprintf(stderr, "bench index: %s\n", p.error.c_str());
    return;
  }
  cxlkv::KvStore& kv = *p.kv;
  // An 8192-block chain with its first 6000 blocks cached (64 B payloads).
  std::vector<uint64_t> ids(8192);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = 0xc0ffee000000ull + i;
  auto chain = cxlkv::keys_from_ids(ids);
  std::vector<std::byte> buf(64);
  cxlkv::Chunk ch{buf.data(), buf.size()};
  for (size_t i = 0; i < 6000; i++) {
    auto r = kv.reserve(chain[i], i ? &chain[i - 1] : nullptr, 64);
    if (!r || !r->reserved() || !kv.write(*r, {&ch, 1}) || !kv.publish(*r)) {
      std::fprintf(stderr, "bench index: chain insert failed at %zu\n", i);
      return;
    }
  }
  const int nbin = std::max(20, int(400 * bench::scale())), nlin = std::max(5, int(30 * bench::scale()));
  std::vector<double> tb, tl;
  for (int i = 0; i < nbin; i++) {
    auto t0 = clk::now();
    size_t n = store_index(kv).longest_prefix(chain);
    tb.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
    if (n != 6000) std::fprintf(stderr, "bench index: binary search found %zu\n", n);
  }
  for (int i = 0; i < nlin; i++) {
    auto t0 = clk::now();
    size_t n = store_index(kv).longest_prefix_linear(chain);
    tl.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
    if (n != 6000) std::fprintf(stderr, "bench index: linear scan found %zu\n", n);
  }
  res.set("index.lookup_chain8192_us_p99", p99(tb));
  res.set("index.lookup_linear_chain8192_us_p99", p99(tl));

  // Inserts: root blocks, reserve + publish (metadata only: 64 B payload, no copy).
  const size_t nins = std::max<size_t>(2000, size_t(40000 * bench::scale()));
  std::vector<uint64_t> rid(nins);
  for (size_t i = 0; i < nins; i++) rid[i] = 0xabc0000000000ull + i;
  std::vector<cxlkv::BlockKey> roots;
  for (size_t i = 0; i < nins; i++) roots.push_back(cxlkv::keys_from_ids({&rid[i], 1})[0]);
  auto t0 = clk::now();
  size_t ok = 0;
  for (auto& k : roots) {
    auto r = kv.reserve(k, nullptr, 64);
    if (r && r->reserved() && kv.publish(*r)) ok++;
  }
  double sec = std::chrono::duration<double>(clk::now() - t0).count();
  res.set("index.insert_mops", double(ok) / sec / 1e6);

  std::mt19937_64 rng(1);
  const size_t nlook = nins * 4;
  t0 = clk::now();
  size_t found = 0;
  for (size_t i = 0; i < nlook; i++) found += store_index(kv).find_ready(roots[rng() % ok]) != CXLKV_INDEX_NO_SLOT;
  sec = std::chrono::duration<double>(clk::now() - t0).count();
  res.set("index.lookup_mops", double(nlook) / sec / 1e6);
  if (found != nlook) std::fprintf(stderr, "bench index: %zu of %zu lookups missed\n", nlook - found, nlook);
  bench_eviction(res);
}

}  // namespace

CXLKV_BENCH({"index", "prefix index: binary vs linear longest-prefix lookup, insert and lookup rates", bench_index});
