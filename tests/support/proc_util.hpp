// SPDX-License-Identifier: MIT
// Starting, reaping and looking at processes and /dev/shm from tests that
// run real processes (the multi-process lock tests, the replay's
// supervision tests).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace proc_util {

// Starts argv[0] (a path) with `argv`; with `out_fd`, its stdout goes to a
// pipe whose read end is put there.  -1 when the pipe cannot be made.
inline pid_t spawn(const std::vector<std::string>& argv, int* out_fd = nullptr) {
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

// A waitpid status as one number: the exit code, or 128 + the signal.
inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Waits for `pid` to exit, however long it takes.
inline int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return exit_code(st);
}

// Watchdog: wait at most `bound` for `pid` to exit; on timeout kill it and
// fail naming what the test waited for.  Returns the exit code (or -1).
inline int wait_within(pid_t pid, std::chrono::milliseconds bound, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return exit_code(st);
    if (std::chrono::steady_clock::now() - t0 > bound) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      ADD_FAILURE() << "watchdog: waited " << bound.count() << " ms for " << what << " (pid " << pid << "); killed it";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

inline void kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
}

// A helper process started with start_ready, its stdout open for reading.
struct ReadyChild {
  pid_t pid = -1;
  FILE* out = nullptr;
};

// Starts `exe` with `args` and waits for its first stdout line, READY (the
// helper is in position); pid -1 when the line is anything else or missing.
inline ReadyChild start_ready(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {exe};
  argv.insert(argv.end(), args.begin(), args.end());
  int fd = -1;
  ReadyChild c;
  c.pid = spawn(argv, &fd);
  if (c.pid < 0) return {};
  c.out = fdopen(fd, "r");
  char line[64] = {};
  if (!fgets(line, sizeof line, c.out) || std::string(line) != "READY\n") c.pid = -1;
  return c;
}

// SIGKILL, reap, close its stdout; pid -1 after.
inline void kill9(ReadyChild& c) {
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  fclose(c.out);
  c.pid = -1;
}

// Pids whose parent is `ppid` (from /proc/PID/stat), zombies left out.
inline std::vector<pid_t> children_of(pid_t ppid) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    size_t rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    char state = 0;
    int pp = 0;
    if (sscanf(line.c_str() + rp + 1, " %c %d", &state, &pp) == 2 && pp == ppid && state != 'Z') out.push_back(pid);
  }
  if (d) closedir(d);
  return out;
}

// Running (not gone, not a zombie waiting for its new parent to reap it).
inline bool running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  size_t rp = line.rfind(')');
  return rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] != 'Z' && line[rp + 2] != 'X';
}

inline std::vector<std::string> shm_entries_containing(const std::string& part) {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  while (dirent* e = d ? readdir(d) : nullptr)
    if (std::string(e->d_name).find(part) != std::string::npos) out.push_back(e->d_name);
  if (d) closedir(d);
  return out;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace proc_util
