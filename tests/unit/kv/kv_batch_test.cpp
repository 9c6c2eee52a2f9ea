// SPDX-License-Identifier: MIT
// KvStore batch calls: handle checks (fencing; docs/integrity.md "Fencing: handles carry the entry version") of a whole batch
// with one fresh read per block in one invalidation sweep, before and after
// the copy, per block; the single-block calls as wrappers with the same
// outcomes.  Every node runs on its own NonCoherentSim domain.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "index/index_check.hpp"
#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

// Node n's domain with two test hooks: `skip_index_invalidate` drops the
// invalidation of index lines (a broken rule 4: the node keeps reading the
// lines it cached), `on_payload_write` runs once at the first payload write.
class HookedDomain final : public MemoryDomain {
 public:
  HookedDomain(MemoryDomain& d, const std::byte* index, size_t index_bytes)
      : d_(d), index_(index), index_bytes_(index_bytes) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override { return "test hooks over " + d_.describe(); }
  void load(void* a, const void* b, size_t n) override { d_.load(a, b, n); }
  void store(void* a, const void* b, size_t n) override { d_.store(a, b, n); }
  void store_nt(void* a, const void* b, size_t n) override {
    payload_write(a);
    d_.store_nt(a, b, n);
  }
  void flush(const void* p, size_t n) override { d_.flush(p, n); }
  void flush_bulk(const void* p, size_t n) override { d_.flush_bulk(p, n); }
  void invalidate(const void* p, size_t n) override {
    if (skip_index_invalidate && in_index(p)) return;
    if (on_payload_read && !in_index(p)) {  // a payload read invalidates first (rule 6)
      auto f = std::move(on_payload_read);
      on_payload_read = nullptr;
      f();
    }
    d_.invalidate(p, n);
  }
  void fence() override { d_.fence(); }
  void copy_to_pool(void* a, const void* b, size_t n) override {
    payload_write(a);
    d_.copy_to_pool(a, b, n);
  }
  void copy_from_pool(void* a, const void* b, size_t n) override { d_.copy_from_pool(a, b, n); }
  void publish_line(void* dst, const void* src) override { d_.publish_line(dst, src); }

  bool skip_index_invalidate = false;
  std::function<void()> on_payload_write;
  std::function<void()> on_payload_read;  // once, before the first payload read's invalidation

 private:
  bool in_index(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= index_ && b < index_ + index_bytes_;
  }
  void payload_write(const void* a) {
    if (!on_payload_write || in_index(a)) return;
    auto f = std::move(on_payload_write);
    on_payload_write = nullptr;
    f();
  }
  MemoryDomain& d_;
  const std::byte* index_;
  size_t index_bytes_;
};

std::unique_ptr<KvStore> hooked_store(SimPool& p, HookedDomain& h, uint32_t node) {
  return SimPool::make(p.deps(node, &h));
}

// The pool's stripe locks as a node sees them while another node keeps
// every grant: never cheap to take, so a get's lookups go without them
// (docs/coherence.md "Optimistic reads").  Counts the locks taken.
class OtherNodesLocks final : public StripeLocks {
 public:
  explicit OtherNodesLocks(StripeLocks& inner) : inner_(inner) {}
  Result<void> lock(uint32_t s) override {
    taken++;
    return inner_.lock(s);
  }
  void unlock(uint32_t s) override { inner_.unlock(s); }
  bool cheap(uint32_t) const override { return false; }
  int taken = 0;

 private:
  StripeLocks& inner_;
};

// Node 0's store reading through `h` while another node keeps every stripe.
std::unique_ptr<KvStore> optimistic_reader(SimPool& p, HookedDomain& h, OtherNodesLocks& locks) {
  KvDeps d = p.deps(0, &h);
  d.locks = &locks;
  return SimPool::make(d);
}

// n root blocks (one-block chains) and their payloads.
struct Blocks {
  explicit Blocks(size_t n, uint64_t tag) : bufs(n, std::vector<std::byte>(4096)), nchunks(n, 1), status(n, 99) {
    for (size_t i = 0; i < n; i++) {
      keys.push_back(chain(tag + i, 1)[0]);
      fill_block(keys[i], bufs[i].data(), 4096);
      chunks.push_back(Chunk{bufs[i].data(), 4096});
    }
  }
  void clear() {
    for (auto& b : bufs) std::fill(b.begin(), b.end(), std::byte{0});
  }
  bool holds(size_t i) const {
    std::vector<std::byte> want(4096);
    fill_block(keys[i], want.data(), 4096);
    return bufs[i] == want;
  }
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks;
  std::vector<int32_t> status;
};

