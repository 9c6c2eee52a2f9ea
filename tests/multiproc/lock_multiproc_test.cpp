// SPDX-License-Identifier: MIT
// Cross-host lock with real processes as nodes on one shm pool: exact
// counts, kill -9 of a holder, kill -9 of the manager (cxlkvd).
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
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
#include "helper_pool.hpp"
#include "support/proc_util.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using proc_util::spawn;
using proc_util::wait_exit;
using proc_util::wait_within;

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/lock_counter_helper";
}
std::string cxlkvctl() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/cxlkvctl";
}
std::string cxlkvd() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/cxlkvd";
}

// Start `argv` and wait for its first stdout line ("held").
pid_t spawn_holder(const std::vector<std::string>& argv) {
  int fd = -1;
  pid_t pid = spawn(argv, &fd);
  char buf[8] = {};
  if (read(fd, buf, sizeof buf - 1) <= 0) ADD_FAILURE() << "holder " << argv[2] << " did not report 'held'";
  close(fd);
  return pid;
}

using Pool = testpool::HelperPool;

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

TEST(LockMultiproc, KilledHolderOnAnotherNodeIsPassedOverWithoutEvict) {
  Pool p("dead-holder");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  pid_t holder = spawn_holder({helper(), p.uri, "0", "hold"});
  pid_t waiter = spawn({helper(), p.uri, "1", "5"});  // waits on the global tier
  std::this_thread::sleep_for(100ms);
  kill(holder, SIGKILL);
  wait_exit(holder);

  // No `node evict`: the manager sees node 0's process gone and grants node 1.
  EXPECT_EQ(wait_within(waiter, 5000ms, "node 1 to get the lock of killed node 0"), 0);
  auto st = mgr.value()->stats();
  mgr.value()->stop();
  EXPECT_EQ(p.counter(), 1u + 5u);
  EXPECT_GE(st.dead_holders, 1u);
}

// One line of a helper's stdout (without the newline); "" at its end.
std::string read_line(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

// A helper in a pid namespace of its own (another host for liveness):
// the wrapper's pid, the worker's pid (the one to kill) and its stdout.
struct OtherHost {
  pid_t wrapper = -1, worker = -1;
  int fd = -1;
  explicit OtherHost(std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/usr/bin/env", "CXLKV_HELPER_OWN_PIDNS=1"});
    wrapper = spawn(argv, &fd);
    const std::string l = read_line(fd);
    if (l.rfind("PID ", 0) == 0) worker = std::atoi(l.c_str() + 4);
    else ADD_FAILURE() << "helper in its own pid namespace said '" << l << "', not its PID";
  }
  ~OtherHost() {
    if (worker > 0) kill(worker, SIGKILL);
    if (wrapper > 0) wait_exit(wrapper);
    if (fd >= 0) close(fd);
  }
};

TEST(LockMultiproc, HolderKilledOnAnotherHostWhileItsNodeLivesIsReleasedByItsNode) {
  // Node 1 runs on another host (its own pid namespace) and holds the lock
  // with a CONTENDED grant (node 2 waits); kill -9 of its holder while
  // another process keeps node 1 alive.  The manager cannot see node 1's
  // processes: it asks node 1, whose watcher (in the successor) recovers
  // the dead holder's node-local mutex and releases (uapi "Dead processes
  // of live nodes").  Without it node 2 waited 30 s per try.
  Pool p("dead-remote");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  pid_t h0 = spawn_holder({helper(), p.uri, "0", "hold"});  // node 0 (this host) holds
  OtherHost h1({helper(), p.uri, "1", "hold"});            // node 1 waits
  ASSERT_GT(h1.worker, 0);
  std::this_thread::sleep_for(200ms);
  pid_t waiter = spawn({helper(), p.uri, "2", "5"});        // node 2 waits
  std::this_thread::sleep_for(200ms);
  kill(h0, SIGKILL);  // node 0 dies whole: round-robin grants node 1, CONTENDED
  wait_exit(h0);
  ASSERT_EQ(read_line(h1.fd), "held");
  OtherHost successor({helper(), p.uri, "1", "idle"});      // node 1 lives on
  ASSERT_EQ(read_line(successor.fd), "attached");
  kill(h1.worker, SIGKILL);

  EXPECT_EQ(wait_within(waiter, 5000ms, "node 2 to get the lock of node 1's killed holder"), 0);
  auto st = mgr.value()->stats();
  mgr.value()->stop();
  EXPECT_GE(st.asks, 1u) << "the manager never asked node 1";
  // Node 0 was passed over (dead node); node 1, alive, released for its
  // dead holder itself: had the manager judged node 1 dead, this were 2.
  EXPECT_EQ(st.dead_holders, 1u);
  EXPECT_EQ(p.counter(), 1u + 1u + 5u);
}

TEST(LockMultiproc, ANodeOfAnotherHostPausedPastItsHeartbeatDoesNotReenterTheGrantItKept) {
  // Node 3 runs on another host (its own pid namespace) and takes the lock
  // again and again, keeping the grant between turns (sticky).  Paused
  // (SIGSTOP) past kNodeStaleMs, it is judged dead and its kept grant goes
  // to node 1.  Resumed while node 1 is inside, it must not re-enter on
  // node-local memory: its heartbeat lapsed, so its kept grants are given up
  // and asked for anew (docs/locks.md "Heartbeat lapses").
  Pool p("lapse");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  OtherHost h3({helper(), p.uri, "3", "inside"});
  ASSERT_GT(h3.worker, 0);
  ASSERT_EQ(read_line(h3.fd), "looping");
  ASSERT_EQ(kill(h3.worker, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(kNodeStaleMs + 500));  // its heartbeat is stale

  NodeOptions no;
  no.node = 1;
  auto n1 = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n1.ok()) << n1.error().message();
  TwoTierLock l1(*n1.value(), CXLKV_LOCK_FIRST_USER);
  auto kv = p.region->carve(CXLKV_CARVE_KV).value();
  auto* mark = p.region->at<uint64_t>(kv.offset) + 1;
  MemoryDomain& d = p.region->domain();
  {
    auto g = LockGuard::take_for(l1, 10s, {mark - 1, 64});
    ASSERT_TRUE(g.ok()) << g.error().message();
    d.write(mark, uint64_t{1});
    d.flush(mark, sizeof *mark);  // rule 3: node 3 reads the mark while we are inside
    d.fence();
    ASSERT_EQ(kill(h3.worker, SIGCONT), 0);
    std::this_thread::sleep_for(1500ms);  // node 3 runs: it must wait for us
    EXPECT_EQ(d.read_fresh(mark), 1u) << "node 3 went inside while node 1 was";
    d.write(mark, uint64_t{0});  // the guard flushes it before release (rule 3)
  }
  // Node 3 gets the lock after us and goes on; "TWO HOLDERS" would be its last word.
  std::this_thread::sleep_for(500ms);
  pollfd pf{h3.fd, POLLIN, 0};
  std::string said;
  while (poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN)) {
    const std::string l = read_line(h3.fd);
    if (l.empty()) break;
    said += l + "\n";
  }
  EXPECT_EQ(said.find("TWO HOLDERS"), std::string::npos) << said;
  int st = 0;
  EXPECT_EQ(waitpid(h3.wrapper, &st, WNOHANG), 0) << "node 3 exited: " << said;
  mgr.value()->stop();
}

