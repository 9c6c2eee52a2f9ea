// SPDX-License-Identifier: MIT
// The hybrid mode's GPU partial attention (docs/near-memory.md "Hybrid mode") as a
// specification: the kernel's per-thread code (cuda/pnm_attend_core.h, what
// the CUDA kernel runs, here on the CPU) equals a float64 attention with its
// log-sum-exp on every dtype, an empty page list included; a hybrid step
// with a GPU library (a fake one whose device is host memory and whose pnm
// table runs that per-thread code) launches the kernel once per step over
// the resident pages and gives the CPU stand-in's result; a library built
// before the kernel, or a failing launch, is refused by name.  The CUDA
// kernel itself has not run on a GPU here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cxlkv_cuda_abi.h"
#include "cuda/cxlkv_pnm_abi.h"
#include "cxlkv/gpu.hpp"
#include "gpu/reference_backend.hpp"
#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

// A fake pnm kernel table: attend runs the kernel's per-thread code.
struct FakeKernels {
  int launches = 0;
  cxlkv_pnm_attend_args last{};
  int fail = 0;
};
FakeKernels g_fake;
const char* fake_error() { return "fake attend kernel: launch failed (out of resources)"; }
int fake_digest(const cxlkv_pnm_digest_args*, void*) { return -ENOSYS; }
int fake_attend(const cxlkv_pnm_attend_args* a, void*) {
  g_fake.launches++;
  g_fake.last = *a;
  if (g_fake.fail) return g_fake.fail;
  detail::reference_attend(*a);
  return 0;
}
const cxlkv_cuda_pnm_ops g_fake_pnm = {CXLKV_CUDA_PNM_ABI_VERSION, sizeof(cxlkv_cuda_pnm_ops), fake_error, fake_digest,
                                       fake_attend};
// A library built before the attention kernel: its table ends after digest.
const cxlkv_cuda_pnm_ops g_old_pnm = {CXLKV_CUDA_PNM_ABI_VERSION, uint32_t(offsetof(cxlkv_cuda_pnm_ops, attend)),
                                      fake_error, fake_digest, nullptr};

struct Override {
  explicit Override(const cxlkv_cuda_pnm_ops* o) {
    pnm::testing::pnm_ops_override() = o;
    g_fake = FakeKernels{};
  }
  ~Override() { pnm::testing::pnm_ops_override() = nullptr; }
};

}  // namespace

TEST(PnmGpuAttend, KernelCodeEqualsAFloat64AttentionOnEveryDtype) {
  std::mt19937_64 rng(3);
  for (Dtype t : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
    const uint32_t dim = 24, pt = 16, heads = 3, group = 2, nq = heads * group;
    const size_t es = dtype_size(t), piece = size_t(pt) * dim * es;
    // Pages of head h: h + 1 pages (head 2 has none: an empty list), each
    // K rows then V rows; the last page of each list is partial.
    std::vector<uint32_t> start = {0, 2, 5, 5};
    std::vector<uint32_t> ntok = {16, 9, 16, 16, 3};
    std::vector<Tensor> pages;
    for (size_t e = 0; e < ntok.size(); e++) pages.push_back(random_tensor(t, 2 * size_t(pt) * dim, rng));
    std::vector<uint64_t> pk;
    for (auto& p : pages) pk.push_back(reinterpret_cast<uint64_t>(p.bytes.data()));
    std::vector<float> q(size_t(nq) * dim), out(q.size(), 7.f), lse(nq, 7.f);
    std::normal_distribution<float> nd;
    for (auto& x : q) x = nd(rng);
    const float scale = 1.f / std::sqrt(float(dim));
    const cxlkv_pnm_attend_args a{reinterpret_cast<uint64_t>(q.data()),
                                  reinterpret_cast<uint64_t>(out.data()),
                                  reinterpret_cast<uint64_t>(lse.data()),
                                  reinterpret_cast<uint64_t>(start.data()),
                                  reinterpret_cast<uint64_t>(pk.data()),
                                  reinterpret_cast<uint64_t>(ntok.data()),
                                  piece,
                                  nq,
                                  group,
                                  dim,
                                  static_cast<uint32_t>(t),
                                  scale,
                                  0};
    detail::reference_attend(a);
    for (uint32_t i = 0; i < nq; i++) {
      const uint32_t h = i / group;
      std::vector<const float*> ks, vs;
      for (uint32_t e = start[h]; e < start[h + 1]; e++)
        for (uint32_t r = 0; r < ntok[e]; r++) {
          ks.push_back(&pages[e].vals[size_t(r) * dim]);
          vs.push_back(&pages[e].vals[size_t(pt + r) * dim]);
        }
      double qd[24], ref[24], ref_lse;
      for (uint32_t d = 0; d < dim; d++) qd[d] = q[size_t(i) * dim + d];
      ref_attention(qd, ks, vs, dim, scale, ref, &ref_lse);
      if (ks.empty()) {
        EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << to_string(t) << " head " << i;
        for (uint32_t d = 0; d < dim; d++) EXPECT_EQ(0.f, out[size_t(i) * dim + d]);
        continue;
      }
      EXPECT_NEAR(ref_lse, lse[i], 1e-4) << to_string(t) << " head " << i;
      for (uint32_t d = 0; d < dim; d++) EXPECT_NEAR(ref[d], out[size_t(i) * dim + d], 1e-4) << to_string(t);
    }
  }
}

