// SPDX-License-Identifier: MIT
// Replay workers: prefill (lookup, fetch hits, produce + publish misses) and
// decode (fetch and verify every prompt block).
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
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
#include "tier/ssd_payload_tier.hpp"
#include "replay.hpp"

namespace replay {

using namespace cxlkv;

size_t coord_bytes(uint64_t n) { return sizeof(Coord) + n; }

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

void fill_chunk(uint64_t lo, uint64_t hi, uint32_t j, std::byte* p, size_t n) {
  uint64_t s = mix(lo ^ mix(hi + j));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = s + i * 0x9e3779b97f4a7c15ULL;
    v ^= v >> 29;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = std::byte(s >> (i % 8));
}

bool check_chunk(uint64_t lo, uint64_t hi, uint32_t j, const std::byte* p, size_t n) {
  uint64_t s = mix(lo ^ mix(hi + j));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = s + i * 0x9e3779b97f4a7c15ULL;
    v ^= v >> 29;
    if (std::memcmp(p + i, &v, 8) != 0) return false;
  }
  for (; i < n; i++)
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

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

// A tiny paged KV cache of the engine: the worker's side of every transfer.
struct Engine {
  explicit Engine(const Config& c) {
    layout.num_layers = c.layers;
    layout.num_blocks = 8;
    layout.block_size = kTraceBlockTokens;
    layout.num_kv_heads = c.kv_heads;
    layout.head_size = c.head_size;
    layout.dtype_bytes = 2;
    layout.order = LayoutOrder::layer_first;
    per_tensor = layout.chunk_bytes() * layout.num_blocks;
    store.resize(per_tensor * 2 * layout.num_layers);
    for (uint32_t i = 0; i < 2 * layout.num_layers; i++) layout.bases.push_back(store.data() + i * per_tensor);
  }
  std::vector<Chunk> chunks(uint32_t engine_block) {
    uint32_t id = engine_block % layout.num_blocks;
    auto r = chunks_for_blocks(layout, {&id, 1});
    return r.ok() ? r.value() : std::vector<Chunk>{};
  }
  EngineLayout layout;
  uint64_t per_tensor;
  std::vector<std::byte> store;
};

void wait_until(uint64_t t_ns) {
  while (now_ns() < t_ns) std::this_thread::sleep_for(std::chrono::microseconds(200));
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

  auto region = Region::open(c.pool_uri);
  if (!region) return fail(region.error().message());
  std::vector<std::unique_ptr<Region>> extra;
  KvOpenOptions ko;
  for (auto& u : c.extra_pools) {
    auto r = Region::open(u);
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
  uint32_t eblock = 0;

  auto lat = [&](LatOp op, uint64_t t0) {
    uint64_t t = now_ns();
    wc.lat[op].add(t - t0);
    return t;
  };
  // Pin, fetch, verify and unpin one block.  An I/O error (the fetch or
  // unpin call failed) is reported as such, apart from bytes that differ.
  auto fetch_verify = [&](const BlockKey& k, uint64_t r, size_t i, const char* who, bool* missing) -> bool {
    uint64_t t0 = now_ns();
    auto pin = kv.pin(k);
    t0 = lat(kLatPin, t0);
    if (!pin) {
      *missing = true;
      return true;
    }
    auto ch = eng.chunks(eblock++);
    const bool from_ssd = pin->loc_tier == CXLKV_TIER_SSD;  // the tier this fetch reads
    auto f = kv.fetch(*pin, ch);
    t0 = lat(kLatFetch, t0);
    auto u = kv.unpin(*pin);
    lat(kLatUnpin, t0);
    const char* what = nullptr;
    std::string why;
    if (!f) what = "fetch failed (I/O error)", why = f.error().message();
    else if (!u) what = "unpin failed", why = u.error().message();
    else if (c.verify)
      for (uint32_t j = 0; j < ch.size() && !what; j++)
        if (!check_chunk(k.lo, k.hi, j, static_cast<const std::byte*>(ch[j].addr), ch[j].len))
          what = "bytes differ from what was published", why = "chunk " + std::to_string(j);
    if (what) {
      std::fprintf(stderr, "cxlkv-replay: %s of request %lu block %zu (%s): %s: %s\n", who, (unsigned long)r, i,
                   to_hex(k).c_str(), what, why.c_str());
      return false;
    }
    wc.blocks_read++;
    wc.bytes_read += block_bytes;
    (from_ssd ? wc.ssd_hits : wc.mem_hits)++;
    (from_ssd ? wc.ssd_bytes : wc.mem_bytes) += block_bytes;
    return true;
  };

  for (;;) {
    if (co.abort.load()) break;
    if (prefill) {
      uint64_t r = co.next_prefill.fetch_add(1);
      if (r >= reqs.size()) break;
      const Request& q = reqs[r];
      std::vector<BlockKey> keys = keys_from_ids(q.hash_ids);
      // ---- metadata phase, in trace order --------------------------------
      spin_wait(co.turn, r, co.abort);
      if (c.time_scale > 0) wait_until(co.start_ns + uint64_t(double(q.timestamp_ms) * c.time_scale * 1e6));
      uint64_t t0 = now_ns();
      size_t ready = kv.lookup(keys);
      const uint64_t t_reserve = lat(kLatLookup, t0);
      std::vector<KvReservation> mine;
      std::vector<size_t> busy;
      size_t hit = ready;
      bool counting = true;
      for (size_t i = ready; i < keys.size(); i++) {
        t0 = now_ns();
        auto res = kv.reserve(keys[i], i ? &keys[i - 1] : nullptr, block_bytes);
        lat(kLatReserve, t0);
        if (!res) {
          // No space / parent evicted meanwhile: the rest is computed, not cached.
          wc.uncached += keys.size() - i;
          break;
        }
        if (res->reserved()) {
          counting = false;
          mine.push_back(*res);
        } else {
          if (counting) hit++;
          if (res->status == 2) busy.push_back(i);
        }
      }
      const uint64_t reserve_ns = now_ns() - t_reserve;
      co.turn.store(r + 1, std::memory_order_release);
      // ---- payload phase ---------------------------------------------------
      const uint64_t t_fetch = now_ns();
      for (size_t i = 0; i < hit; i++) {
        if (std::find(busy.begin(), busy.end(), i) != busy.end())
          kv.wait_ready(keys[i], std::chrono::milliseconds(10000));
        bool missing = false;
        if (!fetch_verify(keys[i], r, i, "prefill", &missing)) wc.errors++;
        if (missing) wc.lost_hits++;  // evicted between lookup and pin (bounded capacity)
      }
      if (hit) lat(kLatWholeFetch, t_fetch);
      const uint64_t t_write = now_ns();
      for (size_t k = 0; k < mine.size(); k++) {
        const KvReservation& res = mine[k];
        auto ch = eng.chunks(eblock++);
        for (uint32_t j = 0; j < ch.size(); j++)
          fill_chunk(res.key.lo, res.key.hi, j, static_cast<std::byte*>(ch[j].addr), ch[j].len);
        t0 = now_ns();
        auto w = kv.write(res, ch);
        t0 = lat(kLatWrite, t0);
        if (!w) {
          std::fprintf(stderr, "cxlkv-replay: prefill of request %lu block %s: write failed (I/O error): %s\n",
                       (unsigned long)r, to_hex(res.key).c_str(), w.error().message().c_str());
          wc.errors++;
          continue;
        }
        auto pub = kv.publish(res);
        for (uint32_t t = 0; !pub && pub.error().code() == -EAGAIN && !co.abort.load(); t++) {
          // The parent block is still being written by an earlier request.
          if (t < 100) sched_yield();
          else std::this_thread::sleep_for(std::chrono::microseconds(50));
          pub = kv.publish(res);
        }
        lat(kLatPublish, t0);
        if (!pub) {
          // Parent's writer died: drop ours and everything after it.
          for (size_t z = mine.size(); z-- > k;) (void)kv.abort(mine[z]);
          wc.uncached += mine.size() - k;
          break;
        }
        wc.blocks_written++;
        wc.bytes_written += block_bytes;
      }
      if (!mine.empty()) wc.lat[kLatWholePublish].add(reserve_ns + (now_ns() - t_write));
      wc.requests++;
      wc.input_tokens += q.input_length;
      wc.hit_tokens += hit_tokens(q, hit);
      wc.hit_blocks += hit;
      co.ready[r].store(1, std::memory_order_release);
      co.prefilled++;
    } else {
      uint64_t r = co.next_decode.fetch_add(1);
      if (r >= reqs.size()) break;
      for (uint32_t i = 0; co.ready[r].load(std::memory_order_acquire) == 0; i++) {
        if (co.abort.load()) break;
        if (i < 100) sched_yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      std::vector<BlockKey> keys = keys_from_ids(reqs[r].hash_ids);
      const uint64_t t_fetch = now_ns();
      for (size_t i = 0; i < keys.size(); i++) {
        bool missing = false;
        if (!fetch_verify(keys[i], r, i, "decode", &missing)) wc.errors++;
        if (missing) wc.decode_misses++;
      }
      if (!keys.empty()) lat(kLatWholeFetch, t_fetch);
      wc.requests++;
      co.decoded++;
    }
  }
  kv.flush_stats();
  wc.demotions = kv.index().counters().demotions;
  wc.promotions = kv.index().counters().promotions;
  wc.done = 1;
  munmap(m, coord_bytes(reqs.size()));
  return 0;
}

}  // namespace replay
