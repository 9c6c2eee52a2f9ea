// SPDX-License-Identifier: MIT
// cxlkv-longctx: builds a long context in a pool (planted-needle synthetic
// KV, or K / V read from files) and runs decode steps on near-memory
// engines, printing per step the time, the bytes that would cross the link
// to the GPU, and the selection quality (see --help).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cxlkv/gpu.hpp"
#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/version.h"
#include "pnm/synthetic.hpp"
#include "pool_fault.hpp"
#include "pool_open.hpp"

namespace {

using namespace cxlkv;
using namespace cxlkv::pnm;

const char* kUsage =
    "usage: cxlkv-longctx [options]\n"
    "\n"
    "Builds one long context in a pool -- K and V in pages of the pool's \"pnm\" carve,\n"
    "with per-page min/max key digests -- and runs decode steps on near-memory\n"
    "engines: score every page against the step's queries, keep the pages of the top\n"
    "--budget tokens (plus sink and local pages), attention over them beside the pool.\n"
    "Each step prints its time, the bytes that cross the link to the GPU (near-memory\n"
    "attention vs recalling the selected pages vs recalling everything) and the\n"
    "selection quality: the fraction of the full softmax attention mass that the\n"
    "selected pages hold (exp(lse_selected - lse_all), averaged over heads), and for\n"
    "synthetic KV the fraction of planted needle pages selected.\n"
    "\n"
    "  --pool URI          pool to use (its pnm carve is made on first use; needs free\n"
    "                      space). Default: a fresh shm pool sized for the context,\n"
    "                      removed at exit\n"
    "  --tokens N          context length (default 32768)\n"
    "  --layers N          (default 2)    --kv-heads N (default 8)   --q-heads N (default 32)\n"
    "  --head-dim N        (default 128)  --page-tokens N (default 16)\n"
    "  --dtype T           bf16 | f16 | f32 (default bf16)\n"
    "  --needles N         planted needle tokens of the synthetic KV (default 16)\n"
    "  --kv-file PREFIX    read K and V from PREFIX.k and PREFIX.v instead: raw arrays\n"
    "                      [layers][kv-heads][tokens][head-dim] of --dtype (e.g. a model's\n"
    "                      cache dumped with numpy .tofile()); queries stay synthetic\n"
    "  --budget N          token budget per (layer, KV head) (default 2048)\n"
    "  --sink N            first pages always kept (default 1)\n"
    "  --local N           most recent pages always kept (default 1)\n"
    "  --coarse            score with max(q.min, q.max) instead of the upper bound\n"
    "  --digest KIND       page digests: minmax (the KV element type, default) or q8 (int8\n"
    "                      with a scale per row, rounded outward: about half the bytes)\n"
    "  --groups N          two-level digests: a group digest per N pages (a power of two)\n"
    "                      scored first, then only the best groups' page digests; 1: one\n"
    "                      level. Default: the store's choice (16 from 4096 pages on)\n"
    "  --refine N          pages whose digests a two-level step reads (default\n"
    "                      max(4 x budget pages, 512))\n"
    "  --steps N           decode steps (default 8); each appends --append tokens first\n"
    "  --append N          tokens appended per step (default 1)\n"
    "  --engines N         near-memory engines (default 1); --threads N per engine (default 2)\n"
    "  --hybrid PAGES      also run the hybrid steady-token mode with PAGES resident pages\n"
    "                      per (layer, KV head), GPU part on the CPU stand-in library\n"
    "  --hybrid-auto       size the hybrid mode's steady set each step from the measured\n"
    "                      step-to-step overlap of the selections (--hybrid: at most that\n"
    "                      many; default the budget's pages)\n"
    "  --no-quality        skip the full-attention pass that measures the attention mass\n"
    "  --json              one JSON object per step instead of the table\n"
    "  --help, --version\n";

struct Args {
  std::string pool, kv_file;
  uint64_t tokens = 32768, budget = 2048;
  uint32_t layers = 2, kv_heads = 8, q_heads = 32, head_dim = 128, page_tokens = 16, needles = 16;
  Dtype dtype = Dtype::bf16;
  DigestKind digest = DigestKind::minmax;
  uint32_t groups = 0, refine = 0;
  uint32_t sink = 1, local = 1, steps = 8, append = 1, engines = 1, threads = 2, hybrid = 0;
  bool coarse = false, quality = true, json = false, hybrid_auto = false;
};

// A fatal error unwinds to main(), so that the destructors remove what the
// run made: the context in the pool, the store's lock file and a pool of its
// own (std::exit skipped them: every error after the pool was made left it,
// often GiBs, in /dev/shm).
struct Fatal {
  std::string message;
  int status;
};
[[noreturn]] void die(const std::string& m, int status = 2) { throw Fatal{m, status}; }

// SIGINT / SIGTERM: stop at the next chunk or step and clean up the same way.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }
void stop_if_signalled() {
  if (int sig = g_stop_signal)
    die(std::string("stopped by signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")", 128 + sig);
}

uint64_t num(const char* flag, const char* v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v, &end, 0);
  if (errno || !end || *end || v[0] == '-') die(std::string(flag) + ": not a number: '" + v + "'");
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    const std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) die(f + " needs a value");
      return argv[++i];
    };
    auto u32 = [&](uint64_t lo, uint64_t hi) {
      const uint64_t x = num(f.c_str(), val());
      if (x < lo || x > hi) die(f + ": " + std::to_string(x) + " outside " + std::to_string(lo) + ".." + std::to_string(hi));
      return static_cast<uint32_t>(x);
    };
    if (f == "--help" || f == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (f == "--version") {
      std::printf("cxlkv-longctx %s\n", CXLKV_VERSION);
      std::exit(0);
    } else if (f == "--pool") a.pool = val();
    else if (f == "--kv-file") a.kv_file = val();
    else if (f == "--tokens") a.tokens = num("--tokens", val());
    else if (f == "--budget") a.budget = num("--budget", val());
    else if (f == "--layers") a.layers = u32(1, 4096);
    else if (f == "--kv-heads") a.kv_heads = u32(1, 4096);
    else if (f == "--q-heads") a.q_heads = u32(1, 65536);
    else if (f == "--head-dim") a.head_dim = u32(1, 4096);
    else if (f == "--page-tokens") a.page_tokens = u32(1, 4096);
    else if (f == "--needles") a.needles = u32(0, 1u << 20);
    else if (f == "--sink") a.sink = u32(0, 1u << 20);
    else if (f == "--local") a.local = u32(0, 1u << 20);
    else if (f == "--steps") a.steps = u32(0, 1u << 20);
    else if (f == "--append") a.append = u32(0, 1u << 20);
    else if (f == "--engines") a.engines = u32(1, 256);
    else if (f == "--threads") a.threads = u32(1, 1024);
    else if (f == "--hybrid") a.hybrid = u32(1, 1u << 20);
    else if (f == "--coarse") a.coarse = true;
    else if (f == "--hybrid-auto") a.hybrid_auto = true;
    else if (f == "--groups") a.groups = u32(1, 1024);
    else if (f == "--refine") a.refine = u32(1, 1u << 30);
    else if (f == "--digest") {
      const std::string k = val();
      if (k == "minmax") a.digest = DigestKind::minmax;
      else if (k == "q8") a.digest = DigestKind::q8;
      else die("--digest: '" + k + "' is not minmax or q8");
    }
    else if (f == "--no-quality") a.quality = false;
    else if (f == "--json") a.json = true;
    else if (f == "--dtype") {
      const std::string t = val();
      if (t == "bf16") a.dtype = Dtype::bf16;
      else if (t == "f16") a.dtype = Dtype::f16;
      else if (t == "f32") a.dtype = Dtype::f32;
      else die("--dtype: '" + t + "' is not bf16, f16 or f32");
    } else die("unknown option '" + f + "' (see --help)");
  }
  if (a.tokens == 0) die("--tokens must be > 0");
  if (a.hybrid_auto && !a.hybrid) a.hybrid = uint32_t(std::max<uint64_t>(1, (a.budget + a.page_tokens - 1) / a.page_tokens));
  if (a.q_heads % a.kv_heads) die("--q-heads must be a multiple of --kv-heads");
  return a;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string human(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  char s[32];
  std::snprintf(s, sizeof s, "%.1f %s", b, u[i]);
  return s;
}

}  // namespace

