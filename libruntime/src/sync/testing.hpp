// SPDX-License-Identifier: MIT
// Test-only switches (not part of the public API).  They exist so a test can
// show that the NonCoherentSim tests catch a broken lock protocol.
#pragma once

#include <cstdint>

namespace cxlkv::sync::testing {

// When set, LockGuard skips the flush of its protected range before the
// global release (coherence contract rule 3), so the next holder on another
// node may read stale data.  Default off; never set outside tests.
void set_break_lock_flush(bool on);
bool break_lock_flush();

// When set, the node's watcher acknowledges a revoked kept grant by writing
// the slot IDLE without taking the lock's node-local mutex and without
// ending the node-local `cached` phase: the node's processes then re-enter
// on a grant the manager has given to another node (the "re-acquire
// without checking" variant of the Promela model, BROKEN_ACK).
void set_break_watcher_local(bool on);
bool break_watcher_local();

// When set, the lock manager loads the watched doorbells without
// invalidating them first (rule 4), so it may never see a new request
// posted after it first cached a doorbell line.
void set_break_doorbell_invalidate(bool on);
bool break_doorbell_invalidate();

// Called (when set) by TwoTierLock::acquire after it has read its grant and
// before it marks the lock held: a test parks the acquirer there to open
// the window in which the manager revokes a grant its holder has seen.
void set_grant_seen_hook(void (*hook)(uint32_t lock_id));
void grant_seen_hook(uint32_t lock_id);

// When set, the node's watcher sweeps for revoked grants only when the
// doorbell's `revokes` counter moves (no periodic sweep), so a test sees
// what a single sweep misses.
void set_watcher_no_resweep(bool on);
bool watcher_no_resweep();

// When set, the lock manager ignores the links of a lock set's requests
// (uapi/cxlkv_ctrl.h "Lock sets") and grants them in any order: two sets
// may then each hold a lock the other waits for (the BROKEN_ORDER variant
// of tests/model/lock_set.pml).
void set_break_set_order(bool on);
bool break_set_order();

// When set, a lock set polls the grant lines it waits for without
// invalidating them first (rule 4), so it may keep reading a stale copy and
// never see its grant.
void set_break_set_grant_invalidate(bool on);
bool break_set_grant_invalidate();

// When set, the lock manager judges every node as if it ran on another
// host: by its heartbeat only, never by a process's pid, so an in-process
// test stands for a manager that cannot see the holder's process.
void set_manager_on_another_host(bool on);
bool manager_on_another_host();

// When set, the lock manager never asks the node of a live CONTENDED
// holder on another host whether that holder lives (uapi "Dead processes
// of live nodes"): a holder that died there keeps the lock while its node
// lives (the BROKEN_ASK variant of tests/model/global_lock.pml).
void set_break_ask_remote(bool on);
bool break_ask_remote();

// When set, the sticky fast path re-enters a grant kept by another process
// of the node without asking whether that process still lives: a successor
// of a killed keeper re-enters a grant the manager has given to another
// node meanwhile (lock_sim_test.cpp shows that this is caught).
void set_break_kept_grant_check(bool on);
bool break_kept_grant_check();

// How many verdicts on the keeper of a grant another process of the node
// kept this process has asked for (a lock set asks once per keeper).
void count_keeper_check();
uint64_t keeper_checks();

// When set, a node whose heartbeat lapsed (docs/locks.md "Heartbeat
// lapses") neither gives up its kept grants before it beats again nor
// refuses them on the sticky fast path: resumed after the manager judged it
// dead, it re-enters a grant the manager has given to another node
// (the BROKEN_LAPSE variant of tests/model/global_lock.pml).
void set_break_lapse_check(bool on);
bool break_lapse_check();

}  // namespace cxlkv::sync::testing
