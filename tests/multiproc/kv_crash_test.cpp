// SPDX-License-Identifier: MIT
// Crash safety of the KV store across real processes: a writer killed with
// SIGKILL mid-publish leaves no visible block and its reservations are
// reclaimed; a reader killed holding a pin does not block eviction.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/alloc.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "pool/format.hpp"
#include "support/proc_util.hpp"

using namespace cxlkv;

namespace {

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/kv_crash_helper";
}

using Child = proc_util::ReadyChild;
using proc_util::kill9;

// Starts the helper and waits for its READY line.
Child start(const std::vector<std::string>& args) { return proc_util::start_ready(helper(), args); }

struct Pool {
  explicit Pool(const std::string& size = "64M") {
    uri = "shm:cxlkv-kvcrash-" + std::to_string(getpid()) + ":" + size;
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    mgr = std::move(LockManager::create(*region).value());
    mgr->start();
    NodeOptions no;
    no.node = 1;
    no.heartbeat = true;
    node = std::move(NodeContext::attach(*region, no).value());
    auto s = open_kv_session(*region, *node);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message());
    session = std::move(s.value());
  }
  ~Pool() {
    session.reset();
    node.reset();
    mgr->stop();
    mgr.reset();
    // This node's and the killed helpers' node-local files.
    for (uint32_t n = 0; n < 16; n++) NodeContext::unlink_local(NodeContext::default_local_name(*region, n));
    region.reset();
    std::string name = uri.substr(4, uri.rfind(':') - 4);
    shm_unlink(("/" + name).c_str());
  }
  KvStore& kv() { return session->store(); }
  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

bool put(KvStore& kv, const BlockKey& k, const BlockKey* parent, std::byte fill) {
  std::vector<std::byte> buf(4096, fill);
  Chunk ch{buf.data(), buf.size()};
  auto r = kv.reserve(k, parent, buf.size());
  return r && r->reserved() && kv.write(*r, {&ch, 1}) && kv.publish(*r);
}

}  // namespace

TEST(KvCrash, WriterKilledMidPublishLeavesNoVisibleBlockAndIsReclaimed) {
  Pool p;
  std::vector<uint64_t> ids = {1, 2, 3};
  auto keys = keys_from_ids(ids);
  ASSERT_TRUE(put(p.kv(), keys[0], nullptr, std::byte{1}));
  Child w = start({p.uri, "2", "writer", to_hex(keys[0]), to_hex(keys[1]), to_hex(keys[2])});
  ASSERT_GT(w.pid, 0) << "helper did not get into position";
  EXPECT_EQ(store_index(p.kv()).find_state(keys[1]), uint32_t(CXLKV_ENTRY_WRITING));
  kill9(w);
  EXPECT_EQ(p.kv().lookup(keys), 1u) << "the half-written blocks are never visible";
  EXPECT_FALSE(p.kv().wait_ready(keys[1], std::chrono::milliseconds(2000)));
  // Another node writes them now: the dead writer's entries are reclaimed.
  ASSERT_TRUE(put(p.kv(), keys[1], &keys[0], std::byte{2}));
  ASSERT_TRUE(put(p.kv(), keys[2], &keys[1], std::byte{3}));
  EXPECT_EQ(p.kv().lookup(keys), 3u);
  auto pin = p.kv().pin(keys[2]);
  ASSERT_TRUE(pin.ok());
  std::vector<std::byte> got(4096);
  Chunk ch{got.data(), got.size()};
  ASSERT_TRUE(p.kv().fetch(*pin, {&ch, 1}).ok());
  EXPECT_EQ(got[0], std::byte{3});
  EXPECT_EQ(got[4095], std::byte{3});
  ASSERT_TRUE(p.kv().unpin(*pin).ok());
}

TEST(KvCrash, ReaderKilledHoldingAPinDoesNotBlockEviction) {
  Pool p;
  std::vector<uint64_t> ids = {42};
  auto keys = keys_from_ids(ids);
  ASSERT_TRUE(put(p.kv(), keys[0], nullptr, std::byte{9}));
  Child r = start({p.uri, "3", "reader", to_hex(keys[0])});
  ASSERT_GT(r.pid, 0) << "helper did not get into position";
  const uint32_t stripe = store_index(p.kv()).stripe_of(keys[0]);
  auto ev = store_index(p.kv()).evict_one(stripe);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev.value()) << "a live reader's pin protects the block";
  EXPECT_EQ(p.kv().lookup(keys), 1u);
  kill9(r);
  ev = store_index(p.kv()).evict_one(stripe);
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(ev.value()) << "the dead reader's pin is ignored";
  EXPECT_EQ(p.kv().lookup(keys), 0u);
}

std::vector<BlockKey> helper_chain(uint64_t c) {
  std::vector<uint64_t> ids(32);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = c * 100 + i + 1;
  return keys_from_ids(ids);
}

