// SPDX-License-Identifier: MIT
// Shared-memory RPC on a real shm pool (one process; threads as server and
// clients): replies, many outstanding requests, errors that never hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rpc/rpc_internal.hpp"
#include "support/rpc_test_pool.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using rpctest::RpcPool;

constexpr uint32_t kEcho = 7;

RpcServerOptions small_server(uint32_t lines = 1) {
  RpcServerOptions o;
  o.geometry.rings = 8;
  o.geometry.depth = 64;
  o.geometry.req_lines = lines;
  o.geometry.resp_lines = lines;
  o.spin_rounds = 200;  // tests share two cores: go to yield / sleep soon
  return o;
}

std::unique_ptr<RpcServer> serve_echo(NodeContext& n, const RpcServerOptions& o) {
  auto s = RpcServer::create(n, o);
  if (!s) throw std::runtime_error(s.error().message());
  s.value()->handle(kEcho, rpctest::echo_plus_one());
  s.value()->start();
  return std::move(s.value());
}

// An echo server polled by a thread of the test (not started), until stop():
// after that its lines stay as they are but nobody answers, so a call stays
// in flight.
struct HandPolledServer {
  std::unique_ptr<RpcServer> srv;
  std::atomic<bool> serving{true};
  std::thread t;
  explicit HandPolledServer(NodeContext& n) {
    auto s = RpcServer::create(n, small_server());
    if (!s) throw std::runtime_error(s.error().message());
    srv = std::move(s.value());
    srv->handle(kEcho, rpctest::echo_plus_one());
    t = std::thread([this] {
      while (serving) {
        (void)srv->poll_once();
        std::this_thread::sleep_for(100us);
      }
    });
  }
  void stop() {
    serving = false;
    if (t.joinable()) t.join();
  }
  ~HandPolledServer() { stop(); }
};

std::unique_ptr<RpcClient> connect(NodeContext& n, int ring = -1, std::chrono::milliseconds timeout = 5000ms) {
  RpcClientOptions o;
  o.ring = ring;
  o.timeout = timeout;
  auto c = RpcClient::connect(n, o);
  if (!c) throw std::runtime_error(c.error().message());
  return std::move(c.value());
}

TEST(Rpc, CallReturnsTheHandlersReplyAndStatusForEverySize) {
  RpcPool p("rpc-sizes");
  auto srv = serve_echo(p.attach(0), small_server(4));
  auto cli = connect(p.attach(1));
  ASSERT_EQ(cli->request_max(), 48u + 3 * 56);
  std::vector<std::byte> req, reply(cli->reply_max());
  for (size_t len : {0, 1, 47, 48, 49, 64, 103, 104, 105, 159, 160, 161, 216}) {
    rpctest::fill_request(req, 1, len, len);
    auto r = cli->call(kEcho, req, reply.data(), static_cast<uint32_t>(reply.size()));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->status, int32_t(len));
    EXPECT_TRUE(rpctest::is_echo_plus_one(req, reply.data(), r->len)) << "len " << len;
  }
}

