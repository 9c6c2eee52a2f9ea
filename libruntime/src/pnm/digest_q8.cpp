// SPDX-License-Identifier: MIT
// q8 digest rows (docs/near-memory.md#digest-kinds): int8 min and max with
// one scale per row, rounded outward, so that a score over them is still an
// upper bound of q.k over the keys the row covers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "pnm/dtype.hpp"
#include "cxlkv/format/pnm_format.h"

namespace cxlkv::pnm::detail {

bool encode_q8_row(Dtype t, const void* mm, uint32_t dim, uint32_t tokens, void* out) {
  double amax = 0;
  for (uint32_t d = 0; d < 2 * dim; d++) {
    const float v = load_elem(t, mm, d);
    if (!std::isfinite(v)) return false;
    amax = std::max(amax, double(std::fabs(v)));
  }
  // 127 x scale >= amax exactly (products of a float and a small integer
  // are exact in double), so every element fits in [-127, 127] steps.
  float s = amax > 0 ? float(amax / 127.0) : 1.f;
  while (double(s) * 127.0 < amax) s = std::nextafter(s, INFINITY);
  auto* o = static_cast<unsigned char*>(out);
  cxlkv_pnm_q8_row head{};
  std::memcpy(&head.scale_bits, &s, 4);
  head.tokens = tokens;
  std::memcpy(o, &head, sizeof head);
  auto* mn = reinterpret_cast<int8_t*>(o + sizeof head);
  auto* mx = mn + dim;
  for (uint32_t d = 0; d < dim; d++) {
    const double lo = load_elem(t, mm, d), hi = load_elem(t, mm, dim + d);
    // Outward: scale x q <= lo for the min, >= hi for the max, checked in
    // exact arithmetic (a division rounded the wrong way moves q one step).
    double a = std::floor(lo / s), b = std::ceil(hi / s);
    while (a * s > lo) a -= 1;
    while (b * s < hi) b += 1;
    mn[d] = static_cast<int8_t>(std::clamp(a, -127.0, 127.0));
    mx[d] = static_cast<int8_t>(std::clamp(b, -127.0, 127.0));
  }
  return true;
}

}  // namespace cxlkv::pnm::detail
