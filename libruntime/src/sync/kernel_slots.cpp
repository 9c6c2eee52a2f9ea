// SPDX-License-Identifier: MIT
#include "sync/kernel_slots.hpp"

#include <algorithm>
#include <cerrno>
#include <string>

#include "cxlkv/sync.hpp"
#include "region/dev_lock_slots.hpp"
#include "sync/backoff.hpp"

namespace cxlkv::sync {

namespace {
// How long a successor waits for the kernel to release a dead holder's
// slot.  The release follows the holder's death by the time its files are
// closed (milliseconds); longer means a live process of this host owns the
// slot outside the node-local mutex, which is a bug worth reporting.
constexpr std::chrono::seconds kMaxOwnWait{5};
}  // namespace

Result<void> own_slot(NodeContext& node, uint32_t lock_id, std::chrono::steady_clock::time_point deadline) {
  const Region& r = node.region();
  if (r.kind() != BackendKind::dev) return {};
  deadline = std::min(deadline, std::chrono::steady_clock::now() + kMaxOwnWait);
  Backoff backoff(0, 20, std::chrono::milliseconds(10));
  for (;;) {
    auto o = region::dev_own_lock_slot(r, lock_id);
    if (o || o.error().code() != -EBUSY) return o;
    if (std::chrono::steady_clock::now() >= deadline)
      return Error(-EBUSY, o.error().message() + "; still owned after waiting for the kernel to release it (node " +
                               std::to_string(node.node()) + ", device " + r.uri() + ")");
    backoff.idle();
  }
}

Result<void> disown_slot(NodeContext& node, uint32_t lock_id) {
  return region::dev_disown_lock_slot(node.region(), lock_id);
}

}  // namespace cxlkv::sync
