// SPDX-License-Identifier: MIT
// The C++ baseline of the py group (tools/bench/py_bench.py), like for like:
// the same C calls the Python package makes, on the same kind of pool, with
// the same geometry, from a C++ loop instead of Python.
//   kv_capi.publish_gbps   cxlkv_kv_put_chain of batches of 32 blocks (median batch)
//   kv_capi.fetch_gbps     cxlkv_kv_get_many of batches of 32 blocks (median batch)
//   kv_capi.publish_gb_per_cpu_s, kv_capi.fetch_gb_per_cpu_s
//                          the same bytes per CPU-second of the calling thread
//                          (far less sensitive to other processes' load)
// Both: a 1 GiB shm pool formatted by cxlkv_pool_format (max_nodes 4), a
// lock manager started with cxlkv_lock_manager_start (two-tier stripe locks:
// node-local tier + global grants, as in service), cxlkv_kv_open as node 1
// (node heap of the chunk allocator), at most 192 blocks cached (pool-wide
// memory-tier bound, evicting as it goes).  2 MiB blocks of Llama-3.1-8B
// (32 layers x K,V x 16 tokens x 8 heads x 128 x bf16): 64 chunks of 32 KiB
// gathered from a vLLM FlashAttention-layout paged cache of 16 engine blocks
// (per layer one [2, 16, 16, 8, 128] buffer); engine block (i mod 16) for
// the i-th block of a pass.  The kv carve is faulted in first, one pass of n
// blocks warms the index and the allocator up, then n blocks are published
// and n fetched cycling over the 128 most recently published, three times;
// each figure is the median of the per-batch rates (bytes of the blocks the
// call did / its time), as py_bench.py measures the package.
// (kv.publish_gbps / kv.fetch_gbps of bench_kv.cpp differ: in-process mutex
// stripe locks, a first-fit range allocator, one block per call.)  The bound
// is set before the KV store opens, as an operator configures a pool.
//
// The same batches through the C++ KvStore over bench_kv.cpp's in-process
// stand-ins (kv_bench_support.hpp: mutex stripe locks, a first-fit range
// allocator, the same bound, a pool of their own), side by side with the
// C API batch at every batch position in rotating order, so a load spike
// hits all of them (the ratios are medians over positions of C API rate /
// stand-in rate):
//   kv_capi.local_batch_{publish,fetch}_gbps   KvStore::put_chain / get_many
//   kv_capi.local_single_{publish,fetch}_gbps  one block per call (reserve /
//                          write / publish, pin / fetch / unpin): kv.*'s design
//   kv_capi.{publish,fetch}_vs_local_batch, kv_capi.{publish,fetch}_vs_local_single
//   kv_capi.{publish,fetch}_per_cpu_s_vs_local_{batch,single}
// (what the real pool's two-tier locks, node heap and C layer cost).
//
// Lockstep (CXLKV_KVCAPI_LOCKSTEP=1, what py_bench.py uses): before every
// batch position, warm-up included, the run waits for one line on stdin, and
// after it writes "W|P|F <bytes done> <wall s> <cpu s>" to stdout, so the
// Python side can run its own batch of the same sequence right beside each
// C++ batch: both see the same machine load, batch by batch.  With
// CXLKV_KVCAPI_LOCAL=1 as well, the single-block stand-in runs at each
// position too and the line carries its three figures after the C API's.
// With CXLKV_KVCAPI_SHARED_POOL=URI it works as node 2 on that (the Python
// side's) pool, under its lock manager and bound, with keys of its own.
// In lockstep the sides run in a fixed order (the C API, then the stand-in),
// so that with the Python side always first every side's batch has the same
// two batches of the other sides between it and its own previous batch (the
// same share of its memory still in cache, the same lock hand-offs); each
// stand-in has engine memory of its own, as the Python side has.
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench.hpp"
#include "capi/capi.hpp"
#include "cxlkv/cxlkv.h"
#include "cxlkv/keys.hpp"
#include "index/prefix_index.hpp"
#include "kv_bench_support.hpp"
#include "uapi/cxlkv_pool.h"

