// SPDX-License-Identifier: MIT
// The index's online repair (prefix_index.hpp "Children counts",
// index_repair.cpp) under NonCoherentSim: writers killed at any lock call
// while other nodes write, read and evict in a full pool, and a node
// repairing all along; and the simulator catching a repair whose count
// write skips the non-temporal publish.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "index/index_check.hpp"
#include "kv/store_index.hpp"
#include "support/index_sim_pool.hpp"

using namespace cxlkv;
using namespace cxlkv::test;

namespace {

constexpr size_t kBytes = 1024;

IndexFormatOptions opts(uint32_t stripes, uint32_t slots, uint64_t max_blocks) {
  IndexFormatOptions o;
  o.max_stripes = stripes;
  o.stripe_slots = slots;
  o.max_blocks = max_blocks;
  return o;
}


// One chain put through the batch calls: reserve, write, publish (retrying
// -EAGAIN below a parent another writer is still writing), abort the rest.
// Returns the blocks published; `bad` counts failures that are bugs.
size_t put_chain(KvStore& kv, const std::vector<BlockKey>& c, std::atomic<uint64_t>& bad) {
  size_t have = kv.lookup(c);
  if (have == c.size()) return 0;
  std::vector<Reservation> res(c.size() - have);
  std::vector<int32_t> st(c.size() - have);
  const BlockKey* parent = have ? &c[have - 1] : nullptr;
  auto r = store_index(kv).reserve_chain(parent, std::span(c).subspan(have), kBytes, res, st);
  if (!r) return 0;
  std::vector<uint32_t> slots;
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < res.size() && st[i] >= 0 && st[i] != kBlockBusy; i++) {
    if (st[i] != kBlockReserved) continue;
    std::vector<std::byte> buf(kBytes);
    fill_block(c[have + i], buf.data(), buf.size());
    KvReservation kr;
    kr.key = c[have + i];
    kr.slot = res[i].slot;
    kr.length = res[i].loc.length;
    kr.loc_off = res[i].loc.offset;
    kr.loc_dev = res[i].loc.device;
    kr.loc_tier = res[i].loc.tier;
    kr.version = res[i].version;
    Chunk ch{buf.data(), buf.size()};
    if (!kv.write(kr, {&ch, 1})) bad++;
    slots.push_back(res[i].slot);
    keys.push_back(c[have + i]);
  }
  size_t published = 0;
  std::vector<int32_t> ps(slots.size());
  for (int k = 0; k < 200 && !slots.empty(); k++) {
    auto pn = store_index(kv).publish_many(slots, keys, ps);
    if (!pn) break;
    published += pn.value();
    std::vector<uint32_t> s2;
    std::vector<BlockKey> k2;
    for (size_t i = 0; i < slots.size(); i++)
      if (ps[i] == -EAGAIN) s2.push_back(slots[i]), k2.push_back(keys[i]);
    slots.swap(s2);
    keys.swap(k2);
    std::this_thread::yield();
  }
  if (!slots.empty()) {
    std::vector<int32_t> as(slots.size());
    (void)store_index(kv).abort_many(slots, keys, as);
  }
  return published;
}

// Tombstones that still name their parent (pending drops).
uint64_t count_pending(PrefixIndex& ix) {
  uint64_t n = 0;
  const uint64_t slots = ix.usage().slots;
  for (uint32_t i = 0; i < slots; i++) {
    IndexEntryView v = ix.entry(i);
    if (v.state == CXLKV_ENTRY_TOMBSTONE && v.parent_slot < slots) n++;
  }
  return n;
}

// With every stripe lock held (no change in progress anywhere): a count
// below the entries naming its block (live or pending drops) -- which lets
// the block be evicted under a cached child -- and a READY block whose
// parent is not READY (prefix closure) are bugs; a count above them is what
// a killed holder leaves until the repair runs.
uint64_t undercounts(SimPool& p, const cxlkv_index_header& h, std::string* first) {
  for (uint32_t s = 0; s < h.nstripes; s++) (void)p.locks.lock(s);
  MemoryDomain& d = p.sim.node(3);
  auto* t = reinterpret_cast<const cxlkv_index_entry*>(p.pool.mem + h.entry_off);
  std::vector<cxlkv_index_entry> all(h.nslots);
  for (uint32_t i = 0; i < h.nslots; i++) all[i] = d.read_fresh(t + i);  // rule 4
  for (uint32_t s = h.nstripes; s-- > 0;) p.locks.unlock(s);
  auto live = [](uint32_t st) {
    return st == CXLKV_ENTRY_WRITING || st == CXLKV_ENTRY_READY || st == CXLKV_ENTRY_EVICTING;
  };
  std::vector<uint32_t> named(h.nslots, 0);
  for (uint32_t i = 0; i < h.nslots; i++)
    if ((live(all[i].state) || all[i].state == CXLKV_ENTRY_TOMBSTONE) && all[i].parent_slot < h.nslots)
      named[all[i].parent_slot]++;
  uint64_t bad = 0;
  for (uint32_t i = 0; i < h.nslots; i++) {
    const cxlkv_index_entry& e = all[i];
    std::string why;
    if (live(e.state) && e.children < named[i])
      why = "slot " + std::to_string(i) + ": count " + std::to_string(e.children) + " below its " +
            std::to_string(named[i]) + " children";
    else if (e.state == CXLKV_ENTRY_READY && e.parent_slot < h.nslots && all[e.parent_slot].state != CXLKV_ENTRY_READY)
      why = "slot " + std::to_string(i) + ": READY under parent slot " + std::to_string(e.parent_slot) + " in state " +
            std::to_string(all[e.parent_slot].state);
    if (why.empty()) continue;
    if (bad++ == 0 && first) *first = why;
  }
  return bad;
}

