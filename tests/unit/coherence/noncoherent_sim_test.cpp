// SPDX-License-Identifier: MIT
// NonCoherentSim must bite: each test below is a way real non-coherent pool
// memory breaks a careless protocol, and the simulator has to show it.
#include "coherence/noncoherent_sim.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cxlkv {
namespace {

// 64-byte aligned, zeroed pool memory.
struct Pool {
  explicit Pool(size_t bytes) : bytes(bytes) {
    mem = static_cast<char*>(std::aligned_alloc(64, bytes));
    std::memset(mem, 0, bytes);
  }
  ~Pool() { std::free(mem); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  size_t bytes;
  char* mem;
};

TEST(NonCoherentSim, PublishWithoutFlushLeavesAnotherNodeReadingStaleData) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  auto* value = reinterpret_cast<uint64_t*>(pool.mem);
  sim.node(0).write(value, uint64_t{42});  // plain store: dirty in node 0's cache
  sim.node(0).fence();

  EXPECT_EQ(sim.node(1).read_fresh(value), 0u);  // memory still has the old value
}

TEST(NonCoherentSim, FlushAndFenceMakeAPlainStoreVisible) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  auto* value = reinterpret_cast<uint64_t*>(pool.mem);
  sim.node(0).write(value, uint64_t{42});
  sim.node(0).flush(value, sizeof *value);
  sim.node(0).fence();

  EXPECT_EQ(sim.node(1).read_fresh(value), 42u);
}

TEST(NonCoherentSim, ReaderWithoutInvalidateKeepsSeeingItsStaleLine) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  auto* value = reinterpret_cast<uint64_t*>(pool.mem);
  EXPECT_EQ(sim.node(1).read(value), 0u);  // node 1 now caches the line
  sim.node(0).write_nt(value, uint64_t{7});
  sim.node(0).fence();

  EXPECT_EQ(sim.node(1).read(value), 0u);        // stale hit
  EXPECT_EQ(sim.node(1).read_fresh(value), 7u);  // rule 4 fixes it
  EXPECT_EQ(sim.counters(1).stale_loads, 1u);
}

TEST(NonCoherentSim, PlainStoresToDifferentBytesOfOneLineClobberEachOther) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  const char a = 'a', b = 'b';
  sim.node(0).store(pool.mem + 0, &a, 1);
  sim.node(1).store(pool.mem + 1, &b, 1);
  sim.node(0).flush(pool.mem, 64);
  sim.node(1).flush(pool.mem, 64);  // writes back its whole line, with byte 0 still 0

  EXPECT_EQ(pool.mem[0], 0) << "node 1's write-back should have clobbered node 0's byte";
  EXPECT_EQ(pool.mem[1], 'b');
}

TEST(NonCoherentSim, NtStoresToDifferentBytesOfOneLineBothSurvive) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  const char a = 'a', b = 'b';
  sim.node(0).store_nt(pool.mem + 0, &a, 1);
  sim.node(1).store_nt(pool.mem + 1, &b, 1);

  EXPECT_EQ(pool.mem[0], 'a');
  EXPECT_EQ(pool.mem[1], 'b');
}

TEST(NonCoherentSim, StoreNtWritesBackTheNodesOwnDirtyLineFirst) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 1});
  const char x = 'x', y = 'y';
  sim.node(0).store(pool.mem + 0, &x, 1);
  sim.node(0).store_nt(pool.mem + 1, &y, 1);

  EXPECT_EQ(pool.mem[0], 'x');
  EXPECT_EQ(pool.mem[1], 'y');
}

TEST(NonCoherentSim, DropAllLosesDirtyLinesAndWritebackAllKeepsThem) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2});
  sim.node(0).write(reinterpret_cast<uint64_t*>(pool.mem), uint64_t{1});
  sim.node(1).write(reinterpret_cast<uint64_t*>(pool.mem + 64), uint64_t{2});
  sim.drop_all(0);
  sim.writeback_all(1);

  EXPECT_EQ(*reinterpret_cast<uint64_t*>(pool.mem), 0u);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(pool.mem + 64), 2u);
  EXPECT_EQ(sim.counters(0).dropped, 1u);
}

