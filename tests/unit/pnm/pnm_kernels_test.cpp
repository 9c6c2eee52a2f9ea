// SPDX-License-Identifier: MIT
// The attention kernels of a query-head group as a specification
// (docs/near-memory.md#attention-at-the-read-bound), on every instruction
// set, every dtype, head counts that fill, split and miss a head chunk and
// dimensions with and without a vector tail: the group's scores are each
// head's q.k, the weighted value sums are each head's sum of w v, and the
// vectorized exponential is exp within float rounding, down to where it
// underflows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

}  // namespace

TEST(PnmKernels, GroupScoresAndWeightedValueSumsEqualAFloat64ReferencePerHead) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (Isa isa : isas())
    for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32})
      for (uint32_t dim : {24u, 40u, 128u})
        for (uint32_t nq : {1u, 3u, 4u, 5u, 8u, 9u}) {
          const uint32_t ntok = 13;
          const size_t ld = ntok + 3;  // a stride that is not the row count
          Tensor rows = random_tensor(t, size_t(ntok) * dim, rng);
          std::vector<float> q(size_t(nq) * dim), scores(nq * ld, -7.f), w(nq * ld), acc(size_t(nq) * dim);
          for (auto& x : q) x = nd(rng);
          for (auto& x : w) x = nd(rng);
          for (auto& x : acc) x = nd(rng);
          const std::vector<float> acc0 = acc;
          const auto& kn = detail::kernels(isa);
          kn.rows_heads(true, t, rows.data(), ntok, dim, q.data(), ld, nq, scores.data());
          kn.rows_heads(false, t, rows.data(), ntok, dim, w.data(), ld, nq, acc.data());
          for (uint32_t h = 0; h < nq; h++) {
            for (uint32_t i = 0; i < ntok; i++) {
              double dot = 0;
              for (uint32_t d = 0; d < dim; d++) dot += double(q[h * dim + d]) * rows.at(size_t(i) * dim + d);
              ASSERT_NEAR(dot, scores[h * ld + i], 1e-4 * (1 + std::fabs(dot)))
                  << to_string(isa) << " " << to_string(t) << " dim " << dim << " heads " << nq;
            }
            for (size_t i = ntok; i < ld; i++) ASSERT_EQ(-7.f, scores[h * ld + i]) << "wrote past its rows";
            for (uint32_t d = 0; d < dim; d++) {
              double want = acc0[h * dim + d];
              for (uint32_t i = 0; i < ntok; i++) want += double(w[h * ld + i]) * rows.at(size_t(i) * dim + d);
              ASSERT_NEAR(want, acc[h * dim + d], 1e-4 * (1 + std::fabs(want)))
                  << to_string(isa) << " " << to_string(t) << " dim " << dim << " heads " << nq;
            }
          }
        }
}

TEST(PnmKernels, VectorizedExpIsExpWithinFloatRoundingAndSumsIt) {
  for (Isa isa : isas())
    for (uint32_t n : {1u, 16u, 37u, 1000u}) {
      std::vector<float> x(n), out(n);
      for (uint32_t i = 0; i < n; i++) x[i] = -100.f * float(i) / float(n) + 3.f;  // from m = 3 down past underflow
      const float sum = detail::kernels(isa).exp_sum(x.data(), n, 3.f, out.data());
      double want_sum = 0;
      for (uint32_t i = 0; i < n; i++) {
        const double want = std::exp(double(x[i]) - 3.0);
        want_sum += want;
        if (x[i] - 3.f > -87.f) {
          ASSERT_NEAR(want, out[i], 4e-7 * want) << to_string(isa) << " x " << x[i];
        } else {
          ASSERT_LT(out[i], 1e-37f) << to_string(isa) << " x " << x[i];
        }
      }
      EXPECT_NEAR(want_sum, sum, 1e-5 * want_sum) << to_string(isa) << " n " << n;
    }
}
