// SPDX-License-Identifier: MIT
// A node's doorbell (uapi/cxlkv_ctrl.h struct cxlkv_doorbell): how the lock
// manager learns, in O(nodes) line reads per round, which locks a node asks
// for.  An entry is only a hint: the manager re-reads the slot before it
// grants, and takes a grant another node keeps (sticky) back as soon as an
// entry names the lock (a revocation; uapi "Sticky grants").
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "cxlkv/sync.hpp"

namespace cxlkv::sync {

// Most entries one post writes beyond the first: a post never fills the
// ring by itself, so a manager that reads the doorbell once between two
// posts of a node never falls behind it (which would cost it a rescan of
// every slot of the node).
constexpr uint32_t kMaxHints = CXLKV_DOORBELL_RING / 2 - 1;

// Post `ids` (at most kMaxHints + 1 of them; the rest is dropped) on the
// node's doorbell in one post: entries, fence, seq, fence (rule 3); then
// wake a lock manager on this host that sleeps.
void ring_doorbell(NodeContext& node, std::span<const uint32_t> ids);

// LockSet's acquisition (uapi/cxlkv_ctrl.h "Lock sets"): `want` sorted and
// unique.  Takes the node-local mutexes in ascending order, enters kept
// grants up to the first lock it must ask for, asks for all the others in
// one doorbell post (each request linked to the previous one), waits for
// their grants, which come in ascending order, and appends what it holds
// to `held` (ascending) as it goes.  On an error, the requests not yet
// granted are withdrawn and `held` is left for the caller to release.
// Not for dev: pools (their module owns slots one by one).
Result<Acquired> acquire_set(NodeContext& node, std::span<const uint32_t> want,
                             std::chrono::steady_clock::time_point deadline, bool bounded,
                             std::vector<uint32_t>& held);

// LockSet's release: every lock of `held` (this process holds them all), in
// descending order, as TwoTierLock::unlock releases one, but with one fence
// for the set before the first release instead of one per lock.  Returns
// the first error; the others are still released.
Result<void> release_set(NodeContext& node, std::span<const uint32_t> held);

}  // namespace cxlkv::sync
