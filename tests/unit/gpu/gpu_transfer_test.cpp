// SPDX-License-Identifier: MIT
// The runtime's GPU path without a GPU: engine layouts -> descriptor
// batches, pinning (chunks, fallback to the IO-memory flag, unpin on close),
// and gather / scatter / sparse read through GpuPool over the CPU reference
// backend, checked byte for byte against naive copies.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <map>
#include <random>
#include <vector>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "gpu/reference_backend.hpp"

using namespace cxlkv::gpu;

namespace {

// Page-aligned anonymous memory standing in for a pool mapping.
struct Mapping {
  explicit Mapping(size_t n) : size(n) {
    p = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Mapping() { munmap(p, size); }
  unsigned char* p;
  size_t size;
};

void fill_random(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; i++) b[i] = static_cast<unsigned char>(r());
}

// A small geometry so tests stay fast: chunks of 4 tokens x 2 heads x 24 elems x 2 B = 384 B.
PagedLayout small_layout(LayoutKind kind, uint64_t blocks, std::vector<std::vector<unsigned char>>& tensors) {
  PagedLayout l;
  l.kind = kind;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_size = 24;
  l.block_tokens = 4;
  l.elem_bytes = 2;
  l.num_blocks = blocks;
  const size_t n = kind == LayoutKind::layer_first ? 2 * l.num_layers : 1;
  const uint64_t bytes = blocks * (kind == LayoutKind::layer_first ? l.chunk_bytes() : l.block_bytes());
  tensors.assign(n, std::vector<unsigned char>(bytes));
  for (size_t i = 0; i < n; i++) {
    fill_random(tensors[i].data(), bytes, 100 + i);
    l.tensors.push_back(reinterpret_cast<uintptr_t>(tensors[i].data()));
  }
  return l;
}

// What pool block `pool` should hold after gathering GPU block `id`.
std::vector<unsigned char> expected_block(const PagedLayout& l, uint64_t id) {
  std::vector<unsigned char> b;
  if (l.kind == LayoutKind::block_first) {
    auto* p = reinterpret_cast<const unsigned char*>(l.tensors[0]) + id * l.stride();
    return {p, p + l.block_bytes()};
  }
  for (uint64_t t : l.tensors) {
    auto* p = reinterpret_cast<const unsigned char*>(t) + id * l.stride();
    b.insert(b.end(), p, p + l.chunk_bytes());
  }
  return b;
}

// ---- a fake CUDA library: plain registration refused (a PFN mapping),
// the IO-memory flag accepted; chunks seen by the "GPU" 1 TiB apart.
struct FakeState {
  int registers = 0, unregisters = 0;
  bool refuse_plain = true;
  bool refuse_all = false;
  std::map<uintptr_t, uint32_t> live;  // host address -> flags
};
FakeState g_fake;
const char* fake_last_error() { return "fake: cudaErrorNotSupported: operation not supported"; }
int fake_register(void* p, size_t, uint32_t flags, uint64_t* dev) {
  if (g_fake.refuse_all || (g_fake.refuse_plain && !(flags & CXLKV_CUDA_REG_IOMEMORY))) return -EOPNOTSUPP;
  g_fake.registers++;
  g_fake.live[reinterpret_cast<uintptr_t>(p)] = flags;
  *dev = (1ull << 40) * g_fake.live.size() + (reinterpret_cast<uintptr_t>(p) & 0xffffffff);
  return 0;
}
int fake_unregister(void* p) {
  g_fake.unregisters++;
  g_fake.live.erase(reinterpret_cast<uintptr_t>(p));
  return 0;
}

cxlkv_cuda_ops fake_ops() {
  cxlkv_cuda_ops o = reference_ops();
  o.last_error = fake_last_error;
  o.host_register = fake_register;
  o.host_unregister = fake_unregister;
  return o;
}

const cxlkv_cuda_ops g_fake_ops = fake_ops();
std::shared_ptr<CudaLibrary> fake_library() { return CudaLibrary::from_table(&g_fake_ops, "fake"); }

}  // namespace

