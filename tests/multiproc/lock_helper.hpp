// SPDX-License-Identifier: MIT
// What the multi-process lock helpers (lock_counter_helper, lock_set_helper)
// share: their command line, URI NODE MODE [BURST], and attaching to the pool
// as node NODE.  Each helper gives MODE its own meaning (ITERS, hold, ...).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

namespace lock_helper {

struct Args {
  const char* uri = nullptr;
  uint32_t node = 0;
  std::string mode;  // argv[3]: ITERS or a word of the helper's
  long burst = 0;    // pause after every BURST iterations; 0: never
};

// URI NODE MODE [BURST]; on any other count prints `usage` (exit 2).
inline std::optional<Args> parse(int argc, char** argv, const char* usage) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "%s\n", usage);
    return std::nullopt;
  }
  Args a;
  a.uri = argv[1];
  a.node = static_cast<uint32_t>(std::atoi(argv[2]));
  a.mode = argv[3];
  a.burst = argc == 5 ? std::atol(argv[4]) : 0;
  return a;
}

// The pool and this process's node in it (the node goes first, before its pool).
struct Attached {
  std::unique_ptr<cxlkv::Region> region;
  std::unique_ptr<cxlkv::NodeContext> node;
};

// Opens the pool at a.uri and attaches as node a.node; prints why not (exit 1).
// `heartbeat`: the node beats (a node on another host is alive only while
// it beats; on the manager's host its process's liveness is enough).
inline std::optional<Attached> attach(const Args& a, bool heartbeat = false) {
  auto region = cxlkv::Region::open(a.uri);
  if (!region) {
    std::fprintf(stderr, "helper: %s\n", region.error().message().c_str());
    return std::nullopt;
  }
  cxlkv::NodeOptions no;
  no.node = a.node;
  no.heartbeat = heartbeat;
  auto node = cxlkv::NodeContext::attach(*region.value(), no);
  if (!node) {
    std::fprintf(stderr, "helper: %s\n", node.error().message().c_str());
    return std::nullopt;
  }
  return Attached{std::move(region.value()), std::move(node.value())};
}

}  // namespace lock_helper
