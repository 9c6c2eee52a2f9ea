// SPDX-License-Identifier: MIT
// A tool that cannot open its pool says why once: the runtime's warning and
// the tool's own error line used to carry the same cause twice (cxlkvctl,
// cxlkvd, cxlkv-longctx, and cxlkv-replay -- once per worker for an extra
// pool device).  Each tool runs on an unformatted pool file and on one with
// a damaged superblock; stderr holds the cause exactly once, after the
// tool's name, and the exit status is not 0.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/proc_util.hpp"

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) n++;
  return n;
}

class ToolsOpenError : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tools = std::getenv("CXLKV_TEST_TOOLS");
    if (!tools) GTEST_SKIP() << "CXLKV_TEST_TOOLS not set (run through ctest)";
    tools_ = tools;
    path_ = "/tmp/cxlkv-toolsopen-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".err").c_str());
  }
  // A 64 MiB pool file: all zero (unformatted), or with a page of junk
  // where the superblock goes (bad magic).
  void make_pool(bool junk) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    std::string page(4096, junk ? 'J' : '\0');
    f.write(page.data(), static_cast<std::streamsize>(page.size()));
    f.seekp((64 << 20) - 1);
    f.put('\0');
  }
  struct Outcome {
    int status = -1;
    std::string err;
  };
  Outcome run(const std::string& tool, const std::string& args) {
    const std::string exe = tools_ + "/" + tool;
    if (access(exe.c_str(), X_OK) != 0) ADD_FAILURE() << exe << " not built";
    const std::string cmd =
        "env -u CXLKV_LOG -u CXLKV_POOL " + exe + " " + args + " >/dev/null 2>" + path_ + ".err </dev/null";
    const int st = std::system(cmd.c_str());
    return Outcome{WIFEXITED(st) ? WEXITSTATUS(st) : -1, proc_util::slurp(path_ + ".err")};
  }
  void expect_once(bool junk, const std::string& cause) {
    make_pool(junk);
    const std::string uri = "file:" + path_;
    struct Case {
      const char* tool;
      std::string args;
      std::string prefix;  // the tool's own error line
    };
    const std::vector<Case> cases = {
        {"cxlkvctl", "--pool " + uri + " info", "cxlkvctl: pool " + uri + ": "},
        {"cxlkvd", "--pool " + uri + " --foreground", "cxlkvd: pool " + uri + ": "},
        {"cxlkv-longctx", "--pool " + uri + " --tokens 256", "cxlkv-longctx: pool " + uri + ": "},
        {"cxlkv-replay", "--extra-pool " + uri + " --requests 2", "cxlkv-replay: --extra-pool: pool " + uri + ": "},
    };
    for (const auto& c : cases) {
      Outcome r = run(c.tool, c.args);
      EXPECT_NE(r.status, 0) << c.tool << ": " << r.err;
      EXPECT_EQ(count(r.err, cause), 1u) << c.tool << " told the cause " << count(r.err, cause) << " times:\n"
                                         << r.err;
      EXPECT_EQ(count(r.err, c.prefix + cause), 1u) << c.tool << ": not on the tool's own line:\n" << r.err;
      EXPECT_EQ(count(r.err, "[warning]"), 0u) << c.tool << ":\n" << r.err;
    }
  }
  std::string tools_, path_;
};

}  // namespace

TEST_F(ToolsOpenError, AnUnformattedPoolIsToldOncePerTool) {
  expect_once(false, "unformatted (the superblock area is all zero)");
}

TEST_F(ToolsOpenError, ADamagedSuperblockIsToldOncePerTool) { expect_once(true, "bad magic 0x4a4a4a4a4a4a4a4a"); }
