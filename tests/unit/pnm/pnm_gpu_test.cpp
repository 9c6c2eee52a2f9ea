// SPDX-License-Identifier: MIT
// KV that comes from a GPU: the pnm digest kernel's CPU reference (the
// kernel's own per-thread code) equals the CPU digests; the kernel itself
// equals its reference where a GPU is present (skipped with the reason
// otherwise); append_gpu moves pages with one copy batch and publishes them
// with GPU-computed digests that another host reads exactly like a CPU
// append of the same KV.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cxlkv/gpu.hpp"
#include "cuda/cxlkv_cuda_abi.h"
#include "pnm/pnm_internal.hpp"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

// CPU digests of K [rows][n][dim]: [rows][np][2][dim].
std::vector<unsigned char> cpu_digests(Dtype t, const Tensor& k, uint32_t rows, uint32_t n, uint32_t dim, uint32_t pt) {
  const size_t es = dtype_size(t);
  const uint32_t np = (n + pt - 1) / pt;
  std::vector<unsigned char> out(size_t(rows) * np * 2 * dim * es);
  for (uint32_t r = 0; r < rows; r++)
    for (uint32_t p = 0; p < np; p++)
      detail::digest_rows(t, k.bytes.data() + (size_t(r) * n + size_t(p) * pt) * dim * es, std::min(pt, n - p * pt),
                          dim, out.data() + (size_t(r) * np + p) * 2 * dim * es, true);
  return out;
}

}  // namespace

TEST(PnmGpuDigest, ReferenceKernelEqualsCpuDigests) {
  auto lib = gpu::CudaLibrary::cpu_reference();
  std::mt19937_64 rng(1);
  for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32})
    for (uint32_t dim : {24u, 128u}) {
      const uint32_t rows = 3, n = 37, pt = 16;  // the last page holds 5 tokens
      Tensor k = random_tensor(t, size_t(rows) * n * dim, rng);
      const auto want = cpu_digests(t, k, rows, n, dim, pt);
      std::vector<unsigned char> got(want.size(), 0xee);
      ASSERT_TRUE(gpu_digests(*lib, t, reinterpret_cast<uint64_t>(k.bytes.data()),
                              reinterpret_cast<uint64_t>(got.data()), rows, n, dim, pt)
                      .ok());
      EXPECT_EQ(want, got) << to_string(t) << " dim " << dim;
    }
  std::vector<unsigned char> buf(64);
  auto bad = gpu_digests(*lib, static_cast<Dtype>(9), reinterpret_cast<uint64_t>(buf.data()),
                         reinterpret_cast<uint64_t>(buf.data()), 1, 1, 8, 16);
  EXPECT_EQ(-EINVAL, bad.error().code());
  EXPECT_EQ(-EINVAL, gpu_digests(*lib, Dtype::bf16, 0, 1, 1, 1, 8, 16).error().code());
}

