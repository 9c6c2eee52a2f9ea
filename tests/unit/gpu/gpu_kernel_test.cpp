// SPDX-License-Identifier: MIT
// The CUDA kernels against the CPU reference, byte for byte: device-to-
// device batches with every misalignment, gather / scatter between a paged
// GPU cache and a pinned pool mapping (inline small batches, staged large
// ones, many batches in flight), and sparse reads.  Skipped with the reason
// where no GPU, driver or library is present.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <memory>
#include <random>
#include <vector>

#include "cuda/copy_core.h"
#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "gpu/reference_backend.hpp"

using namespace cxlkv::gpu;
namespace cc = cxlkv::copycore;

namespace {

std::shared_ptr<CudaLibrary> g_lib;
std::string g_skip;

void fill_random(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; i++) b[i] = static_cast<unsigned char>(r());
}

// A device buffer with a host shadow of what it should hold.
struct DeviceBuffer {
  DeviceBuffer(size_t n, uint64_t seed) : host(n) {
    fill_random(host.data(), n, seed);
    if (g_lib->ops().device_alloc(&dev, n) < 0) throw std::runtime_error(g_lib->ops().last_error());
    upload();
  }
  ~DeviceBuffer() { g_lib->ops().device_free(dev); }
  void upload() {
    EXPECT_EQ(0, g_lib->ops().memcpy_async(dev, host.data(), host.size(), nullptr));
    EXPECT_EQ(0, g_lib->ops().stream_sync(nullptr));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(host.size());
    EXPECT_EQ(0, g_lib->ops().memcpy_async(out.data(), dev, out.size(), nullptr));
    EXPECT_EQ(0, g_lib->ops().stream_sync(nullptr));
    return out;
  }
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(dev) + off; }
  std::vector<unsigned char> host;
  void* dev = nullptr;
};

struct Mapping {
  explicit Mapping(size_t n) : size(n) {
    p = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    fill_random(p, n, 77);
  }
  ~Mapping() { munmap(p, size); }
  unsigned char* p;
  size_t size;
};

class GpuKernel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // CXLKV_GPU_TEST_BACKEND=cpu-reference runs these tests' own harness
    // against the CPU stand-in (a check of the tests, not of the kernels).
    if (const char* b = std::getenv("CXLKV_GPU_TEST_BACKEND"); b && std::string(b) == "cpu-reference") {
      g_lib = CudaLibrary::cpu_reference();
      return;
    }
    Status s = probe();
    if (s.availability != Availability::ready) {
      g_skip = std::string("no usable GPU (") + to_string(s.availability) + "): " + s.message;
      return;
    }
    auto lib = CudaLibrary::load();
    if (!lib) {
      g_skip = lib.error().message();
      return;
    }
    g_lib = lib.value();
  }
  void SetUp() override {
    if (!g_lib) GTEST_SKIP() << g_skip;
  }
};

// Random descriptors between two device buffers (disjoint destination slots).
std::vector<cxlkv_copy_desc> random_descs(const DeviceBuffer& src, const DeviceBuffer& dst, size_t n,
                                          uint64_t max_len, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<cxlkv_copy_desc> d;
  const size_t slot = dst.host.size() / n;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = std::min<uint64_t>(r() % (max_len + 1), slot - 16);
    size_t doff = i * slot + r() % 16, soff = r() % (src.host.size() - len);
    d.push_back({src.addr(soff), dst.addr(doff), len});
  }
  return d;
}

// The same batch on the host shadows, run by the reference.
void reference_on_shadows(std::vector<cxlkv_copy_desc> d, DeviceBuffer& src, DeviceBuffer& dst) {
  for (auto& x : d) {
    x.src = reinterpret_cast<uintptr_t>(src.host.data()) + (x.src - src.addr());
    x.dst = reinterpret_cast<uintptr_t>(dst.host.data()) + (x.dst - dst.addr());
  }
  reference_copy(d.data(), d.size());
}

}  // namespace

TEST_F(GpuKernel, SmallAndLargeBatchesMatchTheReference) {
  DeviceBuffer src(4 << 20, 1), dst(4 << 20, 2);
  // 3 descriptors fit the inline path; 400 need the staged path.
  for (size_t n : {size_t{3}, size_t{40}, size_t{400}}) {
    auto d = random_descs(src, dst, n, 3 * cc::kTileBytes + 5, n);
    ASSERT_EQ(0, g_lib->ops().copy(d.data(), d.size(), nullptr)) << g_lib->ops().last_error();
    reference_on_shadows(d, src, dst);
    EXPECT_EQ(dst.host, dst.download()) << n << " descriptors";
  }
}

