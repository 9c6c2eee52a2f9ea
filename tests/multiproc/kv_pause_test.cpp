// SPDX-License-Identifier: MIT
// Fencing across real processes (docs/integrity.md "Quarantine"): a node on another host
// (kv_pause_helper, in its own pid namespace so it is judged by heartbeat)
// is paused with SIGSTOP past the liveness timeout and declared dead; this
// node takes its reservation or drops its pin and reuses the space; the
// paused node resumes.  Its write and publish fail with -ESTALE, its fetch
// fails and hands back no bytes, and the block this node published reads
// back byte for byte.  Every wait is bounded and names what it waited for.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/alloc.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "pool/format.hpp"

using namespace cxlkv;
using namespace std::chrono_literals;

namespace {

// 2 MiB blocks: a LARGE run of whole chunks, freed straight back to the
// global bitmap, so a freed block is the next allocation's (first fit).
constexpr uint64_t kBlock = 2ull << 20;

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/kv_pause_helper";
}

struct Helper {
  pid_t launcher = -1;  // the helper process (waits for the namespace's init)
  pid_t pid = -1;       // the node's process (init of the new pid namespace)
  FILE* in = nullptr;
  int out = -1;
  std::string buffered;
  bool skipped = false;

  // One line from the helper, or "" after `limit` (watchdog) or at EOF.
  std::string line(std::chrono::milliseconds limit = 30s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto nl = buffered.find('\n');
      if (nl != std::string::npos) {
        std::string l = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[256];
      ssize_t n = read(out, b, sizeof b);
      if (n <= 0) return "";
      buffered.append(b, static_cast<size_t>(n));
    }
  }
  // The value after `tag ` in the next line, or "" (named in the failure).
  std::string expect(const std::string& tag, std::chrono::milliseconds limit = 30s) {
    std::string l = line(limit);
    if (l.rfind(tag + " ", 0) != 0) {
      ADD_FAILURE() << "helper: waited " << limit.count() << " ms for '" << tag << "', got '" << l << "'";
      return "";
    }
    return l.substr(tag.size() + 1);
  }
  void send(const char* cmd) {
    std::fprintf(in, "%s\n", cmd);
    std::fflush(in);
  }
  ~Helper() {
    if (pid > 0) kill(pid, SIGKILL);
    if (pid > 0) kill(pid, SIGCONT);
    if (in) std::fclose(in);
    if (out >= 0) close(out);
    if (launcher > 0) waitpid(launcher, nullptr, 0);
  }
};

// Starts kv_pause_helper and waits (bounded) until it is in position.
std::unique_ptr<Helper> start(const std::vector<std::string>& args, std::string* loc) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return nullptr;
  auto h = std::make_unique<Helper>();
  h->launcher = fork();
  if (h->launcher == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    std::vector<char*> av;
    std::string exe = helper();
    av.push_back(exe.data());
    std::vector<std::string> a = args;
    for (auto& s : a) av.push_back(s.data());
    av.push_back(nullptr);
    execv(exe.c_str(), av.data());
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  h->in = fdopen(to[1], "w");
  h->out = from[0];
  std::string first = h->line();
  if (first.empty()) {  // exited before saying anything: 77 = no pid namespace here
    int st = 0;
    waitpid(h->launcher, &st, 0);
    h->launcher = -1;
    h->skipped = WIFEXITED(st) && WEXITSTATUS(st) == 77;
    return h;
  }
  if (first.rfind("PID ", 0) == 0) h->pid = std::atoi(first.c_str() + 4);
  *loc = h->expect("READY");
  return h;
}