TEST(PnmGpuDigest, KernelEqualsItsReferenceOnAGpu) {
  auto lib = gpu::CudaLibrary::load();
  if (!lib.ok()) GTEST_SKIP() << lib.error().message();
  auto info = (*lib)->probe();
  if (!info.ok()) GTEST_SKIP() << info.error().message();
  const auto& ops = (*lib)->ops();
  std::mt19937_64 rng(2);
  for (Dtype t : {Dtype::bf16, Dtype::f16, Dtype::f32}) {
    const uint32_t rows = 64, n = 1000, dim = 128, pt = 16;
    Tensor k = random_tensor(t, size_t(rows) * n * dim, rng);
    const auto want = cpu_digests(t, k, rows, n, dim, pt);
    void *kd = nullptr, *od = nullptr;
    ASSERT_EQ(0, ops.device_alloc(&kd, k.bytes.size()));
    ASSERT_EQ(0, ops.device_alloc(&od, want.size()));
    ASSERT_EQ(0, ops.memcpy_async(kd, k.bytes.data(), k.bytes.size(), nullptr));
    auto r = gpu_digests(**lib, t, reinterpret_cast<uint64_t>(kd), reinterpret_cast<uint64_t>(od), rows, n, dim, pt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    std::vector<unsigned char> got(want.size());
    ASSERT_EQ(0, ops.memcpy_async(got.data(), od, got.size(), nullptr));
    ASSERT_EQ(0, ops.stream_sync(nullptr));
    EXPECT_EQ(want, got) << to_string(t);
    ops.device_free(kd);
    ops.device_free(od);
  }
}

namespace {

// Two contexts of geometry g on a two-host NonCoherentSim pool: context 1
// gets n1 tokens through append_gpu (the stand-in library, whose "device"
// memory is host memory) and then n2 on the CPU, context 2 the same K/V all
// on the CPU; a and b are host 1's read handles of the two.
struct GpuCpuPair {
  GpuCpuPair(const Geometry& g, uint32_t n1, uint32_t n2, uint64_t seed)
      : pool(32ull << 20, 2, 0.05), n(n1 + n2), error(setup(g, n1, n2, seed)) {}
  // "" or what failed.
  std::string setup(const Geometry& g, uint32_t n1, uint32_t n2, uint64_t seed) {
    StoreOptions so;
    so.carve_bytes = 8ull << 20;
    auto w = ContextStore::open(pool.host(0), so);
    so.writer = false;
    auto r = ContextStore::open(pool.host(1), so);
    if (!w.ok() || !r.ok()) return "stores";
    ws = std::move(*w);
    rs = std::move(*r);
    auto lib = gpu::CudaLibrary::cpu_reference();
    auto g_or = gpu::GpuPool::open(lib, pool.base(), pool.bytes);
    if (!g_or.ok()) return g_or.error().message();
    gp = std::move(*g_or);
    auto from_gpu = ws->create(1, g);
    auto from_cpu = ws->create(2, g);
    if (!from_gpu.ok() || !from_cpu.ok()) return "create";
    gw = std::move(*from_gpu);
    cw = std::move(*from_cpu);
    std::mt19937_64 rng(seed);
    const size_t lh = size_t(g.layers) * g.kv_heads;
    k1 = random_tensor(g.dtype, lh * n1 * g.head_dim, rng);
    v1 = random_tensor(g.dtype, k1.vals.size(), rng);
    Tensor k2 = random_tensor(g.dtype, lh * n2 * g.head_dim, rng), v2 = random_tensor(g.dtype, k2.vals.size(), rng);
    auto ga = gw->append_gpu(*gp, reinterpret_cast<uint64_t>(k1.bytes.data()),
                             reinterpret_cast<uint64_t>(v1.bytes.data()), n1);
    if (!ga.ok()) return ga.error().message();
    if (!gw->append(k2.data(), v2.data(), n2).ok() || !cw->append(k1.data(), v1.data(), n1).ok() ||
        !cw->append(k2.data(), v2.data(), n2).ok())
      return "CPU append";
    auto fa = rs->find(1);
    auto fb = rs->find(2);
    if (!fa.ok() || !fb.ok()) return "find";
    a = std::move(*fa);
    b = std::move(*fb);
    return "";
  }
  SharedPool pool;
  uint64_t n;
  std::unique_ptr<ContextStore> ws, rs;
  std::unique_ptr<gpu::GpuPool> gp;
  std::unique_ptr<Context> gw, cw, a, b;
  Tensor k1, v1;
  std::string error;  // last: setup() fills the members above first
};

}  // namespace

TEST(PnmGpuAppend, PagesAndGpuDigestsReachAnotherHostLikeACpuAppend) {
  const Geometry g{2, 2, 24, Dtype::bf16, 16, 256};
  const uint32_t n1 = 40, n2 = 9;  // a GPU batch ending in a partial page, then CPU appends
  GpuCpuPair t(g, n1, n2, 3);
  ASSERT_TRUE(t.error.empty()) << t.error;
  auto& a = t.a;
  auto& b = t.b;
  ASSERT_EQ(uint64_t(n1 + n2), a->tokens());
  const uint32_t np = a->pages_for(n1 + n2);
  std::vector<uint64_t> ta(np), tb(np);
  ASSERT_TRUE(a->read_page_table(0, np, ta.data()).ok());
  ASSERT_TRUE(b->read_page_table(0, np, tb.data()).ok());
  std::vector<unsigned char> da(np * 2 * 24 * 2), db(da.size()), ra(16 * 24 * 2), rb(ra.size());
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t h = 0; h < 2; h++) {
      ASSERT_TRUE(a->read_digests(l, h, 0, np, da.data()).ok());
      ASSERT_TRUE(b->read_digests(l, h, 0, np, db.data()).ok());
      EXPECT_EQ(db, da) << "layer " << l << " head " << h;
      for (uint32_t p = 0; p < np; p++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint32_t nt = std::min<uint32_t>(16, n1 + n2 - p * 16);
          ASSERT_TRUE(a->read_rows(ta[p], l, kv, h, nt, ra.data()).ok());
          ASSERT_TRUE(b->read_rows(tb[p], l, kv, h, nt, rb.data()).ok());
          EXPECT_EQ(0, std::memcmp(ra.data(), rb.data(), nt * 48)) << "page " << p;
        }
    }
  // Only at a page boundary.
  auto again = t.gw->append_gpu(*t.gp, reinterpret_cast<uint64_t>(t.k1.bytes.data()),
                                reinterpret_cast<uint64_t>(t.v1.bytes.data()), 16);
  EXPECT_EQ(-EINVAL, again.error().code());
}