// Every continuation line of a reply carries the reply's flag as a stamp:
// line 0 with its flag while the next line still holds an older message's
// bytes (or is on its way) is not yet a reply; once that line lands it is.
// A client that skipped the stamp check would take the stale bytes.
TEST(Rpc, ReplyIsTakenOnlyWhenEveryLineCarriesItsStamp) {
  for (bool skip_check : {false, true}) {
    SCOPED_TRACE(skip_check ? "stamp check removed" : "stamp check in place");
    RpcPool p(skip_check ? "rpc-stamp-broken" : "rpc-stamp");
    NodeContext& sn = p.attach(0);
    auto srv = serve_echo(sn, small_server(2));
    auto cli = connect(p.attach(1), 0);
    srv->stop();  // the test answers by hand from here on
    MemoryDomain& d = p.domain(0);
    const RpcCarve& carve = srv->carve();
    std::vector<std::byte> req(100), reply(cli->reply_max());
    rpctest::fill_request(req, 1, 1, req.size());
    RpcCall call{kEcho, req, reply.data(), uint32_t(reply.size()), nullptr};
    ASSERT_TRUE(cli->submit({&call, 1}, nullptr));
    const uint64_t flag = d.read_fresh(carve.doorbell(0)).tail;
    auto* slot = carve.resp(0, uint32_t(flag) & (carve.depth() - 1));
    std::vector<std::byte> answer(req.size());
    for (size_t i = 0; i < req.size(); i++) answer[i] = std::byte(uint8_t(req[i]) + 1);
    // Line 1 of an older message (another stamp, other bytes), then line 0 of this one.
    alignas(64) cxlkv_rpc_cont_line old{};
    old.stamp = flag - 1;
    std::memset(old.data, 0xee, sizeof old.data);
    d.publish_line(reinterpret_cast<std::byte*>(slot) + 64, &old);
    alignas(64) cxlkv_rpc_resp_hdr h{};
    h.flag = flag;
    h.status = int32_t(req.size());
    h.len = uint32_t(req.size()) | CXLKV_RPC_LEN_WHOLE;
    std::memcpy(h.data, answer.data(), CXLKV_RPC_INLINE);
    d.publish_line(slot, &h);
    d.fence();
    rpc::testing::set_break_stamp_check(skip_check);
    RpcCompletion done[2];
    auto n = cli->poll(done);
    rpc::testing::set_break_stamp_check(false);
    ASSERT_TRUE(n);
    if (skip_check) {
      ASSERT_EQ(n.value(), 1u) << "without the check the stale line is taken";
      EXPECT_FALSE(rpctest::is_echo_plus_one(req, reply.data(), done[0].len)) << "and its bytes are wrong";
      continue;
    }
    EXPECT_EQ(n.value(), 0u) << "a reply whose line 1 is an older message's is not complete";
    // Line 1 of this reply lands.
    alignas(64) cxlkv_rpc_cont_line c{};
    c.stamp = flag;
    std::memcpy(c.data, answer.data() + CXLKV_RPC_INLINE, req.size() - CXLKV_RPC_INLINE);
    d.publish_line(reinterpret_cast<std::byte*>(slot) + 64, &c);
    d.fence();
    n = cli->poll(done);
    ASSERT_TRUE(n);
    ASSERT_EQ(n.value(), 1u);
    EXPECT_EQ(done[0].status, int32_t(req.size()));
    EXPECT_TRUE(rpctest::is_echo_plus_one(req, reply.data(), done[0].len));
  }
}

TEST(Rpc, ManyOutstandingRequestsCompleteOnceEachInOrder) {
  RpcPool p("rpc-many");
  auto srv = serve_echo(p.attach(0), small_server(2));
  auto cli = connect(p.attach(1));
  const uint32_t depth = cli->depth();
  std::vector<std::vector<std::byte>> reqs(depth * 4), replies(depth * 4, std::vector<std::byte>(cli->reply_max()));
  for (size_t i = 0; i < reqs.size(); i++) rpctest::fill_request(reqs[i], 2, i, i % 100);
  size_t sent = 0, done = 0;
  std::vector<int> seen(reqs.size(), 0);
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (done < reqs.size() && std::chrono::steady_clock::now() < deadline) {
    std::vector<RpcCall> calls;
    for (size_t i = sent; i < reqs.size() && calls.size() < depth; i++)
      calls.push_back(RpcCall{kEcho, reqs[i], replies[i].data(), uint32_t(replies[i].size()), reinterpret_cast<void*>(i)});
    if (!calls.empty()) {
      auto r = cli->submit(calls, nullptr);
      if (r) sent += r.value();
      else ASSERT_EQ(r.error().code(), -EAGAIN) << r.error().message();
    }
    RpcCompletion c[32];
    auto n = cli->poll(c);
    ASSERT_TRUE(n);
    for (size_t k = 0; k < n.value(); k++) {
      size_t i = reinterpret_cast<size_t>(c[k].tag);
      ASSERT_LT(i, reqs.size());
      EXPECT_EQ(i, done + k) << "completions come in submission order";
      seen[i]++;
      EXPECT_EQ(c[k].status, int32_t(reqs[i].size()));
      EXPECT_TRUE(rpctest::is_echo_plus_one(reqs[i], replies[i].data(), c[k].len)) << i;
    }
    done += n.value();
  }
  ASSERT_EQ(done, reqs.size());
  for (size_t i = 0; i < seen.size(); i++) EXPECT_EQ(seen[i], 1) << i;
  EXPECT_EQ(srv->stats().requests, reqs.size());
  EXPECT_LT(srv->stats().batches, reqs.size()) << "the server batches concurrent requests";
}

