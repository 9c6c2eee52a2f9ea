// SPDX-License-Identifier: MIT
// cxlkvctl node list | node evict N: the node table of the control carve.
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>

#include "command.hpp"
#include "cxlkv/sync.hpp"

namespace cxlkvctl {

std::optional<std::vector<cxlkv::NodeStatus>> node_table(cxlkv::Region& r) {
  auto nodes = cxlkv::list_nodes(r, r.domain());
  if (!nodes.empty()) return nodes;
  auto c = cxlkv::ControlCarve::open(r, r.domain());
  fail(c ? "pool " + r.uri() + ": the control carve's node table is empty" : c.error().message());
  return std::nullopt;
}

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
  auto table = node_table(*r);
  if (!table) return 1;
  const auto& nodes = *table;
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

// A node id: decimal digits only, no sign, no wrap-around.
bool parse_node(const std::string& s, unsigned long* out) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  unsigned long v = std::strtoul(s.c_str(), nullptr, 10);
  if (errno || v > UINT32_MAX) return false;
  *out = v;
  return true;
}

int node_evict(Context& ctx, const Args& args) {
  if (args.positional().size() != 1) return fail("node evict: expected one node id (see --help)");
  unsigned long n = 0;
  if (!parse_node(args.positional()[0], &n))
    return fail("node evict: not a node id: '" + args.positional()[0] + "' (a decimal number from 0 to max_nodes-1)");
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

int node_gc(Context& ctx, const Args& args) {
  std::vector<std::array<uint8_t, 16>> keep;
  if (!ctx.pool_uri.empty()) {  // a pool on a file or device: keep its node-local files
    auto r = ctx.open_pool();
    if (!r) return 1;
    std::array<uint8_t, 16> id{};
    std::memcpy(id.data(), r->superblock().pool_id, 16);
    keep.push_back(id);
  }
  const bool dry = args.flag("dry-run");
  auto res = cxlkv::gc_node_local(keep, dry);
  unsigned removed = 0;
  if (ctx.json) std::printf("[");
  bool first = true;
  for (const auto& g : res) {
    removed += g.removed;
    if (ctx.json) {
      std::printf("%s\n  {\"file\": \"/dev/shm/%s\", \"node\": %u, \"removed\": %s, \"why\": \"%s\"}",
                  first ? "" : ",", g.name.c_str(), g.node, g.removed ? "true" : "false", g.why.c_str());
      first = false;
    } else {
      std::printf("/dev/shm/%s: %s\n", g.name.c_str(), g.why.c_str());
    }
  }
  if (ctx.json)
    std::printf("\n]\n");
  else
    std::printf("%u node-local file(s) removed, %zu kept\n", removed, res.size() - removed);
  return 0;
}

CXLKVCTL_COMMAND({"node list", "nodes of the pool: state, heartbeat age, lock slots in use",
                  "Lists the node table of the control carve.  A node is alive when it is\n"
                  "ACTIVE and: on this host, its process runs (pid and start time; a stopped\n"
                  "process is alive); on another host, its last heartbeat is younger than 3 s\n"
                  "(host clocks synchronised).\n"
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
                  node_evict, 1});

CXLKVCTL_COMMAND({"node gc", "remove node-local files of pools that no longer exist",
                  "cxlkvctl [--pool URI] node gc [--dry-run]\n\n"
                  "Removes /dev/shm/cxlkv-node-<pool id>-<node> files whose pool is gone: no\n"
                  "shm pool in /dev/shm has that pool id, it is not the pool named by --pool\n"
                  "(pass it for pools on files or devices), and no process maps the file.\n"
                  "cxlkvd runs this at start.",
                  {{"dry-run", false, "only say what would be removed"}},
                  node_gc});

}  // namespace
}  // namespace cxlkvctl
