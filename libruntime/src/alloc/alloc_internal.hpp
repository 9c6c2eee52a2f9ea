// SPDX-License-Identifier: MIT
// Shared by the chunk allocator and the node heap: their cross-host locks.
// The layouts they work on are in carve/alloc_layout.hpp.
#pragma once

#include <chrono>
#include <string>

#include "carve/alloc_layout.hpp"
#include "cxlkv/sync.hpp"

namespace cxlkv::alloc {

// Take one of the allocator's cross-host locks (ALLOC, REMOTE_FREE+node)
// within `timeout` (lock_wait_unbounded(): as long as it takes; 0: one
// try).  A failure puts the lock's role first, then the sync layer's story
// of it (pool, lock id, holder, the manager's lease: "start one: `cxlkvd
// --pool URI`" or "expired"), e.g. "allocator lock (ALLOC), allocating 1
// chunk(s): pool shm:a: lock 0 (node 1): not granted within the timeout: ...".
Result<LockGuard> take_lock(TwoTierLock& lock, std::chrono::nanoseconds timeout, const std::string& role,
                            PoolRange protect = {});

}  // namespace cxlkv::alloc
