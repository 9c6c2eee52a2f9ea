// SPDX-License-Identifier: MIT
// Object store: named roots in a pool hash table (protocol in
// cxlkv/format/objstore_format.h).
#include "cxlkv/objstore.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include "carve/alloc_layout.hpp"
#include "cxlkv/format/objstore_format.h"

namespace cxlkv {

namespace {

uint64_t key_hash(std::string_view k) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : k) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

Result<void> check_name(const NodeContext& n, std::string_view name) {
  if (name.empty()) return Error(-EINVAL, "pool " + n.region().uri() + ": object store: empty name");
  if (name.size() > CXLKV_OBJ_KEY_MAX)
    return Error(-ENAMETOOLONG, "pool " + n.region().uri() + ": object store: name '" + std::string(name) + "' is " +
                                    std::to_string(name.size()) + " bytes (max " +
                                    std::to_string(CXLKV_OBJ_KEY_MAX) + ")");
  return {};
}

bool same_key(const cxlkv_obj_entry& e, std::string_view name) {
  return e.key_len == name.size() && std::memcmp(e.key, name.data(), name.size()) == 0;
}

// rule 4: invalidate + read; retry a line whose checksum fails (a write in
// flight is visible piecewise: publish_line is NT stores, not one store).
bool read_entry(MemoryDomain& d, const cxlkv_obj_entry* p, cxlkv_obj_entry* out) {
  for (int tries = 0; tries < 64; tries++) {
    *out = d.read_fresh(p);
    if (out->check == cxlkv_obj_entry_check(out)) return true;
  }
  return false;
}

}  // namespace

Result<ObjectStore> ObjectStore::open(NodeContext& node) {
  auto h = alloc::read_alloc_header(node.region(), node.domain());
  if (!h) return h.error();
  auto carve = node.region().carve(CXLKV_CARVE_ALLOC);
  std::byte* at = node.region().at(carve->offset + h->objstore_off);
  auto oh = node.domain().read_fresh(reinterpret_cast<const cxlkv_objstore_header*>(at));  // rule 4
  if (oh.magic != CXLKV_OBJSTORE_MAGIC || oh.version != CXLKV_OBJSTORE_VERSION || oh.nentries == 0 ||
      (oh.nentries & (oh.nentries - 1)) || oh.table_off + uint64_t(oh.nentries) * 64 > h->objstore_bytes)
    return Error(-EUCLEAN, "pool " + node.region().uri() + ": object store header invalid");
  ObjectStore s(node);
  s.table_ = reinterpret_cast<cxlkv_obj_entry*>(at + oh.table_off);
  s.nentries_ = oh.nentries;
  return s;
}

Result<uint64_t> ObjectStore::get(std::string_view name) const {
  CXLKV_TRY(check_name(*node_, name));
  MemoryDomain& d = node_->domain();
  const uint32_t mask = nentries_ - 1;
  uint32_t i = static_cast<uint32_t>(key_hash(name)) & mask;
  for (uint32_t probe = 0; probe < nentries_; probe++, i = (i + 1) & mask) {
    cxlkv_obj_entry e;
    if (!read_entry(d, &table_[i], &e)) {
      // A writer stalled mid-line: read under the lock instead.
      TwoTierLock lock(*node_, CXLKV_LOCK_OBJSTORE);
      auto g = LockGuard::take(lock);
      if (!g) return g.error();
      if (!read_entry(d, &table_[i], &e))
        return Error(-EUCLEAN, "pool " + node_->region().uri() + ": object store entry " + std::to_string(i) +
                                   " fails its checksum");
    }
    if (e.state == CXLKV_OBJ_EMPTY) break;
    if (e.state == CXLKV_OBJ_LIVE && same_key(e, name)) return e.value;
  }
  return Error(-ENOENT, "pool " + node_->region().uri() + ": object '" + std::string(name) + "' not found");
}

