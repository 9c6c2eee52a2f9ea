// SPDX-License-Identifier: MIT
// Kernel ownership of this node's global lock slots on dev: pools.
//
// The cxlkv module records which open file owns this node's slot of a lock
// and, when that file is closed -- also when its process dies -- sets the
// slot idle (keeping its ticket) so that the lock manager can grant the
// lock to another node.  Ownership is exclusive: take it before posting
// WAITING, give it back after the release.  A successor on this node gets
// -EBUSY until the kernel has released a dead holder's slot (its files are
// closed after its robust futexes are handed on), and simply retries.
//
// Each process uses one file per device, opened on first use and kept open
// for the life of the process (its closing is what releases the slots).
// On pools that are not dev: these calls do nothing.
#pragma once

#include <cstdint>

#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"

namespace cxlkv::region {

// Own this node's slot of `lock_id` (again: succeeds).  -EBUSY: owned by another file (a live
// holder, or a dead one not yet released); -EINVAL: lock_id >= max_locks or
// node_id >= max_nodes; -ENOENT/-EUCLEAN: no usable control carve.
Result<void> dev_own_lock_slot(const Region& r, uint32_t lock_id);

// Give the slot back; the module writes (ticket << 2) | IDLE to it, which is
// also what a release writes.  -ENOENT if this process does not own it.
Result<void> dev_disown_lock_slot(const Region& r, uint32_t lock_id);

}  // namespace cxlkv::region
