// SPDX-License-Identifier: MIT
// index_entry_naming(): a lock-free scan of the index entries for one that
// names a range of pool memory (used by cxlkv_free to refuse blocks the
// KV store owns; docs/integrity.md "Checked metadata"); the audits of cxlkvctl kv check (locations,
// children counts).
#include "index/index_check.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "index/index_internal.hpp"
#include "cxlkv/format/index_format.h"

namespace cxlkv {

namespace {
const char* state_name(uint32_t s) {
  switch (s) {
    case CXLKV_ENTRY_WRITING: return "WRITING";
    case CXLKV_ENTRY_READY: return "READY";
    case CXLKV_ENTRY_EVICTING: return "EVICTING";
    default: return "?";
  }
}
bool live_state(uint32_t s) {
  return s == CXLKV_ENTRY_WRITING || s == CXLKV_ENTRY_READY || s == CXLKV_ENTRY_EVICTING;
}

// Calls fn(slot, entry) on a fresh copy of every entry of the table, in
// slot order, until fn returns false: the scans of this file, none of which
// takes a lock.
template <class Fn>
void for_each_entry_fresh(MemoryDomain& d, const cxlkv_index_entry* entries, uint64_t nslots, Fn&& fn) {
  constexpr uint64_t kSweep = 4096;  // entries per invalidation sweep
  for (uint64_t first = 0; first < nslots; first += kSweep) {
    const uint64_t n = std::min<uint64_t>(kSweep, nslots - first);
    d.invalidate(entries + first, n * 64);  // rule 4: one sweep, one fence, then the loads
    d.fence();
    for (uint64_t i = first; i < first + n; i++) {
      cxlkv_index_entry e;
      d.load(&e, entries + i, sizeof e);
      if (!fn(i, e)) return;
    }
  }
}
}  // namespace

Result<void> check_index_header(const cxlkv_index_header& h, uint64_t bytes, const std::string& who) {
  auto bad = [&](const char* field, uint64_t v, const std::string& why) {
    return Error(-EUCLEAN, who + field + " " + std::to_string(v) + " " + why);
  };
  if (h.version != CXLKV_INDEX_VERSION)
    return Error(-EPROTO, who + "layout version " + std::to_string(h.version) +
                              (h.version < CXLKV_INDEX_VERSION ? " is older than this runtime's " : " is not this runtime's ") +
                              std::to_string(CXLKV_INDEX_VERSION) +
                              "; reformat the pool (cxlkvctl format --force) or use a matching runtime");
  if (h.max_nodes == 0 || h.max_nodes > 64) return bad("max_nodes", h.max_nodes, "is not in 1..64");
  if (!h.stripe_slots || (h.stripe_slots & (h.stripe_slots - 1)))
    return bad("stripe_slots", h.stripe_slots, "is not a power of two");
  if (h.nstripes == 0) return bad("nstripes", 0, "leaves no stripe");
  if (uint64_t(h.lock_base) + h.nstripes > CXLKV_MAX_LOCKS)
    return bad("lock_base", h.lock_base, "+ " + std::to_string(h.nstripes) + " stripes passes the lock id range");
  if (h.nslots != uint64_t(h.nstripes) * h.stripe_slots)
    return bad("nslots", h.nslots, "is not nstripes x stripe_slots (" + std::to_string(h.nstripes) + " x " +
                                       std::to_string(h.stripe_slots) + ")");
  if (h.nslots > (1ull << 32) - 2) return bad("nslots", h.nslots, "exceeds 2^32 - 2");
  // Layout order: header, config, stripes, per-node stats, entries, ext records.
  if (h.stripe_off < 128 || h.stripe_off % 64 || h.stripe_off > bytes || uint64_t(h.nstripes) * 64 > bytes - h.stripe_off)
    return bad("stripe_off", h.stripe_off, "does not place " + std::to_string(h.nstripes) +
                                               " stripe lines inside the carve after its header");
  const uint64_t stats_len = uint64_t(h.max_nodes) * sizeof(cxlkv_index_node_stats);
  if (h.stats_off % 64 || h.stats_off < h.stripe_off + uint64_t(h.nstripes) * 64 || h.stats_off > bytes ||
      stats_len > bytes - h.stats_off)
    return bad("stats_off", h.stats_off, "does not place the per-node stats after the stripes inside the carve");
  if (h.entry_off % 64 || h.entry_off < h.stats_off + stats_len || h.entry_off > bytes ||
      h.nslots > (bytes - h.entry_off) / 64)
    return bad("entry_off", h.entry_off, "does not place " + std::to_string(h.nslots) +
                                             " entries after the stats inside the carve of " + std::to_string(bytes));
  const uint64_t ext = cxlkv_index_ext_off(&h);  // no overflow: entry_off + nslots * 64 <= bytes
  if (ext > bytes || h.nslots > (bytes - ext) / 32)
    return bad("nslots", h.nslots, "leaves no room for the extension records in the carve of " + std::to_string(bytes));
  const uint32_t sum = cxlkv_index_header_checksum(&h);
  if (sum != h.checksum) {
    char b[96];
    std::snprintf(b, sizeof b, "header checksum mismatch (stored 0x%08x, computed 0x%08x)", h.checksum, sum);
    return Error(-EUCLEAN, who + b + ": the header is damaged");
  }
  return {};
}

std::string describe_named_block(const NamedBlock& b) {
  return "block " + to_hex(b.key) + " (index slot " + std::to_string(b.slot) + ", " + state_name(b.state) +
         ", bytes " + std::to_string(b.loc_off) + ".." + std::to_string(b.loc_off + b.loc_len) + ")";
}

Result<std::optional<NamedBlock>> index_entry_naming(const Region& pool, MemoryDomain& d, uint64_t off, uint64_t len) {
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  if (!ic) return std::optional<NamedBlock>{};
  const std::byte* carve = pool.at(ic->offset);
  const auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(carve));  // rule 4
  const std::string who = "pool " + pool.uri() + ": index carve: ";
  if (h.magic != CXLKV_INDEX_MAGIC) return std::optional<NamedBlock>{};  // not formatted: names nothing
  // The entry table lies inside the carve (else: cannot tell which blocks it names).
  CXLKV_TRY(check_index_header(h, ic->size, who));
  const auto* entries = reinterpret_cast<const cxlkv_index_entry*>(carve + h.entry_off);
  const uint64_t end = len > UINT64_MAX - off ? UINT64_MAX : off + len;
  std::optional<NamedBlock> named;
  for_each_entry_fresh(d, entries, h.nslots, [&](uint64_t i, const cxlkv_index_entry& e) {
    if (!live_state(e.state) || e.loc_tier != CXLKV_TIER_MEM) return true;
    // A torn or damaged line counts as naming its range (refusing a free
    // is safe; freeing a block the index names is not).
    const uint64_t lo = e.loc_off, hi = e.loc_len > UINT64_MAX - lo ? UINT64_MAX : lo + e.loc_len;
    if (lo < end && off < hi) named = NamedBlock{static_cast<uint32_t>(i), BlockKey{e.key_lo, e.key_hi}, e.state,
                                                 e.loc_off, e.loc_len};
    return !named;
  });
  return named;
}

