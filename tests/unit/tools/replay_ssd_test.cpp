// SPDX-License-Identifier: MIT
// The main job with an SSD tier (docs/eviction.md "The SSD tier"): under a bounded memory capacity,
// blocks evicted from memory are demoted to an SSD file and read back from
// it byte-exact, so the token hit ratio is at least that of the same memory
// capacity without the SSD tier.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/replay_run.hpp"

namespace {

using replay_run::field;
using replay_run::run;

double ratio(const std::string& json) {
  size_t p = json.find("\"token_hit_ratio\": ");
  return p == std::string::npos ? -1 : std::strtod(json.c_str() + p + 19, nullptr);
}

}  // namespace

TEST(ReplaySsd, DemotedBlocksAreHitOnSsdByteExactAndRaiseTheHitRatio) {
  // O_DIRECT needs a real file system: /tmp, not /dev/shm.
  const std::string img = "/tmp/cxlkv-replay-ssd-test-" + std::to_string(getpid()) + ".img";
  // 256 KiB blocks (1 layer), 60 requests, memory for 40 blocks only.
  const std::string common = "--requests 60 --layers 1 --prefill 2 --decode 1 --capacity 40 ";
  int st_mem = -1, st_ssd = -1;
  std::string mem = run(common, &st_mem);
  std::string ssd = run(common + "--ssd " + img, &st_ssd);
  std::remove(img.c_str());
  ASSERT_EQ(st_mem, 0) << mem;
  ASSERT_EQ(st_ssd, 0) << ssd;

  EXPECT_EQ(field(ssd, "errors"), 0u);               // every fetched block verified byte by byte
  // Decode finds at least as many prompt blocks as with memory alone.
  EXPECT_LE(field(ssd, "decode_misses"), field(mem, "decode_misses"));
  EXPECT_GT(field(ssd, "tier.ssd.demotions"), 0u);   // memory was bounded: blocks went to the SSD
  EXPECT_GT(field(ssd, "tier.ssd.hits"), 0u);        // ... and were read back from it
  EXPECT_EQ(field(ssd, "tier.ssd.bytes"), field(ssd, "tier.ssd.hits") * field(ssd, "block_bytes"));
  EXPECT_EQ(field(ssd, "tier.mem.hits") + field(ssd, "tier.ssd.hits"), field(ssd, "blocks_read"));
  EXPECT_EQ(field(mem, "tier.ssd.hits"), 0u);        // no SSD tier, no SSD hits
  EXPECT_GE(ratio(ssd), ratio(mem));
  EXPECT_GT(ratio(ssd), ratio(mem));  // this workload reuses evicted prefixes: the SSD tier must show
}
