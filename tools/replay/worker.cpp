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
#include "kv/store_index.hpp"
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

// The pools, the SSD tier, the node and the KV session of one worker,
// destroyed in the reverse order of opening.
struct Attached {
  std::unique_ptr<Region> region;
  std::vector<std::unique_ptr<Region>> extra;
  std::unique_ptr<SsdPool> ssd;
  std::unique_ptr<SsdPayloadTier> ssd_tier;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

Result<void> attach_worker(const Config& c, Attached& a) {
  // Each worker maps the pool's pages as it first uses them (its share of
  // the blocks) rather than the whole pool at attach: page tables built at
  // attach, and torn down at exit, for what it never touches.
  OpenOptions oo;
  oo.map_on_use = true;
  auto region = cxlkv_tools::open_pool(c.pool_uri, oo);  // its failure printed once (fail)
  if (!region) return region.error();
  a.region = std::move(region.value());
  KvOpenOptions ko;
  for (auto& u : c.extra_pools) {
    auto r = cxlkv_tools::open_pool(u, oo);
    if (!r) return r.error();
    a.extra.push_back(std::move(r.value()));
    ko.extra_devices.push_back(a.extra.back().get());
  }
  // SSD tier: the file the parent created and sized; this node places in
  // its own partition (node of prefill + decode + 1, the parent is 0) and
  // reads any block the index names.  The parent probed the bandwidth and
  // cached it in the device header.
  if (!c.ssd_path.empty()) {
    SsdPoolOptions so;
    so.devices.push_back(SsdDeviceConfig{c.ssd_path, 0, 0, false});
    so.partition = c.node;
    so.partitions = c.prefill + c.decode + 1;
    auto p = SsdPool::open(so);
    if (!p) return p.error();
    a.ssd = std::move(p.value());
    a.ssd_tier = std::make_unique<SsdPayloadTier>(*a.ssd);
    ko.ssd_tier = a.ssd_tier.get();
    ko.demote_on_evict = true;
    ko.promote_on_hit = true;
  }
  NodeOptions no;
  no.node = c.node;
  no.heartbeat = true;
  auto node = NodeContext::attach(*a.region, no);
  if (!node) return node.error();
  a.node = std::move(node.value());
  auto session = open_kv_session(*a.region, *a.node, ko);
  if (!session) return session.error();
  a.session = std::move(session.value());
  return {};
}

// One worker's requests: a prefill worker's (lookup, fetch hits, produce +
// publish misses, hand the blocks off to the decode) or a decode worker's
// (fetch and verify every block handed off to it).
class Worker {
 public:
  Worker(const Config& c, Coord& co, KvStore& kv)
      : c_(c), co_(co), wc_(co.workers[c.node]), kv_(kv), eng_(c), block_bytes_(eng_.layout.block_bytes()) {}

  void prefill(uint64_t r, const Request& q) {
    wait_for_decode_room(r);
    std::vector<BlockKey> keys = keys_from_ids(q.hash_ids);
    Reserved res = lookup_and_reserve(r, q, keys);
    std::vector<char> leased(keys.size(), 0);  // handed off to request r's decode
    // ---- payload phase ---------------------------------------------------
    if (res.hit) fetch_hits(r, keys, res, leased);
    write_and_publish(r, keys, res, leased);
    finish_prefill(r, q, keys, res.hit, leased);
  }

