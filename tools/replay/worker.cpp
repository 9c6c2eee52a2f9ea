// SPDX-License-Identifier: MIT
// Replay workers: prefill (lookup, fetch hits, produce + publish misses) and
// decode (fetch and verify every prompt block).
#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cxlkv/kv.hpp"
#include "cxlkv/layout.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "cxlkv/tier.hpp"
#include "index/prefix_index.hpp"
#include "pool_open.hpp"
#include "tier/ssd_payload_tier.hpp"
#include "util/clock.hpp"
#include "replay.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace replay {

using namespace cxlkv;

size_t coord_bytes(uint64_t n) { return sizeof(Coord) + n * sizeof(std::atomic<uint32_t>); }

void LatHist::add(uint64_t ns) {
  // Bucket = floor(4 * log2(ns)): the exponent and the two bits below the top one.
  uint32_t b = 0;
  if (ns >= 1) {
    uint32_t e = 63 - uint32_t(__builtin_clzll(ns));
    uint32_t frac = e >= 2 ? uint32_t(ns >> (e - 2)) & 3 : uint32_t(ns << (2 - e)) & 3;
    b = std::min<uint32_t>(kBuckets - 1, e * 4 + frac);
  }
  bucket[b]++;
  count++;
}

void LatHist::merge(const LatHist& o) {
  count += o.count;
  for (uint32_t i = 0; i < kBuckets; i++) bucket[i] += o.bucket[i];
}

double LatHist::percentile_us(double pct) const {
  if (!count) return 0;
  uint64_t want = std::max<uint64_t>(1, uint64_t(std::ceil(double(count) * pct / 100.0))), seen = 0;
  for (uint32_t i = 0; i < kBuckets; i++)
    if ((seen += bucket[i]) >= want) {
      // Upper edge of bucket i: 2^(e) * (1 + (frac + 1) / 4).
      uint32_t e = i / 4, frac = i % 4;
      return std::ldexp(1.0 + (frac + 1) / 4.0, int(e)) / 1000.0;
    }
  return 0;
}

static inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The payload pattern: 64-bit word i of chunk j of block (lo, hi) is
// s + i * kStep, s = mix(lo ^ mix(hi + j)): every byte depends on the key,
// the chunk and the position (a block, chunk or line read from the wrong
// place fails), and it is written and checked at memory speed (AVX-512 where
// the CPU has it), so the replay measures the store rather than the pattern
// (the former per-word mixing ran at ~1 GB/s, below the copies it checked).
constexpr uint64_t kStep = 0x9e3779b97f4a7c15ULL;

static bool have_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

__attribute__((target("avx512f"))) static void fill_words_avx512(uint64_t s, uint64_t* q, size_t words) {
  __m512i v = _mm512_add_epi64(_mm512_set1_epi64(int64_t(s)),
                               _mm512_set_epi64(int64_t(7 * kStep), int64_t(6 * kStep), int64_t(5 * kStep),
                                                int64_t(4 * kStep), int64_t(3 * kStep), int64_t(2 * kStep),
                                                int64_t(kStep), 0));
  const __m512i step = _mm512_set1_epi64(int64_t(8 * kStep));
  size_t i = 0;
  for (; i + 8 <= words; i += 8) {
    _mm512_storeu_si512(q + i, v);
    v = _mm512_add_epi64(v, step);
  }
  for (; i < words; i++) q[i] = s + i * kStep;
}

