// SPDX-License-Identifier: MIT
// cxlkv-replay: replays a serving workload through an embedded shm pool with
// real KV bytes (see replay.hpp and --help).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "cxlkv/tier.hpp"
#include "cxlkv/version.h"
#include "index/prefix_index.hpp"
#include "pool/format.hpp"
#include "pool_open.hpp"
#include "huge_tmpfs.hpp"
#include "replay.hpp"
#include "svg_chart.hpp"
#include "util/clock.hpp"

namespace replay {
namespace {

using namespace cxlkv;

const char* kUsage =
    "usage: cxlkv-replay [options]\n"
    "\n"
    "Replays a serving workload on an embedded pool with real KV bytes: a lock\n"
    "manager, P prefill and D decode worker processes (one node each).  Prefill looks\n"
    "up the longest cached prefix, fetches those blocks, produces and publishes the\n"
    "rest; decode fetches and verifies every prompt block.\n"
    "\n"
    "The run's own pool lives on 2 MiB pages, as a CXL pool is mapped: in a private\n"
    "tmpfs mounted huge=always that only the run sees (it needs CAP_SYS_ADMIN, e.g.\n"
    "root).  Otherwise, or with --small-pages, it is a shm: pool in /dev/shm on the\n"
    "4 KiB pages /dev/shm usually gives, where each worker builds page tables for\n"
    "every block it touches.  The summary says which (JSON: page_bytes).\n"
    "\n"
    "  --trace FILE         Mooncake JSONL trace (default: built-in generator)\n"
    "  --requests N         requests (generator: 100) / at most N requests (trace: all)\n"
    "  --unique-fraction F  generator: share of requests with no shared prefix (0.3)\n"
    "  --seed N             generator seed (1)\n"
    "  --prefill P          prefill workers (2)\n"
    "  --decode D           decode workers (2; at least 1: prefill waits for decode)\n"
    "  --capacity BLOCKS    cache capacity in blocks (default unbounded)\n"
    "  --capacity-fraction F  capacity as a fraction of the workload's distinct blocks\n"
    "  --sweep              also run at 5%, 10%, 25% and 50% of the distinct blocks and\n"
    "                       print each hit ratio beside the block-LRU reference's\n"
    "  --plot FILE.svg      with --sweep: draw the token hit ratio against capacity beside\n"
    "                       the LRU reference and the theoretical reuse (SVG)\n"
    "  --lease-ms MS        ttl of the handoff leases prefill takes for decode (30000)\n"
    "  --max-lag N          prefill stays at most N requests ahead of decode (default:\n"
    "                       prefill + decode workers; a serving system's bounded queue)\n"
    "  --pool-size SIZE     shm pool size: MiB, or with a suffix (512M, 2G; default 2G)\n"
    "  --pool URI           run on this pool (e.g. shm:NAME:SIZE).  The run formats it, which\n"
    "                       destroys what it holds: a valid pool is refused without --force\n"
    "  --force              let --pool reformat a valid pool\n"
    "  --small-pages        own pool in /dev/shm (4 KiB pages) instead of a private\n"
    "                       2 MiB-page tmpfs\n"
    "  --interleave N       stripe payload over N pools (1 or 2)\n"
    "  --ssd PATH           add an SSD tier on this file (created if missing; O_DIRECT needs\n"
    "                       a real file system such as /tmp or /var/tmp; older tmpfs refuses\n"
    "                       it).  Blocks evicted from memory are demoted to it, SSD hits\n"
    "                       promoted back.  Without --capacity the memory capacity is bounded\n"
    "                       to 1/4 of the distinct blocks so that demotion happens\n"
    "  --ssd-size SIZE      SSD file size: MiB, or with a suffix (default: room for every\n"
    "                       distinct block)\n"
    "  --layers L --kv-heads H --head-size S   engine geometry of a 512-token block (8, 2, 64: 2 MiB)\n"
    "  --time-scale X       trace time x X (0: as fast as possible)\n"
    "  --no-verify          skip byte verification\n"
    "  --json               print the summary as JSON on stdout\n"
    "  --quiet              no progress line\n"
    "  -h, --help           this text\n"
    "  --version            print the version\n"
    "\n"
    "Across racks: cxlkv-replay --racks N [N...] [options] splits the requests over N\n"
    "pools that share one Mooncake Store and reports the token hit ratio per tier\n"
    "beside one shared pool and N isolated pools.  Mooncake's store is driven from\n"
    "Python only, so this runs tools/replay/replay_racks.py of the cxlkv source tree\n"
    "(or $CXLKV_REPLAY_RACKS) in the engine environment (.venv-engines from `make\n"
    "deps`, or $CXLKV_PYTHON); its options: cxlkv-replay --racks 2 --help.\n";

struct Summary {
  uint64_t requests = 0, input_tokens = 0, hit_tokens = 0;
  uint64_t blocks_written = 0, blocks_read = 0, bytes = 0;
  uint64_t errors = 0, decode_misses = 0, uncached = 0, lost_hits = 0, evictions = 0;
  uint64_t lease_expiries = 0, not_handed_off = 0, expired_misses = 0, lease_errors = 0;
  uint64_t mem_hits = 0, mem_bytes = 0, ssd_hits = 0, ssd_bytes = 0, demotions = 0, promotions = 0;
  bool ssd = false;
  double seconds = 0, theory = 0;
  LruReference lru;  // block-LRU at the same capacity (docs/eviction.md "The replay's LRU reference"); unbounded: == theory
  LatHist lat[kLatOps];  // merged over the workers
  double p50(uint32_t op) const { return lat[op].percentile_us(50); }
  double p99(uint32_t op) const { return lat[op].percentile_us(99); }
  uint64_t block_bytes = 0, capacity = 0;
  uint64_t page_bytes = 4096;  // page size backing the pool's mapping (huge_tmpfs.hpp)
  double hit_ratio() const { return input_tokens ? double(hit_tokens) / double(input_tokens) : 0; }
  // Token hit ratio over the LRU reference's (1.0 when both are 0).
  double vs_lru() const { return lru.ratio() > 0 ? hit_ratio() / lru.ratio() : (hit_ratio() > 0 ? INFINITY : 1.0); }
};

// SIGINT / SIGTERM to the parent: stop the workers, clean up, exit 128+sig.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Everything one run creates outside this process, removed on every exit
// path (docs/operations.md "Clean-up"): the worker processes (killed and reaped if still
// running), the shm pools and the coordination segment (unlinked as soon as
// every worker has them mapped, so that even a kill -9 of the parent leaves
// only node-local files, which `cxlkvctl node gc` removes once their pool is
// gone), and the node-local files of the run's nodes.
struct RunFiles {
  std::vector<std::string> shm;         // "/name" of pools and the coordination segment
  HugeTmpfs huge;                       // the run's own pools on 2 MiB pages (huge_tmpfs.hpp), if it could
  std::vector<std::string> huge_files;  // pool files in `huge`
  std::vector<std::string> node_local;  // node-local shm names of nodes 0..workers
  std::vector<pid_t> kids;
  std::vector<bool> reaped;
  void unlink_shared() {
    for (auto& n : shm) shm_unlink(n.c_str());
    shm.clear();
    for (auto& n : huge_files) huge.unlink(n);
    huge_files.clear();
  }
  ~RunFiles() {
    for (size_t i = 0; i < kids.size(); i++)
      if (!reaped[i]) kill(kids[i], SIGKILL);
    for (size_t i = 0; i < kids.size(); i++)
      if (!reaped[i]) waitpid(kids[i], nullptr, 0);
    unlink_shared();
    for (auto& n : node_local) NodeContext::unlink_local(n);
  }
};

std::string shm_name_of(const std::string& uri) { return "/" + uri.substr(4, uri.rfind(':') - 4); }

Result<Summary> run_once(const Config& c, const std::vector<Request>& reqs, int argc, char** argv) {
  if (g_stop_signal) return Error(-EINTR, "stopped by signal " + std::to_string(int(g_stop_signal)));
  Summary s;
  RunFiles files;
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(monotonic_ns() % 100000);
  Config cc = c;
  bool own_pool = cc.pool_uri.empty();
  PoolFormatOptions fo;
  // The run's own pools (this one and --interleave's): file:s in a private
  // 2 MiB-page tmpfs when it can mount one, else shm: pools in /dev/shm.
  auto own_pool_uri = [&](const std::string& name) {
    if (files.huge.ok()) {
      files.huge_files.push_back(name);
      return files.huge.pool_uri(name);
    }
    const std::string u = "shm:" + name + ":" + std::to_string(cc.pool_size >> 20) + "M";
    files.shm.push_back(shm_name_of(u));
    return u;
  };
  if (own_pool && !cc.small_pages) {
    files.huge = HugeTmpfs::mount(cc.pool_size * cc.interleave);
    if (files.huge.ok()) {
      fo.size = cc.pool_size;  // a file: pool takes its size from the format
      setenv("CXLKV_HUGE_PAGES", "prefer", 0);  // here and in the workers (a user's setting stays)
    } else if (!cc.quiet) {
      std::fprintf(stderr, "cxlkv-replay: pool on 4 KiB pages in /dev/shm: no private 2 MiB-page tmpfs (%s)\n",
                   files.huge.why_not().c_str());
    }
  }
  if (own_pool) cc.pool_uri = own_pool_uri("cxlkv-replay-" + tag);
  fo.force = true;
  fo.max_nodes = 16;
  // One index slot per 16 KiB of pool: room for every block of the run.
  fo.index_entries = std::max<uint64_t>(cc.pool_size / (16 << 10), cc.min_index_entries);
  auto region = format_pool(cc.pool_uri, fo);
  if (!region) return region.error();
  s.page_bytes = region.value()->huge_pages() ? (2ull << 20) : 4096;
  const uint32_t nworkers = cc.prefill + cc.decode;
  for (uint32_t w = 0; w <= nworkers; w++)
    files.node_local.push_back(NodeContext::default_local_name(*region.value(), w));
  if (!cc.quiet)
    std::fprintf(stderr, "cxlkv-replay: pool %s on %s pages%s (node-local files %s..%u)\n", cc.pool_uri.c_str(),
                 s.page_bytes > 4096 ? "2 MiB" : "4 KiB", files.huge.ok() ? ", a private tmpfs" : "",
                 files.node_local[0].substr(0, files.node_local[0].rfind('-') + 1).c_str(), nworkers);
  std::vector<std::string> extra;
  for (uint32_t d = 1; d < cc.interleave; d++) {
    const std::string u = own_pool_uri("cxlkv-replay-" + tag + "-dev" + std::to_string(d));
    auto r2 = format_pool(u, fo);
    if (!r2) return r2.error();
    extra.push_back(u);
  }
  auto ic = region.value()->carve(CXLKV_CARVE_INDEX);
  if (!ic) return ic.error();
  IndexPolicy pol;
  pol.max_blocks = cc.capacity_blocks;
  pol.ndevices = static_cast<uint8_t>(cc.interleave);
  pol.interleave_stripe = cc.interleave_stripe;
  CXLKV_TRY(index_set_policy(region.value()->domain(), region.value()->at(ic->offset), pol));

  // The lock manager: cxlkvd's job, here a thread of the parent (node 0 owns nothing else).
  LockManagerOptions lo;
  auto mgr = LockManager::create(*region.value(), lo);
  if (!mgr) return mgr.error();
  mgr.value()->start();
  struct StopManager {
    LockManager* m;
    ~StopManager() { m->stop(); }
  } stop_mgr{mgr.value().get()};

  const std::string coord = "/cxlkv-replay-coord-" + tag;
  int fd = shm_open(coord.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Error(-errno, "coordination segment " + coord + ": " + std::strerror(errno));
  files.shm.push_back(coord);
  size_t cb = coord_bytes(reqs.size());
  if (ftruncate(fd, static_cast<off_t>(cb)) != 0) {
    int e = errno;
    close(fd);
    return Error(-e, "coordination segment " + coord + ": ftruncate: " + std::strerror(e));
  }
  void* m = mmap(nullptr, cb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return Error(-errno, "coordination segment " + coord + ": mmap: " + std::strerror(errno));
  struct Unmap {
    void* m;
    size_t n;
    ~Unmap() { munmap(m, n); }
  } unmap{m, cb};
  Coord& co = *new (m) Coord();
  co.nrequests = reqs.size();
  co.start_ns = monotonic_ns();

  // Workers: fork/exec of ourselves with --worker, one node each.
  const pid_t parent = getpid();
  for (uint32_t w = 0; w < nworkers; w++) {
    std::vector<std::string> args(argv, argv + argc);
    args.push_back("--pool");
    args.push_back(cc.pool_uri);
    for (auto& e : extra) {
      args.push_back("--extra-pool");
      args.push_back(e);
    }
    args.push_back("--capacity");
    args.push_back(std::to_string(cc.capacity_blocks));
    args.push_back("--worker");
    args.push_back(w < cc.prefill ? "prefill" : "decode");
    args.push_back("--worker-index");
    args.push_back(std::to_string(w));
    args.push_back("--node");
    args.push_back(std::to_string(w + 1));
    args.push_back("--coord");
    args.push_back(coord);
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) return Error(-errno, "fork of worker " + std::to_string(w) + ": " + std::strerror(errno));
    if (pid == 0) {
      // Die with the parent (it hosts the lock manager: without it every
      // lock waits forever).  The signal survives exec; it fires when the
      // forking thread exits, and this main thread lives as long as the
      // run.  The parent may have died before prctl: check after it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      // Ctrl-C reaches the whole process group: the parent alone decides
      // (it sets abort, the workers finish their request and exit).
      signal(SIGINT, SIG_IGN);
      execv("/proc/self/exe", av.data());
      _exit(127);
    }
    files.kids.push_back(pid);
    files.reaped.push_back(false);
  }

  uint64_t last_print = 0;
  size_t running = files.kids.size();
  uint64_t failed = 0;
  uint64_t stop_deadline = 0;
  const uint64_t n = reqs.size();
  auto& kids = files.kids;
  while (running) {
    for (size_t i = 0; i < kids.size(); i++) {
      if (files.reaped[i]) continue;
      int st;
      if (waitpid(kids[i], &st, WNOHANG) == kids[i]) {
        files.reaped[i] = true;
        running--;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          failed++;
          co.abort = 1;  // a stuck turn would hang the others
          std::fprintf(stderr, "cxlkv-replay: worker %zu (pid %d) failed (%s %d)\n", i, kids[i],
                       WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
      }
    }
    // Every worker has the pools and the coordination segment mapped: their
    // names are no longer needed (see RunFiles).
    if (!files.shm.empty() && co.attached.load() == nworkers) files.unlink_shared();
    uint64_t t = monotonic_ns();
    if (g_stop_signal && !stop_deadline) {
      co.abort = 1;  // workers stop after their current request
      stop_deadline = t + 5000000000ull;
    }
    if (stop_deadline && t > stop_deadline)
      for (size_t i = 0; i < kids.size(); i++)
        if (!files.reaped[i]) kill(kids[i], SIGKILL);
    if (!cc.quiet && t - last_print > 250000000ull) {
      last_print = t;
      uint64_t in = 0, hit = 0, bytes = 0, errs = 0;
      for (uint32_t w = 1; w <= nworkers; w++) {
        in += co.workers[w].input_tokens;
        hit += co.workers[w].hit_tokens;
        bytes += co.workers[w].bytes_written + co.workers[w].bytes_read;
        errs += co.workers[w].errors;
      }
      double sec = double(t - co.start_ns) / 1e9;
      std::fprintf(stderr, "\r[cxlkv-replay] prefill %lu/%lu  decode %lu/%lu  token hit %.1f%%  %.2f GB/s  errors %lu   ",
                   (unsigned long)co.prefilled.load(), (unsigned long)n, (unsigned long)co.decoded.load(),
                   (unsigned long)n, in ? 100.0 * double(hit) / double(in) : 0.0, double(bytes) / 1e9 / sec,
                   (unsigned long)errs);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (g_stop_signal)
    return Error(-EINTR, "stopped by signal " + std::to_string(int(g_stop_signal)) + " (" +
                             strsignal(g_stop_signal) + "): workers stopped, pools and files removed");
  s.seconds = double(monotonic_ns() - co.start_ns) / 1e9;
  if (!cc.quiet) std::fprintf(stderr, "\n");

  for (uint32_t w = 1; w <= nworkers; w++) {
    const WorkerCounters& k = co.workers[w];
    if (w <= cc.prefill) {
      s.requests += k.requests;
      s.input_tokens += k.input_tokens;
      s.hit_tokens += k.hit_tokens;
    }
    s.blocks_written += k.blocks_written;
    s.blocks_read += k.blocks_read;
    s.bytes += k.bytes_written + k.bytes_read;
    s.errors += k.errors;
    s.decode_misses += k.decode_misses;
    s.uncached += k.uncached;
    s.lost_hits += k.lost_hits;
    s.mem_hits += k.mem_hits;
    s.mem_bytes += k.mem_bytes;
    s.ssd_hits += k.ssd_hits;
    s.ssd_bytes += k.ssd_bytes;
    s.demotions += k.demotions;
    s.promotions += k.promotions;
    s.lease_expiries += k.lease_expiries;
    s.not_handed_off += k.not_handed_off;
    s.expired_misses += k.expired_misses;
    s.lease_errors += k.lease_errors;
    for (uint32_t op = 0; op < kLatOps; op++) s.lat[op].merge(k.lat[op]);
  }
  s.ssd = !cc.ssd_path.empty();
  s.errors += failed;
  for (auto& ns : read_pool_stats(region.value()->domain(), region.value()->at(ic->offset)))
    s.evictions += ns.stats.counters[CXLKV_CTR_EVICTIONS];
  s.capacity = cc.capacity_blocks;
  return s;
}

// One flat JSON object, built field by field.
class JsonOut {
 public:
  JsonOut& u(const char* k, uint64_t v) { return raw(k, std::to_string(v)); }
  JsonOut& f(const char* k, double v, int prec = 4) {
    char b[64];
    if (std::isfinite(v)) std::snprintf(b, sizeof b, "%.*f", prec, v);
    else std::snprintf(b, sizeof b, "null");
    return raw(k, b);
  }
  JsonOut& raw(const char* k, const std::string& v) {
    s_ += (s_.empty() ? "{" : ", ");
    s_ += "\"" + std::string(k) + "\": " + v;
    return *this;
  }
  std::string str() const { return s_.empty() ? "{}" : s_ + "}"; }

 private:
  std::string s_;
};

void print_summary(const Summary& s, const Config& c, const char* title) {
  std::fprintf(stderr,
               "%s\n"
               "  requests            %lu\n"
               "  token hit ratio     %.4f   (trace's theoretical prefix reuse %.4f)\n",
               title, (unsigned long)s.requests, s.hit_ratio(), s.theory);
  if (s.capacity)
    std::fprintf(stderr, "  block-LRU reference %.4f   at the same %lu-block capacity: cxlkv / LRU = %.3fx\n",
                 s.lru.ratio(), (unsigned long)s.capacity, s.vs_lru());
  std::fprintf(stderr,
               "  blocks written      %lu   read %lu   (%lu KiB each)\n"
               "  throughput          %.2f GB/s  over %.2f s   (pool on %s pages)\n"
               "  evictions           %lu   uncached blocks %lu   lost hits %lu\n"
               "  decode misses       %lu   (blocks handed off to a decode and gone before it read them: errors)\n"
               "  handoff             %lu blocks not handed off (not cached when prefill leased)   lease expiries %lu\n"
               "                      %lu decode misses excused: their lease had ended (ttl or consumer node dead)   "
               "lease errors %lu\n"
               "  errors              %lu\n",
               (unsigned long)s.blocks_written, (unsigned long)s.blocks_read, (unsigned long)(s.block_bytes >> 10),
               s.bytes / 1e9 / s.seconds, s.seconds, s.page_bytes > 4096 ? "2 MiB" : "4 KiB", (unsigned long)s.evictions, (unsigned long)s.uncached,
               (unsigned long)s.lost_hits, (unsigned long)s.decode_misses, (unsigned long)s.not_handed_off,
               (unsigned long)s.lease_expiries, (unsigned long)s.expired_misses, (unsigned long)s.lease_errors,
               (unsigned long)s.errors);
  std::fprintf(stderr,
               "  whole publish       p50 %.1f us   p99 %.1f us   (per request: reserve + write + publish of its new blocks)\n"
               "  whole fetch         p50 %.1f us   p99 %.1f us   (per request: pin + fetch + unpin of the blocks it reads)\n"
               "  latency p50/p99 us  lookup %.1f/%.1f  reserve %.1f/%.1f  write %.1f/%.1f  publish %.1f/%.1f\n"
               "                      pin %.1f/%.1f  fetch %.1f/%.1f  unpin %.1f/%.1f   (per call)\n",
               s.p50(kLatWholePublish), s.p99(kLatWholePublish), s.p50(kLatWholeFetch), s.p99(kLatWholeFetch),
               s.p50(kLatLookup), s.p99(kLatLookup), s.p50(kLatReserve), s.p99(kLatReserve), s.p50(kLatWrite),
               s.p99(kLatWrite), s.p50(kLatPublish), s.p99(kLatPublish), s.p50(kLatPin), s.p99(kLatPin),
               s.p50(kLatFetch), s.p99(kLatFetch), s.p50(kLatUnpin), s.p99(kLatUnpin));
  std::fprintf(stderr,
               "  tier mem            hits %lu   %.2f GB\n"
               "  tier ssd            hits %lu   %.2f GB%s",
               (unsigned long)s.mem_hits, double(s.mem_bytes) / 1e9, (unsigned long)s.ssd_hits,
               double(s.ssd_bytes) / 1e9, s.ssd ? "" : "   (no SSD tier: SSD=path / --ssd)\n");
  if (s.ssd)
    std::fprintf(stderr, "   demotions %lu   promotions %lu   (%s)\n", (unsigned long)s.demotions,
                 (unsigned long)s.promotions, c.ssd_path.c_str());
}

// The fields a bounded run and a sweep point share.
void json_bounded(JsonOut& j, const Summary& s) {
  j.u("capacity_blocks", s.capacity)
      .f("token_hit_ratio", s.hit_ratio(), 6)
      .f("lru_token_hit_ratio", s.lru.ratio(), 6)
      .f("hit_vs_lru", s.vs_lru(), 6)
      .u("evictions", s.evictions)
      .u("uncached_blocks", s.uncached)
      .u("lost_hits", s.lost_hits)
      .u("decode_misses", s.decode_misses)
      .u("lease_expiries", s.lease_expiries)
      .u("not_handed_off", s.not_handed_off)
      .u("expired_lease_misses", s.expired_misses)
      .u("lease_errors", s.lease_errors)
      .u("errors", s.errors)
      .u("tier.mem.hits", s.mem_hits)
      .u("tier.ssd.hits", s.ssd_hits);
}

bool parse(int argc, char** argv, Config* c, std::string* err) {
  auto need = [&](int& i) -> const char* {
    if (i + 1 >= argc) {
      *err = std::string("option ") + argv[i] + " needs a value";
      return nullptr;
    }
    return argv[++i];
  };
  // A refused value names its option and what the option accepts (one text
  // for every numeric option; NaN, fractions and suffixes never slip through).
  auto refuse = [&](const std::string& opt, const char* v, const std::string& what) {
    *err = opt + ": '" + v + "' is not " + what;
    return false;
  };
  auto whole = [&](const std::string& opt, const char* v, uint64_t lo, uint64_t hi, uint64_t* out) {
    const std::string s = v;
    uint64_t x = 0;
    bool ok = !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string::npos;
    if (ok) x = std::strtoull(v, nullptr, 10);
    if (!ok || x < lo || x > hi)
      return refuse(opt, v, "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
    *out = x;
    return true;
  };
  auto real = [&](const std::string& opt, const char* v, double lo, double hi, double* out) {
    char* e = nullptr;
    double x = std::strtod(v, &e);
    if (!v[0] || *e || !std::isfinite(x) || x < lo || x > hi) {
      char range[64];
      std::snprintf(range, sizeof range, "a number from %g to %g", lo, hi);
      return refuse(opt, v, range);
    }
    *out = x;
    return true;
  };
  // Sizes in MiB: a plain number is MiB, or with a suffix (512M, 2G).
  auto mib = [&](const std::string& opt, const char* v, uint64_t lo, uint64_t hi, uint64_t* bytes) {
    const std::string s = v;
    uint64_t x = 0;
    bool ok;
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) {
      ok = s.size() <= 12;
      if (ok) x = std::strtoull(v, nullptr, 10) << 20;
    } else {
      ok = cxlkv::region::parse_size(s, &x);
    }
    if (!ok || x % (1u << 20) || (x >> 20) < lo || (x >> 20) > hi)
      return refuse(opt, v, "a size in whole MiB from " + std::to_string(lo) + " to " + std::to_string(hi) +
                                " MiB (a number of MiB, or with a suffix: 512M, 2G)");
    *bytes = x;
    return true;
  };
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char* v;
    uint64_t u;
    double x;
    auto num = [&](uint64_t lo, uint64_t hi) { return (v = need(i)) && whole(a, v, lo, hi, &u); };
    auto frac = [&](double lo, double hi) { return (v = need(i)) && real(a, v, lo, hi, &x); };
    auto size = [&](uint64_t lo, uint64_t hi) { return (v = need(i)) && mib(a, v, lo, hi, &u); };
    if (a == "--trace") { if (!(v = need(i))) return false; c->trace = v; }
    else if (a == "--requests") { if (!num(1, 10000000)) return false; c->max_requests = uint32_t(u); }
    else if (a == "--unique-fraction") { if (!frac(0, 1)) return false; c->gen.unique_fraction = x; }
    else if (a == "--seed") { if (!num(0, 1000000000000000000ull)) return false; c->gen.seed = u; }
    else if (a == "--prefill") { if (!num(1, 15)) return false; c->prefill = uint32_t(u); }
    else if (a == "--decode") { if (!num(1, 14)) return false; c->decode = uint32_t(u); }  // prefill waits for decode (--max-lag)
    else if (a == "--capacity") { if (!num(0, 1000000000000ull)) return false; c->capacity_blocks = u; }
    else if (a == "--capacity-fraction") { if (!frac(0, 1)) return false; c->capacity_fraction = x; }
    else if (a == "--sweep") c->sweep = true;
    else if (a == "--plot") { if (!(v = need(i))) return false; c->plot = v; }
    else if (a == "--max-lag") { if (!num(1, 1000000)) return false; c->max_lag = uint32_t(u); }
    else if (a == "--lease-ms") { if (!num(1, 86400000)) return false; c->lease_ms = uint32_t(u); }
    else if (a == "--pool-size") { if (!size(64, 1000000)) return false; c->pool_size = u; }
    else if (a == "--pool") { if (!(v = need(i))) return false; c->pool_uri = v; }
    else if (a == "--force") c->force = true;
    else if (a == "--extra-pool") { if (!(v = need(i))) return false; c->extra_pools.push_back(v); }
    else if (a == "--interleave") { if (!num(1, 2)) return false; c->interleave = uint32_t(u); }
    else if (a == "--ssd") { if (!(v = need(i))) return false; c->ssd_path = v; }
    else if (a == "--ssd-size") { if (!size(64, 100000000)) return false; c->ssd_size = u; }
    else if (a == "--min-index-entries") { if (!num(0, 10000000000ull)) return false; c->min_index_entries = u; }
    else if (a == "--layers") { if (!num(1, 128)) return false; c->layers = uint32_t(u); }
    else if (a == "--kv-heads") { if (!num(1, 128)) return false; c->kv_heads = uint32_t(u); }
    else if (a == "--head-size") { if (!num(1, 1024)) return false; c->head_size = uint32_t(u); }
    else if (a == "--time-scale") { if (!frac(0, 1e6)) return false; c->time_scale = x; }
    else if (a == "--no-verify") c->verify = false;
    else if (a == "--small-pages") c->small_pages = true;
    else if (a == "--json") c->json = true;
    else if (a == "--quiet") c->quiet = true;
    else if (a == "--worker") { if (!(v = need(i))) return false; c->worker = v; }
    else if (a == "--worker-index") { if (!num(0, 63)) return false; c->worker_index = uint32_t(u); }
    else if (a == "--node") { if (!num(0, 63)) return false; c->node = uint32_t(u); }
    else if (a == "--coord") { if (!(v = need(i))) return false; c->coord = v; }
    else if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); std::exit(0); }
    else if (a == "--version") { std::printf("cxlkv-replay (cxlkv) %s\n", CXLKV_VERSION); std::exit(0); }
    else { *err = "unknown option '" + a + "' (see --help)"; return false; }
  }
  if (c->prefill + c->decode > 15) { *err = "at most 15 workers (nodes 1..15)"; return false; }
  if (!c->plot.empty() && !c->sweep) { *err = "--plot draws the sweep: add --sweep"; return false; }
  return true;
}

}  // namespace

int run_parent(const Config& c, char** argv, int argc) {
  std::string err;
  // The run formats its pool: a valid pool given with --pool (an operator's
  // cache) is destroyed only when asked (format never destroys a valid pool
  // without --force: docs/operations.md "Format once, from one host").
  if (!c.pool_uri.empty() && !c.force) {
    OpenOptions oo;
    oo.prefault = false;
    // A pool that is not valid is formatted below: no warning about it here.
    if (auto existing = cxlkv_tools::open_pool(c.pool_uri, oo)) {
      std::fprintf(stderr,
                   "cxlkv-replay: pool %s holds a valid cxlkv pool (generation %llu); the replay formats the pool it "
                   "runs on, which would destroy it: add --force to let it, or leave out --pool for a pool of its "
                   "own\n",
                   c.pool_uri.c_str(), (unsigned long long)existing.value()->superblock().generation);
      return 1;
    }
  }
  // Extra pool devices the workers attach: one that does not open fails the
  // run here, said once, instead of once by every worker.
  for (const auto& u : c.extra_pools) {
    OpenOptions oo;
    oo.prefault = false;
    if (auto r = cxlkv_tools::open_pool(u, oo); !r) {
      std::fprintf(stderr, "cxlkv-replay: --extra-pool: %s\n", r.error().message().c_str());
      return 1;
    }
  }
  if (!c.plot.empty()) {  // the picture is drawn after the whole sweep: a bad path fails now
    std::string perr;
    if (!cxlkv::svg::Document::can_save(c.plot, &perr)) {
      std::fprintf(stderr, "cxlkv-replay: --plot: %s\n", perr.c_str());
      return 1;
    }
  }
  std::vector<Request> reqs = load_workload(c, &err);
  if (reqs.empty()) {
    std::fprintf(stderr, "cxlkv-replay: %s\n", err.empty() ? "empty workload" : err.c_str());
    return 1;
  }
  PrefixReuse th = theoretical_prefix_reuse(reqs);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;  // no SA_RESTART: sleeps and waits return early
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // The SSD file, when this run creates it, goes with the run.
  struct RemoveFile {
    std::string path;
    ~RemoveFile() {
      if (!path.empty()) unlink(path.c_str());
    }
  } ssd_file;
  if (!c.ssd_path.empty() && access(c.ssd_path.c_str(), F_OK) != 0) ssd_file.path = c.ssd_path;
  const uint64_t block_bytes = uint64_t(kTraceBlockTokens) * c.kv_heads * c.head_size * 2 * 2 * c.layers;
  // Unbounded runs need room for every distinct block (+ allocator slack).
  Config cc = c;
  if (c.capacity_fraction > 0)
    cc.capacity_blocks = std::max<uint64_t>(16, uint64_t(double(th.unique_blocks) * c.capacity_fraction));
  // A pool this run creates holds its capacity's payload (+ allocator slack),
  // so the capacity limit, not payload space, bounds the cache; each sweep
  // point sizes its own.
  auto size_pool = [&](Config& k) {
    if (!c.pool_uri.empty()) return;
    uint64_t need = th.unique_blocks * block_bytes * 5 / 4 + (256ull << 20);
    if (k.capacity_blocks) need = std::min<uint64_t>(need, k.capacity_blocks * block_bytes * 5 / 4 + (256ull << 20));
    k.pool_size = std::max<uint64_t>(c.pool_size, (need + (2ull << 20) - 1) & ~((2ull << 20) - 1));
  };
  size_pool(cc);
  if (!c.ssd_path.empty()) {
    // The SSD tier matters only when memory is bounded: without --capacity,
    // keep a quarter of the distinct blocks in memory so blocks get demoted.
    if (!cc.capacity_blocks) cc.capacity_blocks = std::max<uint64_t>(16, th.unique_blocks / 4);
    // The index names blocks on both tiers: a slot for every distinct block.
    cc.min_index_entries = th.unique_blocks * 2 + 1024;
    // Every worker places in its own share (prefill + decode + 1 shares);
    // prefill workers demote, so give each prefill share room for all blocks.
    const uint64_t parts = c.prefill + c.decode + 1;
    if (!cc.ssd_size) cc.ssd_size = th.unique_blocks * block_bytes * parts / c.prefill * 5 / 4 + (256ull << 20);
    // Create / grow the file and probe its bandwidth once here (cached in the
    // device header), so the workers open it without probing concurrently.
    SsdPoolOptions so;
    so.devices.push_back(SsdDeviceConfig{c.ssd_path, cc.ssd_size, 0, false});
    so.partitions = static_cast<uint32_t>(parts);
    auto p = SsdPool::open(so);
    if (!p) {
      std::fprintf(stderr, "cxlkv-replay: SSD tier %s: %s\n", c.ssd_path.c_str(), p.error().message().c_str());
      return 1;
    }
    if (!c.quiet) {
      SsdDeviceInfo di = p.value()->device_info(0);
      std::fprintf(stderr, "cxlkv-replay: SSD tier %s: %.1f GiB, %.2f GB/s (%s), memory capacity %lu blocks\n",
                   c.ssd_path.c_str(), double(di.capacity) / double(1ull << 30), di.bandwidth_gbps,
                   di.bandwidth_source, (unsigned long)cc.capacity_blocks);
    }
  }
  auto r = run_once(cc, reqs, argc, argv);
  if (!r) {
    std::fprintf(stderr, "cxlkv-replay: %s\n", r.error().message().c_str());
    return g_stop_signal ? 128 + g_stop_signal : 1;
  }
  Summary s = r.value();
  s.theory = th.ratio();
  s.block_bytes = block_bytes;
  if (s.capacity) s.lru = lru_reference(reqs, s.capacity);
  std::vector<Summary> sweep;
  if (c.sweep) {
    for (double f : kSweepFractions) {
      Config b = cc;
      b.capacity_blocks = std::max<uint64_t>(16, uint64_t(double(th.unique_blocks) * f));
      size_pool(b);
      b.quiet = true;
      auto rb = run_once(b, reqs, argc, argv);
      if (!rb) {
        std::fprintf(stderr, "cxlkv-replay: capacity %lu: %s\n", (unsigned long)b.capacity_blocks,
                     rb.error().message().c_str());
        return g_stop_signal ? 128 + g_stop_signal : 1;
      }
      rb.value().theory = th.ratio();
      rb.value().block_bytes = block_bytes;
      rb.value().lru = lru_reference(reqs, b.capacity_blocks);
      sweep.push_back(rb.value());
    }
  }
  if (!c.json || !c.quiet) {
    print_summary(s, c, cc.capacity_blocks ? (s.ssd ? "cxlkv-replay summary (bounded memory capacity + SSD tier)"
                                                     : "cxlkv-replay summary (bounded capacity)")
                                           : "cxlkv-replay summary (unbounded capacity)");
    std::fprintf(stderr, "  fidelity            %s\n",
                 cc.capacity_blocks ? "n/a (bounded capacity)"
                 : s.hit_tokens == th.reused_tokens ? "exact (replay hit tokens == theoretical reused tokens)"
                                                     : "MISMATCH");
    if (!sweep.empty())
      std::fprintf(stderr, "  sweep (%lu distinct blocks)   capacity   cxlkv    LRU      cxlkv/LRU  evictions  "
                   "uncached  decode misses  errors\n", (unsigned long)th.unique_blocks);
    for (auto& b : sweep)
      std::fprintf(stderr, "    %4.1f%% of distinct         %8lu   %.4f   %.4f   %6.3fx   %9lu  %8lu  %13lu  %6lu\n",
                   100.0 * double(b.capacity) / double(th.unique_blocks), (unsigned long)b.capacity, b.hit_ratio(),
                   b.lru.ratio(), b.vs_lru(), (unsigned long)b.evictions, (unsigned long)b.uncached,
                   (unsigned long)b.decode_misses, (unsigned long)b.errors);
  }
  uint64_t errors = s.errors;
  for (auto& b : sweep) errors += b.errors;
  if (!c.plot.empty()) {
    std::vector<PlotPoint> pts;
    for (auto& b : sweep)
      pts.push_back({100.0 * double(b.capacity) / double(th.unique_blocks), b.hit_ratio(), b.lru.ratio()});
    // Unbounded: every distinct block fits, so LRU reaches the theoretical reuse.
    if (!cc.capacity_blocks) pts.push_back({100.0, s.hit_ratio(), th.ratio()});
    std::string perr;
    if (!write_sweep_plot(c.plot, pts, th.ratio(), th.unique_blocks,
                          c.trace.empty() ? "built-in generator" : c.trace, &perr)) {
      std::fprintf(stderr, "cxlkv-replay: --plot: %s\n", perr.c_str());
      return 1;
    }
    if (!c.quiet) std::fprintf(stderr, "cxlkv-replay: wrote %s\n", c.plot.c_str());
  }
  if (c.json) {
    JsonOut j;
    j.u("requests", s.requests)
        .u("input_tokens", s.input_tokens)
        .u("hit_tokens", s.hit_tokens)
        .f("token_hit_ratio", s.hit_ratio(), 6)
        .u("theoretical_hit_tokens", th.reused_tokens)
        .f("theoretical_hit_ratio", th.ratio(), 6)
        .u("distinct_blocks", th.unique_blocks)
        .u("capacity_blocks", s.capacity)
        .f("lru_token_hit_ratio", s.capacity ? s.lru.ratio() : th.ratio(), 6)
        .f("hit_vs_lru", s.capacity ? s.vs_lru() : 1.0, 6)
        .u("blocks_written", s.blocks_written)
        .u("blocks_read", s.blocks_read)
        .u("block_bytes", block_bytes)
        .u("bytes", s.bytes)
        .f("seconds", s.seconds)
        .f("gbps", s.bytes / 1e9 / s.seconds)
        .f("block_ops_per_s", double(s.blocks_written + s.blocks_read) / s.seconds, 1)
        .u("page_bytes", s.page_bytes)

        .u("evictions", s.evictions)
        .u("uncached_blocks", s.uncached)
        .u("lost_hits", s.lost_hits)
        .u("decode_misses", s.decode_misses)
        .u("lease_expiries", s.lease_expiries)
        .u("not_handed_off", s.not_handed_off)
        .u("expired_lease_misses", s.expired_misses)
        .u("lease_errors", s.lease_errors)
        .u("errors", errors)
        .u("tier.mem.hits", s.mem_hits)
        .u("tier.mem.bytes", s.mem_bytes)
        .u("tier.ssd.hits", s.ssd_hits)
        .u("tier.ssd.bytes", s.ssd_bytes)
        .u("tier.ssd.demotions", s.demotions)
        .u("tier.ssd.promotions", s.promotions);
    for (uint32_t op = 0; op < kLatOps; op++) {
      j.f((std::string(kLatNames[op]) + "_us_p50").c_str(), s.p50(op), 2);
      j.f((std::string(kLatNames[op]) + "_us_p99").c_str(), s.p99(op), 2);
      j.u((std::string(kLatNames[op]) + "_calls").c_str(), s.lat[op].count);
    }
    std::string sw = "[";
    for (size_t i = 0; i < sweep.size(); i++) {
      JsonOut p;
      json_bounded(p, sweep[i]);
      sw += (i ? ", " : "") + p.str();
    }
    j.raw("sweep", sw + "]");
    std::printf("%s\n", j.str().c_str());
  }
  if (errors) return 1;
  if (!cc.capacity_blocks && s.hit_tokens != th.reused_tokens) return 1;
  return 0;
}

}  // namespace replay

namespace replay {
namespace {

bool executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

// --racks: the replay across racks (docs/remote.md "Replay across racks").
// Racks share through Mooncake Store, whose client is Python only (no C
// interface to drive from here), so this execs the Python driver of the
// source tree this binary was built from, with every argument as given.
int run_racks(int argc, char** argv) {
  const char* env_script = std::getenv("CXLKV_REPLAY_RACKS");
  const std::string src = CXLKV_SOURCE_DIR;
  const std::string script = env_script ? env_script : src + "/tools/replay/replay_racks.py";
  if (::access(script.c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "cxlkv-replay: --racks runs the Python driver tools/replay/replay_racks.py of a cxlkv source tree "
                 "(Mooncake's store has no C interface), and %s is not there (%s); set CXLKV_REPLAY_RACKS to it\n",
                 script.c_str(), std::strerror(errno));
    return 2;
  }
  const char* env_py = std::getenv("CXLKV_PYTHON");
  const std::string py = env_py ? env_py : src + "/.venv-engines/bin/python";
  if (!env_py && !executable(py)) {
    std::fprintf(stderr,
                 "cxlkv-replay: --racks needs the engine environment, which pins Mooncake: no %s (make deps makes it; "
                 "or set CXLKV_PYTHON to a python that imports mooncake and numpy)\n",
                 py.c_str());
    return 2;
  }
  // The driver finds this build's tools and library by CXLKV_BUILD (this
  // binary is BUILD/tools/cxlkv-replay).
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0 && !std::getenv("CXLKV_BUILD")) {
    std::string build(self, static_cast<size_t>(n));
    for (int up = 0; up < 2; up++) build = build.substr(0, build.rfind('/'));
    ::setenv("CXLKV_BUILD", build.c_str(), 0);
  }
  std::vector<char*> args{const_cast<char*>(py.c_str()), const_cast<char*>(script.c_str())};
  for (int i = 1; i < argc; i++) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "cxlkv-replay: --racks: cannot run %s: %s (set CXLKV_PYTHON to the engine environment's python)\n",
               py.c_str(), std::strerror(errno));
  return 2;
}

}  // namespace
}  // namespace replay

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (std::strcmp(argv[i], "--racks") == 0) return replay::run_racks(argc, argv);
  replay::Config c;
  std::string err;
  if (!replay::parse(argc, argv, &c, &err)) {
    std::fprintf(stderr, "cxlkv-replay: %s\n", err.c_str());
    return 2;
  }
  if (!c.worker.empty()) return replay::run_worker(c);
  signal(SIGPIPE, SIG_IGN);
  return replay::run_parent(c, argv, argc);
}
