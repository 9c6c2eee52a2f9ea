// SPDX-License-Identifier: MIT
// cxlkvctl pool commands, run as a program: exit codes, stdout, stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "uapi/cxlkv.h"

namespace {

struct Outcome {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Cxlkvctl : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tools = std::getenv("CXLKV_TEST_TOOLS");
    if (!tools) GTEST_SKIP() << "CXLKV_TEST_TOOLS not set (run through ctest)";
    tool_ = std::string(tools) + "/cxlkvctl";
    if (access(tool_.c_str(), X_OK) != 0) GTEST_SKIP() << tool_ << " not built";
    tag_ = std::to_string(getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = "/tmp/cxlkvctl-test-" + tag_;
    uri_ = "file:" + path_;
    std::remove(path_.c_str());
  }
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
    std::remove((path_ + ".out").c_str());
    std::remove((path_ + ".err").c_str());
  }

  // Outcome cxlkvctl with `args` (a shell word list) and no CXLKV_POOL.
  Outcome run(const std::string& args) {
    std::string cmd = "env -u CXLKV_POOL " + tool_ + " " + args + " >" + path_ + ".out 2>" + path_ + ".err";
    int st = std::system(cmd.c_str());
    Outcome r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(path_ + ".out");
    r.err = slurp(path_ + ".err");
    return r;
  }
  Outcome on_pool(const std::string& args) { return run("--pool " + uri_ + " " + args); }

  std::string tool_, tag_, path_, uri_;
};

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_F(Cxlkvctl, FormatCreatesTheStandardCarvesAndPrintsTheLayout) {
  Outcome r = on_pool("format --size 64M --max-nodes 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "formatted " + uri_));
  for (const char* carve : {"control", "index", "alloc", "kv"}) EXPECT_TRUE(has(r.out, carve)) << r.out;
  EXPECT_TRUE(has(r.out, "max nodes       8"));
  EXPECT_TRUE(has(r.out, "max locks       1024")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(Cxlkvctl, InfoJsonDescribesPoolAndCarves) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("info --json");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string& field :
       {"\"uri\":\"" + uri_ + "\"", std::string("\"backend\":\"file\""), std::string("\"size\":33554432"),
        std::string("\"layout_version\":1"), std::string("\"max_nodes\":16"), std::string("\"max_locks\":1024"), std::string("\"pool_id\":\""),
        std::string("\"generation\":"), std::string("{\"name\":\"control\",\"offset\":2097152,\"size\":2097152,"
                                                    "\"memtype\":\"wb\",\"flags\":[\"system\"]}")})
    EXPECT_TRUE(has(r.out, field)) << field << " missing in " << r.out;
  EXPECT_EQ(r.out.front(), '{');
}

TEST_F(Cxlkvctl, FormatRefusesAValidPoolWithoutForce) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("format --size 32M");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(has(r.err, "already holds a valid cxlkv superblock")) << r.err;
  EXPECT_TRUE(has(r.err, "--force"));
  EXPECT_EQ(on_pool("format --size 32M --force").status, 0);
}

TEST_F(Cxlkvctl, CorruptedPoolIsRefusedWithThePoolAndTheProblem) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(24);  // max_nodes, without fixing the checksum
    f.put('\x7f');
  }
  Outcome r = on_pool("info");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(has(r.err, "pool " + uri_ + ": superblock checksum mismatch")) << r.err;
}

TEST_F(Cxlkvctl, UnformattedPoolSaysHowToFormatIt) {
  { std::ofstream(path_).write(std::string(4 << 20, '\0').data(), 4 << 20); }
  Outcome r = on_pool("carve list");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "unformatted")) << r.err;
  EXPECT_TRUE(has(r.err, "format"));
}

TEST_F(Cxlkvctl, FormattingANewPoolWithoutASizeSaysSoAndCreatesNothing) {
  for (const char* extra : {"", " --no-standard"}) {
    Outcome r = on_pool(std::string("format") + extra);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(has(r.err, "does not exist yet; formatting it needs a size (--size)")) << r.err;
    EXPECT_NE(access(path_.c_str(), F_OK), 0) << "format" << extra << " left a file behind";
  }
}

TEST_F(Cxlkvctl, CarveCreateListRemove) {
  ASSERT_EQ(on_pool("format --size 32M --no-standard").status, 0);
  Outcome c = on_pool("carve create scratch --size 3M --memtype wc");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(has(c.out, "scratch")) << c.out;
  EXPECT_TRUE(has(c.out, "4 MiB"));
  Outcome l = on_pool("carve list --json");
  ASSERT_EQ(l.status, 0);
  EXPECT_TRUE(has(l.out, "[{\"name\":\"scratch\",\"offset\":2097152,\"size\":4194304,\"memtype\":\"wc\",\"flags\":[]}]"))
      << l.out;
  Outcome rm = on_pool("carve rm scratch");
  EXPECT_EQ(rm.status, 0) << rm.err;
  EXPECT_EQ(on_pool("carve list --json").out, "[]\n");
  Outcome again = on_pool("carve rm scratch");
  EXPECT_EQ(again.status, 1);
  EXPECT_TRUE(has(again.err, "carve 'scratch': no such carve")) << again.err;
}

TEST_F(Cxlkvctl, SystemCarveRemovalNeedsForce) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("carve rm kv");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "system carve")) << r.err;
  EXPECT_EQ(on_pool("carve rm kv --force").status, 0);
}

TEST_F(Cxlkvctl, BadArgumentsFailOnStderr) {
  ASSERT_EQ(on_pool("format --size 32M --no-standard").status, 0);
  struct {
    std::string args, expected;
  } cases[] = {
      {"carve create x --size lots", "not a size: 'lots'"},
      {"carve create x", "--size is required"},
      {"carve create x --size 2M --memtype fast", "--memtype must be wb, wc or uc"},
      {"carve create BAD --size 2M", "invalid name"},
      {"carve create x --size 2M --colour red", "unknown option '--colour'"},
      {"format --size 3M --force", "not a multiple of 2 MiB"},
      {"format --max-locks 7 --force", "max_locks 7 out of range"},
      {"frobnicate", "unknown command 'frobnicate'"},
  };
  for (const auto& c : cases) {
    Outcome r = on_pool(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_TRUE(has(r.err, c.expected)) << c.args << " -> " << r.err;
  }
  Outcome no_pool = run("info");
  EXPECT_EQ(no_pool.status, 1);
  EXPECT_TRUE(has(no_pool.err, "no pool given")) << no_pool.err;
  Outcome bad_uri = run("--pool nowhere info");
  EXPECT_EQ(bad_uri.status, 1);
  EXPECT_TRUE(has(bad_uri.err, "pool URI 'nowhere'")) << bad_uri.err;
}

TEST_F(Cxlkvctl, PoolMayFollowTheCommandAndComeFromTheEnvironment) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  EXPECT_EQ(run("info --pool " + uri_).status, 0);
  EXPECT_EQ(run("info --pool=" + uri_).status, 0);
  // env -u removes CXLKV_POOL before our own assignment takes effect.
  EXPECT_EQ(run("--json info").status, 1);
  std::string cmd = "CXLKV_POOL=" + uri_ + " " + tool_ + " info >/dev/null 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
}

TEST_F(Cxlkvctl, EverySubcommandHasHelp) {
  for (const char* c : {"format", "info", "carve create", "carve list", "carve rm"}) {
    Outcome r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_TRUE(has(r.out, std::string("usage: cxlkvctl [--pool URI] ") + c)) << r.out;
  }
  Outcome top = run("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_TRUE(has(top.out, "carve create"));
}