  void decode(uint64_t r, const Request& q) {
    for (uint32_t i = 0; co_.ready[r].load(std::memory_order_acquire) == 0; i++) {
      if (co_.abort.load()) break;
      if (i < 100) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::vector<BlockKey> all = keys_from_ids(q.hash_ids);
    // The blocks its prefill handed off: each must be here (its lease
    // keeps it) unless the lease ended first.
    const uint32_t rd = co_.ready[r].load(std::memory_order_acquire);
    std::vector<BlockKey> keys(all.begin(), all.begin() + std::min<size_t>(all.size(), rd ? rd - 1 : 0));
    const uint64_t t_fetch = monotonic_ns();
    verify_ns_ = 0;
    std::vector<size_t> missed;
    uint64_t misses = read_blocks(keys, 0, r, "decode", nullptr, &missed);
    if (!keys.empty()) lat(kLatWholeFetch, t_fetch + verify_ns_);
    if (!keys.empty()) misses -= release_leases(r, keys, missed);
    wc_.decode_misses += misses;
    wc_.requests++;
    co_.decoded++;
  }

 private:
  // What the metadata phase of a prefill found and reserved.
  struct Reserved {
    size_t hit = 0;                   // leading blocks found (READY, or BUSY being written)
    std::vector<KvReservation> mine;  // the blocks this request writes
    std::vector<size_t> busy;         // found blocks another request is still writing
    uint64_t reserve_ns = 0;          // lookup end to reservation end
  };

  uint64_t lat(LatOp op, uint64_t t0) {
    uint64_t t = monotonic_ns();
    wc_.lat[op].add(t - t0);
    return t;
  }
  // Chunks of engine blocks 0..n-1 (one batch), concatenated, with counts.
  void batch_chunks(size_t n) {
    chunks_.clear();
    nchunks_.clear();
    for (uint32_t b = 0; b < n; b++) {
      auto ch = eng_.chunks(b);
      nchunks_.push_back(uint32_t(ch.size()));
      chunks_.insert(chunks_.end(), ch.begin(), ch.end());
    }
  }
  // The chunks of block b of the current batch.
  std::span<const Chunk> block_chunks(size_t b) {
    size_t off = 0;
    for (size_t i = 0; i < b; i++) off += nchunks_[i];
    return std::span<const Chunk>(chunks_.data() + off, nchunks_[b]);
  }
  void report(const char* who, uint64_t r, size_t i, const BlockKey& k, const char* what, const std::string& why) {
    std::fprintf(stderr, "cxlkv-replay: %s of request %lu block %zu (%s): %s: %s\n", who, (unsigned long)r, i,
                 to_hex(k).c_str(), what, why.c_str());
  }

  // Pin, fetch, verify and unpin keys[first..last) in batches: one pin_many
  // and unpin_many call per batch (the stripe-lock rounds); the pinned
  // blocks are fetched one fetch_many call each and each is verified right
  // after its copy, while its 2 MiB are still in this core's cache (a check
  // after the whole batch's 32 MiB read them back from memory).  Returns
  // the blocks found missing (not cached at pin time); counts errors.  An
  // I/O error (a fetch or unpin that failed) is reported as such, apart from
  // bytes that differ.  Prefill (leased != nullptr): lease each pinned
  // block for request r's decode while the pin holds it, marking leased[i].
  // Time spent verifying goes to verify_ns_: left out of the whole-fetch latency.
  uint64_t read_blocks(std::span<const BlockKey> keys, size_t first, uint64_t r, const char* who,
                       std::vector<char>* leased = nullptr, std::vector<size_t>* missed = nullptr) {
    uint64_t missing = 0;
    std::vector<KvPin> pins(kBatch);
    std::vector<int32_t> pst(kBatch), fst(kBatch), ust(kBatch);
    std::vector<std::string> fetch_err(kBatch);
    std::vector<int> bad_chunk(kBatch);  // first chunk whose bytes differ, -1: none
    for (size_t at = first; at < keys.size(); at += kBatch) {
      const size_t n = std::min<size_t>(kBatch, keys.size() - at);
      auto ks = keys.subspan(at, n);
      uint64_t t0 = monotonic_ns();
      auto pr = kv_.pin_many(ks, {pins.data(), n}, {pst.data(), n});
      t0 = lat(kLatPin, t0);
      if (!pr) {
        report(who, r, at, ks[0], "pin failed", pr.error().message());
        wc_.errors += n;
        continue;
      }
      if (leased) {
        std::vector<int32_t> lst(n);
        auto lr = kv_.lease(ks, r + 1, KvStore::kLeaseNodeAny, c_.lease_ms, lst);
        for (size_t b = 0; b < n; b++) {
          if (lr && lst[b] == 0) (*leased)[at + b] = 1;
          else if (pst[b] == 0) wc_.lease_errors++;  // pinned, yet not leased
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
        auto fr = kv_.fetch_many({&pins[b], 1}, ch, {&nchunks_[b], 1}, {&fst[b], 1});
        fetch_ns += monotonic_ns() - tf;
        if (!fr) {
          fst[b] = fr.error().code() < 0 ? fr.error().code() : -EIO;
          fetch_err[b] = fr.error().message();
          continue;
        }
        if (fst[b] != 0) {
          fetch_err[b] = kv_.last_block_error();
          continue;
        }
        if (!c_.verify) continue;
        const uint64_t tv = monotonic_ns();
        for (uint32_t j = 0; j < ch.size(); j++)
          if (!check_chunk(ks[b].lo, ks[b].hi, j, static_cast<const std::byte*>(ch[j].addr), ch[j].len)) {
            bad_chunk[b] = int(j);
            break;
          }
        verify_ns_ += monotonic_ns() - tv;
      }
      wc_.lat[kLatFetch].add(fetch_ns);
      t0 = monotonic_ns();
      auto ur = kv_.unpin_many({pins.data(), n}, {ust.data(), n});
      const std::string unpin_err = kv_.last_block_error();
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
          wc_.errors++;
          continue;
        }
        const bool from_ssd = pins[b].loc_tier == CXLKV_TIER_SSD;  // the tier this fetch read
        wc_.blocks_read++;
        wc_.bytes_read += block_bytes_;
        (from_ssd ? wc_.ssd_hits : wc_.mem_hits)++;
        (from_ssd ? wc_.ssd_bytes : wc_.mem_bytes) += block_bytes_;
      }
    }
    return missing;
  }