static int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // the run stops at its next chunk or step, not inside a call
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const uint64_t max_tokens = a.tokens + uint64_t(a.steps) * a.append;
  Geometry g{a.layers, a.kv_heads, a.head_dim, a.dtype, a.page_tokens, max_tokens, a.digest, a.groups};
  const uint64_t pages = (max_tokens + a.page_tokens - 1) / a.page_tokens;
  const uint64_t page_bytes = uint64_t(a.layers) * 2 * a.kv_heads * a.page_tokens * a.head_dim * dtype_size(a.dtype);
  const uint64_t digest_bytes = digest_area_bytes(g);
  const uint32_t groups = effective_group_pages(g);  // what the context is made with (0: one level)
  const uint64_t carve = ((pages * (page_bytes + 8) + digest_bytes + (16ull << 20)) + (2ull << 20) - 1) & ~((2ull << 20) - 1);

  // The pool: the given one, or a fresh shm pool with room for the carve.
  std::string uri = a.pool, shm;
  std::unique_ptr<Region> region;
  if (uri.empty()) {
    shm = "cxlkv-longctx-" + std::to_string(getpid());
    uri = "shm:" + shm + ":" + std::to_string(carve + (4ull << 20));
    FormatOptions fo;
    auto r = Region::format(uri, fo);
    if (!r.ok()) die(r.error().message());
    region = std::move(r.value());
  } else {
    auto r = cxlkv_tools::open_pool(uri);  // its failure printed once (die)
    if (!r.ok()) die(r.error().message());
    region = std::move(r.value());
  }
  cxlkv_tools::report_pool_faults("cxlkv-longctx", uri, region->base(), region->size());
  // A bus error on the pool ends the run in the handler, past the
  // destructors below: it removes the pool of our own and the writer's lock
  // file instead (docs/near-memory.md "Damage and files").
  if (!shm.empty()) cxlkv_tools::remove_on_pool_fault("/dev/shm/" + shm);
  struct Cleanup {
    std::string shm;
    ~Cleanup() {
      if (!shm.empty()) shm_unlink(("/" + shm).c_str());
    }
  } cleanup{shm};

  StoreOptions so;
  so.carve_bytes = carve;
  so.partitions = 1;
  so.slots_per_partition = 4;
  auto store = ContextStore::open(*region, so);
  if (!store.ok()) die(store.error().message());
  if (!(*store)->writer_lock_path().empty()) cxlkv_tools::remove_on_pool_fault((*store)->writer_lock_path());
  const uint64_t rid = (uint64_t(getpid()) << 20) | 1;
  auto ctx = (*store)->create(rid, g);
  if (!ctx.ok()) die(ctx.error().message());
  Context& c = **ctx;
  // Destroyed on every way out (a --pool keeps only a few context slots).
  struct DropContext {
    ContextStore* store;
    uint64_t rid;
    bool armed = true;
    ~DropContext() {
      if (armed) (void)store->destroy(rid);
    }
  } drop{store->get(), rid};

  // Build the context.
  NeedleSet ns(g, a.q_heads, a.tokens, a.kv_file.empty() ? a.needles : 0);
  auto t0 = std::chrono::steady_clock::now();
  double append_ms = 0;  // append() alone: NT copies of K / V, digests, publication
  std::vector<unsigned char> k, v;
  const uint32_t chunk = 1024;
  std::ifstream kf, vf;
  if (!a.kv_file.empty()) {
    kf.open(a.kv_file + ".k", std::ios::binary);
    vf.open(a.kv_file + ".v", std::ios::binary);
    if (!kf || !vf) die("--kv-file: cannot open " + a.kv_file + ".k / .v");
  }
  const size_t row = size_t(a.head_dim) * dtype_size(a.dtype);
  for (uint64_t t = 0; t < a.tokens; t += chunk) {
    stop_if_signalled();
    const uint32_t n = uint32_t(std::min<uint64_t>(chunk, a.tokens - t));
    if (a.kv_file.empty()) {
      ns.make_kv(t, n, k, v);
    } else {
      // [l][h][tokens][d] on disk -> [l][h][n][d] for this chunk.
      k.resize(size_t(a.layers) * a.kv_heads * n * row);
      v.resize(k.size());
      for (uint32_t lh = 0; lh < a.layers * a.kv_heads; lh++) {
        const std::streamoff off = std::streamoff((uint64_t(lh) * a.tokens + t) * row);
        kf.seekg(off);
        vf.seekg(off);
        kf.read(reinterpret_cast<char*>(k.data() + size_t(lh) * n * row), std::streamsize(n * row));
        vf.read(reinterpret_cast<char*>(v.data() + size_t(lh) * n * row), std::streamsize(n * row));
        if (!kf || !vf) die("--kv-file: " + a.kv_file + ".k / .v hold fewer than --tokens tokens of this geometry");
      }
    }
    const auto a0 = std::chrono::steady_clock::now();
    if (auto r = c.append(k.data(), v.data(), n); !r.ok()) die(r.error().message());
    append_ms += ms_since(a0);
  }
  const double build_ms = ms_since(t0);
  const double kv_total = double(a.tokens) * a.layers * a.kv_heads * 2 * row;
  if (!a.json)
    std::printf("context: %llu tokens, %u layers x %u KV heads (%u query heads) x %u, %s, pages of %u tokens, "
                "%s digests%s\n"
                "built in %.0f ms; append %.0f ms (%s of K+V: %.2f GB/s with digests), %zu needles, pool %s\n",
                (unsigned long long)a.tokens, a.layers, a.kv_heads, a.q_heads, a.head_dim, to_string(a.dtype),
                a.page_tokens, to_string(a.digest),
                groups ? (", two levels: a group digest per " + std::to_string(groups) + " pages").c_str() : "",
                build_ms, append_ms, human(kv_total).c_str(), kv_total / append_ms / 1e6, ns.needles.size(),
                uri.c_str());

  // Engines read through their own handle (as a reader on another host would).
  StoreOptions ro = so;
  ro.writer = false;
  auto rstore = ContextStore::open(*region, ro);
  if (!rstore.ok()) die(rstore.error().message());
  auto reader = (*rstore)->find(rid);
  if (!reader.ok()) die(reader.error().message());
  std::vector<EngineOptions> eo(a.engines, EngineOptions{a.threads, -1});
  EngineGroup group(eo);

  std::unique_ptr<gpu::GpuPool> gp;
  std::unique_ptr<HybridRequest> hy;
  if (a.hybrid) {
    auto p = gpu::GpuPool::open(gpu::CudaLibrary::cpu_reference(), region->base(), region->size());
    if (!p.ok()) die(p.error().message());
    gp = std::move(p.value());
    auto h = HybridRequest::create(**reader, *gp, a.hybrid, a.hybrid_auto);
    if (!h.ok()) die(h.error().message());
    hy = std::move(h.value());
  }

  if (!a.json)
    std::printf("%5s %9s %9s %9s %9s %12s %12s %12s %12s %8s %8s%s\n", "step", "tokens", "select", "attend", "total",
                "digest:read", "link:near", "link:sel", "link:all", "mass", "needles",
                a.hybrid ? "   hybrid(ms, recalled, overlap, steady)" : "");
  double sum_ms = 0, sum_mass = 0;
  for (uint32_t s = 0; s < a.steps; s++) {
    stop_if_signalled();
    if (a.append) {
      ns.make_kv(c.tokens(), a.append, k, v);
      if (auto r = c.append(k.data(), v.data(), a.append); !r.ok()) die(r.error().message());
    }
    const std::vector<float> q = ns.queries(s);
    StepRequest rq;
    rq.ctx = reader->get();
    rq.queries = q;
    rq.q_heads = a.q_heads;
    rq.select.token_budget = a.budget;
    rq.select.sink_pages = a.sink;
    rq.select.local_pages = a.local;
    rq.select.mode = a.coarse ? ScoreMode::coarse : ScoreMode::upper_bound;
    rq.select.refine_pages = a.refine;
    auto res = group.step({&rq, 1});
    StepResult& r = res[0];
    if (!r.status.ok()) die(r.status.error().message());
    double mass = NAN, needle_frac = NAN;
    if (a.quality) {
      StepRequest all = rq;
      all.ntokens = r.ntokens;
      all.all_pages = true;
      auto full = group.step({&all, 1});
      if (!full[0].status.ok()) die(full[0].status.error().message());
      double m = 0;
      for (size_t i = 0; i < r.partial.lse.size(); i++) m += std::exp(double(r.partial.lse[i]) - full[0].partial.lse[i]);
      mass = m / double(r.partial.lse.size());
    }
    if (!ns.needles.empty()) {
      uint64_t hit = 0, want = 0;
      for (const auto& sel : r.selection.pages)
        for (uint64_t t : ns.needles) {
          want++;
          hit += std::binary_search(sel.begin(), sel.end(), uint32_t(t / a.page_tokens));
        }
      needle_frac = double(hit) / double(want);
    }
    double hy_ms = 0;
    HybridStats hs;
    if (hy) {
      auto h0 = std::chrono::steady_clock::now();
      auto h = hy->step(q, a.q_heads, r.ntokens, rq.select, &hs);
      if (!h.ok()) die(h.error().message());
      hy_ms = ms_since(h0);
    }
    const double total = r.select_ms + r.attend_ms;
    sum_ms += total;
    sum_mass += std::isnan(mass) ? 0 : mass;
    if (a.json) {
      std::printf("{\"step\": %u, \"tokens\": %llu, \"select_ms\": %.3f, \"attend_ms\": %.3f, \"total_ms\": %.3f, "
                  "\"digest\": \"%s%s\", \"digest_bytes_read\": %llu, "
                  "\"link_bytes_near\": %llu, \"link_bytes_selected\": %llu, \"link_bytes_all\": %llu, "
                  "\"attention_mass\": %s, \"needle_pages_selected\": %s, \"hybrid_ms\": %.3f, "
                  "\"hybrid_recalled\": %u, \"hybrid_recall_bytes\": %llu, \"hybrid_overlap\": %llu, "
                  "\"hybrid_steady\": %llu}\n",
                  s, (unsigned long long)r.ntokens, r.select_ms, r.attend_ms, total, to_string(a.digest),
                  groups ? ("_g" + std::to_string(groups)).c_str() : "", (unsigned long long)r.digest_bytes,
                  (unsigned long long)r.link_bytes_near, (unsigned long long)r.link_bytes_selected,
                  (unsigned long long)r.link_bytes_all, std::isnan(mass) ? "null" : std::to_string(mass).c_str(),
                  std::isnan(needle_frac) ? "null" : std::to_string(needle_frac).c_str(), hy_ms, hs.recalled,
                  (unsigned long long)hs.recall_bytes, (unsigned long long)hs.overlap, (unsigned long long)hs.steady);
    } else {
      char hyb[96] = "";
      if (hy)
        std::snprintf(hyb, sizeof hyb, "   %8.2f %6u %8llu %8llu", hy_ms, hs.recalled, (unsigned long long)hs.overlap,
                      (unsigned long long)hs.steady);
      std::printf("%5u %9llu %7.2fms %7.2fms %7.2fms %12s %12s %12s %12s %8.4f %8.3f%s\n", s,
                  (unsigned long long)r.ntokens, r.select_ms, r.attend_ms, total, human(double(r.digest_bytes)).c_str(),
                  human(double(r.link_bytes_near)).c_str(),
                  human(double(r.link_bytes_selected)).c_str(), human(double(r.link_bytes_all)).c_str(), mass,
                  needle_frac, hyb);
    }
  }
  if (!a.json && a.steps)
    std::printf("mean step %.2f ms, mean attention mass captured %.4f at a budget of %llu tokens\n",
                sum_ms / a.steps, a.quality ? sum_mass / a.steps : NAN, (unsigned long long)a.budget);
  hy.reset();
  reader->reset();
  drop.armed = false;
  if (auto d = (*store)->destroy(rid); !d.ok()) die(d.error().message());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Fatal& f) {
    // A call the signal interrupted (EINTR while the pool is allocated) fails
    // for the signal's sake: report the signal.
    if (int sig = g_stop_signal; sig && f.status != 128 + sig) {
      std::fprintf(stderr, "cxlkv-longctx: stopped by signal %d (%s)\n", sig, strsignal(sig));
      return 128 + sig;
    }
    std::fprintf(stderr, "cxlkv-longctx: %s\n", f.message.c_str());
    return f.status;
  }
}
