// SPDX-License-Identifier: MIT
// The GPU path on every tier (docs/gpu.md "Every tier"): blocks interleaved over two pool
// devices go through their stripe map, blocks on the SSD tier through the
// pinned staging ring (the store reads them with io_uring, the GPU copies a
// slot while the next is read), byte for byte against the CPU path, on an
// asynchronous fake GPU whose copies run only when waited for -- so a
// staging slot reused before its copy completed would show wrong bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/gpu.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/memory_domain.hpp"
#include "cxlkv/tier.hpp"
#include "gpu/reference_backend.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "tier/ssd_payload_tier.hpp"
#include "support/kv_test_support.hpp"
#include "support/tier_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::gpu;
using namespace cxlkv::test;

namespace {

constexpr uint64_t kPoolBytes = 16 << 20;
constexpr uint64_t kIndexBytes = 2 << 20;

// "GPU" tensors in host memory: 8 layers, 32-token blocks of 2 heads x 32
// fp16 (4 KiB chunks, 64 KiB blocks), layer-first.
struct Tensors {
  explicit Tensors(uint64_t seed, uint32_t blocks = 24) {
    layout.kind = LayoutKind::layer_first;
    layout.num_layers = 8;
    layout.num_kv_heads = 2;
    layout.head_size = 32;
    layout.block_tokens = 32;
    layout.elem_bytes = 2;
    layout.num_blocks = blocks;
    std::mt19937_64 r(seed);
    for (int t = 0; t < 16; t++) {
      mem.emplace_back(blocks * layout.chunk_bytes());
      for (auto& b : mem.back()) b = static_cast<unsigned char>(r());
      layout.tensors.push_back(reinterpret_cast<uintptr_t>(mem.back().data()));
    }
  }
  std::vector<unsigned char> block(uint64_t id) const {
    std::vector<unsigned char> b;
    for (auto& m : mem) b.insert(b.end(), m.begin() + id * layout.chunk_bytes(), m.begin() + (id + 1) * layout.chunk_bytes());
    return b;
  }
  PagedLayout layout;
  std::vector<std::vector<unsigned char>> mem;
};

std::vector<BlockKey> chain(uint64_t id, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = id * 1000003 + i + 11;
  return keys_from_ids(ids);
}

// An asynchronous fake GPU: copies are queued and run (reference) only when
// an event or the stream is waited for; it also records which copies read
// staging memory (sources outside the pool and the tensors).
struct AsyncGpu {
  std::vector<std::vector<cxlkv_copy_desc>> pending;
  size_t copies = 0;
};
AsyncGpu g_gpu;
int a_copy(const cxlkv_copy_desc* d, size_t n, void*) {
  g_gpu.pending.emplace_back(d, d + n);
  g_gpu.copies++;
  return 0;
}
int a_complete(void*) {
  for (auto& b : g_gpu.pending) reference_copy(b.data(), b.size());
  g_gpu.pending.clear();
  return 0;
}
cxlkv_cuda_ops async_ops() {
  cxlkv_cuda_ops o = reference_ops();
  o.copy = a_copy;
  o.event_wait = a_complete;
  o.event_sync = a_complete;
  o.stream_sync = a_complete;
  return o;
}
const cxlkv_cuda_ops g_async_ops = async_ops();

// Memory capacity in blocks (the SSD tier takes what does not fit).
class LimitedSpace final : public PayloadSpace {
 public:
  LimitedSpace(PayloadSpace& inner, uint32_t limit) : inner_(inner), limit_(limit) {}
  Result<BlockLocation> alloc(uint64_t bytes) override {
    if (used_ >= limit_) return Error(-ENOSPC, "memory tier full");
    auto r = inner_.alloc(bytes);
    if (r) used_++;
    return r;
  }
  void free(const BlockLocation& loc) override {
    inner_.free(loc);
    used_--;
  }

