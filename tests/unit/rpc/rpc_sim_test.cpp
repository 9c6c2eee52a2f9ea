// SPDX-License-Identifier: MIT
// The RPC protocol under NonCoherentSim: the server and each client are
// simulated hosts with private write-back caches, random evictions, NT
// stores and flushes held back until a fence, random prefetches.  Every
// reply must be the handler's answer to that very request; with one
// invalidate or flush of the protocol removed, the same run fails.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "rpc/rpc_internal.hpp"
#include "support/rpc_test_pool.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using rpctest::RpcPool;

constexpr uint32_t kEcho = 7;

struct SimRun {
  uint64_t ok = 0, wrong = 0, errors = 0;
  uint64_t requests_run = 0;
};

// Server on simulated node 0, `clients` clients on nodes 1..clients, each
// sending `per_client` requests of 0..180 bytes, `qd` outstanding at a time.
// A client stops at its first wrong reply or error (a broken protocol would
// otherwise time out request after request).
SimRun run_sim(uint32_t clients, uint32_t per_client, uint32_t qd, NonCoherentSimOptions so,
               std::chrono::milliseconds timeout = 10000ms) {
  RpcPool p("rpc-sim");
  p.simulate(clients + 1, so);
  NodeContext& sn = p.attach(0);
  RpcServerOptions o;
  o.geometry.rings = 4;
  o.geometry.depth = 16;
  o.geometry.req_lines = 4;
  o.geometry.resp_lines = 4;
  o.spin_rounds = 50;
  o.max_sleep = 50us;
  auto s = RpcServer::create(sn, o);
  if (!s) throw std::runtime_error(s.error().message());
  s.value()->handle(kEcho, rpctest::echo_plus_one());
  s.value()->start();
  std::vector<NodeContext*> cn;
  for (uint32_t c = 1; c <= clients; c++) cn.push_back(&p.attach(c));
  std::atomic<uint64_t> ok{0}, wrong{0}, errors{0};
  std::vector<std::thread> th;
  for (uint32_t c = 0; c < clients; c++) {
    th.emplace_back([&, c] {
      RpcClientOptions co;
      co.timeout = timeout;  // default generous: the simulator is slow and make test runs it beside other tests
      auto cl = RpcClient::connect(*cn[c], co);
      if (!cl) {
        ADD_FAILURE() << cl.error().message();
        errors++;
        return;
      }
      RpcClient& client = *cl.value();
      std::vector<std::vector<std::byte>> req(per_client), rep(per_client, std::vector<std::byte>(client.reply_max()));
      for (uint32_t i = 0; i < per_client; i++) rpctest::fill_request(req[i], c, i, (i * 37 + c * 11) % 181);
      uint32_t sent = 0, done = 0;
      bool stop = false;
      while (done < per_client && !stop) {
        while (sent < per_client && sent - done < qd) {
          RpcCall call{kEcho, req[sent], rep[sent].data(), uint32_t(rep[sent].size()), reinterpret_cast<void*>(uintptr_t(sent))};
          auto r = client.submit({&call, 1}, nullptr);
          if (!r) {
            errors++;
            stop = true;
            break;
          }
          sent++;
        }
        RpcCompletion cc[8];
        auto n = client.poll(cc);
        for (size_t k = 0; n && k < n.value(); k++) {
          uint32_t i = uint32_t(reinterpret_cast<uintptr_t>(cc[k].tag));
          done++;
          if (cc[k].status < 0) {
            errors++;
            stop = true;
          } else if (cc[k].status != int32_t(req[i].size()) || !rpctest::is_echo_plus_one(req[i], rep[i].data(), cc[k].len)) {
            wrong++;
            stop = true;
          } else {
            ok++;
          }
        }
        if (n && n.value() == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : th) t.join();
  SimRun out{ok.load(), wrong.load(), errors.load(), s.value()->stats().requests};
  s.value().reset();
  return out;
}

NonCoherentSimOptions harsh(uint64_t seed) {
  NonCoherentSimOptions so;
  so.evict_probability = 0.05;
  so.seed = seed;
  so.buffer_until_fence = true;
  so.prefetch_probability = 0.01;
  return so;
}

TEST(RpcSim, EveryReplyIsTheAnswerToItsRequestUnderEvictionsAndBufferedStores) {
  for (uint64_t seed : {1, 2}) {
    SimRun r = run_sim(2, 120, 6, harsh(seed));
    EXPECT_EQ(r.wrong, 0u) << "seed " << seed;
    EXPECT_EQ(r.errors, 0u) << "seed " << seed;
    EXPECT_EQ(r.ok, 240u) << "seed " << seed;
    EXPECT_EQ(r.requests_run, 240u) << "each request ran exactly once, seed " << seed;
  }
}

TEST(RpcSim, QueueDepthOneUnderEvictions) {
  SimRun r = run_sim(1, 150, 1, harsh(7));
  EXPECT_EQ(r.wrong + r.errors, 0u);
  EXPECT_EQ(r.ok, 150u);
}

// call() leaves its request's last fence to its first poll's fence (one
// mfence for rule 3 and rule 4), and the server leaves its replies' to its
// next round's.  With NT stores held back until a fence, every call still
// gets its own answer: the deferred fences come, on both sides.
TEST(RpcSim, CallsAtQueueDepthOneUnderEvictionsAndBufferedStores) {
  for (bool two_phase : {false, true}) {
    SCOPED_TRACE(two_phase ? "two-phase publication" : "whole lines");
    rpc::testing::set_force_two_phase(two_phase);
    struct Restore {
      ~Restore() { rpc::testing::set_force_two_phase(false); }
    } restore;
    RpcPool p("rpc-sim-call");
    p.simulate(2, harsh(two_phase ? 21 : 22));
    RpcServerOptions o;
    o.geometry.rings = 2;
    o.geometry.depth = 8;
    o.geometry.req_lines = 4;
    o.geometry.resp_lines = 4;
    o.spin_rounds = 50;
    o.max_sleep = 50us;
    auto s = RpcServer::create(p.attach(0), o);
    ASSERT_TRUE(s) << s.error().message();
    s.value()->handle(kEcho, rpctest::echo_plus_one());
    s.value()->start();
    RpcClientOptions co;
    co.timeout = 10000ms;
    auto cl = RpcClient::connect(p.attach(1), co);
    ASSERT_TRUE(cl) << cl.error().message();
    uint32_t ok = 0;
    for (uint32_t i = 0; i < 100; i++) {
      std::vector<std::byte> req, rep(cl.value()->reply_max());
      req.resize((i * 29) % 181);
      rpctest::fill_request(req, 1, i, req.size());
      auto r = cl.value()->call(kEcho, req, rep.data(), uint32_t(rep.size()));
      ASSERT_TRUE(r) << "call " << i << ": " << r.error().message();
      ASSERT_EQ(r->status, int32_t(req.size())) << "call " << i;
      ASSERT_TRUE(rpctest::is_echo_plus_one(req, rep.data(), r->len)) << "call " << i;
      ok++;
    }
    cl.value().reset();
    EXPECT_EQ(s.value()->stats().requests, 100u) << "each call ran exactly once";
    s.value().reset();
    EXPECT_EQ(ok, 100u);
  }
}

// Writers that cannot store a line in one piece (no movdir64b) publish in
// two phases: every line with flag word 0, fence, the flags, fence.  The
// same workload stays exact on that path.
TEST(RpcSim, TwoPhasePublicationForCpusWithoutWholeLineStores) {
  rpc::testing::set_force_two_phase(true);
  SimRun r = run_sim(2, 100, 6, harsh(11));
  SimRun one = run_sim(1, 80, 1, harsh(12));
  rpc::testing::set_force_two_phase(false);
  EXPECT_EQ(r.wrong + r.errors, 0u);
  EXPECT_EQ(r.ok, 200u);
  EXPECT_EQ(r.requests_run, 200u) << "each request ran exactly once";
  EXPECT_EQ(one.wrong + one.errors, 0u);
  EXPECT_EQ(one.ok, 80u);
}

struct Broken {
  void (*set)(bool);
};

// A removed invalidate on either side, or a reply written with plain stores
// and no flush: the same workload must fail (stale request or reply seen,
// never answered, or wrong bytes).
TEST(RpcSim, MissingInvalidateOrFlushIsCaught) {
  struct Case {
    const char* name;
    void (*set)(bool);
  } cases[] = {
      {"server loads requests without invalidating", rpc::testing::set_break_request_invalidate},
      {"client polls replies without invalidating", rpc::testing::set_break_reply_invalidate},
      {"server writes reply payload without flush", rpc::testing::set_break_reply_flush},
  };
  for (const Case& c : cases) {
    c.set(true);
    NonCoherentSimOptions so;
    so.evict_probability = 0;  // no evictions: a stale line stays until invalidated
    so.buffer_until_fence = true;
    so.seed = 3;
    // A broken run ends at its first wrong reply or error; a request that
    // is never answered fails at this (shorter) timeout.
    SimRun r = run_sim(2, 60, 4, so, 2000ms);
    c.set(false);
    EXPECT_GT(r.wrong + r.errors, 0u) << c.name << ": the broken protocol went unnoticed (" << r.ok << " ok)";
  }
}

}  // namespace
}  // namespace cxlkv
