// SPDX-License-Identifier: MIT
// Near-memory engine benchmarks (docs/near-memory.md), each beside its same-run baseline:
//   pnm.digest_gbps            CPU digest build (min/max of 16-token pages of
//                              bf16 keys, 128 MiB, cold) vs pnm.read_memcpy_gbps,
//                              a memcpy read of the same bytes in 32 KiB pieces
//                              (the method of copy.read_memcpy_gbps)
//   pnm.select_ms_128k         score + top-K of one decode step of one request,
//                              Llama-3.1-8B geometry (32 layers, 8 KV heads,
//                              32 query heads, head 128, bf16), 128K tokens;
//                              bound: its digests read at pnm.read_memcpy_gbps
//   pnm.select_ms_1m           the same at 1M tokens, all 32 layers (their
//                              digests are 8.6 GiB) when the machine has that
//                              much memory available with 4 GiB to spare, else
//                              4 of the 32 layers (1 GiB); pnm.select_1m_layers
//                              says which, pnm.select_ms_1m_bound likewise;
//                              _4layers, _1layer, _8layers, _per_layer,
//                              select_1m_linearity and _32layers_est (32 x the
//                              8-layer per-layer time) with _32layers_bound: the
//                              scaling over layers
//   pnm.attention_ms_budget2048  attention of one step over the 2048-token budget,
//                              all 32 layers, real bf16 KV (a 2560-token context),
//                              one engine thread, the pool on 4 KiB pages; bound: the
//                              selected K/V read at pnm.attention_read_memcpy_gbps
//                              (one thread's memcpy read of 128 MiB of the same
//                              pool mapping in 32 KiB pieces, beside each of the 5
//                              steps; pnm.attention_private_read_memcpy_gbps: the
//                              same read of a private buffer, the bound's source
//                              before); _scattered_read: those rows memcpy'd where
//                              they lie; pnm.attention_cpu_ms_budget2048 (_bound):
//                              the same attention and memcpy in the thread's CPU
//                              time; _2m (_bound, pnm.attention_2m_read_memcpy_gbps):
//                              the pool on 2 MiB pages (MADV_HUGEPAGE;
//                              pnm.attention_2m_huge_share of the K/V got them);
//                              _2threads: two engine threads, bound read by two
//                              threads at once (pnm.attention_2threads_read_memcpy_gbps)
//   pnm.bytes_over_link_ratio  bytes to the GPU per step with near-memory
//                              attention / recalling the selected pages
//                              (_all_128k, _all_1m: / recalling every page)
//   pnm.attention_mass_budget{256,2048}  attention mass the selection keeps on
//                              the planted-needle set (32K tokens);
//                              pnm.needle_recall_budget{256,2048}: the share of
//                              planted needle pages selected, every (layer, head)
// Digest kinds (docs/near-memory.md#digest-kinds): every selection and
// quality figure above is today's min/max digests; the same with suffix
// _q8 (int8 min/max, a scale per row), _minmax_g16 and _q8_g16 (two levels:
// a group digest per 16 pages scored first, then the best groups' pages),
// each with pnm.select_bytes_<size>[_kind]: the digest bytes one step reads;
// pnm.select_ms_{128k,1m}_default: the kind a context made with the default
// geometry gets at those sizes (group size pnm.select_default_group_pages).
// Selection contexts hold digests of pages that sit in untouched memory of a
// sparse (MAP_NORESERVE) pool: scoring reads digests only.  The pool is read
// through a coherent domain (as a near-memory processor sees its own memory);
// pnm.select_ms_128k_flush is the same step on a write-back mapping of
// non-coherent memory (rule 4: every digest range invalidated first).
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"
#include "pnm/dtype.hpp"
#include "pnm/synthetic.hpp"

namespace {

using namespace cxlkv;
using namespace cxlkv::pnm;
using Clock = std::chrono::steady_clock;

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// This thread's CPU time in seconds: what a step cost while it ran, without
// the time other processes of a shared machine held the CPU.
double thread_cpu_secs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Anonymous memory that is committed only where touched.
struct Sparse {
  explicit Sparse(uint64_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("bench pnm: mmap");
      std::abort();
    }
  }
  ~Sparse() { munmap(p, bytes); }
  uint64_t bytes;
  void* p;
};

