// SPDX-License-Identifier: MIT
// The index's batch calls in both modes: lock-based (this process takes the
// stripe locks itself) and index service (one server owns the index and
// answers over the shared-memory RPC).  The same specification must hold
// in both: the same per-block statuses, locations and chain semantics.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cxlkv/kv.hpp"
#include "kv/index_service.hpp"
#include "kv/store_index.hpp"
#include "support/rpc_test_pool.hpp"

namespace cxlkv {
namespace {

using rpctest::RpcPool;

enum class Mode { locks, service };

// The batch calls, either straight on a PrefixIndex or through the service.
struct IndexOps {
  PrefixIndex* direct = nullptr;
  IndexServiceClient* svc = nullptr;
  Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                               std::span<Reservation> out, std::span<int32_t> st) {
    return direct ? direct->reserve_chain(parent, keys, bytes, out, st) : svc->reserve_chain(parent, keys, bytes, out, st);
  }
  Result<size_t> publish_many(std::span<const uint32_t> s, std::span<const BlockKey> k, std::span<int32_t> st) {
    return direct ? direct->publish_many(s, k, st) : svc->publish_many(s, k, st);
  }
  Result<size_t> abort_many(std::span<const uint32_t> s, std::span<const BlockKey> k, std::span<int32_t> st) {
    return direct ? direct->abort_many(s, k, st) : svc->abort_many(s, k, st);
  }
  Result<size_t> pin_many(std::span<const BlockKey> k, std::span<PinnedBlock> out, std::span<int32_t> st) {
    return direct ? direct->pin_many(k, out, st) : svc->pin_many(k, out, st);
  }
  Result<size_t> unpin_many(std::span<const uint32_t> s, std::span<const BlockKey> k, std::span<int32_t> st) {
    return direct ? direct->unpin_many(s, k, st) : svc->unpin_many(s, k, st);
  }
};

class IndexModes : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    pool = std::make_unique<RpcPool>(GetParam() == Mode::locks ? "ixs-locks" : "ixs-svc", 64ull << 20,
                                     std::vector<std::pair<std::string, uint64_t>>{{kIndexServiceCarve, kIndexServiceCarveBytes}});
    LockManagerOptions mo;
    mo.node = 0;
    auto m = LockManager::create(*pool->region, mo);
    ASSERT_TRUE(m) << m.error().message();
    mgr = std::move(m.value());
    mgr->start();
    NodeContext& server_node = pool->attach(0);
    NodeContext& client_node = pool->attach(1);
    KvOpenOptions locks;
    locks.index_mode = KvIndexMode::locks;  // the pool has the service carve: say which path
    if (GetParam() == Mode::locks) {
      auto s = open_kv_session(*pool->region, client_node, locks);
      ASSERT_TRUE(s) << s.error().message();
      session = std::move(s.value());
      ops.direct = &store_index(session->store());
    } else {
      auto s = open_kv_session(*pool->region, server_node, locks);
      ASSERT_TRUE(s) << s.error().message();
      session = std::move(s.value());
      RpcServerOptions so;
      so.spin_rounds = 200;
      auto svc = IndexService::create(server_node, store_index(session->store()), so);
      ASSERT_TRUE(svc) << svc.error().message();
      service = std::move(svc.value());
      service->server().start();
      auto c = IndexServiceClient::connect(client_node);
      ASSERT_TRUE(c) << c.error().message();
      client = std::move(c.value());
      ops.svc = client.get();
    }
  }
  void TearDown() override {
    client.reset();
    service.reset();
    session.reset();
    if (mgr) mgr->stop();
    mgr.reset();
    pool.reset();
  }
  static std::vector<BlockKey> chain(uint64_t tag, size_t n) {
    std::vector<BlockKey> k(n);
    for (size_t i = 0; i < n; i++) k[i] = BlockKey{tag * 1000003 + i + 1, 0x5eed0000 + tag};
    return k;
  }
  std::unique_ptr<RpcPool> pool;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<KvSession> session;
  std::unique_ptr<IndexService> service;
  std::unique_ptr<IndexServiceClient> client;
  IndexOps ops;
};

std::vector<uint32_t> slots_of(const std::vector<Reservation>& r) {
  std::vector<uint32_t> s;
  for (auto& x : r) s.push_back(x.slot);
  return s;
}

TEST_P(IndexModes, FreshChainIsReservedThenExistsOncePublished) {
  auto keys = chain(1, 8);
  std::vector<Reservation> res(8);
  std::vector<int32_t> st(8, 99);
  auto r = ops.reserve_chain(nullptr, keys, 4096, res, st);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), 8u);
  for (int i = 0; i < 8; i++) {
    EXPECT_EQ(st[i], kBlockReserved) << i;
    EXPECT_EQ(res[i].status, ReserveStatus::reserved) << i;
    EXPECT_EQ(res[i].loc.length, 4096u) << i;
  }
  auto slots = slots_of(res);
  auto p = ops.publish_many(slots, keys, st);
  ASSERT_TRUE(p);
  EXPECT_EQ(p.value(), 8u);
  std::vector<Reservation> again(8);
  auto r2 = ops.reserve_chain(nullptr, keys, 4096, again, st);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2.value(), 8u);
  for (int i = 0; i < 8; i++) {
    EXPECT_EQ(st[i], kBlockExists) << i;
    EXPECT_EQ(again[i].loc.offset, res[i].loc.offset) << i;
  }
}

