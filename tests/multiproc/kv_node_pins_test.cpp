// SPDX-License-Identifier: MIT
// A pin protects its block for as long as ANY process of the node holds it.
//
// A pin is one bit per node in the pool entry (pin_mask); several processes
// of one host may attach as the same node (an engine's scheduler and its
// workers).  Two processes of node 0 (A and B, forked, each with its own
// KV session) pin the same block; A unpins.  Node 2 (this process) then
// tries to evict: it must not take the block while B still pins it, and
// takes it once B unpins too.  A process killed with SIGKILL while holding
// pins must not pin its blocks for ever: its pins are dropped (its node's
// other processes notice it is gone) while B's own pins keep protecting
// their blocks.  Every wait is bounded; the children are killed whatever
// happens.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "pool/format.hpp"

using namespace cxlkv;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kBlock = 4096;

BlockKey key_of(uint32_t i) { return BlockKey{0x5157a11ed0000000ull + i, 0x9e3779b97f4a7c15ull * (i + 1)}; }
std::byte fill_of(uint32_t i) { return std::byte(uint8_t(0x41 + i)); }

// A process attached as node 0 with its own KV session.  Commands on `in`,
// one per line ("p I" pin block I, "u I" unpin it, "f I" fetch it and check
// its bytes); one reply line each on `out` ("ok" or "err WHY").
int child_main(const std::string& uri, bool heartbeat, int in, int out) {
  alarm(120);  // watchdog
  auto say = [out](const std::string& s) {
    const std::string l = s + "\n";
    return write(out, l.data(), l.size()) == ssize_t(l.size());
  };
  FILE* f = fdopen(in, "r");
  char line[64];
  // Attach only when told ("go"): the test orders A's and B's attaches.
  if (!f || !fgets(line, sizeof line, f) || std::string(line) != "go\n") return 9;
  auto region = Region::open(uri);
  if (!region) return say("err open: " + region.error().message()) ? 10 : 11;
  NodeOptions no;
  no.node = 0;
  no.heartbeat = heartbeat;
  auto node = NodeContext::attach(*region.value(), no);
  if (!node) return say("err attach: " + node.error().message()) ? 12 : 13;
  auto s = open_kv_session(*region.value(), *node.value());
  if (!s) return say("err session: " + s.error().message()) ? 14 : 15;
  KvStore& kv = s.value()->store();
  std::map<uint32_t, std::vector<KvPin>> pins;
  if (!say("ready")) return 16;
  while (fgets(line, sizeof line, f)) {
    char op = 0;
    unsigned i = 0;
    if (std::sscanf(line, "%c %u", &op, &i) != 2) {
      say("err bad command");
      continue;
    }
    if (op == 'p') {
      auto p = kv.pin(key_of(i));
      if (!p) {
        say("err pin: " + p.error().message());
        continue;
      }
      pins[i].push_back(*p);
      say("ok");
    } else if (op == 'u') {
      if (pins[i].empty()) {
        say("err not pinned");
        continue;
      }
      auto u = kv.unpin(pins[i].back());
      pins[i].pop_back();
      say(u ? "ok" : "err unpin: " + u.error().message());
    } else if (op == 'f') {
      if (pins[i].empty()) {
        say("err not pinned");
        continue;
      }
      std::vector<std::byte> got(kBlock, std::byte{0});
      Chunk ch{got.data(), got.size()};
      auto r = kv.fetch(pins[i].back(), {&ch, 1});
      if (!r) {
        say("err fetch: " + r.error().message());
        continue;
      }
      bool same = true;
      for (std::byte b : got) same = same && b == fill_of(i);
      say(same ? "ok" : "err wrong bytes");
    } else {
      say("err unknown op");
    }
  }
  return 0;
}

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string buf;

  // One reply line (bounded wait); "timeout" / "eof" when none came.
  std::string reply(std::chrono::milliseconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      if (auto nl = buf.find('\n'); nl != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "timeout";
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, int(left.count())) <= 0) continue;
      char b[256];
      ssize_t k = read(from, b, sizeof b);
      if (k <= 0) return "eof";
      buf.append(b, size_t(k));
    }
  }
  std::string send(const std::string& l) {
    if (write(to, l.data(), l.size()) != ssize_t(l.size())) return "write failed";
    return reply();
  }
  std::string cmd(char op, uint32_t i) {
    const std::string l = std::string(1, op) + " " + std::to_string(i) + "\n";
    if (write(to, l.data(), l.size()) != ssize_t(l.size())) return "write failed";
    return reply();
  }
  void kill9() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
      pid = -1;
    }
  }
  ~Child() {
    if (to >= 0) close(to);
    if (from >= 0) close(from);
    if (pid > 0) {
      int st = 0;
      for (int i = 0; i < 300 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(10000);
      if (waitpid(pid, &st, WNOHANG) == 0) kill9();
    }
  }
};