// A "Name: N kB" field of a /proc file in bytes (0 when it cannot be read).
uint64_t proc_kb_field(const char* path, const char* name) {
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  const std::string fmt = std::string(name) + ": %llu kB";
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, fmt.c_str(), &kib) == 1) break;
  std::fclose(f);
  return uint64_t(kib) * 1024;
}

uint64_t mem_available_bytes() { return proc_kb_field("/proc/meminfo", "MemAvailable"); }

// This process's anonymous memory on transparent 2 MiB pages.
uint64_t anon_huge_bytes() { return proc_kb_field("/proc/self/smaps_rollup", "AnonHugePages"); }

[[noreturn]] void fail(const std::string& m) {
  std::fprintf(stderr, "bench pnm: %s\n", m.c_str());
  std::abort();
}

template <class T>
T must(Result<T> r) {
  if (!r.ok()) fail(r.error().message());
  return std::move(r.value());
}

std::unique_ptr<Region> memory_pool(Sparse& s, DomainMode mode, bool format) {
  OpenOptions oo;
  oo.domain.mode = mode;
  return must(format ? Region::format_memory("pnm-bench", s.p, s.bytes, FormatOptions{}, oo)
                     : Region::open_memory("pnm-bench", s.p, s.bytes, oo));
}

Geometry llama(uint32_t layers, uint64_t tokens) { return Geometry{layers, 8, 128, Dtype::bf16, 16, tokens}; }

// ---- digest build rate vs memcpy read ---------------------------------------

double read_gbps_of(const std::vector<unsigned char>& src) {
  std::vector<unsigned char> dst(32 << 10);
  std::vector<double> v;
  for (int r = 0; r < 3; r++) {
    auto t0 = Clock::now();
    for (size_t o = 0; o < src.size(); o += dst.size()) std::memcpy(dst.data(), src.data() + o, dst.size());
    v.push_back(double(src.size()) / secs(t0) / 1e9);
    asm volatile("" ::"r"(dst.data()) : "memory");
  }
  return median(v);
}

void bench_digest(bench::Results& res, double& read_gbps) {
  const size_t bytes = 128ull << 20, dim = 128, pt = 16, es = 2;
  std::vector<unsigned char> keys(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t x = rng() & 0x3fff3fff3fff3fffull;  // finite bf16 values
    std::memcpy(&keys[i], &x, 8);
  }
  std::vector<unsigned char> dig(2 * dim * es);
  const size_t page = pt * dim * es;
  std::vector<double> dg, rd;
  for (int r = 0; r < 3; r++) {
    auto t0 = Clock::now();
    for (size_t o = 0; o < bytes; o += page)
      detail::digest_rows(Dtype::bf16, keys.data() + o, pt, dim, dig.data(), true);
    dg.push_back(double(bytes) / secs(t0) / 1e9);
    asm volatile("" ::"r"(dig.data()) : "memory");
    rd.push_back(read_gbps_of(keys));
  }
  read_gbps = median(rd);
  res.set("pnm.digest_gbps", median(dg));
  res.set("pnm.read_memcpy_gbps", read_gbps);
  res.set("pnm.digest_vs_read_ratio", median(dg) / read_gbps);
  std::printf("pnm: digest build %.2f GB/s of keys, memcpy read %.2f GB/s (ratio %.2f)\n", median(dg), read_gbps,
              median(dg) / read_gbps);
}

// ---- selection at 128K and 1M tokens ------------------------------------------

// A digest kind as the benchmarks name it.
struct Kind {
  DigestKind digest = DigestKind::minmax;
  uint32_t group_pages = 1;  // Geometry::group_pages: 1 one level (today's), else pages a group
  std::string suffix() const {
    std::string s;
    if (digest != DigestKind::minmax || group_pages > 1) s = std::string("_") + to_string(digest);
    if (group_pages > 1) s += "_g" + std::to_string(group_pages);
    return s;
  }
  std::string name() const { return suffix().empty() ? "minmax (today)" : suffix().substr(1); }
};

struct SelectRun {
  double ms = 0, ms_flush = 0;
  uint64_t digest_bytes = 0;  // every page's min/max digest (today's bytes, the bound's)
  uint64_t read_bytes = 0;    // what one step of this kind read
};

