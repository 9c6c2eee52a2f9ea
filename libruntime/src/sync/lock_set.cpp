// SPDX-License-Identifier: MIT
// LockSet: several two-tier locks of one node in one call (batches).
//
// Deadlock freedom: every multi-lock path takes locks in ascending id
// order and holds lower ids while it waits for higher ones, never the
// reverse; a single TwoTierLock is a set of one.  Locks whose grant the
// node keeps (sticky) cost node-local memory only (see two_tier_lock.cpp),
// so a batch whose stripes are all kept touches no pool line at all,
// acquire or release.  The others are asked for together (docs/locks.md "Lock sets"; one
// manager round trip and one sleep per set instead of one per lock): every
// request names the set's previous one, and the manager grants a request
// only while the node holds the one it names, so grants still come in
// ascending order (uapi/cxlkv_ctrl.h "Lock sets"; tests/model/lock_set.pml).
// dev: pools take them one after the other (their module owns each slot
// from before its request to after its release).
#include <algorithm>
#include <cerrno>
#include <functional>
#include <string>

#include "cxlkv/sync.hpp"
#include "sync/doorbell.hpp"
#include "sync/node_local.hpp"
#include "util/log.hpp"

namespace cxlkv {

LockSet::~LockSet() {
  if (held_.empty()) return;
  auto r = unlock();
  if (!r) log().error("{}", r.error().message());
}

bool LockSet::holds(uint32_t id) const { return std::binary_search(held_.begin(), held_.end(), id); }

Result<Acquired> LockSet::lock(std::span<const uint32_t> ids) {
  return acquire(ids, std::chrono::nanoseconds::max(), false);
}

Result<Acquired> LockSet::try_lock_for(std::span<const uint32_t> ids, std::chrono::nanoseconds timeout) {
  return acquire(ids, timeout, true);
}

Result<Acquired> LockSet::acquire(std::span<const uint32_t> ids, std::chrono::nanoseconds timeout, bool bounded) {
  // Made for an error only: a batch takes a set per call, and the string
  // cost more than the set's kept locks.
  auto who = [&] {
    return "pool " + node_.region().uri() + ": lock set (node " + std::to_string(node_.node()) + ")";
  };
  if (!held_.empty()) return Error(-EBUSY, who() + ": already holds " + std::to_string(held_.size()) + " locks");
  std::vector<uint32_t> want(ids.begin(), ids.end());
  // The index passes its stripes sorted and unique already.
  if (std::adjacent_find(want.begin(), want.end(), std::greater_equal<uint32_t>()) != want.end()) {
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
  }
  const uint32_t max = node_.control().max_locks();
  if (!want.empty() && want.back() >= max)
    return Error(-EINVAL, who() + ": lock id " + std::to_string(want.back()) + " out of range (max_locks " +
                              std::to_string(max) + ")");
  const auto deadline = bounded ? std::chrono::steady_clock::now() + timeout
                                : std::chrono::steady_clock::time_point::max();
  Acquired how = Acquired::clean;
  held_.reserve(want.size());
  if (node_.region().kind() != BackendKind::dev) {
    // All of them in one request (uapi/cxlkv_ctrl.h "Lock sets").
    auto r = sync::acquire_set(node_, want, deadline, bounded, held_);
    if (!r) {
      auto u = unlock();  // all or nothing
      if (!u) log().error("{}", u.error().message());
      return Error(r.error().code(), who() + ": " + r.error().message());
    }
    return r.value();
  }
  // dev: pools: one lock after the other (the module owns slots one by one).
  for (uint32_t id : want) {
    TwoTierLock l(node_, id);
    Result<Acquired> r = Acquired::clean;
    if (bounded) {
      const auto left = deadline - std::chrono::steady_clock::now();
      r = l.try_lock_for(std::max<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0)));
    } else {
      r = l.lock();
    }
    if (!r) {
      auto u = unlock();  // all or nothing
      if (!u) log().error("{}", u.error().message());
      return Error(r.error().code(), who() + ": " + r.error().message());
    }
    if (r.value() == Acquired::recovered) how = Acquired::recovered;
    held_.push_back(id);
  }
  return how;
}

Result<void> LockSet::unlock() {
  auto r = sync::release_set(node_, held_);
  held_.clear();
  return r;
}

}  // namespace cxlkv
