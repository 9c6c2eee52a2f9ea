// SPDX-License-Identifier: MIT
// The main job's fidelity: with unbounded capacity the replay's token hit
// ratio equals the trace's theoretical prefix reuse, on a generated trace and
// on the real trace when it is present; workload parsing and bad input.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/proc_util.hpp"
#include "support/replay_run.hpp"

#include "cxlkv/sync.hpp"
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

TEST(Workload, MalformedTracesAreRefusedNamingTheFileTheLineAndTheCause) {
  const std::string path = "/tmp/cxlkv-bad-trace2-" + std::to_string(getpid()) + ".jsonl";
  const std::string good = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";
  auto refused = [&](const std::string& second_line) {
    std::ofstream(path) << good << second_line << "\n";
    auto r = read_trace(path);
    std::remove(path.c_str());
    return r.ok() ? std::string("accepted") : r.error().message();
  };
  const std::string at = "trace " + path + ":2: ";
  // A line cut short, a missing field: the field is named.
  EXPECT_EQ(refused("{\"timestamp\": 1, \"input_le").find(at + "no field \"input_length\""), 0u)
      << refused("{\"timestamp\": 1, \"input_le");
  // NaN and 1e300 became 0 (and an 'input_length 0' message) or any number.
  std::string nan = refused("{\"timestamp\": nan, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}");
  EXPECT_EQ(nan.find(at + "field \"timestamp\" is not a number"), 0u) << nan;
  std::string huge = refused("{\"timestamp\": 0, \"input_length\": 1e300, \"output_length\": 1, \"hash_ids\": [1]}");
  EXPECT_EQ(huge.find(at + "field \"input_length\" is not a number"), 0u) << huge;
  // -1 read as 2^64-1.
  std::string neg = refused("{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [-1]}");
  EXPECT_EQ(neg.find(at + "field \"hash_ids\" holds '-1'"), 0u) << neg;
  // Fewer block ids than the input needs replayed a shorter prompt, silently.
  std::string few = refused("{\"timestamp\": 0, \"input_length\": 4096, \"output_length\": 1, \"hash_ids\": [1]}");
  EXPECT_EQ(few, at + "hash_ids has 1 block ids; input_length 4096 needs 8 (one per 512 tokens)");
  // A directory read as an empty file ("no requests").
  auto dir = read_trace("/tmp");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message(), "trace /tmp: is a directory, not a JSONL trace file");
}

TEST(Workload, LruReferenceHitsCachedLeadingBlocksAndEvictsTheLeastRecentlyUsed) {
  auto req = [](std::vector<uint64_t> ids) {
    Request r;
    r.input_length = uint32_t(ids.size() * kTraceBlockTokens);
    r.hash_ids = std::move(ids);
    return r;
  };
  // Capacity 2.  A [1,2]: both inserted (2 most recent).  B [1,2]: two hits.
  // C [3]: 3 inserted, 1 (least recent) evicted.  D [1,2]: 1 missing, so 2 is
  // no hit although cached (a prefix cache cannot use it); inserting 1 evicts
  // 2, reinserting 2 evicts 3.
  std::vector<Request> reqs = {req({1, 2}), req({1, 2}), req({3}), req({1, 2})};
  auto lr = lru_reference(reqs, 2);
  EXPECT_EQ(lr.input_tokens, 7u * kTraceBlockTokens);
  EXPECT_EQ(lr.hit_blocks, 2u);
  EXPECT_EQ(lr.hit_tokens, 2u * kTraceBlockTokens);
  EXPECT_EQ(lr.evictions, 3u);
  // With room for everything LRU is exactly the theoretical prefix reuse.
  EXPECT_EQ(lru_reference(reqs, 100).hit_tokens, theoretical_prefix_reuse(reqs).reused_tokens);
}

TEST(Workload, LruReferenceOnTheSyntheticTraceMatchesTheIssueFigure) {
  std::string path = replay_run::synthetic_trace();
  if (path.empty()) GTEST_SKIP() << "synthetic trace not present";
  auto reqs = read_trace(path);
  ASSERT_TRUE(reqs.ok()) << reqs.error().message();
  // Block-LRU with a 2000-block capacity gets 0.147.
  EXPECT_NEAR(lru_reference(reqs.value(), 2000).ratio(), 0.147, 0.001);
}

