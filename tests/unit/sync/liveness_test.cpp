// SPDX-License-Identifier: MIT
// process_alive, the liveness rule's check of a process on this host
// (docs/coherence.md "Liveness"): pid and start time, answered from a pidfd
// after the first question about a process.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cxlkv/sync.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;

// A child that waits for a byte on `in`, then exits.
pid_t child_waiting(int in) {
  const pid_t c = fork();
  if (c == 0) {
    char x;
    _exit(read(in, &x, 1) == 1 ? 0 : 1);
  }
  return c;
}

// process_start_time of `pid`, once /proc shows the child (it may not yet
// have run when fork returns in the parent).
uint64_t start_of(pid_t pid) {
  for (int i = 0; i < 1000; i++) {
    if (uint64_t s = process_start_time(static_cast<uint32_t>(pid))) return s;
    std::this_thread::sleep_for(1ms);
  }
  return 0;
}

TEST(Liveness, AProcessIsAliveUntilItExitsAndNeverUnderAnotherStartTime) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t c = child_waiting(p[0]);
  ASSERT_GT(c, 0);
  const uint32_t pid = static_cast<uint32_t>(c);
  const uint64_t start = start_of(c);
  ASSERT_NE(start, 0u);

  EXPECT_TRUE(process_alive(pid, start));
  EXPECT_TRUE(process_alive(pid, start)) << "the second verdict (from the pidfd) differs from the first";
  EXPECT_FALSE(process_alive(pid, start + 1)) << "another start time is another process: the pid was reused";
  EXPECT_TRUE(process_alive(pid, start)) << "asking about another start time forgot the live process";
  EXPECT_TRUE(process_alive(pid, 0)) << "no start time: any process with the pid";

  // Exited, not yet reaped (a zombie): dead, from the cached pidfd too.
  ASSERT_EQ(write(p[1], "x", 1), 1);
  siginfo_t si{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(c), &si, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(process_alive(pid, start)) << "an exited process (zombie) is dead";
  int st = 0;
  ASSERT_EQ(waitpid(c, &st, 0), c);
  EXPECT_FALSE(process_alive(pid, start)) << "a reaped process is dead";
  EXPECT_FALSE(process_alive(pid, 0));
  close(p[0]);
  close(p[1]);
}

TEST(Liveness, AnotherThreadAsksWithItsOwnPidfdsAndAgrees) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t c = child_waiting(p[0]);
  ASSERT_GT(c, 0);
  const uint64_t start = start_of(c);
  ASSERT_NE(start, 0u);
  const uint32_t pid = static_cast<uint32_t>(c);
  EXPECT_TRUE(process_alive(pid, start));
  bool there = false;
  std::thread([&] { there = process_alive(pid, start); }).join();
  EXPECT_TRUE(there);
  ASSERT_EQ(write(p[1], "x", 1), 1);
  int st = 0;
  ASSERT_EQ(waitpid(c, &st, 0), c);
  std::thread([&] { there = process_alive(pid, start); }).join();
  EXPECT_FALSE(there);
  EXPECT_FALSE(process_alive(pid, start));
  close(p[0]);
  close(p[1]);
}

TEST(Liveness, NoProcessAndPidZeroAreDead) {
  EXPECT_FALSE(process_alive(0, 0));
  EXPECT_FALSE(process_alive(0, 123));
  // A pid above the kernel's limit names no process.
  EXPECT_FALSE(process_alive(0x7fffffff, 1));
  EXPECT_TRUE(process_alive(static_cast<uint32_t>(getpid()), process_start_time(static_cast<uint32_t>(getpid()))));
}

}  // namespace
}  // namespace cxlkv
