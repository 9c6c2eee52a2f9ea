// SPDX-License-Identifier: MIT
// Allocator and object store under NonCoherentSim: 4 simulated nodes with
// random evictions allocate, free locally and remotely, and publish roots.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "carve/alloc_layout.hpp"
#include "cxlkv/objstore.hpp"
#include "support/lock_test_pool.hpp"
#include "sync/node_local.hpp"

namespace cxlkv {
namespace {

using testpool::TestPool;

struct Harness {
  explicit Harness(const char* tag, uint32_t nodes, double evict, uint64_t pool_bytes = 64ull << 20)
      : p(tag, pool_bytes) {
    p.simulate(nodes + 1, evict, 9);
    for (uint32_t n = 0; n < nodes; n++) ctx.push_back(&p.attach(n));
    LockManagerOptions mo;
    mo.node = nodes;
    auto m = LockManager::create(*p.region, p.domain(nodes), mo);
    if (!m) throw std::runtime_error(m.error().message());
    mgr = std::move(m.value());
    mgr->start();
  }
  ~Harness() { mgr->stop(); }
  TestPool p;
  std::vector<NodeContext*> ctx;
  std::unique_ptr<LockManager> mgr;
};

TEST(AllocSim, FourNodesNeverGetOverlappingBlocksAndRemoteFreesComeBack) {
  Harness h("alloc-sim", 4, 0.02);
  std::mutex mu;
  std::map<uint64_t, uint64_t> live;  // offset -> usable end, across all nodes
  std::vector<std::vector<uint64_t>> handoff(4);  // blocks freed by the next node
  bool overlap = false;
  std::vector<std::thread> ts;
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto heap = NodeHeap::open(*h.ctx[n]);
      ASSERT_TRUE(heap.ok()) << heap.error().message();
      std::mt19937_64 rng(n);
      std::vector<uint64_t> mine;
      for (int i = 0; i < 300; i++) {
        uint64_t sz = 64u << (rng() % 7);  // 64 B .. 4 KiB
        auto off = heap.value()->alloc(sz);
        ASSERT_TRUE(off.ok()) << off.error().message();
        uint64_t end = off.value() + heap.value()->usable_size(off.value()).value();
        {
          std::lock_guard<std::mutex> g(mu);
          auto it = live.upper_bound(off.value());
          if (it != live.end() && it->first < end) overlap = true;
          if (it != live.begin() && std::prev(it)->second > off.value()) overlap = true;
          live[off.value()] = end;
        }
        mine.push_back(off.value());
        if (rng() % 3 == 0 && !mine.empty()) {
          uint64_t victim = mine[rng() % mine.size()];
          mine.erase(std::find(mine.begin(), mine.end(), victim));
          {
            std::lock_guard<std::mutex> g(mu);
            live.erase(victim);
          }
          // Every other free goes to a neighbour: a remote free there.
          if (i % 2) {
            std::lock_guard<std::mutex> g(mu);
            handoff[(n + 1) % 4].push_back(victim);
          } else {
            ASSERT_TRUE(heap.value()->free(victim).ok());
          }
        }
        std::vector<uint64_t> theirs;
        {
          std::lock_guard<std::mutex> g(mu);
          theirs.swap(handoff[n]);
        }
        for (uint64_t o : theirs) {
          auto r = heap.value()->free(o);
          ASSERT_TRUE(r.ok()) << r.error().message();
        }
      }
    });
  }
  for (auto& t : ts) t.join();

  EXPECT_FALSE(overlap);
}

TEST(AllocSim, ExhaustionIsACleanEnospc) {
  Harness h("alloc-enospc", 1, 0.0);
  auto heap = NodeHeap::open(*h.ctx[0]);
  ASSERT_TRUE(heap.ok());
  const auto& geo = heap.value()->chunks().geometry();

  Error last(0, "");
  for (uint64_t i = 0; i <= geo.nchunks; i++) {
    auto r = heap.value()->alloc(geo.chunk_size);
    if (!r) {
      last = r.error();
      break;
    }
  }

  EXPECT_EQ(last.code(), -ENOSPC) << last.message();
}

