// SPDX-License-Identifier: MIT
// How long a pool operation waits for a cross-host lock (the index's stripe
// locks, the allocator's ALLOC and REMOTE_FREE locks) before it gives up
// with -ETIMEDOUT and the sync layer's story of the lock (describe_lock: its
// holder, and "start one: `cxlkvd --pool URI`" when no lock manager holds
// the pool's lease, or "(expired: is it still running?)").  Without a
// running manager nothing is ever granted: an unbounded wait hung engine
// threads for good instead of telling the operator what is missing.
#pragma once

#include <chrono>

namespace cxlkv {

// CXLKV_LOCK_TIMEOUT_MS, read on each call (callers read it when they open:
// a store, a node heap); default 30 s.  0 in the environment waits as long
// as it takes: nanoseconds::max(), the one spelling of "unbounded" in the
// runtime's lock waits (a timeout of 0 passed to a call means one try).
// A value that is not a number keeps the default with a warning.
std::chrono::nanoseconds lock_timeout();

constexpr bool lock_wait_unbounded(std::chrono::nanoseconds t) { return t == std::chrono::nanoseconds::max(); }

}  // namespace cxlkv