// An idle ring is polled by its next slot alone (no doorbell miss for a
// lone request): a burst submitted to it is found by its first request, and
// the rest come in the next round through the doorbell, which the server
// reads while the ring stays busy.
TEST(Rpc, IdleRingIsPolledByItsNextSlotAndABurstIsBatchedThroughTheDoorbell) {
  RpcPool p("rpc-hot");
  auto srv = serve_echo(p.attach(0), small_server(2));
  auto cli = connect(p.attach(1));
  srv->stop();  // rounds by hand from here on
  for (int round = 0; round < 3; round++) {
    SCOPED_TRACE("burst " + std::to_string(round));
    auto idle = srv->poll_once();
    ASSERT_TRUE(idle);
    EXPECT_EQ(idle.value(), 0u) << "nothing submitted yet";
    std::vector<std::vector<std::byte>> reqs(5), replies(5, std::vector<std::byte>(cli->reply_max()));
    std::vector<RpcCall> calls;
    for (size_t i = 0; i < reqs.size(); i++) {
      rpctest::fill_request(reqs[i], 3, round * 10 + i, 20 + i * 20);
      calls.push_back(RpcCall{kEcho, reqs[i], replies[i].data(), uint32_t(replies[i].size()), reinterpret_cast<void*>(i)});
    }
    auto sub = cli->submit(calls, nullptr);
    ASSERT_TRUE(sub) << sub.error().message();
    ASSERT_EQ(sub.value(), reqs.size());
    auto first = srv->poll_once();
    ASSERT_TRUE(first);
    EXPECT_EQ(first.value(), 1u) << "an idle ring: its next slot only";
    auto rest = srv->poll_once();
    ASSERT_TRUE(rest);
    EXPECT_EQ(rest.value(), reqs.size() - 1) << "a busy ring: the doorbell announces the rest, one round";
    std::vector<RpcCompletion> done(8);
    size_t got = 0;
    for (int spins = 0; got < reqs.size() && spins < 1000; spins++) {
      auto n = cli->poll(std::span(done.data() + got, done.size() - got));
      ASSERT_TRUE(n);
      got += n.value();
    }
    ASSERT_EQ(got, reqs.size());
    for (size_t k = 0; k < got; k++) {
      size_t i = reinterpret_cast<size_t>(done[k].tag);
      EXPECT_EQ(i, k) << "in submission order";
      EXPECT_TRUE(rpctest::is_echo_plus_one(reqs[i], replies[i].data(), done[k].len)) << i;
    }
  }
}

TEST(Rpc, UnknownOpAndOversizedRequestAreErrorsNotHangs) {
  RpcPool p("rpc-errs");
  auto srv = serve_echo(p.attach(0), small_server());
  auto cli = connect(p.attach(1));
  char reply[64];
  auto r = cli->call(999, {}, reply, sizeof reply);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, -EOPNOTSUPP);
  std::vector<std::byte> big(cli->request_max() + 1);
  auto e = cli->call(kEcho, big, reply, sizeof reply);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), -EMSGSIZE);
  EXPECT_NE(e.error().message().find("rpc carve 'rpc'"), std::string::npos) << e.error().message();
}