TEST(LockMultiproc, KilledWaiterIsSkippedAndTheNextWaiterGetsTheLock) {
  Pool p("dead-waiter");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  NodeOptions no;
  no.node = 0;
  auto n0 = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n0.ok()) << n0.error().message();
  TwoTierLock l0(*n0.value(), CXLKV_LOCK_FIRST_USER);
  ASSERT_TRUE(l0.lock().ok());
  pid_t dead = spawn({helper(), p.uri, "1", "5"});  // next in round-robin order after node 0
  std::this_thread::sleep_for(200ms);
  kill(dead, SIGKILL);
  wait_exit(dead);
  pid_t next = spawn({helper(), p.uri, "2", "5"});
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(l0.unlock().ok());

  EXPECT_EQ(wait_within(next, 5000ms, "node 2 to get the lock past killed waiter node 1"), 0);
  auto st = mgr.value()->stats();
  mgr.value()->stop();
  EXPECT_EQ(p.counter(), 5u);
  EXPECT_GE(st.dead_waiters, 1u);
}

TEST(LockMultiproc, KilledManagerHostThatHeldTheLockIsRecoveredByASuccessor) {
  Pool p("dead-mgr-host");
  pid_t host = spawn_holder({helper(), p.uri, "0", "mgrhold"});  // manager + holder in one process
  pid_t waiter = spawn({helper(), p.uri, "1", "5"});
  std::this_thread::sleep_for(100ms);
  kill(host, SIGKILL);
  wait_exit(host);
  pid_t d2 = spawn({cxlkvd(), "--pool", p.uri, "--foreground", "--lease-ms", "300", "--wait"});

  // The successor takes the expired lease, adopts the grant of dead node 0,
  // sees its process gone and grants node 1.
  EXPECT_EQ(wait_within(waiter, 8000ms, "node 1 to get the lock after the manager host died holding it"), 0);
  kill(d2, SIGTERM);
  EXPECT_EQ(wait_within(d2, 5000ms, "cxlkvd to stop on SIGTERM"), 0);
  EXPECT_EQ(p.counter(), 1u + 5u);
}

