// SPDX-License-Identifier: MIT
// The superblock protocol across hosts, under NonCoherentSim: one node
// changes carves (store, clflush every line, fence: rule 3), the others
// re-read (invalidate, fence, load: rule 4) and must see exactly the same
// table -- with random evictions.  Two tests remove the flush or the
// invalidate and show that the simulator then catches the protocol.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/region.hpp"
#include "pool/format.hpp"
#include "util/log.hpp"

using namespace cxlkv;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t kPool = 64 * MiB;

// A node's domain with one duty forgotten, to prove the tests can fail.
class Forgetful final : public MemoryDomain {
 public:
  Forgetful(MemoryDomain& d, bool skip_flush, bool skip_invalidate)
      : d_(d), skip_flush_(skip_flush), skip_invalidate_(skip_invalidate) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override { return "forgetful(" + d_.describe() + ")"; }
  void load(void* a, const void* b, size_t n) override { d_.load(a, b, n); }
  void store(void* a, const void* b, size_t n) override { d_.store(a, b, n); }
  void store_nt(void* a, const void* b, size_t n) override { d_.store_nt(a, b, n); }
  void flush(const void* p, size_t n) override {
    if (!skip_flush_) d_.flush(p, n);
  }
  void flush_bulk(const void* p, size_t n) override {
    if (!skip_flush_) d_.flush_bulk(p, n);
  }
  void invalidate(const void* p, size_t n) override {
    if (!skip_invalidate_) d_.invalidate(p, n);
  }
  void fence() override { d_.fence(); }
  void copy_to_pool(void* a, const void* b, size_t n) override { d_.copy_to_pool(a, b, n); }
  void copy_from_pool(void* a, const void* b, size_t n) override { d_.copy_from_pool(a, b, n); }
  void publish_line(void* a, const void* b) override { d_.publish_line(a, b); }

 private:
  MemoryDomain& d_;
  bool skip_flush_, skip_invalidate_;
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

class SharedPool : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.reset(std::aligned_alloc(4096, kPool));
    std::memset(mem_.get(), 0, kPool);
  }
  std::unique_ptr<NonCoherentSim> sim(uint32_t nodes, double evict) {
    return std::make_unique<NonCoherentSim>(mem_.get(), kPool, NonCoherentSimOptions{nodes, evict, 7});
  }
  std::unique_ptr<Region> format_on(MemoryDomain& d) {
    OpenOptions oo;
    oo.use_domain = &d;
    FormatOptions fo;
    auto r = Region::format_memory("shared", mem_.get(), kPool, fo, oo);
    EXPECT_TRUE(r.ok()) << r.error().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Region> open_on(MemoryDomain& d) {
    OpenOptions oo;
    oo.use_domain = &d;
    auto r = Region::open_memory("shared", mem_.get(), kPool, oo);
    EXPECT_TRUE(r.ok()) << r.error().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<void, AlignedFree> mem_;
};

bool same_table(const cxlkv_superblock& a, const cxlkv_superblock& b) {
  return a.ncarves == b.ncarves && a.generation == b.generation &&
         std::memcmp(a.carves, b.carves, sizeof a.carves) == 0;
}

}  // namespace

TEST_F(SharedPool, CarveChangesReachEveryNodeUnderRandomEvictions) {
  auto s = sim(3, 0.05);
  std::unique_ptr<Region> node[3];
  node[0] = format_on(s->node(0));
  node[1] = open_on(s->node(1));
  node[2] = open_on(s->node(2));
  ASSERT_TRUE(node[0] && node[1] && node[2]);
  std::mt19937_64 rng(99);
  for (int step = 0; step < 300; step++) {
    Region& writer = *node[rng() % 3];
    auto cs = writer.carves();
    if (!cs.empty() && rng() % 3 == 0)
      ASSERT_TRUE(writer.carve_remove(cs[rng() % cs.size()].name).ok());
    else
      (void)writer.carve_create("c" + std::to_string(step), (1 + rng() % 4) * 2 * MiB, MemType::wb);
    auto mine = writer.read_superblock();
    ASSERT_TRUE(mine.ok()) << mine.error().message();
    for (auto& other : node) {
      auto theirs = other->read_superblock();
      ASSERT_TRUE(theirs.ok()) << "step " << step << ": " << theirs.error().message();
      ASSERT_TRUE(same_table(mine.value(), theirs.value())) << "step " << step << ": a node sees an old carve table";
    }
  }
  EXPECT_GT(s->total().evictions, 0u);
}

TEST_F(SharedPool, StandardFormatInMemoryOpensFromAnotherNode) {
  auto s = sim(2, 0.02);
  OpenOptions oo;
  oo.use_domain = &s->node(0);
  PoolFormatOptions po;
  po.max_locks = CXLKV_MIN_LOCKS;
  auto f = format_pool_memory("std", mem_.get(), kPool, po, oo);
  ASSERT_TRUE(f.ok()) << f.error().message();
  oo.use_domain = &s->node(1);
  auto r = Region::open_memory("std", mem_.get(), kPool, oo);
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto ctl = r.value()->carve("control");
  ASSERT_TRUE(ctl.ok());
  auto h = s->node(1).read_fresh(r.value()->at<cxlkv_ctrl_header>(ctl->offset));
  EXPECT_EQ(h.magic, CXLKV_CTRL_MAGIC) << "node 1 must see the control header node 0 wrote";
  EXPECT_EQ(r.value()->carves().size(), 4u);
}

// ---- the simulator bites when the protocol is broken -------------------------

TEST_F(SharedPool, WithoutTheFlushAnotherNodeDoesNotSeeTheNewCarve) {
  log().set_level(spdlog::level::off);
  auto s = sim(2, 0.0);
  Forgetful no_flush(s->node(0), /*skip_flush=*/true, /*skip_invalidate=*/false);
  // Format with the real protocol, then change carves without the flush.
  { ASSERT_TRUE(format_on(s->node(0))); }
  s->writeback_all(0);
  auto writer = open_on(no_flush);
  auto reader = open_on(s->node(1));
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->carve_create("late", 2 * MiB, MemType::wb).ok());
  EXPECT_FALSE(reader->carve("late").ok()) << "the unflushed superblock reached memory anyway";
  log().set_level(spdlog::level::warn);
}

TEST_F(SharedPool, WithoutTheInvalidateAReaderKeepsAStaleTable) {
  log().set_level(spdlog::level::off);
  auto s = sim(2, 0.0);
  auto writer = format_on(s->node(0));
  Forgetful no_invalidate(s->node(1), /*skip_flush=*/false, /*skip_invalidate=*/true);
  auto reader = open_on(no_invalidate);  // caches the superblock lines
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->carve_create("late", 2 * MiB, MemType::wb).ok());
  EXPECT_FALSE(reader->carve("late").ok()) << "a stale cache line was refreshed without invalidation";
  log().set_level(spdlog::level::warn);
}
