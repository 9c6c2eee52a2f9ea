// SPDX-License-Identifier: MIT
// Layer-wise load and save on the GPU path (docs/gpu.md "Layer-wise transfers"), through a fake CUDA
// library that records every launch and event and runs the copies with the
// CPU reference: a load delivers layer groups in order, each followed by
// its own event (so layer 0 is usable while later layers still travel);
// waiting for a layer waits on that layer's event; a save gathers layer by
// layer and publishes only after the last layer's DMA completed (rule 5);
// bytes equal what the CPU path reads.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/gpu.hpp"
#include "cxlkv/kv.hpp"
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
      : pool(kPoolBytes), sim(pool.mem, pool.bytes, NonCoherentSimOptions{nodes, 0.05, 21}),
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

// "GPU" tensors in host memory: a layer-first (or block-first) cache of
// `layers` layers, 4-token blocks, 2 heads x 32 fp16 (512-byte chunks).
struct Tensors {
  Tensors(uint64_t seed, LayoutKind kind = LayoutKind::layer_first, uint32_t layers = 8, uint32_t blocks = 16) {
    layout.kind = kind;
    layout.num_layers = layers;
    layout.num_kv_heads = 2;
    layout.head_size = 32;
    layout.block_tokens = 4;
    layout.elem_bytes = 2;
    layout.num_blocks = blocks;
    std::mt19937_64 r(seed);
    const size_t nt = kind == LayoutKind::layer_first ? 2 * layers : 1;
    const uint64_t per = kind == LayoutKind::layer_first ? layout.chunk_bytes() : layout.block_bytes();
    for (size_t t = 0; t < nt; t++) {
      mem.emplace_back(blocks * per);
      for (auto& b : mem.back()) b = static_cast<unsigned char>(r());
      layout.tensors.push_back(reinterpret_cast<uintptr_t>(mem.back().data()));
    }
  }
  // Pool image of GPU block id (layer, K|V order).
  std::vector<unsigned char> block(uint64_t id) const {
    if (layout.kind == LayoutKind::block_first)
      return {mem[0].begin() + id * layout.block_bytes(), mem[0].begin() + (id + 1) * layout.block_bytes()};
    std::vector<unsigned char> b;
    for (auto& m : mem) b.insert(b.end(), m.begin() + id * layout.chunk_bytes(), m.begin() + (id + 1) * layout.chunk_bytes());
    return b;
  }
  // The layer a device address belongs to (-1: none of these tensors).
  int layer_of(uint64_t addr) const {
    for (size_t t = 0; t < mem.size(); t++) {
      const uint64_t b = layout.tensors[t];
      if (addr >= b && addr < b + mem[t].size()) {
        if (layout.kind == LayoutKind::layer_first) return static_cast<int>(t / 2);
        return static_cast<int>(((addr - b) % layout.block_bytes()) / (2 * layout.chunk_bytes()));
      }
    }
    return -1;
  }
  PagedLayout layout;
  std::vector<std::vector<unsigned char>> mem;
};

std::vector<BlockKey> chain(uint64_t id, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = id * 1000003 + i + 7;
  return keys_from_ids(ids);
}