TEST(Replay, BoundedRunsPrintTheBlockLruReferenceAndTheSweepItsFourCapacities) {
  GeneratorOptions g;
  g.requests = 30;  // the replay's built-in generator with --requests 30 (seed 1)
  auto reqs = generate_workload(g);
  const uint64_t distinct = theoretical_prefix_reuse(reqs).unique_blocks;
  int st;
  std::string out = run("--requests 30 --capacity 40 --sweep --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NEAR(replay_run::dfield(out, "lru_token_hit_ratio"), lru_reference(reqs, 40).ratio(), 1e-5) << out;
  EXPECT_NEAR(replay_run::dfield(out, "hit_vs_lru"),
              replay_run::dfield(out, "token_hit_ratio") / lru_reference(reqs, 40).ratio(), 1e-3) << out;
  EXPECT_EQ(field(out, "distinct_blocks"), distinct) << out;
  size_t sw = out.find("\"sweep\": [");
  ASSERT_NE(sw, std::string::npos) << out;
  size_t at = sw;
  for (double f : kSweepFractions) {
    at = out.find("\"capacity_blocks\": ", at + 1);
    ASSERT_NE(at, std::string::npos) << "sweep point " << f << " missing: " << out;
    uint64_t cap = std::max<uint64_t>(16, uint64_t(double(distinct) * f));
    EXPECT_EQ(std::strtoull(out.c_str() + at + 19, nullptr, 10), cap) << out;
    EXPECT_NEAR(replay_run::dfield(out, "lru_token_hit_ratio", at), lru_reference(reqs, cap).ratio(), 1e-5) << out;
    EXPECT_EQ(replay_run::dfield(out, "errors", at), 0) << out;
  }
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
  std::string path = replay_run::synthetic_trace();
  if (path.empty()) GTEST_SKIP() << "synthetic trace not present";
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

TEST(Replay, ReportsEachStepsLatencyAndTheWholePublishAndFetchSeparately) {
  int st;
  std::string out = run("--requests 30 --prefill 2 --decode 1 --layers 1 --head-size 16", &st);
  ASSERT_EQ(st, 0) << out;
  for (const char* op : {"lookup", "reserve", "write", "publish", "pin", "fetch", "unpin", "whole_publish",
                         "whole_fetch"}) {
    std::string n = op;
    EXPECT_GT(field(out, n + "_calls"), 0u) << n << ": " << out;
    EXPECT_GT(replay_run::dfield(out, n + "_us_p50"), 0) << n << ": " << out;
    EXPECT_GE(replay_run::dfield(out, n + "_us_p99"), replay_run::dfield(out, n + "_us_p50")) << n << ": " << out;
  }
  // One whole publish per request that wrote something, one whole fetch per
  // decoded request (and per prefill with hits).
  EXPECT_LE(field(out, "whole_publish_calls"), 30u) << out;
  EXPECT_GE(field(out, "whole_fetch_calls"), 30u) << out;
  // A whole publish contains at least one publish call, so its slowest
  // requests are no faster than a typical publish.
  EXPECT_GE(replay_run::dfield(out, "whole_publish_us_p99"), replay_run::dfield(out, "publish_us_p50")) << out;
}

using proc_util::children_of;
using proc_util::running;
using proc_util::shm_entries_containing;
using proc_util::slurp;

TEST(Replay, KillMinus9OfTheParentLeavesNoWorkerRunningAndNoPoolOrCoordinationSegment) {
  // A slow run (trace time at wall speed) so that it is mid-way when killed.
  const std::string err = "/tmp/cxlkv-replay-kill-test-" + std::to_string(getpid()) + ".err";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    std::string exe = replay_run::tools() + "/cxlkv-replay";
    // --small-pages: the pool in /dev/shm, where a kill could leave it (the
    // default private tmpfs has no name to leave: huge_tmpfs.hpp).
    execl(exe.c_str(), exe.c_str(), "--requests", "3000", "--time-scale", "1", "--prefill", "2", "--decode", "1",
          "--layers", "1", "--head-size", "16", "--small-pages", (char*)nullptr);
    _exit(127);
  }
  const std::string mine = "cxlkv-replay-" + std::to_string(pid) + "-";
  const std::string coord = "cxlkv-replay-coord-" + std::to_string(pid) + "-";
  // Wait (bounded) until its 3 workers run and have attached: the pool's and
  // the coordination segment's names are then unlinked.
  std::vector<pid_t> workers;
  bool progressing = false;
  for (int i = 0; i < 400 && !progressing; i++) {
    usleep(50000);
    workers = children_of(pid);
    progressing = workers.size() == 3 && shm_entries_containing(mine).empty() &&
                  shm_entries_containing(coord).empty() && slurp(err).find("prefill ") != std::string::npos;
  }
  std::string log = slurp(err);
  ASSERT_TRUE(progressing) << "replay did not start its 3 workers within 20 s; workers " << workers.size()
                           << ", stderr: " << log;
  size_t np = log.find("node-local files ");
  ASSERT_NE(np, std::string::npos) << log;
  const std::string node_prefix = log.substr(np + 17, log.find("..", np) - np - 17);

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  waitpid(pid, nullptr, 0);
  // Workers die with their parent (PR_SET_PDEATHSIG): bounded wait for it.
  std::vector<pid_t> alive = workers;
  for (int i = 0; i < 200 && !alive.empty(); i++) {
    usleep(50000);
    alive.erase(std::remove_if(alive.begin(), alive.end(), [](pid_t w) { return !running(w); }), alive.end());
  }
  EXPECT_TRUE(alive.empty()) << alive.size() << " workers still running 10 s after their parent was killed";
  for (pid_t w : alive) kill(w, SIGKILL);
  EXPECT_TRUE(shm_entries_containing(mine).empty()) << "pool left behind";
  EXPECT_TRUE(shm_entries_containing(coord).empty()) << "coordination segment left behind";
  // Only node-local files remain, and `cxlkvctl node gc` removes them since
  // their pool no longer exists.
  int st = std::system((replay_run::tools() + "/cxlkvctl node gc >/dev/null 2>&1").c_str());
  std::remove(err.c_str());
  if (st != 0) {
    for (auto& n : shm_entries_containing(node_prefix)) NodeContext::unlink_local(n);
    GTEST_SKIP() << "cxlkvctl node gc not available (status " << st << "): node-local files " << node_prefix
                 << "* removed by the test";
  }
  EXPECT_TRUE(shm_entries_containing(node_prefix).empty()) << node_prefix << "* left after node gc";
}

// The run's own pool is on 2 MiB pages, as a CXL pool is mapped: a private
// tmpfs (huge=always) that leaves no mount behind.  It needs CAP_SYS_ADMIN.
TEST(Replay, OwnPoolIsOnTwoMiBPagesInAPrivateTmpfsThatLeavesNoMount) {
  if (geteuid() != 0) GTEST_SKIP() << "a private tmpfs needs CAP_SYS_ADMIN (root)";
  const std::string before = slurp("/proc/self/mountinfo");
  int st;
  std::string out = run("--requests 6 --prefill 1 --decode 1", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_EQ(field(out, "page_bytes"), 2u << 20) << out;
  EXPECT_EQ(slurp("/proc/self/mountinfo"), before) << "the run's tmpfs was mounted where others see it";
}

TEST(Replay, SmallPagesKeepsTheOwnPoolInDevShmOnFourKiBPages) {
  int st;
  std::string out = run("--requests 6 --prefill 1 --decode 1 --small-pages", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(field(out, "errors"), 0u) << out;
  EXPECT_EQ(field(out, "page_bytes"), 4096u) << out;
}

// The eviction policy's targets (docs/benchmarks.md "Latest figures") on bounded runs that finish in well under a minute:
// the first 800 requests of the synthetic trace at 5%, 10% and 25% of their
// distinct blocks, 128 KiB blocks, prefill handing its blocks off to decode
// under leases.  Every run reads only correct bytes, evicts, misses no
// handed-off block and beats the block-LRU reference at the same capacity.
void bounded_runs_beat_lru(uint32_t prefill, uint32_t decode) {
  std::string path = replay_run::synthetic_trace();
  if (path.empty()) GTEST_SKIP() << "synthetic trace not present";
  for (double f : {0.05, 0.10, 0.25}) {
    SCOPED_TRACE(std::to_string(prefill) + "+" + std::to_string(decode) + " workers at " + std::to_string(f));
    int st;
    std::string out = run("--trace " + path + " --requests 800 --capacity-fraction " + std::to_string(f) +
                              " --prefill " + std::to_string(prefill) + " --decode " + std::to_string(decode) +
                              " --layers 1 --kv-heads 1 --head-size 64",
                          &st);
    ASSERT_EQ(st, 0) << out;
    EXPECT_EQ(field(out, "errors"), 0u) << out;
    EXPECT_GT(field(out, "evictions"), 0u) << "capacity did not bind: " << out;
    EXPECT_GE(replay_run::dfield(out, "hit_vs_lru"), 1.0) << out;
    // Prefill hands every block off to its decode under a lease: the decode
    // finds each one (a miss would also be an error, unless its lease ended).
    EXPECT_EQ(field(out, "decode_misses"), 0u) << out;
    EXPECT_EQ(field(out, "lease_errors"), 0u) << out;
    EXPECT_EQ(field(out, "expired_lease_misses"), 0u) << "30 s leases ended in a short run: " << out;
    ::testing::Test::RecordProperty("hit_vs_lru_" + std::to_string(int(f * 100)) + "pct",
                   std::to_string(replay_run::dfield(out, "hit_vs_lru")));
  }
}

TEST(Replay, BoundedReplayOfTheSyntheticTraceReadsOnlyCorrectBytesAndBeatsBlockLru) { bounded_runs_beat_lru(2, 2); }

TEST(Replay, BoundedReplayWithFourPrefillAndFourDecodeWorkersBeatsBlockLruWithoutDecodeMisses) {
  bounded_runs_beat_lru(4, 4);
}

TEST(Replay, BadOptionsAreRefused) {
  int st;
  run("--prefill 0", &st);
  EXPECT_NE(st, 0);
  run("--trace /nonexistent.jsonl", &st);
  EXPECT_NE(st, 0);
}

namespace {

// exit status and stderr of `cxlkv-replay ARGS`, bounded by `timeout` (a
// hang is a failure here, exit 124, not a stuck test).
int run_stderr(const std::string& args, std::string* err) {
  std::string cmd = "timeout 60 " + replay_run::tools() + "/cxlkv-replay --quiet " + args + " 2>&1 >/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  char buf[4096];
  err->clear();
  while (size_t n = fread(buf, 1, sizeof buf, f)) err->append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// stdout of a shell command.
std::string command_output(const std::string& cmd) {
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  pclose(f);
  return out;
}

}  // namespace

TEST(Replay, ARefusedNumberNamesItsOptionAndWhatItAcceptsAndNanIsRefused) {
  std::string err;
  EXPECT_EQ(run_stderr("--prefill 0", &err), 2);
  EXPECT_NE(err.find("--prefill: '0' is not a whole number from 1 to 15"), std::string::npos) << err;
  // NaN compared false against both bounds and became 0 prefill workers: the
  // decode workers waited for ever.
  EXPECT_EQ(run_stderr("--prefill nan", &err), 2) << err;
  EXPECT_NE(err.find("--prefill: 'nan'"), std::string::npos) << err;
  EXPECT_EQ(run_stderr("--decode 1.5", &err), 2) << "a fraction of a worker: " << err;
  EXPECT_EQ(run_stderr("--unique-fraction nan", &err), 2) << err;
  EXPECT_NE(err.find("--unique-fraction: 'nan' is not a number from 0 to 1"), std::string::npos) << err;
  EXPECT_EQ(run_stderr("--pool-size 100K", &err), 2);
  EXPECT_NE(err.find("--pool-size: '100K' is not a size in whole MiB"), std::string::npos) << err;
}

TEST(Replay, PoolSizeTakesTheSuffixItsHelpShows) {
  std::string err;
  EXPECT_EQ(run_stderr("--requests 4 --prefill 1 --decode 1 --pool-size 1G", &err), 0) << err;
}

TEST(Replay, APoolNamedWithPoolThatHoldsAValidPoolIsNotReformattedWithoutForce) {
  // The run formats its pool (force): --pool naming an operator's pool
  // silently destroyed every block cached in it.
  const std::string name = "cxlkv-replay-test-force-" + std::to_string(getpid());
  const std::string ctl = replay_run::tools() + "/cxlkvctl --pool shm:" + name;
  ASSERT_EQ(std::system((ctl + ":256M format >/dev/null").c_str()), 0);
  const std::string before = command_output(ctl + " info --json");
  std::string err;
  EXPECT_EQ(run_stderr("--requests 3 --prefill 1 --decode 1 --pool shm:" + name, &err), 1);
  EXPECT_NE(err.find("pool shm:" + name + " holds a valid cxlkv pool"), std::string::npos) << err;
  EXPECT_NE(err.find("add --force"), std::string::npos) << err;
  EXPECT_EQ(command_output(ctl + " info --json"), before) << "the pool was reformatted";
  EXPECT_EQ(run_stderr("--requests 3 --prefill 1 --decode 1 --force --pool shm:" + name, &err), 0) << err;
  std::remove(("/dev/shm/" + name).c_str());
}

TEST(Replay, APlotPathThatCannotBeWrittenFailsBeforeAnyRun) {
  // The picture is drawn after the whole sweep (minutes on the real trace):
  // a bad path used to fail only then.
  std::string err;
  EXPECT_EQ(run_stderr("--requests 10 --sweep --plot /nonexistent-dir/x.svg", &err), 1);
  EXPECT_NE(err.find("cxlkv-replay: --plot: cannot write /nonexistent-dir/x.svg.tmp"), std::string::npos) << err;
  EXPECT_EQ(err.find("summary"), std::string::npos) << "the runs happened first: " << err;
}

TEST(Replay, ZeroDecodeWorkersIsRefusedInsteadOfWaitingForever) {
  // Prefill stays at most --max-lag requests ahead of decode: with no decode
  // worker it waited for ever.
  std::string err;
  EXPECT_EQ(run_stderr("--requests 20 --decode 0", &err), 2);
  EXPECT_NE(err.find("--decode: '0' is not a whole number from 1 to 14"), std::string::npos) << err;
}