TEST(NonCoherentSim, EvictionsWriteBackDirtyLinesAtRandomMoments) {
  Pool pool(64 * 1024);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 1, .evict_probability = 0.5, .seed = 3});
  const char v = 1;
  for (size_t off = 0; off < pool.bytes; off += 64) sim.node(0).store(pool.mem + off, &v, 1);
  size_t in_memory = 0;
  for (size_t off = 0; off < pool.bytes; off += 64) in_memory += pool.mem[off];

  EXPECT_GT(sim.counters(0).evictions, 100u);
  EXPECT_GT(in_memory, 100u);             // some reached memory without a flush
  EXPECT_LT(in_memory, pool.bytes / 64);  // but not all of them
}

TEST(NonCoherentSim, AccessOutsideThePoolIsRefused) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 1});
  uint64_t v = 0;
  EXPECT_THROW(sim.node(0).store(pool.mem + 4090, &v, 8), std::out_of_range);
  EXPECT_THROW(sim.node(0).load(&v, &v, 8), std::out_of_range);
  EXPECT_THROW(sim.node(1), std::out_of_range);
}

TEST(NonCoherentSim, MisalignedPoolIsRefused) {
  Pool pool(4096);
  EXPECT_THROW(NonCoherentSim(pool.mem + 8, 1024, {}), std::invalid_argument);
}

// ---- buffer_until_fence: NT stores and flushes wait for the writer's fence ---

TEST(NonCoherentSimBuffered, NtStoreReachesMemoryAtTheWritersFence) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2, .buffer_until_fence = true});
  auto* value = reinterpret_cast<uint64_t*>(pool.mem);
  sim.node(0).write_nt(value, uint64_t{5});

  EXPECT_EQ(sim.node(1).read_fresh(value), 0u);  // still in node 0's WC buffer
  EXPECT_EQ(sim.node(0).read(value), 5u);        // node 0 sees its own store
  sim.node(0).fence();
  EXPECT_EQ(sim.node(1).read_fresh(value), 5u);
}

TEST(NonCoherentSimBuffered, FlushedLineReachesMemoryAtTheWritersFence) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 2, .buffer_until_fence = true});
  auto* value = reinterpret_cast<uint64_t*>(pool.mem + 128);
  sim.node(0).write(value, uint64_t{9});
  sim.node(0).flush_bulk(value, 8);

  EXPECT_EQ(sim.node(1).read_fresh(value), 0u);
  sim.node(0).fence();
  EXPECT_EQ(sim.node(1).read_fresh(value), 9u);
}

TEST(NonCoherentSimBuffered, CrashLosesBufferedWrites) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes, {.nodes = 1, .buffer_until_fence = true});
  sim.node(0).write_nt(reinterpret_cast<uint64_t*>(pool.mem), uint64_t{5});
  sim.drop_all(0);

  EXPECT_EQ(*reinterpret_cast<uint64_t*>(pool.mem), 0u);
}