uint64_t row_bytes(const Kind& k) { return k.digest == DigestKind::q8 ? 8 + 2 * 128 : 2 * 128 * 2; }

SelectRun bench_select(uint32_t layers, uint64_t tokens, bool flush_too, const Kind& kind = {}) {
  Geometry g = llama(layers, tokens);
  g.digest = kind.digest;
  g.group_pages = kind.group_pages;
  const uint32_t np = uint32_t(tokens / 16), q_heads = 32;
  const uint64_t page_bytes = uint64_t(layers) * 2 * 8 * 16 * 128 * 2;
  const uint64_t dig_bytes = uint64_t(layers) * 8 * np * 2 * 128 * 2;
  const uint64_t area = digest_area_bytes(g);
  const uint64_t carve = (area + uint64_t(np) * 8 + (8ull << 20) + (2ull << 20) - 1) & ~((2ull << 20) - 1);
  const uint64_t pages_off = (4ull << 20) + carve;
  Sparse mem(pages_off + uint64_t(np) * page_bytes + (2ull << 20));
  auto region = memory_pool(mem, DomainMode::coherent, true);
  StoreOptions so;
  so.carve_bytes = carve;
  so.partitions = 1;
  so.slots_per_partition = 2;
  auto store = must(ContextStore::open(*region, so));
  auto ctx = must(store->create(1, g));
  // Pages of the sparse pool (never touched), digests in blocks of 256 pages.
  const uint32_t blk = 256;
  const std::vector<unsigned char> digs = random_digests(g, blk, 7);
  std::vector<uint64_t> offs(blk);
  for (uint32_t p0 = 0; p0 < np; p0 += blk) {
    for (uint32_t i = 0; i < blk; i++) offs[i] = pages_off + uint64_t(p0 + i) * page_bytes;
    if (auto r = ctx->append_pages(offs, digs.data(), uint64_t(blk) * 16); !r.ok()) fail(r.error().message());
  }
  NeedleSet ns(g, q_heads, tokens, 0);
  SelectRun out;
  auto time_steps = [&](Context& c, int reps) {
    std::vector<double> v;
    for (int r = 0; r < reps; r++) {
      const std::vector<float> q = ns.queries(r);
      auto t0 = Clock::now();
      // Selection only: the engine's select phase, all layers and heads.
      auto sel = select_pages(c, q, q_heads, tokens, SelectOptions{});
      v.push_back(secs(t0) * 1e3);
      if (!sel.ok()) fail(sel.error().message());
      out.read_bytes = sel->digest_bytes;
    }
    return median(v);
  };
  out.ms = time_steps(*ctx, 3);
  out.digest_bytes = dig_bytes;
  if (flush_too) {
    auto fr = memory_pool(mem, DomainMode::flush, false);
    StoreOptions ro = so;
    ro.writer = false;
    auto rs = must(ContextStore::open(*fr, ro));
    auto rc = must(rs->find(1));
    out.ms_flush = time_steps(*rc, 1);
  }
  return out;
}

// ---- attention over a 2048-token budget, real KV ------------------------------

struct AttnRun {
  double ms = 0, scattered_ms = 0, read_gbps = 0;
  double private_read_gbps = 0;  // the same read of a private buffer (the bound before it read the pool)
  double cpu_ms = 0, cpu_read_gbps = 0;  // the same in this thread's CPU time (one engine thread)
  uint64_t kv_bytes = 0, near = 0, selected = 0;
  double huge_share = 0;  // of the context's K/V, on 2 MiB pages
};