// ---- a recording fake: every copy launch and event in order; copies run
// at once (reference) unless `defer` holds them until their event is
// waited for (an asynchronous GPU).
struct Op {
  enum Kind { copy, event, event_sync, stream_wait } kind;
  std::vector<cxlkv_copy_desc> descs;
  int event_id = -1;
  void* stream = nullptr;
};
struct Recorder {
  std::vector<Op> log;
  int next_event = 0;
  bool defer = false;
  // Deferred copies with the id of the first event recorded after them:
  // waiting on event k completes the copies enqueued before it, in order.
  std::vector<std::pair<int, std::vector<cxlkv_copy_desc>>> pending;
  std::function<void()> before_complete;
  std::vector<int> event_ids;  // storage the event handles point into
};
Recorder g_rec;
int rec_copy(const cxlkv_copy_desc* d, size_t n, void* s) {
  g_rec.log.push_back({Op::copy, {d, d + n}, -1, s});
  if (g_rec.defer) g_rec.pending.emplace_back(g_rec.next_event, std::vector<cxlkv_copy_desc>(d, d + n));
  else reference_copy(d, n);
  return 0;
}
void complete_pending(int up_to_event = 1 << 30) {
  if (g_rec.before_complete && !g_rec.pending.empty()) g_rec.before_complete();
  auto& p = g_rec.pending;
  size_t k = 0;
  for (; k < p.size() && p[k].first <= up_to_event; k++) reference_copy(p[k].second.data(), p[k].second.size());
  p.erase(p.begin(), p.begin() + static_cast<long>(k));
}
int rec_event_record(void* s, void** e) {
  static int ids[100000];
  const int id = g_rec.next_event++;
  ids[id] = id;
  *e = &ids[id];
  g_rec.log.push_back({Op::event, {}, id, s});
  return 0;
}
int rec_event_sync(void* e) {
  g_rec.log.push_back({Op::event_sync, {}, *static_cast<int*>(e), nullptr});
  complete_pending(*static_cast<int*>(e));
  return 0;
}
int rec_event_wait(void* e) { return rec_event_sync(e); }
int rec_stream_sync(void*) {
  complete_pending();
  return 0;
}
int rec_stream_wait_event(void* s, void* e) {
  g_rec.log.push_back({Op::stream_wait, {}, *static_cast<int*>(e), s});
  return 0;
}
int rec_event_query(void* e) {
  return !g_rec.pending.empty() && g_rec.pending.front().first <= *static_cast<int*>(e) ? -EAGAIN : 0;
}
cxlkv_cuda_ops recording_ops() {
  cxlkv_cuda_ops o = reference_ops();
  o.copy = rec_copy;
  o.event_record = rec_event_record;
  o.event_sync = rec_event_sync;
  o.event_wait = rec_event_wait;
  o.stream_sync = rec_stream_sync;
  o.stream_wait_event = rec_stream_wait_event;
  o.event_query = rec_event_query;
  return o;
}
const cxlkv_cuda_ops g_rec_ops = recording_ops();

struct Fixture {
  explicit Fixture(uint32_t nodes = 2) : sp(nodes) {
    g_rec = Recorder{};
    for (uint32_t n = 0; n < nodes; n++) stores.push_back(sp.store(n));
    auto g = GpuPool::open(CudaLibrary::from_table(&g_rec_ops, "recording-fake"), sp.pool.mem, sp.pool.bytes);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message());
    gp = std::move(g.value());
  }
  // Publish GPU blocks `ids` of `t` under `keys` with the whole-block path.
  void publish(const Tensors& t, const std::vector<BlockKey>& keys, const std::vector<uint64_t>& ids) {
    KvGpu w(*stores[0], {gp.get()});
    std::vector<int32_t> st(keys.size());
    auto r = w.put_chain(nullptr, keys, t.layout, ids, nullptr, st);
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_EQ(keys.size(), r.value());
  }
  SimPool sp;
  std::vector<std::unique_ptr<KvStore>> stores;
  std::unique_ptr<GpuPool> gp;
};

}  // namespace

