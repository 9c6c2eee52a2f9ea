// SPDX-License-Identifier: MIT
// Test-only switches (not part of the public API).  They exist so a test can
// show that the NonCoherentSim tests catch a broken lock protocol.
#pragma once

namespace cxlkv::sync::testing {

// When set, LockGuard skips the flush of its protected range before the
// global release (coherence contract rule 3), so the next holder on another
// node may read stale data.  Default off; never set outside tests.
void set_break_lock_flush(bool on);
bool break_lock_flush();

// When set, the sticky re-entry skips the invalidation of the grant line
// before reading it (rule 4), so a node may act on its cached copy of a
// grant the manager has since revoked and given to another node.
void set_break_sticky_invalidate(bool on);
bool break_sticky_invalidate();

// When set, the lock manager loads the watched doorbells without
// invalidating them first (rule 4), so it may never see a new request
// posted after it first cached a doorbell line.
void set_break_doorbell_invalidate(bool on);
bool break_doorbell_invalidate();

}  // namespace cxlkv::sync::testing
