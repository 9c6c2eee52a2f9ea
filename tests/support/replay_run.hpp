// SPDX-License-Identifier: MIT
// Runs the cxlkv-replay binary (the main job) for tests and reads fields of
// its --json summary.
#pragma once

#include <unistd.h>

#include <cmath>
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

// A number field of the summary (the first with that name); NaN when absent.
inline double dfield(const std::string& json, const std::string& name, size_t from = 0) {
  size_t p = json.find("\"" + name + "\": ", from);
  if (p == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + p + name.size() + 4, nullptr);
}

// The synthetic Mooncake trace, found by path: CXLKV_TRACE, else
// shared/traces/synthetic_trace.jsonl in a parent of the source tree (the
// repository's ../shared).  Empty when absent: tests that need it skip.
inline std::string synthetic_trace() {
  if (const char* t = std::getenv("CXLKV_TRACE")) return access(t, R_OK) == 0 ? t : "";
  // This source file's folder (when the compiler named it absolutely) and the
  // running binary's folder (the build tree inside the repository).
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string from[2] = {__FILE__, n > 0 ? std::string(exe, size_t(n)) : std::string()};
  for (std::string d : from) {
    if (d.empty() || d[0] != '/') continue;
    for (size_t p; (p = d.rfind('/')) != std::string::npos && p > 0;) {
      d.resize(p);
      std::string cand = d + "/shared/traces/synthetic_trace.jsonl";
      if (access(cand.c_str(), R_OK) == 0) return cand;
    }
  }
  return "";
}

}  // namespace replay_run
