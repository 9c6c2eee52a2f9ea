// SPDX-License-Identifier: MIT
// The control carve: format initializer and validated view (layout in
// uapi/cxlkv_ctrl.h).
#include <cstdio>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/sync.hpp"
#include "util/log.hpp"

namespace cxlkv {

uint64_t control_carve_bytes(uint32_t max_nodes, uint32_t max_locks) {
  return cxlkv_ctrl_carve_bytes(max_nodes, max_locks);
}

uint32_t control_max_locks_for(uint64_t carve_size, uint32_t max_nodes) {
  uint64_t fixed = control_carve_bytes(max_nodes, 0);
  if (carve_size <= fixed) return 0;
  uint64_t per_lock = uint64_t(max_nodes + 1) * CXLKV_LINE_SIZE;
  uint64_t n = (carve_size - fixed) / per_lock;
  return static_cast<uint32_t>(std::min<uint64_t>(n, CXLKV_MAX_LOCKS));
}

Result<void> format_control_carve(Region& region, MemoryDomain& d, const ControlFormatOptions& opts) {
  auto carve = region.carve(CXLKV_CARVE_CONTROL);
  if (!carve) return carve.error();
  const uint32_t nodes = region.max_nodes();
  uint32_t locks = opts.max_locks;
  uint32_t fit = control_max_locks_for(carve->size, nodes);
  if (locks > fit) {
    log().info("pool {}: control carve of {} bytes holds {} locks for {} nodes (asked {})",
               region.uri(), carve->size, fit, nodes, locks);
    locks = fit;
  }
  if (locks < CXLKV_MIN_LOCKS)
    return Error(-ENOSPC, "pool " + region.uri() + ": control carve of " + std::to_string(carve->size) +
                              " bytes holds only " + std::to_string(locks) + " locks for " +
                              std::to_string(nodes) + " nodes (need " +
                              std::to_string(CXLKV_MIN_LOCKS) + ")");
  cxlkv_ctrl_header h{};
  h.magic = CXLKV_CTRL_MAGIC;
  h.version = CXLKV_CTRL_VERSION;
  h.max_nodes = nodes;
  h.max_locks = locks;
  h.lease_off = CXLKV_LINE_SIZE;
  h.node_table_off = 2 * CXLKV_LINE_SIZE;
  h.lock_table_off = h.node_table_off + uint64_t(nodes) * CXLKV_LINE_SIZE;
  h.grant_table_off = h.lock_table_off + uint64_t(locks) * nodes * CXLKV_LINE_SIZE;
  h.doorbell_off = h.grant_table_off + uint64_t(locks) * CXLKV_LINE_SIZE;
  h.checksum = cxlkv_ctrl_header_checksum(&h);  // checked at open

  std::byte* base = region.at(carve->offset);
  const uint64_t used = h.doorbell_off + uint64_t(nodes) * CXLKV_LINE_SIZE;
  // Format is a single-writer operation: plain stores, then flush every
  // line (rule 3: data before the header that makes it valid).
  std::vector<std::byte> zero(1 << 16);
  for (uint64_t o = CXLKV_LINE_SIZE; o < used; o += zero.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(zero.size(), used - o));
    d.store(base + o, zero.data(), n);
    d.flush(base + o, n);
  }
  cxlkv_lock_grant none{};
  none.node = CXLKV_GRANT_NONE;
  for (uint32_t l = 0; l < locks; l++) {
    auto* g = reinterpret_cast<cxlkv_lock_grant*>(base + h.grant_table_off) + l;
    d.publish_line(g, &none);  // rule 1: grants are written NT by whichever manager runs
  }
  d.fence();  // rule 3: the tables are in memory before the header says they exist
  d.publish_line(base, &h);
  d.fence();
  return {};
}

Result<ControlCarve> ControlCarve::open(const Region& region, MemoryDomain& d) {
  auto carve = region.carve(CXLKV_CARVE_CONTROL);
  if (!carve) return carve.error();
  ControlCarve c;
  c.base_ = region.at(carve->offset);
  c.hdr_ = d.read_fresh(reinterpret_cast<const cxlkv_ctrl_header*>(c.base_));  // rule 4
  const auto& h = c.hdr_;
  const std::string who = "pool " + region.uri() + ": control carve: ";
  if (h.magic != CXLKV_CTRL_MAGIC)
    return Error(-EUCLEAN, who + "not formatted (bad magic; run `cxlkvctl format`)");
  if (h.version != CXLKV_CTRL_VERSION)
    return Error(-EPROTO, who + "layout version " + std::to_string(h.version) + ", this runtime knows " +
                              std::to_string(CXLKV_CTRL_VERSION) +
                              (h.version < CXLKV_CTRL_VERSION
                                   ? "; reformat the pool (cxlkvctl format --force) or use a matching runtime"
                                   : ""));
  if (h.max_nodes == 0 || h.max_nodes > CXLKV_MAX_NODES || h.max_nodes != region.max_nodes())
    return Error(-EUCLEAN, who + "max_nodes " + std::to_string(h.max_nodes) + " does not match the superblock");
  if (h.max_locks == 0 || h.max_locks > CXLKV_MAX_LOCKS)
    return Error(-EUCLEAN, who + "max_locks " + std::to_string(h.max_locks) + " out of range");
  // Every table lies inside the carve, after the header, on a line
  // boundary, and overlaps no other table; all arithmetic is overflow-safe
  // (a huge or wrapping offset must not reach another carve).
  struct Table {
    const char* field;
    uint64_t off, len;
  };
  const uint64_t L = CXLKV_LINE_SIZE;
  const Table t[] = {{"lease_off", h.lease_off, L},
                     {"node_table_off", h.node_table_off, uint64_t(h.max_nodes) * L},
                     {"lock_table_off", h.lock_table_off, uint64_t(h.max_locks) * h.max_nodes * L},
                     {"grant_table_off", h.grant_table_off, uint64_t(h.max_locks) * L},
                     {"doorbell_off", h.doorbell_off, uint64_t(h.max_nodes) * L}};
  for (const Table& a : t) {
    if (a.off % L || a.off < L || a.off > carve->size || a.len > carve->size - a.off)
      return Error(-EUCLEAN, who + a.field + " " + std::to_string(a.off) + " (+" + std::to_string(a.len) +
                                 " bytes) is not a line-aligned range inside the carve of " +
                                 std::to_string(carve->size) + " bytes after its header");
    for (const Table& b : t)
      if (&a != &b && a.off < b.off + b.len && b.off < a.off + a.len)  // both in range: no overflow
        return Error(-EUCLEAN, who + a.field + " " + std::to_string(a.off) + " overlaps " + b.field + " " +
                                   std::to_string(b.off));
  }
  // Last, so a field out of range is named above; this catches a
  // damaged field whose value still looks plausible.
  if (const uint32_t sum = cxlkv_ctrl_header_checksum(&h); sum != h.checksum) {
    char b[80];
    std::snprintf(b, sizeof b, "header checksum mismatch (stored 0x%08x, computed 0x%08x)", h.checksum, sum);
    return Error(-EUCLEAN, who + b + ": the header is damaged");
  }
  return c;
}

}  // namespace cxlkv
