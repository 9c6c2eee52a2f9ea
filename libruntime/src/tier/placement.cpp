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

std::vector<uint32_t> place_batch_carry(std::span<const double> bandwidth, uint64_t n, std::vector<double>* credit) {
  std::vector<double> p = placement_ratios(bandwidth);
  credit->resize(p.size(), 0.0);
  std::vector<uint32_t> count(p.size(), 0);
  std::vector<double> exact(p.size(), 0.0);
  std::vector<size_t> order;
  double credit_sum = 0;
  for (size_t i = 0; i < p.size(); i++) {
    if (p[i] <= 0) {
      (*credit)[i] = 0;  // not taking part: it starts afresh when it returns
      continue;
    }
    order.push_back(i);
    credit_sum += (*credit)[i];
  }
  if (order.empty() || n == 0) return count;
  // The credits of the devices taking part sum to 0 (what one was given
  // beyond its share another was not); re-centre after the set changed.
  for (size_t i : order) (*credit)[i] -= credit_sum / static_cast<double>(order.size());
  uint64_t given = 0;
  for (size_t i : order) {
    exact[i] = p[i] * static_cast<double>(n) + (*credit)[i];
    double f = std::floor(exact[i] + 1e-9);
    count[i] = f > 0 ? static_cast<uint32_t>(f) : 0;
    given += count[i];
  }
  while (given > n) {  // cannot happen while credits sum to 0; keep the sum exact anyway
    size_t worst = order[0];
    for (size_t i : order)
      if (count[i] && (count[worst] == 0 || exact[i] - count[i] < exact[worst] - count[worst])) worst = i;
    count[worst]--, given--;
  }
  // The rest, one each, to the largest remainders (ties: the larger share, then the lower index).
  std::vector<size_t> by_rem = order;
  std::stable_sort(by_rem.begin(), by_rem.end(), [&](size_t a, size_t b) {
    double ra = exact[a] - count[a], rb = exact[b] - count[b];
    if (std::fabs(ra - rb) > 1e-9) return ra > rb;
    return p[a] > p[b];
  });
  for (size_t k = 0; given < n; k = (k + 1) % by_rem.size(), given++) count[by_rem[k]]++;
  for (size_t i : order) (*credit)[i] = exact[i] - count[i];
  return count;
}

}  // namespace cxlkv::tier
