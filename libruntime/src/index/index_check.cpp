// SPDX-License-Identifier: MIT
// index_entry_naming(): a lock-free scan of the index entries for one that
// names a range of pool memory (used by cxlkv_free to refuse blocks the
// KV store owns, issue 12).
#include "index/index_check.hpp"

#include <cerrno>
#include <cstring>

#include "uapi/cxlkv_index.h"

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
}  // namespace

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
  // Overflow-safe: the entry table lies inside the carve.
  if (h.nslots == 0 || h.nslots > (1ull << 32) || h.entry_off > ic->size || h.nslots > (ic->size - h.entry_off) / 64)
    return Error(-EUCLEAN, who + "entry table (" + std::to_string(h.nslots) + " slots at " +
                               std::to_string(h.entry_off) + ") does not fit the carve; cannot tell which blocks it names");
  const auto* entries = reinterpret_cast<const cxlkv_index_entry*>(carve + h.entry_off);
  const uint64_t end = len > UINT64_MAX - off ? UINT64_MAX : off + len;
  constexpr uint64_t kBatch = 4096;  // entries per invalidation sweep
  for (uint64_t first = 0; first < h.nslots; first += kBatch) {
    const uint64_t n = std::min<uint64_t>(kBatch, h.nslots - first);
    d.invalidate(entries + first, n * 64);  // rule 4: one sweep, one fence, then the loads
    d.fence();
    for (uint64_t i = first; i < first + n; i++) {
      cxlkv_index_entry e;
      d.load(&e, entries + i, sizeof e);
      if (e.state != CXLKV_ENTRY_WRITING && e.state != CXLKV_ENTRY_READY && e.state != CXLKV_ENTRY_EVICTING) continue;
      if (e.loc_tier != CXLKV_TIER_MEM) continue;
      // A torn or damaged line counts as naming its range (refusing a free
      // is safe; freeing a block the index names is not).
      const uint64_t lo = e.loc_off, hi = e.loc_len > UINT64_MAX - lo ? UINT64_MAX : lo + e.loc_len;
      if (lo < end && off < hi) {
        NamedBlock b;
        b.slot = static_cast<uint32_t>(i);
        b.key = BlockKey{e.key_lo, e.key_hi};
        b.state = e.state;
        b.loc_off = e.loc_off;
        b.loc_len = e.loc_len;
        return std::optional<NamedBlock>{b};
      }
    }
  }
  return std::optional<NamedBlock>{};
}

}  // namespace cxlkv