void put_each(KvStore& kv, Blocks& b) {
  for (size_t i = 0; i < b.keys.size(); i++) {
    auto n = kv.put_chain(nullptr, std::span(b.keys).subspan(i, 1), 4096, std::span(b.chunks).subspan(i, 1),
                          std::span(b.nchunks).subspan(i, 1), std::span(b.status).subspan(i, 1));
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(n.value(), 1u) << kv.last_block_error();
  }
}

// The reader loses its pins (judged dead while paused: another node drops
// a dead node's pin bits) and comes back unaware, still holding the
// handles.
void lose_pins(SimPool& p, KvStore& other, uint32_t node) {
  p.live.kill(node);
  ASSERT_TRUE(other.reclaim_dead().ok());
  p.live.set_incarnation(node, 100 + node);  // back, unaware
}

}  // namespace

// Another node removes half of the blocks a reader pinned (the reader had
// lost those pins): fetch_many reads the other half byte for byte and
// refuses the stale pins per block (-ESTALE), never returning their bytes.
TEST(KvBatch, FetchManyRefusesStalePinsPerBlockAndReadsTheRest) {
  SimPool p(2, 0.02);
  auto a = p.store(0), b = p.store(1);
  Blocks blk(8, 300);
  put_each(*b, blk);
  std::vector<KvPin> pins(8);
  ASSERT_EQ(a->pin_many(blk.keys, pins, blk.status).value(), 8u);
  std::vector<int32_t> st(4, 99);
  lose_pins(p, *b, 0);
  for (size_t i = 0; i < 4; i++) ASSERT_TRUE(store_index(*b).remove(blk.keys[i]).ok()) << i;
  blk.clear();
  auto n = a->fetch_many(pins, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 4u);
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(blk.status[i], -ESTALE) << i;
    EXPECT_FALSE(blk.holds(i)) << "no bytes of a stale pin are returned: " << i;
  }
  for (size_t i = 4; i < 8; i++) {
    EXPECT_EQ(blk.status[i], 0) << i;
    EXPECT_TRUE(blk.holds(i)) << i;
  }
  EXPECT_NE(a->last_block_error().find("kv: fetch of block " + to_hex(blk.keys[0])), std::string::npos)
      << a->last_block_error();
  EXPECT_EQ(a->unpin_many(std::span(pins).subspan(4), st).value(), 4u);
}

// The same check with the invalidation of the entry lines removed: the
// reader trusts the lines it cached and takes the stale pins for valid.
TEST(KvBatch, SimulatorCatchesAHandleCheckWithoutInvalidation) {
  SimPool p(2, 0.0);
  HookedDomain h(p.sim.node(0), p.pool.mem, kIndexBytes);
  auto a = hooked_store(p, h, 0);
  auto b = p.store(1);
  Blocks blk(4, 400);
  put_each(*b, blk);
  std::vector<KvPin> pins(4);
  ASSERT_EQ(a->pin_many(blk.keys, pins, blk.status).value(), 4u);
  lose_pins(p, *b, 0);
  for (size_t i = 0; i < 4; i++) EXPECT_EQ(a->lookup(std::span(blk.keys).subspan(i, 1)), 1u);  // caches the lines
  for (auto& k : blk.keys) ASSERT_TRUE(store_index(*b).remove(k).ok());
  h.skip_index_invalidate = true;
  auto n = a->fetch_many(pins, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_GT(n.value(), 0u) << "without the invalidation a removed block's stale pin passes its check";
  h.skip_index_invalidate = false;
  n = a->fetch_many(pins, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 0u) << "with it every stale pin fails";
  for (int32_t s : blk.status) EXPECT_EQ(s, -ESTALE);
}

// A writer whose reservations are reclaimed while it copies (it was judged
// dead: paused past its liveness) learns it from write_many (-ESTALE per
// block, checked after the copy) and cannot publish; nothing is visible.
TEST(KvBatch, WriteManyFailsBlocksReclaimedUnderTheCopy) {
  SimPool p(2, 0.02);
  HookedDomain h(p.sim.node(0), p.pool.mem, kIndexBytes);
  auto a = hooked_store(p, h, 0);
  auto b = p.store(1);
  Blocks blk(4, 500);
  auto c = chain(501, 4);
  std::vector<KvReservation> rs(4);
  ASSERT_EQ(a->reserve_chain(nullptr, c, 4096, rs, blk.status).value(), 4u);
  h.on_payload_write = [&] {
    p.live.kill(0);
    auto r = b->reclaim_dead();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value(), 4u);
    p.live.set_incarnation(0, 100);  // back, unaware
  };
  auto n = a->write_many(rs, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 0u);
  for (int32_t s : blk.status) EXPECT_EQ(s, -ESTALE);
  EXPECT_NE(a->last_block_error().find("reclaimed during the write"), std::string::npos) << a->last_block_error();
  n = a->publish_many(rs, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 0u);
  for (int32_t s : blk.status) EXPECT_EQ(s, -ESTALE);
  EXPECT_EQ(b->lookup(c), 0u);
  EXPECT_EQ(p.space.double_frees, 0u);
}