// 128 MiB of the pool read in 32 KiB pieces (the method of
// read_gbps_of) from the context's first pages where they lie: the same
// mapping and page size the step reads.  With several threads each reads
// its share of the pages at once, as the engine's threads share a step.
double pool_read_gbps(const Region& region, const std::vector<uint64_t>& table, uint64_t page_bytes,
                      uint32_t threads) {
  const uint64_t pages = (128ull << 20) / page_bytes;
  if (table.size() < pages) fail("attention bench: fewer than 128 MiB of pages to read");
  auto read = [&](uint32_t t) {
    std::vector<unsigned char> dst(32 << 10);
    for (uint64_t p = t; p < pages; p += threads) {
      const auto* src = reinterpret_cast<const unsigned char*>(region.at(table[p]));
      for (uint64_t o = 0; o < page_bytes; o += dst.size()) std::memcpy(dst.data(), src + o, dst.size());
    }
    asm volatile("" ::"r"(dst.data()) : "memory");
  };
  std::vector<double> v;
  for (int r = 0; r < 3; r++) {
    auto t0 = Clock::now();
    std::vector<std::thread> others;
    for (uint32_t t = 1; t < threads; t++) others.emplace_back(read, t);
    read(0);
    for (auto& t : others) t.join();
    v.push_back(double(pages * page_bytes) / secs(t0) / 1e9);
  }
  return median(v);
}

// One step's attention, 5 steps, each beside its bound's read rate.  The
// pool is anonymous memory on 4 KiB pages, or (huge_pages) on 2 MiB pages
// where the kernel gives them (MADV_HUGEPAGE; huge_share says how much it
// gave), as device-dax maps a CXL pool.
AttnRun bench_attention(bool huge_pages, uint32_t threads) {
  const uint64_t tokens = 2560;
  const Geometry g = llama(32, tokens);
  const uint32_t q_heads = 32;
  const uint64_t kv = tokens * 32 * 8 * 128 * 2 * 2;
  Sparse mem(kv + (64ull << 20));
  if (huge_pages) (void)madvise(mem.p, mem.bytes, MADV_HUGEPAGE);
  const uint64_t huge0 = anon_huge_bytes();
  auto region = memory_pool(mem, DomainMode::coherent, true);
  StoreOptions so;
  so.carve_bytes = (kv + (32ull << 20)) & ~((2ull << 20) - 1);
  so.partitions = 1;
  so.slots_per_partition = 2;
  auto store = must(ContextStore::open(*region, so));
  auto ctx = must(store->create(1, g));
  NeedleSet ns(g, q_heads, tokens, 8);
  std::vector<unsigned char> k, v;
  for (uint64_t t = 0; t < tokens; t += 256) {
    ns.make_kv(t, 256, k, v);
    if (auto r = ctx->append(k.data(), v.data(), 256); !r.ok()) fail(r.error().message());
  }
  AttnRun out;
  out.huge_share = std::min(1.0, double(anon_huge_bytes() - std::min(anon_huge_bytes(), huge0)) / double(kv));
  std::vector<uint64_t> table(ctx->pages_for(tokens));
  if (auto t = ctx->read_page_table(0, uint32_t(table.size()), table.data()); !t.ok()) fail(t.error().message());
  Engine eng({threads, -1});
  std::vector<double> ms, scattered, gbps, cpu_ms, cpu_gbps, private_gbps;
  // A private buffer on 4 KiB pages, read as the bound reads the pool.
  std::vector<unsigned char> priv(threads == 1 && !huge_pages ? 128ull << 20 : 0);
  for (size_t i = 0; i < priv.size(); i += 4096) priv[i] = static_cast<unsigned char>(i >> 12);
  // The bound's read rate is measured beside each step (not minutes
  // earlier with the digest build): on a shared machine the rate moves
  // with the other work, and the ratio is only meaningful against a rate
  // from the same moment.
  for (int r = 0; r < 5; r++) {
    // A private buffer read the same way, beside the pool's read: whether
    // the pool's pages read as fast as other memory (on 4 KiB pages they
    // have not: docs/near-memory.md "Attention at the read bound").
    if (!priv.empty()) private_gbps.push_back(read_gbps_of(priv));
    const double c0 = thread_cpu_secs();
    gbps.push_back(pool_read_gbps(*region, table, ctx->page_bytes(), threads));
    cpu_gbps.push_back(3 * double(128ull << 20) / (thread_cpu_secs() - c0) / 1e9);
    const std::vector<float> q = ns.queries(r);
    StepRequest rq;
    rq.ctx = ctx.get();
    rq.queries = q;
    rq.q_heads = q_heads;
    rq.ntokens = tokens;
    rq.select.token_budget = 2048;
    StepResult res = eng.step(rq);
    if (!res.status.ok()) fail(res.status.error().message());
    ms.push_back(res.attend_ms);
    out.kv_bytes = res.kv_bytes;
    out.near = res.link_bytes_near;
    out.selected = res.link_bytes_selected;
    if (threads != 1) continue;
    // The same attention (the step's selection) in CPU time: the engine
    // has one thread, this one.
    const double c1 = thread_cpu_secs();
    auto part = attend(*ctx, q, q_heads, tokens, &res.selection);
    cpu_ms.push_back((thread_cpu_secs() - c1) * 1e3);
    if (!part.ok()) fail(part.error().message());
    // The same rows memcpy'd where they lie (a page's rows of one head, a
    // page apart): the read alone in the step's own access pattern.
    std::vector<unsigned char> dst(16 * 128 * 2);
    auto t0 = Clock::now();
    for (uint32_t l = 0; l < g.layers; l++)
      for (uint32_t h = 0; h < g.kv_heads; h++)
        for (uint32_t kv = 0; kv < 2; kv++)
          for (uint32_t p : res.selection.at(l, h)) {
            const void* src = ctx->rows_in_place(table[p], l, kv, h);
            if (!src) fail("attention bench: rows not in place");
            std::memcpy(dst.data(), src, dst.size());
            asm volatile("" ::"r"(dst.data()) : "memory");
          }
    scattered.push_back(secs(t0) * 1e3);
  }
  out.ms = median(ms);
  out.read_gbps = median(gbps);
  if (threads == 1) {
    out.scattered_ms = median(scattered);
    if (!private_gbps.empty()) out.private_read_gbps = median(private_gbps);
    out.cpu_ms = median(cpu_ms);
    out.cpu_read_gbps = median(cpu_gbps);
  }
  return out;
}