// A block larger than the whole kv carve can never be allocated, whatever is
// freed: -EFBIG, so that the index does not evict every block for it (it
// evicts on -ENOSPC) before failing.
TEST(AllocSim, ABlockLargerThanTheKvCarveIsEfbigNotEnospc) {
  Harness h("alloc-efbig", 1, 0.0);
  auto heap = NodeHeap::open(*h.ctx[0]);
  ASSERT_TRUE(heap.ok());
  uint64_t kv = h.p.region->carve(CXLKV_CARVE_KV).value().size;

  auto r = heap.value()->alloc(kv * 2);

  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EFBIG);
  EXPECT_NE(r.error().message().find("larger than the whole kv carve"), std::string::npos) << r.error().message();
}

TEST(AllocSizeClasses, MidSizeBlocksGetPowerOfTwoClassesUpToHalfAChunk) {
  constexpr uint64_t kChunk = 2ull << 20;

  const uint32_t c128 = size_class_for(128u << 10, kChunk);
  const uint32_t just_over_64k = size_class_for((64u << 10) + 1, kChunk);
  const uint32_t half = size_class_for(kChunk / 2, kChunk);

  EXPECT_EQ(size_class_bytes(c128), 128u << 10);
  EXPECT_EQ(size_class_bytes(just_over_64k), 128u << 10);  // worst case: under 2x
  EXPECT_EQ(size_class_bytes(half), 1u << 20);
  EXPECT_EQ(size_class_for(kChunk / 2 + 1, kChunk), kSizeClasses);  // whole chunks
  // A class never holds fewer than 2 blocks of a chunk, whatever the chunk size.
  EXPECT_EQ(size_class_for((32u << 10) + 1, 64u << 10), kSizeClasses);
  EXPECT_EQ(size_class_for(512u << 10, 8ull << 20), size_class_for(512u << 10, kChunk));
  EXPECT_EQ(size_class_for((1u << 20) + 1, 8ull << 20), kSizeClasses);  // above the largest class
  for (uint64_t b = 64; b <= kChunk / 2; b = b * 3 / 2 + 1) {
    uint64_t cb = size_class_bytes(size_class_for(b, kChunk));
    EXPECT_GE(cb, b);
    EXPECT_LE(cb, 2 * b) << b;
  }
}

TEST(AllocSim, KvBlocksOf128KiBShareChunksUntilACleanEnospcAndAllChunksComeBack) {
  Harness h("alloc-mid", 1, 0.0, 320ull << 20);
  auto heap = NodeHeap::open(*h.ctx[0]);
  ASSERT_TRUE(heap.ok()) << heap.error().message();
  NodeHeap& hp = *heap.value();
  const auto geo = hp.chunks().geometry();
  const uint64_t block = 128u << 10;
  const uint64_t ideal = geo.nchunks * geo.chunk_size / block;
  std::vector<uint64_t> blocks;
  Error last(0, "");
  for (;;) {
    auto off = hp.alloc(block);
    if (!off) {
      last = off.error();
      break;
    }
    blocks.push_back(off.value());
    ASSERT_LE(blocks.size(), ideal) << "more blocks than fit in the kv carve";
  }

  RecordProperty("blocks_128k", std::to_string(blocks.size()) + " of ideal " + std::to_string(ideal) + " in " +
                                     std::to_string(geo.nchunks) + " chunks");
  EXPECT_GE(blocks.size(), 1000u) << geo.nchunks << " chunks of " << geo.chunk_size;
  EXPECT_GE(blocks.size() * 2, ideal);  // capacity within 2x of ideal (here: exactly ideal)
  EXPECT_EQ(last.code(), -ENOSPC);
  EXPECT_NE(last.message().find("exhausted"), std::string::npos) << last.message();
  EXPECT_EQ(hp.usable_size(blocks.front()).value(), block);
  EXPECT_EQ(hp.chunks().free_chunks(), 0u);
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); i++) ASSERT_GE(blocks[i], blocks[i - 1] + block);

  for (uint64_t o : blocks) ASSERT_TRUE(hp.free(o).ok());

  // Exhaustion left no current chunk, so every chunk goes back to the global bitmap.
  EXPECT_EQ(hp.chunks().free_chunks(), geo.nchunks);
  EXPECT_EQ(hp.stats().chunks_owned, 0u);
  EXPECT_EQ(hp.stats().bytes_in_use, 0u);
  EXPECT_TRUE(hp.alloc(geo.chunk_size * geo.nchunks / 2).ok());  // a large run fits again
}