__attribute__((target("avx512f"))) static bool check_words_avx512(uint64_t s, const uint64_t* q, size_t words) {
  __m512i v = _mm512_add_epi64(_mm512_set1_epi64(int64_t(s)),
                               _mm512_set_epi64(int64_t(7 * kStep), int64_t(6 * kStep), int64_t(5 * kStep),
                                                int64_t(4 * kStep), int64_t(3 * kStep), int64_t(2 * kStep),
                                                int64_t(kStep), 0));
  const __m512i step = _mm512_set1_epi64(int64_t(8 * kStep));
  size_t i = 0;
  __mmask8 bad = 0;
  for (; i + 8 <= words; i += 8) {
    bad |= _mm512_cmpneq_epi64_mask(_mm512_loadu_si512(q + i), v);
    v = _mm512_add_epi64(v, step);
    if ((i & 1023) == 0 && bad) return false;
  }
  if (bad) return false;
  for (; i < words; i++)
    if (q[i] != s + i * kStep) return false;
  return true;
}

void fill_chunk(uint64_t lo, uint64_t hi, uint32_t j, std::byte* p, size_t n) {
  const uint64_t s = mix(lo ^ mix(hi + j));
  const size_t words = n / 8;
  if (reinterpret_cast<uintptr_t>(p) % 8 == 0 && have_avx512()) {
    fill_words_avx512(s, reinterpret_cast<uint64_t*>(p), words);
  } else {
    for (size_t i = 0; i < words; i++) {
      const uint64_t v = s + i * kStep;
      std::memcpy(p + i * 8, &v, 8);
    }
  }
  for (size_t i = words * 8; i < n; i++) p[i] = std::byte(s >> (i % 8));
}

bool check_chunk(uint64_t lo, uint64_t hi, uint32_t j, const std::byte* p, size_t n) {
  const uint64_t s = mix(lo ^ mix(hi + j));
  const size_t words = n / 8;
  if (reinterpret_cast<uintptr_t>(p) % 8 == 0 && have_avx512()) {
    if (!check_words_avx512(s, reinterpret_cast<const uint64_t*>(p), words)) return false;
  } else {
    for (size_t i = 0; i < words; i++) {
      const uint64_t v = s + i * kStep;
      if (std::memcmp(p + i * 8, &v, 8) != 0) return false;
    }
  }
  for (size_t i = words * 8; i < n; i++)
    if (p[i] != std::byte(s >> (i % 8))) return false;
  return true;
}

std::vector<Request> load_workload(const Config& c, std::string* err) {
  if (c.trace.empty()) {
    GeneratorOptions g = c.gen;
    if (c.max_requests) g.requests = c.max_requests;
    return generate_workload(g);
  }
  auto r = read_trace(c.trace, c.max_requests);
  if (!r) {
    *err = r.error().message();
    return {};
  }
  return std::move(r.value());
}

