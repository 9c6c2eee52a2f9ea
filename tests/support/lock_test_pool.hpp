// SPDX-License-Identifier: MIT
// Test helper for the sync area: a freshly formatted shm pool (removed at
// the end) and, optionally, a NonCoherentSim over its mapping so each
// simulated node gets its own private write-back cache.  The pool is the
// shared ShmPool (support/pool_fixture.hpp), by the name the sync tests use.
#pragma once

#include "cxlkv/alloc.hpp"
#include "cxlkv/sync.hpp"
#include "support/pool_fixture.hpp"

namespace cxlkv::testpool {

using TestPool = test::ShmPool;

}  // namespace cxlkv::testpool
