// SPDX-License-Identifier: MIT
// cxlkvctl index stats / stats: the prefix index's occupancy and every
// node's KV counters and latency percentiles, read from the pool (no lock:
// a snapshot; every line is invalidated before it is read, rule 4).

#include <cstdio>
#include <string>

#include "command.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/metrics.hpp"
#include "index/index_check.hpp"
#include "cxlkv/format/index_format.h"
#include "util/clock.hpp"

namespace {

using namespace cxlkvctl;

const void* index_carve(cxlkv::Region& r, uint64_t* size) {
  auto c = r.carve(CXLKV_CARVE_INDEX);
  if (!c) return nullptr;
  *size = c->size;
  return r.at(c->offset);
}

int cmd_index_stats(Context& ctx, const Args&) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  uint64_t size = 0;
  const void* carve = index_carve(*r, &size);
  cxlkv::MemoryDomain& d = r->domain();
  auto hr = cxlkv::read_index_header(*r, d);  // every offset below checked against the carve
  if (!hr) return fail(hr.error().message());
  const cxlkv_index_header h = hr.value();
  auto* base = static_cast<const std::byte*>(carve);
  auto cfg = d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(base + 64));
  uint64_t used_blocks = 0, used_bytes = 0, evictions = 0, reclaims = 0, tombstones = 0, lease_expiries = 0,
           lease_dead = 0;
  for (uint32_t s = 0; s < h.nstripes; s++) {
    auto st = d.read_fresh(reinterpret_cast<const cxlkv_index_stripe*>(base + h.stripe_off + uint64_t(s) * 64));
    used_blocks += st.used_blocks;
    used_bytes += st.used_bytes;
    evictions += st.evictions;
    reclaims += st.reclaims;
    tombstones += st.tombstones;
    lease_expiries += st.lease_expiries;
    lease_dead += st.lease_dead;
  }
  uint64_t by_state[6] = {};
  uint64_t pinned = 0;
  for (uint64_t i = 0; i < h.nslots; i++) {
    auto e = d.read_fresh(reinterpret_cast<const cxlkv_index_entry*>(base + h.entry_off + i * 64));
    bool valid = e.check == 0 ? e.state == 0 : e.check == cxlkv_index_entry_check(&e);
    by_state[valid && e.state < 5 ? e.state : 5]++;
    if (valid && e.state == CXLKV_ENTRY_READY && e.pin_mask) pinned++;
  }
  if (ctx.json) {
    std::printf("{\"slots\": %llu, \"stripes\": %u, \"stripe_slots\": %u, \"max_blocks\": %llu, \"max_bytes\": %llu, "
                "\"used_blocks\": %llu, \"used_bytes\": %llu, \"ready\": %llu, \"writing\": %llu, \"evicting\": %llu, "
                "\"tombstones\": %llu, \"empty\": %llu, \"damaged\": %llu, \"pinned\": %llu, \"evictions\": %llu, "
                "\"reclaims\": %llu, \"lease_expiries\": %llu, \"lease_dead\": %llu, \"devices\": %u, "
                "\"interleave_stripe\": %u}\n",
                (unsigned long long)h.nslots, h.nstripes, h.stripe_slots, (unsigned long long)cfg.max_blocks,
                (unsigned long long)cfg.max_bytes, (unsigned long long)used_blocks, (unsigned long long)used_bytes,
                (unsigned long long)by_state[CXLKV_ENTRY_READY], (unsigned long long)by_state[CXLKV_ENTRY_WRITING],
                (unsigned long long)by_state[CXLKV_ENTRY_EVICTING], (unsigned long long)by_state[CXLKV_ENTRY_TOMBSTONE],
                (unsigned long long)by_state[CXLKV_ENTRY_EMPTY], (unsigned long long)by_state[5],
                (unsigned long long)pinned, (unsigned long long)evictions, (unsigned long long)reclaims,
                (unsigned long long)lease_expiries, (unsigned long long)lease_dead, cfg.ndevices,
                cfg.interleave_stripe);
    return 0;
  }
  std::printf("index of %s\n", r->uri().c_str());
  std::printf("  slots        %llu (%u stripes x %u), locks %u..%u\n", (unsigned long long)h.nslots, h.nstripes,
              h.stripe_slots, h.lock_base, h.lock_base + h.nstripes - 1);
  std::printf("  capacity     %s blocks, %s bytes\n",
              cfg.max_blocks ? std::to_string(cfg.max_blocks).c_str() : "unbounded",
              cfg.max_bytes ? std::to_string(cfg.max_bytes).c_str() : "unbounded");
  std::printf("  used         %llu blocks, %llu bytes\n", (unsigned long long)used_blocks, (unsigned long long)used_bytes);
  std::printf("  entries      ready %llu, writing %llu, evicting %llu, tombstone %llu, empty %llu, damaged %llu\n",
              (unsigned long long)by_state[CXLKV_ENTRY_READY], (unsigned long long)by_state[CXLKV_ENTRY_WRITING],
              (unsigned long long)by_state[CXLKV_ENTRY_EVICTING], (unsigned long long)by_state[CXLKV_ENTRY_TOMBSTONE],
              (unsigned long long)by_state[CXLKV_ENTRY_EMPTY], (unsigned long long)by_state[5]);
  std::printf("  pinned       %llu\n  evictions    %llu\n  reclaims     %llu\n", (unsigned long long)pinned,
              (unsigned long long)evictions, (unsigned long long)reclaims);
  std::printf("  lease ends   %llu (%llu by a dead consumer node)\n", (unsigned long long)lease_expiries,
              (unsigned long long)lease_dead);
  std::printf("  interleave   %u device(s), stripe %u bytes\n", cfg.ndevices, cfg.interleave_stripe);
  return 0;
}

