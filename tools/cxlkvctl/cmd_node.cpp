// SPDX-License-Identifier: MIT
// cxlkvctl node list | node evict N: the node table of the control carve.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "command.hpp"
#include "cxlkv/sync.hpp"

namespace cxlkvctl {
namespace {

const char* state_name(cxlkv_node_state s) {
  switch (s) {
    case CXLKV_NODE_ABSENT: return "absent";
    case CXLKV_NODE_ACTIVE: return "active";
    case CXLKV_NODE_EVICTED: return "evicted";
  }
  return "?";
}

int node_list(Context& ctx, const Args& args) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  bool all = args.flag("all");
  auto nodes = cxlkv::list_nodes(*r, r->domain());
  if (nodes.empty()) return fail("pool " + r->uri() + ": no control carve (not formatted with the standard layout?)");
  if (ctx.json) {
    std::printf("[");
    bool first = true;
    for (const auto& n : nodes) {
      if (!all && n.state == CXLKV_NODE_ABSENT) continue;
      std::printf("%s\n  {\"node\": %u, \"state\": \"%s\", \"alive\": %s, \"pid\": %u, \"host\": \"%s\", "
                  "\"heartbeat\": %lu, \"age_ms\": %ld, \"slots_in_use\": %u}",
                  first ? "" : ",", n.node, state_name(n.state), n.alive ? "true" : "false", n.pid, n.host.c_str(),
                  static_cast<unsigned long>(n.heartbeat), static_cast<long>(n.age_ms), n.waiting_or_holding);
      first = false;
    }
    std::printf("\n]\n");
    return 0;
  }
  std::printf("%-5s %-8s %-6s %-8s %-20s %-10s %s\n", "NODE", "STATE", "ALIVE", "PID", "HOST", "AGE", "SLOTS");
  for (const auto& n : nodes) {
    if (!all && n.state == CXLKV_NODE_ABSENT) continue;
    std::string age = n.age_ms < 0 ? "-" : std::to_string(n.age_ms) + "ms";
    std::printf("%-5u %-8s %-6s %-8u %-20s %-10s %u\n", n.node, state_name(n.state), n.alive ? "yes" : "no", n.pid,
                n.host.c_str(), age.c_str(), n.waiting_or_holding);
  }
  return 0;
}

int node_evict(Context& ctx, const Args& args) {
  if (args.positional().size() != 1) return fail("node evict: expected one node id (see --help)");
  char* end = nullptr;
  unsigned long n = std::strtoul(args.positional()[0].c_str(), &end, 0);
  if (!end || *end) return fail("node evict: not a node id: '" + args.positional()[0] + "'");
  auto r = ctx.open_pool();
  if (!r) return 1;
  auto res = cxlkv::evict_node(*r, r->domain(), static_cast<uint32_t>(n), args.flag("force"));
  if (!res) return fail(res.error().message());
  if (ctx.json)
    std::printf("{\"node\": %lu, \"evicted\": true, \"slots_released\": %u}\n", n, res.value());
  else
    std::printf("node %lu evicted; %u global lock slot(s) released\n", n, res.value());
  return 0;
}

CXLKVCTL_COMMAND({"node list", "nodes of the pool: state, heartbeat age, lock slots in use",
                  "Lists the node table of the control carve.  A node is alive when it is\n"
                  "ACTIVE and its last heartbeat is younger than 3 s (host clocks synchronised).\n"
                  "SLOTS counts global lock slots the node waits on or holds.",
                  {{"all", false, "also list nodes that never attached"}},
                  node_list});

CXLKVCTL_COMMAND({"node evict", "release every global lock slot of a dead node",
                  "cxlkvctl node evict N\n\n"
                  "For a node that died holding or waiting for cross-host locks: writes its\n"
                  "slots IDLE (as the kernel module does for a closed device file) so the lock\n"
                  "manager grants the next node, and marks it EVICTED.  Refuses a node whose\n"
                  "heartbeat is fresh unless --force.",
                  {{"force", false, "evict even if the node looks alive"}},
                  node_evict});

}  // namespace
}  // namespace cxlkvctl