// The handle checks of a batch cost one fence each way, not one per block:
// fetch_many of 16 pinned blocks fences twice for its checks and once per
// block for its payload invalidation (and at most once more if the node's
// statistics are due to be copied into the pool).
TEST(KvBatch, HandleChecksOfABatchShareOneFence) {
  SimPool p(1, 0.02);
  auto a = p.store(0);
  Blocks blk(16, 600);
  put_each(*a, blk);
  std::vector<KvPin> pins(16);
  ASSERT_EQ(a->pin_many(blk.keys, pins, blk.status).value(), 16u);
  const uint64_t f0 = p.sim.counters(0).fences;
  ASSERT_EQ(a->fetch_many(pins, blk.chunks, blk.nchunks, blk.status).value(), 16u);
  const uint64_t fences = p.sim.counters(0).fences - f0;
  EXPECT_LE(fences, 2u + 16u + 1u) << "pre-copy check + post-copy check + one per block's payload";
  for (size_t i = 0; i < 16; i++) EXPECT_TRUE(blk.holds(i)) << i;
  std::vector<int32_t> st(16);
  EXPECT_EQ(a->unpin_many(pins, st).value(), 16u);
}

// The single-block calls are the batch calls on one block: the same
// outcomes and the same per-block messages, as Result errors.
TEST(KvBatch, SingleBlockCallsReportWhatTheBatchCallsReport) {
  SimPool p(2, 0.02);
  auto a = p.store(0), b = p.store(1);
  auto c = chain(700, 2);
  auto r0 = a->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(r0.ok());
  EXPECT_TRUE(r0->reserved());
  auto busy = b->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->status, uint32_t(kKvBusy));
  auto w = b->write(*busy, {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code(), -EINVAL) << "not reserved by this call";
  auto r1 = a->reserve(c[1], &c[0], 4096);
  ASSERT_TRUE(r1.ok());
  std::vector<std::byte> buf(4096);
  Chunk ch{buf.data(), buf.size()};
  ASSERT_TRUE(a->write(*r1, {&ch, 1}).ok());
  auto pub = a->publish(*r1);
  ASSERT_FALSE(pub.ok());
  EXPECT_EQ(pub.error().code(), -EAGAIN) << "the parent is not published yet";
  ASSERT_TRUE(a->write(*r0, {&ch, 1}).ok());
  ASSERT_TRUE(a->publish(*r0).ok());
  ASSERT_TRUE(a->publish(*r1).ok());
  auto again = a->publish(*r1);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), -ESTALE);
  EXPECT_NE(again.error().message().find("no longer reserved"), std::string::npos) << again.error().message();
  auto exists = b->reserve(c[0], nullptr, 4096);
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->status, uint32_t(kKvExists));
  auto miss = b->pin(chain(701, 1)[0]);
  ASSERT_FALSE(miss.ok());
  EXPECT_EQ(miss.error().code(), -ENOENT);
  auto pin = b->pin(c[1]);
  ASSERT_TRUE(pin.ok());
  KvPin forged = *pin;
  forged.loc_off += 4096;
  auto f = b->fetch(forged, {&ch, 1});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), -EINVAL) << f.error().message();
  EXPECT_TRUE(b->fetch(*pin, {&ch, 1}).ok());
  EXPECT_TRUE(b->unpin(*pin).ok());
  auto twice = b->unpin(*pin);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code(), -EINVAL);
}