// Handoff leases (uapi cxlkv_index_ext): a lock-free snapshot, rule 4 reads.
int cmd_index_leases(Context& ctx, const Args&) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  uint64_t size = 0;
  const void* carve = index_carve(*r, &size);
  cxlkv::MemoryDomain& d = r->domain();
  auto hr = cxlkv::read_index_header(*r, d);
  if (!hr) return fail(hr.error().message());
  const cxlkv_index_header h = hr.value();
  auto* base = static_cast<const std::byte*>(carve);
  const uint64_t ext_off = cxlkv_index_ext_off(&h);
  if (h.nslots > (1ull << 32) || h.entry_off > size || ext_off > size || h.nslots * 32 > size - ext_off)
    return fail("pool " + r->uri() + ": index header is inconsistent");
  auto cfg = d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(base + 64));
  const uint32_t now = static_cast<uint32_t>(cxlkv::realtime_ms() - cfg.epoch_ms);
  if (!ctx.json) std::printf("%-32s %6s %20s %5s %6s %10s %12s\n", "block", "slot", "consumer", "node", "count", "age_ms", "expires_ms");
  else std::printf("[");
  size_t n = 0;
  for (uint64_t i = 0; i < h.nslots; i++) {
    cxlkv_index_ext x;
    d.invalidate(base + ext_off + i * 32, 32);  // rule 4
    d.fence();
    d.load(&x, base + ext_off + i * 32, 32);
    if (!x.lease_count) continue;
    auto e = d.read_fresh(reinterpret_cast<const cxlkv_index_entry*>(base + h.entry_off + i * 64));
    if (e.state != CXLKV_ENTRY_READY) continue;
    char key[40];
    std::snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)e.key_hi, (unsigned long long)e.key_lo);
    const std::string node = x.lease_node == CXLKV_LEASE_NODE_ANY ? "any" : std::to_string(x.lease_node);
    const int32_t left = static_cast<int32_t>(x.lease_expiry_ms - now);
    if (ctx.json)
      std::printf("%s{\"block\": \"%s\", \"slot\": %llu, \"consumer\": %llu, \"node\": \"%s\", \"count\": %u, "
                  "\"age_ms\": %u, \"expires_ms\": %d}",
                  n ? ", " : "", key, (unsigned long long)i, (unsigned long long)x.lease_consumer, node.c_str(),
                  x.lease_count, now - x.lease_start_ms, left);
    else
      std::printf("%-32s %6llu %20llu %5s %6u %10u %12d%s\n", key, (unsigned long long)i,
                  (unsigned long long)x.lease_consumer, node.c_str(), x.lease_count, now - x.lease_start_ms, left,
                  left <= 0 ? " (expired)" : "");
    n++;
  }
  if (ctx.json) std::printf("]\n");
  else std::printf("%zu lease(s)\n", n);
  return 0;
}

