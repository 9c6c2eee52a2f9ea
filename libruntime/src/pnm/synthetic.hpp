// SPDX-License-Identifier: MIT
// Planted-needle synthetic KV for the near-memory engine's tool, benchmarks
// and tests: noise keys with a few "needle" tokens whose keys align with
// their KV head's query direction, so the attention mass sits on known
// pages.  Deterministic: token t's K and V depend only on (seed, t).
#pragma once

#include <cstdint>
#include <vector>

#include "cxlkv/pnm.hpp"

namespace cxlkv::pnm {

struct NeedleSet {
  Geometry g;
  uint32_t q_heads = 0;
  uint64_t seed = 1;
  float noise = 0.3f;     // scale of noise keys and values
  float strength = 2.5f;  // needle key = strength * the KV head's query direction
  std::vector<uint64_t> needles;  // token positions, ascending
  std::vector<float> base;        // [layers][kv_heads][head_dim] query directions

  // `count` needles spread over [0, tokens).
  NeedleSet(const Geometry& g, uint32_t q_heads, uint64_t tokens, uint32_t count, uint64_t seed = 1);
  // K and V of tokens [t0, t0 + n) as append() takes them ([l][h][n][d], dtype).
  void make_kv(uint64_t t0, uint32_t n, std::vector<unsigned char>& k, std::vector<unsigned char>& v) const;
  // Queries of a decode step ([layers][q_heads][head_dim]): each KV head's
  // direction plus a little per-head, per-step noise.
  std::vector<float> queries(uint64_t step) const;
};

// Random digests in the context's dtype ([layers][kv_heads][npages][2][head_dim])
// for benchmarks of scoring alone (min <= max per element).
std::vector<unsigned char> random_digests(const Geometry& g, uint32_t npages, uint64_t seed);

}  // namespace cxlkv::pnm
