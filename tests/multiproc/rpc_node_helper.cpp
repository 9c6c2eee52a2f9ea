// SPDX-License-Identifier: MIT
// A process of the RPC multi-process tests (tests/multiproc/rpc_crash_test.cpp).
//
//   rpc_node_helper server URI NODE LOG
//       serves op 1 (RECORD): appends "client n server_pid" to LOG (O_APPEND,
//       one write per request, before the reply) and replies {client, n, pid}.
//       Prints READY once serving; runs until killed (SIGTERM: clean stop).
//   rpc_node_helper client URI NODE CLIENT COUNT QD OUT [RING]
//       sends requests n = 0 .. COUNT-1 of client CLIENT with up to QD
//       outstanding; appends one line "n status" per request to OUT as its
//       outcome arrives (status 0 = the right reply, else the negative errno);
//       a request not accepted (no server) is retried until one is (it has no
//       outcome yet).  Prints READY once connected, DONE at the end.
//   rpc_node_helper vmserver URI NODE N       (make vm-test, guest twohost0)
//   rpc_node_helper vmclient URI NODE N       (guest twohost1)
//       the two-host check: the server formats the pool (standard layout plus
//       an "rpc" carve; the module's format=1 writes only the control carve)
//       and, with its heartbeat on so the other host can judge it alive,
//       answers echo requests until it has answered 2N; the client waits for
//       a running server in a freshly read pool, sends N requests at queue
//       depth 1 and N at queue depth 16 and checks every reply byte.  Exit 0:
//       all correct.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/rpc.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"

using namespace cxlkv;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kRecord = 1;
std::atomic<bool> g_stop{false};

struct Msg {
  uint64_t client, n, pid;
};

std::unique_ptr<NodeContext> attach(Region& r, uint32_t node, bool heartbeat = false) {
  NodeOptions o;
  o.node = node;
  o.heartbeat = heartbeat;
  auto n = NodeContext::attach(r, o);
  if (!n) {
    fprintf(stderr, "attach: %s\n", n.error().message().c_str());
    exit(2);
  }
  return std::move(n.value());
}

int server(Region& r, uint32_t node, const char* log_path) {
  auto nc = attach(r, node);
  int log = ::open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log < 0) return 2;
  RpcServerOptions o;
  o.spin_rounds = 2000;  // two cores shared by every process of the test
  std::unique_ptr<RpcServer> srv;
  for (int i = 0; i < 500 && !srv; i++) {  // the killed predecessor may still be being reaped
    auto s = RpcServer::create(*nc, o);
    if (s) srv = std::move(s.value());
    else if (s.error().code() != -EBUSY) {
      fprintf(stderr, "server: %s\n", s.error().message().c_str());
      return 2;
    } else std::this_thread::sleep_for(10ms);
  }
  if (!srv) return 3;
  const uint64_t me = getpid();
  srv->handle(kRecord, [&](const RpcRequest& rq, std::span<std::byte> reply, uint32_t& len) -> int32_t {
    Msg m{};
    if (rq.data.size() != sizeof m) return -EINVAL;
    std::memcpy(&m, rq.data.data(), sizeof m);
    char line[96];
    int k = snprintf(line, sizeof line, "%llu %llu %llu\n", (unsigned long long)m.client, (unsigned long long)m.n,
                     (unsigned long long)me);
    if (::write(log, line, size_t(k)) != k) return -EIO;  // the execution record, before the reply
    m.pid = me;
    std::memcpy(reply.data(), &m, sizeof m);
    len = sizeof m;
    return 0;
  });
  signal(SIGTERM, [](int) { g_stop = true; });
  printf("READY\n");
  fflush(stdout);
  auto r2 = srv->run(g_stop);
  return r2 ? 0 : 4;
}