namespace {

using clk = std::chrono::steady_clock;
constexpr uint32_t kLayers = 32, kEngineBlocks = 16, kBatch = 32, kCapacity = 192, kRecent = 128, kPasses = 3;
constexpr size_t kChunk = 16 * 8 * 128 * 2;  // one layer's K (or V) of one block: 32 KiB
constexpr uint64_t kBlock = 2ull * kLayers * kChunk;

// One buffer per layer, 64 B aligned, as an engine allocates its per-layer
// cache tensors (PyTorch's CPU allocator aligns to 64 B): the Python side's
// torch.zeros per layer reads from memory laid out the same way.
struct VllmCache {
  static constexpr size_t kLayerBytes = size_t(2) * kEngineBlocks * kChunk;
  VllmCache() {
    for (auto& l : layers) {
      l = static_cast<std::byte*>(std::aligned_alloc(64, kLayerBytes));
      for (size_t i = 0; i < kLayerBytes; i += 4096) l[i] = std::byte(i >> 12);  // fault in every page
    }
  }
  ~VllmCache() {
    for (auto* l : layers) std::free(l);
  }
  VllmCache(const VllmCache&) = delete;
  VllmCache& operator=(const VllmCache&) = delete;
  // The 64 chunks of engine block b in pool order (layer, K then V).
  void chunks(uint32_t b, cxlkv_chunk* out) {
    for (uint32_t l = 0; l < kLayers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) *out++ = cxlkv_chunk{layers[l] + (size_t(kv) * kEngineBlocks + b) * kChunk, kChunk};
  }
  std::byte* layers[kLayers] = {};
};

// Lockstep with py_bench.py (see the top of the file): wait for the go line
// before a batch, report the batch after it.
struct Lockstep {
  bool on = std::getenv("CXLKV_KVCAPI_LOCKSTEP") != nullptr;
  bool wait() const {
    if (!on) return true;
    for (int c; (c = std::getchar()) != '\n';)
      if (c == EOF) return false;
    return true;
  }
  // "<kind> <bytes> <wall s> <cpu s>" of each side, one line.
  void report(char kind, const std::vector<double>& sides) const {
    if (!on) return;
    std::printf("%c", kind);
    for (size_t i = 0; i < sides.size(); i += 3)
      std::printf(" %llu %.9f %.9f", (unsigned long long)sides[i], sides[i + 1], sides[i + 2]);
    std::printf("\n");
    std::fflush(stdout);
  }
};

std::vector<cxlkv_kv_key> keys_of(uint64_t tag, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = tag + i;
  std::vector<cxlkv_kv_key> out;
  for (const auto& k : cxlkv::keys_from_ids(ids)) out.push_back(cxlkv_kv_key{k.lo, k.hi});
  return out;
}

// Seconds of CPU time of the calling thread (the thread doing the copies and
// the index work): a rate per CPU-second is far less sensitive to other
// processes' load than a wall-clock rate.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Per-batch rates, wall-clock and per CPU-second of the calling thread.
struct Rates {
  std::vector<double> wall, cpu;  // GB/s; GB per CPU-second
  void add(uint64_t bytes, double wall_s, double cpu_s) {
    wall.push_back(double(bytes) / std::max(wall_s, 1e-9) / 1e9);
    cpu.push_back(double(bytes) / std::max(cpu_s, 1e-9) / 1e9);
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// One way of making the batch calls: a batch of m blocks from pass position
// lo (engine blocks (lo + j) mod 16); returns the blocks it did.
class Side {
 public:
  explicit Side(VllmCache& c) : cache_(c) {}
  virtual ~Side() = default;
  virtual size_t publish(const cxlkv_kv_key* keys, size_t lo, size_t m) = 0;
  virtual size_t fetch(const cxlkv_kv_key* keys, size_t lo, size_t m) = 0;
  Rates pub, fet;  // per batch

 protected:
  void fill(size_t lo, size_t m) {
    for (size_t j = 0; j < m; j++) cache_.chunks(uint32_t((lo + j) % kEngineBlocks), &ch_[j * 2 * kLayers]);
  }
  size_t count(size_t m, int32_t good) const {
    size_t k = 0;
    for (size_t j = 0; j < m; j++) k += st_[j] == good;
    return k;
  }
  VllmCache& cache_;
  std::vector<cxlkv_chunk> ch_ = std::vector<cxlkv_chunk>(size_t(kBatch) * 2 * kLayers);
  std::vector<uint32_t> nch_ = std::vector<uint32_t>(kBatch, 2 * kLayers);
  std::vector<int32_t> st_ = std::vector<int32_t>(kBatch);
};

// The C API: cxlkv_kv_put_chain (each batch a chain from a root) /
// cxlkv_kv_get_many, what the Python package calls.
class CapiSide final : public Side {
 public:
  CapiSide(cxlkv_kv* kv, VllmCache& c) : Side(c), kv_(kv) {}
  size_t publish(const cxlkv_kv_key* keys, size_t lo, size_t m) override {
    fill(lo, m);
    int rc = cxlkv_kv_put_chain(kv_, nullptr, keys, m, kBlock, ch_.data(), nch_.data(), st_.data());
    return rc < 0 ? 0 : count(m, CXLKV_KV_RESERVED);
  }
  size_t fetch(const cxlkv_kv_key* keys, size_t lo, size_t m) override {
    fill(lo, m);
    int rc = cxlkv_kv_get_many(kv_, keys, m, ch_.data(), nch_.data(), st_.data());
    return rc < 0 ? 0 : count(m, 0);
  }

 private:
  cxlkv_kv* kv_;
};

// The C++ KvStore over bench_kv.cpp's in-process stand-ins
// (kv_bench_support.hpp: mutex stripe locks, a first-fit range allocator,
// the same 192-block bound) on a 1 GiB pool of its own: `batched` makes the
// C API's calls (put_chain / get_many) without the real pool's two-tier
// locks, node heap and C layer; otherwise one block per call (reserve /
// write / publish, pin / fetch / unpin), the design of kv.publish_gbps /
// kv.fetch_gbps (bench_kv.cpp).  Engine memory of its own (OwnCache, a
// base, so that it exists before Side binds it).
struct OwnCache {
  VllmCache own_cache;
};

class LocalSide final : private OwnCache, public Side {
 public:
  // Engine memory of its own, as each side of the lockstep has.
  explicit LocalSide(bool batched) : Side(own_cache), batched_(batched) {}
  // Opens its pool, bounded to kCapacity blocks, kv carve faulted in.
  bool open(const std::string& what) {
    if (!pool_.open(what, 1ull << 30, 1, 0, kCapacity)) {
      std::fprintf(stderr, "bench kv_capi: %s pool: %s\n", what.c_str(), pool_.error.c_str());
      return false;
    }
    auto kc = pool_.regions[0]->carve(CXLKV_CARVE_KV).value();
    std::memset(pool_.regions[0]->at(kc.offset), 0, kc.size);
    return true;
  }
  size_t publish(const cxlkv_kv_key* keys, size_t lo, size_t m) override {
    auto k = keys_of(keys, m);
    fill(lo, m);
    cxlkv::KvStore& kv = *pool_.kv;
    if (batched_) {
      auto r = kv.put_chain(nullptr, k, kBlock, {ch_.data(), m * 2 * kLayers}, {nch_.data(), m}, {st_.data(), m});
      return r ? count(m, CXLKV_KV_RESERVED) : 0;
    }
    size_t ok = 0;
    for (size_t j = 0; j < m; j++) {
      auto r = kv.reserve(k[j], nullptr, kBlock);
      if (!r || !r->reserved()) continue;
      if (kv.write(*r, {&ch_[j * 2 * kLayers], 2 * kLayers}) && kv.publish(*r)) ok++;
      else (void)kv.abort(*r);
    }
    return ok;
  }
  size_t fetch(const cxlkv_kv_key* keys, size_t lo, size_t m) override {
    auto k = keys_of(keys, m);
    fill(lo, m);
    cxlkv::KvStore& kv = *pool_.kv;
    if (batched_) {
      auto r = kv.get_many(k, {ch_.data(), m * 2 * kLayers}, {nch_.data(), m}, {st_.data(), m});
      return r ? count(m, 0) : 0;
    }
    size_t ok = 0;
    for (size_t j = 0; j < m; j++) {
      auto p = kv.pin(k[j]);
      if (!p) continue;
      if (kv.fetch(*p, {&ch_[j * 2 * kLayers], 2 * kLayers})) ok++;
      (void)kv.unpin(*p);
    }
    return ok;
  }

 private:
  static std::vector<cxlkv::BlockKey> keys_of(const cxlkv_kv_key* k, size_t m) {
    std::vector<cxlkv::BlockKey> v(m);
    for (size_t j = 0; j < m; j++) v[j] = cxlkv::BlockKey{k[j].lo, k[j].hi};
    return v;
  }
  bool batched_;
  bench::BenchPool pool_;
};

// The sequence of batches (warm-up pass, then kPasses x (publish n, fetch n
// cycling over the kRecent most recently published)); at every batch
// position each side runs the same batch on its own pool, in rotating order,
// so that a load spike hits them all.  Lockstep: one go line per position,
// one report line after it with each side's "<bytes> <wall s> <cpu s>".
struct Run {
  std::vector<Side*> sides;
  Lockstep step;
  size_t turn = 0;

  bool position(char kind, const cxlkv_kv_key* keys, size_t lo, size_t m) {
    if (!step.wait()) return false;
    std::vector<double> out(3 * sides.size());
    for (size_t s = 0; s < sides.size(); s++) {
      // Rotating order, but fixed in lockstep (see the top of the file).
      size_t i = step.on ? s : (turn + s) % sides.size();
      Side& side = *sides[i];
      auto t0 = clk::now();
      double c0 = thread_cpu_s();
      size_t done = kind == 'F' ? side.fetch(keys, lo, m) : side.publish(keys, lo, m);
      double c1 = thread_cpu_s();
      double w = std::chrono::duration<double>(clk::now() - t0).count();
      if (kind != 'W') (kind == 'P' ? side.pub : side.fet).add(done * kBlock, w, c1 - c0);
      out[3 * i] = double(done * kBlock);
      out[3 * i + 1] = w;
      out[3 * i + 2] = c1 - c0;
    }
    turn++;
    step.report(kind, out);
    return true;
  }
  void publish(const std::vector<cxlkv_kv_key>& keys, char kind) {
    for (size_t lo = 0; lo < keys.size(); lo += kBatch)
      if (!position(kind, &keys[lo], lo, std::min<size_t>(kBatch, keys.size() - lo))) return;
  }
  void fetch(const std::vector<cxlkv_kv_key>& recent, size_t n) {
    std::vector<cxlkv_kv_key> k(kBatch);
    for (size_t lo = 0; lo < n; lo += kBatch) {
      size_t m = std::min<size_t>(kBatch, n - lo);
      for (size_t j = 0; j < m; j++) k[j] = recent[(lo + j) % recent.size()];
      if (!position('F', k.data(), lo, m)) return;
    }
  }
  void all(uint64_t key_base, size_t n) {
    publish(keys_of(key_base + 0x5000000, n), 'W');  // warm-up pass
    for (uint64_t pass = 0; pass < kPasses; pass++) {
      auto keys = keys_of(key_base + 0x6000000 + pass * n, n);
      publish(keys, 'P');
      fetch(std::vector<cxlkv_kv_key>(keys.end() - std::min<size_t>(kRecent, keys.size()), keys.end()), n);
    }
  }
};

// Median over batch positions of a[i] / b[i] (both sides ran position i).
double paired(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> q;
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    if (a[i] > 0 && b[i] > 0) q.push_back(a[i] / b[i]);
  return median(q);
}

void bench_kv_capi(bench::Results& res) {
  const size_t n = std::max<size_t>(64, size_t(512 * bench::scale()));
  // CXLKV_KVCAPI_SHARED_POOL=URI (py_bench.py's lockstep): work as node 2 on
  // the Python side's pool, under its lock manager and capacity bound, with
  // keys of its own: the pool, the manager and the bound are then the same
  // for both sides, only the caller differs.
  const char* shared = std::getenv("CXLKV_KVCAPI_SHARED_POOL");
  const uint64_t key_base = shared ? 0x10000000 : 0;
  const std::string uri =
      shared ? std::string(shared) : "shm:" + bench::shm_name("kvcapi") + ":" + std::to_string(1ull << 30);
  auto fail = [](const char* what) { std::fprintf(stderr, "bench kv_capi: %s: %s\n", what, cxlkv_last_error()); };
  cxlkv_format_opts fo{};
  fo.size = sizeof fo;
  fo.max_nodes = 4;
  fo.flags = CXLKV_FORMAT_F_FORCE;
  if (!shared && cxlkv_pool_format(uri.c_str(), &fo) != 0) return fail("format");
  cxlkv_pool* pool = nullptr;
  if (cxlkv_pool_open(uri.c_str(), &pool) != 0) return fail("open");
  cxlkv_lock_manager* mgr = nullptr;
  cxlkv_lock_manager_opts mo{};
  mo.size = sizeof mo;
  cxlkv_kv* kv = nullptr;
  cxlkv_kv_opts ko{};
  ko.size = sizeof ko;
  ko.node = shared ? 2 : 1;
  cxlkv_carve_info kc{};
  // At most kCapacity blocks cached: the pool-wide memory-tier bound, as
  // `cxlkvctl kv ... --mem-capacity` sets it (py_bench.py does that), set
  // before the KV store opens (a shared pool: the other side set it).
  auto bound = [&] {
    if (shared) return true;
    cxlkv::Region& r = *pool->region;
    auto ic = r.carve(CXLKV_CARVE_INDEX);
    if (!ic) return false;
    auto cur = cxlkv::index_policy(r.domain(), r.at(ic->offset));
    if (!cur) return false;
    cxlkv::IndexPolicy p;
    p.max_blocks = kCapacity;
    p.max_bytes = cur->max_bytes;
    p.interleave_stripe = cur->interleave_stripe;
    p.ndevices = cur->ndevices;
    for (unsigned i = 0; i < CXLKV_INDEX_MAX_DEVICES; i++) p.weights[i] = cur->weights[i];
    return cxlkv::index_set_policy(r.domain(), r.at(ic->offset), p).ok();
  };
  if (!shared && cxlkv_lock_manager_start(pool, &mo, &mgr) != 0) {
    fail("lock manager");
  } else if (!bound()) {
    std::fprintf(stderr, "bench kv_capi: cannot set the capacity\n");
  } else if (cxlkv_kv_open(pool, &ko, &kv) != 0) {
    fail("kv open");
  } else if (cxlkv_carve_lookup(pool, CXLKV_CARVE_KV, &kc) != 0) {
    fail("kv carve");
  } else {
    // Fault the kv carve into this mapping, writable, as the other side
    // did: zero it (our own pool), or populate the page tables for writing
    // without changing a byte (a shared pool holds the other side's
    // blocks): a read per page would map pages read-only and leave a
    // write fault per page inside the timed batches.
    auto* carve = static_cast<std::byte*>(cxlkv_pool_base(pool)) + kc.offset;
    if (!shared) {
      std::memset(carve, 0, kc.size);
    } else if (madvise(carve, kc.size, MADV_POPULATE_WRITE) != 0) {
      for (uint64_t off = 0; off < kc.size; off += 4096)  // older kernels: a no-op atomic write per page
        __atomic_fetch_add(reinterpret_cast<uint64_t*>(carve + off), 0, __ATOMIC_RELAXED);
    }
    VllmCache cache;
    CapiSide capi(kv, cache);
    // The stand-ins beside it (not in lockstep, or CXLKV_KVCAPI_LOCAL=1 in
    // lockstep: then the single-block one only, the kv.* design).
    const bool lockstep = std::getenv("CXLKV_KVCAPI_LOCKSTEP") != nullptr;
    const bool with_local = !lockstep || std::getenv("CXLKV_KVCAPI_LOCAL") != nullptr;
    LocalSide batched(true), single(false);
    Run run;
    run.sides.push_back(&capi);
    if (with_local && !lockstep && batched.open("kvcapi_batched")) run.sides.push_back(&batched);
    if (with_local && single.open("kvcapi_single")) run.sides.push_back(&single);
    run.all(key_base, n);
    // The median batch: a loaded machine slows some batches a lot, few not at all.
    res.set("kv_capi.publish_gbps", median(capi.pub.wall));
    res.set("kv_capi.fetch_gbps", median(capi.fet.wall));
    res.set("kv_capi.publish_gb_per_cpu_s", median(capi.pub.cpu));
    res.set("kv_capi.fetch_gb_per_cpu_s", median(capi.fet.cpu));
    for (Side* sd : run.sides) {
      if (sd == &capi) continue;
      const std::string g = sd == &batched ? "local_batch" : "local_single";
      res.set("kv_capi." + g + "_publish_gbps", median(sd->pub.wall));
      res.set("kv_capi." + g + "_fetch_gbps", median(sd->fet.wall));
      res.set("kv_capi.publish_vs_" + g, paired(capi.pub.wall, sd->pub.wall));
      res.set("kv_capi.fetch_vs_" + g, paired(capi.fet.wall, sd->fet.wall));
      res.set("kv_capi.publish_per_cpu_s_vs_" + g, paired(capi.pub.cpu, sd->pub.cpu));
      res.set("kv_capi.fetch_per_cpu_s_vs_" + g, paired(capi.fet.cpu, sd->fet.cpu));
    }
  }
  if (kv) cxlkv_kv_close(kv);
  if (mgr) cxlkv_lock_manager_stop(mgr);
  (void)cxlkv_node_remove_local(pool, ko.node);  // the node-local file the KV store's node made
  cxlkv_pool_close(pool);
}

}  // namespace

CXLKV_BENCH({"kv_capi", "baseline of py.*: 2 MiB blocks by cxlkv_kv_put_chain / get_many (batches of 32) from C++ "
                        "on a real pool (lock manager, two-tier locks, node heap, 192-block bound)",
             bench_kv_capi});