// Every digest kind (docs/near-memory.md#digest-kinds): pages that come
// from a GPU get the same page rows, group rows and selection as the same
// K/V appended on the CPU (the kernel writes min/max rows; the q8 rows and
// the group rows are made from them when the pages are published).
TEST(PnmGpuAppend, EveryDigestKindGetsTheRowsAndSelectionOfACpuAppend) {
  struct Kind {
    DigestKind digest;
    uint32_t group_pages;
  };
  for (const Kind kind : {Kind{DigestKind::q8, 1}, Kind{DigestKind::q8, 4}, Kind{DigestKind::minmax, 4}}) {
    SCOPED_TRACE(std::string(to_string(kind.digest)) + " groups " + std::to_string(kind.group_pages));
    const Geometry g{2, 2, 24, Dtype::bf16, 16, 512, kind.digest, kind.group_pages};
    // Ten pages from the GPU, then CPU appends ending in a partial page.
    GpuCpuPair t(g, 160, 37, 5);
    ASSERT_TRUE(t.error.empty()) << t.error;
    auto& a = t.a;
    auto& b = t.b;
    const uint32_t np = a->pages_for(t.n), ng = a->groups_for(t.n);
    EXPECT_EQ(kind.group_pages > 1 ? (np + 3) / 4 : 0u, ng);
    std::vector<unsigned char> da(np * a->digest_row_bytes()), db(da.size());
    std::vector<unsigned char> ga(ng * a->digest_row_bytes()), gb(ga.size());
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t h = 0; h < 2; h++) {
        ASSERT_TRUE(a->read_digests(l, h, 0, np, da.data()).ok());
        ASSERT_TRUE(b->read_digests(l, h, 0, np, db.data()).ok());
        EXPECT_EQ(db, da) << "page rows of layer " << l << " head " << h;
        if (ng) {
          ASSERT_TRUE(a->read_group_digests(l, h, 0, ng, ga.data()).ok());
          ASSERT_TRUE(b->read_group_digests(l, h, 0, ng, gb.data()).ok());
          EXPECT_EQ(gb, ga) << "group rows of layer " << l << " head " << h;
        }
      }
    std::mt19937_64 rng(6);
    std::normal_distribution<float> nd;
    std::vector<float> q(size_t(2) * 4 * 24);
    for (float& x : q) x = nd(rng);
    SelectOptions o;
    o.token_budget = 48;
    o.refine_pages = 8;  // two levels: two groups' pages read, chosen by the group rows
    auto sa = select_pages(*a, q, 4, t.n, o);
    auto sb = select_pages(*b, q, 4, t.n, o);
    ASSERT_TRUE(sa.ok() && sb.ok()) << (sa.ok() ? sb.error().message() : sa.error().message());
    EXPECT_EQ(sb->pages, sa->pages);
    EXPECT_EQ(sb->digest_bytes, sa->digest_bytes);
  }
}

TEST(PnmGpuDigest, TheBuiltLibraryExportsTheKernelAndReportsFailuresByName) {
  auto lib = gpu::CudaLibrary::load();
  if (!lib.ok()) GTEST_SKIP() << lib.error().message();
  if ((*lib)->probe().ok()) GTEST_SKIP() << "a GPU is present: KernelEqualsItsReferenceOnAGpu covers it";
  // No driver / no GPU: the kernel is found, its launch fails with a message.
  std::vector<unsigned char> buf(4096);
  auto r = gpu_digests(**lib, Dtype::bf16, reinterpret_cast<uint64_t>(buf.data()),
                       reinterpret_cast<uint64_t>(buf.data()), 1, 16, 64, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string::npos, r.error().message().find("pnm digest")) << r.error().message();
}
