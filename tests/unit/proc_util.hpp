// SPDX-License-Identifier: MIT
// Looking at processes and /dev/shm from tests that run real processes
// (the replay's supervision tests).
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace proc_util {

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