int client(Region& r, uint32_t node, uint64_t id, uint64_t count, uint32_t qd, const char* out_path, int ring) {
  auto nc = attach(r, node);
  FILE* out = fopen(out_path, "a");
  if (!out) return 2;
  RpcClientOptions o;
  o.ring = ring;
  o.timeout = 20s;  // outcomes are replies or resets here; a timeout would be a bug on this host
  std::unique_ptr<RpcClient> cli;
  for (int i = 0; i < 1000 && !cli; i++) {
    auto c = RpcClient::connect(*nc, o);
    if (c) cli = std::move(c.value());
    else std::this_thread::sleep_for(10ms);
  }
  if (!cli) return 3;
  printf("READY\n");
  fflush(stdout);
  std::vector<Msg> req(count), rep(count);
  uint64_t sent = 0, done = 0;
  while (done < count) {
    while (sent < count && sent - done < qd) {
      req[sent] = Msg{id, sent, 0};
      RpcCall c{kRecord, {reinterpret_cast<const std::byte*>(&req[sent]), sizeof(Msg)}, &rep[sent], sizeof(Msg),
                reinterpret_cast<void*>(uintptr_t(sent))};
      auto s = cli->submit({&c, 1}, nullptr);
      if (!s) {
        if (s.error().code() == -ECONNRESET || s.error().code() == -ETIMEDOUT) std::this_thread::sleep_for(2ms);
        break;  // not accepted: retried later (no outcome yet)
      }
      sent++;
    }
    RpcCompletion cc[16];
    auto n = cli->poll(cc);
    if (!n) return 4;
    for (size_t k = 0; k < n.value(); k++) {
      uint64_t i = uintptr_t(cc[k].tag);
      int st = cc[k].status;
      if (st == 0 && (cc[k].len != sizeof(Msg) || rep[i].client != id || rep[i].n != i)) st = -EBADMSG;
      fprintf(out, "%llu %d\n", (unsigned long long)i, st);
      done++;
    }
    fflush(out);
    if (n.value() == 0) std::this_thread::yield();
  }
  fclose(out);
  printf("DONE\n");
  fflush(stdout);
  return 0;
}


constexpr uint32_t kEcho = 2;

int vmserver(const char* uri, uint32_t node, uint64_t n) {
  PoolFormatOptions fo;
  fo.force = true;
  fo.extra_carves = {{CXLKV_CARVE_RPC, 2ull << 20}};
  auto fr = format_pool(uri, fo);
  if (!fr) {
    printf("rpc: format: %s\n", fr.error().message().c_str());
    return 2;
  }
  Region& r = *fr.value();
  auto nc = attach(r, node, true);
  RpcServerOptions o;
  o.geometry.rings = 4;
  o.geometry.depth = 16;
  o.geometry.req_lines = 2;
  o.geometry.resp_lines = 2;
  o.spin_rounds = 100;  // one emulated CPU per guest
  auto s = RpcServer::create(*nc, o);
  if (!s) {
    printf("rpc: server: %s\n", s.error().message().c_str());
    return 2;
  }
  std::atomic<uint64_t> served{0};
  s.value()->handle(kEcho, [&](const RpcRequest& rq, std::span<std::byte> reply, uint32_t& len) -> int32_t {
    for (size_t i = 0; i < rq.data.size(); i++) reply[i] = std::byte(uint8_t(rq.data[i]) ^ 0xa5);
    len = uint32_t(rq.data.size());
    served++;
    return int32_t(rq.seq & 0x7fff);
  });
  printf("rpc: server epoch %u on node %u\n", s.value()->epoch(), node);
  fflush(stdout);
  auto t0 = std::chrono::steady_clock::now();
  while (served < 2 * n && std::chrono::steady_clock::now() - t0 < 150s) (void)s.value()->poll_once();
  // Keep answering a little longer: the client's last replies are out, but
  // it may still be reading them.
  auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t1 < 2s) (void)s.value()->poll_once();
  printf("rpc: server answered %llu requests\n", (unsigned long long)served.load());
  return served >= 2 * n ? 0 : 1;
}

