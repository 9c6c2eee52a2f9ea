// SPDX-License-Identifier: MIT
// KvStore in both index modes (docs/rpc.md "The index service"): the same user-facing calls
// (single and batch, put_chain / get_many) must behave the same whether this
// process takes the index's stripe locks itself or an index service owns the
// index and answers over the shared-memory RPC.  Also: how a pool's mode is
// chosen, and what a caller sees when the service is down (an error naming
// the pool and the service, never a hang).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cxlkv/kv.hpp"
#include "cxlkv/metrics.hpp"
#include "index/prefix_index.hpp"
#include "kv/index_service.hpp"
#include "kv/store_index.hpp"
#include "support/rpc_service_pool.hpp"

namespace cxlkv {
namespace {

using rpctest::ModePool;
using rpctest::RpcPool;
using Clock = std::chrono::steady_clock;

// Unsets CXLKV_INDEX_MODE for the test (the service-mode CTest run sets it).
struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (const char* e = std::getenv("CXLKV_INDEX_MODE")) saved = e, had = true;
    if (value) setenv("CXLKV_INDEX_MODE", value, 1);
    else unsetenv("CXLKV_INDEX_MODE");
  }
  ~EnvGuard() {
    if (had) setenv("CXLKV_INDEX_MODE", saved.c_str(), 1);
    else unsetenv("CXLKV_INDEX_MODE");
  }
  std::string saved;
  bool had = false;
};

std::vector<BlockKey> chain(uint64_t tag, size_t n) {
  std::vector<BlockKey> k(n);
  for (size_t i = 0; i < n; i++) k[i] = BlockKey{tag * 1000003 + i + 1, 0xfeed0000 + tag};
  return k;
}

std::vector<std::byte> pattern(size_t block, size_t len) {
  std::vector<std::byte> b(len);
  for (size_t i = 0; i < len; i++) b[i] = std::byte(uint8_t(block * 37 + i * 11 + 3));
  return b;
}

class KvModes : public ::testing::TestWithParam<KvIndexMode> {
 protected:
  void SetUp() override {
    mp = std::make_unique<ModePool>(GetParam() == KvIndexMode::locks ? "kvm-locks" : "kvm-svc");
    if (GetParam() == KvIndexMode::service) mp->start_service();
    a = &mp->store(1, GetParam());
    b = &mp->store(2, GetParam());
  }
  void TearDown() override { mp.reset(); }
  std::unique_ptr<ModePool> mp;
  KvStore* a = nullptr;
  KvStore* b = nullptr;
};

TEST_P(KvModes, StoreReportsTheModeItWasOpenedIn) {
  EXPECT_STREQ(a->index_mode(), GetParam() == KvIndexMode::locks ? "locks" : "service");
}