// ---- selection quality on the planted-needle set ---------------------------------

struct Quality {
  double mass = 0, recall = 0;
};

// Attention mass kept (exp(lse_selected - lse_all), averaged over query heads
// and steps) and needle recall (needle pages selected / needle pages, over
// every (layer, KV head)) at each budget, on the 32K-token planted-needle
// context written with digest kind `kind`: the same keys for every kind.
std::vector<Quality> attention_quality(const Kind& kind, const std::vector<uint64_t>& budgets) {
  const uint64_t tokens = 32768;
  Geometry g{2, 8, 128, Dtype::bf16, 16, tokens, kind.digest, kind.group_pages};
  const uint32_t q_heads = 32;
  const uint64_t kv = tokens * 2 * 8 * 128 * 2 * 2;
  Sparse mem(kv + (64ull << 20));
  auto region = memory_pool(mem, DomainMode::coherent, true);
  StoreOptions so;
  so.carve_bytes = (kv + (32ull << 20)) & ~((2ull << 20) - 1);
  so.partitions = 1;
  so.slots_per_partition = 2;
  auto store = must(ContextStore::open(*region, so));
  auto ctx = must(store->create(1, g));
  NeedleSet ns(g, q_heads, tokens, 16);
  std::vector<unsigned char> k, v;
  for (uint64_t t = 0; t < tokens; t += 1024) {
    ns.make_kv(t, 1024, k, v);
    if (auto r = ctx->append(k.data(), v.data(), 1024); !r.ok()) fail(r.error().message());
  }
  std::vector<uint32_t> needle_pages;
  for (uint64_t t : ns.needles) needle_pages.push_back(uint32_t(t / 16));
  needle_pages.erase(std::unique(needle_pages.begin(), needle_pages.end()), needle_pages.end());
  Engine eng({1, -1});
  const int steps = 3;
  std::vector<Quality> out(budgets.size());
  for (int s = 0; s < steps; s++) {
    const std::vector<float> q = ns.queries(s);
    StepRequest rq;
    rq.ctx = ctx.get();
    rq.queries = q;
    rq.q_heads = q_heads;
    rq.ntokens = tokens;
    rq.all_pages = true;
    StepResult all = eng.step(rq);
    if (!all.status.ok()) fail("attention mass step failed: " + all.status.error().message());
    rq.all_pages = false;
    for (size_t b = 0; b < budgets.size(); b++) {
      rq.select.token_budget = budgets[b];
      StepResult sel = eng.step(rq);
      if (!sel.status.ok()) fail("attention mass step failed: " + sel.status.error().message());
      double m = 0;
      for (size_t i = 0; i < sel.partial.lse.size(); i++)
        m += std::exp(double(sel.partial.lse[i]) - all.partial.lse[i]);
      out[b].mass += m / double(sel.partial.lse.size()) / steps;
      uint64_t found = 0;
      for (const auto& pages : sel.selection.pages)
        for (uint32_t p : needle_pages) found += std::binary_search(pages.begin(), pages.end(), p);
      out[b].recall +=
          double(found) / double(needle_pages.size() * sel.selection.pages.size()) / steps;
    }
  }
  return out;
}