// A pin is dropped only through its own handle, checked field for field:
// an unpin of a handle with a forged location, version, key, slot or tag
// is refused (-EINVAL, naming the block) and the real pin stays -- the
// block stays pinned (another node cannot remove it) and the real handle
// still unpins once, and only once.
TEST(KvBatch, UnpinRefusesAForgedPinHandleAndKeepsTheRealPin) {
  SimPool p(2, 0.02);
  auto a = p.store(0), b = p.store(1);
  Blocks blk(2, 800);
  put_each(*b, blk);
  std::vector<KvPin> pins(2);
  ASSERT_EQ(a->pin_many(blk.keys, pins, blk.status).value(), 2u);
  const KvPin real = pins[0];
  std::vector<std::pair<const char*, std::function<void(KvPin&)>>> forgeries = {
      {"location + 1", [](KvPin& f) { f.loc_off += 1; }},
      {"location + 4096", [](KvPin& f) { f.loc_off += 4096; }},
      {"length", [](KvPin& f) { f.length -= 64; }},
      {"version + 1", [](KvPin& f) { f.version += 1; }},
      {"tag", [](KvPin& f) { f.tag += 1; }},
      {"no tag (a handle read from the index)", [](KvPin& f) { f.tag = 0; }},
      {"another pinned block's slot", [&](KvPin& f) { f.slot = pins[1].slot; }},
  };
  for (auto& [what, forge] : forgeries) {
    SCOPED_TRACE(what);
    KvPin f = real;
    forge(f);
    std::vector<int32_t> st(1, 99);
    auto n = a->unpin_many({&f, 1}, st);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n.value(), 0u);
    EXPECT_EQ(st[0], -EINVAL);
    EXPECT_NE(a->last_block_error().find("kv: unpin of block " + to_hex(real.key)), std::string::npos)
        << a->last_block_error();
    EXPECT_TRUE(store_index(*a).entry(real.slot).pin_mask & 1u) << "the forged unpin dropped the real pin";
    auto rm = store_index(*b).remove(real.key);
    ASSERT_FALSE(rm.ok()) << "a pinned block was removed";
    EXPECT_EQ(rm.error().code(), -EBUSY);
  }
  std::vector<int32_t> st(2, 99);
  EXPECT_EQ(a->unpin_many(pins, st).value(), 2u) << a->last_block_error();
  EXPECT_EQ(store_index(*a).entry(real.slot).pin_mask & 1u, 0u);
  EXPECT_EQ(a->unpin_many(pins, st).value(), 0u) << "a second unpin of the same handles went through";
  EXPECT_EQ(st[0], -EINVAL);
  EXPECT_EQ(st[1], -EINVAL);
  EXPECT_TRUE(store_index(*b).remove(real.key).ok());
}