TEST_P(KvModes, PutChainThenGetManyReturnsTheBytesAndASecondPutFindsThemCached) {
  const size_t n = 40, len = 1000;  // 40 blocks: more than one stripe, one request
  auto keys = chain(1, n);
  std::vector<std::vector<std::byte>> data;
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < n; i++) data.push_back(pattern(i, len));
  for (auto& d : data) chunks.push_back(Chunk{d.data(), len});
  std::vector<uint32_t> nch(n, 1);
  std::vector<int32_t> st(n, 99);
  auto p = a->put_chain(nullptr, keys, len, chunks, nch, st);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p.value(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(st[i], kKvReserved) << i;
  EXPECT_EQ(b->lookup(keys), n) << "another node sees the published chain";

  std::vector<std::vector<std::byte>> got(n, std::vector<std::byte>(len));
  std::vector<Chunk> out;
  for (auto& g : got) out.push_back(Chunk{g.data(), len});
  auto g = b->get_many(keys, out, nch, st);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(g.value(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(got[i], data[i]) << "block " << i;

  auto again = b->put_chain(nullptr, keys, len, chunks, nch, st);
  ASSERT_TRUE(again);
  EXPECT_EQ(again.value(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(st[i], kKvExists) << i;
}

TEST_P(KvModes, SingleBlockCallsReserveWritePublishPinFetchUnpin) {
  auto keys = chain(2, 2);
  auto bytes = pattern(7, 4096);
  Chunk c{bytes.data(), bytes.size()};
  auto r0 = a->reserve(keys[0], nullptr, bytes.size());
  ASSERT_TRUE(r0) << r0.error().message();
  EXPECT_TRUE(r0->reserved());
  ASSERT_TRUE(a->write(*r0, {&c, 1}));
  // The child may be reserved under a reserved parent; its publish waits
  // for the parent's (-EAGAIN) in both modes.
  auto r1 = a->reserve(keys[1], &keys[0], bytes.size());
  ASSERT_TRUE(r1) << r1.error().message();
  ASSERT_TRUE(a->write(*r1, {&c, 1}));
  auto early = a->publish(*r1);
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code(), -EAGAIN);
  ASSERT_TRUE(a->publish(*r0));
  ASSERT_TRUE(a->publish(*r1));
  EXPECT_EQ(b->lookup(keys), 2u);

  auto pin = b->pin(keys[1]);
  ASSERT_TRUE(pin) << pin.error().message();
  std::vector<std::byte> got(bytes.size());
  Chunk o{got.data(), got.size()};
  ASSERT_TRUE(b->fetch(*pin, {&o, 1}));
  EXPECT_EQ(got, bytes);
  ASSERT_TRUE(b->unpin(*pin));

  auto miss = b->pin(BlockKey{999, 999});
  ASSERT_FALSE(miss);
  EXPECT_EQ(miss.error().code(), -ENOENT);
}

// A forged entry (checksum recomputed) that names another block's space is
// refused at pin in both modes, and the message says which block and why
// (docs/integrity.md "Block owners: overlapping entries").  Through the index service the refusal arrives as a
// code only; the store's message still names the pool, the service and the
// cause, not a bare "Input/output error" (found by the damaged-pool campaign,
// tests/damage/damage_campaign.py).
TEST_P(KvModes, AForgedEntryNamingAnotherBlocksSpaceIsRefusedWithTheCauseNamed) {
  auto keys = chain(9, 2);
  const size_t len = 8192;
  for (size_t i = 0; i < 2; i++) {
    auto bytes = pattern(i, len);
    Chunk c{bytes.data(), len};
    auto r = a->reserve(keys[i], nullptr, len);
    ASSERT_TRUE(r && r->reserved()) << (r ? "" : r.error().message());
    ASSERT_TRUE(a->write(*r, {&c, 1}));
    ASSERT_TRUE(a->publish(*r));
  }
  Region& region = *mp->pool.region;
  MemoryDomain& d = region.domain();
  std::byte* ix = region.at(region.carve(CXLKV_CARVE_INDEX)->offset);
  auto line = [&](uint32_t slot) {
    return reinterpret_cast<cxlkv_index_entry*>(ix + store_index(*b).header().entry_off + slot * 64ull);
  };
  const uint32_t sa = store_index(*b).find_ready(keys[0]), sb = store_index(*b).find_ready(keys[1]);
  ASSERT_NE(sa, CXLKV_INDEX_NO_SLOT);
  ASSERT_NE(sb, CXLKV_INDEX_NO_SLOT);
  cxlkv_index_entry e = d.read_fresh(line(sb));
  e.loc_off = d.read_fresh(line(sa)).loc_off;  // B now names A's bytes
  e.check = cxlkv_index_entry_check(&e);
  d.publish_line(line(sb), &e);
  d.fence();

  auto pin = b->pin(keys[1]);
  ASSERT_FALSE(pin) << "an entry naming another block's space was pinned";
  EXPECT_EQ(pin.error().code(), -EIO);
  const std::string m = pin.error().message();
  EXPECT_NE(m.find(to_hex(keys[1])), std::string::npos) << m;
  EXPECT_NE(m.find("damaged or forged"), std::string::npos) << m;
  if (GetParam() == KvIndexMode::service) {
    EXPECT_NE(m.find("pool " + mp->pool.region->uri()), std::string::npos) << m;
    EXPECT_NE(m.find("index service"), std::string::npos) << m;
  }
  // The batch path says the same, and A is still served as itself.
  std::vector<std::byte> got(len);
  Chunk o{got.data(), len};
  std::vector<uint32_t> n1(1, 1);
  std::vector<int32_t> st(1, 99);
  auto g = b->get_many({&keys[1], 1}, {&o, 1}, n1, st);
  EXPECT_TRUE(!g || st[0] == -EIO) << st[0];
  EXPECT_NE(b->last_block_error().find("damaged or forged"), std::string::npos) << b->last_block_error();
  auto ga = b->get_many({&keys[0], 1}, {&o, 1}, n1, st);
  ASSERT_TRUE(ga);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(got, pattern(0, len));
}

TEST_P(KvModes, AnotherNodesReservationIsBusyUntilAbortedThenReservable) {
  auto keys = chain(3, 1);
  auto r = a->reserve(keys[0], nullptr, 512);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(r->reserved());
  std::vector<KvReservation> rs(1);
  std::vector<int32_t> st(1, 99);
  ASSERT_TRUE(b->reserve_chain(nullptr, keys, 512, rs, st));
  EXPECT_EQ(st[0], kKvBusy);
  ASSERT_TRUE(a->abort(*r));
  ASSERT_TRUE(b->reserve_chain(nullptr, keys, 512, rs, st));
  EXPECT_EQ(st[0], kKvReserved);
  ASSERT_TRUE(b->abort_many(rs, st));
  EXPECT_EQ(st[0], kKvReserved);
}

TEST_P(KvModes, StaleReservationHandleIsRefusedAfterAbort) {
  auto keys = chain(4, 1);
  auto r = a->reserve(keys[0], nullptr, 512);
  ASSERT_TRUE(r);
  ASSERT_TRUE(a->abort(*r));
  auto p = a->publish(*r);  // the entry is gone: the fencing check refuses it
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), -ESTALE) << p.error().message();
}

TEST_P(KvModes, ChainLongerThanOneServiceRequestKeepsChainSemantics) {
  const size_t n = 300;  // > kIndexServiceMaxBatch (the client splits it)
  auto keys = chain(5, n);
  std::vector<KvReservation> rs(n);
  std::vector<int32_t> st(n, 99);
  auto r = a->reserve_chain(nullptr, keys, 128, rs, st);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), n);
  auto p = a->publish_many(rs, st);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p.value(), n);
  std::vector<KvPin> pins(n);
  auto q = b->pin_many(keys, pins, st);
  ASSERT_TRUE(q);
  EXPECT_EQ(q.value(), n);
  for (size_t i = 0; i < n; i += 37) EXPECT_EQ(pins[i].loc_off, rs[i].loc_off) << i;
  ASSERT_TRUE(b->unpin_many(pins, st));
}

