// SPDX-License-Identifier: MIT
// Shared by the pnm_* tests: a pool in memory seen by several simulated
// hosts (NonCoherentSim), random KV in every dtype, and float64 references
// of digests, scores and attention.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"
#include "pnm/dtype.hpp"
#include "support/pool_fixture.hpp"  // AlignedPool

namespace cxlkv::pnm::test {

// A pool of `bytes` in memory; host(i) is a Region over it through node i of
// a NonCoherentSim (or, with sim == false, through a coherent host domain).
// One Region per host, not one ShmPool: a near-memory context is opened
// through the Region of the host that uses it.
struct SharedPool {
  SharedPool(uint64_t bytes, uint32_t hosts, double evict, bool use_sim = true, double prefetch = 0.0)
      : bytes(bytes), mem(bytes) {
    name = "pnmtest" + std::to_string(getpid()) + "-" + std::to_string(counter()++);
    if (use_sim) {
      NonCoherentSimOptions so;
      so.nodes = hosts;
      so.evict_probability = evict;
      so.seed = 11;
      so.prefetch_probability = prefetch;
      sim = std::make_unique<NonCoherentSim>(base(), bytes, so);
    }
    for (uint32_t i = 0; i < hosts; i++) {
      OpenOptions oo;
      if (sim) oo.use_domain = &sim->node(i);
      else oo.domain.mode = DomainMode::coherent;
      auto r = i == 0 ? Region::format_memory(name, base(), bytes, FormatOptions{}, oo)
                      : Region::open_memory(name, base(), bytes, oo);
      EXPECT_TRUE(r.ok()) << r.error().message();
      regions.push_back(std::move(r).value());
    }
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  Region& host(uint32_t i) { return *regions.at(i); }
  void* base() const { return mem.mem; }  // the pool's first byte
  uint64_t bytes;
  cxlkv::test::AlignedPool mem;
  std::string name;
  std::unique_ptr<NonCoherentSim> sim;
  std::vector<std::unique_ptr<Region>> regions;
};

// Random values of a dtype, stored as its bytes; `vals` holds the exact
// float value of each stored element.
struct Tensor {
  Dtype t = Dtype::bf16;
  std::vector<unsigned char> bytes;
  std::vector<float> vals;
  const void* data() const { return bytes.data(); }
  float at(size_t i) const { return vals[i]; }
};

inline Tensor random_tensor(Dtype t, size_t n, std::mt19937_64& rng, float scale = 1.f) {
  Tensor x;
  x.t = t;
  x.bytes.resize(n * dtype_size(t));
  x.vals.resize(n);
  std::normal_distribution<float> nd(0.f, scale);
  for (size_t i = 0; i < n; i++) {
    detail::store_elem(t, x.bytes.data(), i, nd(rng));
    x.vals[i] = detail::load_elem(t, x.bytes.data(), i);
  }
  return x;
}

// Float64 attention of one query over rows (keys [n][d], values [n][d]).
inline void ref_attention(const double* q, const std::vector<const float*>& k, const std::vector<const float*>& v,
                          uint32_t d, double scale, double* out, double* lse) {
  double m = -INFINITY;
  std::vector<double> s(k.size());
  for (size_t i = 0; i < k.size(); i++) {
    double a = 0;
    for (uint32_t j = 0; j < d; j++) a += q[j] * k[i][j];
    s[i] = a * scale;
    m = std::max(m, s[i]);
  }
  double l = 0;
  for (uint32_t j = 0; j < d; j++) out[j] = 0;
  for (size_t i = 0; i < k.size(); i++) {
    const double w = std::exp(s[i] - m);
    l += w;
    for (uint32_t j = 0; j < d; j++) out[j] += w * v[i][j];
  }
  if (k.empty()) {
    *lse = -INFINITY;
    return;
  }
  for (uint32_t j = 0; j < d; j++) out[j] /= l;
  *lse = m + std::log(l);
}

}  // namespace cxlkv::pnm::test