TEST_F(GpuKernel, EveryRelativeMisalignmentMatchesTheReference) {
  DeviceBuffer src(1 << 20, 3), dst(1 << 20, 4);
  std::vector<cxlkv_copy_desc> d;
  size_t slot = 0;
  for (uint64_t so = 0; so < 16; so++)
    for (uint64_t doff = 0; doff < 16; doff++, slot++)
      d.push_back({src.addr(so + slot * 64), dst.addr(slot * 4096 + doff), 1000 + slot});
  ASSERT_EQ(0, g_lib->ops().copy(d.data(), d.size(), nullptr)) << g_lib->ops().last_error();
  reference_on_shadows(d, src, dst);
  EXPECT_EQ(dst.host, dst.download());
}

TEST_F(GpuKernel, ManyBatchesInFlightReuseDescriptorSlotsSafely) {
  DeviceBuffer src(8 << 20, 5), dst(8 << 20, 6);
  void* stream = nullptr;
  ASSERT_EQ(0, g_lib->ops().stream_create(&stream));
  std::vector<std::vector<cxlkv_copy_desc>> batches;
  for (int b = 0; b < 24; b++) {  // three times the staging ring
    // Batch b writes only its own region of dst.
    std::mt19937_64 r(b);
    std::vector<cxlkv_copy_desc> d;
    for (int i = 0; i < 80; i++) {
      size_t doff = (static_cast<size_t>(b) * 80 + i) * 4096;
      d.push_back({src.addr(r() % (src.host.size() - 4096)), dst.addr(doff), 4000});
    }
    ASSERT_EQ(0, g_lib->ops().copy(d.data(), d.size(), stream)) << g_lib->ops().last_error();
    batches.push_back(std::move(d));
  }
  ASSERT_EQ(0, g_lib->ops().stream_sync(stream));
  for (auto& d : batches) reference_on_shadows(d, src, dst);
  EXPECT_EQ(dst.host, dst.download());
  g_lib->ops().stream_destroy(stream);
}

TEST_F(GpuKernel, GatherAndScatterThroughThePinnedPoolMatchTheReference) {
  const uint64_t blocks = 16;
  PagedLayout l = PagedLayout::llama31_8b(LayoutKind::layer_first, blocks, {}, 4);  // 8 KiB chunks
  std::vector<std::unique_ptr<DeviceBuffer>> k;
  for (int i = 0; i < 64; i++) {
    k.push_back(std::make_unique<DeviceBuffer>(blocks * l.chunk_bytes(), 100 + i));
    l.tensors.push_back(k.back()->addr());
  }
  Mapping m(blocks * l.block_bytes() + (2 << 20));
  auto g = GpuPool::open(g_lib, m.p, m.size);
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::printf("pinned by %s\n", to_string(g.value()->pin().method()));
  std::vector<uint64_t> ids = {3, 0, 15, 7}, offs = {0, l.block_bytes() + 48, 5 * l.block_bytes() + 3, 9 * l.block_bytes()};
  ASSERT_TRUE(g.value()->gather(l, ids, offs, nullptr).ok());
  ASSERT_TRUE(g.value()->sync(nullptr).ok());
  for (size_t i = 0; i < ids.size(); i++)
    for (int t = 0; t < 64; t++)
      ASSERT_EQ(0, std::memcmp(m.p + offs[i] + t * l.chunk_bytes(), k[t]->host.data() + ids[i] * l.chunk_bytes(),
                               l.chunk_bytes()))
          << "block " << ids[i] << " slice " << t;
  // Scatter them back into other slots.
  std::vector<uint64_t> back = {1, 2, 4, 5};
  ASSERT_TRUE(g.value()->scatter(l, back, offs, nullptr).ok());
  ASSERT_TRUE(g.value()->sync(nullptr).ok());
  for (int t = 0; t < 64; t++) {
    auto img = k[t]->download();
    for (size_t i = 0; i < ids.size(); i++)
      ASSERT_EQ(0, std::memcmp(img.data() + back[i] * l.chunk_bytes(), m.p + offs[i] + t * l.chunk_bytes(),
                               l.chunk_bytes()))
          << "block " << back[i] << " slice " << t;
  }
}