TEST_P(IndexModes, PinFindsPublishedBlocksAndMissesOthersThenUnpins) {
  auto keys = chain(2, 4);
  std::vector<Reservation> res(4);
  std::vector<int32_t> st(4);
  ASSERT_TRUE(ops.reserve_chain(nullptr, keys, 1024, res, st));
  auto slots = slots_of(res);
  ASSERT_TRUE(ops.publish_many(slots, keys, st));
  std::vector<BlockKey> ask = keys;
  ask.push_back(BlockKey{777, 888});  // never cached
  std::vector<PinnedBlock> pins(5);
  std::vector<int32_t> pst(5, 99);
  auto n = ops.pin_many(ask, pins, pst);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(n.value(), 4u);
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(pst[i], 0) << i;
    EXPECT_EQ(pins[i].slot, res[i].slot) << i;
    EXPECT_EQ(pins[i].loc.offset, res[i].loc.offset) << i;
  }
  EXPECT_EQ(pst[4], kBlockMiss);
  std::vector<uint32_t> pslots;
  for (int i = 0; i < 4; i++) pslots.push_back(pins[i].slot);
  std::vector<int32_t> ust(4, 99);
  auto u = ops.unpin_many(pslots, keys, ust);
  ASSERT_TRUE(u);
  EXPECT_EQ(u.value(), 4u);
  for (int i = 0; i < 4; i++) EXPECT_EQ(ust[i], 0);
}

TEST_P(IndexModes, AbortedReservationsAreGone) {
  auto keys = chain(3, 3);
  std::vector<Reservation> res(3);
  std::vector<int32_t> st(3);
  ASSERT_TRUE(ops.reserve_chain(nullptr, keys, 512, res, st));
  auto slots = slots_of(res);
  auto a = ops.abort_many(slots, keys, st);
  ASSERT_TRUE(a);
  std::vector<PinnedBlock> pins(3);
  ASSERT_TRUE(ops.pin_many(keys, pins, st));
  for (int i = 0; i < 3; i++) EXPECT_EQ(st[i], kBlockMiss) << i;
}

TEST_P(IndexModes, ChildOfAnUnknownParentIsRefused) {
  BlockKey parent{4242, 4242};  // not in the index
  auto keys = chain(4, 2);
  std::vector<Reservation> res(2);
  std::vector<int32_t> st(2, 99);
  auto r = ops.reserve_chain(&parent, keys, 512, res, st);
  if (r) {
    EXPECT_EQ(r.value(), 0u);
    EXPECT_LT(st[0], 0) << "a block whose parent is not cached is not reserved";
    EXPECT_EQ(st[1], -ECANCELED);
  } else {
    EXPECT_LT(r.error().code(), 0);
  }
}

TEST_P(IndexModes, BatchesLargerThanOneRequestKeepChainSemantics) {
  const size_t n = 500;  // > kIndexServiceMaxBatch: the service splits it (the index reserves up to 512 per call)
  auto keys = chain(5, n);
  std::vector<Reservation> res(n);
  std::vector<int32_t> st(n, 99);
  auto r = ops.reserve_chain(nullptr, keys, 256, res, st);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r.value(), n);
  auto slots = slots_of(res);
  auto p = ops.publish_many(slots, keys, st);
  ASSERT_TRUE(p);
  EXPECT_EQ(p.value(), n);
  std::vector<PinnedBlock> pins(n);
  auto q = ops.pin_many(keys, pins, st);
  ASSERT_TRUE(q);
  EXPECT_EQ(q.value(), n);
  for (size_t i = 0; i < n; i += 97) EXPECT_EQ(pins[i].loc.offset, res[i].loc.offset) << i;
}

// cxlkvd --index-service: the daemon that manages the locks also owns the
// index; another process reserves, publishes and pins through it.
TEST(IndexServiceDaemon, CxlkvdServesTheIndexToAnotherProcess) {
  RpcPool pool("ixs-daemon", 64ull << 20, {{kIndexServiceCarve, kIndexServiceCarveBytes}});
  rpctest::IndexServiceDaemon daemon(pool.uri);
  ASSERT_GT(daemon.pid, 0);
  NodeContext& me = pool.attach(1);
  std::unique_ptr<IndexServiceClient> cl;
  std::string last;
  for (int i = 0; i < 200 && !cl; i++) {
    auto c = IndexServiceClient::connect(me);
    if (c) cl = std::move(c.value());
    else {
      last = c.error().message();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_TRUE(cl) << "no index service from cxlkvd: " << last;
  std::vector<BlockKey> keys = {{11, 1}, {12, 1}, {13, 1}};
  std::vector<Reservation> res(3);
  std::vector<int32_t> st(3, 99);
  auto r = cl->reserve_chain(nullptr, keys, 2048, res, st);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), 3u);
  std::vector<uint32_t> slots = {res[0].slot, res[1].slot, res[2].slot};
  ASSERT_TRUE(cl->publish_many(slots, keys, st));
  std::vector<PinnedBlock> pins(3);
  auto p = cl->pin_many(keys, pins, st);
  ASSERT_TRUE(p);
  EXPECT_EQ(p.value(), 3u);
  EXPECT_EQ(pins[2].loc.offset, res[2].loc.offset);
  cl.reset();
  const int wst = daemon.stop();
  EXPECT_TRUE(WIFEXITED(wst) && WEXITSTATUS(wst) == 0) << "cxlkvd exit status " << wst;
}

INSTANTIATE_TEST_SUITE_P(BothModes, IndexModes, ::testing::Values(Mode::locks, Mode::service),
                         [](const auto& info) { return info.param == Mode::locks ? "locks" : "service"; });

}  // namespace
}  // namespace cxlkv
