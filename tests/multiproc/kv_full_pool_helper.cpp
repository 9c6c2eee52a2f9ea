// SPDX-License-Identifier: MIT
// Helper for kv_full_pool_test: a writer on a full pool, killed at random.
//   kv_full_pool_helper POOL NODE writer SEED BYTES FAMILIES
//       put_chain chains of random families (full_pool_common.hpp) again
//       and again; lease each chain's cached blocks to a consumer id of the
//       test's node and acknowledge them on stdout ("A <consumer> <lease
//       time, realtime ms> <key>..."),
//       then read another
//       family's cached prefix and check its bytes ("V <verified> <wrong>");
//       a failed put prints "E <errno> <message>".  "READY" after the first
//       chain.  Runs until killed.
//   kv_full_pool_helper POOL NODE remote-writer SEED BYTES FAMILIES
//       the same in a pid namespace of its own, standing for a process of
//       another host (liveness by heartbeat); prints "PID <pid>" first:
//       the writer's pid, the one to kill.
//   kv_full_pool_helper POOL NODE fresh SEED BYTES CHAINS
//       put CHAINS chains of families of its own (never used by writers),
//       each whole, and exit 0 when every one went in whole, else 1
//       (each failure on stderr).
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "multiproc/full_pool_common.hpp"

using namespace cxlkv;
using namespace cxlkv::fullpool;

namespace {

struct Bufs {
  explicit Bufs(size_t bytes) : data(kMaxChain, std::vector<std::byte>(bytes)), nchunks(kMaxChain, 1) {
    for (auto& d : data) chunks.push_back(Chunk{d.data(), d.size()});
  }
  std::vector<std::vector<std::byte>> data;
  std::vector<Chunk> chunks;
  std::vector<uint32_t> nchunks;
};

// put_chain of `keys` with their bytes; returns the leading cached count.
Result<size_t> put(KvStore& kv, const std::vector<BlockKey>& keys, Bufs& b, std::vector<int32_t>& st) {
  for (size_t i = 0; i < keys.size(); i++) fill(keys[i], b.data[i].data(), b.data[i].size());
  st.assign(keys.size(), 0);
  return kv.put_chain(nullptr, keys, b.data[0].size(), std::span(b.chunks).first(keys.size()),
                      std::span(b.nchunks).first(keys.size()), st);
}

}  // namespace

int work(int argc, char** argv);

int main(int argc, char** argv) {
  if (argc != 7) return 2;
  if (std::string(argv[3]) != "remote-writer") return work(argc, argv);
  if (unshare(CLONE_NEWPID) != 0) return std::fprintf(stderr, "no pid namespace: %s\n", std::strerror(errno)), 77;
  std::fflush(stdout);
  const pid_t child = fork();  // the new namespace's init: the writer
  if (child < 0) return 1;
  if (child == 0) _exit(work(argc, argv));
  std::printf("PID %d\n", static_cast<int>(child));
  std::fflush(stdout);
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int work(int argc, char** argv) {
  (void)argc;
  auto region = Region::open(argv[1]);
  if (!region) return std::fprintf(stderr, "%s\n", region.error().message().c_str()), 1;
  NodeOptions no;
  no.node = static_cast<uint32_t>(std::atoi(argv[2]));
  no.heartbeat = true;
  auto node = NodeContext::attach(*region.value(), no);
  if (!node) return std::fprintf(stderr, "%s\n", node.error().message().c_str()), 1;
  auto s = open_kv_session(*region.value(), *node.value());
  if (!s) return std::fprintf(stderr, "%s\n", s.error().message().c_str()), 1;
  KvStore& kv = s.value()->store();
  const std::string mode = argv[3];
  std::mt19937_64 rng(std::strtoull(argv[4], nullptr, 10));
  const size_t bytes = std::strtoull(argv[5], nullptr, 10);
  const uint64_t n = std::strtoull(argv[6], nullptr, 10);
  Bufs b(bytes);
  std::vector<int32_t> st;
  if (mode == "fresh") {
    int failed = 0;
    for (uint64_t c = 0; c < n; c++) {
      auto keys = family_chain(1000000 + rng() % 1000000, kMaxChain);
      auto r = put(kv, keys, b, st);
      if (!r || r.value() != keys.size()) {
        std::fprintf(stderr, "fresh writer: chain %llu: %zu of %zu blocks: %s\n", (unsigned long long)c,
                     r ? r.value() : size_t(0), keys.size(),
                     r ? kv.last_block_error().c_str() : r.error().message().c_str());
        failed++;
      }
    }
    return failed ? 1 : 0;
  }
  if (mode != "writer" && mode != "remote-writer") return 2;
  bool ready = false;
  uint64_t acks = 0;
  const uint64_t consumer_base = (rng() & 0xffffffffffull) << 24;  // 2^24 acknowledgements per writer
  std::vector<std::byte> got(bytes);
  for (;;) {
    auto keys = family_chain(rng() % n, 2 + rng() % (kMaxChain - 1));
    auto r = put(kv, keys, b, st);
    if (!r) {
      std::printf("E %d %s\n", r.error().code(), r.error().message().c_str());
    } else {
      if (r.value() < keys.size()) {
        size_t i = r.value();
        if (st[i] < 0 && st[i] != -ECANCELED) std::printf("E %d %s\n", st[i], kv.last_block_error().c_str());
      }
      // Acknowledged: cached and leased to the test's consumer, which reads
      // and releases them.
      // One consumer (request) id per acknowledgement: leases of one
      // consumer do not add up, those of several do.  Drawn from the seed,
      // not the pid: every writer in a pid namespace of its own is pid 1.
      const uint64_t consumer = kConsumer + consumer_base + ++acks;
      std::vector<BlockKey> have(keys.begin(), keys.begin() + r.value());
      std::vector<int32_t> ls(have.size());
      if (!have.empty() && kv.lease(have, consumer, kConsumerNode, kLeaseMs, ls)) {
        timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const uint64_t ms = uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
        std::string line = "A " + std::to_string(consumer) + " " + std::to_string(ms);
        for (size_t i = 0; i < have.size(); i++)
          if (ls[i] == 0) line += " " + to_hex(have[i]);
        std::printf("%s\n", line.c_str());
      }
    }
    // A reader too: another family's cached prefix, every byte checked.
    auto other = family_chain(rng() % n, kMaxChain);
    uint64_t ok = 0, wrong = 0;
    const size_t cached = kv.lookup(other);
    for (size_t i = 0; i < cached; i++) {
      Chunk ch{got.data(), got.size()};
      std::vector<int32_t> gs(1);
      auto g = kv.get_many(std::span(&other[i], 1), std::span(&ch, 1), std::span(b.nchunks).first(1), gs);
      if (!g || g.value() != 1) continue;  // evicted meanwhile
      (verify(other[i], got.data(), got.size()) ? ok : wrong)++;
    }
    if (ok || wrong) std::printf("V %llu %llu\n", (unsigned long long)ok, (unsigned long long)wrong);
    if (!ready) {
      std::printf("READY\n");
      ready = true;
    }
    std::fflush(stdout);
  }
}