TEST(GpuLayout, Llama31BlockIs64ChunksOf32KiB) {
  std::vector<uint64_t> t(64, 0x10000000);
  auto l = PagedLayout::llama31_8b(LayoutKind::layer_first, 100, t);
  for (size_t i = 0; i < t.size(); i++) l.tensors[i] = 0x10000000ull * (i + 1);
  ASSERT_TRUE(l.validate().ok());
  EXPECT_EQ(32u * 1024, l.chunk_bytes());
  EXPECT_EQ(2u * 1024 * 1024, l.block_bytes());
  std::vector<DevicePiece> s;
  block_slices(l, 7, s);
  ASSERT_EQ(64u, s.size());
  EXPECT_EQ(0x10000000ull + 7 * 32 * 1024, s[0].dev);
  EXPECT_EQ(0x20000000ull * 32 + 7 * 32 * 1024, s[63].dev);
}

TEST(GpuLayout, BlockFirstBlockIsOneSlice) {
  auto l = PagedLayout::llama31_8b(LayoutKind::block_first, 10, {0x40000000});
  ASSERT_TRUE(l.validate().ok());
  std::vector<DevicePiece> s;
  block_slices(l, 3, s);
  ASSERT_EQ(1u, s.size());
  EXPECT_EQ(0x40000000ull + 3 * l.block_bytes(), s[0].dev);
  EXPECT_EQ(l.block_bytes(), s[0].len);
}

TEST(GpuLayout, InvalidLayoutsAreRefusedWithTheReason) {
  auto l = PagedLayout::llama31_8b(LayoutKind::layer_first, 10, std::vector<uint64_t>(63, 1));
  auto r = l.validate();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string::npos, r.error().message().find("63 tensor pointers, expected 64"));
  l.tensors.assign(64, 1);
  l.block_stride = 100;  // smaller than a 32 KiB chunk
  EXPECT_NE(std::string::npos, l.validate().error().message().find("block stride"));
  l.block_stride = 0;
  l.head_size = 0;
  EXPECT_EQ(-EINVAL, l.validate().error().code());
}

TEST(GpuPin, LargeRangesArePinnedInChunksAndTranslated) {
  Mapping m(1 << 20);
  auto pin = PoolPin::pin(CudaLibrary::cpu_reference(), m.p, m.size, PinOptions{.chunk_bytes = 256 << 10});
  ASSERT_TRUE(pin.ok()) << pin.error().message();
  EXPECT_EQ(4u, pin.value()->chunk_count());
  EXPECT_EQ(PinMethod::reference, pin.value()->method());
  std::vector<DevicePiece> out;
  // Crosses a chunk boundary; the stand-in GPU sees chunks adjacently, so one piece.
  ASSERT_TRUE(pin.value()->to_device((256 << 10) - 100, 300, out).ok());
  ASSERT_EQ(1u, out.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.p) + (256 << 10) - 100, out[0].dev);
  EXPECT_EQ(300u, out[0].len);
  auto bad = pin.value()->to_device(m.size - 10, 11, out);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(-ERANGE, bad.error().code());
}

TEST(GpuPool, GatherThenScatterRoundTripsEveryLayout) {
  for (auto kind : {LayoutKind::layer_first, LayoutKind::block_first}) {
    std::vector<std::vector<unsigned char>> src, dst;
    auto ls = small_layout(kind, 32, src);
    auto ld = small_layout(kind, 32, dst);  // different random contents
    Mapping m(64 * ls.block_bytes() + 4096);
    auto g = GpuPool::open(CudaLibrary::cpu_reference(), m.p, m.size);
    ASSERT_TRUE(g.ok()) << g.error().message();
    std::vector<uint64_t> ids = {5, 0, 31, 17}, offs = {0, 3 * ls.block_bytes(), 7 * ls.block_bytes() + 16, 40 * ls.block_bytes() + 3};
    ASSERT_TRUE(g.value()->gather(ls, ids, offs, nullptr).ok());
    ASSERT_TRUE(g.value()->sync(nullptr).ok());
    for (size_t i = 0; i < ids.size(); i++) {
      auto want = expected_block(ls, ids[i]);
      ASSERT_EQ(0, std::memcmp(m.p + offs[i], want.data(), want.size())) << "block " << ids[i];
    }
    std::vector<uint64_t> back = {9, 1, 2, 30};
    ASSERT_TRUE(g.value()->scatter(ld, back, offs, nullptr).ok());
    for (size_t i = 0; i < ids.size(); i++)
      EXPECT_EQ(expected_block(ls, ids[i]), expected_block(ld, back[i])) << "block " << back[i];
  }
}

