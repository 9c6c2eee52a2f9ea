// SPDX-License-Identifier: MIT
// Helper for kv_pause_test: a node on "another host" that the test pauses
// with SIGSTOP past the liveness timeout.
//
//   kv_pause_helper POOL NODE writer KEY BYTES   reserve KEY (BYTES), then on
//                                                "write\n": write 0xAA.. and publish
//   kv_pause_helper POOL NODE reader KEY BYTES   pin KEY, then on "fetch\n": fetch
//                                                it into a 0x5A-filled buffer and unpin
//   kv_pause_helper POOL NODE stray KEY BYTES    reserve KEY, then on "stray\n":
//                                                store 0xEE.. straight into the
//                                                reserved location (the rest of a
//                                                copy that passed its checks before
//                                                the pause), no checks
//
// The work runs in a new pid namespace, so this_host_id() differs from the
// test's: the test's node judges this one by heartbeat age, as it would a
// node on another host (a process on the same host is alive while stopped).
// Output lines: "PID <pid in the test's namespace>", "READY <loc_off>",
// then one result line per command.  Exits 77 when no pid namespace can be
// made (not root); a watchdog alarm ends it after 120 s whatever happens.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

using namespace cxlkv;

namespace {

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

std::string next_command() {
  char line[64] = {};
  if (!std::fgets(line, sizeof line, stdin)) return "eof";
  std::string s(line);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// This node's own heartbeat is younger than half the liveness timeout
// (bounded wait of 10 s).
bool fresh_heartbeat(Region& region, uint32_t n) {
  auto ctrl = ControlCarve::open(region, region.domain());
  if (!ctrl) return false;
  for (int i = 0; i < 1000; i++) {
    cxlkv_node_entry e = region.domain().read_fresh(ctrl->node_entry(n));  // rule 4
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    if (now - int64_t(e.heartbeat_ns) < kNodeStaleMs * 1000000 / 2) return true;
    usleep(10000);
  }
  return false;
}

int code_of(const Result<void>& r) { return r ? 0 : r.error().code(); }

int work(int argc, char** argv) {
  auto region = Region::open(argv[1]);
  if (!region) return std::fprintf(stderr, "%s\n", region.error().message().c_str()), 1;
  NodeOptions no;
  no.node = static_cast<uint32_t>(std::atoi(argv[2]));
  no.heartbeat = true;
  no.heartbeat_ms = 100;
  auto node = NodeContext::attach(*region.value(), no);
  if (!node) return std::fprintf(stderr, "%s\n", node.error().message().c_str()), 1;
  auto s = open_kv_session(*region.value(), *node.value());
  if (!s) return std::fprintf(stderr, "%s\n", s.error().message().c_str()), 1;
  KvStore& kv = s.value()->store();
  const std::string mode = argv[3];
  BlockKey key;
  if (argc < 6 || !parse_key(argv[4], &key)) return 2;
  const uint64_t bytes = std::strtoull(argv[5], nullptr, 10);
  std::vector<std::byte> buf(bytes);
  Chunk ch{buf.data(), buf.size()};

  if (mode == "writer" || mode == "stray") {
    auto r = kv.reserve(key, nullptr, bytes);
    if (!r || !r->reserved()) return std::fprintf(stderr, "reserve failed\n"), 1;
    say("READY " + std::to_string(r->loc_off));
    const std::string cmd = next_command();
    if (cmd == "write") {
      buf.assign(bytes, std::byte{0xAA});
      ch = Chunk{buf.data(), buf.size()};
      say("WRITE " + std::to_string(code_of(kv.write(*r, {&ch, 1}))));
      say("PUBLISH " + std::to_string(code_of(kv.publish(*r))));
    } else if (cmd == "stray") {
      // What a copy in flight at the pause would still store on resume:
      // plain stores into the location, no check (rule 3 flush so the test
      // sees them in memory).
      std::byte* dst = static_cast<std::byte*>(region.value()->at(r->loc_off));
      std::memset(dst, 0xEE, bytes);
      region.value()->domain().flush(dst, bytes);
      region.value()->domain().fence();
      say("STRAY 0");
    }
  } else if (mode == "reader") {
    auto p = kv.pin(key);
    if (!p) return std::fprintf(stderr, "pin failed: %s\n", p.error().message().c_str()), 1;
    say("READY " + std::to_string(p->loc_off));
    if (next_command() == "fetch") {
      buf.assign(bytes, std::byte{0x5A});
      ch = Chunk{buf.data(), buf.size()};
      const int rc = code_of(kv.fetch(*p, {&ch, 1}));
      // Bytes of the buffer that the fetch changed: any is a byte the
      // caller might take for the block's.
      size_t changed = 0;
      for (std::byte b : buf) changed += b != std::byte{0x5A};
      say("FETCH " + std::to_string(rc) + " " + std::to_string(changed));
      // The lock manager drops a waiter it judges dead, and a waiter rings
      // its doorbell once: a lock request made in the first moments after
      // the resume, before the heartbeat thread beat again, would wait for
      // ever (reported to the sync layer).  Wait for a fresh beat first.
      if (!fresh_heartbeat(*region.value(), no.node)) return std::fprintf(stderr, "no heartbeat after resume\n"), 1;
      say("UNPIN " + std::to_string(code_of(kv.unpin(*p))));
    }
  } else {
    return 2;
  }
  (void)next_command();  // "exit" or end of input
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return 2;
  alarm(120);  // watchdog: never outlive a broken test
  if (unshare(CLONE_NEWPID) != 0) {
    std::fprintf(stderr, "kv_pause_helper: no pid namespace (%s)\n", std::strerror(errno));
    return 77;
  }
  pid_t child = fork();  // the first child is the new namespace's init
  if (child < 0) return 1;
  if (child == 0) {
    alarm(120);
    _exit(work(argc, argv));
  }
  say("PID " + std::to_string(child));
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
