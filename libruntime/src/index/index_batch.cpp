// SPDX-License-Identifier: MIT
// PrefixIndex batch calls (CONTRACTS.md "PrefixIndex batch interface").
#include "index/prefix_index.hpp"

#include <string>

namespace cxlkv {
namespace {

int32_t reserve_code(ReserveStatus s) {
  switch (s) {
    case ReserveStatus::reserved: return kBlockReserved;
    case ReserveStatus::exists_ready: return kBlockExists;
    default: return kBlockBusy;
  }
}

}  // namespace

Result<size_t> PrefixIndex::reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                          std::span<Reservation> out, std::span<int32_t> status) {
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: reserve_chain of " + std::to_string(keys.size()) + " blocks with " +
                              std::to_string(out.size()) + " results / " + std::to_string(status.size()) + " statuses");
  size_t good = 0;
  bool stopped = false;
  for (size_t i = 0; i < keys.size(); i++) {
    if (stopped) {
      status[i] = -ECANCELED;
      out[i] = Reservation{};
      continue;
    }
    const BlockKey* p = i ? &keys[i - 1] : parent;
    auto r = reserve(keys[i], p, bytes);
    if (!r) {
      status[i] = r.error().code();
      out[i] = Reservation{};
      stopped = true;
      continue;
    }
    out[i] = r.value();
    status[i] = reserve_code(r->status);
    if (status[i] == kBlockBusy) {
      stopped = true;
      continue;
    }
    good++;
  }
  return good;
}

Result<size_t> PrefixIndex::publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                         std::span<int32_t> status) {
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: publish_many: slots, keys and statuses differ in length");
  size_t good = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    auto r = publish(slots[i], keys[i]);
    status[i] = r ? kBlockReserved : r.error().code();
    good += r.ok();
  }
  return good;
}

Result<size_t> PrefixIndex::abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                       std::span<int32_t> status) {
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: abort_many: slots, keys and statuses differ in length");
  size_t good = 0;
  // Leaf first: a chain given parent first is aborted from its end.
  for (size_t j = keys.size(); j-- > 0;) {
    auto r = abort(slots[j], keys[j]);
    status[j] = r ? kBlockReserved : r.error().code();
    good += r.ok();
  }
  return good;
}

Result<size_t> PrefixIndex::pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                     std::span<int32_t> status) {
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: pin_many: fewer results or statuses than keys");
  size_t good = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    uint32_t slot = CXLKV_INDEX_NO_SLOT;
    auto r = pin(keys[i], &slot);
    out[i] = PinnedBlock{};
    if (!r) {
      status[i] = r.error().code() == -ENOENT ? kBlockMiss : r.error().code();
      continue;
    }
    out[i].slot = slot;
    out[i].loc = r.value();
    out[i].version = entry(slot).version;
    status[i] = kBlockReserved;
    good++;
  }
  return good;
}

Result<size_t> PrefixIndex::unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                       std::span<int32_t> status) {
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index: unpin_many: slots, keys and statuses differ in length");
  size_t good = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    auto r = unpin(slots[i], keys[i]);
    status[i] = r ? kBlockReserved : r.error().code();
    good += r.ok();
  }
  return good;
}

bool PrefixIndex::still_valid(uint32_t slot, const BlockKey& key, uint32_t state, uint32_t version) const {
  if (slot >= hdr_.nslots) return false;
  cxlkv_index_entry e = read_entry(slot);  // rule 4: one fresh read
  return e.key_lo == key.lo && e.key_hi == key.hi && e.state == state && e.version == version;
}

}  // namespace cxlkv