// A pin handle is valid only until its own unpin: with two pins of one
// block, the unpinned handle fetches nothing (-ESTALE, the message says
// why) and cannot unpin again, while the other pin still reads the block;
// a handle built from the index entry, never pinned, is not a pin either.
TEST(KvBatch, APinHandleDiesWithItsUnpinAndAHandleReadFromTheIndexIsNoPin) {
  SimPool p(2, 0.02);
  auto a = p.store(0), b = p.store(1);
  Blocks blk(1, 900);
  put_each(*b, blk);
  std::vector<KvPin> first(1), second(1);
  ASSERT_EQ(a->pin_many(blk.keys, first, blk.status).value(), 1u);
  ASSERT_EQ(a->pin_many(blk.keys, second, blk.status).value(), 1u);
  EXPECT_NE(first[0].tag, second[0].tag);
  std::vector<int32_t> st(1, 99);
  ASSERT_EQ(a->unpin_many(first, st).value(), 1u);
  blk.clear();
  auto n = a->fetch_many(first, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 0u) << "a fetch through an unpinned handle went through";
  EXPECT_EQ(blk.status[0], -ESTALE);
  EXPECT_NE(a->last_block_error().find("released by its unpin"), std::string::npos) << a->last_block_error();
  EXPECT_FALSE(blk.holds(0)) << "bytes of an unpinned handle were returned";
  Chunk ch = blk.chunks[0];
  auto single = a->fetch(first[0], {&ch, 1});
  ASSERT_FALSE(single.ok());
  EXPECT_EQ(single.error().code(), -ESTALE) << single.error().message();
  auto again = a->unpin(first[0]);
  ASSERT_FALSE(again.ok()) << "an unpinned handle unpinned again (and dropped the other pin)";
  EXPECT_EQ(again.error().code(), -EINVAL);
  ASSERT_EQ(a->fetch_many(second, blk.chunks, blk.nchunks, blk.status).value(), 1u) << a->last_block_error();
  EXPECT_TRUE(blk.holds(0));

  // From the index alone: the entry's slot, key, location and version.
  const IndexEntryView e = store_index(*b).entry(second[0].slot);
  KvPin made;
  made.key = e.key;
  made.slot = second[0].slot;
  made.length = e.loc.length;
  made.loc_off = e.loc.offset;
  made.loc_dev = e.loc.device;
  made.loc_tier = e.loc.tier;
  made.version = e.version;
  blk.clear();
  n = b->fetch_many({&made, 1}, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 0u) << "a fetch without a pin went through";
  EXPECT_EQ(blk.status[0], -ESTALE);
  EXPECT_NE(b->last_block_error().find("never taken by this store"), std::string::npos) << b->last_block_error();
  EXPECT_FALSE(blk.holds(0));
  ASSERT_EQ(a->unpin_many(second, st).value(), 1u);
  EXPECT_EQ(store_index(*a).entry(second[0].slot).pin_mask & 1u, 0u);
}

namespace {

// One engine step of node `n` in round `r`: four chains, of which the
// second hangs below the first's last block (a request of the same step
// sharing its prefix) and the others are roots; keys of different nodes
// never coincide, their stripes do (8 stripes in the simulated index).
struct Step {
  Step(uint32_t n, uint32_t r) {
    const uint64_t base = 100000 + 1000 * n + 40 * r;
    auto a = chain(base, 5), b = chain(base + 1, 3), c = chain(base + 2, 4), d = chain(base + 3, 2);
    for (auto* ch : {&a, &b, &c, &d}) {
      keys.insert(keys.end(), ch->begin(), ch->end());
      lens.push_back(uint32_t(ch->size()));
    }
    parents = {BlockKey{}, a.back(), BlockKey{}, BlockKey{}};
    bufs.assign(keys.size(), std::vector<std::byte>(4096));
    for (size_t i = 0; i < keys.size(); i++) {
      fill_block(keys[i], bufs[i].data(), 4096);
      chunks.push_back(Chunk{bufs[i].data(), 4096});
    }
    nchunks.assign(keys.size(), 1);
    status.assign(keys.size(), 99);
  }
  Result<size_t> put(KvStore& kv) { return kv.put_chains(parents, lens, keys, 4096, chunks, nchunks, status); }
  std::vector<BlockKey> keys, parents;
  std::vector<uint32_t> lens;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks;
  std::vector<int32_t> status;
};

}  // namespace