// Today's digests first, then the kinds that read fewer bytes.
std::vector<Kind> kinds() {
  return {{DigestKind::minmax, 1}, {DigestKind::q8, 1}, {DigestKind::minmax, 16}, {DigestKind::q8, 16}};
}

// One kind's selection at 128K tokens and at 1M tokens (all 32 layers when
// the machine has the memory, as for today's digests, else 4 layers), with
// the bytes each step read.
void bench_select_kind(bench::Results& res, const Kind& kind, double read_gbps) {
  const SelectRun s128 = bench_select(32, 128 * 1024, false, kind);
  const double bound128 = double(s128.digest_bytes) / (read_gbps * 1e9) * 1e3;
  res.set("pnm.select_ms_128k" + kind.suffix(), s128.ms);
  res.set("pnm.select_bytes_128k" + kind.suffix(), double(s128.read_bytes));
  std::printf("pnm: select 128K tokens (32 layers), %s: %.1f ms, %.1f MiB read per step (today's bound %.1f ms)\n",
              kind.name().c_str(), s128.ms, double(s128.read_bytes) / double(1 << 20), bound128);
  const uint64_t need = uint64_t(32) * 8 * (1 << 16) * row_bytes(kind);
  const uint32_t layers = mem_available_bytes() >= need + (4ull << 30) ? 32 : 4;
  const SelectRun s1m = bench_select(layers, 1024 * 1024, false, kind);
  const double bound1m = double(s1m.digest_bytes) / (read_gbps * 1e9) * 1e3;
  res.set("pnm.select_ms_1m" + kind.suffix(), s1m.ms);
  res.set("pnm.select_bytes_1m" + kind.suffix(), double(s1m.read_bytes));
  res.set("pnm.select_1m_layers" + kind.suffix(), layers);
  std::printf("pnm: select 1M tokens (%u layers), %s: %.1f ms, %.1f MiB read per step (today's bound %.1f ms)\n",
              layers, kind.name().c_str(), s1m.ms, double(s1m.read_bytes) / double(1 << 20), bound1m);
  // What a context made with the default geometry (group_pages 0: the
  // store's choice, docs/near-memory.md#digest-kinds) gets at these sizes.
  Geometry dflt = llama(32, 1024 * 1024);
  dflt.group_pages = 0;
  const uint32_t chosen = effective_group_pages(dflt);
  dflt.max_tokens = 128 * 1024;
  if (effective_group_pages(dflt) != chosen) fail("default group size differs between 128K and 1M tokens");
  if (kind.digest == dflt.digest && kind.group_pages == (chosen ? chosen : 1)) {
    res.set("pnm.select_ms_128k_default", s128.ms);
    res.set("pnm.select_ms_1m_default", s1m.ms);
    res.set("pnm.select_bytes_1m_default", double(s1m.read_bytes));
    res.set("pnm.select_default_group_pages", chosen);
    std::printf("pnm: the default geometry at 128K and 1M tokens is %s\n", kind.name().c_str());
  }
}

