// SPDX-License-Identifier: MIT
// Kernel-module ownership of global lock slots (dev: pools).  When the pool
// is a /dev/cxlkvN device, the module releases the slots registered through
// its file descriptor when the file is closed (process death included).
#pragma once

#include <cstdint>

namespace cxlkv {
class NodeContext;
namespace sync {
// Register (once per process and lock) that this process's device file
// owns slot (lock_id, node).  No-op for shm:/file:/dax: pools.
void register_slot_owner(NodeContext& node, uint32_t lock_id);
}  // namespace sync
}  // namespace cxlkv