struct Pool {
  Pool() {
    uri = "shm:cxlkv-kvpause-" + std::to_string(getpid()) + ":64M";
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    mgr = std::move(LockManager::create(*region).value());
    mgr->start();
    NodeOptions no;
    no.node = 1;
    no.heartbeat = true;
    node = std::move(NodeContext::attach(*region, no).value());
    auto s = open_kv_session(*region, *node);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message());
    session = std::move(s.value());
  }
  ~Pool() {
    session.reset();
    // Node-local files of this node and of the helper nodes 2 and 3.
    const std::string local = node->local_shm_name();
    node.reset();
    for (const char* n : {"1", "2", "3"}) shm_unlink(("/" + local.substr(0, local.size() - 1) + n).c_str());
    mgr->stop();
    mgr.reset();
    region.reset();
    std::string name = uri.substr(4, uri.rfind(':') - 4);
    shm_unlink(("/" + name).c_str());
  }
  KvStore& kv() { return session->store(); }

  // Pause `h` and wait (bounded) until this node judges it dead.
  void pause_until_dead(Helper& h, uint32_t n) {
    ASSERT_EQ(kill(h.pid, SIGSTOP), 0);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kNodeStaleMs * 5);
    for (;;) {
      auto ctrl = ControlCarve::open(*region, region->domain());
      ASSERT_TRUE(ctrl.ok());
      NodeVerdict v = judge_node(region->domain().read_fresh(ctrl->node_entry(n)));
      ASSERT_FALSE(v.local) << "the paused node must look like another host's (judged by heartbeat)";
      if (!v.alive) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "watchdog: node " << n << " still judged alive " << kNodeStaleMs * 5 << " ms after SIGSTOP (" << v.why
          << ")";
      std::this_thread::sleep_for(50ms);
    }
  }

  // reserve + write `fill` + publish one root block; its location.
  uint64_t put(const BlockKey& k, std::byte fill) {
    std::vector<std::byte> buf(kBlock, fill);
    Chunk ch{buf.data(), buf.size()};
    auto r = kv().reserve(k, nullptr, buf.size());
    EXPECT_TRUE(r.ok() && r->reserved()) << (r.ok() ? "not reserved" : r.error().message());
    if (!r.ok() || !r->reserved()) return ~0ull;
    auto w = kv().write(*r, {&ch, 1});
    EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().message());
    auto p = kv().publish(*r);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message());
    return r->loc_off;
  }

  // Bytes of block k that are not `fill` (pin, fetch, unpin).
  size_t wrong_bytes(const BlockKey& k, std::byte fill) {
    auto pin = kv().pin(k);
    EXPECT_TRUE(pin.ok()) << (pin.ok() ? "" : pin.error().message());
    if (!pin.ok()) return kBlock;
    std::vector<std::byte> got(kBlock);
    Chunk ch{got.data(), got.size()};
    auto f = kv().fetch(*pin, {&ch, 1});
    EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message());
    EXPECT_TRUE(kv().unpin(*pin).ok());
    size_t wrong = 0;
    for (std::byte b : got) wrong += b != fill;
    return wrong;
  }

  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

BlockKey key_of(uint64_t id) {
  std::vector<uint64_t> ids = {id};
  return keys_from_ids(ids)[0];
}

}  // namespace

// A writer reserves, is paused past the liveness timeout and reclaimed;
// this node publishes the same key; the writer resumes: write and publish
// fail with -ESTALE, and the block reads back as this node wrote it.
TEST(KvPause, ResumedWriterGetsEstaleAndThePublishedBlockStaysExact) {
  Pool p;
  const BlockKey k = key_of(1001);
  std::string loc;
  auto w = start({p.uri, "2", "writer", to_hex(k), std::to_string(kBlock)}, &loc);
  ASSERT_TRUE(w);
  if (w->skipped) GTEST_SKIP() << "no pid namespace for a second 'host' (needs root)";
  ASSERT_GT(w->pid, 0);
  ASSERT_FALSE(loc.empty());
  EXPECT_EQ(store_index(p.kv()).find_state(k), uint32_t(CXLKV_ENTRY_WRITING));
  p.pause_until_dead(*w, 2);

  // The dead writer's reservation is reclaimed by this node's reserve.
  p.put(k, std::byte{0xBB});
  EXPECT_EQ(store_index(p.kv()).find_state(k), uint32_t(CXLKV_ENTRY_READY));

  ASSERT_EQ(kill(w->pid, SIGCONT), 0);
  w->send("write");
  EXPECT_EQ(w->expect("WRITE"), std::to_string(-ESTALE)) << "a resumed writer's write is fenced";
  EXPECT_EQ(w->expect("PUBLISH"), std::to_string(-ESTALE)) << "a resumed writer's publish is fenced";
  w->send("exit");
  EXPECT_EQ(p.wrong_bytes(k, std::byte{0xBB}), 0u) << "the block this node published is intact";
}

// A reader pins, is paused past the liveness timeout; its pin no longer
// protects the block, which is evicted and its space reused by another
// block; the reader resumes: its fetch fails (never 0) and changes none of
// the caller's bytes.
TEST(KvPause, ResumedReaderFetchFailsAndReturnsNoBytes) {
  Pool p;
  const BlockKey k = key_of(2001), other = key_of(2002);
  const uint64_t first_loc = p.put(k, std::byte{0x11});
  std::string loc;
  auto r = start({p.uri, "3", "reader", to_hex(k), std::to_string(kBlock)}, &loc);
  ASSERT_TRUE(r);
  if (r->skipped) GTEST_SKIP() << "no pid namespace for a second 'host' (needs root)";
  ASSERT_GT(r->pid, 0);
  ASSERT_EQ(loc, std::to_string(first_loc));
  auto ev = store_index(p.kv()).evict_one(store_index(p.kv()).stripe_of(k));
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev.value()) << "a live reader's pin protects the block";

  p.pause_until_dead(*r, 3);
  ev = store_index(p.kv()).evict_one(store_index(p.kv()).stripe_of(k));
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(ev.value()) << "the dead reader's pin no longer protects the block";
  EXPECT_EQ(p.put(other, std::byte{0x22}), first_loc) << "the space is reused (first fit)";

  ASSERT_EQ(kill(r->pid, SIGCONT), 0);
  r->send("fetch");
  const std::string f = r->expect("FETCH");
  ASSERT_FALSE(f.empty());
  const int rc = std::atoi(f.c_str());
  const size_t changed = std::strtoull(f.c_str() + f.find(' ') + 1, nullptr, 10);
  EXPECT_NE(rc, 0) << "a fetch of a block that changed under the pin never succeeds";
  EXPECT_EQ(rc, -ESTALE);
  EXPECT_EQ(changed, 0u) << "the failed fetch handed the caller no bytes";
  (void)r->expect("UNPIN");
  r->send("exit");
  EXPECT_EQ(p.wrong_bytes(other, std::byte{0x22}), 0u);
}