// put_chains (its lock_ahead of every chain's stripes, then one put_chain
// per chain) from two nodes at once, each on its own non-coherent view:
// every block of both is published, then read byte for byte by the other
// node, a chain below a block of the same call included; the children
// counts and the LRU lists stay sound; a second put of the same steps
// finds every block cached (EXISTS) and changes nothing.
TEST(KvBatch, PutChainsOfTwoNodesAtOnceArePublishedAndReadByTheOther) {
  SimPool p(2, 0.02);
  constexpr uint32_t kRounds = 12;
  std::atomic<int> failures{0};
  std::vector<std::string> errors(2);
  auto writer = [&](uint32_t n) {
    auto kv = p.store(n);
    for (uint32_t r = 0; r < kRounds; r++) {
      Step s(n, r);
      auto got = s.put(*kv);
      if (!got || got.value() != s.keys.size()) {
        failures++;
        if (errors[n].empty())
          errors[n] = got ? std::to_string(got.value()) + " blocks: " + kv->last_block_error() : got.error().message();
        continue;
      }
      for (int32_t st : s.status)
        if (st != kBlockReserved) failures++;  // nothing of this node's keys existed before
    }
  };
  std::thread t0(writer, 0), t1(writer, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(failures.load(), 0) << "node 0: " << errors[0] << "; node 1: " << errors[1];

  auto a = p.store(0), b = p.store(1);
  for (uint32_t n = 0; n < 2; n++)
    for (uint32_t r = 0; r < kRounds; r++) {
      Step s(n, r);
      KvStore& other = n ? *a : *b;
      for (const BlockKey& k : s.keys) EXPECT_TRUE(fetch_ok(other, k)) << "node " << n << " round " << r;
      // The chain below the first chain's last block names it as parent;
      // the roots name none.
      uint32_t a_last = CXLKV_INDEX_NO_SLOT, b_first = CXLKV_INDEX_NO_SLOT, c_first = CXLKV_INDEX_NO_SLOT;
      (void)store_index(other).find_state(s.keys[4], &a_last);
      (void)store_index(other).find_state(s.keys[5], &b_first);
      (void)store_index(other).find_state(s.keys[8], &c_first);
      ASSERT_NE(b_first, CXLKV_INDEX_NO_SLOT);
      EXPECT_EQ(store_index(other).entry(b_first).parent_slot, a_last) << "node " << n << " round " << r;
      EXPECT_EQ(store_index(other).entry(c_first).parent_slot, CXLKV_INDEX_NO_SLOT);
      auto again = s.put(n ? *b : *a);
      ASSERT_TRUE(again.ok()) << again.error().message();
      EXPECT_EQ(again.value(), s.keys.size());
      for (int32_t st : s.status) EXPECT_EQ(st, kBlockExists);
    }
  auto counts = index_child_count_snapshot(p.sim.node(0), p.pool.mem, kIndexBytes, "test");
  ASSERT_TRUE(counts.ok()) << counts.error().message();
  EXPECT_TRUE(counts->empty()) << describe_child_count_mismatch(counts->front());
  std::string first;
  EXPECT_EQ(store_index(*a).audit_lists(&first), 0u) << first;
}

namespace {

// A node's payload domain whose flushes do nothing (a writer that skipped
// rule 3's write-back): what it stored stays in its cache.
class NoFlush final : public MemoryDomain {
 public:
  explicit NoFlush(MemoryDomain& d) : d_(d) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override { return "no flush over " + d_.describe(); }
  void load(void* a, const void* b, size_t n) override { d_.load(a, b, n); }
  void store(void* a, const void* b, size_t n) override { d_.store(a, b, n); }
  void store_nt(void* a, const void* b, size_t n) override { d_.store_nt(a, b, n); }
  void flush(const void*, size_t) override {}
  void flush_bulk(const void*, size_t) override {}
  void invalidate(const void* p, size_t n) override { d_.invalidate(p, n); }
  void fence() override { d_.fence(); }
  void copy_to_pool(void* a, const void* b, size_t n) override { d_.copy_to_pool(a, b, n); }
  void copy_from_pool(void* a, const void* b, size_t n) override { d_.copy_from_pool(a, b, n); }
  void publish_line(void* dst, const void* src) override { d_.publish_line(dst, src); }

 private:
  MemoryDomain& d_;
};

// Reserve a chain on `w`, write each payload in place with ordinary stores
// through `writer` (a transfer engine receiving into the pool mapping),
// flush_in_place, publish; then does node 1 read every block's bytes?
bool in_place_round_trip(SimPool& p, KvStore& w, MemoryDomain& writer, KvStore& reader, uint64_t tag) {
  auto c = chain(tag, 4);
  std::vector<KvReservation> rs(c.size());
  std::vector<int32_t> st(c.size(), 99);
  EXPECT_EQ(w.reserve_chain(nullptr, c, 4096, rs, st).value(), c.size());
  std::vector<std::byte> buf(4096);
  for (const KvReservation& r : rs) {
    std::byte* at = nullptr;
    EXPECT_EQ(w.reserved_extent(r, &at), 0);
    if (!at) return false;
    fill_block(r.key, buf.data(), buf.size());
    writer.store(at, buf.data(), buf.size());  // ordinary stores, as a socket read into the address does
  }
  EXPECT_EQ(w.flush_in_place(rs, st), c.size());
  EXPECT_EQ(w.publish_many(rs, st).value(), c.size()) << w.last_block_error();
  (void)p;
  bool all = true;
  for (const BlockKey& k : c) all = fetch_ok(reader, k) && all;
  return all;
}

}  // namespace

// Blocks written in place (docs/remote.md "Straight from the pool"): the
// payload a writer stored into a reserved block's address reaches another
// node once flush_in_place wrote it back (rule 3); with the flush removed,
// the other node reads what memory held before, so the test catches a
// missing write-back.  An extent is handed out only for a RESERVED memory
// block inside the kv carve.
TEST(KvBatch, BlocksWrittenInPlaceReachAnotherNodeOnlyThroughTheirFlush) {
  SimPool p(2);
  auto a = p.store(0), b = p.store(1);
  EXPECT_TRUE(in_place_round_trip(p, *a, p.sim.node(0), *b, 700));

  NoFlush broken(p.sim.node(0));
  auto nf = SimPool::make(p.deps(0, &p.sim.node(0), &broken));
  ASSERT_TRUE(nf);
  EXPECT_FALSE(in_place_round_trip(p, *nf, p.sim.node(0), *b, 701))
      << "node 1 read in-place bytes that were never written back";

  KvReservation r;
  r.status = uint32_t(kBlockExists);
  std::byte* at = nullptr;
  EXPECT_EQ(a->reserved_extent(r, &at), int32_t(kBlockExists));
  r.status = 0;
  r.loc_tier = CXLKV_TIER_MEM;
  r.loc_dev = 7;
  EXPECT_EQ(a->reserved_extent(r, &at), -ENODEV);
  r.loc_dev = 0;
  r.loc_off = kPoolBytes - 100;
  r.length = 4096;
  EXPECT_EQ(a->reserved_extent(r, &at), -EUCLEAN);
  r.loc_dev = CXLKV_LOC_DEV_INTERLEAVED;
  EXPECT_EQ(a->reserved_extent(r, &at), -EXDEV);
  EXPECT_EQ(at, nullptr);
}

// A get of blocks whose stripes another node keeps takes no stripe lock and
// no pin: it reads the blocks byte for byte and owes their recency, which
// settle_reads writes later under the locks without changing the entries'
// versions (docs/coherence.md "Optimistic reads").
TEST(KvBatch, AGetOfBlocksWhoseStripesAnotherNodeKeepsTakesNoLockAndNoPin) {
  SimPool p(2, 0.02);
  OtherNodesLocks locks(p.locks);
  KvDeps d = p.deps(0);
  d.locks = &locks;
  auto a = SimPool::make(d);
  auto b = p.store(1);
  Blocks blk(8, 500);
  put_each(*b, blk);
  PrefixIndex& ix = store_index(*a);
  std::vector<uint32_t> slots(8);
  std::vector<IndexEntryView> before(8), after(8);
  for (size_t i = 0; i < 8; i++) ASSERT_EQ(ix.find_state(blk.keys[i], &slots[i]), uint32_t(CXLKV_ENTRY_READY));
  ix.entries_fresh(slots, before);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // recency is kept in ms
  blk.clear();
  auto n = a->get_many(blk.keys, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 8u) << a->last_block_error();
  for (size_t i = 0; i < 8; i++) {
    EXPECT_EQ(blk.status[i], 0) << i;
    EXPECT_TRUE(blk.holds(i)) << i;
  }
  EXPECT_EQ(locks.taken, 0) << "a get of blocks whose stripes another node keeps asks for no stripe lock";
  EXPECT_EQ(ix.reads_owed(), 8u);
  ix.entries_fresh(slots, after);
  for (size_t i = 0; i < 8; i++) {
    EXPECT_EQ(after[i].pin_mask, 0u) << "no pin: " << i;
    EXPECT_EQ(after[i].lru_ms, before[i].lru_ms) << "the recency is owed, not written yet: " << i;
  }
  ix.settle_reads(0);
  EXPECT_GT(locks.taken, 0) << "the owed recency is written under the stripe locks";
  EXPECT_EQ(ix.reads_owed(), 0u);
  ix.entries_fresh(slots, after);
  for (size_t i = 0; i < 8; i++) {
    EXPECT_GT(after[i].lru_ms, before[i].lru_ms) << "the read's recency stamp: " << i;
    EXPECT_EQ(after[i].version, before[i].version) << "a stamp is not a change of the block: " << i;
  }
  // With the option off the same get pins under the locks, as before.
  KvDeps off = p.deps(0);
  off.locks = &locks;
  off.optimistic_reads = false;
  auto c = SimPool::make(off);
  const int taken = locks.taken;
  n = c->get_many(blk.keys, blk.chunks, blk.nchunks, blk.status);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 8u);
  EXPECT_GT(locks.taken, taken);
  EXPECT_EQ(store_index(*c).reads_owed(), 0u);
}