  // Bounded queue to decode: request r starts once r - max_lag requests
  // are decoded (their prefills came earlier, so this always progresses).
  void wait_for_decode_room(uint64_t r) {
    const uint64_t lag = c_.max_lag ? c_.max_lag : c_.prefill + c_.decode;
    for (uint32_t i = 0; r >= co_.decoded.load(std::memory_order_acquire) + lag; i++) {
      if (co_.abort.load()) break;
      if (i < 100) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // ---- metadata phase, in trace order: the lookup, then one reserve_chain
  // call for the rest of the chain; the next request's turn after it.
  Reserved lookup_and_reserve(uint64_t r, const Request& q, const std::vector<BlockKey>& keys) {
    Reserved res;
    spin_wait(co_.turn, r, co_.abort);
    if (c_.time_scale > 0) wait_until(co_.start_ns + uint64_t(double(q.timestamp_ms) * c_.time_scale * 1e6));
    uint64_t t0 = monotonic_ns();
    size_t ready = kv_.lookup(keys);
    const uint64_t t_reserve = lat(kLatLookup, t0);
    res.hit = ready;
    if (ready < keys.size()) {
      const size_t n = keys.size() - ready;
      std::vector<KvReservation> out(n);
      std::vector<int32_t> st(n, -ECANCELED);
      // A block another request is still writing (BUSY) does not end the
      // chain: the blocks below it are reserved or found as usual, and ours
      // are published once its writer has published it (-EAGAIN until then).
      auto rr = kv_.reserve_chain(ready ? &keys[ready - 1] : nullptr, std::span(keys).subspan(ready), block_bytes_,
                                  out, st, /*through_busy=*/true);
      const bool call_ok = rr.ok();
      lat(kLatReserve, t_reserve);
      bool counting = true;
      for (size_t i = 0; i < n; i++) {
        if (!call_ok || st[i] < 0) {
          // No space / parent evicted meanwhile: the rest is computed, not cached.
          wc_.uncached += n - i;
          break;
        }
        if (st[i] == kKvReserved) {
          counting = false;
          res.mine.push_back(out[i]);
        } else if (counting) {
          res.hit++;
          if (st[i] == kKvBusy) res.busy.push_back(ready + i);
        }
      }
    }
    res.reserve_ns = monotonic_ns() - t_reserve;
    co_.turn.store(r + 1, std::memory_order_release);
    return res;
  }

  // The blocks found: wait for those still being written, then read them.
  void fetch_hits(uint64_t r, const std::vector<BlockKey>& keys, const Reserved& res, std::vector<char>& leased) {
    const uint64_t t_fetch = monotonic_ns();
    verify_ns_ = 0;
    for (size_t i : res.busy) kv_.wait_ready(keys[i], std::chrono::milliseconds(10000));
    // evicted between lookup and pin (bounded capacity)
    wc_.lost_hits += read_blocks(std::span<const BlockKey>(keys.data(), res.hit), 0, r, "prefill", &leased);
    lat(kLatWholeFetch, t_fetch + verify_ns_);
  }

  // Produce, write and publish the reserved blocks batch by batch, and hand
  // each published block off to this request's decode.
  void write_and_publish(uint64_t r, const std::vector<BlockKey>& keys, Reserved& res, std::vector<char>& leased) {
    std::vector<KvReservation>& mine = res.mine;
    const uint64_t t_write = monotonic_ns();
    std::vector<int32_t> st(kBatch);
    for (size_t at = 0; at < mine.size(); at += kBatch) {
      const size_t n = std::min<size_t>(kBatch, mine.size() - at);
      std::span<KvReservation> rs(mine.data() + at, n);
      batch_chunks(n);
      std::string write_err;
      const size_t good = write_batch(rs, st, write_err);
      uint64_t t0 = monotonic_ns();
      // Publish the written prefix of the batch, parents first; a block
      // after a failed write cannot be published (its parent is missing).
      if (good < n) {
        report("prefill", r, at + good, rs[good].key, "write failed (I/O error)", write_err);
        wc_.errors++;
      }
      const size_t published = publish_written(rs, good, st);
      lat(kLatPublish, t0);
      if (published) hand_off(r, keys, rs.first(published), leased);
      wc_.blocks_written += published;
      wc_.bytes_written += published * block_bytes_;
      if (published < n) {
        std::span<KvReservation> rest(mine.data() + at + published, mine.size() - at - published);
        std::vector<int32_t> ast(rest.size());
        (void)kv_.abort_many(rest, ast);
        wc_.uncached += rest.size() - (good < n ? 1 : 0);
        break;
      }
    }
    if (!mine.empty()) wc_.lat[kLatWholePublish].add(res.reserve_ns + (monotonic_ns() - t_write));
  }

  // Each block is produced and written by one write_many call while its
  // 2 MiB are still in this core's cache (producing the whole batch first
  // left the copy to read 32 MiB back from memory).  The write latency is
  // the batch's write calls together; a block after a failed one is not
  // written (it could not be published).  Returns the blocks written.
  size_t write_batch(std::span<KvReservation> rs, std::vector<int32_t>& st, std::string& write_err) {
    const size_t n = rs.size();
    uint64_t write_ns = 0;
    size_t good = 0;
    for (size_t b = 0; b < n; b++) st[b] = -ECANCELED;
    for (size_t b = 0; b < n; b++) {
      auto ch = block_chunks(b);
      for (uint32_t j = 0; j < ch.size(); j++)
        fill_chunk(rs[b].key.lo, rs[b].key.hi, j, static_cast<std::byte*>(ch[j].addr), ch[j].len);
      const uint64_t tw = monotonic_ns();
      auto wr = kv_.write_many(rs.subspan(b, 1), ch, {&nchunks_[b], 1}, {&st[b], 1});
      write_ns += monotonic_ns() - tw;
      if (wr && st[b] == kKvReserved) {
        good++;
        continue;
      }
      write_err = wr ? kv_.last_block_error() : wr.error().message();
      break;
    }
    wc_.lat[kLatWrite].add(write_ns);
    return good;
  }

  // Publish rs[0..good), retrying while a parent is still being written.
  // Returns the blocks published.
  size_t publish_written(std::span<KvReservation> rs, size_t good, std::vector<int32_t>& st) {
    size_t published = 0;
    for (uint32_t t = 0; published < good && !co_.abort.load(); t++) {
      auto pr = kv_.publish_many(rs.subspan(published, good - published), {st.data(), good - published});
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
    return published;
  }

  // Hand the new blocks off to this request's decode: leased blocks are not
  // evicted before it releases them (or the lease ends).
  void hand_off(uint64_t r, const std::vector<BlockKey>& keys, std::span<const KvReservation> published,
                std::vector<char>& leased) {
    std::vector<BlockKey> pk(published.size());
    std::vector<int32_t> lst(published.size());
    for (size_t b = 0; b < published.size(); b++) pk[b] = published[b].key;
    auto lr = kv_.lease(pk, r + 1, KvStore::kLeaseNodeAny, c_.lease_ms, lst);
    for (size_t b = 0; b < published.size(); b++) {
      if (lr && lst[b] == 0) {
        for (size_t i = 0; i < keys.size(); i++)
          if (keys[i] == pk[b]) leased[i] = 1;
      } else {
        wc_.lease_errors++;
      }
    }
  }

  // The request's counters, and the leading run of handed-off blocks told
  // to its decode.
  void finish_prefill(uint64_t r, const Request& q, const std::vector<BlockKey>& keys, size_t hit,
                      const std::vector<char>& leased) {
    wc_.requests++;
    wc_.input_tokens += q.input_length;
    wc_.hit_tokens += hit_tokens(q, hit);
    wc_.hit_blocks += hit;
    uint32_t handoff = 0;
    while (handoff < keys.size() && leased[handoff]) handoff++;
    wc_.not_handed_off += keys.size() - handoff;
    co_.ready[r].store(1 + handoff, std::memory_order_release);
    co_.prefilled++;
  }

  // Release the decode's leases; a block missed whose lease had ended is
  // excused (returned as a count), any other miss is an error.
  uint64_t release_leases(uint64_t r, const std::vector<BlockKey>& keys, const std::vector<size_t>& missed) {
    uint64_t excused = 0;
    std::vector<int32_t> rst(keys.size());
    auto rl = kv_.lease_release(keys, r + 1, rst);
    for (size_t i : missed) {
      if (rl && rst[i] == -ETIMEDOUT) {
        wc_.expired_misses++;  // its lease ended (ttl or our node declared dead): excused, named in the summary
        excused++;
      } else {
        report("decode", r, i, keys[i], "decode miss",
               "a block handed off to this request was evicted before it was read (lease not honoured)");
        wc_.errors++;
      }
    }
    for (size_t i = 0; i < keys.size(); i++)
      if (rl && rst[i] < 0 && rst[i] != -ETIMEDOUT && rst[i] != kKvMiss) wc_.lease_errors++;
    return excused;
  }

  const Config& c_;
  Coord& co_;
  WorkerCounters& wc_;
  KvStore& kv_;
  Engine eng_;
  const uint64_t block_bytes_;
  std::vector<Chunk> chunks_;     // the current batch's chunks (batch_chunks)
  std::vector<uint32_t> nchunks_;
  uint64_t verify_ns_ = 0;
};

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

  Attached a;
  if (auto r = attach_worker(c, a); !r) return fail(r.error().message());
  KvStore& kv = a.session->store();
  co.attached++;  // the parent may now unlink the pools' and this segment's names

  Worker w(c, co, kv);
  const bool prefill = c.worker == "prefill";
  for (;;) {
    if (co.abort.load()) break;
    uint64_t r = (prefill ? co.next_prefill : co.next_decode).fetch_add(1);
    if (r >= reqs.size()) break;
    if (prefill) w.prefill(r, reqs[r]);
    else w.decode(r, reqs[r]);
  }
  WorkerCounters& wc = co.workers[c.node];
  kv.flush_stats();
  wc.demotions = store_index(kv).counters().demotions;
  wc.promotions = store_index(kv).counters().promotions;
  wc.lease_expiries = store_index(kv).counters().lease_expiries;
  wc.done = 1;
  munmap(m, coord_bytes(reqs.size()));
  return 0;
}

}  // namespace replay