// Fork a node-0 process (before this process starts any thread).
void spawn(Child& c, const std::string& uri, bool heartbeat) {
  int tp[2], fp[2];
  if (pipe(tp) != 0 || pipe(fp) != 0) return;
  c.pid = fork();
  if (c.pid == 0) {
    close(tp[1]);
    close(fp[0]);
    _exit(child_main(uri, heartbeat, tp[0], fp[1]));
  }
  close(tp[0]);
  close(fp[1]);
  c.to = tp[1];
  c.from = fp[0];
}

// The pool, node 0's processes A and B, a lock manager and node 2 (this
// process), which publishes the blocks.  A attaches first and does not
// beat; B attaches after it and beats, so the node table names B's process
// for node 0 (killing A never makes node 0 look dead to node 2).
struct KvNodePins : ::testing::Test {
  std::string uri;
  std::unique_ptr<Region> region;
  Child a, b;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node2;
  std::unique_ptr<KvSession> s2;

  bool a_last = false;  // A attaches after B (the node table names A)
  bool b_beats = true;  // B runs a heartbeat (names B again within a period)

  void SetUp() override {
    uri = "shm:cxlkv-nodepins-" + std::to_string(getpid()) + ":32M";
    PoolFormatOptions fo;
    fo.force = true;
    auto fmt = format_pool(uri, fo);
    ASSERT_TRUE(fmt.ok()) << fmt.error().message();
    region = std::move(fmt.value());
    spawn(a, uri, /*heartbeat=*/false);
    spawn(b, uri, /*heartbeat=*/b_beats);
    ASSERT_GT(a.pid, 0);
    ASSERT_GT(b.pid, 0);
    auto m = LockManager::create(*region);
    ASSERT_TRUE(m.ok()) << m.error().message();
    mgr = std::move(m.value());
    mgr->start();
    NodeOptions no;
    no.node = 2;
    no.heartbeat = true;
    auto n = NodeContext::attach(*region, no);
    ASSERT_TRUE(n.ok()) << n.error().message();
    node2 = std::move(n.value());
    auto s = open_kv_session(*region, *node2);
    ASSERT_TRUE(s.ok()) << s.error().message();
    s2 = std::move(s.value());
    for (uint32_t i = 0; i < 3; i++) {
      std::vector<std::byte> buf(kBlock, fill_of(i));
      Chunk ch{buf.data(), buf.size()};
      auto r = kv().reserve(key_of(i), nullptr, kBlock);
      ASSERT_TRUE(r.ok()) << r.error().message();
      ASSERT_TRUE(r->reserved());
      ASSERT_TRUE(kv().write(*r, {&ch, 1}).ok());
      ASSERT_TRUE(kv().publish(*r).ok());
    }
    // A first (so that B's attach is the node table's last word), then B;
    // or the other way round.
    Child& first = a_last ? b : a;
    Child& second = a_last ? a : b;
    ASSERT_EQ(first.send("go\n"), "ready");
    ASSERT_EQ(second.send("go\n"), "ready");
  }
  void TearDown() override {
    if (a.to >= 0) close(a.to), a.to = -1;
    if (b.to >= 0) close(b.to), b.to = -1;
    s2.reset();
    node2.reset();
    if (mgr) mgr->stop();
    mgr.reset();
    if (region)
      for (uint32_t n : {0u, 2u}) NodeContext::unlink_local(NodeContext::default_local_name(*region, n));
    region.reset();
    const std::string name = uri.substr(4, uri.rfind(':') - 4);
    shm_unlink(("/" + name).c_str());
  }
  KvStore& kv() { return s2->store(); }
  bool cached(uint32_t i) { return store_index(kv()).find_ready(key_of(i)) != CXLKV_INDEX_NO_SLOT; }
  // Node 2 evicts what it can; the blocks still cached afterwards.
  std::vector<bool> evict_all() {
    for (int n = 0; n < 8; n++) {
      auto r = store_index(kv()).evict_any();
      EXPECT_TRUE(r.ok()) << r.error().message();
      if (!r.ok() || !r.value()) break;
    }
    return {cached(0), cached(1), cached(2)};
  }
};