// Whether the page of node-local memory holding `p` is in memory (mincore).
bool resident(const void* p) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  unsigned char v = 0;
  void* at = reinterpret_cast<void*>(uintptr_t(p) / page * page);
  if (mincore(at, 1, &v) != 0) throw std::runtime_error("mincore failed");
  return v & 1;
}

// A chunk's free bitmap in node-local memory is first touched when one of
// its blocks is freed, not when the node takes the chunk (LocalChunk::
// bits_words): taking it inside a put would fault the page in.  The words a
// free brings into use, and those a returned chunk used, never hand a block
// out twice.
TEST(AllocSim, TakingAChunkTouchesNoneOfItsBitmapAndFreedBlocksComeBackOnceEach) {
  Harness h("alloc-bits", 1, 0.0);
  auto heap = NodeHeap::open(*h.ctx[0]);
  ASSERT_TRUE(heap.ok()) << heap.error().message();
  NodeHeap& hp = *heap.value();
  const auto geo = hp.chunks().geometry();
  const uint64_t block = 1024;  // 32 bitmap words a chunk of 2 MiB
  const uint64_t per_chunk = geo.chunk_size / block;
  ASSERT_GE(per_chunk, 256u);
  const auto layout = alloc::heap_local_layout(geo.nchunks, geo.chunk_size);
  const std::byte* heap_area = h.ctx[0]->local().heap;
  const uint64_t stride = reinterpret_cast<const alloc::HeapLocalHeader*>(heap_area)->bits_stride;  // the heap's own
  ASSERT_GT(stride, 0u);
  const std::byte* bits = heap_area + layout.bits_off;

  std::vector<uint64_t> got;
  for (uint64_t i = 0; i < per_chunk; i++) {
    auto o = hp.alloc(block);
    ASSERT_TRUE(o.ok()) << o.error().message();
    got.push_back(o.value());
  }
  const uint32_t c = static_cast<uint32_t>(hp.chunks().chunk_of(got.front()));
  ASSERT_EQ(hp.chunks().chunk_of(got.back()), c) << "one chunk's worth of blocks spans two chunks";
  EXPECT_FALSE(resident(bits + c * stride)) << "taking chunk " << c << " touched its free bitmap";

  // Free blocks in a high word first, then a low one: both come back, once.
  const uint64_t base = hp.chunks().chunk_off(c);
  const std::vector<uint64_t> freed = {base + (per_chunk - 3) * block, base + 5 * block, base + 70 * block};
  for (uint64_t o : freed) ASSERT_TRUE(hp.free(o).ok());
  EXPECT_TRUE(resident(bits + c * stride));
  EXPECT_EQ(hp.free(freed[0]).error().code(), -EINVAL);  // a double free is still seen
  std::vector<uint64_t> again;
  for (size_t i = 0; i < freed.size(); i++) {
    auto o = hp.alloc(block);
    ASSERT_TRUE(o.ok()) << o.error().message();
    again.push_back(o.value());
  }
  std::vector<uint64_t> want = freed;
  std::sort(want.begin(), want.end());
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, want) << "the chunk was full: its freed blocks, and only they, come back";

  // The next block comes from another chunk; then all of c's come back and
  // c returns (not current), its words in use cleared; taken again, every
  // block is handed out once.
  auto extra = hp.alloc(block);
  ASSERT_TRUE(extra.ok()) << extra.error().message();
  ASSERT_NE(hp.chunks().chunk_of(extra.value()), c);
  const uint64_t returns = hp.stats().chunk_returns;
  for (uint64_t o : got) ASSERT_TRUE(hp.free(o).ok());
  EXPECT_EQ(hp.stats().chunk_returns, returns + 1) << "chunk " << c << " did not go back";
  std::vector<uint64_t> all = {extra.value()};
  bool c_again = false;
  for (uint64_t i = 0; i < 3 * per_chunk; i++) {
    auto o = hp.alloc(block);
    ASSERT_TRUE(o.ok()) << o.error().message();
    all.push_back(o.value());
    c_again |= hp.chunks().chunk_of(o.value()) == c;
  }
  EXPECT_TRUE(c_again) << "chunk " << c << " was not taken again";
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a block handed out twice";
  for (uint64_t o : all) ASSERT_TRUE(hp.free(o).ok());
  EXPECT_EQ(hp.stats().bytes_in_use, 0u);
}