std::string describe(const std::vector<ChildCountMismatch>& ms) {
  std::string s;
  for (const auto& m : ms) s += describe_child_count_mismatch(m) + "; ";
  return s;
}

}  // namespace

// Four nodes on a full pool with random cache-line evictions: node 0's
// writers die at a random lock call of their puts and evictions (their
// node's next incarnation goes on), nodes 1 and 2 put chains, read and
// evict, node 3 runs the online repair all along.  What the dead writers
// leave (stale counts, pending drops, WRITING blocks) never makes a live
// node read wrong bytes; one more repair after the run leaves every count
// exact, no pending drop, no WRITING block, sound lists; every cached block
// reads back its own bytes; a fresh writer fills a chain into the full pool.
TEST(IndexRepair, OnlineRepairWhileNodesWorkLeavesNothingOfKilledWritersUnderNonCoherentSim) {
  SimPool p(4, 0.05, opts(8, 64, 48));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, hits{0}, published{0}, deaths{0}, repaired{0};
  std::vector<std::thread> th;
  for (uint32_t n = 1; n <= 2; n++) {
    th.emplace_back([&, n] {
      auto kv = p.store(n);
      std::mt19937_64 rng(n + 31);
      for (int it = 0; it < 400; it++) {
        auto c = chain(rng() % 24, 2 + rng() % 6);
        const size_t have = kv->lookup(c);
        for (size_t i = 0; i < have; i++) {
          auto pin = kv->pin(c[i]);
          if (!pin) break;
          std::vector<std::byte> got(kBytes), want(kBytes);
          Chunk ch{got.data(), got.size()};
          if (!kv->fetch(*pin, {&ch, 1})) bad++;
          fill_block(c[i], want.data(), want.size());
          if (got != want) bad++;
          hits++;
          if (!kv->unpin(*pin)) bad++;
        }
        published += put_chain(*kv, c, bad);
        if (rng() % 5 == 0) (void)store_index(*kv).evict_any();
      }
    });
  }
  th.emplace_back([&] {  // node 0: writers killed at random lock calls
    std::mt19937_64 rng(5);
    uint32_t inc = 1000;
    while (!stop.load()) {
      p.live.set_incarnation(0, ++inc);
      DyingLocks dying(p.locks);
      KvDeps d = p.deps(0, nullptr, nullptr, inc);
      d.locks = &dying;
      auto kv = SimPool::make(std::move(d));
      if (!kv) break;
      dying.die_at = 1 + static_cast<uint32_t>(rng() % 40);
      try {
        for (int it = 0; it < 20 && !stop.load(); it++) {
          (void)put_chain(*kv, chain(100 + rng() % 24, 2 + rng() % 6), bad);
          if (rng() % 3 == 0) (void)store_index(*kv).evict_any();
        }
      } catch (const Died&) {
        deaths++;
        dying.recover();
        p.sim.drop_all(0);  // its unfenced writes die with it
        p.live.kill(0);
      }
      kv.reset();
    }
  });
  std::atomic<uint64_t> under{0}, checks{0};
  std::string first_under;
  th.emplace_back([&] {  // node 3: the online repair, all along, and the invariants between its runs
    auto kv = p.store(3);
    while (!stop.load()) {
      auto r = store_index(*kv).repair_index();
      if (!r) bad++;
      else repaired += r->total();
      std::string why;
      const uint64_t u = undercounts(p, store_index(*kv).header(), &why);
      if (u && under.fetch_add(u) == 0) first_under = why;
      checks++;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  th[0].join();
  th[1].join();
  stop = true;
  for (size_t i = 2; i < th.size(); i++) th[i].join();
  p.live.kill(0);

  auto kv = p.store(3);
  auto last = store_index(*kv).repair_index();
  ASSERT_TRUE(last.ok()) << last.error().message();
  repaired += last->total();
  auto stale = index_child_count_snapshot(p.sim.node(3), p.pool.mem, kIndexBytes, "sim pool: index carve: ");
  ASSERT_TRUE(stale.ok()) << stale.error().message();
  IndexUsage u = store_index(*kv).usage();
  std::string why;
  const uint64_t list_problems = store_index(*kv).audit_lists(&why);
  uint64_t verified = 0, wrong = 0;
  for (uint32_t i = 0; i < u.slots; i++) {
    IndexEntryView v = store_index(*kv).entry(i);
    if (v.state != CXLKV_ENTRY_READY) continue;
    if (fetch_ok(*kv, v.key, kBytes)) verified++;
    else wrong++;
  }
  // A fresh writer fills a whole chain into the full pool.
  std::atomic<uint64_t> fresh_bad{0};
  const auto fresh = chain(999, 8);
  const size_t fresh_put = put_chain(*kv, fresh, fresh_bad);
  std::printf("killed writers %llu, repairs %llu, published %llu, read hits %llu, blocks verified %llu, wrong %llu, "
              "stale counts %zu, pending drops %llu, WRITING left %llu, invariant checks %llu, undercounts %llu\n",
              (unsigned long long)deaths.load(), (unsigned long long)repaired.load(),
              (unsigned long long)published.load(), (unsigned long long)hits.load(), (unsigned long long)verified,
              (unsigned long long)wrong, stale->size(), (unsigned long long)count_pending(store_index(*kv)),
              (unsigned long long)u.by_state[CXLKV_ENTRY_WRITING], (unsigned long long)checks.load(),
              (unsigned long long)under.load());
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(checks.load(), 5u);
  EXPECT_EQ(under.load(), 0u) << first_under;
  EXPECT_GE(deaths.load(), 10u) << "too few writers died to test anything";
  EXPECT_GT(repaired.load(), 0u) << "the dead writers left nothing to repair";
  EXPECT_GT(published.load(), 50u);
  EXPECT_EQ(describe(*stale), "");
  EXPECT_EQ(count_pending(store_index(*kv)), 0u);
  EXPECT_EQ(u.by_state[CXLKV_ENTRY_WRITING], 0u);
  EXPECT_EQ(u.by_state[CXLKV_ENTRY_EVICTING], 0u);
  EXPECT_EQ(list_problems, 0u) << why;
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(verified, 0u);
  EXPECT_EQ(fresh_put, fresh.size()) << kv->last_block_error();
  EXPECT_EQ(fresh_bad.load(), 0u);
  EXPECT_EQ(p.space.double_frees, 0u);
}

// A child removed under its own stripe's lock while its parent's stripe is
// not held leaves a pending drop; the remover killed before it settles it
// leaves the parent's count accounted for by the tombstone (kv check finds
// it sound), and the online repair settles it once: the parent keeps the
// count of its other child, and is a leaf again when that one goes.
TEST(IndexRepair, AKilledRemoversPendingDropIsSettledOnline) {
  SimPool p(3, 0.0, opts(8, 64, 0));
  auto b = p.store(1);
  // A parent and its child in different stripes.
  std::vector<BlockKey> c;
  for (uint64_t id = 1; c.empty(); id++) {
    auto k = chain(id, 2);
    if (store_index(*b).stripe_of(k[0]) != store_index(*b).stripe_of(k[1])) c = k;
  }
  for (size_t i = 0; i < 2; i++) ASSERT_TRUE(put(*b, c, i, kBytes).ok());
  // A second child of the parent, away from the first one's stripe: it
  // keeps the parent's true count at 1 once the first goes.
  std::vector<BlockKey> c2 = {c[0]};
  for (uint64_t id = 5000; c2.size() < 2; id++) {
    const BlockKey k = chain(id, 1)[0];
    if (store_index(*b).stripe_of(k) != store_index(*b).stripe_of(c[1])) c2.push_back(k);
  }
  ASSERT_TRUE(put(*b, c2, 1, kBytes).ok());
  uint32_t cs = 0, ps = 0;
  ASSERT_EQ(store_index(*b).find_state(c[1], &cs), CXLKV_ENTRY_READY);
  ASSERT_EQ(store_index(*b).find_state(c[0], &ps), CXLKV_ENTRY_READY);
  // Node 0 evicts the child and dies at its next lock call: drop_children's.
  DyingLocks dying(p.locks);
  KvDeps d = p.deps(0);
  d.locks = &dying;
  auto a = SimPool::make(std::move(d));
  ASSERT_TRUE(a);
  dying.die_at = 2;
  bool died = false;
  try {
    (void)store_index(*a).evict_one(store_index(*b).stripe_of(c[1]));
  } catch (const Died&) {
    died = true;
  }
  ASSERT_TRUE(died);
  dying.recover();
  p.sim.drop_all(0);
  p.live.kill(0);
  IndexEntryView child = store_index(*b).entry(cs), parent = store_index(*b).entry(ps);
  EXPECT_EQ(child.state, static_cast<uint32_t>(CXLKV_ENTRY_TOMBSTONE));
  EXPECT_EQ(child.parent_slot, ps) << "the removed child keeps naming its parent until the drop";
  EXPECT_EQ(parent.children, 2u);
  auto audit = index_child_count_snapshot(p.sim.node(2), p.pool.mem, kIndexBytes, "sim pool: index carve: ");
  ASSERT_TRUE(audit.ok());
  EXPECT_EQ(describe(*audit), "") << "a pending drop accounts for the count";
  // The slot is not reused while the drop is pending.
  auto rep = store_index(*p.store(2)).repair_index();
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(rep->drops_settled, 1u);
  EXPECT_EQ(rep->counts_fixed, 0u) << "the pending drop accounts for the count: the settle alone makes it right";
  EXPECT_EQ(store_index(*b).entry(cs).parent_slot, CXLKV_INDEX_NO_SLOT);
  EXPECT_EQ(store_index(*b).entry(ps).children, 1u) << "the pending drop counted once: the second child remains";
  std::string why;
  EXPECT_EQ(store_index(*b).audit_lists(&why), 0u) << why;
  audit = index_child_count_snapshot(p.sim.node(2), p.pool.mem, kIndexBytes, "sim pool: index carve: ");
  ASSERT_TRUE(audit.ok());
  EXPECT_EQ(describe(*audit), "");
  // The second child goes, then the parent, a leaf again.
  uint32_t c2s = 0;
  ASSERT_EQ(store_index(*b).find_state(c2[1], &c2s), CXLKV_ENTRY_READY);
  ASSERT_TRUE(store_index(*b).remove(c2[1]).ok());
  EXPECT_EQ(store_index(*b).entry(ps).children, 0u);
  ASSERT_TRUE(store_index(*b).remove(c[0]).ok()) << "the parent is a leaf again";
  EXPECT_EQ(store_index(*b).find_state(c[0]), static_cast<uint32_t>(CXLKV_ENTRY_EMPTY));
}

// A count raised by a holder killed inside its critical section (its
// child's entry never written) is set back by the online repair while the
// parent's writer node lives; another node sees the repaired count.  The
// same repair from a node whose entry publishes are plain stores (no NT
// store, no flush: a broken rule 1/3) leaves the other node reading the
// stale count: the simulator catches it.
namespace {

// Raises the children count of `key`'s READY entry as node `n`'s killed
// holder left it: the whole line with its check, NT, fenced.
void raise_count(SimPool& p, PrefixIndex& ix, const BlockKey& key, uint32_t n) {
  uint32_t slot = 0;
  ASSERT_EQ(ix.find_state(key, &slot), CXLKV_ENTRY_READY);
  MemoryDomain& d = p.sim.node(n);
  auto* e = reinterpret_cast<cxlkv_index_entry*>(p.pool.mem + ix.header().entry_off) + slot;
  cxlkv_index_entry v = d.read_fresh(e);
  v.children++;
  v.check = cxlkv_index_entry_check(&v);
  d.publish_line(e, &v);
  d.fence();
}
}  // namespace

TEST(IndexRepair, SimulatorCatchesARepairPublishedWithoutNonTemporalStores) {
  for (const bool broken : {false, true}) {
    SimPool p(3, 0.0, opts(4, 64, 0));
    auto b = p.store(1);
    auto c = chain(7, 2);
    for (size_t i = 0; i < 2; i++) ASSERT_TRUE(put(*b, c, i, kBytes).ok());
    ASSERT_NO_FATAL_FAILURE(raise_count(p, store_index(*b), c[0], 0));
    auto stale = index_child_count_snapshot(p.sim.node(2), p.pool.mem, kIndexBytes, "sim: ");
    ASSERT_TRUE(stale.ok());
    ASSERT_EQ(stale->size(), 1u) << "the raised count is seen";
    BrokenStores plain(p.sim.node(0), /*plain_nt=*/true, /*plain_publish=*/true);
    auto a = SimPool::make(p.deps(0, broken ? &plain : nullptr));
    ASSERT_TRUE(a);
    auto rep = store_index(*a).repair_index();
    ASSERT_TRUE(rep.ok()) << rep.error().message();
    EXPECT_EQ(rep->counts_fixed, 1u);
    auto after = index_child_count_snapshot(p.sim.node(2), p.pool.mem, kIndexBytes, "sim: ");
    ASSERT_TRUE(after.ok());
    if (broken) EXPECT_EQ(after->size(), 1u) << "node 2 still reads the stale count: caught";
    else EXPECT_EQ(describe(*after), "") << "node 2 reads the repaired count";
  }
}