Result<void> ObjectStore::put(std::string_view name, uint64_t off) {
  CXLKV_TRY(check_name(*node_, name));
  // A root names pool data by offset (DESIGN.md "The pool"): one past the
  // pool (UINT64_MAX, a length taken for an offset) names nothing, and a
  // reader adding it to its base would overflow.
  if (off >= node_->region().size())
    return Error(-ERANGE, "pool " + node_->region().uri() + ": object store: object '" + std::string(name) +
                              "': offset " + std::to_string(off) + " is outside the pool (" +
                              std::to_string(node_->region().size()) + " bytes)");
  MemoryDomain& d = node_->domain();
  TwoTierLock lock(*node_, CXLKV_LOCK_OBJSTORE);
  auto g = LockGuard::take(lock);
  if (!g) return g.error();
  const uint32_t mask = nentries_ - 1;
  uint32_t i = static_cast<uint32_t>(key_hash(name)) & mask;
  int64_t reuse = -1;
  int64_t found = -1;
  cxlkv_obj_entry e{};
  for (uint32_t probe = 0; probe < nentries_; probe++, i = (i + 1) & mask) {
    if (!read_entry(d, &table_[i], &e))
      return Error(-EUCLEAN, "pool " + node_->region().uri() + ": object store entry " + std::to_string(i) +
                                 " fails its checksum");
    if (e.state == CXLKV_OBJ_LIVE && same_key(e, name)) {
      found = i;
      break;
    }
    if (e.state == CXLKV_OBJ_TOMBSTONE && reuse < 0) reuse = i;
    if (e.state == CXLKV_OBJ_EMPTY) {
      if (reuse < 0) reuse = i;
      break;
    }
  }
  const int64_t slot = found >= 0 ? found : reuse;
  if (slot < 0)
    return Error(-ENOSPC, "pool " + node_->region().uri() + ": object store full (" + std::to_string(nentries_) +
                              " entries)");
  cxlkv_obj_entry cur = d.read_fresh(&table_[slot]);  // rule 4
  cxlkv_obj_entry n{};
  n.value = off;
  n.state = CXLKV_OBJ_LIVE;
  n.key_len = static_cast<uint16_t>(name.size());
  n.seq = cur.seq + 1;
  std::memcpy(n.key, name.data(), name.size());
  n.check = cxlkv_obj_entry_check(&n);
  d.publish_line(&table_[slot], &n);  // rule 1: whole line, NT
  d.fence();                          // rule 3: visible before the lock is released
  return {};
}

Result<void> ObjectStore::destroy(std::string_view name) {
  CXLKV_TRY(check_name(*node_, name));
  MemoryDomain& d = node_->domain();
  TwoTierLock lock(*node_, CXLKV_LOCK_OBJSTORE);
  auto g = LockGuard::take(lock);
  if (!g) return g.error();
  const uint32_t mask = nentries_ - 1;
  uint32_t i = static_cast<uint32_t>(key_hash(name)) & mask;
  for (uint32_t probe = 0; probe < nentries_; probe++, i = (i + 1) & mask) {
    cxlkv_obj_entry e;
    if (!read_entry(d, &table_[i], &e))
      return Error(-EUCLEAN, "pool " + node_->region().uri() + ": object store entry " + std::to_string(i) +
                                 " fails its checksum");
    if (e.state == CXLKV_OBJ_EMPTY) break;
    if (e.state == CXLKV_OBJ_LIVE && same_key(e, name)) {
      cxlkv_obj_entry t{};
      t.state = CXLKV_OBJ_TOMBSTONE;
      t.seq = e.seq + 1;
      t.check = cxlkv_obj_entry_check(&t);
      d.publish_line(&table_[i], &t);  // rule 1
      d.fence();                       // rule 3
      return {};
    }
  }
  return Error(-ENOENT, "pool " + node_->region().uri() + ": object '" + std::string(name) + "' not found");
}

}  // namespace cxlkv