void run_pnm(bench::Results& res) {
  double read_gbps = 0;
  bench_digest(res, read_gbps);

  SelectRun s128 = bench_select(32, 128 * 1024, true);
  const double bound128 = double(s128.digest_bytes) / (read_gbps * 1e9) * 1e3;
  res.set("pnm.select_ms_128k", s128.ms);
  res.set("pnm.select_ms_128k_bound", bound128);
  res.set("pnm.select_ms_128k_flush", s128.ms_flush);
  res.set("pnm.select_bytes_128k", double(s128.read_bytes));
  std::printf("pnm: select 128K tokens (32 layers): %.1f ms (bound %.1f ms; %.1f ms invalidating first)\n", s128.ms,
              bound128, s128.ms_flush);

  SelectRun s1m = bench_select(4, 1024 * 1024, false);
  const double bound1m = double(s1m.digest_bytes) / (read_gbps * 1e9) * 1e3;
  res.set("pnm.select_ms_1m_4layers", s1m.ms);
  res.set("pnm.select_ms_1m_4layers_bound", bound1m);
  std::printf("pnm: select 1M tokens (4 of 32 layers): %.1f ms (bound %.1f ms)\n", s1m.ms, bound1m);

  // All 32 layers at 1M tokens: their digests are 8.6 GiB.  Measured directly
  // where the machine has that much memory available with 4 GiB to spare;
  // on a smaller or busier machine pnm.select_ms_1m is the 4-layer step and
  // pnm.select_1m_layers says so.  Selection reads each layer's digests once
  // (a stream, no reuse across layers or heads), so its time is linear in the
  // layers: measured at 1, 4 and 8 layers (8: 2.1 GiB) as well, with the
  // 32-layer estimate (32 x the 8-layer per-layer time, named so) beside the
  // 32-layer bound.  In a real decode step layer l's queries exist only after
  // layer l-1 ran, so each layer's selection is a separate per-layer step
  // (pnm.select_ms_1m_per_layer) anyway.
  const uint64_t dig32 = s1m.digest_bytes * 8;
  if (mem_available_bytes() >= dig32 + (4ull << 30)) {
    SelectRun s1m32 = bench_select(32, 1024 * 1024, false);
    const double bound32 = double(s1m32.digest_bytes) / (read_gbps * 1e9) * 1e3;
    res.set("pnm.select_ms_1m", s1m32.ms);
    res.set("pnm.select_bytes_1m", double(s1m32.read_bytes));
    res.set("pnm.select_ms_1m_bound", bound32);
    res.set("pnm.select_1m_layers", 32);
    std::printf("pnm: select 1M tokens (all 32 layers, %.1f GiB of digests): %.1f ms (bound %.1f ms)\n",
                double(s1m32.digest_bytes) / double(1ull << 30), s1m32.ms, bound32);
  } else {
    res.set("pnm.select_ms_1m", s1m.ms);
    res.set("pnm.select_bytes_1m", double(s1m.read_bytes));
    res.set("pnm.select_ms_1m_bound", bound1m);
    res.set("pnm.select_1m_layers", 4);
    std::printf("pnm: select 1M tokens: %.1f GiB of memory available, all 32 layers need %.1f GiB + 4 GiB spare; "
                "pnm.select_ms_1m is the 4-layer step\n",
                double(mem_available_bytes()) / double(1ull << 30), double(dig32) / double(1ull << 30));
  }
  SelectRun s1m1 = bench_select(1, 1024 * 1024, false);
  SelectRun s1m8 = bench_select(8, 1024 * 1024, false);
  const double per_layer = s1m8.ms / 8, bound1m32 = bound1m * 8;
  res.set("pnm.select_ms_1m_1layer", s1m1.ms);
  res.set("pnm.select_ms_1m_8layers", s1m8.ms);
  res.set("pnm.select_ms_1m_per_layer", per_layer);
  res.set("pnm.select_1m_linearity", per_layer / s1m1.ms);  // 1.0: per-layer time independent of layer count
  res.set("pnm.select_ms_1m_32layers_est", 32 * per_layer);
  res.set("pnm.select_ms_1m_32layers_bound", bound1m32);
  std::printf("pnm: select 1M tokens: 1 layer %.1f ms, 8 layers %.1f ms (%.1f ms/layer, %.2fx the 1-layer time); "
              "32 layers est. %.0f ms (bound %.0f ms)\n",
              s1m1.ms, s1m8.ms, per_layer, per_layer / s1m1.ms, 32 * per_layer, bound1m32);

  for (const Kind& kind : kinds())
    if (!kind.suffix().empty()) bench_select_kind(res, kind, read_gbps);

  AttnRun at = bench_attention(false, 1);
  const double abound = double(at.kv_bytes) / (at.read_gbps * 1e9) * 1e3;
  res.set("pnm.attention_read_memcpy_gbps", at.read_gbps);
  res.set("pnm.attention_private_read_memcpy_gbps", at.private_read_gbps);
  const double cbound = double(at.kv_bytes) / (at.cpu_read_gbps * 1e9) * 1e3;
  res.set("pnm.attention_cpu_ms_budget2048", at.cpu_ms);
  res.set("pnm.attention_cpu_ms_budget2048_bound", cbound);
  res.set("pnm.attention_ms_budget2048", at.ms);
  res.set("pnm.attention_ms_budget2048_bound", abound);
  res.set("pnm.attention_ms_budget2048_scattered_read", at.scattered_ms);
  std::printf("pnm: the same in CPU time: %.1f ms, bound %.1f ms (%.2fx); a private buffer read at %.1f GB/s "
              "beside the pool's %.1f GB/s\n",
              at.cpu_ms, cbound, at.cpu_ms / cbound, at.private_read_gbps, at.read_gbps);
  // The pool on 2 MiB pages, and two engine threads against two threads'
  // read rate: each beside its own bound.
  auto variant = [&](const std::string& sfx, const AttnRun& a, const char* what) {
    const double b = double(a.kv_bytes) / (a.read_gbps * 1e9) * 1e3;
    res.set("pnm.attention_ms_budget2048" + sfx, a.ms);
    res.set("pnm.attention_ms_budget2048" + sfx + "_bound", b);
    res.set("pnm.attention" + sfx + "_read_memcpy_gbps", a.read_gbps);
    std::printf("pnm: attention over 2048 tokens x 32 layers, %s: %.1f ms (bound %.1f ms at %.1f GB/s, %.2fx)\n",
                what, a.ms, b, a.read_gbps, a.ms / b);
  };
  const AttnRun at2m = bench_attention(true, 1);
  variant("_2m", at2m, "pool on 2 MiB pages");
  res.set("pnm.attention_2m_huge_share", at2m.huge_share);
  std::printf("pnm: %.0f%% of that pool's K/V was on 2 MiB pages\n", 100 * at2m.huge_share);
  variant("_2threads", bench_attention(false, 2), "two engine threads, bound read by two threads");
  // Link bytes per step: near-memory attention moves queries + output + lse;
  // recalling moves the selected pages' K and V, or every page's.
  const double all128 = 128.0 * 1024 * 32 * 8 * 128 * 2 * 2, all1m = all128 * 8;
  res.set("pnm.bytes_over_link_ratio", double(at.near) / double(at.selected));
  res.set("pnm.bytes_over_link_ratio_all_128k", double(at.near) / all128);
  res.set("pnm.bytes_over_link_ratio_all_1m", double(at.near) / all1m);
  std::printf("pnm: attention over 2048 tokens x 32 layers: %.1f ms (bound %.1f ms at %.1f GB/s read from the same pool beside it, "
              "%.2fx; the same rows memcpy'd where they lie %.1f ms); link bytes %llu near vs %llu selected pages\n",
              at.ms, abound, at.read_gbps, at.ms / abound, at.scattered_ms, (unsigned long long)at.near, (unsigned long long)at.selected);

  for (const Kind& kind : kinds()) {
    const std::vector<uint64_t> budgets = {256, 2048};
    const std::vector<Quality> qs = attention_quality(kind, budgets);
    for (size_t b = 0; b < budgets.size(); b++) {
      const std::string bs = std::to_string(budgets[b]);
      res.set("pnm.attention_mass_budget" + bs + kind.suffix(), qs[b].mass);
      res.set("pnm.needle_recall_budget" + bs + kind.suffix(), qs[b].recall);
      std::printf("pnm: planted-needle set (32K tokens), %s, budget %s: attention mass kept %.4f, needle recall "
                  "%.4f\n",
                  kind.name().c_str(), bs.c_str(), qs[b].mass, qs[b].recall);
    }
  }
}

}  // namespace

CXLKV_BENCH({"pnm", "near-memory engine: digest build, page selection at 128K / 1M tokens, attention, link bytes",
             run_pnm});
