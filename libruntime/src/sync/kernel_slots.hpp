// SPDX-License-Identifier: MIT
// Kernel-module ownership of global lock slots (dev: pools).  When the pool
// is a /dev/cxlkvN device, the module releases the slots registered through
// this process's device file when the file is closed (process death
// included), so a holder killed with -9 does not wedge the lock for other
// nodes.  Protocol: uapi/cxlkv_ioctl.h (LOCK_ALLOC / LOCK_FREE);
// implementation: region/dev_lock_slots.hpp.
#pragma once

#include <chrono>
#include <cstdint>

#include "cxlkv/result.hpp"

namespace cxlkv {
class NodeContext;
namespace sync {

// Make this process's device file the owner of this node's slot of
// `lock_id`, before the slot is set WAITING.  A dead holder's slot stays
// owned until the kernel has closed its files, which happens after its
// robust futex was handed on to us: -EBUSY is retried with backoff until
// `deadline` (at most a few seconds), then reported naming lock and device.
// No-op for shm:/file:/dax: pools.
Result<void> own_slot(NodeContext& node, uint32_t lock_id, std::chrono::steady_clock::time_point deadline);

// Give the slot back after its release (or withdrawal) was written.  The
// module writes (ticket<<2)|IDLE, the same word the release wrote.  No-op
// for non-dev pools.
Result<void> disown_slot(NodeContext& node, uint32_t lock_id);

}  // namespace sync
}  // namespace cxlkv