TEST(GpuPool, LayerFirstAndBlockFirstWriteTheSamePoolBytes) {
  std::vector<std::vector<unsigned char>> lf_t, bf_t;
  auto lf = small_layout(LayoutKind::layer_first, 4, lf_t);
  auto bf = small_layout(LayoutKind::block_first, 4, bf_t);
  // Make block 2 of the block-first tensor hold what block 2 of the layer-first tensors hold.
  auto img = expected_block(lf, 2);
  std::memcpy(bf_t[0].data() + 2 * bf.block_bytes(), img.data(), img.size());
  Mapping m(2 * lf.block_bytes() + 4096);
  auto g = GpuPool::open(CudaLibrary::cpu_reference(), m.p, m.size);
  ASSERT_TRUE(g.ok());
  std::vector<uint64_t> id = {2}, off0 = {0}, off1 = {lf.block_bytes()};
  ASSERT_TRUE(g.value()->gather(lf, id, off0, nullptr).ok());
  ASSERT_TRUE(g.value()->gather(bf, id, off1, nullptr).ok());
  EXPECT_EQ(0, std::memcmp(m.p, m.p + lf.block_bytes(), lf.block_bytes()));
}

TEST(GpuPool, BadBlockIdsAndPoolOffsetsAreRefusedWithoutCopying) {
  std::vector<std::vector<unsigned char>> t;
  auto l = small_layout(LayoutKind::layer_first, 8, t);
  Mapping m(4 * l.block_bytes());
  std::memset(m.p, 0x5A, m.size);
  auto g = GpuPool::open(CudaLibrary::cpu_reference(), m.p, m.size);
  ASSERT_TRUE(g.ok());
  std::vector<uint64_t> ids = {1, 8}, offs = {0, l.block_bytes()};
  auto r = g.value()->gather(l, ids, offs, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string::npos, r.error().message().find("block id 8 is out of range"));
  std::vector<uint64_t> ids2 = {1, 2}, offs2 = {0, 4 * l.block_bytes() - 10};
  r = g.value()->gather(l, ids2, offs2, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(-ERANGE, r.error().code());
  std::vector<uint64_t> one = {1};
  EXPECT_EQ(-EINVAL, g.value()->gather(l, one, offs, nullptr).error().code());  // size mismatch
  for (size_t i = 0; i < m.size; i++) ASSERT_EQ(0x5A, m.p[i]) << "a refused batch wrote byte " << i;
}

TEST(GpuPool, SparseReadMatchesNaiveGather) {
  // Llama-3-8B-like token layout in the pool: per (layer, head, K|V) a run of
  // 64 tokens, 256 B each; 160-byte pieces of 16 sparse tokens per list.
  const uint64_t ntok = 64, stride = 256, piece = 160;
  const size_t nlists = 2 * 4 * 2;
  Mapping m(nlists * ntok * stride);
  fill_random(m.p, m.size, 9);
  auto g = GpuPool::open(CudaLibrary::cpu_reference(), m.p, m.size, PinOptions{.chunk_bytes = 64 << 10});
  ASSERT_TRUE(g.ok());
  std::mt19937_64 r(10);
  std::vector<SparseList> lists;
  std::vector<uint32_t> tokens;
  std::vector<unsigned char> out(nlists * 16 * piece), expect(out.size());
  for (size_t k = 0; k < nlists; k++) {
    lists.push_back({k * ntok * stride, stride, reinterpret_cast<uintptr_t>(out.data()) + k * 16 * piece, piece, 16, 0});
    for (int i = 0; i < 16; i++) {
      uint32_t t = static_cast<uint32_t>(r() % ntok);
      tokens.push_back(t);
      std::memcpy(expect.data() + (k * 16 + i) * piece, m.p + k * ntok * stride + t * stride, piece);
    }
  }
  ASSERT_TRUE(g.value()->sparse_read(lists, tokens, piece, nullptr).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), out.size()));
  // A token past the end of the pool is refused, not read.
  tokens.back() = static_cast<uint32_t>(m.size / stride);
  lists.back().pool_off = (nlists - 1) * ntok * stride;
  EXPECT_EQ(-ERANGE, g.value()->sparse_read(lists, tokens, piece, nullptr).error().code());
}