// One writer publishes rounds of a six-line payload and a flag; between the
// flag and its next fence it does unrelated work, during which buffered lines
// drain in random order.  A reader checks each time whether the flag is ahead
// of the payload.
struct TornOutcome {
  uint64_t checked = 0;  // rounds whose flag the reader saw before the writer's fence
  uint64_t torn = 0;     // ... of which had a stale payload
};
TornOutcome torn_publishes(bool fence_before_flag) {
  Pool pool(4096);
  NonCoherentSim sim(pool.mem, pool.bytes,
                     {.nodes = 2, .evict_probability = 0.2, .seed = 17, .buffer_until_fence = true});
  auto* payload = reinterpret_cast<uint64_t*>(pool.mem);       // lines 0..5
  auto* flag = reinterpret_cast<uint64_t*>(pool.mem + 6 * 64);  // line 6
  auto* other = reinterpret_cast<uint64_t*>(pool.mem + 8 * 64);
  MemoryDomain& w = sim.node(0);
  MemoryDomain& r = sim.node(1);
  TornOutcome out;
  for (uint64_t round = 1; round <= 300; round++) {
    for (size_t i = 0; i < 48; i++) w.write(&payload[i], round);
    w.flush(payload, 48 * 8);
    if (fence_before_flag) w.fence();  // rule 3: payload before flag
    w.write_nt(flag, round);
    for (int k = 0; k < 8; k++) (void)w.read(other);  // unrelated work
    if (r.read_fresh(flag) == round) {
      uint64_t got[48];
      r.invalidate(payload, sizeof got);
      r.fence();
      r.load(got, payload, sizeof got);
      out.checked++;
      for (uint64_t g : got)
        if (g != round) {
          out.torn++;
          break;
        }
    }
    w.fence();
  }
  return out;
}

TEST(NonCoherentSimBuffered, PublishWithFenceBeforeTheFlagIsNeverTorn) {
  TornOutcome out = torn_publishes(/*fence_before_flag=*/true);

  EXPECT_GT(out.checked, 100u);  // the flag often got out early: the check ran
  EXPECT_EQ(out.torn, 0u);
}

TEST(NonCoherentSimBuffered, PublishWithoutFenceBeforeTheFlagIsCaught) {
  TornOutcome out = torn_publishes(/*fence_before_flag=*/false);

  EXPECT_GT(out.torn, 0u) << "the simulator let a missing fence through (" << out.checked
                          << " rounds checked)";
}

// ---- a publish protocol run by several nodes in threads --------------------
//
// Every node owns one channel: a payload of several lines, a flag line and one
// ack line per reader.  The owner publishes round r (payload pattern for r,
// then the flag); every other node polls the flag, reads the payload, checks
// it and acks.  The owner waits for all acks before the next round.
struct ProtocolVariant {
  bool writer_flushes_payload = true;      // rule 3
  bool reader_invalidates_payload = true;  // rule 4
  // Bug: the reader invalidates the payload right after consuming a round,
  // before it has seen the next flag, instead of after.
  bool reader_invalidates_early = false;
};

constexpr size_t kPayloadWords = 48;  // 384 B: six lines
constexpr uint32_t kNodes = 4;

struct alignas(64) Channel {
  uint64_t payload[kPayloadWords];
  alignas(64) uint64_t flag;  // round published; written only by the owner, NT
  struct alignas(64) Ack {
    uint64_t round;  // written only by that reader, NT
  } ack[kNodes];
};

uint64_t pattern(uint32_t owner, uint64_t round, size_t i) {
  return (uint64_t{owner} << 56) ^ (round << 16) ^ i ^ 0x9e3779b97f4a7c15ull;
}

struct ProtocolOutcome {
  uint64_t bad_reads = 0;
  uint64_t evictions = 0;
  uint64_t rounds_checked = 0;
};

