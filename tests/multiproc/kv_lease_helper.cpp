// SPDX-License-Identifier: MIT
// Helper for kv_lease_crash_test: a node of a prefill -> decode handoff that
// is killed with SIGKILL while leases are involved.
//   kv_lease_helper POOL NODE consumer
//       a decode worker: attaches as NODE (its leases name this node) and waits
//   kv_lease_helper POOL NODE producer CONSUMER_NODE TTL_MS KEYS...
//       a prefill worker: puts KEYS as a chain (block i filled with byte 0x40+i)
//       and leases them for consumer id 88 on CONSUMER_NODE with TTL_MS
// Prints "READY" when in position, then sleeps until killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

using namespace cxlkv;

int main(int argc, char** argv) {
  if (argc < 4) return 2;
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
  if (mode == "producer") {
    if (argc < 7) return 2;
    const uint32_t consumer_node = static_cast<uint32_t>(std::atoi(argv[4]));
    const uint32_t ttl = static_cast<uint32_t>(std::atoi(argv[5]));
    std::vector<BlockKey> keys;
    for (int i = 6; i < argc; i++) {
      BlockKey k;
      if (!parse_key(argv[i], &k)) return 2;
      keys.push_back(k);
    }
    std::vector<std::vector<std::byte>> bufs(keys.size());
    std::vector<Chunk> chunks;
    for (size_t i = 0; i < keys.size(); i++) {
      bufs[i].assign(4096, std::byte(static_cast<uint8_t>(0x40 + i)));
      chunks.push_back(Chunk{bufs[i].data(), bufs[i].size()});
    }
    std::vector<uint32_t> nchunks(keys.size(), 1);
    std::vector<int32_t> st(keys.size());
    auto put = kv.put_chain(nullptr, keys, 4096, chunks, nchunks, st);
    if (!put || put.value() != keys.size()) return std::fprintf(stderr, "put_chain failed\n"), 1;
    auto l = kv.lease(keys, 88, consumer_node, ttl, st);
    if (!l || l.value() != keys.size()) return std::fprintf(stderr, "lease failed\n"), 1;
  } else if (mode != "consumer") {
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  for (;;) pause();
}
