// SPDX-License-Identifier: MIT
// Supervision of the main job's worker processes (docs/operations.md "Clean-up"): a worker killed
// with -9 in the middle of a run ends the run with an error naming it, in
// bounded time (the others may have waited on a lock it held), and the
// replay removes every worker, pool, coordination segment and node-local file
// it created.  Its sibling test in replay_test.cpp kills the parent.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "support/proc_util.hpp"
#include "support/replay_run.hpp"

using namespace proc_util;

namespace {

// Runs a slow replay (trace time at wall speed) with 2 prefill + 2 decode
// workers, kills worker `victim` (in fork order) once all four are attached
// and progressing, and checks how the run ends.
void kill_one_worker_and_check(size_t victim) {
  const std::string err = "/tmp/cxlkv-replay-worker-kill-" + std::to_string(getpid()) + ".err";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    std::string exe = replay_run::tools() + "/cxlkv-replay";
    execl(exe.c_str(), exe.c_str(), "--requests", "3000", "--time-scale", "1", "--prefill", "2", "--decode", "2",
          "--layers", "1", "--head-size", "16", (char*)nullptr);
    _exit(127);
  }
  const std::string mine = "cxlkv-replay-" + std::to_string(pid) + "-";
  const std::string coord = "cxlkv-replay-coord-" + std::to_string(pid) + "-";
  std::vector<pid_t> workers;
  bool progressing = false;
  for (int i = 0; i < 400 && !progressing; i++) {  // bounded: 20 s
    usleep(50000);
    workers = children_of(pid);
    progressing = workers.size() == 4 && shm_entries_containing(mine).empty() &&
                  shm_entries_containing(coord).empty() && slurp(err).find("prefill ") != std::string::npos;
  }
  std::string log = slurp(err);
  if (!progressing) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
  ASSERT_TRUE(progressing) << "replay did not start its 4 workers within 20 s; workers " << workers.size()
                           << ", stderr: " << log;
  size_t np = log.find("node-local files ");
  ASSERT_NE(np, std::string::npos) << log;
  const std::string node_prefix = log.substr(np + 17, log.find("..", np) - np - 17);
  std::sort(workers.begin(), workers.end());  // fork order: pids rise (no wrap in a test run)
  ASSERT_EQ(kill(workers[victim], SIGKILL), 0);

  // The run must end by itself, with an error, within 60 s.
  int st = 0;
  bool ended = false;
  for (int i = 0; i < 1200 && !ended; i++) {
    usleep(50000);
    ended = waitpid(pid, &st, WNOHANG) == pid;
  }
  if (!ended) {
    std::vector<pid_t> left = children_of(pid);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    for (pid_t w : left) kill(w, SIGKILL);
  }
  log = slurp(err);
  std::remove(err.c_str());
  ASSERT_TRUE(ended) << "replay still running 60 s after worker " << victim << " (pid " << workers[victim]
                     << ") was killed; stderr: " << log;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << "a run that lost a worker must fail; status " << st;
  EXPECT_NE(log.find("pid " + std::to_string(workers[victim]) + ") failed (signal 9)"), std::string::npos)
      << "the error should name the killed worker; stderr: " << log;
  for (pid_t w : workers) EXPECT_FALSE(running(w)) << "worker " << w << " still running after the replay ended";
  EXPECT_TRUE(shm_entries_containing(mine).empty()) << "pool left behind";
  EXPECT_TRUE(shm_entries_containing(coord).empty()) << "coordination segment left behind";
  EXPECT_TRUE(shm_entries_containing(node_prefix).empty()) << node_prefix << "* node-local files left behind";
}

}  // namespace

TEST(ReplaySupervision, KillMinus9OfAPrefillWorkerEndsTheRunWithAnErrorAndLeavesNothing) {
  kill_one_worker_and_check(0);
}

TEST(ReplaySupervision, KillMinus9OfADecodeWorkerEndsTheRunWithAnErrorAndLeavesNothing) {
  kill_one_worker_and_check(3);
}