TEST(Rpc, ReplyLargerThanTheCallersBufferIsTruncatedAndLenSaysSo) {
  RpcPool p("rpc-trunc");
  auto srv = serve_echo(p.attach(0), small_server(2));
  auto cli = connect(p.attach(1));
  std::vector<std::byte> req;
  rpctest::fill_request(req, 3, 0, 100);
  std::byte reply[10];
  auto r = cli->call(kEcho, req, reply, sizeof reply);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->len, 100u);
  for (int i = 0; i < 10; i++) EXPECT_EQ(reply[i], std::byte(uint8_t(req[i]) + 1));
}

TEST(Rpc, SilentServerGivesETIMEDOUTAndTheLateReplyIsDropped) {
  RpcPool p("rpc-timeout");
  HandPolledServer srv(p.attach(0));
  auto cli = connect(p.attach(1));
  srv.stop();  // connected; now nobody polls
  std::vector<std::byte> req;
  rpctest::fill_request(req, 4, 0, 20);
  std::byte reply[64];
  auto t0 = std::chrono::steady_clock::now();
  auto r = cli->call(kEcho, req, reply, sizeof reply, 50ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), -ETIMEDOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(cli->in_flight(), 0u);
  // The server wakes up and answers the old request: the client drops it
  // (already reported) and the next call gets its own reply.
  srv.srv->start();
  rpctest::fill_request(req, 4, 1, 30);
  auto r2 = cli->call(kEcho, req, reply, sizeof reply, 5s);
  ASSERT_TRUE(r2) << r2.error().message();
  EXPECT_TRUE(rpctest::is_echo_plus_one(req, reply, r2->len));
  EXPECT_EQ(srv.srv->stats().requests, 2u) << "the timed-out request still ran exactly once";
}

TEST(Rpc, StoppedServerGivesECONNRESETAndANewServerIsReachedOnTheNextSubmit) {
  RpcPool p("rpc-restart");
  NodeContext& sn = p.attach(0);
  auto srv = serve_echo(sn, small_server());
  uint32_t epoch1 = srv->epoch();
  auto cli = connect(p.attach(1));
  std::byte reply[64];
  ASSERT_TRUE(cli->call(kEcho, {}, reply, sizeof reply));
  srv.reset();  // STOPPED
  auto t0 = std::chrono::steady_clock::now();
  auto r = cli->call(kEcho, {}, reply, sizeof reply, 10s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), -ECONNRESET) << r.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "a stopped server is noticed within milliseconds";
  auto again = cli->call(kEcho, {}, reply, sizeof reply);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), -ECONNRESET) << "no server to reconnect to";

  srv = serve_echo(sn, small_server());
  EXPECT_EQ(srv->epoch(), epoch1 + 1);
  auto ok = cli->call(kEcho, {}, reply, sizeof reply);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(cli->stats().reconnects, 1u);
}

TEST(Rpc, SecondServerIsRefusedWhileTheFirstRuns) {
  RpcPool p("rpc-busy");
  NodeContext& n0 = p.attach(0);
  auto srv = serve_echo(n0, small_server());
  auto second = RpcServer::create(p.attach(1), small_server());
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), -EBUSY);
  EXPECT_NE(second.error().message().find("a server is running"), std::string::npos);
}

