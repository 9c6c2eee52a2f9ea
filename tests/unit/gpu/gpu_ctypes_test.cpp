// SPDX-License-Identifier: MIT
// The GPU C API is usable from Python through ctypes: the example script
// loads libcxlkv.so, reports the probe result cleanly on a machine without a
// GPU, and round-trips a paged cache through the CPU reference backend.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

TEST(GpuCtypes, ExampleScriptProbesAndRoundTripsFromPython) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not installed";
  const char* tools = std::getenv("CXLKV_TEST_TOOLS");
  ASSERT_NE(nullptr, tools);
  const fs::path lib = fs::path(tools).parent_path() / "libruntime" / "libcxlkv.so";
  const fs::path script = fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path() / "cuda" / "cxlkv_gpu_ctypes.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  ASSERT_TRUE(fs::exists(lib)) << lib;
  std::string cmd = "python3 '" + script.string() + "' --reference --lib '" + lib.string() + "' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(nullptr, f);
  std::string out;
  char buf[1024];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int status = pclose(f);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(std::string::npos, out.find("cxlkv_gpu_probe: ")) << out;
  EXPECT_NE(std::string::npos, out.find("pinned by cpu-reference")) << out;
  EXPECT_NE(std::string::npos, out.find("reference round trip: ok")) << out;
}
