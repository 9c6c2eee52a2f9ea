// SPDX-License-Identifier: MIT
#include "tier/placement.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cxlkv::tier {

std::vector<double> placement_ratios(std::span<const double> bandwidth) {
  double sum = 0;
  for (double b : bandwidth) sum += b > 0 ? b : 0;
  std::vector<double> p(bandwidth.size(), 0.0);
  if (sum <= 0) return p;
  for (size_t i = 0; i < p.size(); i++) p[i] = bandwidth[i] > 0 ? bandwidth[i] / sum : 0;
  return p;
}

std::vector<uint32_t> place_batch(std::span<const double> bandwidth, uint64_t n) {
  std::vector<double> p = placement_ratios(bandwidth);
  std::vector<uint32_t> count(p.size(), 0);
  std::vector<size_t> order;  // participating devices, largest p first (ties: lower index)
  for (size_t i = 0; i < p.size(); i++)
    if (p[i] > 0) order.push_back(i);
  if (order.empty() || n == 0) return count;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });

  uint64_t given = 0;
  for (size_t i : order) {
    // floor with a small tolerance so that p = 1/3, n = 3 gives 1, not 0.
    count[i] = static_cast<uint32_t>(std::floor(p[i] * static_cast<double>(n) + 1e-9));
    given += count[i];
  }
  // Rounding can only leave a remainder below the number of devices; it
  // goes one each to the largest shares.
  for (size_t k = 0; given < n; k = (k + 1) % order.size(), given++) count[order[k]]++;
  while (given > n) {  // never after the floor above, but keep the sum exact
    for (auto it = order.rbegin(); it != order.rend() && given > n; ++it)
      if (count[*it]) count[*it]--, given--;
  }
  return count;
}

}  // namespace cxlkv::tier