ProtocolOutcome run_protocol(ProtocolVariant v, uint64_t rounds, NonCoherentSimOptions o) {
  Pool pool(sizeof(Channel) * kNodes);
  o.nodes = kNodes;
  NonCoherentSim sim(pool.mem, pool.bytes, o);
  auto* ch = reinterpret_cast<Channel*>(pool.mem);
  std::atomic<uint64_t> bad{0}, checked{0};

  auto node_main = [&](uint32_t me) {
    MemoryDomain& d = sim.node(me);
    uint64_t published = 0;                 // my channel's last round
    std::vector<uint64_t> seen(kNodes, 0);  // last round read from each channel
    uint64_t payload[kPayloadWords];
    for (;;) {
      bool progress = false, done = published == rounds;
      // Owner side: publish the next round once every reader acked this one.
      if (published < rounds) {
        bool all_acked = true;
        for (uint32_t r = 0; r < kNodes; r++)
          if (r != me && d.read_fresh(&ch[me].ack[r].round) != published) all_acked = false;
        if (all_acked) {
          const uint64_t round = published + 1;
          for (size_t i = 0; i < kPayloadWords; i++)
            d.write(&ch[me].payload[i], pattern(me, round, i));
          if (v.writer_flushes_payload)
            d.flush(ch[me].payload, sizeof ch[me].payload);  // rule 3: payload to memory
          d.fence();                                         // rule 3: payload before flag
          d.write_nt(&ch[me].flag, round);                   // rule 1/3: flag by NT store
          d.fence();
          published = round;
          progress = true;
        }
      }
      // Reader side: consume every channel whose flag moved.
      for (uint32_t o = 0; o < kNodes; o++) {
        if (o == me) continue;
        if (seen[o] < rounds) done = false;
        const uint64_t flag = d.read_fresh(&ch[o].flag);  // rule 4: invalidate every poll
        if (flag == seen[o]) continue;
        if (v.reader_invalidates_payload && !v.reader_invalidates_early) {
          d.invalidate(ch[o].payload, sizeof ch[o].payload);  // rule 4
          d.fence();
        }
        d.load(payload, ch[o].payload, sizeof payload);
        for (size_t i = 0; i < kPayloadWords; i++)
          if (payload[i] != pattern(o, flag, i)) {
            bad++;
            break;
          }
        checked++;
        seen[o] = flag;
        if (v.reader_invalidates_early) {
          d.invalidate(ch[o].payload, sizeof ch[o].payload);  // too early: before the next flag
          d.fence();
        }
        d.write_nt(&ch[o].ack[me].round, flag);  // rule 1: own ack line, NT
        d.fence();
        progress = true;
      }
      if (done) break;
      if (!progress) std::this_thread::yield();
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < kNodes; n++) threads.emplace_back(node_main, n);
  for (auto& t : threads) t.join();
  return {bad.load(), sim.total().evictions, checked.load()};
}

TEST(NonCoherentSimProtocol, CorrectPublishProtocolPassesUnderThousandsOfRandomEvictions) {
  ProtocolOutcome out = run_protocol({}, /*rounds=*/500, {.evict_probability = 0.05, .seed = 11});

  EXPECT_EQ(out.bad_reads, 0u);
  EXPECT_EQ(out.rounds_checked, 500u * kNodes * (kNodes - 1));
  EXPECT_GT(out.evictions, 5000u);
}

TEST(NonCoherentSimProtocol, CorrectPublishProtocolPassesWithBufferedWritesAndPrefetching) {
  ProtocolOutcome out =
      run_protocol({}, /*rounds=*/300,
                   {.evict_probability = 0.05, .seed = 11, .buffer_until_fence = true,
                    .prefetch_probability = 0.2});

  EXPECT_EQ(out.bad_reads, 0u);
  EXPECT_EQ(out.rounds_checked, 300u * kNodes * (kNodes - 1));
}

TEST(NonCoherentSimProtocol, PublishWithoutPayloadFlushIsCaught) {
  ProtocolOutcome out =
      run_protocol({.writer_flushes_payload = false}, 100, {.evict_probability = 0.02, .seed = 11});

  EXPECT_GT(out.bad_reads, 0u) << "the simulator let a missing flush through";
}

TEST(NonCoherentSimProtocol, ReadWithoutPayloadInvalidateIsCaught) {
  ProtocolOutcome out = run_protocol({.reader_invalidates_payload = false}, 100,
                                     {.evict_probability = 0.02, .seed = 11});

  EXPECT_GT(out.bad_reads, 0u) << "the simulator let a missing invalidate through";
}

TEST(NonCoherentSimProtocol, InvalidatingBeforeTheFlagIsSeenIsCaughtWithPrefetching) {
  ProtocolOutcome out =
      run_protocol({.reader_invalidates_early = true}, 200,
                   {.evict_probability = 0.02, .seed = 11, .prefetch_probability = 0.2});

  EXPECT_GT(out.bad_reads, 0u) << "the simulator let an early invalidate through";
}

}  // namespace
}  // namespace cxlkv