 private:
  PayloadSpace& inner_;
  uint32_t limit_;
  uint32_t used_ = 0;
};

struct SsdStore {
  explicit SsdStore(uint32_t mem_blocks)
      : pool(kPoolBytes), sim(pool.mem, pool.bytes, NonCoherentSimOptions{1, 0.05, 5}),
        range(kIndexBytes, kPoolBytes - kIndexBytes), space(range, mem_blocks) {
    IndexFormatOptions fo;
    fo.stripe_slots = 64;
    fo.max_stripes = 1;
    EXPECT_TRUE(index_format(sim.node(0), pool.mem, kIndexBytes, fo).ok());
    live.set_incarnation(0, 100);
    if (!dir.ok() || !dir.direct_io_ok()) return;
    SsdPoolOptions so;
    so.probe_bytes = 64 * 1024;
    so.devices.push_back({dir.file("ssd0"), 32 << 20, 1.0, false});
    auto sp = SsdPool::open(so);
    EXPECT_TRUE(sp) << (sp ? "" : sp.error().message());
    if (!sp) return;
    ssd = std::move(*sp);
    tier = std::make_unique<SsdPayloadTier>(*ssd);
    KvDeps d;
    d.index_domain = &sim.node(0);
    d.index_carve = pool.mem;
    d.index_bytes = kIndexBytes;
    d.node = 0;
    d.incarnation = 100;
    d.locks = &locks;
    d.liveness = &live;
    d.space = &space;
    d.devices.push_back(PoolDevice{&sim.node(0), pool.mem, pool.bytes});
    d.ssd_tier = tier.get();
    d.demote_on_evict = true;
    auto kv_r = KvStore::create(std::move(d));
    EXPECT_TRUE(kv_r.ok()) << (kv_r.ok() ? "" : kv_r.error().message());
    if (kv_r.ok()) kv = std::move(kv_r.value());
  }
  uint8_t tier_of(const BlockKey& k) {
    BlockLocation loc;
    EXPECT_NE(store_index(*kv).find_ready(k, &loc), CXLKV_INDEX_NO_SLOT);
    return loc.tier;
  }
  tier_test::ScratchDir dir;
  AlignedPool pool;
  NonCoherentSim sim;
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace range;
  LimitedSpace space;
  std::unique_ptr<SsdPool> ssd;
  std::unique_ptr<SsdPayloadTier> tier;
  std::unique_ptr<KvStore> kv;
};

}  // namespace