TEST_F(GpuKernel, SparseReadMatchesTheReference) {
  const uint64_t ntok = 256, stride = 256, piece = 160;
  const size_t nlists = 32 * 8 * 2;  // Llama-3-8B: layers x KV heads x K|V
  Mapping m(nlists * ntok * stride);
  auto g = GpuPool::open(g_lib, m.p, m.size);
  ASSERT_TRUE(g.ok()) << g.error().message();
  DeviceBuffer out(nlists * 16 * piece, 9);
  std::mt19937_64 r(11);
  std::vector<SparseList> lists;
  std::vector<uint32_t> tokens;
  for (size_t k = 0; k < nlists; k++) {
    lists.push_back({k * ntok * stride, stride, out.addr(k * 16 * piece), piece, 16, 0});
    for (int i = 0; i < 16; i++) {
      uint32_t t = static_cast<uint32_t>(r() % ntok);
      tokens.push_back(t);
      std::memcpy(out.host.data() + (k * 16 + i) * piece, m.p + k * ntok * stride + t * stride, piece);
    }
  }
  ASSERT_TRUE(g.value()->sparse_read(lists, tokens, piece, nullptr).ok());
  ASSERT_TRUE(g.value()->sync(nullptr).ok());
  EXPECT_EQ(out.host, out.download());
}

// Both launch shapes, inline (<= kInlineDescs descriptors) and
// staged, for chunk sizes of 2-64 KiB and batches of 1-1024 chunks.
TEST_F(GpuKernel, EveryLaunchShapeMatchesTheReferenceForSmallChunksAndBatches) {
  DeviceBuffer src(8 << 20, 21), dst(24 << 20, 22);
  uint64_t seed = 1;
  for (uint64_t chunk : {uint64_t{2048}, uint64_t{4096}, uint64_t{4100}, uint64_t{16384}, uint64_t{32768},
                         uint64_t{65536}}) {
    for (size_t n : {size_t{1}, size_t{cc::kInlineDescs}, size_t{cc::kInlineDescs + 1}, size_t{1024}}) {
      if (n * (chunk + 64) > dst.host.size()) continue;
      for (uint32_t shape : {CXLKV_CUDA_SHAPE_AUTO, CXLKV_CUDA_SHAPE_BLOCK, CXLKV_CUDA_SHAPE_WARP}) {
        std::mt19937_64 r(seed++);
        std::vector<cxlkv_copy_desc> d;
        for (size_t i = 0; i < n; i++)
          d.push_back({src.addr(r() % (src.host.size() - chunk)), dst.addr(i * (chunk + 64) + r() % 4 * 16), chunk});
        ASSERT_EQ(0, g_lib->ops().copy_shaped(d.data(), d.size(), shape, nullptr)) << g_lib->ops().last_error();
        for (auto& x : d) {
          x.src = reinterpret_cast<uintptr_t>(src.host.data()) + (x.src - src.addr());
          x.dst = reinterpret_cast<uintptr_t>(dst.host.data()) + (x.dst - dst.addr());
        }
        ASSERT_EQ(0, reference_copy_shaped(d.data(), d.size(), shape));
        ASSERT_EQ(dst.host, dst.download()) << "chunk " << chunk << " batch " << n << " shape " << shape;
      }
    }
  }
}

TEST_F(GpuKernel, WarmupLoadsTheKernelsAndEventsCanBeWaitedOnRepeatedly) {
  ASSERT_EQ(0, g_lib->ops().warmup(nullptr)) << g_lib->ops().last_error();
  void* ev = nullptr;
  ASSERT_EQ(0, g_lib->ops().event_record(nullptr, &ev));
  ASSERT_EQ(0, g_lib->ops().event_sync(ev));
  EXPECT_EQ(0, g_lib->ops().event_query(ev));
  void* s = nullptr;
  ASSERT_EQ(0, g_lib->ops().stream_create(&s));
  EXPECT_EQ(0, g_lib->ops().stream_wait_event(s, ev));
  EXPECT_EQ(0, g_lib->ops().stream_sync(s));
  EXPECT_EQ(0, g_lib->ops().event_destroy(ev));
  g_lib->ops().stream_destroy(s);
}