TEST(Rpc, RingOfALiveClientIsBusyAndAutomaticRingsDiffer) {
  RpcPool p("rpc-rings");
  auto srv = serve_echo(p.attach(0), small_server());
  NodeContext& cn = p.attach(1);
  auto a = connect(cn, 3);
  RpcClientOptions o;
  o.ring = 3;
  auto b = RpcClient::connect(cn, o);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), -EBUSY);
  auto c = connect(cn);
  auto d = connect(cn);
  EXPECT_NE(c->ring(), 3u);
  EXPECT_NE(d->ring(), 3u);
  EXPECT_NE(c->ring(), d->ring());
  a.reset();  // detached: the ring is free again
  auto e = connect(cn, 3);
  std::byte reply[64];
  EXPECT_TRUE(e->call(kEcho, {}, reply, sizeof reply));
}

// Two clients that claim one free ring at once both write its client line
// (there are no cross-host atomics); the last write stays.  Here the other
// claim lands after this client's claim was acknowledged -- the widest form
// of that race.  The client finds the other token in the line, fails what it
// had outstanding with -ECONNRESET instead of waiting for replies that the
// server will never send to it, and takes another ring on its next call.
TEST(Rpc, RingClaimedByAnotherClientAtTheSameMomentIsGivenUpAndAnotherRingTaken) {
  RpcPool p("rpc-claim-race");
  auto srv = serve_echo(p.attach(0), small_server());
  NodeContext& cn = p.attach(1);
  auto a = connect(cn, -1, 3000ms);
  std::byte reply[64];
  ASSERT_TRUE(a->call(kEcho, {}, reply, sizeof reply));
  const uint32_t ring = a->ring();

  MemoryDomain& d = p.region->domain();
  cxlkv_rpc_client_line other = d.read_fresh(srv->carve().client_line(ring));
  other.token ^= 0x5a5a5a5a5a5a5a5aull;  // the other client's claim: same process, same inc
  other.start_seq += 1000;
  d.publish_line(srv->carve().client_line(ring), &other);
  d.fence();
  auto t0 = std::chrono::steady_clock::now();
  while (d.read_fresh(srv->carve().ack(ring)).token != other.token) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, 5s) << "the server never served the other claim";
    std::this_thread::sleep_for(1ms);
  }

  t0 = std::chrono::steady_clock::now();
  auto lost = a->call(kEcho, {}, reply, sizeof reply);
  ASSERT_FALSE(lost) << "a reply came for a request on a ring the server serves for another client";
  EXPECT_EQ(lost.error().code(), -ECONNRESET) << lost.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "noticed within milliseconds, not at the call timeout";
  auto ok = a->call(kEcho, {}, reply, sizeof reply);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_NE(a->ring(), ring) << "the ring now belongs to the other claim";
  EXPECT_EQ(a->stats().reconnects, 1u);
}

