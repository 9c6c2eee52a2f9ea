// SPDX-License-Identifier: MIT
#include "sync/kernel_slots.hpp"

#include <atomic>

#include "cxlkv/sync.hpp"
#include "util/log.hpp"

namespace cxlkv::sync {

void register_slot_owner(NodeContext& node, uint32_t lock_id) {
  if (node.region().kind() != BackendKind::dev) return;
  // HOOK (kmod area): the lock-slot ioctls of uapi/cxlkv_ioctl.h are not on
  // main yet.  Once they are, register (lock_id, node) with the device file
  // here, once per process and lock.  Until then, on dev: pools a slot of a
  // dead process is released by the next local locker (EOWNERDEAD path in
  // two_tier_lock.cpp) or by `cxlkvctl node evict`, as on shm: pools.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log().warn("pool {}: kernel lock-slot registration not available in this build (lock {}); "
               "dead holders are recovered by the next local locker",
               node.region().uri(), lock_id);
}

}  // namespace cxlkv::sync
