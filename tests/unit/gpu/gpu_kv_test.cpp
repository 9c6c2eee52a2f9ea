// SPDX-License-Identifier: MIT
// KvGpu: the KV store's publish / fetch with GPU tensors, run on the CPU
// reference backend over a NonCoherentSim pool (each node its own simulated
// cache).  Checks that blocks published from "GPU" tensors are what other
// nodes read, that an index entry is written only after the DMA completed
// (rule 5), and that failures leave no reservation or pin behind.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/gpu.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/layout.hpp"
#include "gpu/reference_backend.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "support/kv_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::gpu;
using namespace cxlkv::test;

namespace {

constexpr uint64_t kPoolBytes = 16 << 20;
constexpr uint64_t kIndexBytes = 2 << 20;

struct SimPool {
  explicit SimPool(uint32_t nodes)
      : pool(kPoolBytes), sim(pool.mem, pool.bytes, NonCoherentSimOptions{nodes, 0.05, 11}),
        space(kIndexBytes, kPoolBytes - kIndexBytes) {
    IndexFormatOptions o;
    o.stripe_slots = 64;
    o.max_stripes = 8;
    auto r = index_format(sim.node(0), pool.mem, kIndexBytes, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    for (uint32_t n = 0; n < nodes; n++) live.set_incarnation(n, 100 + n);
  }
  std::unique_ptr<KvStore> store(uint32_t node) {
    KvDeps d;
    d.index_domain = &sim.node(node);
    d.index_carve = pool.mem;
    d.index_bytes = kIndexBytes;
    d.node = node;
    d.incarnation = 100 + node;
    d.locks = &locks;
    d.liveness = &live;
    d.space = &space;
    d.devices.push_back(PoolDevice{&sim.node(node), pool.mem, pool.bytes});
    auto kv = KvStore::create(std::move(d));
    EXPECT_TRUE(kv.ok()) << (kv.ok() ? "" : kv.error().message());
    return kv.ok() ? std::move(kv.value()) : nullptr;
  }
  AlignedPool pool;
  NonCoherentSim sim;
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace space;
};

// "GPU" tensors in host memory (the reference backend's device is the CPU):
// a small layer-first cache of 2 layers, 4-token blocks, 2 heads x 32 fp16.
struct Tensors {
  explicit Tensors(uint64_t seed, uint32_t blocks = 16) {
    layout.kind = LayoutKind::layer_first;
    layout.num_layers = 2;
    layout.num_kv_heads = 2;
    layout.head_size = 32;
    layout.block_tokens = 4;
    layout.elem_bytes = 2;
    layout.num_blocks = blocks;
    std::mt19937_64 r(seed);
    for (int t = 0; t < 4; t++) {
      mem.emplace_back(blocks * layout.chunk_bytes());
      for (auto& b : mem.back()) b = static_cast<unsigned char>(r());
      layout.tensors.push_back(reinterpret_cast<uintptr_t>(mem.back().data()));
    }
  }
  std::vector<unsigned char> block(uint64_t id) const {  // pool image of GPU block id
    std::vector<unsigned char> b;
    for (auto& m : mem) b.insert(b.end(), m.begin() + id * layout.chunk_bytes(), m.begin() + (id + 1) * layout.chunk_bytes());
    return b;
  }
  PagedLayout layout;
  std::vector<std::vector<unsigned char>> mem;
};

std::vector<BlockKey> chain(uint64_t id, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = id * 1000003 + i;
  return keys_from_ids(ids);
}

// ---- an asynchronous stand-in: copies run only when the stream is waited on.
struct AsyncFake {
  std::vector<std::vector<cxlkv_copy_desc>> pending;
  std::function<void()> before_dma_completes;
};
AsyncFake g_async;
int async_copy(const cxlkv_copy_desc* d, size_t n, void*) {
  g_async.pending.emplace_back(d, d + n);
  return 0;
}
int async_complete(void*) {
  if (g_async.before_dma_completes && !g_async.pending.empty()) g_async.before_dma_completes();
  for (auto& b : g_async.pending) reference_copy(b.data(), b.size());
  g_async.pending.clear();
  return 0;
}
cxlkv_cuda_ops async_ops() {
  cxlkv_cuda_ops o = reference_ops();
  o.copy = async_copy;
  o.event_wait = async_complete;
  o.event_sync = async_complete;
  o.stream_sync = async_complete;
  return o;
}
const cxlkv_cuda_ops g_async_ops = async_ops();

}  // namespace

TEST(GpuKv, BlocksPublishedFromGpuTensorsAreWhatAnotherNodeReads) {
  SimPool sp(2);
  auto w = sp.store(0), r = sp.store(1);
  auto gp = GpuPool::open(CudaLibrary::cpu_reference(), sp.pool.mem, sp.pool.bytes);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  Tensors src(1), dst(2);
  auto keys = chain(7, 4);
  std::vector<uint64_t> ids = {9, 3, 12, 0};

  KvGpu writer(*w, {gp.value().get()});
  auto rep = writer.publish(keys, nullptr, src.layout, ids, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(4u, rep->written);
  EXPECT_EQ(4u, r->lookup(keys));

  // Node 1 reads block 2 with the CPU path: the bytes the GPU gathered.
  auto pin = r->pin(keys[2]);
  ASSERT_TRUE(pin.ok());
  std::vector<unsigned char> got(src.layout.block_bytes());
  Chunk c{got.data(), got.size()};
  ASSERT_TRUE(r->fetch(pin.value(), {&c, 1}).ok());
  ASSERT_TRUE(r->unpin(pin.value()).ok());
  EXPECT_EQ(src.block(12), got);

  // ... and with the GPU path into its own tensors.
  KvGpu reader(*r, {gp.value().get()});
  std::vector<uint64_t> into = {1, 2, 5, 6};
  ASSERT_TRUE(reader.fetch(keys, dst.layout, into, nullptr).ok());
  for (size_t i = 0; i < keys.size(); i++) EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "block " << i;
}

TEST(GpuKv, RepublishingCachedBlocksWritesNothing) {
  SimPool sp(1);
  auto kv = sp.store(0);
  auto gp = GpuPool::open(CudaLibrary::cpu_reference(), sp.pool.mem, sp.pool.bytes);
  ASSERT_TRUE(gp.ok());
  Tensors t(3);
  auto keys = chain(8, 3);
  std::vector<uint64_t> ids = {0, 1, 2};
  KvGpu g(*kv, {gp.value().get()});
  ASSERT_TRUE(g.publish(keys, nullptr, t.layout, ids, nullptr).ok());
  auto again = g.publish(keys, nullptr, t.layout, ids, nullptr);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(0u, again->written);
  EXPECT_EQ(3u, again->already_cached);
}

TEST(GpuKv, AnIndexEntryIsWrittenOnlyAfterTheDmaCompleted) {
  SimPool sp(2);
  auto w = sp.store(0), r = sp.store(1);
  auto gp = GpuPool::open(CudaLibrary::from_table(&g_async_ops, "async-fake"), sp.pool.mem, sp.pool.bytes);
  ASSERT_TRUE(gp.ok());
  Tensors t(4);
  auto keys = chain(9, 4);
  std::vector<uint64_t> ids = {4, 5, 6, 7};
  size_t visible_before_dma = 99;
  g_async = AsyncFake{};
  g_async.before_dma_completes = [&] { visible_before_dma = r->lookup(keys); };
  KvGpu g(*w, {gp.value().get()});
  auto rep = g.publish(keys, nullptr, t.layout, ids, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(0u, visible_before_dma) << "a block became visible before its DMA completed (rule 5)";
  EXPECT_EQ(4u, r->lookup(keys));
  g_async = AsyncFake{};
}

TEST(GpuKv, FetchOfAMissingBlockFailsAndReleasesItsPins) {
  SimPool sp(1);
  auto kv = sp.store(0);
  auto gp = GpuPool::open(CudaLibrary::cpu_reference(), sp.pool.mem, sp.pool.bytes);
  ASSERT_TRUE(gp.ok());
  Tensors t(5), d(6);
  auto keys = chain(10, 2);
  std::vector<uint64_t> ids = {0, 1};
  KvGpu g(*kv, {gp.value().get()});
  ASSERT_TRUE(g.publish(std::span(keys).first(1), nullptr, t.layout, std::span(ids).first(1), nullptr).ok());
  auto before = d.block(1);
  auto f = g.fetch(keys, d.layout, ids, nullptr);  // keys[1] was never published
  ASSERT_FALSE(f.ok());
  EXPECT_NE(std::string::npos, f.error().message().find(to_hex(keys[1])));
  EXPECT_EQ(before, d.block(1)) << "a failed fetch wrote GPU memory";
  uint32_t slot = 0;
  ASSERT_EQ(static_cast<uint32_t>(CXLKV_ENTRY_READY), store_index(*kv).find_state(keys[0], &slot));
  EXPECT_EQ(0u, store_index(*kv).entry(slot).pin_mask) << "the pin of the block that was found was not released";
}

TEST(GpuKv, ABlockOnADeviceWithoutAGpuPoolIsRefusedAndNotLeftReserved) {
  SimPool sp(2);
  auto w = sp.store(0), other = sp.store(1);
  Tensors t(7);
  auto keys = chain(11, 2);
  std::vector<uint64_t> ids = {0, 1};
  KvGpu g(*w, {});
  auto rep = g.publish(keys, nullptr, t.layout, ids, nullptr);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(-ENODEV, rep.error().code());
  // Not stuck in WRITING: another node can reserve and write it.
  auto res = other->reserve(keys[0], nullptr, t.layout.block_bytes());
  ASSERT_TRUE(res.ok());
  EXPECT_TRUE(res->reserved());
  ASSERT_TRUE(other->abort(res.value()).ok());
}

TEST(GpuKv, EngineLayoutsMapToTheSameSlicesAsTheStoresChunkLists) {
  EngineLayout e = llama31_8b_layout(8);
  std::vector<std::vector<std::byte>> mem(64, std::vector<std::byte>(8 * e.chunk_bytes()));
  for (auto& m : mem) e.bases.push_back(m.data());
  PagedLayout p = PagedLayout::from_engine(e);
  ASSERT_TRUE(p.validate().ok()) << p.validate().error().message();
  EXPECT_EQ(e.block_bytes(), p.block_bytes());
  std::vector<uint32_t> ids = {5};
  auto chunks = chunks_for_blocks(e, ids);
  ASSERT_TRUE(chunks.ok());
  std::vector<DevicePiece> slices;
  block_slices(p, 5, slices);
  ASSERT_EQ(chunks->size(), slices.size());
  for (size_t i = 0; i < slices.size(); i++) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*chunks)[i].addr), slices[i].dev);
    EXPECT_EQ((*chunks)[i].len, slices[i].len);
  }
}