// In both modes a fetch needs a pin the caller holds: a handle built from
// the index entry (never pinned) reads nothing, nor does a handle after its
// own unpin; an unpin of a forged handle (location, version) is refused and
// leaves the real pin in place (the block cannot be removed, the real
// handle still unpins).
TEST_P(KvModes, AFetchNeedsAPinTheCallerHoldsAndAForgedUnpinKeepsTheRealPin) {
  auto keys = chain(6, 1);
  auto bytes = pattern(9, 4096);
  Chunk c{bytes.data(), bytes.size()};
  std::vector<uint32_t> nch(1, 1);
  std::vector<int32_t> st(1, 99);
  ASSERT_TRUE(a->put_chain(nullptr, keys, bytes.size(), {&c, 1}, nch, st));
  ASSERT_EQ(st[0], kKvReserved);
  PrefixIndex& ix = store_index(*a);  // lock-free reads; remove() takes the stripe locks itself
  const uint32_t slot = ix.find_ready(keys[0]);
  ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
  const IndexEntryView e = ix.entry(slot);
  KvPin made;  // from the index alone
  made.key = keys[0];
  made.slot = slot;
  made.length = e.loc.length;
  made.loc_off = e.loc.offset;
  made.loc_dev = e.loc.device;
  made.loc_tier = e.loc.tier;
  made.version = e.version;
  std::vector<std::byte> got(bytes.size(), std::byte{0});
  Chunk o{got.data(), got.size()};
  auto f = b->fetch(made, {&o, 1});
  ASSERT_FALSE(f) << "a handle read from the index fetched without a pin";
  EXPECT_EQ(f.error().code(), -ESTALE) << f.error().message();
  EXPECT_NE(got, bytes);

  auto pin = b->pin(keys[0]);
  ASSERT_TRUE(pin) << pin.error().message();
  ASSERT_TRUE(b->fetch(*pin, {&o, 1}));
  EXPECT_EQ(got, bytes);
  for (int forge = 0; forge < 2; forge++) {
    KvPin x = *pin;
    if (forge == 0) x.loc_off += 512;
    else x.version += 1;
    auto u = b->unpin(x);
    ASSERT_FALSE(u) << "forged unpin " << forge << " went through";
    EXPECT_EQ(u.error().code(), -EINVAL) << u.error().message();
    EXPECT_NE(ix.entry(slot).pin_mask, 0u) << "forged unpin " << forge << " dropped the real pin";
    auto rm = ix.remove(keys[0]);
    ASSERT_FALSE(rm) << "a pinned block was removable after forged unpin " << forge;
  }
  ASSERT_TRUE(b->unpin(*pin)) << "the real pin no longer unpins";
  EXPECT_EQ(ix.entry(slot).pin_mask, 0u);
  std::fill(got.begin(), got.end(), std::byte{0});
  f = b->fetch(*pin, {&o, 1});
  ASSERT_FALSE(f) << "a fetch through an unpinned handle went through";
  EXPECT_EQ(f.error().code(), -ESTALE) << f.error().message();
  EXPECT_NE(got, bytes);
}

