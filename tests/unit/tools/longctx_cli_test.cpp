// SPDX-License-Identifier: MIT
// cxlkv-longctx run as a program: whatever way a run ends (an error after
// the pool is made, SIGTERM), it leaves no pool, lock file or context behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/proc_util.hpp"

namespace {

using proc_util::shm_entries_containing;
using proc_util::slurp;

class LongctxCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tools = std::getenv("CXLKV_TEST_TOOLS");
    if (!tools) GTEST_SKIP() << "CXLKV_TEST_TOOLS not set (run through ctest)";
    tool_ = std::string(tools) + "/cxlkv-longctx";
    if (access(tool_.c_str(), X_OK) != 0) GTEST_SKIP() << tool_ << " not built";
    tag_ = "/tmp/cxlkv-longctx-test-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    // K and V files far too short for the context: the run fails while it
    // builds the context, after it has made its pool and its context.
    std::ofstream(tag_ + ".k") << std::string(1000, 'k');
    std::ofstream(tag_ + ".v") << std::string(1000, 'v');
  }
  void TearDown() override {
    for (const char* s : {".k", ".v", ".err"}) std::remove((tag_ + s).c_str());
  }

  // Starts the tool with `args`; stderr to tag_.err.
  pid_t start(const std::vector<std::string>& args) {
    pid_t pid = fork();
    if (pid == 0) {
      if (!freopen((tag_ + ".err").c_str(), "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(126);
      std::vector<char*> av{const_cast<char*>(tool_.c_str())};
      for (auto& a : args) av.push_back(const_cast<char*>(a.c_str()));
      av.push_back(nullptr);
      execv(tool_.c_str(), av.data());
      _exit(127);
    }
    return pid;
  }
  // Exit status (or -signal) of a started run.
  static int finish(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }
  std::vector<std::string> failing() const { return {"--kv-file", tag_, "--tokens", "64", "--layers", "1"}; }

  std::string tool_, tag_;
};

}  // namespace

TEST_F(LongctxCli, AnErrorAfterItsOwnPoolIsMadeRemovesThePoolAndTheStoreLockFile) {
  pid_t pid = start(failing());
  ASSERT_GT(pid, 0);
  EXPECT_EQ(finish(pid), 2);
  EXPECT_NE(slurp(tag_ + ".err").find("hold fewer than --tokens tokens"), std::string::npos) << slurp(tag_ + ".err");
  // std::exit skipped the destructors: the pool (sized for the context) and
  // the pnm store's lock file stayed in /dev/shm.
  std::vector<std::string> left;
  if (access(("/dev/shm/cxlkv-longctx-" + std::to_string(pid)).c_str(), F_OK) == 0)
    left.push_back("cxlkv-longctx-" + std::to_string(pid));
  auto lock = shm_entries_containing("longctx_" + std::to_string(pid) + "_");
  left.insert(left.end(), lock.begin(), lock.end());
  for (auto& f : left) std::remove(("/dev/shm/" + f).c_str());
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

TEST_F(LongctxCli, FailedRunsOnAGivenPoolLeaveNoContextSoLaterRunsFindAFreeSlot) {
  const std::string name = "cxlkv-longctx-test-pool-" + std::to_string(getpid());
  const std::string ctl = tool_.substr(0, tool_.rfind('/')) + "/cxlkvctl";
  ASSERT_EQ(std::system((ctl + " --pool shm:" + name + ":256M format --no-standard >/dev/null").c_str()), 0);
  // The store keeps 4 context slots: each failed run used to keep one for ever.
  for (int i = 0; i < 5; i++) {
    std::vector<std::string> args = failing();
    args.insert(args.begin(), {"--pool", "shm:" + name});
    EXPECT_EQ(finish(start(args)), 2) << "run " << i << ": " << slurp(tag_ + ".err");
  }
  int ok = finish(start({"--pool", "shm:" + name, "--tokens", "64", "--layers", "1", "--steps", "1", "--no-quality"}));
  std::string err = slurp(tag_ + ".err");
  std::remove(("/dev/shm/" + name).c_str());
  for (auto& f : shm_entries_containing("shm_cxlkv_longctx_test_pool_" + std::to_string(getpid()) + "-"))  // the store's lock
    std::remove(("/dev/shm/" + f).c_str());
  EXPECT_EQ(ok, 0) << err;
}

TEST_F(LongctxCli, SigtermStopsTheRunWith143AndRemovesItsPool) {
  pid_t pid = start({"--tokens", "4096", "--layers", "1", "--steps", "1000000", "--no-quality"});
  ASSERT_GT(pid, 0);
  // The pool exists once the signal handlers are in place (they come first).
  const std::string pool = "cxlkv-longctx-" + std::to_string(pid);
  bool made = false;
  for (int i = 0; i < 1000 && !made; i++) {
    made = access(("/dev/shm/" + pool).c_str(), F_OK) == 0;
    if (!made) usleep(10000);
  }
  ASSERT_TRUE(made) << "no pool after 10 s";
  kill(pid, SIGTERM);
  EXPECT_EQ(finish(pid), 143);
  EXPECT_NE(slurp(tag_ + ".err").find("cxlkv-longctx: stopped by signal 15"), std::string::npos)
      << slurp(tag_ + ".err");
  std::vector<std::string> left;
  if (access(("/dev/shm/" + pool).c_str(), F_OK) == 0) left.push_back(pool);
  auto lock = shm_entries_containing("longctx_" + std::to_string(pid) + "_");
  left.insert(left.end(), lock.begin(), lock.end());
  for (auto& f : left) std::remove(("/dev/shm/" + f).c_str());
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

// A pool truncated under the run ends it with a bus error on the pool's
// memory: the handler ends the process past the destructors, and the pool of
// its own and the writer's lock file stayed in /dev/shm.
TEST_F(LongctxCli, ABusErrorOnThePoolEndsTheRunAndRemovesItsPoolAndLockFile) {
  pid_t pid = start({"--tokens", "4096", "--layers", "1", "--steps", "1000000", "--no-quality"});
  ASSERT_GT(pid, 0);
  const std::string pool = "cxlkv-longctx-" + std::to_string(pid);
  const std::string lock_tag = "longctx_" + std::to_string(pid) + "_";
  bool running = false;  // the store (and its lock file) exists
  for (int i = 0; i < 2000 && !running; i++) {
    running = !shm_entries_containing(lock_tag).empty();
    if (!running) usleep(10000);
  }
  ASSERT_TRUE(running) << "no lock file after 20 s: " << slurp(tag_ + ".err");
  usleep(200 * 1000);  // into the decode steps
  ASSERT_EQ(truncate(("/dev/shm/" + pool).c_str(), 4096), 0);
  int st = -1;
  for (int i = 0; i < 3000; i++) {
    int s = 0;
    if (waitpid(pid, &s, WNOHANG) == pid) {
      st = WIFEXITED(s) ? WEXITSTATUS(s) : -WTERMSIG(s);
      break;
    }
    usleep(10000);
  }
  if (st == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  const std::string err = slurp(tag_ + ".err");
  std::vector<std::string> left;
  if (access(("/dev/shm/" + pool).c_str(), F_OK) == 0) left.push_back(pool);
  auto lock = shm_entries_containing(lock_tag);
  left.insert(left.end(), lock.begin(), lock.end());
  for (auto& f : left) std::remove(("/dev/shm/" + f).c_str());
  ASSERT_NE(st, -1) << "still running 30 s after its pool was truncated";
  EXPECT_EQ(st, 1) << err;
  EXPECT_NE(err.find("bus error on the pool's memory"), std::string::npos) << err;
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}