namespace {

struct Fixture {
  explicit Fixture(uint64_t seed) : pool(32ull << 20, 1, 0.0, false), rng(seed) {
    StoreOptions so;
    so.carve_bytes = 8ull << 20;
    ws = std::move(ContextStore::open(pool.host(0), so)).value();
    g = Geometry{2, 2, 32, Dtype::bf16, 16, 2048};
    w = std::move(ws->create(9, g)).value();
  }
  void add(uint32_t n) {
    Tensor k = random_tensor(g.dtype, size_t(4) * n * 32, rng);
    Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
    ASSERT_TRUE(w->append(k.data(), v.data(), n).ok());
  }
  std::vector<float> query() {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(size_t(2) * 4 * 32);
    for (auto& x : q) x = nd(rng);
    return q;
  }
  SharedPool pool;
  std::mt19937_64 rng;
  std::unique_ptr<ContextStore> ws;
  std::unique_ptr<Context> w;
  Geometry g;
};

}  // namespace

TEST(PnmGpuAttend, AHybridStepOnAGpuLibraryLaunchesTheKernelAndEqualsTheCpuStandIn) {
  Fixture f(4);
  f.add(300);
  Override ov(&g_fake_pnm);
  auto fake = gpu::GpuPool::open(gpu::CudaLibrary::from_table(&gpu::reference_ops(), "fake-gpu"), f.pool.base(),
                                 f.pool.bytes);
  auto ref = gpu::GpuPool::open(gpu::CudaLibrary::cpu_reference(), f.pool.base(), f.pool.bytes);
  ASSERT_TRUE(fake.ok() && ref.ok());
  ASSERT_FALSE((*fake)->library().is_reference());
  auto hg = HybridRequest::create(*f.w, **fake, 5);
  auto hc = HybridRequest::create(*f.w, **ref, 5);
  ASSERT_TRUE(hg.ok() && hc.ok());
  SelectOptions o;
  o.token_budget = 9 * 16;
  for (int step = 0; step < 5; step++) {
    if (step) f.add(6);
    const uint64_t n = f.w->tokens();
    auto q = f.query();
    HybridStats sg, sc;
    auto a = (*hg)->step(q, 4, n, o, &sg);
    ASSERT_TRUE(a.ok()) << a.error().message();
    auto b = (*hc)->step(q, 4, n, o, &sc);
    ASSERT_TRUE(b.ok()) << b.error().message();
    EXPECT_EQ(step + 1, g_fake.launches) << "one kernel launch per step";
    EXPECT_EQ(2u * 4, g_fake.last.nq);
    EXPECT_EQ(2u, g_fake.last.group);
    EXPECT_EQ(32u, g_fake.last.head_dim);
    EXPECT_EQ(uint32_t(Dtype::bf16), g_fake.last.dtype);
    EXPECT_EQ(sc.gpu_pages, sg.gpu_pages);
    EXPECT_GT(sg.gpu_pages, 0u);
    EXPECT_EQ(sc.near_pages, sg.near_pages);
    for (size_t i = 0; i < a->out.size(); i++) ASSERT_NEAR(b->out[i], a->out[i], 1e-5) << "step " << step;
    for (size_t i = 0; i < a->lse.size(); i++) ASSERT_NEAR(b->lse[i], a->lse[i], 1e-5) << "step " << step;
  }
}

TEST(PnmGpuAttend, ALibraryBuiltBeforeTheKernelOrAFailingLaunchIsRefusedByName) {
  Fixture f(5);
  f.add(200);
  auto fake = gpu::GpuPool::open(gpu::CudaLibrary::from_table(&gpu::reference_ops(), "fake-gpu"), f.pool.base(),
                                 f.pool.bytes);
  ASSERT_TRUE(fake.ok());
  auto h = HybridRequest::create(*f.w, **fake, 4);
  ASSERT_TRUE(h.ok());
  SelectOptions o;
  o.token_budget = 6 * 16;
  auto q = f.query();
  {
    Override ov(&g_old_pnm);
    auto r = (*h)->step(q, 4, f.w->tokens(), o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(-ENOSYS, r.error().code());
    EXPECT_NE(std::string::npos, r.error().message().find("fake-gpu")) << r.error().message();
    EXPECT_NE(std::string::npos, r.error().message().find("partial-attention kernel")) << r.error().message();
  }
  {
    Override ov(&g_fake_pnm);
    g_fake.fail = -EIO;
    auto r = (*h)->step(q, 4, f.w->tokens(), o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(-EIO, r.error().code());
    EXPECT_NE(std::string::npos, r.error().message().find("out of resources")) << r.error().message();
    g_fake.fail = 0;
    auto again = (*h)->step(q, 4, f.w->tokens(), o);
    EXPECT_TRUE(again.ok()) << "the request stays usable after a failed launch: " << again.error().message();
  }
}