// An idle owner gives back what other nodes freed of its blocks: the
// drain (as the kv session's drainer thread runs it, drain_if_posted)
// returns every chunk whose blocks all came back -- the current one too --
// so another node can take them.
TEST(AllocSim, RemoteFreesDrainedByAnIdleOwnerReturnWholeChunksToOtherNodes) {
  Harness h("alloc-drain", 2, 0.02);
  auto h0 = NodeHeap::open(*h.ctx[0]);
  auto h1 = NodeHeap::open(*h.ctx[1]);
  ASSERT_TRUE(h0.ok() && h1.ok());
  const auto geo = h0.value()->chunks().geometry();
  const uint64_t block = geo.chunk_size / 2;
  std::vector<uint64_t> blocks;
  for (;;) {
    auto off = h0.value()->alloc(block);
    if (!off) {
      ASSERT_EQ(off.error().code(), -ENOSPC) << off.error().message();
      break;
    }
    blocks.push_back(off.value());
  }
  ASSERT_EQ(blocks.size(), geo.nchunks * 2);
  EXPECT_EQ(h1.value()->alloc(block).error().code(), -ENOSPC);
  // Node 1 frees (evicts) all but one block: remote frees into node 0's inbox.
  for (size_t i = 1; i < blocks.size(); i++) ASSERT_TRUE(h1.value()->free(blocks[i]).ok());
  EXPECT_EQ(h1.value()->remote_frees_posted(0), blocks.size() - 1);
  EXPECT_EQ(h1.value()->alloc(block).error().code(), -ENOSPC) << "the space is node 0's until it drains";
  auto d = h0.value()->drain_if_posted(std::chrono::seconds(10));
  ASSERT_TRUE(d.ok()) << d.error().message();
  EXPECT_EQ(d.value(), blocks.size() - 1);
  EXPECT_EQ(h1.value()->remote_frees_posted(0), 0u);
  // Every chunk but the one that still holds blocks[0] is free again.
  EXPECT_EQ(h0.value()->chunks().free_chunks(), geo.nchunks - 1);
  EXPECT_EQ(h0.value()->stats().chunks_owned, 1u);
  EXPECT_EQ(h0.value()->drain_if_posted(std::chrono::seconds(10)).value(), 0u) << "nothing posted: no work";
  std::vector<uint64_t> theirs;
  for (uint64_t i = 0; i < (geo.nchunks - 1) * 2; i++) {
    auto off = h1.value()->alloc(block);
    ASSERT_TRUE(off.ok()) << i << ": " << off.error().message();
    EXPECT_NE(h1.value()->chunks().chunk_of(off.value()), h1.value()->chunks().chunk_of(blocks[0]));
    theirs.push_back(off.value());
  }
  // The half-used chunk stays node 0's: its free half is node 0's to reuse.
  EXPECT_EQ(h1.value()->alloc(block).error().code(), -ENOSPC);
  auto again = h0.value()->alloc(block);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(h0.value()->chunks().chunk_of(again.value()), h0.value()->chunks().chunk_of(blocks[0]));
}