namespace {

// The stray-store scenario: a writer reserves KEY and is paused after its
// checks passed (a copy in flight); it is declared dead, this node takes
// the reservation and publishes KEY and another block; the writer resumes
// and its copy stores 0xEE.. into the location it had reserved.  Returns
// the bytes of the two published blocks that are not what this node wrote,
// and whether the writer's location was reused.
struct StrayOutcome {
  bool skipped = false;
  bool reused = false;
  size_t wrong = 0;
  uint64_t writer_loc = 0;
  std::unique_ptr<Helper> writer;  // still running (and beating) until reset
};

StrayOutcome stray_store_after_reclaim(Pool& p, uint64_t id) {
  StrayOutcome out;
  const BlockKey k = key_of(id), other = key_of(id + 1);
  std::string loc;
  auto w = start({p.uri, "2", "stray", to_hex(k), std::to_string(kBlock)}, &loc);
  if (!w || w->skipped) {
    out.skipped = true;
    return out;
  }
  EXPECT_GT(w->pid, 0);
  EXPECT_FALSE(loc.empty());
  out.writer_loc = std::strtoull(loc.c_str(), nullptr, 10);
  p.pause_until_dead(*w, 2);
  const uint64_t a = p.put(k, std::byte{0xBB});
  const uint64_t b = p.put(other, std::byte{0xCC});
  out.reused = a == out.writer_loc || b == out.writer_loc;
  EXPECT_EQ(kill(w->pid, SIGCONT), 0);
  w->send("stray");
  EXPECT_EQ(w->expect("STRAY"), "0");
  out.wrong = p.wrong_bytes(k, std::byte{0xBB}) + p.wrong_bytes(other, std::byte{0xCC});
  out.writer = std::move(w);
  return out;
}

}  // namespace

// Space taken from a node declared dead is quarantined: what a resumed
// process still stores into it lands in no published block; once that node
// has resumed and beaten twice the space is released and reused.
TEST(KvPause, SpaceTakenFromAPausedWriterIsQuarantinedUntilItResumed) {
  Pool p;
  set_reclaim_quarantine(std::chrono::minutes(10));
  auto chunks = ChunkAllocator::open(*p.node);
  ASSERT_TRUE(chunks.ok());
  StrayOutcome s = stray_store_after_reclaim(p, 3001);
  if (s.skipped) GTEST_SKIP() << "no pid namespace for a second 'host' (needs root)";
  EXPECT_FALSE(s.reused) << "the dead writer's space is not handed out while it is quarantined";
  EXPECT_EQ(s.wrong, 0u) << "the resumed writer's store landed in a published block";
  EXPECT_EQ(chunks->quarantined_chunks(), 1u);

  // The writer resumed and beats again: released well before the period.
  auto deadline = std::chrono::steady_clock::now() + 20s;
  uint64_t released = 0;
  while (released == 0) {
    auto r = chunks->release_quarantine();
    ASSERT_TRUE(r.ok()) << r.error().message();
    released = r.value();
    if (released) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "watchdog: quarantine not released 20 s after the writer resumed";
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(released, 1u);
  EXPECT_EQ(chunks->quarantined_chunks(), 0u);
  s.writer->send("exit");
  EXPECT_EQ(p.put(key_of(3100), std::byte{0x44}), s.writer_loc) << "released space is reused";
  EXPECT_EQ(p.wrong_bytes(key_of(3100), std::byte{0x44}), 0u);
}

// What the quarantine guards: with it off, the same resumed store lands in
// the block this node published in the reused space.
TEST(KvPause, WithoutQuarantineAResumedStoreCorruptsTheReusedBlock) {
  Pool p;
  set_reclaim_quarantine(std::chrono::milliseconds(0));
  const StrayOutcome s = stray_store_after_reclaim(p, 4001);
  set_reclaim_quarantine(std::chrono::minutes(10));
  if (s.skipped) GTEST_SKIP() << "no pid namespace for a second 'host' (needs root)";
  EXPECT_TRUE(s.reused);
  EXPECT_GT(s.wrong, 0u) << "the simulator of a paused copy did not reach the reused block";
}