TEST(GpuTiers, SsdBlocksComeThroughTheStagingRingByteForByte) {
  SsdStore t(4);
  if (!t.dir.ok() || !t.dir.direct_io_ok()) GTEST_SKIP() << "O_DIRECT not supported in the scratch directory";
  ASSERT_TRUE(t.kv);
  g_gpu = AsyncGpu{};
  auto lib = CudaLibrary::from_table(&g_async_ops, "async-fake");
  auto gp = GpuPool::open(lib, t.pool.mem, t.pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  gp.value()->set_staging_slot_bytes(64 << 10);  // one block per slot: the 4-slot ring turns over
  Tensors src(1), dst(2);
  auto keys = chain(1, 12);
  std::vector<uint64_t> ids(12), into(12);
  for (size_t i = 0; i < 12; i++) ids[i] = i, into[i] = 23 - i;
  KvGpu g(*t.kv, {gp.value().get()});
  std::vector<int32_t> st(12);
  // Published from the GPU four at a time: memory holds 4 blocks, the rest are demoted.
  for (size_t b = 0; b < 12; b += 4) {
    auto r = g.put_chain(b ? &keys[b - 1] : nullptr, std::span(keys).subspan(b, 4), src.layout,
                         std::span(ids).subspan(b, 4), nullptr, std::span(st).subspan(b, 4));
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_EQ(4u, r.value());
  }
  size_t on_ssd = 0;
  for (auto& k : keys) on_ssd += t.tier_of(k) == CXLKV_TIER_SSD;
  ASSERT_EQ(8u, on_ssd);

  const uint64_t reads_before = t.tier->stats().reads;
  auto n = g.get_many(keys, dst.layout, into, nullptr, st);
  ASSERT_TRUE(n.ok()) << n.error().message();
  EXPECT_EQ(12u, n.value());
  for (size_t i = 0; i < 12; i++) {
    EXPECT_EQ(0, st[i]) << "block " << i;
    EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "block " << i << " (tier " << int(t.tier_of(keys[i])) << ")";
  }
  EXPECT_EQ(reads_before + 8, t.tier->stats().reads) << "the SSD blocks were read from the SSD tier";
  for (auto& k : keys) {
    uint32_t slot = 0;
    ASSERT_EQ(static_cast<uint32_t>(CXLKV_ENTRY_READY), store_index(*t.kv).find_state(k, &slot));
    EXPECT_EQ(0u, store_index(*t.kv).entry(slot).pin_mask) << "a pin was left behind";
  }
}

TEST(GpuTiers, ALayerWiseLoadOfSsdBlocksHasThemInPlaceByTheFirstLayersEvent) {
  SsdStore t(2);
  if (!t.dir.ok() || !t.dir.direct_io_ok()) GTEST_SKIP() << "O_DIRECT not supported in the scratch directory";
  ASSERT_TRUE(t.kv);
  g_gpu = AsyncGpu{};
  auto gp = GpuPool::open(CudaLibrary::from_table(&g_async_ops, "async-fake"), t.pool.mem, t.pool.bytes);
  ASSERT_TRUE(gp.ok());
  gp.value()->set_staging_slot_bytes(128 << 10);
  Tensors src(3), dst(4);
  auto keys = chain(2, 6);
  std::vector<uint64_t> ids = {0, 1, 2, 3, 4, 5}, into = {10, 11, 12, 13, 14, 15};
  KvGpu g(*t.kv, {gp.value().get()});
  std::vector<int32_t> st(6);
  for (size_t b = 0; b < 6; b += 2)
    ASSERT_EQ(2u, g.put_chain(b ? &keys[b - 1] : nullptr, std::span(keys).subspan(b, 2), src.layout,
                              std::span(ids).subspan(b, 2), nullptr, std::span(st).subspan(b, 2))
                      .value());
  auto load = g.load_layers(keys, dst.layout, into, nullptr, 1, st);
  ASSERT_TRUE(load.ok()) << load.error().message();
  EXPECT_EQ(6u, load.value()->blocks_loading());
  ASSERT_TRUE(load.value()->wait_layer(0).ok());
  for (size_t i = 0; i < 6; i++)
    if (t.tier_of(keys[i]) == CXLKV_TIER_SSD) {
      EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "SSD block " << i;
    }
  auto n = load.value()->finish(st);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(6u, n.value());
  for (size_t i = 0; i < 6; i++) EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "block " << i;
}

namespace {
// Two pool devices with the index formatted to interleave over both in 4 KiB stripes.
struct InterleavedStore {
  InterleavedStore()
      : pool0(kPoolBytes), pool1(kPoolBytes), sim(pool0.mem, pool0.bytes, NonCoherentSimOptions{1, 0.05, 9}),
        dom1(make_host_domain()), space(kIndexBytes, kPoolBytes - kIndexBytes) {
    IndexFormatOptions fo;
    fo.stripe_slots = 64;
    fo.max_stripes = 4;
    fo.interleave_stripe = 4096;
    fo.ndevices = 2;
    fo.weights[0] = 1;
    fo.weights[1] = 3;  // uneven: device 1 takes 3 of every 4 stripes
    EXPECT_TRUE(index_format(sim.node(0), pool0.mem, kIndexBytes, fo).ok());
    live.set_incarnation(0, 100);
    KvDeps d;
    d.index_domain = &sim.node(0);
    d.index_carve = pool0.mem;
    d.index_bytes = kIndexBytes;
    d.node = 0;
    d.incarnation = 100;
    d.locks = &locks;
    d.liveness = &live;
    d.space = &space;
    d.devices.push_back(PoolDevice{&sim.node(0), pool0.mem, pool0.bytes});
    d.devices.push_back(PoolDevice{dom1.get(), pool1.mem, pool1.bytes});
    auto kv_r = KvStore::create(std::move(d));
    EXPECT_TRUE(kv_r.ok()) << (kv_r.ok() ? "" : kv_r.error().message());
    if (kv_r.ok()) kv = std::move(kv_r.value());
  }
  AlignedPool pool0, pool1;
  NonCoherentSim sim;
  std::unique_ptr<MemoryDomain> dom1;
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace space;
  std::unique_ptr<KvStore> kv;
};
}  // namespace

TEST(GpuTiers, InterleavedBlocksGoThroughTheirStripeMapByteForByte) {
  InterleavedStore t;
  ASSERT_TRUE(t.kv);
  g_gpu = AsyncGpu{};
  auto lib = CudaLibrary::from_table(&g_async_ops, "async-fake");
  auto gp0 = GpuPool::open(lib, t.pool0.mem, t.pool0.bytes);
  auto gp1 = GpuPool::open(lib, t.pool1.mem, t.pool1.bytes);
  ASSERT_TRUE(gp0.ok() && gp1.ok());
  Tensors src(5), dst(6);
  auto keys = chain(3, 5);
  std::vector<uint64_t> ids = {4, 0, 7, 2, 9}, into = {1, 3, 5, 6, 8};
  KvGpu g(*t.kv, {gp0.value().get(), gp1.value().get()});
  std::vector<int32_t> st(5);
  auto r = g.put_chain(nullptr, keys, src.layout, ids, nullptr, st);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(5u, r.value());
  for (auto& k : keys) {
    BlockLocation loc;
    ASSERT_NE(store_index(*t.kv).find_ready(k, &loc), CXLKV_INDEX_NO_SLOT);
    EXPECT_EQ(CXLKV_LOC_DEV_INTERLEAVED, loc.device);
  }
  EXPECT_EQ(1u, g_gpu.copies) << "all stripes of all blocks on both devices in one launch";
  // The CPU path reads exactly what the GPU wrote through the stripe map.
  std::vector<unsigned char> got(5 * src.layout.block_bytes());
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nch(5, 1);
  for (size_t i = 0; i < 5; i++) chunks.push_back(Chunk{got.data() + i * src.layout.block_bytes(), src.layout.block_bytes()});
  ASSERT_EQ(5u, t.kv->get_many(keys, chunks, nch, st).value());
  for (size_t i = 0; i < 5; i++) {
    auto want = src.block(ids[i]);
    EXPECT_EQ(0, std::memcmp(got.data() + i * want.size(), want.data(), want.size())) << "block " << i;
  }
  // Device 1 holds 3/4 of each block: a stripe map that put everything on
  // device 0 would leave device 1 empty.
  size_t nonzero = 0;
  for (size_t i = kIndexBytes; i < t.pool1.bytes; i++) nonzero += t.pool1.mem[i] != std::byte{0};
  EXPECT_GT(nonzero, 5 * src.layout.block_bytes() / 2);
  // ... and the GPU reads them back, whole and layer by layer.
  auto n = g.get_many(keys, dst.layout, into, nullptr, st);
  ASSERT_TRUE(n.ok()) << n.error().message();
  EXPECT_EQ(5u, n.value());
  for (size_t i = 0; i < 5; i++) EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "block " << i;
  Tensors dst2(7);
  auto load = g.load_layers(keys, dst2.layout, into, nullptr, 3, st);
  ASSERT_TRUE(load.ok());
  ASSERT_EQ(5u, load.value()->finish(st).value());
  for (size_t i = 0; i < 5; i++) EXPECT_EQ(src.block(ids[i]), dst2.block(into[i])) << "block " << i;
}

TEST(GpuTiers, AnInterleavedBlockWithoutEveryDevicesGpuPoolIsRefusedNotMisread) {
  InterleavedStore t;
  ASSERT_TRUE(t.kv);
  auto gp0 = GpuPool::open(CudaLibrary::cpu_reference(), t.pool0.mem, t.pool0.bytes);
  ASSERT_TRUE(gp0.ok());
  Tensors src(8);
  auto keys = chain(4, 2);
  std::vector<uint64_t> ids = {0, 1};
  KvGpu g(*t.kv, {gp0.value().get()});  // device 1 not opened for the GPU
  std::vector<int32_t> st(2);
  auto r = g.put_chain(nullptr, keys, src.layout, ids, nullptr, st);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(0u, r.value());
  EXPECT_EQ(-ENODEV, st[0]);
  EXPECT_EQ(-ECANCELED, st[1]);
  EXPECT_EQ(0u, t.kv->lookup(keys));
}