TEST(GpuLayerwise, ALoadDeliversLayerGroupsInOrderEachFollowedByItsEvent) {
  Fixture f;
  Tensors src(1), dst(2);
  auto keys = chain(1, 5);
  std::vector<uint64_t> ids = {3, 9, 0, 12, 6}, into = {1, 2, 4, 5, 7};
  f.publish(src, keys, ids);
  g_rec.log.clear();

  KvGpu reader(*f.stores[1], {f.gp.get()});
  std::vector<int32_t> st(keys.size());
  void* stream = reinterpret_cast<void*>(0x5151);
  auto load = reader.load_layers(keys, dst.layout, into, stream, 2, st);  // 8 layers in groups of 2
  ASSERT_TRUE(load.ok()) << load.error().message();
  LayerLoad& l = *load.value();
  EXPECT_EQ(4u, l.groups());
  EXPECT_EQ(5u, l.blocks_loading());
  for (int32_t s : st) EXPECT_EQ(0, s);

  // The launches: group g's copies (layers 2g, 2g+1 of every block, nothing
  // else), then event g, on the caller's stream, in layer order.
  std::vector<Op> ops;
  for (auto& o : g_rec.log)
    if (o.kind == Op::copy || o.kind == Op::event) ops.push_back(o);
  ASSERT_EQ(8u, ops.size());
  for (size_t g = 0; g < 4; g++) {
    const Op& c = ops[2 * g];
    const Op& e = ops[2 * g + 1];
    ASSERT_EQ(Op::copy, c.kind) << "group " << g;
    ASSERT_EQ(Op::event, e.kind) << "group " << g;
    EXPECT_EQ(stream, c.stream);
    EXPECT_EQ(stream, e.stream);
    std::set<int> layers;
    uint64_t bytes = 0;
    for (auto& d : c.descs) layers.insert(dst.layer_of(d.dst)), bytes += d.len;
    EXPECT_EQ((std::set<int>{int(2 * g), int(2 * g + 1)}), layers) << "group " << g;
    EXPECT_EQ(5 * 2 * 2 * dst.layout.chunk_bytes(), bytes) << "group " << g;
    EXPECT_EQ(l.event(static_cast<uint32_t>(2 * g)), l.event(static_cast<uint32_t>(2 * g + 1)));
  }
  EXPECT_EQ(nullptr, l.event(8));

  // Waiting for layer 5 waits on group 2's event; a stream wait enqueues it.
  g_rec.log.clear();
  ASSERT_TRUE(l.wait_layer(5).ok());
  ASSERT_TRUE(l.stream_wait_layer(0, reinterpret_cast<void*>(0x7777)).ok());
  ASSERT_EQ(2u, g_rec.log.size());
  EXPECT_EQ(Op::event_sync, g_rec.log[0].kind);
  EXPECT_EQ(*static_cast<int*>(l.event(5)), g_rec.log[0].event_id);
  EXPECT_EQ(Op::stream_wait, g_rec.log[1].kind);
  EXPECT_EQ(*static_cast<int*>(l.event(0)), g_rec.log[1].event_id);
  EXPECT_EQ(reinterpret_cast<void*>(0x7777), g_rec.log[1].stream);
  EXPECT_FALSE(l.wait_layer(8).ok());

  std::vector<int32_t> fin(keys.size(), 99);
  auto n = l.finish(fin);
  ASSERT_TRUE(n.ok()) << n.error().message();
  EXPECT_EQ(5u, n.value());
  for (size_t i = 0; i < keys.size(); i++) {
    EXPECT_EQ(0, fin[i]);
    EXPECT_EQ(src.block(ids[i]), dst.block(into[i])) << "block " << i;
  }
  // The pins are gone: every block can be evicted again.
  for (auto& k : keys) {
    uint32_t slot = 0;
    ASSERT_EQ(static_cast<uint32_t>(CXLKV_ENTRY_READY), store_index(*f.stores[1]).find_state(k, &slot));
    EXPECT_EQ(0u, store_index(*f.stores[1]).entry(slot).pin_mask);
  }
}

TEST(GpuLayerwise, LayerZeroIsUsableBeforeLaterLayersArriveOnAnAsynchronousGpu) {
  Fixture f;
  Tensors src(3, LayoutKind::block_first), dst(4, LayoutKind::block_first);
  auto keys = chain(2, 3);
  std::vector<uint64_t> ids = {0, 1, 2}, into = {5, 6, 7};
  f.publish(src, keys, ids);
  g_rec.defer = true;  // copies complete only when an event is waited on
  g_rec.log.clear();
  KvGpu reader(*f.stores[1], {f.gp.get()});
  std::vector<int32_t> st(3);
  auto load = reader.load_layers(keys, dst.layout, into, nullptr, 1, st);
  ASSERT_TRUE(load.ok()) << load.error().message();
  EXPECT_EQ(8u, load.value()->groups());
  // Nothing has landed yet; layer 0 is not ready.
  EXPECT_FALSE(load.value()->layer_ready(0).value());
  EXPECT_NE(src.block(0), dst.block(5));
  // Layer 0 in place (its event waited for) while layers 1..7 still travel.
  ASSERT_TRUE(load.value()->wait_layer(0).ok());
  EXPECT_TRUE(load.value()->layer_ready(0).value());
  EXPECT_FALSE(load.value()->layer_ready(1).value());
  const uint64_t layer_bytes = 2 * dst.layout.chunk_bytes();
  for (size_t i = 0; i < 3; i++) {
    auto want = src.block(ids[i]), got = dst.block(into[i]);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), layer_bytes)) << "layer 0 of block " << i;
    EXPECT_NE(0, std::memcmp(want.data() + layer_bytes, got.data() + layer_bytes, layer_bytes))
        << "layer 1 of block " << i << " arrived with layer 0";
  }
  auto n = load.value()->finish(st);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(3u, n.value());
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(src.block(ids[i]), dst.block(into[i]));
}

