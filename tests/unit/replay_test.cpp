// SPDX-License-Identifier: MIT
// The main job's fidelity: with unbounded capacity the replay's token hit
// ratio equals the trace's theoretical prefix reuse, on a generated trace and
// on the real trace when it is present; workload parsing and bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "replay_run.hpp"

#include "workload/workload.hpp"

using namespace cxlkv;

namespace {

using replay_run::field;
using replay_run::run;

std::string write_trace(const std::vector<Request>& reqs) {
  std::string path = "/tmp/cxlkv-replay-test-" + std::to_string(getpid()) + ".jsonl";
  std::ofstream f(path);
  for (auto& r : reqs) {
    f << "{\"timestamp\": " << r.timestamp_ms << ", \"input_length\": " << r.input_length
      << ", \"output_length\": " << r.output_length << ", \"hash_ids\": [";
    for (size_t i = 0; i < r.hash_ids.size(); i++) f << (i ? ", " : "") << r.hash_ids[i];
    f << "]}\n";
  }
  return path;
}

}  // namespace

TEST(Workload, TheoreticalReuseCountsLeadingSeenBlocksCappedAtInput) {
  std::vector<Request> reqs(3);
  reqs[0].input_length = 1024;
  reqs[0].hash_ids = {1, 2};
  reqs[1].input_length = 1200;  // blocks 1,2 seen, 3 new -> 1024 tokens
  reqs[1].hash_ids = {1, 2, 3};
  reqs[2].input_length = 700;  // blocks 1,2 seen, capped at 700
  reqs[2].hash_ids = {1, 2};
  auto pr = theoretical_prefix_reuse(reqs);
  EXPECT_EQ(pr.input_tokens, 2924u);
  EXPECT_EQ(pr.reused_tokens, 1024u + 700u);
  EXPECT_EQ(pr.unique_blocks, 3u);
}

TEST(Workload, GeneratorIsDeterministicAndNearItsTargets) {
  GeneratorOptions g;
  g.requests = 2000;
  auto a = generate_workload(g), b = generate_workload(g);
  ASSERT_EQ(a.size(), 2000u);
  double in = 0;
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i].hash_ids, b[i].hash_ids);
    in += a[i].input_length;
  }
  EXPECT_NEAR(in / a.size(), 4449, 300);
  EXPECT_GT(theoretical_prefix_reuse(a).ratio(), 0.1);
}

TEST(Workload, BadTraceLinesAreErrorsNamingTheLine) {
  std::string path = "/tmp/cxlkv-bad-trace-" + std::to_string(getpid()) + ".jsonl";
  {
    std::ofstream f(path);
    f << "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n";
    f << "{\"timestamp\": 1, \"input_length\": 512}\n";
  }
  auto r = read_trace(path);
  std::remove(path.c_str());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find(":2:"), std::string::npos) << r.error().message();
  EXPECT_FALSE(read_trace("/nonexistent/trace.jsonl").ok());
}

TEST(Replay, UnboundedHitRatioEqualsTheoreticalReuseOnAGeneratedTrace) {
  GeneratorOptions g;
  g.requests = 40;
  g.seed = 7;
  std::string path = write_trace(generate_workload(g));
  int st;
  std::string out = run("--trace " + path + " --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  std::remove(path.c_str());
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_GT(field(out, "hit_tokens"), 0u) << out;
  EXPECT_EQ(field(out, "hit_tokens"), field(out, "theoretical_hit_tokens")) << out;
  EXPECT_EQ(field(out, "decode_misses"), 0u) << out;
}

TEST(Replay, UnboundedHitRatioEqualsTheoreticalReuseOnTheRealTrace) {
  const char* path = "/work/shared/traces/synthetic_trace.jsonl";
  if (access(path, R_OK) != 0) GTEST_SKIP() << path << " not present";
  int st;
  std::string out = run(std::string("--trace ") + path + " --requests 30 --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_EQ(field(out, "hit_tokens"), field(out, "theoretical_hit_tokens")) << out;
}

TEST(Replay, BoundedCapacityStillReadsOnlyCorrectBytes) {
  int st;
  std::string out = run("--requests 30 --capacity 40 --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_LE(field(out, "hit_tokens"), field(out, "theoretical_hit_tokens")) << out;
}

TEST(Replay, PayloadStripedOverTwoPoolsIsReadBackByteExact) {
  // --interleave 2 stripes every block over two shm pools; decode workers
  // verify every byte they fetch, so a wrong stripe map is an error.
  int st;
  std::string out =
      run("--requests 30 --interleave 2 --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_GT(field(out, "blocks_read"), 0u) << out;
  EXPECT_EQ(field(out, "decode_misses"), 0u) << out;
  EXPECT_EQ(field(out, "hit_tokens"), field(out, "theoretical_hit_tokens")) << out;
}

TEST(Replay, BadOptionsAreRefused) {
  int st;
  run("--prefill 0", &st);
  EXPECT_NE(st, 0);
  run("--trace /nonexistent.jsonl", &st);
  EXPECT_NE(st, 0);
}