// Another node evicts a block that a reader found without a pin, and a new
// block takes its space, while the reader copies it: the reader's check
// after the copy sees the entry changed and reports a miss (no error, no
// bytes served).  Without the invalidation in that check (a broken rule 4)
// the reader trusts the entry line it cached at the lookup and serves the
// new block's bytes as the old block's: the simulator catches it.
TEST(KvBatch, AnOptimisticReadOfABlockEvictedAndReusedUnderItsCopyIsAMiss) {
  for (bool broken : {false, true}) {
    SCOPED_TRACE(broken ? "check after the copy without invalidation" : "rule 4 kept");
    SimPool p(2, 0.0);
    HookedDomain h(p.sim.node(0), p.pool.mem, kIndexBytes);
    OtherNodesLocks locks(p.locks);
    auto a = optimistic_reader(p, h, locks);
    auto b = p.store(1);
    Blocks blk(1, 600), other(1, 700);
    put_each(*b, blk);
    bool reused = false;
    h.on_payload_read = [&] {
      ASSERT_TRUE(store_index(*b).remove(blk.keys[0]).ok());
      put_each(*b, other);  // first fit: the evicted block's space
      reused = true;
      h.skip_index_invalidate = broken;
    };
    blk.clear();
    auto n = a->get_many(blk.keys, blk.chunks, blk.nchunks, blk.status);
    ASSERT_TRUE(n.ok());
    ASSERT_TRUE(reused);
    EXPECT_EQ(blk.bufs[0], other.bufs[0]) << "the copy read the new block's bytes (the race the check must see)";
    if (!broken) {
      EXPECT_EQ(n.value(), 0u);
      EXPECT_EQ(blk.status[0], kKvMiss) << "a block that changed under an optimistic read is a miss";
      EXPECT_EQ(a->last_block_error(), "") << "a race, not an error";
    } else {
      EXPECT_EQ(blk.status[0], 0) << "without the invalidation the stale line passes: wrong bytes served";
    }
  }
}

