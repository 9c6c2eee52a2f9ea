// SPDX-License-Identifier: MIT
// The rpc part of the Prometheus definition (cxlkv/metrics.hpp): per RPC
// carve (label carve="rpc", "rpc.index", ...), its server line and how many
// clients are attached under the running server's epoch.  Read fresh
// (rule 4) through RpcCarve; nothing is written.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/metrics.hpp"
#include "util/prom_text.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/rpc.hpp"
#include "uapi/cxlkv_pool.h"
#include "cxlkv/format/rpc_format.h"

namespace cxlkv {
namespace {

// Indexed by CXLKV_METRIC_RPC_*.
const MetricDesc kRpcMetrics[CXLKV_METRIC_RPC_COUNT] = {
    {"cxlkv_rpc_server_running", "gauge",
     "1 when the RPC carve's server line says a server is running (0: stopped or never started), per rpc carve"},
    {"cxlkv_rpc_server_epoch", "gauge", "Epoch of the RPC carve's latest server (+1 at every server start), per rpc carve"},
    {"cxlkv_rpc_rings", "gauge", "Client rings of the RPC carve (one client each), per rpc carve"},
    {"cxlkv_rpc_ring_depth", "gauge", "Request slots per ring (outstanding requests per client), per rpc carve"},
    {"cxlkv_rpc_clients", "gauge", "Rings whose client is attached under the current server epoch, per rpc carve"},
};
const MetricDesc kBadRpc{"cxlkv_unknown", "gauge", "?"};

}  // namespace

const MetricDesc& rpc_metric(int which) {
  return which >= 0 && which < int(CXLKV_METRIC_RPC_COUNT) ? kRpcMetrics[which] : kBadRpc;
}

std::string prometheus_rpc_exposition(Region& r) {
  struct Row {
    std::string carve;
    uint64_t v[CXLKV_METRIC_RPC_COUNT];
  };
  std::vector<Row> rows;
  const std::string prefix = CXLKV_CARVE_RPC;
  for (const CarveInfo& ci : r.carves()) {
    if (ci.name != prefix && ci.name.rfind(prefix + ".", 0) != 0) continue;
    auto c = RpcCarve::open(r, r.domain(), ci.name);  // validated header; -ENODATA: never served
    if (!c) continue;
    MemoryDomain& d = r.domain();
    const cxlkv_rpc_server_line s = d.read_fresh(c->server_line());  // rule 4: the server's line
    uint64_t clients = 0;
    for (uint32_t k = 0; k < c->rings(); k++) {
      const cxlkv_rpc_client_line cl = d.read_fresh(c->client_line(k));  // rule 4: the client's line
      if (cl.state == CXLKV_RPC_CLIENT_ATTACHED && cl.epoch == s.epoch) clients++;
    }
    rows.push_back(Row{ci.name,
                       {s.state == CXLKV_RPC_SERVER_RUNNING ? 1u : 0u, s.epoch, c->rings(), c->depth(), clients}});
  }
  std::string out;
  if (rows.empty()) return out;
  for (int m = 0; m < int(CXLKV_METRIC_RPC_COUNT); m++) {
    const MetricDesc& md = kRpcMetrics[m];
    append_family_header(out, md);
    for (const Row& row : rows)
      appendf(out, "%s{carve=\"%s\"} %llu\n", md.name, row.carve.c_str(), (unsigned long long)row.v[m]);
  }
  return out;
}

}  // namespace cxlkv
