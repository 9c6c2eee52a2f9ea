// SPDX-License-Identifier: MIT
// The attention kernels of a query-head group as a specification
// (docs/near-memory.md#attention-at-the-read-bound), on every instruction
// set, every dtype, head counts that fill, split and miss a head chunk and
// dimensions with and without a vector tail: page by page, the online
// softmax's output and log-sum-exp are each head's exact attention over
// every page so far, and the vectorized exponential is exp within float
// rounding, down to where it underflows.
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

TEST(PnmKernels, PageByPageOnlineSoftmaxOfAGroupEqualsAFloat64ReferencePerHead) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (Isa isa : isas())
    for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32})
      for (uint32_t dim : {24u, 40u, 128u})
        for (uint32_t nq : {1u, 3u, 4u, 5u, 8u, 9u, 16u}) {
          // Pages of 13, 16, 37 (more than the kernel takes at a time) and 5
          // rows, keys then values of each: with random keys the running
          // maximum moves on later pages, so what was summed is rescaled.
          const std::vector<uint32_t> page_rows = {13, 16, 37, 5};
          uint32_t ntok = 0;
          for (uint32_t n : page_rows) ntok += n;
          Tensor k = random_tensor(t, size_t(ntok) * dim, rng), v = random_tensor(t, size_t(ntok) * dim, rng);
          std::vector<float> q(size_t(nq) * dim);
          for (auto& x : q) x = nd(rng) * 0.5f;
          std::vector<float> m(nq, -INFINITY), l(nq, 0.f), acc(size_t(nq) * dim, 0.f);
          const auto& kn = detail::kernels(isa);
          const size_t es = dtype_size(t);
          const uint32_t ld = detail::kAttendRows + 3;  // a stride that is not the row count
          std::vector<float> w(size_t(nq) * ld);
          uint32_t t0 = 0;
          for (uint32_t n : page_rows) {
            // The kernel takes at most kAttendRows rows at a time: pieces.
            for (uint32_t a = 0; a < n; a += detail::kAttendRows) {
              const uint32_t c = std::min(detail::kAttendRows, n - a);
              kn.attend_rows(true, t, k.bytes.data() + size_t(t0 + a) * dim * es, c, dim, q.data(), nq, m.data(),
                             l.data(), acc.data(), w.data(), ld, nullptr, 0);
              kn.attend_rows(false, t, v.bytes.data() + size_t(t0 + a) * dim * es, c, dim, nullptr, nq, nullptr,
                             nullptr, acc.data(), w.data(), ld, nullptr, 0);
            }
            t0 += n;
          }
          std::vector<const float*> ks, vs;
          for (uint32_t i = 0; i < ntok; i++) {
            ks.push_back(&k.vals[size_t(i) * dim]);
            vs.push_back(&v.vals[size_t(i) * dim]);
          }
          for (uint32_t h = 0; h < nq; h++) {
            std::vector<double> qd(dim), out(dim);
            for (uint32_t d = 0; d < dim; d++) qd[d] = q[size_t(h) * dim + d];
            double lse;
            ref_attention(qd.data(), ks, vs, dim, 1.0, out.data(), &lse);
            ASSERT_NEAR(lse, m[h] + std::log(l[h]), 1e-4 * (1 + std::fabs(lse)))
                << to_string(isa) << " " << to_string(t) << " dim " << dim << " heads " << nq;
            for (uint32_t d = 0; d < dim; d++)
              ASSERT_NEAR(out[d], acc[size_t(h) * dim + d] / l[h], 1e-4 * (1 + std::fabs(out[d])))
                  << to_string(isa) << " " << to_string(t) << " dim " << dim << " heads " << nq << " head " << h;
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
