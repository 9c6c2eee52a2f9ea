// SPDX-License-Identifier: MIT
// Cross-host lock with real processes as nodes on one shm pool: exact
// counts, kill -9 of a holder, kill -9 of the manager (cxlkvd).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/sync.hpp"
#include "pool/format.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/lock_counter_helper";
}
std::string cxlkvd() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/cxlkvd";
}

pid_t spawn(const std::vector<std::string>& argv, int* out_fd = nullptr) {
  int p[2] = {-1, -1};
  if (out_fd && pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (out_fd) {
      dup2(p[1], 1);
      close(p[0]);
    }
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  if (out_fd) {
    close(p[1]);
    *out_fd = p[0];
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct Pool {
  Pool(const char* tag) {
    name = std::string("cxlkv-mp-") + tag + "-" + std::to_string(getpid());
    uri = "shm:" + name + ":64M";
    PoolFormatOptions o;
    o.max_nodes = 8;
    o.max_locks = CXLKV_MIN_LOCKS;
    o.force = true;
    auto r = format_pool(uri, o);
    if (!r) throw std::runtime_error(r.error().message());
    region = std::move(r.value());
  }
  ~Pool() {
    for (uint32_t n = 0; n < 8; n++) NodeContext::unlink_local(NodeContext::default_local_name(*region, n));
    region.reset();
    shm_unlink(("/" + name).c_str());
  }
  uint64_t counter() {
    auto kv = region->carve(CXLKV_CARVE_KV).value();
    return region->domain().read_fresh(region->at<uint64_t>(kv.offset));
  }
  std::string name, uri;
  std::unique_ptr<Region> region;
};

TEST(LockMultiproc, FourProcessesAsFourNodesCountExactly) {
  Pool p("count");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  const int iters = 2000;
  std::vector<pid_t> kids;
  for (int n = 0; n < 4; n++) kids.push_back(spawn({helper(), p.uri, std::to_string(n), std::to_string(iters)}));
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
  mgr.value()->stop();

  EXPECT_EQ(p.counter(), 4u * iters);
}

TEST(LockMultiproc, ProcessesInBurstsKeepAndRevokeStickyGrantsAndCountExactly) {
  Pool p("sticky");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  const int iters = 400;
  std::vector<pid_t> kids;
  for (int n = 0; n < 3; n++)
    kids.push_back(spawn({helper(), p.uri, std::to_string(n), std::to_string(iters), "20"}));
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
  mgr.value()->stop();
  auto st = mgr.value()->stats();

  EXPECT_EQ(p.counter(), 3u * iters);
  EXPECT_GT(st.revokes, 0u) << "no kept grant was revoked";
  EXPECT_LT(st.grants, 3u * iters) << "no acquisition used a kept (sticky) grant";
}

TEST(LockMultiproc, KilledHolderIsRecoveredByTheNextLocalWaiter) {
  Pool p("kill-holder");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  int fd = -1;
  pid_t holder = spawn({helper(), p.uri, "0", "hold"}, &fd);
  char buf[8] = {};
  ASSERT_GT(read(fd, buf, sizeof buf - 1), 0);  // "held": it holds both tiers
  close(fd);
  pid_t other_node = spawn({helper(), p.uri, "1", "10"});  // waits on the global tier
  std::this_thread::sleep_for(100ms);
  kill(holder, SIGKILL);
  wait_exit(holder);

  pid_t same_node = spawn({helper(), p.uri, "0", "10"});  // gets EOWNERDEAD locally
  EXPECT_EQ(wait_exit(same_node), 4);                     // recovered, then counted
  EXPECT_EQ(wait_exit(other_node), 0);                    // no deadlock across nodes
  mgr.value()->stop();
  EXPECT_EQ(p.counter(), 1u + 10u + 10u);
}

TEST(LockMultiproc, KilledManagerIsReplacedWithinTheLease) {
  Pool p("kill-mgr");
  pid_t d1 = spawn({cxlkvd(), "--pool", p.uri, "--foreground", "--lease-ms", "200"});
  std::this_thread::sleep_for(300ms);
  pid_t refused = spawn({cxlkvd(), "--pool", p.uri, "--foreground", "--lease-ms", "200"});
  EXPECT_EQ(wait_exit(refused), 3);  // lease held by a live manager
  pid_t c1 = spawn({helper(), p.uri, "0", "200"});
  EXPECT_EQ(wait_exit(c1), 0);
  kill(d1, SIGKILL);
  wait_exit(d1);

  auto t0 = std::chrono::steady_clock::now();
  pid_t d2 = spawn({cxlkvd(), "--pool", p.uri, "--foreground", "--lease-ms", "200", "--wait"});
  pid_t c2 = spawn({helper(), p.uri, "1", "200"});
  EXPECT_EQ(wait_exit(c2), 0);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 5s);  // lease (200 ms) + settle + work
  kill(d2, SIGTERM);
  EXPECT_EQ(wait_exit(d2), 0);  // clean shutdown frees the lease
  EXPECT_EQ(p.counter(), 400u);
}

}  // namespace
}  // namespace cxlkv
