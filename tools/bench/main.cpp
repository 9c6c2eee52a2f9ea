// SPDX-License-Identifier: MIT
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "cxlkv/version.h"

namespace bench {
namespace {
std::vector<Benchmark>& registry() {
  static std::vector<Benchmark> r;
  return r;
}
}  // namespace

void register_bench(Benchmark b) { registry().push_back(std::move(b)); }

double scale() {
  const char* s = std::getenv("CXLKV_BENCH_SCALE");
  double v = s ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

std::string shm_name(const std::string& what) {
  return "cxlkv-bench-" + what + "-" + std::to_string(getpid());
}

namespace {

// Removes this process's benchmark pools (shm_name(): "cxlkv-bench-*-<pid>"),
// whatever path the run took: at exit, on SIGINT / SIGTERM, after an error.
void remove_my_pools() {
  const std::string suffix = "-" + std::to_string(getpid());
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("cxlkv-bench-", 0) == 0 && n.size() > suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(n);
  }
  closedir(d);
  for (auto& n : names) shm_unlink(("/" + n).c_str());
}

void on_stop_signal(int sig) {
  remove_my_pools();  // not async-signal-safe in theory; the process ends right after
  _exit(128 + sig);
}

}  // namespace

}  // namespace bench

int main(int argc, char** argv) {
  std::atexit(bench::remove_my_pools);
  signal(SIGINT, bench::on_stop_signal);
  signal(SIGTERM, bench::on_stop_signal);
  std::string out = "build/bench/results.json";
  std::vector<std::string> only;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const int needs = a == "--out" || a == "--only" ? 1 : a == "--report-svg" ? 2 : 0;
    if (needs && i + needs >= argc) {
      std::fprintf(stderr, "cxlkv-bench: %s needs %s (see --help)\n", a.c_str(),
                   needs == 2 ? "RESULTS.json and OUT.svg" : a == "--out" ? "a FILE" : "a GROUP (--list shows them)");
      return 2;
    }
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else if (a == "--report-svg" && i + 2 < argc) {
      return bench::write_report_svg(argv[i + 1], argv[i + 2]);
    } else if (a == "--list") {
      for (auto& b : bench::registry()) std::printf("%-10s %s\n", b.name.c_str(), b.help.c_str());
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: cxlkv-bench [--out FILE] [--only GROUP]... [--list]\n"
          "       cxlkv-bench --report-svg RESULTS.json OUT.svg\n\n"
          "Runs cxlkv's benchmarks, each beside its baseline in the same run, and\n"
          "writes one flat JSON object of metric name to number to FILE\n"
          "(default build/bench/results.json).  CXLKV_BENCH_SCALE scales iteration counts.\n"
          "--report-svg draws a results file: each metric against its same-run baseline\n"
          "and its target (make bench writes build/bench/report.svg).\n"
          "--version prints the version.\n");
      return 0;
    } else if (a == "--version") {
      std::printf("cxlkv-bench (cxlkv) %s\n", CXLKV_VERSION);
      return 0;
    } else {
      std::fprintf(stderr, "cxlkv-bench: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  // Refuse a group that does not exist (it ran nothing and wrote an empty
  // results file) and an output that cannot be written, before any run:
  // the whole set takes minutes.
  std::vector<std::string> groups;  // in registry order, each once (a group may register several parts)
  for (auto& b : bench::registry())
    if (std::find(groups.begin(), groups.end(), b.name) == groups.end()) groups.push_back(b.name);
  for (auto& o : only) {
    if (std::find(groups.begin(), groups.end(), o) != groups.end()) continue;
    std::string names;
    for (auto& g : groups) names += (names.empty() ? "" : ", ") + g;
    std::fprintf(stderr, "cxlkv-bench: --only %s: no such benchmark group (groups: %s)\n", o.c_str(), names.c_str());
    return 2;
  }
  {
    namespace fs = std::filesystem;
    const size_t slash = out.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : out.substr(0, slash);
    std::error_code made, ec;
    fs::create_directories(dir, made);  // build/bench/ in a fresh tree; a failure shows below
    std::string why;
    if (fs::is_directory(out, ec)) why = "it is a directory";
    else if (!fs::is_directory(dir, ec)) why = dir + " is not a folder" + (made ? ": " + made.message() : "");
    else if (::access(dir.c_str(), W_OK) != 0 || (::access(out.c_str(), F_OK) == 0 && ::access(out.c_str(), W_OK) != 0))
      why = std::strerror(errno);
    if (!why.empty()) {
      std::fprintf(stderr, "cxlkv-bench: --out %s: cannot be written (%s)\n", out.c_str(), why.c_str());
      return 2;
    }
  }
  bench::Results res;
  for (auto& b : bench::registry()) {
    bool sel = only.empty();
    for (auto& o : only) sel |= (o == b.name);
    if (!sel) continue;
    std::fprintf(stderr, "cxlkv-bench: running %s ...\n", b.name.c_str());
    b.run(res);
  }
  std::ofstream f(out);
  if (!f) {
    std::fprintf(stderr, "cxlkv-bench: cannot write %s: %s\n", out.c_str(), std::strerror(errno));
    return 1;
  }
  f << "{\n";
  size_t n = 0;
  for (auto& [k, v] : res.all()) {
    char buf[64];
    if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.6g", v);
    else std::snprintf(buf, sizeof buf, "null");
    f << "  \"" << k << "\": " << buf << (++n < res.all().size() ? ",\n" : "\n");
  }
  f << "}\n";
  return 0;
}
