// SPDX-License-Identifier: MIT
// Hybrid steady-token mode, Algorithm 1 as bit masks over a request's pages:
// evict = R & ~S, candidates = S & ~R, recall the best candidates (as many
// as were evicted, plus any free capacity), resident' = (R & ~evict) |
// recall, near-memory part = S & ~resident'.
#include <algorithm>
#include <bit>
#include <cmath>

#include "cxlkv/pnm.hpp"

namespace cxlkv::pnm {

PageMask to_mask(std::span<const uint32_t> pages, uint32_t npages) {
  PageMask m((npages + 63) / 64, 0);
  for (uint32_t p : pages)
    if (p < npages) m[p / 64] |= 1ull << (p % 64);
  return m;
}

std::vector<uint32_t> from_mask(const PageMask& m) {
  std::vector<uint32_t> out;
  for (size_t w = 0; w < m.size(); w++)
    for (uint64_t b = m[w]; b; b &= b - 1) out.push_back(uint32_t(w * 64 + std::countr_zero(b)));
  return out;
}

namespace {
uint32_t popcount(const PageMask& m) {
  uint32_t n = 0;
  for (uint64_t w : m) n += uint32_t(std::popcount(w));
  return n;
}
}  // namespace

SteadyStep steady_step(const PageMask& resident_in, std::span<const uint32_t> top, std::span<const float> scores,
                       uint32_t npages, uint32_t capacity) {
  const size_t words = (npages + 63) / 64;
  PageMask R = resident_in;
  R.resize(words, 0);
  if (npages % 64 && words) R[words - 1] &= (1ull << (npages % 64)) - 1;  // pages that exist
  const PageMask S = to_mask(top, npages);
  SteadyStep st;
  st.evict.resize(words);
  st.recall.assign(words, 0);
  PageMask cand(words);
  for (size_t w = 0; w < words; w++) {
    st.evict[w] = R[w] & ~S[w];
    cand[w] = S[w] & ~R[w];
  }
  st.evicted = popcount(st.evict);
  const uint32_t kept = popcount(R) - st.evicted;
  const uint32_t room = capacity > kept ? capacity - kept : 0;
  std::vector<uint32_t> c = from_mask(cand);
  const uint32_t n = std::min<uint32_t>(room, uint32_t(c.size()));
  auto score = [&](uint32_t p) {
    const float s = p < scores.size() ? scores[p] : -INFINITY;
    return std::isnan(s) ? -INFINITY : s;
  };
  // The best-scored candidates; ties to the lower page.
  std::partial_sort(c.begin(), c.begin() + n, c.end(), [&](uint32_t a, uint32_t b) {
    return score(a) != score(b) ? score(a) > score(b) : a < b;
  });
  for (uint32_t i = 0; i < n; i++) st.recall[c[i] / 64] |= 1ull << (c[i] % 64);
  st.recalled = n;
  st.resident.resize(words);
  st.near.resize(words);
  for (size_t w = 0; w < words; w++) {
    st.resident[w] = (R[w] & ~st.evict[w]) | st.recall[w];
    st.near[w] = S[w] & ~st.resident[w];
  }
  return st;
}

}  // namespace cxlkv::pnm