TEST(LockMultiproc, StoppedHolderIsAliveAndATimedOutAcquireSaysWhoHoldsIt) {
  Pool p("stopped");
  auto mgr = LockManager::create(*p.region);
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  pid_t holder = spawn_holder({helper(), p.uri, "3", "hold"});
  kill(holder, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(kNodeStaleMs + 300));  // heartbeat now stale
  NodeOptions no;
  no.node = 1;
  auto n1 = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n1.ok()) << n1.error().message();
  TwoTierLock l1(*n1.value(), CXLKV_LOCK_FIRST_USER);

  auto nodes = list_nodes(*p.region, p.region->domain());
  auto r = l1.try_lock_for(300ms);

  EXPECT_TRUE(nodes[3].alive) << nodes[3].why;  // stopped, not dead
  EXPECT_TRUE(nodes[3].local);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ETIMEDOUT);
  EXPECT_NE(r.error().message().find("held by node 3 (pid " + std::to_string(holder) + ", alive)"), std::string::npos)
      << r.error().message();
  kill(holder, SIGKILL);
  wait_exit(holder);
  auto after = list_nodes(*p.region, p.region->domain());
  EXPECT_FALSE(after[3].alive);
  EXPECT_NE(after[3].why.find("gone"), std::string::npos) << after[3].why;
  auto got = l1.try_lock_for(5s);
  EXPECT_TRUE(got.ok()) << (got.ok() ? "" : got.error().message());
  if (got.ok()) (void)l1.unlock();
  mgr.value()->stop();
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

TEST(LockTools, CxlkvdRefusesBadNumbersAndNodesBeyondThePool) {
  Pool p("cxlkvd-args");
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {cxlkvd(), "--pool", p.uri, "--foreground"};
    a.insert(a.end(), extra.begin(), extra.end());
    return wait_within(spawn(a), 5000ms, "cxlkvd to refuse its arguments");
  };
  EXPECT_EQ(run({"--lease-ms", "abc"}), 2);                    // not a number
  EXPECT_EQ(run({"--lease-ms", "18446744073709551617"}), 2);   // would wrap
  EXPECT_EQ(run({"--lease-ms", "-5"}), 2);
  EXPECT_EQ(run({"--node", "999"}), 2);                        // beyond CXLKV_MAX_NODES
  EXPECT_EQ(run({"--node", "8"}), 2);                          // beyond this pool's 8 nodes
}

TEST(LockTools, NodeEvictOfAnEmptyIdIsRefusedAndEvictsNothing) {
  Pool p("evict-empty");
  NodeOptions no;
  no.node = 0;
  auto n0 = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n0.ok());
  for (const char* bad : {"", "-1", "4294967296", "1x"})
    EXPECT_EQ(wait_within(spawn({cxlkvctl(), "--pool", p.uri, "node", "evict", bad, "--force"}), 5000ms,
                          "cxlkvctl node evict to refuse"),
              1)
        << "node evict '" << bad << "'";

  EXPECT_EQ(list_nodes(*p.region, p.region->domain())[0].state, CXLKV_NODE_ACTIVE);
}

TEST(LockTools, NodeGcRemovesNodeLocalFilesOfVanishedPoolsOnly) {
  Pool p("gc");
  NodeOptions no;
  no.node = 2;
  std::string kept;
  {
    auto n = NodeContext::attach(*p.region, no);
    ASSERT_TRUE(n.ok());
    kept = n.value()->local_shm_name();
  }
  // A node-local file of a pool that does not exist (random pool id).
  char stale[80];
  std::snprintf(stale, sizeof stale, "cxlkv-node-%08x%024x-1", static_cast<unsigned>(getpid()), 0xdeadu);
  int fd = shm_open((std::string("/") + stale).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);

  auto res = gc_node_local({}, /*dry_run=*/false);

  bool saw_stale = false, saw_kept = false;
  for (const auto& g : res) {
    if (g.name == stale) {
      saw_stale = true;
      EXPECT_TRUE(g.removed) << g.why;
    }
    if (g.name == kept) {
      saw_kept = true;
      EXPECT_FALSE(g.removed) << g.why;
      EXPECT_EQ(g.why, "pool exists");
    }
  }
  EXPECT_TRUE(saw_stale);
  EXPECT_TRUE(saw_kept);
  EXPECT_NE(access((std::string("/dev/shm/") + stale).c_str(), F_OK), 0);
  EXPECT_EQ(access(("/dev/shm/" + kept).c_str(), F_OK), 0);
  EXPECT_TRUE(remove_node_local(*p.region, 2).ok());
  EXPECT_NE(access(("/dev/shm/" + kept).c_str(), F_OK), 0);
}

}  // namespace
}  // namespace cxlkv
