// SPDX-License-Identifier: MIT
// CPU gather-write / scatter-read: a chunk list goes into one pool block and
// comes back byte for byte, on the host domain and across two simulated
// non-coherent nodes; bad lists are refused before anything is copied.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "transfer/cpu_copy.hpp"

namespace cxlkv {
namespace {

// A random chunk list: lengths 0..max_len at random offsets of one source arena.
struct ChunkList {
  ChunkList(std::mt19937& rng, size_t n, size_t max_len) {
    std::vector<size_t> lens(n);
    size_t total = 0;
    for (auto& l : lens) total += (l = rng() % (max_len + 1));
    arena.resize(total + 64 * n + 64);
    for (auto& b : arena) b = static_cast<unsigned char>(rng());
    size_t off = 0;
    for (size_t l : lens) {
      off += rng() % 64;  // arbitrary alignment of each chunk
      chunks.push_back({arena.data() + off, l});
      off += l;
    }
    bytes = total;
  }
  // The same shape over a zeroed arena (where scatter_read lands).
  ChunkList zeroed_like() const {
    ChunkList z = *this;
    std::fill(z.arena.begin(), z.arena.end(), 0);
    for (size_t i = 0; i < chunks.size(); i++)
      z.chunks[i].addr = z.arena.data() + (static_cast<unsigned char*>(chunks[i].addr) - arena.data());
    return z;
  }
  std::vector<unsigned char> concatenated() const {
    std::vector<unsigned char> v;
    for (auto& c : chunks)
      v.insert(v.end(), static_cast<unsigned char*>(c.addr), static_cast<unsigned char*>(c.addr) + c.len);
    return v;
  }
  std::vector<unsigned char> arena;
  std::vector<Chunk> chunks;
  size_t bytes = 0;
};

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : n((n + 63) / 64 * 64) {
    p = static_cast<unsigned char*>(std::aligned_alloc(64, this->n));
    std::memset(p, 0, this->n);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  size_t n;
  unsigned char* p;
};

TEST(GatherScatter, RandomChunkListsRoundTripByteExactOnTheHostDomain) {
  std::mt19937 rng(7);
  for (auto mode : {DomainMode::flush, DomainMode::coherent}) {
    auto d = make_host_domain({.mode = mode});
    for (int iter = 0; iter < 60; iter++) {
      ChunkList src(rng, 1 + rng() % 40, iter % 2 ? 300 : 9000);
      AlignedBuf block(src.bytes + 256);
      const size_t at = rng() % 64;  // block start need not be line aligned
      std::memset(block.p, 0xee, block.n);

      auto w = gather_write(*d, block.p + at, src.chunks);
      ChunkList back = src.zeroed_like();
      auto r = scatter_read(*d, block.p + at, back.chunks);

      ASSERT_TRUE(w.ok() && r.ok());
      EXPECT_EQ(*w, src.bytes);
      EXPECT_EQ(*r, src.bytes);
      const auto want = src.concatenated();
      ASSERT_EQ(std::memcmp(block.p + at, want.data(), want.size()), 0) << "iteration " << iter;
      EXPECT_EQ(block.p[at + src.bytes], 0xee) << "gather_write wrote past the block";
      if (at != 0) {
        EXPECT_EQ(block.p[at - 1], 0xee) << "gather_write wrote before the block";
      }
      ASSERT_EQ(back.concatenated(), want) << "iteration " << iter;
    }
  }
}

TEST(GatherScatter, BlockWrittenOnOneSimulatedNodeReadsBackOnAnother) {
  AlignedBuf pool(1 << 20);
  NonCoherentSim sim(pool.p, pool.n, {.nodes = 2, .evict_probability = 0.01, .seed = 5});
  std::mt19937 rng(9);
  for (int iter = 0; iter < 20; iter++) {
    ChunkList src(rng, 1 + rng() % 16, 4000);
    const size_t at = rng() % 4096;
    // The reader has stale copies of the block's lines from an earlier read.
    std::vector<unsigned char> scratch(src.bytes);
    if (src.bytes) sim.node(1).load(scratch.data(), pool.p + at, src.bytes);

    ASSERT_TRUE(gather_write(sim.node(0), pool.p + at, src.chunks).ok());
    ChunkList back = src.zeroed_like();
    ASSERT_TRUE(scatter_read(sim.node(1), pool.p + at, back.chunks).ok());

    ASSERT_EQ(back.concatenated(), src.concatenated()) << "iteration " << iter;
  }
}

TEST(GatherScatter, PlainLoadsWithoutInvalidateWouldHaveReadStaleBytes) {
  // Control for the test above: the simulated reader really holds stale lines.
  AlignedBuf pool(1 << 16);
  NonCoherentSim sim(pool.p, pool.n, {.nodes = 2});
  std::mt19937 rng(3);
  ChunkList src(rng, 8, 1000);
  std::vector<unsigned char> scratch(src.bytes);
  sim.node(1).load(scratch.data(), pool.p, src.bytes);
  ASSERT_TRUE(gather_write(sim.node(0), pool.p, src.chunks).ok());
  sim.node(1).load(scratch.data(), pool.p, src.bytes);
  EXPECT_NE(scratch, src.concatenated());
}

// Counts the fences and invalidations a copy issues on the simulated node it
// wraps; `skip_invalidate` drops the block invalidation (a broken reader).
class CountingDomain final : public MemoryDomain {
 public:
  CountingDomain(MemoryDomain& d, bool skip_invalidate = false) : d_(d), skip_(skip_invalidate) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override { return "counting(" + d_.describe() + ")"; }
  void load(void* dst, const void* s, size_t n) override { d_.load(dst, s, n); }
  void store(void* p, const void* s, size_t n) override { d_.store(p, s, n); }
  void store_nt(void* p, const void* s, size_t n) override { d_.store_nt(p, s, n); }
  void flush(const void* p, size_t n) override { d_.flush(p, n); }
  void flush_bulk(const void* p, size_t n) override { d_.flush_bulk(p, n); }
  void invalidate(const void* p, size_t n) override {
    invalidations++;
    if (!skip_) d_.invalidate(p, n);
  }
  void invalidate_payload(const void* p, size_t n) override { invalidate(p, n); }
  void fence() override {
    fences++;
    d_.fence();
  }
  void copy_to_pool(void* p, const void* s, size_t n) override { d_.copy_to_pool(p, s, n); }
  void copy_from_pool(void* dst, const void* s, size_t n) override {
    invalidate(s, n);
    fence();
    load(dst, s, n);
  }
  void publish_line(void* p, const void* s) override { d_.publish_line(p, s); }
  int fences = 0, invalidations = 0;

