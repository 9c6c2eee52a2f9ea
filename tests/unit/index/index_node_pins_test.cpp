// SPDX-License-Identifier: MIT
// Pins of one node's processes (index/node_pins.hpp).  A pin is one bit per
// node in the pool entry; with node pins, that bit goes only when no index
// of the node pins the block, and the pins of a gone process (or of a store
// closed with pins left) are dropped by the node's live indexes.  The
// protocol runs under NonCoherentSim with random evictions; the table is
// checked on its own (records, gone processes, rebuilds, a full table).
// tests/multiproc/kv_node_pins_test.cpp does the same with real processes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "index/node_pins.hpp"
#include "kv/store_index.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

// A pin section as the node-local file has it: zeroed, its mutex set up.
struct Section {
  Section() {
    void* p = mmap(nullptr, kNodePinSectionBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    mem = static_cast<std::byte*>(p);
    sync::robust_mutex_init(&reinterpret_cast<NodePinSectionHead*>(mem)->mu);
  }
  ~Section() { munmap(mem, kNodePinSectionBytes); }
  std::unique_ptr<NodePins> open() {
    auto r = NodePins::open(mem, "test pin section");
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    return r.ok() ? std::move(r.value()) : nullptr;
  }
  std::byte* mem = nullptr;
};

// Node `node` of `pool` as one more index with node pins over `sec`.
std::unique_ptr<KvStore> store_with_pins(SimPool& pool, uint32_t node, Section& sec) {
  auto kv = pool.store(node);
  if (!kv) return kv;
  auto np = sec.open();
  EXPECT_TRUE(store_index(*kv).set_node_pins(std::move(np)).ok());
  return kv;
}

bool cached(KvStore& kv, const BlockKey& k) { return store_index(kv).find_ready(k) != CXLKV_INDEX_NO_SLOT; }

// Node 2 evicts whatever it can (bounded).
void evict_all(KvStore& kv) {
  for (int i = 0; i < 64; i++) {
    auto r = store_index(kv).evict_any();
    ASSERT_TRUE(r.ok()) << r.error().message();
    if (!r.value()) return;
  }
}

}  // namespace

TEST(IndexNodePinsSim, ABlockKeepsItsNodesPinUntilEveryIndexOfTheNodeUnpinsIt) {
  SimPool pool(3, /*evict_p=*/0.2);
  Section sec;
  auto a = store_with_pins(pool, 0, sec);  // two processes of node 0
  auto b = store_with_pins(pool, 0, sec);
  auto c = pool.store(2);                  // another node, under pressure
  ASSERT_TRUE(a && b && c);
  auto keys = chain(1, 3);
  for (size_t i = 0; i < keys.size(); i++) ASSERT_TRUE(put(*c, keys, i).ok());

  auto pa = a->pin(keys[2]);
  auto pb = b->pin(keys[2]);
  ASSERT_TRUE(pa.ok() && pb.ok());
  auto pb2 = b->pin(keys[2]);  // a repeat pin of B's: its own count (fast path)
  ASSERT_TRUE(pb2.ok());
  ASSERT_TRUE(a->unpin(*pa).ok());
  evict_all(*c);
  EXPECT_TRUE(cached(*c, keys[2])) << "node 2 evicted a block process B of node 0 still pins";
  std::vector<std::byte> got(4096), want(4096);
  Chunk ch{got.data(), got.size()};
  ASSERT_TRUE(b->fetch(*pb, {&ch, 1}).ok());
  fill_block(keys[2], want.data(), want.size());
  EXPECT_EQ(got, want);
  ASSERT_TRUE(b->unpin(*pb2).ok());
  evict_all(*c);
  EXPECT_TRUE(cached(*c, keys[2])) << "B still holds one pin";
  ASSERT_TRUE(b->unpin(*pb).ok());
  evict_all(*c);
  EXPECT_FALSE(cached(*c, keys[2])) << "no index of node 0 pins it any more";
  EXPECT_EQ(sec.open()->slots_pinned(), 0u);
}

TEST(IndexNodePinsSim, WithoutNodePinsTheFirstUnpinWouldDropTheNodesPin) {
  // What the table is for: two indexes of node 0 that count pins each on
  // its own (no node pins) lose the block under the second one's pin.
  SimPool pool(3, 0.2);
  auto a = pool.store(0);
  auto b = pool.store(0);
  auto c = pool.store(2);
  ASSERT_TRUE(a && b && c);
  auto keys = chain(2, 1);
  ASSERT_TRUE(put(*c, keys, 0).ok());
  auto pa = a->pin(keys[0]);
  auto pb = b->pin(keys[0]);
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_TRUE(a->unpin(*pa).ok());
  evict_all(*c);
  EXPECT_FALSE(cached(*c, keys[0]));
}

TEST(IndexNodePinsSim, AClosedStoresPinsAreDroppedByTheNodesOtherIndex) {
  SimPool pool(3, 0.2);
  Section sec;
  auto a = store_with_pins(pool, 0, sec);
  auto b = store_with_pins(pool, 0, sec);
  auto c = pool.store(2);
  ASSERT_TRUE(a && b && c);
  auto keys = chain(3, 2);
  for (size_t i = 0; i < keys.size(); i++) ASSERT_TRUE(put(*c, keys, i).ok());
  ASSERT_TRUE(a->pin(keys[1]).ok());  // A: block 1, never unpinned
  auto pb = b->pin(keys[1]);           // B: block 1 too
  ASSERT_TRUE(pb.ok());
  a.reset();  // closed with a pin left: its record is gone, not free
  ASSERT_TRUE(store_index(*b).reclaim_node_pins().ok());
  evict_all(*c);
  EXPECT_TRUE(cached(*c, keys[1])) << "B's own pin must survive A's reclaim";
  ASSERT_TRUE(b->unpin(*pb).ok());
  evict_all(*c);
  EXPECT_FALSE(cached(*c, keys[1]));
  EXPECT_EQ(sec.open()->records_in_use(), 2u) << "B's record and the probe's own; A's was freed";
}