TEST(GpuPin, FallsBackToIoMemoryForPfnMappingsAndUnpinsOnClose) {
  g_fake = FakeState{};
  Mapping m(1 << 20);
  {
    auto pin = PoolPin::pin(fake_library(), m.p, m.size, PinOptions{.chunk_bytes = 512 << 10, .eager = true});
    ASSERT_TRUE(pin.ok()) << pin.error().message();
    EXPECT_EQ(PinMethod::io_memory, pin.value()->method());
    EXPECT_EQ(2u, g_fake.live.size());
    for (auto& [p, flags] : g_fake.live) EXPECT_TRUE(flags & CXLKV_CUDA_REG_IOMEMORY);
    // Chunks the GPU sees apart: a range across them becomes two pieces.
    std::vector<DevicePiece> out;
    ASSERT_TRUE(pin.value()->to_device((512 << 10) - 8, 16, out).ok());
    ASSERT_EQ(2u, out.size());
    EXPECT_EQ(8u, out[0].len);
    EXPECT_EQ(8u, out[1].len);
  }
  EXPECT_TRUE(g_fake.live.empty()) << "chunks left registered after close";
  EXPECT_EQ(g_fake.registers, g_fake.unregisters);
}

TEST(GpuPin, ReportsBothMethodsWhenNeitherWorks) {
  g_fake = FakeState{};
  g_fake.refuse_all = true;
  Mapping m(1 << 16);
  auto pin = PoolPin::pin(fake_library(), m.p, m.size, PinOptions{.eager = true});
  ASSERT_FALSE(pin.ok());
  EXPECT_NE(std::string::npos, pin.error().message().find("host-register failed"));
  EXPECT_NE(std::string::npos, pin.error().message().find("io-memory failed"));
  EXPECT_NE(std::string::npos, pin.error().message().find("cudaErrorNotSupported"));
  // On demand (the default) the open succeeds and the first transfer that
  // touches the range gets the same reasons, naming the chunk.
  auto lazy = PoolPin::pin(fake_library(), m.p, m.size, PinOptions{.chunk_bytes = 16 << 10});
  ASSERT_TRUE(lazy.ok()) << lazy.error().message();
  std::vector<DevicePiece> out;
  auto r = lazy.value()->to_device(20 << 10, 100, out);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(-EOPNOTSUPP, r.error().code());
  EXPECT_NE(std::string::npos, r.error().message().find("pool chunk 1 ")) << r.error().message();
  EXPECT_NE(std::string::npos, r.error().message().find("io-memory failed"));
  EXPECT_TRUE(g_fake.live.empty());
}

TEST(GpuPin, DescriptorsSplitWhereTheGpuSeesChunksApart) {
  g_fake = FakeState{};
  std::vector<std::vector<unsigned char>> t;
  auto l = small_layout(LayoutKind::block_first, 4, t);
  Mapping m(1 << 16);
  auto pin = PoolPin::pin(fake_library(), m.p, m.size, PinOptions{.chunk_bytes = 4096});
  ASSERT_TRUE(pin.ok());
  std::vector<uint64_t> id = {1}, off = {4096 - 100};
  auto d = plan_blocks(l, id, off, *pin.value(), Direction::gather);
  ASSERT_TRUE(d.ok()) << d.error().message();
  uint64_t total = 0;
  for (auto& x : d.value()) total += x.len;
  EXPECT_EQ(l.block_bytes(), total);
  ASSERT_GE(d.value().size(), 2u);
  EXPECT_EQ(100u, d.value()[0].len);
  EXPECT_EQ(l.tensors[0] + l.block_bytes() + 100, d.value()[1].src);
}

