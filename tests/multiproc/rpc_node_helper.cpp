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
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/rpc.hpp"
#include "cxlkv/sync.hpp"

using namespace cxlkv;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kRecord = 1;
std::atomic<bool> g_stop{false};

struct Msg {
  uint64_t client, n, pid;
};

std::unique_ptr<NodeContext> attach(Region& r, uint32_t node) {
  NodeOptions o;
  o.node = node;
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: see the comment at the top of rpc_node_helper.cpp\n");
    return 2;
  }
  std::string mode = argv[1];
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
