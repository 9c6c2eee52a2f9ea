// SPDX-License-Identifier: MIT
// cxlkv-replay: the main job.  One parent (pool owner + lock manager) and
// P prefill + D decode worker processes, each attached as its own node.
//
// Fidelity: prefill workers take requests in trace order and do the
// metadata phase (lookup + reserve of the missing blocks) one request at a
// time in that order (a turn counter in the coordination segment), then
// move payloads in parallel.  So a request sees every block an earlier
// request cached or is still writing, and with unbounded capacity the token
// hit ratio equals the trace's theoretical prefix reuse exactly.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "workload/workload.hpp"

namespace replay {

struct Config {
  std::string pool_uri;          // default shm:cxlkv-replay-<pid>:<pool_size>
  bool force = false;            // --force: --pool may name a valid pool (the run reformats it)
  bool small_pages = false;      // --small-pages: own pools in /dev/shm (4 KiB pages), not huge_tmpfs.hpp's
  uint64_t pool_size = 2ull << 30;
  std::string trace;             // empty: built-in generator
  uint32_t max_requests = 0;     // trace: 0 = all; generator: requests
  cxlkv::GeneratorOptions gen;
  uint32_t prefill = 2, decode = 2;
  // Engine geometry of one 512-token block: 8 layers x K,V x 512 tokens x 2
  // KV heads x 64 x fp16 = 2 MiB, the size of one Llama-3.1-8B 16-token
  // block (a small model keeps the default run quick).
  uint32_t layers = 8, kv_heads = 2, head_size = 64;
  uint64_t capacity_blocks = 0;  // 0: unbounded
  double capacity_fraction = 0;  // > 0: capacity = this share of the distinct blocks
  bool sweep = false;            // also run at kSweepFractions of the distinct blocks
  std::string plot;              // --plot FILE.svg: the sweep's hit ratios as a picture (plot.cpp)
  double time_scale = 0;         // trace ms -> wall ms factor; 0: as fast as possible
  bool json = false;
  bool quiet = false;
  bool verify = true;
  uint32_t interleave = 1;       // pool devices to stripe payload over (1 or 2)
  uint32_t lease_ms = 30000;     // ttl of the handoff leases prefill takes for decode
  // Prefill starts request r only once r - max_lag requests are decoded
  // (0: prefill + decode workers): a serving system's bounded queue between
  // prefill and decode.  Without it an as-fast-as-possible replay lets
  // prefill run far ahead, and the leases of every handed-off request still
  // waiting for decode hold cache capacity (docs/eviction.md "The replay's LRU reference").
  uint32_t max_lag = 0;
  uint32_t interleave_stripe = 64 << 10;
  // SSD tier (docs/eviction.md "The SSD tier"): one file shared by all workers, each placing in its
  // own partition (node of prefill + decode + 1).  Blocks evicted from the
  // bounded memory capacity are demoted to it; an SSD hit promotes them back.
  std::string ssd_path;          // empty: no SSD tier
  uint64_t ssd_size = 0;         // 0: sized by the parent for the workload
  uint64_t min_index_entries = 0;  // index slots for blocks on both tiers
  // worker mode
  std::string worker;            // "prefill" | "decode"
  uint32_t worker_index = 0, node = 0;
  std::string coord;
  std::vector<std::string> extra_pools;
};

// Client-side latencies the workers measure around each KV call (the
// control cost per block, docs/benchmarks.md): one histogram per operation, per worker, merged by the parent.
// The single steps are per call; the whole publish is a request's reserve +
// write + publish of its new blocks, the whole fetch a request's pin + fetch +
// unpin of the blocks it reads (prefill hits, decode prompt).
enum LatOp : uint32_t {
  kLatLookup, kLatReserve, kLatWrite, kLatPublish, kLatPin, kLatFetch, kLatUnpin,
  kLatWholePublish, kLatWholeFetch, kLatOps
};
inline constexpr const char* kLatNames[kLatOps] = {"lookup", "reserve", "write", "publish", "pin",
                                                   "fetch", "unpin", "whole_publish", "whole_fetch"};
// Four buckets per power of two of nanoseconds: bucket i = 4e + f holds
// [2^e (1 + f/4), 2^e (1 + (f+1)/4)) ns, so a percentile (the bucket's upper
// edge) is at most 25% above the truth.
struct LatHist {
  static constexpr uint32_t kBuckets = 160;  // up to 2^40 ns (18 min)
  uint64_t count = 0;
  uint64_t bucket[kBuckets] = {};
  void add(uint64_t ns);
  void merge(const LatHist& o);
  double percentile_us(double pct) const;  // upper edge of the bucket; 0 when empty
};

struct WorkerCounters {
  std::atomic<uint64_t> requests{0}, input_tokens{0}, hit_tokens{0}, hit_blocks{0};
  std::atomic<uint64_t> blocks_written{0}, blocks_read{0}, bytes_written{0}, bytes_read{0};
  std::atomic<uint64_t> errors{0}, decode_misses{0}, uncached{0}, lost_hits{0};
  // Per-tier reads (hits) by the tier the pin reported (docs/eviction.md "The SSD tier"), and this
  // node's demotions (MEM -> SSD on eviction) / promotions (SSD -> MEM on hit).
  std::atomic<uint64_t> mem_hits{0}, mem_bytes{0}, ssd_hits{0}, ssd_bytes{0};
  std::atomic<uint64_t> demotions{0}, promotions{0};
  std::atomic<uint64_t> lease_expiries{0};
  // Handoff (docs/eviction.md "Handoff leases"): blocks a prefill could not hand off (not cached at
  // lease time), decode misses excused because the block's lease had ended
  // (ttl or consumer death: -ETIMEDOUT at release), leases that failed.
  std::atomic<uint64_t> not_handed_off{0}, expired_misses{0}, lease_errors{0};  // leases this worker's index found ended (ttl / consumer death)
  std::atomic<uint64_t> done{0};  // 1 when the worker finished its loop
  LatHist lat[kLatOps];           // written by this worker only, read after it exits
  char pad[40];
};

// Shared between the parent and its workers (node-local shm, not the pool:
// it stands in for the serving frontend that routes requests).
struct Coord {
  std::atomic<uint64_t> next_prefill{0}, next_decode{0}, turn{0};
  std::atomic<uint64_t> prefilled{0}, decoded{0};
  std::atomic<uint32_t> abort{0};
  std::atomic<uint32_t> attached{0};  // workers that have the pools and this segment mapped
  uint64_t start_ns = 0;
  uint64_t nrequests = 0;
  WorkerCounters workers[64];
  // [nrequests]: 0 until request i is prefilled, then 1 + the number of its
  // leading blocks the prefill handed off (published or found, and leased
  // for the request's decode).
  std::atomic<uint32_t> ready[1];
};

size_t coord_bytes(uint64_t nrequests);

// One point of the --plot picture: token hit ratios at a capacity.
struct PlotPoint {
  double capacity_pct = 0;  // capacity as % of the workload's distinct blocks
  double cxlkv = 0;         // replayed token hit ratio
  double lru = 0;           // block-LRU reference at the same capacity
};
// Writes the sweep as an SVG line chart (tools/common/svg_chart.hpp): cxlkv
// and the LRU reference against capacity, the theoretical reuse as a line.
bool write_sweep_plot(const std::string& path, const std::vector<PlotPoint>& points, double theory,
                      uint64_t distinct_blocks, const std::string& workload, std::string* err);

int run_worker(const Config& c);
int run_parent(const Config& c, char** argv, int argc);

// Deterministic payload of a block: chunk j of the block with key (lo, hi).
void fill_chunk(uint64_t key_lo, uint64_t key_hi, uint32_t j, std::byte* p, size_t n);
bool check_chunk(uint64_t key_lo, uint64_t key_hi, uint32_t j, const std::byte* p, size_t n);

std::vector<cxlkv::Request> load_workload(const Config& c, std::string* err);

}  // namespace replay