INSTANTIATE_TEST_SUITE_P(BothModes, KvModes, ::testing::Values(KvIndexMode::locks, KvIndexMode::service),
                         [](const auto& info) { return info.param == KvIndexMode::locks ? "locks" : "service"; });

// ---- mode selection -----------------------------------------------------------

TEST(KvIndexModeSelection, PoolWithTheServiceCarveIsInServiceModeUnlessTheEnvironmentSaysLocks) {
  EnvGuard env(nullptr);
  ModePool mp("kvm-sel");
  mp.start_service();
  EXPECT_STREQ(mp.store(1, KvIndexMode::automatic).index_mode(), "service");
  setenv("CXLKV_INDEX_MODE", "locks", 1);
  EXPECT_STREQ(mp.store(2, KvIndexMode::automatic).index_mode(), "locks");
  setenv("CXLKV_INDEX_MODE", "sideways", 1);
  auto bad = mp.open(3, KvIndexMode::automatic);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), -EINVAL);
  EXPECT_NE(bad.error().message().find("CXLKV_INDEX_MODE"), std::string::npos) << bad.error().message();
}

TEST(KvIndexModeSelection, PoolWithoutTheServiceCarveIsLockBased) {
  EnvGuard env(nullptr);
  RpcPool pool("kvm-plain");
  LockManagerOptions mo;
  auto m = LockManager::create(*pool.region, mo);
  ASSERT_TRUE(m);
  m.value()->start();
  {
    auto s = open_kv_session(*pool.region, pool.attach(1));
    ASSERT_TRUE(s) << s.error().message();
    EXPECT_STREQ(s.value()->store().index_mode(), "locks");
  }
  m.value()->stop();
}

// ---- the service down ------------------------------------------------------------

TEST(KvIndexServiceDown, CallsFailWithConnResetNamingPoolAndServiceNotAHang) {
  EnvGuard env(nullptr);
  ModePool mp("kvm-down");
  mp.start_service();
  KvStore& s = mp.store(1, KvIndexMode::service);
  auto keys = chain(6, 4);
  std::vector<KvReservation> rs(4);
  std::vector<int32_t> st(4);
  ASSERT_TRUE(s.reserve_chain(nullptr, keys, 256, rs, st));
  mp.stop_service();  // the server marks its line STOPPED

  auto t0 = Clock::now();
  auto p = s.publish_many(rs, st);
  auto took = Clock::now() - t0;
  ASSERT_FALSE(p) << "a publish with the service down cannot succeed";
  EXPECT_TRUE(p.error().code() == -ECONNRESET || p.error().code() == -ETIMEDOUT) << p.error().message();
  EXPECT_NE(p.error().message().find(mp.pool.uri), std::string::npos) << p.error().message();
  EXPECT_NE(p.error().message().find("index service"), std::string::npos) << p.error().message();
  EXPECT_LT(took, std::chrono::seconds(30)) << "bounded (request timeout 5 s)";

  // Opening a store in service mode with no server: an error naming both.
  t0 = Clock::now();
  auto o = mp.open(2, KvIndexMode::service);
  ASSERT_FALSE(o);
  EXPECT_NE(o.error().message().find(mp.pool.uri), std::string::npos) << o.error().message();
  EXPECT_NE(o.error().message().find("index service"), std::string::npos) << o.error().message();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));

  // A new service: the same store's calls go through again (reconnect), and
  // the reservations the old server held are its node's (still alive here):
  // they abort through the new server, which runs as the same node.
  mp.start_service();
  std::vector<KvReservation> rs2(4);
  auto r2 = s.reserve_chain(nullptr, chain(7, 4), 256, rs2, st);
  ASSERT_TRUE(r2) << r2.error().message();
  EXPECT_EQ(r2.value(), 4u);
  ASSERT_TRUE(s.abort_many(rs2, st));
}