int cmd_stats(Context& ctx, const Args& a) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  uint64_t size = 0;
  const void* carve = index_carve(*r, &size);
  const bool prom = a.flag("prometheus");
  if (prom && !carve && r->carve(CXLKV_CARVE_PNM)) {  // a near-memory pool without KV index: its pnm family
    std::fputs(cxlkv::prometheus_region_exposition(*r).c_str(), stdout);
    return 0;
  }
  if (auto hr = cxlkv::read_index_header(*r, r->domain()); !hr) return fail(hr.error().message());
  auto nodes = cxlkv::read_pool_stats(r->domain(), carve, size);
  cxlkv::KvStats total;
  for (auto& n : nodes) total.add(n.stats);
  // The remote tier's counters (docs/remote.md "Counters"), named as in the
  // Prometheus text; shown once a node has any.
  uint64_t remote_total[CXLKV_REMOTE_COUNT] = {};
  bool remote = false;
  for (auto& n : nodes)
    for (int c = 0; c < CXLKV_REMOTE_COUNT; c++) {
      remote_total[c] += n.remote[c];
      remote |= n.remote[c] != 0;
    }
  auto remote_json = [](const uint64_t* v) {
    std::printf("\"remote\": {");
    for (int c = 0; c < CXLKV_REMOTE_COUNT; c++)
      std::printf("%s\"%.*s\": %llu", c ? ", " : "", int(cxlkv::remote_counter_name(c).size()),
                  cxlkv::remote_counter_name(c).data(), (unsigned long long)v[c]);
    std::printf("}");
  };
  auto remote_text = [](const uint64_t* v) {
    for (int c = 0; c < CXLKV_REMOTE_COUNT; c++)
      std::printf(" %.*s %llu", int(cxlkv::remote_counter_name(c).size()), cxlkv::remote_counter_name(c).data(),
                  (unsigned long long)v[c]);
    std::printf("\n");
  };
  if (prom) {
    // one definition: cxlkv/metrics.hpp (node counters, histograms, lease ends, pool state)
    std::fputs(cxlkv::prometheus_region_exposition(*r).c_str(), stdout);
    return 0;
  }
  if (ctx.json || a.flag("json")) {
    std::printf("{\"nodes\": [");
    for (size_t i = 0; i < nodes.size(); i++) {
      std::printf("%s{\"node\": %u, \"pid\": %u", i ? ", " : "", nodes[i].node, nodes[i].pid);
      for (int c = 0; c < CXLKV_CTR_COUNT; c++)
        std::printf(", \"%s\": %llu", cxlkv::counter_name(c), (unsigned long long)nodes[i].stats.counters[c]);
      std::printf(", ");
      remote_json(nodes[i].remote);
      std::printf("}");
    }
    std::printf("], \"total\": {");
    for (int c = 0; c < CXLKV_CTR_COUNT; c++)
      std::printf("%s\"%s\": %llu", c ? ", " : "", cxlkv::counter_name(c), (unsigned long long)total.counters[c]);
    for (int l = 0; l < CXLKV_LAT_COUNT; l++)
      std::printf(", \"%s_us_p50\": %.3f, \"%s_us_p99\": %.3f", cxlkv::latency_name(l), total.latency_us(l, 50),
                  cxlkv::latency_name(l), total.latency_us(l, 99));
    std::printf(", ");
    remote_json(remote_total);
    std::printf("}}\n");
    return 0;
  }
  std::printf("kv statistics of %s (%zu node(s) reporting)\n", r->uri().c_str(), nodes.size());
  for (int c = 0; c < CXLKV_CTR_COUNT; c++)
    std::printf("  %-16s %llu\n", cxlkv::counter_name(c), (unsigned long long)total.counters[c]);
  for (int l = 0; l < CXLKV_LAT_COUNT; l++)
    std::printf("  %-8s latency p50 %.1f us  p99 %.1f us  (%llu ops)\n", cxlkv::latency_name(l),
                total.latency_us(l, 50), total.latency_us(l, 99), (unsigned long long)total.latency_count(l));
  for (auto& n : nodes)
    std::printf("  node %-3u pid %-7u hits %llu misses %llu in %llu B out %llu B evictions %llu\n", n.node, n.pid,
                (unsigned long long)n.stats.counters[CXLKV_CTR_HIT_BLOCKS],
                (unsigned long long)n.stats.counters[CXLKV_CTR_MISS_BLOCKS],
                (unsigned long long)n.stats.counters[CXLKV_CTR_BYTES_IN],
                (unsigned long long)n.stats.counters[CXLKV_CTR_BYTES_OUT],
                (unsigned long long)n.stats.counters[CXLKV_CTR_EVICTIONS]);
  if (remote) {
    std::printf("  remote tier:");
    remote_text(remote_total);
    for (auto& n : nodes) {
      std::printf("  node %-3u remote:", n.node);
      remote_text(n.remote);
    }
  }
  return 0;
}

}  // namespace

CXLKVCTL_COMMAND({"index stats", "prefix index occupancy: slots, states, capacity, evictions",
                  "usage: cxlkvctl --pool URI [--json] index stats\n\n"
                  "Reads the index carve without taking locks (a snapshot) and prints slots,\n"
                  "entries by state, pinned blocks, capacity limits and usage.\n",
                  {},
                  cmd_index_stats});

CXLKVCTL_COMMAND({"index leases", "handoff leases: block, consumer, node, age, time to expiry",
                  "usage: cxlkvctl --pool URI [--json] index leases\n\n"
                  "Lists the blocks leased to a consumer (cxlkv_kv_lease): consumer id, consumer\n"
                  "node (any: not ended by a node's death), number of consumers, age and time\n"
                  "left until expiry.  A lock-free snapshot.\n",
                  {},
                  cmd_index_leases});

CXLKVCTL_COMMAND({"stats", "KV counters and latencies of every node (text, --json, --prometheus)",
                  "usage: cxlkvctl --pool URI stats [--json | --prometheus]\n\n"
                  "Every node writes its counters (lookups, hits, misses, evictions, bytes in/out,\n"
                  "...) and latency histograms into its own lines of the index carve; this sums\n"
                  "them and prints p50/p99 latencies of lookup, publish and fetch, then the\n"
                  "remote tier's counters once a node has any (docs/remote.md).\n",
                  {{"json", false, "JSON output"}, {"prometheus", false, "Prometheus exposition format"}},
                  cmd_stats});
