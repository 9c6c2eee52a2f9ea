// SPDX-License-Identifier: MIT
// Helper for kv_crash_test: a node that is killed with SIGKILL in the middle
// of its work.
//   kv_crash_helper POOL NODE writer KEYS...   reserve + write (not publish) KEYS as
//                                              a chain below a published first key
//   kv_crash_helper POOL NODE reader KEY       pin KEY
// Prints "READY" when in position, then sleeps until killed.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

using namespace cxlkv;

int main(int argc, char** argv) {
  if (argc < 5) return 2;
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
  std::string mode = argv[3];
  std::vector<BlockKey> keys;
  for (int i = 4; i < argc; i++) {
    BlockKey k;
    if (!parse_key(argv[i], &k)) return 2;
    keys.push_back(k);
  }
  std::vector<std::byte> buf(4096, std::byte{0x77});
  Chunk ch{buf.data(), buf.size()};
  if (mode == "writer") {
    // keys[0] is published by the test; reserve the rest and write half of the payload.
    for (size_t i = 1; i < keys.size(); i++) {
      auto r = kv.reserve(keys[i], &keys[i - 1], buf.size());
      if (!r || !r->reserved()) return std::fprintf(stderr, "reserve failed\n"), 1;
      if (!kv.write(*r, {&ch, 1})) return 1;
    }
  } else if (mode == "reader") {
    if (!kv.pin(keys[0])) return std::fprintf(stderr, "pin failed\n"), 1;
  } else {
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  for (;;) pause();
}
