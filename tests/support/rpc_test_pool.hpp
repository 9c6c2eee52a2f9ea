// SPDX-License-Identifier: MIT
// Test helper for the RPC tests: a standard shm pool with an "rpc" carve
// (and optionally others), removed at the end; nodes attached on demand,
// optionally each with its own NonCoherentSim cache.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cxlkv/rpc.hpp"
#include "support/pool_fixture.hpp"
#include "support/proc_util.hpp"

namespace cxlkv::rpctest {

// The shared ShmPool (support/pool_fixture.hpp) with, unless a test names
// other carves, the rpc carve the RPC tests put their rings in (2 MiB), for
// 8 nodes.
struct RpcPool : test::ShmPool {
  explicit RpcPool(const std::string& tag, uint64_t size = 64ull << 20,
                   std::vector<std::pair<std::string, uint64_t>> carves = {{CXLKV_CARVE_RPC, 2ull << 20}})
      : ShmPool(tag, size, 8, std::move(carves)) {}
};

// A client in a real separate process: forked before the test starts any
// thread (a fork of a multi-threaded process may inherit a held lock), it
// waits for one line from the test (e.g. the pool's URI), runs body(line),
// writes the line body returns, and then waits to be killed (kill -9: it
// never detaches or cleans up).  The destructor kills and reaps it.
struct ForkedClient {
  explicit ForkedClient(std::function<std::string(const std::string&)> body) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("pipe failed");
    pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      std::string line;
      char c;
      while (read(down[0], &c, 1) == 1 && c != '\n') line += c;
      std::string out = body(line) + "\n";
      if (write(up[1], out.data(), out.size()) != ssize_t(out.size())) _exit(2);
      for (;;) pause();
    }
    close(down[0]);
    close(up[1]);
    to = down[1];
    from = up[0];
  }
  ~ForkedClient() {
    kill9();
    if (to >= 0) close(to);
    if (from >= 0) close(from);
  }
  void send(const std::string& line) {
    std::string l = line + "\n";
    if (write(to, l.data(), l.size()) != ssize_t(l.size())) throw std::runtime_error("write to the child failed");
  }
  // Its report; "" when it did not answer within `limit` (or died).
  std::string read_line(std::chrono::milliseconds limit) {
    std::string line;
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd pf{from, POLLIN, 0};
      if (poll(&pf, 1, int(left.count())) <= 0) continue;
      char c;
      if (read(from, &c, 1) != 1) return "";
      if (c == '\n') return line;
      line += c;
    }
  }
  // kill -9 and reap (a zombie would still look alive by /proc).
  void kill9() {
    if (pid > 0) proc_util::kill_and_reap(pid);
    pid = -1;
  }
  pid_t pid = -1;
  int to = -1, from = -1;
};

// cxlkvd --index-service on the pool `uri` as node 0, in a child process
// (the binary from $CXLKV_TEST_TOOLS, else tools/).  The destructor kills
// it with -9 and reaps it unless stop() or kill9() did already.
struct IndexServiceDaemon {
  explicit IndexServiceDaemon(const std::string& uri) {
    const char* tools = std::getenv("CXLKV_TEST_TOOLS");
    const std::string cxlkvd = std::string(tools ? tools : "tools") + "/cxlkvd";
    pid = fork();
    if (pid == 0) {
      execl(cxlkvd.c_str(), "cxlkvd", "--pool", uri.c_str(), "--node", "0", "--foreground", "--metrics-listen", "none",
            "--index-service", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~IndexServiceDaemon() { kill9(); }
  IndexServiceDaemon(const IndexServiceDaemon&) = delete;
  IndexServiceDaemon& operator=(const IndexServiceDaemon&) = delete;
  // SIGTERM, then reap: the wait status (-1 if it was not running).
  int stop() {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int wst = 0;
    waitpid(pid, &wst, 0);
    pid = -1;
    return wst;
  }
  // kill -9 and reap.
  void kill9() {
    if (pid > 0) proc_util::kill_and_reap(pid);
    pid = -1;
  }
  pid_t pid = -1;
};

// The request each test sends and the reply the echo handler computes: a
// pattern derived from (client, n) so any stale or torn byte is seen.
inline void fill_request(std::vector<std::byte>& buf, uint64_t client, uint64_t n, size_t len) {
  buf.resize(len);
  uint64_t x = client * 0x9e3779b97f4a7c15ull ^ (n + 1) * 0xbf58476d1ce4e5b9ull;
  for (size_t i = 0; i < len; i++) {
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    buf[i] = std::byte(x >> 56);
  }
}
// Echo handler: the reply is the request with every byte + 1; the status is
// the request length.
inline RpcHandler echo_plus_one() {
  return [](const RpcRequest& rq, std::span<std::byte> reply, uint32_t& len) -> int32_t {
    size_t n = std::min(rq.data.size(), reply.size());
    for (size_t i = 0; i < n; i++) reply[i] = std::byte(uint8_t(rq.data[i]) + 1);
    len = static_cast<uint32_t>(n);
    return static_cast<int32_t>(rq.data.size());
  };
}
inline bool is_echo_plus_one(const std::vector<std::byte>& req, const std::byte* reply, uint32_t len) {
  if (len != req.size()) return false;
  for (size_t i = 0; i < req.size(); i++)
    if (reply[i] != std::byte(uint8_t(req[i]) + 1)) return false;
  return true;
}

}  // namespace cxlkv::rpctest