Result<cxlkv_index_header> read_index_header(const Region& pool, MemoryDomain& d) {
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  if (!ic)
    return Error(-ENOENT, "pool " + pool.uri() + " has no index carve (format it with the standard layout: "
                                                 "cxlkvctl format)");
  const std::string who = "pool " + pool.uri() + ": index carve: ";
  if (ic->size < sizeof(cxlkv_index_header)) return Error(-EUCLEAN, who + "smaller than its header");
  const auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(pool.at(ic->offset)));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC) {
    const auto* b = reinterpret_cast<const unsigned char*>(&h);
    if (std::all_of(b, b + sizeof h, [](unsigned char c) { return c == 0; }))
      return Error(-ENODATA, who + "not formatted (all zero; cxlkvctl format --force reformats the pool)");
    char m[64];
    std::snprintf(m, sizeof m, "bad magic 0x%016llx (expected 0x%016llx)", (unsigned long long)h.magic,
                  (unsigned long long)CXLKV_INDEX_MAGIC);
    return Error(-EUCLEAN, who + m + ": damaged");
  }
  CXLKV_TRY(check_index_header(h, ic->size, who));
  // The config line (no checksum: operator-written) names the interleave set.
  const auto cfg = d.read_fresh(reinterpret_cast<const cxlkv_index_config*>(pool.at(ic->offset) + 64));  // rule 4
  if (cfg.ndevices == 0 || cfg.ndevices > CXLKV_INDEX_MAX_DEVICES)
    return Error(-EUCLEAN, who + "config line: ndevices " + std::to_string(cfg.ndevices) + " is not 1.." +
                               std::to_string(CXLKV_INDEX_MAX_DEVICES) + " (damaged)");
  return h;
}

