// SPDX-License-Identifier: MIT
#include "pnm/synthetic.hpp"

#include <algorithm>
#include <cmath>

#include "pnm/dtype.hpp"

namespace cxlkv::pnm {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from a counter.
struct Rng {
  uint64_t s;
  float next() {
    s = splitmix(s);
    return float(int64_t(s >> 40) - (1ll << 23)) / float(1 << 23);
  }
};

}  // namespace

NeedleSet::NeedleSet(const Geometry& geo, uint32_t qh, uint64_t tokens, uint32_t count, uint64_t sd)
    : g(geo), q_heads(qh), seed(sd) {
  Rng r{seed * 7919 + 1};
  base.resize(size_t(g.layers) * g.kv_heads * g.head_dim);
  // Directions of norm ~ sqrt(head_dim): unit-variance elements.
  for (auto& x : base) x = r.next() * 1.7f;
  for (uint32_t i = 0; i < count && tokens; i++) {
    const uint64_t t = (splitmix(seed ^ (0x1234 + i)) % tokens);
    needles.push_back(t);
  }
  std::sort(needles.begin(), needles.end());
  needles.erase(std::unique(needles.begin(), needles.end()), needles.end());
}

void NeedleSet::make_kv(uint64_t t0, uint32_t n, std::vector<unsigned char>& k, std::vector<unsigned char>& v) const {
  const size_t es = dtype_size(g.dtype), per = size_t(g.layers) * g.kv_heads * n * g.head_dim;
  k.resize(per * es);
  v.resize(per * es);
  for (uint32_t i = 0; i < n; i++) {
    const uint64_t t = t0 + i;
    const bool needle = std::binary_search(needles.begin(), needles.end(), t);
    Rng r{splitmix(seed ^ (t * 0x9e3779b97f4a7c15ull))};
    for (uint32_t l = 0; l < g.layers; l++)
      for (uint32_t h = 0; h < g.kv_heads; h++) {
        const size_t row = ((size_t(l) * g.kv_heads + h) * n + i) * g.head_dim;
        const float* b = base.data() + (size_t(l) * g.kv_heads + h) * g.head_dim;
        for (uint32_t d = 0; d < g.head_dim; d++) {
          const float kx = needle ? strength * b[d] + 0.05f * r.next() : noise * r.next();
          detail::store_elem(g.dtype, k.data(), row + d, kx);
          detail::store_elem(g.dtype, v.data(), row + d, r.next());
        }
      }
  }
}

std::vector<float> NeedleSet::queries(uint64_t step) const {
  std::vector<float> q(size_t(g.layers) * q_heads * g.head_dim);
  const uint32_t group = q_heads / g.kv_heads;
  Rng r{splitmix(seed * 31 + step + 17)};
  for (uint32_t l = 0; l < g.layers; l++)
    for (uint32_t j = 0; j < q_heads; j++) {
      const float* b = base.data() + (size_t(l) * g.kv_heads + j / group) * g.head_dim;
      for (uint32_t d = 0; d < g.head_dim; d++)
        q[(size_t(l) * q_heads + j) * g.head_dim + d] = b[d] + 0.1f * r.next();
    }
  return q;
}

std::vector<unsigned char> random_digests(const Geometry& g, uint32_t npages, uint64_t seed) {
  const size_t es = dtype_size(g.dtype);
  const size_t rows = size_t(g.layers) * g.kv_heads * npages;
  std::vector<unsigned char> d(rows * 2 * g.head_dim * es);
  Rng r{seed};
  for (size_t i = 0; i < rows; i++) {
    unsigned char* p = d.data() + i * 2 * g.head_dim * es;
    for (uint32_t x = 0; x < g.head_dim; x++) {
      const float a = r.next(), b = r.next();
      detail::store_elem(g.dtype, p, x, std::min(a, b));
      detail::store_elem(g.dtype, p, g.head_dim + x, std::max(a, b));
    }
  }
  return d;
}

}  // namespace cxlkv::pnm