TEST(IndexNodePinsTable, AGoneProcesssRecordIsFoundDroppedAndFreed) {
  Section sec;
  auto me = sec.open();
  ASSERT_TRUE(me);
  pid_t child = fork();
  if (child == 0) {
    auto r = NodePins::open(sec.mem, "child");
    if (!r) _exit(1);
    const uint32_t slots[] = {5, 7};
    uint8_t ok[2] = {};
    r.value()->add(slots, ok);
    _exit(ok[0] && ok[1] ? 0 : 2);  // dies holding its pins (no destructor runs)
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const uint32_t five = 5;
  uint8_t ok = 0;
  me->add({&five, 1}, &ok);
  ASSERT_EQ(ok, 1);
  EXPECT_TRUE(me->pinned_by_others(7)) << "the dead process still holds slot 7 until it is dropped";
  auto gone = me->gone();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].pid, uint32_t(child));
  std::vector<uint32_t> s = gone[0].slots;
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, (std::vector<uint32_t>{5, 7}));
  uint8_t node_free[2] = {9, 9};
  me->drop(gone[0], s, node_free);
  EXPECT_EQ(node_free[0], 0) << "slot 5 is still this index's";
  EXPECT_EQ(node_free[1], 1) << "slot 7 was only the dead process's";
  EXPECT_TRUE(me->forget(gone[0]));
  EXPECT_TRUE(me->gone().empty());
  EXPECT_EQ(me->records_in_use(), 1u);
  EXPECT_EQ(me->slots_pinned(), 1u);
}

TEST(IndexNodePinsTable, ManyPinsAndUnpinsKeepTheTableExactAndAFullTableRefuses) {
  Section sec;
  auto a = sec.open();
  auto b = sec.open();
  ASSERT_TRUE(a && b);
  // Waves of distinct slots pinned and unpinned: removed buckets are
  // reclaimed by rebuilds, and every answer stays exact.
  std::vector<uint8_t> ok(4096), fr(4096);
  uint32_t base = 0;
  for (int wave = 0; wave < 80; wave++, base += 4096) {
    std::vector<uint32_t> s(4096);
    for (uint32_t i = 0; i < 4096; i++) s[i] = base + i * 7;
    a->add(s, ok.data());
    ASSERT_TRUE(std::all_of(ok.begin(), ok.end(), [](uint8_t v) { return v == 1; }));
    b->add({s.data(), 16}, ok.data());
    EXPECT_TRUE(a->pinned_by_others(s[3]));
    EXPECT_FALSE(a->pinned_by_others(s[100]));
    a->remove(s, fr.data());
    for (uint32_t i = 0; i < 4096; i++) ASSERT_EQ(fr[i], i < 16 ? 0 : 1) << "wave " << wave << " slot " << i;
    b->remove({s.data(), 16}, fr.data());
    ASSERT_TRUE(std::all_of(fr.begin(), fr.begin() + 16, [](uint8_t v) { return v == 1; }));
    ASSERT_EQ(a->slots_pinned(), 0u);
  }
  // Full: kMaxSlots distinct slots, then one more is refused.
  std::vector<uint32_t> all(NodePins::kMaxSlots);
  for (uint32_t i = 0; i < all.size(); i++) all[i] = i * 3 + 1;
  std::vector<uint8_t> okall(all.size());
  a->add(all, okall.data());
  EXPECT_TRUE(std::all_of(okall.begin(), okall.end(), [](uint8_t v) { return v == 1; }));
  const uint32_t more = 2;
  uint8_t ok1 = 1;
  b->add({&more, 1}, &ok1);
  EXPECT_EQ(ok1, 0) << "a full table refuses a new slot";
  const uint32_t known = 4;  // already in the table: B may share it
  b->add({&known, 1}, &ok1);
  EXPECT_EQ(ok1, 1);
}

TEST(IndexNodePinsTable, AllRecordsTakenAGoneProcesssEmptyRecordIsReusedAPinningOneIsNot) {
  Section sec;
  std::vector<std::unique_ptr<NodePins>> mine;
  for (uint32_t r = 0; r + 2 < NodePins::kRecords; r++) mine.push_back(sec.open());
  // Two processes take the last two records and die: one pins a slot, one does not.
  for (int pins : {0, 1}) {
    pid_t child = fork();
    if (child == 0) {
      auto r = NodePins::open(sec.mem, "child");
      if (!r) _exit(1);
      if (pins) {
        const uint32_t slot = 42;
        uint8_t ok = 0;
        r.value()->add({&slot, 1}, &ok);
      }
      _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(child, &st, 0), child);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  auto again = NodePins::open(sec.mem, "test");  // the record that pins nothing
  ASSERT_TRUE(again.ok()) << again.error().message();
  auto full = NodePins::open(sec.mem, "test");  // the other pins slot 42 until reclaimed
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code(), -EUSERS);
  EXPECT_NE(full.error().message().find("pin records are in use"), std::string::npos) << full.error().message();
  // A live index reclaims it (drop + forget); then a record is free again.
  auto gone = again.value()->gone();
  ASSERT_EQ(gone.size(), 1u);
  uint8_t node_free = 0;
  again.value()->drop(gone[0], gone[0].slots, &node_free);
  EXPECT_EQ(node_free, 1);
  EXPECT_TRUE(again.value()->forget(gone[0]));
  EXPECT_TRUE(NodePins::open(sec.mem, "test").ok());
}