Result<std::vector<std::string>> index_audit_locations(const Region& pool, MemoryDomain& d) {
  std::vector<std::string> out;
  auto hr = read_index_header(pool, d);
  if (!hr) return hr.error();
  const cxlkv_index_header h = hr.value();
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  const std::byte* carve = pool.at(ic->offset);
  const std::string who = "pool " + pool.uri() + ": index carve: ";
  auto kv = pool.carve(CXLKV_CARVE_KV);
  const uint64_t lo = kv ? kv->offset : 0, hi = kv ? kv->offset + kv->size : 0;
  const auto* entries = reinterpret_cast<const cxlkv_index_entry*>(carve + h.entry_off);
  std::vector<NamedBlock> mem;  // inside the carve, to check for overlaps
  for_each_entry_fresh(d, entries, h.nslots, [&](uint64_t i, const cxlkv_index_entry& e) {
    if (e.check != cxlkv_index_entry_check(&e)) return true;  // empty, torn right now, or damaged (never trusted)
    if (!live_state(e.state)) return true;
    if (e.loc_tier != CXLKV_TIER_MEM || e.loc_dev == CXLKV_LOC_DEV_INTERLEAVED || e.loc_dev != 0) return true;
    NamedBlock b{static_cast<uint32_t>(i), BlockKey{e.key_lo, e.key_hi}, e.state, e.loc_off, e.loc_len};
    if (!kv || e.loc_off < lo || e.loc_off > hi || e.loc_len > hi - e.loc_off)
      out.push_back(who + describe_named_block(b) + " lies outside the kv carve [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + ")");
    else
      mem.push_back(b);
    return true;
  });
  std::sort(mem.begin(), mem.end(), [](const NamedBlock& a, const NamedBlock& b) { return a.loc_off < b.loc_off; });
  // Sorted by start: a block overlaps an earlier one exactly when it starts
  // before the furthest end reached so far.
  size_t far = 0;
  auto end_of = [&](size_t k) { return mem[k].loc_off + mem[k].loc_len; };
  for (size_t i = 1; i < mem.size(); i++) {
    if (mem[i].loc_off < end_of(far))
      out.push_back(who + describe_named_block(mem[i]) + " overlaps " + describe_named_block(mem[far]));
    if (end_of(i) > end_of(far)) far = i;
  }
  return out;
}


