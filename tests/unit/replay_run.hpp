// SPDX-License-Identifier: MIT
// Runs the cxlkv-replay binary (the main job) for tests and reads fields of
// its --json summary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace replay_run {

inline std::string tools() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return t ? t : "tools";
}

// stdout of `cxlkv-replay --json --quiet ARGS`; *status is pclose()'s.
inline std::string run(const std::string& args, int* status) {
  std::string cmd = tools() + "/cxlkv-replay --json --quiet " + args + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  *status = pclose(f);
  return out;
}

// An unsigned integer field of the summary; ~0 when absent.
inline uint64_t field(const std::string& json, const std::string& name) {
  size_t p = json.find("\"" + name + "\": ");
  if (p == std::string::npos) return ~0ull;
  return std::strtoull(json.c_str() + p + name.size() + 4, nullptr, 10);
}

}  // namespace replay_run