// ---- on-demand pinning (docs/gpu.md "On-demand pinning") ----------------------

namespace {
// A fake driver whose registration costs what an H100 host's does (~0.59 s
// per GiB, scaled down 1000x so the test stays quick: 0.59 ms per GiB) and
// that counts the bytes it registered.
struct CountingFake {
  std::atomic<uint64_t> bytes{0}, calls{0}, unregs{0};
  std::mutex mu;
  std::map<uintptr_t, size_t> live;
};
CountingFake g_count;
int counting_register(void* p, size_t len, uint32_t, uint64_t* dev) {
  std::this_thread::sleep_for(std::chrono::microseconds(len >> 21));  // 0.5 us per 2 MiB
  std::lock_guard<std::mutex> g(g_count.mu);
  g_count.bytes += len;
  g_count.calls++;
  g_count.live[reinterpret_cast<uintptr_t>(p)] = len;
  *dev = reinterpret_cast<uintptr_t>(p);  // the GPU sees host addresses (UVA)
  return 0;
}
int counting_unregister(void* p) {
  std::lock_guard<std::mutex> g(g_count.mu);
  g_count.unregs++;
  g_count.live.erase(reinterpret_cast<uintptr_t>(p));
  return 0;
}
cxlkv_cuda_ops counting_ops() {
  cxlkv_cuda_ops o = reference_ops();
  o.host_register = counting_register;
  o.host_unregister = counting_unregister;
  return o;
}
const cxlkv_cuda_ops g_counting_ops = counting_ops();
void reset_counting() {
  g_count.bytes = g_count.calls = g_count.unregs = 0;
  g_count.live.clear();
}

// A sparse 64 GiB shared-memory pool mapping (no page is allocated until touched).
struct SparseShm {
  explicit SparseShm(uint64_t n) : size(n), name("/cxlkv-gpu-sparse-" + std::to_string(getpid())) {
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0) return;
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (m != MAP_FAILED) p = static_cast<unsigned char*>(m);
  }
  ~SparseShm() {
    if (p) munmap(p, size);
    shm_unlink(name.c_str());
  }
  unsigned char* p = nullptr;
  uint64_t size;
  std::string name;
};
}  // namespace

TEST(GpuPinOnDemand, A64GiBPoolIsReadyAtOnceAndOnlyTouchedChunksAreRegistered) {
  reset_counting();
  const uint64_t GiB = 1ull << 30;
  SparseShm shm(64 * GiB);
  ASSERT_NE(nullptr, shm.p) << "cannot map a sparse 64 GiB shm file";
  std::vector<std::vector<unsigned char>> t;
  auto l = small_layout(LayoutKind::layer_first, 8, t);
  {
    const auto t0 = std::chrono::steady_clock::now();
    auto g = GpuPool::open(CudaLibrary::from_table(&g_counting_ops, "counting-fake"), shm.p, shm.size);
    const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(g.ok()) << g.error().message();
    EXPECT_LT(open_s, 0.5) << "opening a 64 GiB pool must not register it";
    EXPECT_EQ(0u, g_count.calls.load()) << "nothing is registered before a transfer touches it";
    const PoolPin& pin = g.value()->pin();
    EXPECT_EQ(64u, pin.chunk_count());
    EXPECT_EQ(PinMethod::pending, pin.method());

    // Two blocks in chunk 3, one in chunk 40, one straddling chunks 62/63.
    std::vector<uint64_t> ids = {0, 1, 2, 3};
    std::vector<uint64_t> offs = {3 * GiB + 4096, 3 * GiB + 1000000, 40 * GiB + 12345, 63 * GiB - 100};
    ASSERT_TRUE(g.value()->gather(l, ids, offs, nullptr).ok());
    for (size_t i = 0; i < ids.size(); i++) {
      auto want = expected_block(l, ids[i]);
      ASSERT_EQ(0, std::memcmp(shm.p + offs[i], want.data(), want.size())) << "block " << i;
    }
    EXPECT_EQ(4u, g_count.calls.load()) << "chunks 3, 40, 62 and 63 only";
    EXPECT_EQ(4 * GiB, g_count.bytes.load());
    for (size_t c : {3, 40, 62, 63}) EXPECT_TRUE(pin.chunk_pinned(c)) << "chunk " << c;
    EXPECT_FALSE(pin.chunk_pinned(0));
    EXPECT_FALSE(pin.chunk_pinned(41));
    PinStats st = pin.stats();
    EXPECT_EQ(4u, st.chunks_pinned);
    EXPECT_EQ(4u, st.on_demand);
    EXPECT_EQ(PinMethod::host_register, pin.method());
    // A second transfer into the same chunks registers nothing more.
    ASSERT_TRUE(g.value()->scatter(l, ids, offs, nullptr).ok());
    EXPECT_EQ(4u, g_count.calls.load());
  }
  EXPECT_EQ(4u, g_count.unregs.load()) << "every registered chunk is unregistered on close";
  EXPECT_TRUE(g_count.live.empty());
}