Result<std::vector<ChildCountMismatch>> index_child_count_snapshot(MemoryDomain& d, const void* carve,
                                                                   uint64_t bytes, const std::string& who) {
  if (!carve || bytes < sizeof(cxlkv_index_header)) return Error(-EINVAL, who + "no carve, or smaller than its header");
  const auto* base = static_cast<const std::byte*>(carve);
  const auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(base));  // rule 4
  if (h.magic != CXLKV_INDEX_MAGIC) return Error(-ENODATA, who + "not formatted");
  CXLKV_TRY(check_index_header(h, bytes, who));  // the entry table lies inside the carve
  const auto* entries = reinterpret_cast<const cxlkv_index_entry*>(base + h.entry_off);
  struct Live {
    uint32_t slot, state, children;
    BlockKey key;
  };
  std::vector<Live> live;
  std::vector<uint32_t> found(h.nslots, 0);  // live entries naming each slot as parent
  for_each_entry_fresh(d, entries, h.nslots, [&](uint64_t i, const cxlkv_index_entry& e) {
    if (e.check != cxlkv_index_entry_check(&e)) return true;  // empty, torn right now, or damaged (never trusted)
    // A pending drop (a removed child whose parent's count is still to go
    // down: prefix_index.hpp "Children counts") counts as a child.
    const bool pending = pending_drop(e, static_cast<uint32_t>(h.nslots));
    if (!live_state(e.state) && !pending) return true;
    if (!pending) live.push_back(Live{static_cast<uint32_t>(i), e.state, e.children, BlockKey{e.key_lo, e.key_hi}});
    // A block naming itself (a damaged line) is no child of itself.
    if (e.parent_slot < h.nslots && e.parent_slot != i) found[e.parent_slot]++;
    return true;
  });
  std::vector<ChildCountMismatch> out;  // in slot order
  for (const Live& l : live)
    if (l.children != found[l.slot])
      out.push_back(ChildCountMismatch{l.slot, l.key, l.state, l.children, found[l.slot]});
  return out;
}

Result<std::vector<ChildCountMismatch>> index_audit_child_counts(const Region& pool, MemoryDomain& d,
                                                                 std::chrono::milliseconds settle) {
  auto hr = read_index_header(pool, d);  // errors: missing, unformatted, damaged
  if (!hr) return hr.error();
  auto ic = pool.carve(CXLKV_CARVE_INDEX);
  const std::string who = "pool " + pool.uri() + ": index carve: ";
  auto first = index_child_count_snapshot(d, pool.at(ic->offset), ic->size, who);
  if (!first || first->empty() || settle.count() <= 0) return first;
  std::this_thread::sleep_for(settle);
  auto second = index_child_count_snapshot(d, pool.at(ic->offset), ic->size, who);
  if (!second) return second;
  // Both lists are in slot order: keep what the second repeats exactly.
  std::vector<ChildCountMismatch> both;
  auto a = first->begin();
  for (const ChildCountMismatch& m : *second) {
    while (a != first->end() && a->slot < m.slot) ++a;
    if (a != first->end() && *a == m) both.push_back(m);
  }
  return both;
}

std::string describe_child_count_mismatch(const ChildCountMismatch& m) {
  std::string s = "block " + to_hex(m.key) + " (index slot " + std::to_string(m.slot) + ", " + state_name(m.state) +
                  "): children count " + std::to_string(m.stored) + ", but " + std::to_string(m.found) +
                  (m.found == 1 ? " live block names" : " live blocks name") + " it as parent";
  if (m.stored > m.found) s += " (a stale count: the block can never be evicted)";
  else s += " (the block can be evicted under its cached children)";
  return s;
}

std::string describe_child_count_repair(const ChildCountRepair& r) {
  const ChildCountMismatch& m = r.was;
  std::string s = "block " + to_hex(m.key) + " (index slot " + std::to_string(m.slot) + ", " + state_name(m.state) +
                  "): children " + std::to_string(m.stored) + " -> " + std::to_string(m.found);
  if (r.listed) s += ", a leaf on its stripe's eviction list (evictable)";
  return s;
}

size_t ChildCountRepairReport::now_evictable() const {
  size_t n = 0;
  for (const auto& r : repaired) n += r.listed;
  return n;
}

std::vector<std::string> IndexAudit::lines(const Region& pool) const {
  std::vector<std::string> out = locations;  // already prefixed
  for (const auto& m : child_counts)
    out.push_back("pool " + pool.uri() + ": index carve: " + describe_child_count_mismatch(m));
  return out;
}

Result<IndexAudit> index_audit(const Region& pool, MemoryDomain& d, std::chrono::milliseconds settle) {
  IndexAudit a;
  auto loc = index_audit_locations(pool, d);
  if (!loc) return loc.error();
  a.locations = std::move(loc.value());
  auto kids = index_audit_child_counts(pool, d, settle);
  if (!kids) return kids.error();
  a.child_counts = std::move(kids.value());
  return a;
}

}  // namespace cxlkv