TEST(GpuLayerwise, MissingBlocksAreReportedAndTheRestLoadLayerByLayer) {
  Fixture f;
  Tensors src(5), dst(6);
  auto keys = chain(3, 4);
  std::vector<uint64_t> ids = {0, 1};
  f.publish(src, std::vector<BlockKey>(keys.begin(), keys.begin() + 2), ids);
  KvGpu reader(*f.stores[1], {f.gp.get()});
  std::vector<int32_t> st(4);
  std::vector<uint64_t> into = {8, 9, 10, 11};
  auto before = dst.block(10);
  auto load = reader.load_layers(keys, dst.layout, into, nullptr, 3, st);
  ASSERT_TRUE(load.ok()) << load.error().message();
  EXPECT_EQ(0, st[0]);
  EXPECT_EQ(0, st[1]);
  EXPECT_EQ(kKvMiss, st[2]);
  EXPECT_EQ(kKvMiss, st[3]);
  EXPECT_EQ(3u, load.value()->groups());  // 8 layers in groups of 3: 3, 3, 2
  EXPECT_EQ(2u, load.value()->blocks_loading());
  auto n = load.value()->finish(st);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(2u, n.value());
  EXPECT_EQ(src.block(0), dst.block(8));
  EXPECT_EQ(src.block(1), dst.block(9));
  EXPECT_EQ(before, dst.block(10)) << "a missing block's GPU memory was written";
}

TEST(GpuLayerwise, ASavePublishesOnlyAfterTheLastLayersDmaCompleted) {
  Fixture f;
  Tensors src(7);
  auto keys = chain(4, 4);
  std::vector<uint64_t> ids = {2, 4, 6, 8};
  KvGpu writer(*f.stores[0], {f.gp.get()});
  std::vector<int32_t> st(4, 99);
  auto save = writer.save_layers(nullptr, keys, src.layout, ids, st);
  ASSERT_TRUE(save.ok()) << save.error().message();
  for (int32_t s : st) EXPECT_EQ(kKvReserved, s);
  EXPECT_EQ(4u, save.value()->blocks_reserved());

  g_rec.defer = true;  // an asynchronous GPU
  g_rec.log.clear();
  size_t visible_before_dma = 99;
  g_rec.before_complete = [&] { visible_before_dma = f.stores[1]->lookup(keys); };
  void* stream = reinterpret_cast<void*>(0x1234);
  for (uint32_t layer = 0; layer < 8; layer++) {
    ASSERT_TRUE(save.value()->save_layer(layer, stream).ok()) << "layer " << layer;
    EXPECT_EQ(0u, f.stores[1]->lookup(keys)) << "visible after layer " << layer;
  }
  EXPECT_EQ(-EALREADY, save.value()->save_layer(3, stream).error().code());
  // One gather per layer, of that layer only, each followed by its event.
  ASSERT_EQ(16u, g_rec.log.size());
  for (uint32_t layer = 0; layer < 8; layer++) {
    const Op& c = g_rec.log[2 * layer];
    ASSERT_EQ(Op::copy, c.kind);
    std::set<int> layers;
    for (auto& d : c.descs) layers.insert(src.layer_of(d.src));
    EXPECT_EQ(std::set<int>{int(layer)}, layers);
    EXPECT_EQ(Op::event, g_rec.log[2 * layer + 1].kind);
  }
  auto n = save.value()->finish(st);
  ASSERT_TRUE(n.ok()) << n.error().message();
  EXPECT_EQ(4u, n.value());
  EXPECT_EQ(0u, visible_before_dma) << "a block became visible before its last layer's DMA completed (rule 5)";
  EXPECT_EQ(4u, f.stores[1]->lookup(keys));
  // Another node reads the bytes with the CPU path.
  for (size_t i = 0; i < keys.size(); i++) {
    auto pin = f.stores[1]->pin(keys[i]);
    ASSERT_TRUE(pin.ok());
    std::vector<unsigned char> got(src.layout.block_bytes());
    Chunk c{got.data(), got.size()};
    ASSERT_TRUE(f.stores[1]->fetch(pin.value(), {&c, 1}).ok());
    ASSERT_TRUE(f.stores[1]->unpin(pin.value()).ok());
    EXPECT_EQ(src.block(ids[i]), got) << "block " << i;
  }
}