TEST(AllocSim, MixedSizesUpTo2MiBFromFourNodesNeverOverlap) {
  Harness h("alloc-mixed", 4, 0.02, 512ull << 20);
  std::mutex mu;
  std::map<uint64_t, uint64_t> live;  // offset -> usable end, across all nodes
  std::vector<std::vector<uint64_t>> handoff(4);
  std::atomic<bool> overlap{false};
  std::atomic<int> failures{0}, remote{0};
  std::vector<std::thread> ts;
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto heap = NodeHeap::open(*h.ctx[n]);
      ASSERT_TRUE(heap.ok()) << heap.error().message();
      NodeHeap& hp = *heap.value();
      std::mt19937_64 rng(100 + n);
      std::vector<uint64_t> mine;
      for (int i = 0; i < 250; i++) {
        const uint64_t top = 64u << (rng() % 16);  // 64 B .. 2 MiB, and sizes in between
        const uint64_t sz = (rng() % 2) ? top : top / 2 + 1 + rng() % (top / 2);
        auto off = hp.alloc(sz);
        if (!off) {
          failures++;
          ADD_FAILURE() << "node " << n << " alloc " << sz << ": " << off.error().message();
          return;
        }
        auto us = hp.usable_size(off.value());
        if (!us || us.value() < sz) failures++;
        const uint64_t end = off.value() + (us ? us.value() : sz);
        {
          std::lock_guard<std::mutex> g(mu);
          auto it = live.upper_bound(off.value());
          if (it != live.end() && it->first < end) overlap = true;
          if (it != live.begin() && std::prev(it)->second > off.value()) overlap = true;
          live[off.value()] = end;
        }
        mine.push_back(off.value());
        while (mine.size() > 12) {  // bounded working set: ~ 4 x 12 blocks live
          const size_t k = rng() % mine.size();
          const uint64_t victim = mine[k];
          mine.erase(mine.begin() + static_cast<long>(k));
          std::lock_guard<std::mutex> g(mu);
          live.erase(victim);
          if (rng() % 2) handoff[(n + 1) % 4].push_back(victim);  // freed remotely by the neighbour
          else if (!hp.free(victim).ok()) failures++;
        }
        std::vector<uint64_t> theirs;
        {
          std::lock_guard<std::mutex> g(mu);
          theirs.swap(handoff[n]);
        }
        for (uint64_t o : theirs) {
          auto r = hp.free(o);
          if (!r) ADD_FAILURE() << r.error().message(), failures++;
          remote++;
        }
      }
    });
  }
  for (auto& t : ts) t.join();

  EXPECT_FALSE(overlap.load());
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(remote.load(), 0);
}

TEST(ObjectStoreSim, RootsPutOnOneNodeAreSeenAndDestroyedFromOthers) {
  Harness h("objstore-sim", 4, 0.02);
  std::vector<std::thread> ts;
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto s = ObjectStore::open(*h.ctx[n]);
      ASSERT_TRUE(s.ok()) << s.error().message();
      for (int i = 0; i < 40; i++)
        ASSERT_TRUE(s.value().put("root-" + std::to_string(n) + "-" + std::to_string(i), 4096u * (n * 100 + i)).ok());
    });
  }
  for (auto& t : ts) t.join();
  ts.clear();
  std::atomic<int> wrong{0};
  for (uint32_t n = 0; n < 4; n++) {
    ts.emplace_back([&, n] {
      auto s = ObjectStore::open(*h.ctx[n]);
      uint32_t other = (n + 1) % 4;
      for (int i = 0; i < 40; i++) {
        auto v = s.value().get("root-" + std::to_string(other) + "-" + std::to_string(i));
        if (!v || v.value() != 4096u * (other * 100 + i)) wrong++;
      }
      for (int i = 0; i < 20; i++) (void)s.value().destroy("root-" + std::to_string(other) + "-" + std::to_string(i));
    });
  }
  for (auto& t : ts) t.join();
  auto s = ObjectStore::open(*h.ctx[0]);

  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s.value().get("root-2-5").error().code(), -ENOENT);
  EXPECT_EQ(s.value().get("root-2-25").value(), 4096u * (200 + 25));
  EXPECT_EQ(s.value().put(std::string(41, 'x'), 1).error().code(), -ENAMETOOLONG);
}

}  // namespace
}  // namespace cxlkv