// kill -9 of a node in the middle of a batch (a chain reserved, half of it
// written, nothing published): none of it is visible, its reservations are
// reclaimed, the chain it put before reads back whole, and another node
// completes the broken chain in one call.
TEST(KvCrash, BatchWriterKilledMidBatchLeavesNothingBehind) {
  Pool p;
  std::vector<uint64_t> root_id = {7};
  auto root = keys_from_ids(root_id);
  ASSERT_TRUE(put(p.kv(), root[0], nullptr, std::byte{1}));
  Child w = start({p.uri, "2", "batch-writer", to_hex(root[0])});
  ASSERT_GT(w.pid, 0) << "helper did not get into position";
  auto done = helper_chain(0), broken = helper_chain(1);
  EXPECT_EQ(store_index(p.kv()).usage().by_state[CXLKV_ENTRY_WRITING], 32u);
  kill9(w);
  EXPECT_EQ(p.kv().lookup(broken), 0u) << "a half-written batch is never visible";
  ASSERT_TRUE(p.kv().reclaim_dead().ok());
  EXPECT_EQ(store_index(p.kv()).usage().by_state[CXLKV_ENTRY_WRITING], 0u)
      << "the dead writer's reservations are reclaimed";

  std::vector<std::vector<std::byte>> bufs(32, std::vector<std::byte>(4096));
  std::vector<Chunk> chunks;
  for (auto& b : bufs) chunks.push_back(Chunk{b.data(), b.size()});
  std::vector<uint32_t> nchunks(32, 1);
  std::vector<int32_t> st(32);
  ASSERT_EQ(p.kv().lookup(done), 32u);
  auto got = p.kv().get_many(done, chunks, nchunks, st);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value(), 32u);
  for (size_t i = 0; i < 32; i++)
    for (std::byte b : bufs[i]) ASSERT_EQ(b, std::byte(static_cast<uint8_t>(i))) << "block " << i;

  for (size_t i = 0; i < 32; i++) bufs[i].assign(4096, std::byte(static_cast<uint8_t>(32 + i)));
  auto put = p.kv().put_chain(&root[0], broken, 4096, chunks, nchunks, st);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put.value(), 32u) << p.kv().last_block_error();
  for (int32_t s : st) EXPECT_EQ(s, kKvReserved);
  EXPECT_EQ(p.kv().lookup(broken), 32u);
}

// kill -9 of a reader between fetch_many and unpin_many: its pins do not
// keep the blocks from being evicted.
TEST(KvCrash, BatchReaderKilledHoldingPinsDoesNotBlockEviction) {
  Pool p;
  std::vector<uint64_t> ids = {11, 12, 13, 14};
  auto keys = keys_from_ids(ids);
  for (size_t i = 0; i < keys.size(); i++)
    ASSERT_TRUE(put(p.kv(), keys[i], i ? &keys[i - 1] : nullptr, std::byte(static_cast<uint8_t>(i))));
  std::vector<std::string> args = {p.uri, "3", "batch-reader"};
  for (auto& k : keys) args.push_back(to_hex(k));
  Child r = start(args);
  ASSERT_GT(r.pid, 0) << "helper did not get into position";
  const uint32_t leaf_stripe = store_index(p.kv()).stripe_of(keys.back());
  auto ev = store_index(p.kv()).evict_one(leaf_stripe);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(p.kv().lookup(keys), keys.size()) << "a live reader's pins protect its blocks";
  kill9(r);
  // Evict leaves first until nothing is left (prefix-closed: a few passes).
  for (int pass = 0; pass < 16 && p.kv().lookup(keys) > 0; pass++)
    for (auto& k : keys) ASSERT_TRUE(store_index(p.kv()).evict_one(store_index(p.kv()).stripe_of(k)).ok());
  EXPECT_EQ(p.kv().lookup(keys), 0u) << "the dead reader's pins are ignored";
}

