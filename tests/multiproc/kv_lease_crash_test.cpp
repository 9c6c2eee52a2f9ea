// SPDX-License-Identifier: MIT
// Handoff leases across real processes (docs/eviction.md "Handoff leases"): a decode worker killed
// with SIGKILL while blocks are leased to it stops protecting them within the
// liveness rule (its process is gone), so they become evictable and the
// prefill that was refused space makes progress; a prefill killed after it
// published and leased blocks for a decode leaves them readable to that
// decode, and a lease that ended meanwhile says so (-ETIMEDOUT, named).
// Every wait is bounded by a watchdog that names what it waited for.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "pool/format.hpp"
#include "support/proc_util.hpp"

using namespace cxlkv;
using namespace std::chrono_literals;

namespace {

// Ends the test process with a message naming the wait when it is not
// disarmed in time (a hang becomes a failure that says what hung).
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit) : what_(std::move(what)) {
    t_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, limit, [this] { return done_; })) {
        std::fprintf(stderr, "watchdog: %s: not done within %lld s\n", what_.c_str(), (long long)limit.count());
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    t_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread t_;
};

std::string helper() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return std::string(t ? t : "tools") + "/../tests/kv_lease_helper";
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
};

// Starts the helper and waits (at most 20 s) for its READY line.
Child start(const std::vector<std::string>& args, const std::string& what) {
  std::vector<std::string> argv = {helper()};
  argv.insert(argv.end(), args.begin(), args.end());
  Child c;
  c.pid = proc_util::spawn(argv, &c.fd);
  if (c.pid < 0) return {};
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (got.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{c.fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char b[64];
    ssize_t n = read(c.fd, b, sizeof b);
    if (n <= 0) break;
    got.append(b, size_t(n));
  }
  if (got != "READY\n") {
    ADD_FAILURE() << what << ": helper did not print READY within 20 s (got '" << got << "')";
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    close(c.fd);
    c.pid = -1;
  }
  return c;
}

void kill9(Child& c, const std::string& what) {
  Watchdog w("reaping " + what + " after SIGKILL", 20s);
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  close(c.fd);
  c.pid = -1;
}

struct Pool {
  explicit Pool(uint64_t max_blocks) {
    uri = "shm:cxlkv-leasecrash-" + std::to_string(getpid()) + ":64M";
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    auto ic = region->carve(CXLKV_CARVE_INDEX);
    EXPECT_TRUE(ic.ok());
    IndexPolicy pol;
    pol.max_blocks = max_blocks;  // pool-wide capacity, before any node attaches
    EXPECT_TRUE(index_set_policy(region->domain(), region->at(ic->offset), pol).ok());
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
    node.reset();
    mgr->stop();
    mgr.reset();
    region.reset();
    std::string name = uri.substr(4, uri.rfind(':') - 4);
    shm_unlink(("/" + name).c_str());
  }
  KvStore& kv() { return session->store(); }
  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

std::vector<BlockKey> keys_of(uint64_t first, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = first + i;
  return keys_from_ids(ids);
}

bool put_root(KvStore& kv, const BlockKey& k) {
  std::vector<std::byte> buf(4096, std::byte{1});
  Chunk ch{buf.data(), buf.size()};
  std::int32_t st = 0;
  uint32_t one = 1;
  auto r = kv.put_chain(nullptr, std::span(&k, 1), buf.size(), std::span(&ch, 1), std::span(&one, 1),
                        std::span(&st, 1));
  return r && r.value() == 1 && st == kKvReserved;
}

}  // namespace

// The pool holds 6 blocks; the prefill (this process, node 1) leases all 6
// for a decode worker on node 3.  While it lives, a further reserve is
// refused (every block is leased).  kill -9 of the decode worker: within the
// liveness bound its leases stop protecting the blocks, the prefill's next
// reserves evict them, and the ends are counted as consumer deaths.
TEST(KvLeaseCrash, DecodeWorkerKilledHoldingLeasesFreesItsBlocksAndPrefillProgresses) {
  Pool p(6);
  KvStore& kv = p.kv();
  auto leased = keys_of(500, 6);
  for (auto& k : leased) ASSERT_TRUE(put_root(kv, k));
  Child decode = start({p.uri, "3", "consumer"}, "decode worker (node 3)");
  ASSERT_GT(decode.pid, 0);
  std::vector<int32_t> st(6);
  auto l = kv.lease(leased, 77, 3, 600000, st);  // ten minutes: only the death can end it
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l.value(), 6u) << kv.last_block_error();
  auto fresh = keys_of(900, 3);
  EXPECT_FALSE(put_root(kv, fresh[0])) << "every block is leased to a live decode: nothing may be evicted";
  EXPECT_EQ(kv.lookup(std::span(leased).first(1)), 1u);

  kill9(decode, "decode worker (node 3)");
  // The liveness rule on this host: the node's process (pid + start time) is
  // gone.  Bound: 10 s (the heartbeat rule for other hosts is slower).
  {
    Watchdog w("prefill reserving after the decode worker's death (leases ended by node death)", 30s);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    bool ok = false;
    while (!(ok = put_root(kv, fresh[0])) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(ok) << "prefill still refused 10 s after the decode worker died: " << kv.last_block_error();
  }
  EXPECT_TRUE(put_root(kv, fresh[1]));
  EXPECT_TRUE(put_root(kv, fresh[2]));
  EXPECT_EQ(kv.lookup(std::span(fresh).first(1)), 1u);
  IndexUsage u = store_index(kv).usage();
  EXPECT_GE(u.lease_dead, 3u) << "each evicted block's lease is counted as ended by its consumer node's death";
  EXPECT_EQ(u.used_blocks, 6u) << "capacity held";
  // The decode (restarted elsewhere) releasing what survived learns why.
  auto rl = kv.lease_release(leased, 77, st);
  ASSERT_TRUE(rl.ok());
  for (size_t i = 0; i < leased.size(); i++)
    EXPECT_TRUE(st[i] == -ETIMEDOUT || st[i] == kKvMiss) << "block " << i << ": " << st[i];
}

// A prefill (node 2) puts a 4-block chain, leases it for this decode (node 1)
// and is killed.  The decode still reads every block byte for byte (the
// lease belongs to the consumer, not to the dead producer), eviction passes
// the leased blocks over, and the release succeeds.  A second producer leases
// with a 300 ms ttl and dies: after the ttl the decode's release says the
// lease had expired (-ETIMEDOUT, and the message names the cause).
TEST(KvLeaseCrash, ProducerKilledAfterPublishingForAConsumerLeavesItReadable) {
  Pool p(64);
  KvStore& kv = p.kv();
  auto chain = keys_of(700, 4);
  std::vector<std::string> args = {p.uri, "2", "producer", "1", "600000"};
  for (auto& k : chain) args.push_back(to_hex(k));
  Child prefill = start(args, "prefill (node 2)");
  ASSERT_GT(prefill.pid, 0);
  kill9(prefill, "prefill (node 2)");

  for (int i = 0; i < 8; i++) {
    auto ev = store_index(kv).evict_any();
    ASSERT_TRUE(ev.ok());
    EXPECT_FALSE(ev.value()) << "the chain is leased to a live consumer: nothing to evict";
  }
  std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(4096));
  std::vector<Chunk> chunks;
  for (auto& b : bufs) chunks.push_back(Chunk{b.data(), b.size()});
  std::vector<uint32_t> nchunks(4, 1);
  std::vector<int32_t> st(4);
  auto got = kv.get_many(chain, chunks, nchunks, st);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value(), 4u) << kv.last_block_error();
  for (size_t i = 0; i < 4; i++)
    for (std::byte b : bufs[i]) ASSERT_EQ(b, std::byte(static_cast<uint8_t>(0x40 + i))) << "block " << i;
  auto rl = kv.lease_release(chain, 88, st);
  ASSERT_TRUE(rl.ok());
  EXPECT_EQ(rl.value(), 4u) << kv.last_block_error();

  auto chain2 = keys_of(800, 2);
  args = {p.uri, "2", "producer", "1", "300"};
  for (auto& k : chain2) args.push_back(to_hex(k));
  Child prefill2 = start(args, "second prefill (node 2, 300 ms leases)");
  ASSERT_GT(prefill2.pid, 0);
  kill9(prefill2, "second prefill (node 2)");
  std::this_thread::sleep_for(400ms);
  std::vector<int32_t> st2(2);
  rl = kv.lease_release(chain2, 88, st2);
  ASSERT_TRUE(rl.ok());
  EXPECT_EQ(rl.value(), 0u);
  EXPECT_EQ(st2, (std::vector<int32_t>{-ETIMEDOUT, -ETIMEDOUT}));
  EXPECT_NE(kv.last_block_error().find("expired"), std::string::npos) << kv.last_block_error();
}