// The eviction side of the same protocol: the evictor fences its EVICTING
// line before the space goes back (rule 3).  An evictor whose entry writes
// stay in its cache (a broken rule 1/3) lets the reader's check read the old
// READY line from memory and serve the new block's bytes: caught.
TEST(KvBatch, AnEvictionWhoseEntryWriteNeverReachesMemoryServesWrongBytesToAnOptimisticRead) {
  for (bool broken : {false, true}) {
    SCOPED_TRACE(broken ? "evictor's entry writes stay in its cache" : "rule 1/3 kept");
    SimPool p(3, 0.0);
    HookedDomain h(p.sim.node(0), p.pool.mem, kIndexBytes);
    OtherNodesLocks locks(p.locks);
    auto a = optimistic_reader(p, h, locks);
    BrokenStores bs(p.sim.node(1), false, broken);
    auto b = SimPool::make(p.deps(1, &bs, &p.sim.node(1)));
    auto w = p.store(2);  // the writer that reuses the space, on a host of its own (sound stores)
    Blocks blk(1, 800), other(1, 900);
    put_each(*w, blk);
    h.on_payload_read = [&] {
      ASSERT_TRUE(store_index(*b).remove(blk.keys[0]).ok());
      put_each(*w, other);
    };
    blk.clear();
    auto n = a->get_many(blk.keys, blk.chunks, blk.nchunks, blk.status);
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(blk.bufs[0], other.bufs[0]) << "the space was reused under the copy";
    if (!broken) EXPECT_EQ(blk.status[0], kKvMiss);
    else EXPECT_EQ(blk.status[0], 0) << "the removal never reached memory: the old line passes, wrong bytes served";
  }
}