// cxlkvd --index-service in another process owns the index; a store opened
// with no mode given finds the pool in service mode and works through it.
// kill -9 of the daemon: the store's next call fails (-ECONNRESET or
// -ETIMEDOUT, naming the pool and the service) within a bound, never hangs.
TEST(KvIndexServiceDaemon, StoreInAutomaticModeUsesCxlkvdAndSeesItsDeathAsAnError) {
  EnvGuard env(nullptr);
  RpcPool pool("kvm-daemon", 64ull << 20, {{kIndexServiceCarve, kIndexServiceCarveBytes}});
  rpctest::IndexServiceDaemon daemon(pool.uri);
  ASSERT_GT(daemon.pid, 0);
  NodeContext& me = pool.attach(1, true);
  std::unique_ptr<KvSession> session;
  std::string last;
  for (int i = 0; i < 200 && !session; i++) {  // until cxlkvd serves (bounded: 10 s)
    auto s = open_kv_session(*pool.region, me);
    if (s) session = std::move(s.value());
    else {
      last = s.error().message();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_TRUE(session) << "no index service from cxlkvd: " << last;
  KvStore& kv = session->store();
  EXPECT_STREQ(kv.index_mode(), "service");
  const size_t n = 8, len = 512;
  auto keys = chain(8, n);
  std::vector<std::byte> in(n * len), out(n * len);
  for (size_t i = 0; i < in.size(); i++) in[i] = std::byte(uint8_t(i * 13 + 1));
  std::vector<Chunk> cin, cout;
  for (size_t i = 0; i < n; i++) {
    cin.push_back(Chunk{in.data() + i * len, len});
    cout.push_back(Chunk{out.data() + i * len, len});
  }
  std::vector<uint32_t> nch(n, 1);
  std::vector<int32_t> st(n);
  auto p = kv.put_chain(nullptr, keys, len, cin, nch, st);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p.value(), n);
  auto g = kv.get_many(keys, cout, nch, st);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(g.value(), n);
  EXPECT_EQ(in, out);

  daemon.kill9();
  auto t0 = Clock::now();
  std::vector<KvPin> pins(n);
  auto q = kv.pin_many(keys, pins, st);
  ASSERT_FALSE(q) << "a pin with the service dead cannot succeed";
  EXPECT_TRUE(q.error().code() == -ECONNRESET || q.error().code() == -ETIMEDOUT) << q.error().message();
  EXPECT_NE(q.error().message().find(pool.uri), std::string::npos) << q.error().message();
  EXPECT_NE(q.error().message().find("index service"), std::string::npos) << q.error().message();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  // The lock-free read path does not need the service.
  EXPECT_EQ(kv.lookup(keys), n);
}

// ---- rpc metrics ------------------------------------------------------------------

TEST(RpcMetrics, ExpositionShowsTheIndexServiceAndItsClientsThenItsStop) {
  EnvGuard env(nullptr);
  ModePool mp("kvm-metrics");
  for (int m = 0; m < int(CXLKV_METRIC_RPC_COUNT); m++) {
    const std::string name = rpc_metric(m).name;
    EXPECT_EQ(name.rfind("cxlkv_rpc_", 0), 0u) << name;
    for (int k = 0; k < m; k++) EXPECT_NE(name, rpc_metric(k).name) << "one definition per metric";
  }
  mp.start_service();
  mp.store(1, KvIndexMode::service);
  mp.store(2, KvIndexMode::service);
  std::string text = prometheus_region_exposition(*mp.pool.region);
  EXPECT_NE(text.find("# TYPE cxlkv_rpc_server_running gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("cxlkv_rpc_server_running{carve=\"rpc.index\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("cxlkv_rpc_clients{carve=\"rpc.index\"} 2\n"), std::string::npos) << text;
  mp.stores.clear();
  mp.stop_service();
  text = prometheus_region_exposition(*mp.pool.region);
  EXPECT_NE(text.find("cxlkv_rpc_server_running{carve=\"rpc.index\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("cxlkv_rpc_clients{carve=\"rpc.index\"} 0\n"), std::string::npos) << text;
}

TEST(RpcMetrics, NoRpcCarveNoRpcFamilies) {
  RpcPool pool("kvm-nometrics", 64ull << 20, {});
  EXPECT_EQ(prometheus_rpc_exposition(*pool.region), "");
}

// ---- what a client holds through the service ends with its claim -------------

// Reservations and pins taken through the service belong to the serving
// node; a client that goes away without aborting or unpinning would leave
// them for good (pins keep blocks unevictable, reservations hold space).
// The service undoes them when the client's claim of its ring ends.

// Puts a one-block chain through `kv` and returns its key.
BlockKey put_one(KvStore& kv, uint64_t tag) {
  auto k = chain(tag, 1);
  std::vector<std::byte> buf(256, std::byte{1});
  std::vector<Chunk> c{Chunk{buf.data(), buf.size()}};
  std::vector<uint32_t> nch{1};
  std::vector<int32_t> st(1);
  auto put = kv.put_chain(nullptr, k, 256, c, nch, st);
  if (!put || put.value() != 1u) throw std::runtime_error("put of block " + std::to_string(tag) + " failed");
  return k[0];
}

// Until the service has closed `claims` client claims (bounded: 10 s).
bool wait_closed(IndexService& svc, uint64_t claims) {
  const auto t0 = Clock::now();
  while (svc.released().claims < claims && Clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return svc.released().claims >= claims;
}

bool writing(PrefixIndex& ix, uint32_t slot, const BlockKey& k) {
  auto e = ix.entry(slot);
  return e.key == k && e.state == CXLKV_ENTRY_WRITING;
}

TEST(KvIndexServiceClients, AClientThatDetachesLeavesNoReservationOrPinBehind) {
  EnvGuard env(nullptr);
  ModePool mp("kvm-gone");
  mp.start_service();
  KvStore& stays = mp.store(2, KvIndexMode::service);
  const BlockKey done = put_one(stays, 9);
  PrefixIndex& ix = store_index(mp.server_session->store());

  auto keys = chain(10, 3);
  std::vector<KvReservation> rs(3);
  std::vector<int32_t> st(3, 99);
  uint32_t pinned_slot = 0;
  {
    auto leaving = mp.open(1, KvIndexMode::service);
    ASSERT_TRUE(leaving) << leaving.error().message();
    KvStore& kv = leaving.value()->store();
    auto r = kv.reserve_chain(nullptr, keys, 256, rs, st);
    ASSERT_TRUE(r && r.value() == 3u);
    auto p = kv.pin(done);
    ASSERT_TRUE(p) << p.error().message();
    pinned_slot = p->slot;
    EXPECT_NE(ix.entry(pinned_slot).pin_mask, 0u);
    for (auto& x : rs) EXPECT_TRUE(writing(ix, x.slot, x.key));
    // Gone without abort or unpin: the session closes (its ring detaches).
  }
  ASSERT_TRUE(wait_closed(*mp.service, 1)) << "the service never saw the client go";
  EXPECT_EQ(mp.service->released().reservations, 3u);
  EXPECT_EQ(mp.service->released().pins, 1u);
  for (auto& x : rs) EXPECT_FALSE(writing(ix, x.slot, x.key)) << "reservation of slot " << x.slot << " left behind";
  EXPECT_EQ(ix.entry(pinned_slot).pin_mask, 0u) << "its pin was not dropped";
  EXPECT_TRUE(ix.remove(done)) << "the block it pinned is not removable (evictable) again";
  std::vector<KvReservation> again(3);
  auto r = stays.reserve_chain(nullptr, keys, 256, again, st);
  ASSERT_TRUE(r) << r.error().message();
  for (int i = 0; i < 3; i++) EXPECT_EQ(st[i], kKvReserved) << "block " << i << " is still held";
  ASSERT_TRUE(stays.abort_many(again, st));
}

// kill -9 of a client process that reserved and pinned through the service:
// its reservations are aborted (their space reused), its pins dropped -- and
// a block that a live client also pins stays pinned until that one unpins.
// The live client's own reservations are untouched.
TEST(KvIndexServiceClients, AKilledClientProcessLosesItsHoldsAndALiveClientsPinOfTheSameBlockStays) {
  EnvGuard env(nullptr);
  // The client process: forked before this test starts any thread.
  rpctest::ForkedClient child([](const std::string& line) -> std::string {
    char uri[256];
    unsigned long long plo = 0, phi = 0, qlo = 0, qhi = 0;
    if (std::sscanf(line.c_str(), "%255s %llu %llu %llu %llu", uri, &plo, &phi, &qlo, &qhi) != 5) return "E bad line";
    auto r = Region::open(uri);
    if (!r) return "E " + r.error().message();
    NodeOptions no;
    no.node = 1;
    auto n = NodeContext::attach(*r.value(), no);
    if (!n) return "E " + n.error().message();
    KvOpenOptions ko;
    ko.index_mode = KvIndexMode::service;
    auto s = open_kv_session(*r.value(), *n.value(), ko);
    if (!s) return "E " + s.error().message();
    KvStore& kv = s.value()->store();
    auto keys = chain(10, 3);
    std::vector<KvReservation> rs(3);
    std::vector<int32_t> st(3);
    auto res = kv.reserve_chain(nullptr, keys, 4096, rs, st);
    if (!res || res.value() != 3) return "E reserve_chain";
    auto p = kv.pin(BlockKey{plo, phi});
    auto q = kv.pin(BlockKey{qlo, qhi});
    if (!p || !q) return "E pin";
    std::string out = "ok " + std::to_string(p->slot) + " " + std::to_string(q->slot);
    for (auto& x : rs) out += " " + std::to_string(x.slot);
    out += " " + n.value()->local_shm_name();
    (void)r.value().release();  // killed with everything held: nothing is torn down
    (void)n.value().release();
    (void)s.value().release();
    return out;
  });
  ModePool mp("kvm-kill");
  mp.start_service();
  KvStore& live = mp.store(2, KvIndexMode::service);
  PrefixIndex& ix = store_index(mp.server_session->store());
  const BlockKey shared = put_one(live, 9), only_dead = put_one(live, 11);
  const auto before = ix.usage();

  child.send(mp.pool.uri + " " + std::to_string(shared.lo) + " " + std::to_string(shared.hi) + " " +
             std::to_string(only_dead.lo) + " " + std::to_string(only_dead.hi));
  std::string report = child.read_line(std::chrono::seconds(60));
  ASSERT_EQ(report.rfind("ok ", 0), 0u) << "the client process: '" << report << "'";
  unsigned ps = 0, qs = 0, r0 = 0, r1 = 0, r2 = 0;
  char local[200] = {};
  ASSERT_EQ(std::sscanf(report.c_str(), "ok %u %u %u %u %u %199s", &ps, &qs, &r0, &r1, &r2, local), 6) << report;
  mp.pool.local_names.push_back(local);  // its node-local file, removed with the pool
  auto keys = chain(10, 3);
  const uint32_t rslots[3] = {r0, r1, r2};
  for (int i = 0; i < 3; i++) ASSERT_TRUE(writing(ix, rslots[i], keys[i])) << i;
  EXPECT_GE(ix.usage().used_bytes, before.used_bytes + 3 * 4096);

  // The live client pins the shared block too, and reserves its own chain.
  auto lp = live.pin(shared);
  ASSERT_TRUE(lp) << lp.error().message();
  ASSERT_EQ(lp->slot, ps);
  auto mine = chain(12, 2);
  std::vector<KvReservation> lrs(2);
  std::vector<int32_t> st(3, 99);
  ASSERT_TRUE(live.reserve_chain(nullptr, mine, 256, lrs, st));
  ASSERT_EQ(st[0], kKvReserved);
  // A client cannot drop another client's pin (the node's count is shared).
  KvPin theirs;
  theirs.key = only_dead;
  theirs.slot = qs;
  auto u = live.unpin(theirs);
  EXPECT_FALSE(u) << "an unpin of a pin this client does not hold went through";
  EXPECT_NE(ix.entry(qs).pin_mask, 0u);

  child.kill9();
  ASSERT_TRUE(wait_closed(*mp.service, 1)) << "the service never judged the killed client dead";
  EXPECT_EQ(mp.service->released().reservations, 3u);
  EXPECT_EQ(mp.service->released().pins, 2u);
  for (int i = 0; i < 3; i++) EXPECT_FALSE(writing(ix, rslots[i], keys[i])) << "reservation " << i << " left behind";
  EXPECT_EQ(ix.usage().used_bytes, before.used_bytes + 2 * 256) << "its reserved space was not given back";
  EXPECT_EQ(ix.entry(qs).pin_mask, 0u) << "the block only it pinned is still pinned";
  EXPECT_TRUE(ix.remove(only_dead)) << "the block only it pinned is not evictable again";
  EXPECT_NE(ix.entry(ps).pin_mask, 0u) << "the live client's pin of the shared block was lost";
  auto busy = ix.remove(shared);
  ASSERT_FALSE(busy) << "a block a live client pins was removable";
  EXPECT_EQ(busy.error().code(), -EBUSY) << busy.error().message();
  // The live client's holds are its own: it publishes, and unpins.
  std::vector<std::byte> buf(256, std::byte{2});
  std::vector<Chunk> ch{Chunk{buf.data(), buf.size()}, Chunk{buf.data(), buf.size()}};
  std::vector<uint32_t> nch{1, 1};
  auto w = live.write_many(lrs, ch, nch, st);
  ASSERT_TRUE(w && w.value() == 2u);
  auto pub = live.publish_many(lrs, st);
  ASSERT_TRUE(pub) << pub.error().message();
  EXPECT_EQ(pub.value(), 2u) << "the live client's reservations were touched";
  ASSERT_TRUE(live.unpin(*lp));
  EXPECT_EQ(ix.entry(ps).pin_mask, 0u);
  EXPECT_TRUE(ix.remove(shared)) << "unpinned by everyone, the shared block is evictable";
  // The killed client's keys can be reserved again.
  std::vector<KvReservation> again(3);
  auto r = live.reserve_chain(nullptr, keys, 4096, again, st);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), 3u);
  for (int i = 0; i < 3; i++) EXPECT_EQ(st[i], kKvReserved) << i;
  ASSERT_TRUE(live.abort_many(again, st));
}

// A ring claimed anew before the server saw it free (the server is paused
// while one client leaves and another takes its ring): the old claim's holds
// are released, never the new claim's.
TEST(KvIndexServiceClients, ARingClaimedAnewReleasesTheOldClaimsHoldsNotTheNewOnes) {
  EnvGuard env(nullptr);
  ModePool mp("kvm-reclaim");
  mp.start_service();
  KvStore& stays = mp.store(2, KvIndexMode::service);  // ring 0
  const BlockKey shared = put_one(stays, 9);
  PrefixIndex& ix = store_index(mp.server_session->store());
  auto old_keys = chain(20, 2), new_keys = chain(21, 2);
  std::vector<KvReservation> old_rs(2), new_rs(2);
  std::vector<int32_t> st(2, 99);

  auto a = mp.open(1, KvIndexMode::service);  // ring 1
  ASSERT_TRUE(a) << a.error().message();
  ASSERT_TRUE(a.value()->store().reserve_chain(nullptr, old_keys, 256, old_rs, st));
  auto ap = a.value()->store().pin(shared);
  ASSERT_TRUE(ap);
  const uint32_t shared_slot = ap->slot;
  const auto& carve = mp.service->server().carve();
  MemoryDomain& d = mp.pool.region->domain();
  ASSERT_EQ(d.read_fresh(carve.client_line(1)).state, uint32_t(CXLKV_RPC_CLIENT_ATTACHED));

  mp.service->server().stop();
  a.value().reset();  // detaches: not seen by the paused server
  std::unique_ptr<KvSession> b;
  std::thread opener([&] {
    auto s = mp.open(3, KvIndexMode::service);  // takes ring 1, waits for the ack
    if (s) b = std::move(s.value());
  });
  const auto t0 = Clock::now();
  while (d.read_fresh(carve.client_line(1)).state != CXLKV_RPC_CLIENT_ATTACHED && Clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  mp.service->server().start();
  opener.join();
  ASSERT_TRUE(b) << "the new client did not connect";
  EXPECT_EQ(mp.service->server().stats().reclaimed, 1u) << "the server did not see ring 1 claimed anew";
  EXPECT_EQ(mp.service->released().claims, 1u);
  EXPECT_EQ(mp.service->released().reservations, 2u);
  EXPECT_EQ(mp.service->released().pins, 1u);
  for (auto& x : old_rs) EXPECT_FALSE(writing(ix, x.slot, x.key));
  EXPECT_EQ(ix.entry(shared_slot).pin_mask, 0u) << "the old claim's pin was not dropped";

  KvStore& kb = b->store();
  ASSERT_TRUE(kb.reserve_chain(nullptr, new_keys, 256, new_rs, st));
  EXPECT_EQ(st[0], kKvReserved);
  auto bp = kb.pin(shared);
  ASSERT_TRUE(bp);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // scans go on: nothing more is released
  EXPECT_EQ(mp.service->released().claims, 1u);
  for (auto& x : new_rs) EXPECT_TRUE(writing(ix, x.slot, x.key)) << "the new claim's reservation was released";
  EXPECT_NE(ix.entry(bp->slot).pin_mask, 0u) << "the new claim's pin was dropped";
  ASSERT_TRUE(kb.abort_many(new_rs, st));
  ASSERT_TRUE(kb.unpin(*bp));
  EXPECT_EQ(ix.entry(bp->slot).pin_mask, 0u);
}

}  // namespace
}  // namespace cxlkv