int vmclient(const char* uri, uint32_t node, uint64_t n) {
  // Wait until the other host has formatted the pool and runs the server.
  std::unique_ptr<Region> rp;
  auto w0 = std::chrono::steady_clock::now();
  while (!rp && std::chrono::steady_clock::now() - w0 < 150s) {
    auto o = Region::open(uri);
    if (o) {
      auto c = RpcCarve::open(*o.value(), o.value()->domain());
      if (c && o.value()->domain().read_fresh(c->server_line()).state == CXLKV_RPC_SERVER_RUNNING) {
        rp = std::move(o.value());
        break;
      }
    }
    std::this_thread::sleep_for(200ms);
  }
  if (!rp) {
    printf("rpc: no server ever ran on %s\n", uri);
    return 2;
  }
  Region& r = *rp;
  auto nc = attach(r, node, true);
  RpcClientOptions o;
  o.timeout = 30s;
  o.connect_timeout = 10s;
  std::unique_ptr<RpcClient> cli;
  auto t0 = std::chrono::steady_clock::now();
  std::string last;
  while (!cli && std::chrono::steady_clock::now() - t0 < 150s) {
    auto c = RpcClient::connect(*nc, o);
    if (c) cli = std::move(c.value());
    else {
      last = c.error().message();
      std::this_thread::sleep_for(50ms);
    }
  }
  if (!cli) {
    printf("rpc: client never connected: %s\n", last.c_str());
    return 2;
  }
  uint64_t bad = 0;
  std::vector<double> us;
  std::vector<std::byte> req(64), rep(64);
  for (uint64_t i = 0; i < n; i++) {
    for (size_t k = 0; k < req.size(); k++) req[k] = std::byte(uint8_t(i * 31 + k));
    size_t len = 1 + i % 64;
    auto c0 = std::chrono::steady_clock::now();
    auto rr = cli->call(kEcho, {req.data(), len}, rep.data(), uint32_t(rep.size()));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count());
    if (!rr || rr->len != len) {
      bad++;
      printf("rpc: call %llu: %s\n", (unsigned long long)i, rr ? "wrong length" : rr.error().message().c_str());
      continue;
    }
    for (size_t k = 0; k < len; k++) bad += rep[k] != (req[k] ^ std::byte(0xa5));
  }
  // Queue depth 16.
  std::vector<std::vector<std::byte>> reqs(n, std::vector<std::byte>(40)), reps(n, std::vector<std::byte>(64));
  uint64_t sent = 0, done = 0;
  auto t1 = std::chrono::steady_clock::now();
  while (done < n && std::chrono::steady_clock::now() - t1 < 120s) {
    while (sent < n && sent - done < 16) {
      for (size_t k = 0; k < 40; k++) reqs[sent][k] = std::byte(uint8_t(sent + 7 * k));
      RpcCall c{kEcho, reqs[sent], reps[sent].data(), 64, reinterpret_cast<void*>(uintptr_t(sent))};
      auto sr = cli->submit({&c, 1}, nullptr);
      if (!sr) break;
      sent++;
    }
    RpcCompletion cc[16];
    auto k = cli->poll(cc);
    if (!k) return 3;
    for (size_t j = 0; j < k.value(); j++) {
      uint64_t i = uintptr_t(cc[j].tag);
      if (cc[j].status < 0 || cc[j].len != 40) bad++;
      else
        for (size_t b = 0; b < 40; b++) bad += reps[i][b] != (reqs[i][b] ^ std::byte(0xa5));
      done++;
    }
  }
  std::sort(us.begin(), us.end());
  printf("rpc: two hosts: %llu calls at depth 1 (p50 %.0f us under TCG), %llu at depth 16, %llu bad\n",
         (unsigned long long)n, us.empty() ? 0.0 : us[us.size() / 2], (unsigned long long)done,
         (unsigned long long)bad);
  return bad == 0 && done == n ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: see the comment at the top of rpc_node_helper.cpp\n");
    return 2;
  }
  std::string mode = argv[1];
  if (mode == "vmserver") return vmserver(argv[2], uint32_t(atoi(argv[3])), strtoull(argv[4], nullptr, 10));
  if (mode == "vmclient") return vmclient(argv[2], uint32_t(atoi(argv[3])), strtoull(argv[4], nullptr, 10));
  auto r = Region::open(argv[2]);
  if (!r) {
    fprintf(stderr, "open: %s\n", r.error().message().c_str());
    return 2;
  }
  uint32_t node = uint32_t(atoi(argv[3]));
  if (mode == "server") return server(*r.value(), node, argv[4]);

  if (mode == "client" && argc >= 8)
    return client(*r.value(), node, strtoull(argv[4], nullptr, 10), strtoull(argv[5], nullptr, 10),
                  uint32_t(atoi(argv[6])), argv[7], argc > 8 ? atoi(argv[8]) : -1);
  return 2;
}