TEST(GpuLayerwise, ASaveWithMissingLayersPublishesNothingAndReleasesItsReservations) {
  Fixture f;
  Tensors src(8);
  auto keys = chain(5, 3);
  std::vector<uint64_t> ids = {0, 1, 2};
  KvGpu writer(*f.stores[0], {f.gp.get()});
  std::vector<int32_t> st(3);
  auto save = writer.save_layers(nullptr, keys, src.layout, ids, st);
  ASSERT_TRUE(save.ok());
  for (uint32_t layer = 0; layer < 7; layer++) ASSERT_TRUE(save.value()->save_layer(layer, nullptr).ok());
  auto n = save.value()->finish(st);
  ASSERT_TRUE(n.ok()) << n.error().message();
  EXPECT_EQ(0u, n.value());
  EXPECT_EQ(-ENODATA, st[0]);
  EXPECT_EQ(-ECANCELED, st[1]);
  EXPECT_EQ(0u, f.stores[1]->lookup(keys));
  // Not stuck in WRITING: another node reserves them at once.
  auto r = f.stores[1]->reserve(keys[0], nullptr, src.layout.block_bytes());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->reserved());
  ASSERT_TRUE(f.stores[1]->abort(r.value()).ok());
  // An abandoned save (destroyed unfinished) releases them too.
  {
    auto s2 = writer.save_layers(nullptr, keys, src.layout, ids, st);
    ASSERT_TRUE(s2.ok());
    ASSERT_TRUE(s2.value()->save_layer(0, nullptr).ok());
  }
  auto r2 = f.stores[1]->reserve(keys[0], nullptr, src.layout.block_bytes());
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->reserved()) << "an abandoned layer save left its block reserved";
  ASSERT_TRUE(f.stores[1]->abort(r2.value()).ok());
}

TEST(GpuLayerwise, SavingBlocksAlreadyCachedWritesOnlyTheNewOnes) {
  Fixture f;
  Tensors src(9);
  auto keys = chain(6, 4);
  std::vector<uint64_t> ids = {0, 1, 2, 3};
  f.publish(src, std::vector<BlockKey>(keys.begin(), keys.begin() + 2), {0, 1});
  KvGpu writer(*f.stores[0], {f.gp.get()});
  std::vector<int32_t> st(4);
  auto save = writer.save_layers(nullptr, keys, src.layout, ids, st);
  ASSERT_TRUE(save.ok());
  EXPECT_EQ(kKvExists, st[0]);
  EXPECT_EQ(kKvExists, st[1]);
  EXPECT_EQ(kKvReserved, st[2]);
  EXPECT_EQ(2u, save.value()->blocks_reserved());
  g_rec.log.clear();
  for (uint32_t layer = 0; layer < 8; layer++) ASSERT_TRUE(save.value()->save_layer(layer, nullptr).ok());
  uint64_t bytes = 0;
  for (auto& o : g_rec.log)
    for (auto& d : o.descs) bytes += d.len;
  EXPECT_EQ(2 * src.layout.block_bytes(), bytes) << "only the two reserved blocks are gathered";
  auto n = save.value()->finish(st);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(4u, n.value());
  EXPECT_EQ(4u, f.stores[1]->lookup(keys));
}
