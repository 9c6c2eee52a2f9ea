// SPDX-License-Identifier: MIT
// The liveness rule (docs/coherence.md "Liveness", uapi/cxlkv_ctrl.h node entry):
// a node on this host is dead exactly when its process (pid + start time
// from /proc/PID/stat) is gone; a node on another host when its heartbeat
// is older than kNodeStaleMs.  A stopped (SIGSTOP) process is alive.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"
#include "util/clock.hpp"

namespace cxlkv {

namespace {

// Read a small /proc file whole; empty on error.
std::string slurp(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

uint32_t fnv1a(const std::string& s, uint32_t h = 2166136261u) {
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

}  // namespace

uint32_t this_host_id() {
  static const uint32_t id = [] {
    // Same boot of the same machine and the same pid namespace: the only
    // case where a pid names the same process for the writer and the reader.
    std::string boot = slurp("/proc/sys/kernel/random/boot_id");
    char ns[64] = {};
    ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    uint32_t h = fnv1a(boot);
    h = fnv1a(n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string("?"), h);
    return h ? h : 1u;  // 0 means "unknown host" in a node entry
  }();
  return id;
}

uint64_t process_start_time(uint32_t pid) {
  if (pid == 0) return 0;
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  std::string s = slurp(path);
  // "pid (comm) S ppid ..." -- comm may contain spaces and ')': parse after the last ')'.
  auto rp = s.rfind(')');
  if (rp == std::string::npos || rp + 2 >= s.size()) return 0;
  const char* p = s.c_str() + rp + 2;  // field 3: state
  if (*p == 'Z' || *p == 'X' || *p == 'x') return 0;  // exited, not yet reaped: dead
  // Fields 3..22; starttime is field 22.
  for (int field = 3; field < 22; field++) {
    p = std::strchr(p, ' ');
    if (!p) return 0;
    p++;
  }
  uint64_t st = std::strtoull(p, nullptr, 10);
  return st ? st : 1;  // a process started at tick 0 is still a process
}

namespace {
std::atomic<uint32_t> g_pid{0};
std::atomic<uint64_t> g_start{0};
void forked_child() {
  g_pid.store(static_cast<uint32_t>(getpid()));
  g_start.store(0);
}
}  // namespace

uint32_t self_pid() {
  uint32_t p = g_pid.load(std::memory_order_relaxed);
  if (p) return p;
  static const bool registered = [] { return pthread_atfork(nullptr, nullptr, forked_child) == 0; }();
  (void)registered;
  p = static_cast<uint32_t>(getpid());
  g_pid.store(p);
  return p;
}

uint64_t self_start_time() {
  uint64_t st = g_start.load(std::memory_order_relaxed);
  if (st) return st;
  st = process_start_time(self_pid());
  g_start.store(st);
  return st;
}

namespace {

// The processes this thread asked about, each held by a pidfd
// (docs/coherence.md "Liveness"): a pidfd names one process, never a later
// one that reuses its pid, and is readable once that process has exited.
// The start time is read from /proc once, when the pidfd is opened; after
// that a verdict is one poll().  Reading /proc/PID/stat walks every thread
// of the process: 35-80 us for an engine's many-threaded processes, where
// a node's processes ask about each other on every lock set.  Per thread,
// so no lock is held across a fork.
class Pidfds {
 public:
  enum class Verdict { alive, dead, unknown };
  ~Pidfds() {
    for (const E& e : v_) ::close(e.fd);
  }
  Verdict judge(uint32_t pid, uint64_t start_time) {
    for (size_t i = 0; i < v_.size(); i++) {
      if (v_[i].pid != pid) continue;
      if (!exited(v_[i].fd)) return v_[i].start == start_time ? Verdict::alive : Verdict::dead;  // the pid is another's
      drop(i);
      break;
    }
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (fd < 0) return errno == ESRCH ? Verdict::dead : Verdict::unknown;  // ENOSYS, EPERM, EMFILE: read /proc
    // After the pidfd: a start time that matches now means the pidfd names
    // that process or one that exited before it started (then readable).
    const uint64_t now = process_start_time(pid);
    if (now != start_time || exited(fd)) {
      ::close(fd);
      return Verdict::dead;
    }
    if (v_.size() == kMax) drop(0);
    v_.push_back(E{pid, start_time, fd});
    return Verdict::alive;
  }

 private:
  struct E {
    uint32_t pid;
    uint64_t start;
    int fd;
  };
  static constexpr size_t kMax = 32;
  static bool exited(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable (exited) or an error: not known alive
  }
  void drop(size_t i) {
    ::close(v_[i].fd);
    v_.erase(v_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::vector<E> v_;
};

}  // namespace

bool process_alive(uint32_t pid, uint64_t start_time) {
  if (pid == 0) return false;
  if (start_time != 0) {
    thread_local Pidfds fds;
    const auto v = fds.judge(pid, start_time);
    if (v != Pidfds::Verdict::unknown) return v == Pidfds::Verdict::alive;
  }
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  uint64_t now = process_start_time(pid);
  if (now == 0) return false;                  // gone (or a zombie) by now
  return start_time == 0 || now == start_time;  // pid reused by another process: dead
}

NodeVerdict judge_node(const cxlkv_node_entry& e) {
  NodeVerdict v;
  if (e.state != CXLKV_NODE_ACTIVE) {
    v.why = e.state == CXLKV_NODE_EVICTED ? "evicted" : "not attached";
    return v;
  }
  v.local = e.host_id != 0 && e.host_id == this_host_id();
  if (v.local) {
    v.alive = process_alive(e.pid, e.start_time);
    v.why = v.alive ? "process " + std::to_string(e.pid) + " running on this host"
                    : "process " + std::to_string(e.pid) + " gone";
    return v;
  }
  const int64_t age_ms = e.heartbeat_ns ? (int64_t(realtime_ns()) - int64_t(e.heartbeat_ns)) / 1000000 : -1;
  v.alive = age_ms >= 0 && age_ms < kNodeStaleMs;
  v.why = age_ms < 0 ? std::string("never beat")
                     : "heartbeat " + std::to_string(age_ms) + " ms ago" + (v.alive ? "" : " (stale)");
  return v;
}

}  // namespace cxlkv