 private:
  MemoryDomain& d_;
  bool skip_;
};

TEST(GatherScatter, ScatterReadInvalidatesTheWholeBlockWithOneFence) {
  AlignedBuf pool(1 << 20);
  NonCoherentSim sim(pool.p, pool.n, {.nodes = 2, .evict_probability = 0.01, .seed = 11});
  std::mt19937 rng(4);
  ChunkList src(rng, 32, 8000);
  std::vector<unsigned char> scratch(src.bytes);
  sim.node(1).load(scratch.data(), pool.p, src.bytes);  // stale lines on the reader
  ASSERT_TRUE(gather_write(sim.node(0), pool.p, src.chunks).ok());
  CountingDomain reader(sim.node(1));
  ChunkList back = src.zeroed_like();
  ASSERT_TRUE(scatter_read(reader, pool.p, back.chunks).ok());
  EXPECT_EQ(back.concatenated(), src.concatenated());
  EXPECT_EQ(reader.fences, 1) << "one fence per block, not one per chunk (32 chunks)";
  EXPECT_EQ(reader.invalidations, 1);
}

TEST(GatherScatter, ScatterReadWithoutItsInvalidationIsCaughtBySim) {
  // The same read with the block invalidation removed returns stale bytes.
  AlignedBuf pool(1 << 20);
  NonCoherentSim sim(pool.p, pool.n, {.nodes = 2, .seed = 11});
  std::mt19937 rng(4);
  ChunkList src(rng, 32, 8000);
  std::vector<unsigned char> scratch(src.bytes);
  sim.node(1).load(scratch.data(), pool.p, src.bytes);
  ASSERT_TRUE(gather_write(sim.node(0), pool.p, src.chunks).ok());
  CountingDomain broken(sim.node(1), /*skip_invalidate=*/true);
  ChunkList back = src.zeroed_like();
  ASSERT_TRUE(scatter_read(broken, pool.p, back.chunks).ok());
  EXPECT_NE(back.concatenated(), src.concatenated());
}

TEST(GatherScatter, EmptyListMovesNothing) {
  auto d = make_host_domain();
  auto w = gather_write(*d, nullptr, {});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 0u);
}

TEST(GatherScatter, NullChunkWithBytesIsRefusedAndNothingIsCopied) {
  auto d = make_host_domain();
  unsigned char a[100], block[256];
  std::memset(a, 1, sizeof a);
  std::memset(block, 0, sizeof block);
  const Chunk chunks[] = {{a, sizeof a}, {nullptr, 10}};

  auto w = gather_write(*d, block, chunks);
  auto r = scatter_read(*d, block, chunks);

  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code(), -EINVAL);
  EXPECT_NE(w.error().message().find("chunk 1"), std::string::npos) << w.error().message();
  EXPECT_EQ(block[0], 0) << "a rejected list must not be partly copied";
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EINVAL);
}

TEST(GatherScatter, NullChunkWithZeroLengthIsAllowed) {
  auto d = make_host_domain();
  unsigned char a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, block[64] = {};
  const Chunk chunks[] = {{nullptr, 0}, {a, sizeof a}};
  auto w = gather_write(*d, block, chunks);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 10u);
  EXPECT_EQ(std::memcmp(block, a, 10), 0);
}

TEST(GatherScatter, OverflowingLengthsAreRefused) {
  auto d = make_host_domain();
  unsigned char a[1], block[64];
  const Chunk chunks[] = {{a, SIZE_MAX - 5}, {a, 10}};
  auto w = gather_write(*d, block, chunks);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code(), -EOVERFLOW);
}

TEST(GatherScatter, NullPoolBlockIsRefused) {
  auto d = make_host_domain();
  unsigned char a[8] = {};
  const Chunk chunks[] = {{a, sizeof a}};
  auto r = scatter_read(*d, nullptr, chunks);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EINVAL);
}

}  // namespace
}  // namespace cxlkv