TEST(GpuPinOnDemand, BackgroundPrePinRegistersEveryChunkOnceAlongsideTransfers) {
  reset_counting();
  Mapping m(64 << 20);
  std::vector<std::vector<unsigned char>> t;
  auto l = small_layout(LayoutKind::block_first, 4, t);
  {
    auto g = GpuPool::open(CudaLibrary::from_table(&g_counting_ops, "counting-fake"), m.p, m.size,
                           PinOptions{.chunk_bytes = 1 << 20, .background = true});
    ASSERT_TRUE(g.ok()) << g.error().message();
    std::vector<uint64_t> ids = {1}, offs = {(50 << 20) + 7};
    ASSERT_TRUE(g.value()->gather(l, ids, offs, nullptr).ok());  // races the pre-pin: registered once
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (g.value()->pin().stats().chunks_pinned < 64 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    PinStats st = g.value()->pin().stats();
    EXPECT_EQ(64u, st.chunks_pinned);
    EXPECT_EQ(64u, g_count.calls.load()) << "a chunk was registered twice";
    EXPECT_EQ(64u, st.on_demand + st.background);
    auto want = expected_block(l, 1);
    EXPECT_EQ(0, std::memcmp(m.p + offs[0], want.data(), want.size()));
  }
  EXPECT_EQ(64u, g_count.unregs.load());
}

TEST(GpuPinOnDemand, ClosingDuringTheBackgroundPrePinStopsItAndUnregistersWhatItPinned) {
  reset_counting();
  Mapping m(256 << 20);
  {
    auto g = GpuPool::open(CudaLibrary::from_table(&g_counting_ops, "counting-fake"), m.p, m.size,
                           PinOptions{.chunk_bytes = 1 << 20, .background = true});
    ASSERT_TRUE(g.ok());
  }  // closed at once
  std::lock_guard<std::mutex> lk(g_count.mu);
  EXPECT_EQ(g_count.calls.load(), g_count.unregs.load());
  EXPECT_TRUE(g_count.live.empty());
}

TEST(GpuPinOnDemand, TheIoMemoryPathIsOnDemandToo) {
  g_fake = FakeState{};  // plain registration refused: a PFN mapping
  Mapping m(4 << 20);
  {
    auto pin = PoolPin::pin(fake_library(), m.p, m.size, PinOptions{.chunk_bytes = 1 << 20});
    ASSERT_TRUE(pin.ok()) << pin.error().message();
    EXPECT_TRUE(g_fake.live.empty());
    std::vector<DevicePiece> out;
    ASSERT_TRUE(pin.value()->to_device((2 << 20) + 5, 10, out).ok());
    EXPECT_EQ(PinMethod::io_memory, pin.value()->method());
    ASSERT_EQ(1u, g_fake.live.size());
    EXPECT_TRUE(g_fake.live.begin()->second & CXLKV_CUDA_REG_IOMEMORY);
    // Later chunks go straight to the method that worked: one call each.
    const int before = g_fake.registers;
    ASSERT_TRUE(pin.value()->to_device(5, 10, out).ok());
    EXPECT_EQ(before + 1, g_fake.registers);
  }
  EXPECT_TRUE(g_fake.live.empty());
}