// on_ring_closed: once per claim of a ring that ends -- the client detached,
// died (kill -9 of a real process), the ring was claimed anew before the
// server saw it free, or the server went away with the claim open -- on the
// polling thread after the claim's last request was answered and before the
// first request of the ring's next claim runs.
TEST(Rpc, EveryClaimOfARingIsClosedOnceBetweenItsLastRequestAndTheNextClaimsFirst) {
  // The dead client: a real process, forked before any thread starts.
  rpctest::ForkedClient dead([](const std::string& uri) -> std::string {
    auto r = Region::open(uri);
    if (!r) return "E " + r.error().message();
    NodeOptions no;
    no.node = 2;
    auto n = NodeContext::attach(*r.value(), no);
    if (!n) return "E " + n.error().message();
    RpcClientOptions o;
    o.ring = 5;
    auto c = RpcClient::connect(*n.value(), o);
    if (!c) return "E " + c.error().message();
    std::byte tag{'d'}, reply[64];
    auto k = c.value()->call(kEcho, {&tag, 1}, reply, sizeof reply);
    if (!k) return "E " + k.error().message();
    std::string local = n.value()->local_shm_name();
    (void)r.value().release();  // killed with its claim open: nothing is torn down
    (void)n.value().release();
    (void)c.value().release();
    return "ok " + local;
  });
  RpcPool p("rpc-closed");
  std::mutex mu;
  std::vector<std::pair<uint32_t, std::string>> events;  // (ring, "req X" / "close why")
  auto count_of = [&](const std::string& what) {
    std::lock_guard<std::mutex> g(mu);
    size_t k = 0;
    for (auto& e : events) k += e.second == what;
    return k;
  };
  auto wait_for = [&](const std::string& what) {
    const auto t0 = std::chrono::steady_clock::now();
    while (count_of(what) == 0 && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(1ms);
    return count_of(what) > 0;
  };
  const char* why_names[] = {"detached", "dead", "reclaimed", "server_stopped"};
  RpcServerOptions o = small_server();
  o.on_ring_closed = [&](uint32_t ring, RpcRingClose why) {
    std::lock_guard<std::mutex> g(mu);
    events.emplace_back(ring, std::string("close ") + why_names[int(why)]);
  };
  auto created = RpcServer::create(p.attach(0), o);
  ASSERT_TRUE(created) << created.error().message();
  std::unique_ptr<RpcServer> srv = std::move(created.value());
  srv->handle(kEcho, [&](const RpcRequest& rq, std::span<std::byte>, uint32_t& len) -> int32_t {
    std::lock_guard<std::mutex> g(mu);
    events.emplace_back(rq.ring, "req " + std::string(1, char(rq.data.empty() ? '?' : char(rq.data[0]))));
    len = 0;
    return 0;
  });
  srv->start();
  NodeContext& cn = p.attach(1);
  std::byte reply[64];
  auto call = [&](RpcClient& c, char tag) {
    std::byte t{uint8_t(tag)};
    auto r = c.call(kEcho, {&t, 1}, reply, sizeof reply);
    ASSERT_TRUE(r) << r.error().message();
  };

  // 1. A client detaches.
  call(*connect(cn, 3), 'a');
  ASSERT_TRUE(wait_for("close detached"));

  // 2. Ring 3 claimed anew before the server sees it free: the server is
  // paused while the client detaches and another claims the ring.
  auto b = connect(cn, 3);
  call(*b, 'b');
  srv->stop();
  b.reset();  // DETACHED, not seen
  std::unique_ptr<RpcClient> c;
  std::thread claimer([&] { c = connect(cn, 3); });  // waits for the server's ack
  MemoryDomain& d = p.region->domain();
  const auto t0 = std::chrono::steady_clock::now();
  while (d.read_fresh(srv->carve().client_line(3)).state != CXLKV_RPC_CLIENT_ATTACHED &&
         std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(1ms);
  srv->start();
  claimer.join();
  ASSERT_TRUE(c);
  call(*c, 'c');
  c.reset();
  ASSERT_TRUE(wait_for("close reclaimed"));
  const auto t1 = std::chrono::steady_clock::now();
  while (count_of("close detached") < 2 && std::chrono::steady_clock::now() - t1 < 10s)
    std::this_thread::sleep_for(1ms);

  // 3. A client process is killed (no detach): judged dead by its pid.
  dead.send(p.uri);
  const std::string report = dead.read_line(30s);
  ASSERT_EQ(report.rfind("ok ", 0), 0u) << "the client process: '" << report << "'";
  p.local_names.push_back(report.substr(3));  // its node-local file, removed with the pool
  dead.kill9();
  ASSERT_TRUE(wait_for("close dead"));

  // 4. A claim still open when the server goes away.
  auto e = connect(cn, 6);
  call(*e, 'e');
  std::this_thread::sleep_for(50ms);  // a few more scans: nothing closes twice
  srv.reset();
  e.reset();

  std::lock_guard<std::mutex> g(mu);
  auto of_ring = [&](uint32_t r) {
    std::vector<std::string> v;
    for (auto& [ring, what] : events)
      if (ring == r) v.push_back(what);
    return v;
  };
  EXPECT_EQ(of_ring(3), (std::vector<std::string>{"req a", "close detached", "req b", "close reclaimed", "req c",
                                                  "close detached"}));
  EXPECT_EQ(of_ring(5), (std::vector<std::string>{"req d", "close dead"}));
  EXPECT_EQ(of_ring(6), (std::vector<std::string>{"req e", "close server_stopped"}));
  EXPECT_EQ(events.size(), 10u) << "no other ring was opened or closed";
}

TEST(Rpc, NoServerMeansECONNREFUSEDAtConnect) {
  RpcPool p("rpc-refused");
  NodeContext& n = p.attach(1);
  auto c = RpcClient::connect(n);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), -ECONNREFUSED);
}