// No process of node 0 beats and A attached last: the node table names A's
// process for node 0 for good.
struct KvNodePinsNamedProcessDies : KvNodePins {
  KvNodePinsNamedProcessDies() {
    a_last = true;
    b_beats = false;
  }
};

}  // namespace

TEST_F(KvNodePins, ABlockStaysPinnedUntilEveryProcessOfTheNodeUnpinsIt) {
  ASSERT_EQ(a.cmd('p', 0), "ok");
  ASSERT_EQ(b.cmd('p', 0), "ok");
  ASSERT_EQ(a.cmd('u', 0), "ok");  // A is done; B still reads block 0
  // Node 2 under pressure: blocks 1 and 2 go, block 0 (B's pin) must stay.
  EXPECT_EQ(evict_all(), (std::vector<bool>{true, false, false}))
      << "node 2 evicted block 0 while process B of node 0 still pins it";
  EXPECT_EQ(b.cmd('f', 0), "ok") << "B's pinned block no longer reads back as itself";
  ASSERT_EQ(b.cmd('u', 0), "ok");
  // No process of node 0 pins it any more: it can go now.
  EXPECT_EQ(evict_all(), (std::vector<bool>{false, false, false}));
}

TEST_F(KvNodePins, PinsOfAKilledProcessAreDroppedWhileItsNodesOtherProcessKeepsItsOwn) {
  ASSERT_EQ(a.cmd('p', 0), "ok");  // block 0: A only
  ASSERT_EQ(b.cmd('p', 1), "ok");  // block 1: B only
  ASSERT_EQ(a.cmd('p', 2), "ok");  // block 2: both
  ASSERT_EQ(b.cmd('p', 2), "ok");
  EXPECT_EQ(evict_all(), (std::vector<bool>{true, true, true})) << "a pinned block was evicted";
  a.kill9();
  // A's pins go once node 0's live process notices A is gone (bounded):
  // block 0 becomes evictable; blocks 1 and 2 stay pinned by B.
  std::vector<bool> left;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  do {
    left = evict_all();
    if (!left[0]) break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(left, (std::vector<bool>{false, true, true}))
      << "block 0 is still pinned by killed process A (or B's blocks were evicted)";
  EXPECT_EQ(b.cmd('f', 1), "ok");
  EXPECT_EQ(b.cmd('f', 2), "ok");
  ASSERT_EQ(b.cmd('u', 1), "ok");
  ASSERT_EQ(b.cmd('u', 2), "ok");
  EXPECT_EQ(evict_all(), (std::vector<bool>{false, false, false}));
}

TEST_F(KvNodePinsNamedProcessDies, TheNodeLivesOnByItsOtherProcesssPins) {
  // The node table names one process per node; when it is gone, a node of
  // this host is judged dead by it -- yet B, another process of node 0,
  // still pins block 0 and reads it.  Node 2 must not take it.
  ASSERT_EQ(b.cmd('p', 0), "ok");
  ASSERT_EQ(a.cmd('p', 1), "ok");
  a.kill9();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::vector<bool> left;
  do {
    left = evict_all();
    ASSERT_TRUE(left[0]) << "node 2 evicted block 0, pinned by live process B of node 0, after A died";
    if (!left[1]) break;  // A's pin is gone (B's process dropped it)
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(left, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(b.cmd('f', 0), "ok");
  ASSERT_EQ(b.cmd('u', 0), "ok");
  EXPECT_EQ(evict_all(), (std::vector<bool>{false, false, false}));
}