namespace {

// Blocks per batch call: a request's blocks go to the store in batches of
// this many (one stripe-lock round per batch instead of per block).
constexpr uint32_t kBatch = 16;

// A tiny paged KV cache of the engine: the worker's side of every transfer.
struct Engine {
  explicit Engine(const Config& c) {
    layout.num_layers = c.layers;
    layout.num_blocks = kBatch;  // one engine block per block of a batch
    layout.block_size = kTraceBlockTokens;
    layout.num_kv_heads = c.kv_heads;
    layout.head_size = c.head_size;
    layout.dtype_bytes = 2;
    layout.order = LayoutOrder::layer_first;
    per_tensor = layout.chunk_bytes() * layout.num_blocks;
    bytes = per_tensor * 2 * layout.num_layers;
    // The engine's memory, as a serving engine allocates its KV cache: one
    // mapping faulted in at once (one call instead of a zeroed 4 KiB
    // first-touch fault per page, then a memset over the same bytes).  No
    // MADV_HUGEPAGE: on this VM zeroing fresh huge pages cost ~70 ms of CPU
    // per worker inside the measured window (the host backs never-touched
    // guest memory on first write), more than fewer TLB misses saved.
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      store.resize(bytes);
      base = store.data();
    } else {
      base = static_cast<std::byte*>(m);
      mapped = true;
      (void)madvise(m, bytes, MADV_POPULATE_WRITE);  // Linux 5.14+; else first touch faults
    }
    for (uint32_t i = 0; i < 2 * layout.num_layers; i++) layout.bases.push_back(base + i * per_tensor);
  }
  ~Engine() {
    if (mapped) munmap(base, bytes);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  std::vector<Chunk> chunks(uint32_t engine_block) {
    uint32_t id = engine_block % layout.num_blocks;
    auto r = chunks_for_blocks(layout, {&id, 1});
    return r.ok() ? r.value() : std::vector<Chunk>{};
  }
  EngineLayout layout;
  uint64_t per_tensor, bytes;
  std::byte* base = nullptr;
  bool mapped = false;
  std::vector<std::byte> store;  // where the mapping failed
};

void wait_until(uint64_t t_ns) {
  while (monotonic_ns() < t_ns) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void spin_wait(const std::atomic<uint64_t>& v, uint64_t want, const std::atomic<uint32_t>& abort) {
  for (uint32_t i = 0; v.load(std::memory_order_acquire) != want; i++) {
    if (abort.load()) return;
    if (i < 100) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

int run_worker(const Config& c) {
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "cxlkv-replay %s worker %u (node %u): %s\n", c.worker.c_str(), c.worker_index, c.node,
                 m.c_str());
    return 1;
  };
  std::string err;
  std::vector<Request> reqs = load_workload(c, &err);
  if (reqs.empty()) return fail(err.empty() ? "empty workload" : err);

  int fd = shm_open(c.coord.c_str(), O_RDWR, 0);
  if (fd < 0) return fail("coordination segment " + c.coord + ": " + std::strerror(errno));
  void* m = mmap(nullptr, coord_bytes(reqs.size()), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail("mmap coordination segment: " + std::string(std::strerror(errno)));
  Coord& co = *static_cast<Coord*>(m);
  WorkerCounters& wc = co.workers[c.node];

  // Each worker maps the pool's pages as it first uses them (its share of
  // the blocks) rather than the whole pool at attach: page tables built at
  // attach, and torn down at exit, for what it never touches.
  OpenOptions oo;
  oo.map_on_use = true;
  auto region = cxlkv_tools::open_pool(c.pool_uri, oo);  // its failure printed once (fail)
  if (!region) return fail(region.error().message());
  std::vector<std::unique_ptr<Region>> extra;
  KvOpenOptions ko;
  for (auto& u : c.extra_pools) {
    auto r = cxlkv_tools::open_pool(u, oo);
    if (!r) return fail(r.error().message());
    extra.push_back(std::move(r.value()));
    ko.extra_devices.push_back(extra.back().get());
  }
  // SSD tier: the file the parent created and sized; this node places in
  // its own partition (node of prefill + decode + 1, the parent is 0) and
  // reads any block the index names.  The parent probed the bandwidth and
  // cached it in the device header.
  std::unique_ptr<SsdPool> ssd;
  std::unique_ptr<SsdPayloadTier> ssd_tier;
  if (!c.ssd_path.empty()) {
    SsdPoolOptions so;
    so.devices.push_back(SsdDeviceConfig{c.ssd_path, 0, 0, false});
    so.partition = c.node;
    so.partitions = c.prefill + c.decode + 1;
    auto p = SsdPool::open(so);
    if (!p) return fail(p.error().message());
    ssd = std::move(p.value());
    ssd_tier = std::make_unique<SsdPayloadTier>(*ssd);
    ko.ssd_tier = ssd_tier.get();
    ko.demote_on_evict = true;
    ko.promote_on_hit = true;
  }
  NodeOptions no;
  no.node = c.node;
  no.heartbeat = true;
  auto node = NodeContext::attach(*region.value(), no);
  if (!node) return fail(node.error().message());
  auto session = open_kv_session(*region.value(), *node.value(), ko);
  if (!session) return fail(session.error().message());
  KvStore& kv = session.value()->store();
  co.attached++;  // the parent may now unlink the pools' and this segment's names

  Engine eng(c);
  const uint64_t block_bytes = eng.layout.block_bytes();
  const bool prefill = c.worker == "prefill";

  auto lat = [&](LatOp op, uint64_t t0) {
    uint64_t t = monotonic_ns();
    wc.lat[op].add(t - t0);
    return t;
  };
  // Chunks of engine blocks 0..n-1 (one batch), concatenated, with counts.
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks;
  auto batch_chunks = [&](size_t n) {
    chunks.clear();
    nchunks.clear();
    for (uint32_t b = 0; b < n; b++) {
      auto ch = eng.chunks(b);
      nchunks.push_back(uint32_t(ch.size()));
      chunks.insert(chunks.end(), ch.begin(), ch.end());
    }
  };
  // The chunks of block b of the current batch.
  auto block_chunks = [&](size_t b) {
    size_t off = 0;
    for (size_t i = 0; i < b; i++) off += nchunks[i];
    return std::span<const Chunk>(chunks.data() + off, nchunks[b]);
  };
  auto report = [&](const char* who, uint64_t r, size_t i, const BlockKey& k, const char* what,
                    const std::string& why) {
    std::fprintf(stderr, "cxlkv-replay: %s of request %lu block %zu (%s): %s: %s\n", who, (unsigned long)r, i,
                 to_hex(k).c_str(), what, why.c_str());
  };
  // Pin, fetch, verify and unpin keys[first..last) in batches: one pin_many
  // and unpin_many call per batch (the stripe-lock rounds); the pinned
  // blocks are fetched one fetch_many call each and each is verified right
  // after its copy, while its 2 MiB are still in this core's cache (a check
  // after the whole batch's 32 MiB read them back from memory).  Returns
  // the blocks found missing (not cached at pin time); counts errors.  An
  // I/O error (a fetch or unpin that failed) is reported as such, apart from
  // bytes that differ.  Prefill (leased != nullptr): lease each pinned
  // block for request r's decode while the pin holds it, marking leased[i].
  // Time spent verifying inside read_blocks: left out of the whole-fetch latency.
  uint64_t verify_ns = 0;
  auto read_blocks = [&](std::span<const BlockKey> keys, size_t first, uint64_t r, const char* who,
                         std::vector<char>* leased = nullptr, std::vector<size_t>* missed = nullptr) -> uint64_t {
    uint64_t missing = 0;
    std::vector<KvPin> pins(kBatch);
    std::vector<int32_t> pst(kBatch), fst(kBatch), ust(kBatch);
    std::vector<std::string> fetch_err(kBatch);
    std::vector<int> bad_chunk(kBatch);  // first chunk whose bytes differ, -1: none
    for (size_t at = first; at < keys.size(); at += kBatch) {
      const size_t n = std::min<size_t>(kBatch, keys.size() - at);
      auto ks = keys.subspan(at, n);
      uint64_t t0 = monotonic_ns();
      auto pr = kv.pin_many(ks, {pins.data(), n}, {pst.data(), n});
      t0 = lat(kLatPin, t0);
      if (!pr) {
        report(who, r, at, ks[0], "pin failed", pr.error().message());
        wc.errors += n;
        continue;
      }
      if (leased) {
        std::vector<int32_t> lst(n);
        auto lr = kv.lease(ks, r + 1, KvStore::kLeaseNodeAny, c.lease_ms, lst);
        for (size_t b = 0; b < n; b++) {
          if (lr && lst[b] == 0) (*leased)[at + b] = 1;
          else if (pst[b] == 0) wc.lease_errors++;  // pinned, yet not leased
        }
      }
      batch_chunks(n);
      // The fetch latency is the batch's fetch calls together (as one
      // batched call), the checks between them left out.
      uint64_t fetch_ns = 0;
      for (size_t b = 0; b < n; b++) {
        fetch_err[b].clear();
        bad_chunk[b] = -1;
        fst[b] = pst[b];
        if (pst[b] != 0) continue;
        auto ch = block_chunks(b);
        const uint64_t tf = monotonic_ns();
        auto fr = kv.fetch_many({&pins[b], 1}, ch, {&nchunks[b], 1}, {&fst[b], 1});
        fetch_ns += monotonic_ns() - tf;
        if (!fr) {
          fst[b] = fr.error().code() < 0 ? fr.error().code() : -EIO;
          fetch_err[b] = fr.error().message();
          continue;
        }
        if (fst[b] != 0) {
          fetch_err[b] = kv.last_block_error();
          continue;
        }
        if (!c.verify) continue;
        const uint64_t tv = monotonic_ns();
        for (uint32_t j = 0; j < ch.size(); j++)
          if (!check_chunk(ks[b].lo, ks[b].hi, j, static_cast<const std::byte*>(ch[j].addr), ch[j].len)) {
            bad_chunk[b] = int(j);
            break;
          }
        verify_ns += monotonic_ns() - tv;
      }
      wc.lat[kLatFetch].add(fetch_ns);
      t0 = monotonic_ns();
      auto ur = kv.unpin_many({pins.data(), n}, {ust.data(), n});
      const std::string unpin_err = kv.last_block_error();
      lat(kLatUnpin, t0);
      for (size_t b = 0; b < n; b++) {
        if (pst[b] == kKvMiss) {
          missing++;
          if (missed) missed->push_back(at + b);
          continue;
        }
        const char* what = nullptr;
        std::string why;
        if (pst[b] != 0) what = "pin failed", why = std::strerror(-pst[b]);
        else if (fst[b] != 0) what = "fetch failed (I/O error)", why = fetch_err[b].empty() ? std::strerror(-fst[b]) : fetch_err[b];
        else if (!ur || ust[b] != 0) what = "unpin failed", why = ur ? unpin_err : ur.error().message();
        else if (bad_chunk[b] >= 0) what = "bytes differ from what was published", why = "chunk " + std::to_string(bad_chunk[b]);
        if (what) {
          report(who, r, at + b, ks[b], what, why);
          wc.errors++;
          continue;
        }
        const bool from_ssd = pins[b].loc_tier == CXLKV_TIER_SSD;  // the tier this fetch read
        wc.blocks_read++;
        wc.bytes_read += block_bytes;
        (from_ssd ? wc.ssd_hits : wc.mem_hits)++;
        (from_ssd ? wc.ssd_bytes : wc.mem_bytes) += block_bytes;
      }
    }
    return missing;
  };

  for (;;) {
    if (co.abort.load()) break;
    if (prefill) {
      uint64_t r = co.next_prefill.fetch_add(1);
      if (r >= reqs.size()) break;
      const Request& q = reqs[r];
      // Bounded queue to decode: request r starts once r - max_lag requests
      // are decoded (their prefills came earlier, so this always progresses).
      const uint64_t lag = c.max_lag ? c.max_lag : c.prefill + c.decode;
      for (uint32_t i = 0; r >= co.decoded.load(std::memory_order_acquire) + lag; i++) {
        if (co.abort.load()) break;
        if (i < 100) sched_yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      std::vector<BlockKey> keys = keys_from_ids(q.hash_ids);
      // ---- metadata phase, in trace order --------------------------------
      spin_wait(co.turn, r, co.abort);
      if (c.time_scale > 0) wait_until(co.start_ns + uint64_t(double(q.timestamp_ms) * c.time_scale * 1e6));
      uint64_t t0 = monotonic_ns();
      size_t ready = kv.lookup(keys);
      const uint64_t t_reserve = lat(kLatLookup, t0);
      // One reserve_chain call for the rest of the chain.
      std::vector<KvReservation> mine;
      std::vector<size_t> busy;
      std::vector<char> leased(keys.size(), 0);  // handed off to request r's decode
      size_t hit = ready;
      if (ready < keys.size()) {
        const size_t n = keys.size() - ready;
        std::vector<KvReservation> out(n);
        std::vector<int32_t> st(n, -ECANCELED);
        // A block another request is still writing (BUSY) does not end the
        // chain: the blocks below it are reserved or found as usual, and ours
        // are published once its writer has published it (-EAGAIN until then).
        auto rr = kv.reserve_chain(ready ? &keys[ready - 1] : nullptr, std::span(keys).subspan(ready), block_bytes,
                                   out, st, /*through_busy=*/true);
        const bool call_ok = rr.ok();
        lat(kLatReserve, t_reserve);
        bool counting = true;
        for (size_t i = 0; i < n; i++) {
          if (!call_ok || st[i] < 0) {
            // No space / parent evicted meanwhile: the rest is computed, not cached.
            wc.uncached += n - i;
            break;
          }
          if (st[i] == kKvReserved) {
            counting = false;
            mine.push_back(out[i]);
          } else if (counting) {
            hit++;
            if (st[i] == kKvBusy) busy.push_back(ready + i);
          }
        }
      }
      const uint64_t reserve_ns = monotonic_ns() - t_reserve;
      co.turn.store(r + 1, std::memory_order_release);
      // ---- payload phase ---------------------------------------------------
      if (hit) {
        const uint64_t t_fetch = monotonic_ns();
        verify_ns = 0;
        for (size_t i : busy) kv.wait_ready(keys[i], std::chrono::milliseconds(10000));
        // evicted between lookup and pin (bounded capacity)
        wc.lost_hits += read_blocks(std::span<const BlockKey>(keys.data(), hit), 0, r, "prefill", &leased);
        lat(kLatWholeFetch, t_fetch + verify_ns);
      }
      const uint64_t t_write = monotonic_ns();
      std::vector<int32_t> st(kBatch);
      for (size_t at = 0; at < mine.size(); at += kBatch) {
        const size_t n = std::min<size_t>(kBatch, mine.size() - at);
        std::span<KvReservation> rs(mine.data() + at, n);
        batch_chunks(n);
        // Each block is produced and written by one write_many call while
        // its 2 MiB are still in this core's cache (producing the whole
        // batch first left the copy to read 32 MiB back from memory).  The
        // write latency is the batch's write calls together; a block after
        // a failed one is not written (it could not be published).
        uint64_t write_ns = 0;
        std::string write_err;
        size_t good = 0;
        for (size_t b = 0; b < n; b++) st[b] = -ECANCELED;
        for (size_t b = 0; b < n; b++) {
          auto ch = block_chunks(b);
          for (uint32_t j = 0; j < ch.size(); j++)
            fill_chunk(rs[b].key.lo, rs[b].key.hi, j, static_cast<std::byte*>(ch[j].addr), ch[j].len);
          const uint64_t tw = monotonic_ns();
          auto wr = kv.write_many(rs.subspan(b, 1), ch, {&nchunks[b], 1}, {&st[b], 1});
          write_ns += monotonic_ns() - tw;
          if (wr && st[b] == kKvReserved) {
            good++;
            continue;
          }
          write_err = wr ? kv.last_block_error() : wr.error().message();
          break;
        }
        wc.lat[kLatWrite].add(write_ns);
        t0 = monotonic_ns();
        // Publish the written prefix of the batch, parents first; a block
        // after a failed write cannot be published (its parent is missing).
        if (good < n) {
          report("prefill", r, at + good, rs[good].key, "write failed (I/O error)", write_err);
          wc.errors++;
        }
        size_t published = 0;
        for (uint32_t t = 0; published < good && !co.abort.load(); t++) {
          auto pr = kv.publish_many(rs.subspan(published, good - published), {st.data(), good - published});
          size_t k = 0;
          while (pr && k < good - published && st[k] == kKvReserved) k++;
          published += k;
          // -EAGAIN: the parent block is still being written by an earlier
          // request: retry the rest.  Anything else (the parent's writer
          // died): drop ours and everything after it.
          if (published == good || !pr || st[k] != -EAGAIN) break;
          if (t < 100) sched_yield();
          else std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        lat(kLatPublish, t0);
        if (published) {
          // Hand the new blocks off to this request's decode: leased blocks
          // are not evicted before it releases them (or the lease ends).
          std::vector<BlockKey> pk(published);
          std::vector<int32_t> lst(published);
          for (size_t b = 0; b < published; b++) pk[b] = rs[b].key;
          auto lr = kv.lease(pk, r + 1, KvStore::kLeaseNodeAny, c.lease_ms, lst);
          for (size_t b = 0; b < published; b++) {
            if (lr && lst[b] == 0) {
              for (size_t i = 0; i < keys.size(); i++)
                if (keys[i] == pk[b]) leased[i] = 1;
            } else {
              wc.lease_errors++;
            }
          }
        }
        wc.blocks_written += published;
        wc.bytes_written += published * block_bytes;
        if (published < n) {
          std::span<KvReservation> rest(mine.data() + at + published, mine.size() - at - published);
          std::vector<int32_t> ast(rest.size());
          (void)kv.abort_many(rest, ast);
          wc.uncached += rest.size() - (good < n ? 1 : 0);
          break;
        }
      }
      if (!mine.empty()) wc.lat[kLatWholePublish].add(reserve_ns + (monotonic_ns() - t_write));
      wc.requests++;
      wc.input_tokens += q.input_length;
      wc.hit_tokens += hit_tokens(q, hit);
      wc.hit_blocks += hit;
      uint32_t handoff = 0;
      while (handoff < keys.size() && leased[handoff]) handoff++;
      wc.not_handed_off += keys.size() - handoff;
      co.ready[r].store(1 + handoff, std::memory_order_release);
      co.prefilled++;
    } else {
      uint64_t r = co.next_decode.fetch_add(1);
      if (r >= reqs.size()) break;
      for (uint32_t i = 0; co.ready[r].load(std::memory_order_acquire) == 0; i++) {
        if (co.abort.load()) break;
        if (i < 100) sched_yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      std::vector<BlockKey> all = keys_from_ids(reqs[r].hash_ids);
      // The blocks its prefill handed off: each must be here (its lease
      // keeps it) unless the lease ended first.
      const uint32_t rd = co.ready[r].load(std::memory_order_acquire);
      std::vector<BlockKey> keys(all.begin(), all.begin() + std::min<size_t>(all.size(), rd ? rd - 1 : 0));
      const uint64_t t_fetch = monotonic_ns();
      verify_ns = 0;
      std::vector<size_t> missed;
      uint64_t misses = read_blocks(keys, 0, r, "decode", nullptr, &missed);
      if (!keys.empty()) lat(kLatWholeFetch, t_fetch + verify_ns);
      if (!keys.empty()) {
        std::vector<int32_t> rst(keys.size());
        auto rl = kv.lease_release(keys, r + 1, rst);
        for (size_t i : missed) {
          if (rl && rst[i] == -ETIMEDOUT) {
            wc.expired_misses++;  // its lease ended (ttl or our node declared dead): excused, named in the summary
            misses--;
          } else {
            report("decode", r, i, keys[i], "decode miss",
                   "a block handed off to this request was evicted before it was read (lease not honoured)");
            wc.errors++;
          }
        }
        for (size_t i = 0; i < keys.size(); i++)
          if (rl && rst[i] < 0 && rst[i] != -ETIMEDOUT && rst[i] != kKvMiss) wc.lease_errors++;
      }
      wc.decode_misses += misses;
      wc.requests++;
      co.decoded++;
    }
  }
  kv.flush_stats();
  wc.demotions = kv.index().counters().demotions;
  wc.promotions = kv.index().counters().promotions;
  wc.lease_expiries = kv.index().counters().lease_expiries;
  wc.done = 1;
  munmap(m, coord_bytes(reqs.size()));
  return 0;
}

}  // namespace replay