// A damaged ring line was reported as "the server went away before
// replying": the error names the line and the field instead.
TEST(Rpc, ADamagedClientLineIsNamedAsSuchNotAsAServerThatWentAway) {
  RpcPool p("rpc-client-line");
  HandPolledServer srv(p.attach(0));
  auto cli = connect(p.attach(1));
  std::byte reply[64];
  const bool answered = static_cast<bool>(cli->call(kEcho, {}, reply, sizeof reply));
  // Served no more: the next call stays in flight until the client's look
  // at its lines (every server check period) finds the damage.  A call the
  // server answered before that look would succeed, and a look with no call
  // in flight ends in a quiet reconnect that writes the line anew.
  srv.stop();
  ASSERT_TRUE(answered);
  auto carve = RpcCarve::open(*p.region, p.region->domain());
  ASSERT_TRUE(carve) << carve.error().message();
  MemoryDomain& d = p.region->domain();
  cxlkv_rpc_client_line l = d.read_fresh(carve->client_line(cli->ring()));
  l.state = 7;
  d.publish_line(carve->client_line(cli->ring()), &l);  // rule 1: whole line, NT
  d.fence();
  auto r = cli->call(kEcho, {}, reply, sizeof reply, 5s);
  ASSERT_FALSE(r);
  const std::string m = r.error().message();
  EXPECT_NE(m.find("ring " + std::to_string(cli->ring()) + "'s client line is damaged: state 7 is not a client state"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("went away"), std::string::npos) << m;
}

TEST(Rpc, ADamagedServerLineIsNamedAsSuchNotAsAServerThatWentAway) {
  RpcPool p("rpc-server-line");
  HandPolledServer srv(p.attach(0));
  auto cli = connect(p.attach(1));
  srv.stop();  // connected; the server's line stays as damaged below
  auto carve = RpcCarve::open(*p.region, p.region->domain());
  ASSERT_TRUE(carve) << carve.error().message();
  MemoryDomain& d = p.region->domain();
  cxlkv_rpc_server_line l = d.read_fresh(carve->server_line());
  l.state = 9;
  d.publish_line(carve->server_line(), &l);  // rule 1: whole line, NT
  d.fence();
  std::byte reply[64];
  auto r = cli->call(kEcho, {}, reply, sizeof reply, 5s);
  ASSERT_FALSE(r);
  const std::string m = r.error().message();
  EXPECT_NE(m.find("the carve's server line is damaged: state 9 is not a server state"), std::string::npos) << m;
  EXPECT_EQ(m.find("went away"), std::string::npos) << m;
}

TEST(Rpc, CarveHeaderDamageIsReported) {
  RpcPool p("rpc-damage");
  {
    auto srv = serve_echo(p.attach(0), small_server());
  }
  auto ci = p.region->carve(CXLKV_CARVE_RPC).value();
  auto* h = p.region->at<cxlkv_rpc_header>(ci.offset);
  uint32_t depth = 3;  // not a power of two, and the checksum no longer matches
  p.region->domain().write_nt(&h->depth, depth);
  p.region->domain().fence();
  auto c = RpcCarve::open(*p.region, p.region->domain());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), -EINVAL);
  EXPECT_NE(c.error().message().find("checksum"), std::string::npos) << c.error().message();
}

}  // namespace
}  // namespace cxlkv
