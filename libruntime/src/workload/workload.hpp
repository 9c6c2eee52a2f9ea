// SPDX-License-Identifier: MIT
// Serving workloads for the replay: a built-in generator and a reader for
// Mooncake-format JSONL traces.  A request is a prompt of input_length
// tokens described by the hash ids of its 512-token blocks (a hash id names
// a block together with everything before it, as in Mooncake traces).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"

namespace cxlkv {

inline constexpr uint32_t kTraceBlockTokens = 512;

struct Request {
  uint64_t timestamp_ms = 0;
  uint32_t input_length = 0;
  uint32_t output_length = 0;
  std::vector<uint64_t> hash_ids;  // one per 512-token block of the input
};

struct GeneratorOptions {
  uint32_t requests = 100;
  double input_mean = 4449, input_std = 2424;
  double output_mean = 215, output_std = 263;
  // Fraction of requests that share no prefix with any other.
  double unique_fraction = 0.3;
  uint32_t prefix_groups = 16;      // distinct shared prefixes (Zipf-like popularity)
  double arrival_rate = 50;         // requests per second (timestamps)
  uint64_t seed = 1;
};

// Deterministic for a given seed: every worker regenerates the same list.
std::vector<Request> generate_workload(const GeneratorOptions& o);

// Reads a Mooncake JSONL trace (fields timestamp, input_length,
// output_length, hash_ids).  max_requests 0: all.  Errors name file and line.
Result<std::vector<Request>> read_trace(const std::string& path, uint32_t max_requests = 0);

// Tokens of a request's prefix that earlier requests already cover: leading
// blocks whose hash ids were seen before, 512 tokens each, capped at the
// input length.  Processes requests in order, adding each one's ids.
struct PrefixReuse {
  uint64_t input_tokens = 0;
  uint64_t reused_tokens = 0;
  uint64_t blocks = 0;
  uint64_t unique_blocks = 0;
  double ratio() const { return input_tokens ? double(reused_tokens) / double(input_tokens) : 0.0; }
};
PrefixReuse theoretical_prefix_reuse(const std::vector<Request>& reqs);

// The block-LRU reference for a bounded cache of `capacity_blocks` blocks (issue
// 11): a plain simulation in trace order.  A request hits its leading blocks
// that are cached (a prefix cache can use nothing after the first miss), then
// touches every block of its prompt in order: a cached block is refreshed, a
// missing one inserted, and the least recently used block evicted while the
// cache is over capacity.  Nothing is prefix-closed, so LRU keeps children of
// evicted parents that can never hit; that is the baseline cxlkv must beat.
struct LruReference {
  uint64_t input_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t hit_blocks = 0;
  uint64_t evictions = 0;
  double ratio() const { return input_tokens ? double(hit_tokens) / double(input_tokens) : 0.0; }
};
LruReference lru_reference(const std::vector<Request>& reqs, uint64_t capacity_blocks);

// The capacities of `cxlkv-replay --sweep`: these fractions of the distinct blocks.
inline constexpr double kSweepFractions[] = {0.05, 0.10, 0.25, 0.50};

// Tokens covered by `hit_blocks` leading blocks of a request.
inline uint64_t hit_tokens(const Request& r, uint64_t hit_blocks) {
  uint64_t t = hit_blocks * kTraceBlockTokens;
  return t < r.input_length ? t : r.input_length;
}

}  // namespace cxlkv