// kill -9 of a writer inside put_chain (a chain of 16 blocks of 2 MiB being
// reserved, written or published while it dies): what it published stays
// a readable prefix, nothing it reserved stays reserved or allocated, and
// another node puts the same chain in one call, on the space it gave back.
TEST(KvCrash, WriterKilledInsidePutChainLeaksNothing) {
  Pool p("256M");
  constexpr size_t kN = 16, kBytes = 2u << 20;
  auto chunks_of = ChunkAllocator::open(*p.node);
  ASSERT_TRUE(chunks_of.ok());
  ChunkAllocator& ca = chunks_of.value();
  ASSERT_GE(ca.geometry().chunk_size, kBytes) << "one chunk per block below";
  const uint64_t free0 = ca.free_chunks();
  auto chain_keys = [&](uint64_t c) {
    std::vector<uint64_t> ids(kN);
    for (size_t i = 0; i < kN; i++) ids[i] = 1000 + c * kN + i;
    return keys_from_ids(ids);
  };
  // Kill the writer while it holds reservations.  The writer is stopped
  // (SIGSTOP) as soon as a reservation is seen lock-free, so the state it
  // dies in is the state read while it is stopped: on a loaded machine the
  // test may lose the CPU between seeing a reservation and the kill, and
  // the call would have ended by then.  A stop that lands between two calls
  // (nothing reserved) is undone with SIGCONT and tried again.
  uint64_t left_writing = 0;
  Child w = start({p.uri, "2", "put-chain-loop"});
  ASSERT_GT(w.pid, 0) << "helper did not put its first chain";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (left_writing == 0 && std::chrono::steady_clock::now() < deadline) {
    while (store_index(p.kv()).usage().by_state[CXLKV_ENTRY_WRITING] == 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    kill(w.pid, SIGSTOP);
    int ws = 0;
    ASSERT_EQ(waitpid(w.pid, &ws, WUNTRACED), w.pid);
    ASSERT_TRUE(WIFSTOPPED(ws)) << "the writer must be stopped, not gone";
    left_writing = store_index(p.kv()).usage().by_state[CXLKV_ENTRY_WRITING];
    if (left_writing == 0) kill(w.pid, SIGCONT);
  }
  // The chain being put when the writer stops: the one holding reservations
  // (the writer puts chains 0..5 one at a time, again and again, removing
  // them between cycles: chains before it are complete, none after it is
  // cached).
  constexpr uint64_t kChains = 6;
  uint64_t inflight = 0;
  auto reserving = [&](uint64_t c) {
    for (const BlockKey& k : chain_keys(c))
      if (store_index(p.kv()).find_state(k) == CXLKV_ENTRY_WRITING) return true;
    return false;
  };
  while (left_writing > 0 && inflight < kChains && !reserving(inflight)) inflight++;
  kill9(w);
  ASSERT_GT(left_writing, 0u) << "no kill landed inside a put_chain";
  ASSERT_LT(inflight, kChains) << "no chain holds the reservations seen";

  std::vector<std::vector<std::byte>> bufs(kN, std::vector<std::byte>(kBytes));
  std::vector<Chunk> chunks(kN);
  std::vector<uint32_t> nchunks(kN, 1);
  std::vector<int32_t> st(kN);
  auto fill = [&](uint64_t c, bool expected) {
    for (size_t i = 0; i < kN; i++) {
      std::fill(bufs[i].begin(), bufs[i].end(), expected ? std::byte(static_cast<uint8_t>(c * kN + i)) : std::byte{0});
      chunks[i] = Chunk{bufs[i].data(), kBytes};
    }
  };
  size_t broken = 0;
  for (uint64_t c = 0; c < kChains; c++) {
    auto keys = chain_keys(c);
    const size_t k = p.kv().lookup(keys);
    if (c > inflight) {
      EXPECT_EQ(k, 0u) << "chain " << c << " is after the one in flight: removed before this cycle";
      continue;
    }
    // What the dead writer published is a prefix that reads back exactly.
    fill(c, false);
    auto got = p.kv().get_many(std::span(keys).first(k), chunks, nchunks, st);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got.value(), k) << p.kv().last_block_error();
    for (size_t i = 0; i < k; i++)
      ASSERT_EQ(bufs[i][kBytes - 1], std::byte(static_cast<uint8_t>(c * kN + i))) << "chain " << c << " block " << i;
    if (k == kN) continue;
    broken++;
    // Another node puts the whole chain in one call: the dead writer's
    // reservations are taken over (no reclaim_dead() first).
    fill(c, true);
    auto put = p.kv().put_chain(nullptr, keys, kBytes, chunks, nchunks, st);
    ASSERT_TRUE(put.ok());
    ASSERT_EQ(put.value(), kN) << p.kv().last_block_error();
    for (size_t i = 0; i < kN; i++) EXPECT_EQ(st[i], i < k ? kKvExists : kKvReserved) << i;
    fill(c, false);
    ASSERT_EQ(p.kv().get_many(keys, chunks, nchunks, st).value(), kN);
    for (size_t i = 0; i < kN; i++) ASSERT_EQ(bufs[i][0], std::byte(static_cast<uint8_t>(c * kN + i))) << i;
  }
  EXPECT_GE(broken, 1u) << "a chain was being put when the writer died";
  IndexUsage u = store_index(p.kv()).usage();
  EXPECT_EQ(u.by_state[CXLKV_ENTRY_WRITING], 0u) << "no reservation is left";
  EXPECT_EQ(ca.free_chunks(), free0 - u.by_state[CXLKV_ENTRY_READY])
      << "every chunk is free or holds a published block: the dead writer's reserved space came back";
}
