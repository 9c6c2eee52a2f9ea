/*
 * Promela model of the cxlkv global lock protocol (uapi/cxlkv_ctrl.h,
 * libruntime/src/sync/two_tier_lock.cpp, lock_manager.cpp, watcher.cpp),
 * one lock, N nodes, one manager.  Checked by spin in `make test`
 * (tests/model/run_spin.sh): mutual exclusion among live nodes (assertion)
 * and no invalid end states (a live waiter blocked for ever is one).
 *
 * Modelled: slot request = (ticket, state) written by the node, state IDLE
 * or WAITING; grant = (node, ticket, revoked, contended) written by the
 * manager; the doorbell as a hint set; sticky grants, protocol 2: a release
 * of a grant that is not CONTENDED may keep it without writing anything to
 * the pool (node-local phase CACHED), and re-entry checks node-local memory
 * only (phase CACHED, taken under the node-local mutex); revocation: the
 * manager sets REVOKED and then waits for the node's answer -- the node's
 * watcher, under the node-local mutex, writes IDLE and ends the CACHED
 * phase, or, when the mutex is busy (a process inside), sets the node-local
 * revoke flag so that the release writes IDLE.  A node may give up (timeout,
 * TIMEOUTS) by writing IDLE, racing with a grant; a node may die anywhere
 * (DEATHS; its watcher dies with it: one process per node), and the
 * manager, which sees liveness, passes over a dead holder or waiter.  The
 * manager grants only after re-reading the slot WAITING.  Each variable is
 * single-copy atomic (8-byte NT stores, whole-line grant writes, fresh
 * reads): the NonCoherentSim tests cover the cache side.  Tickets are
 * bounded by ROUNDS per node.
 *
 * Variants that spin must reject (ctest WILL_FAIL):
 *   BROKEN         the node trusts a grant's node without its ticket
 *   BROKEN_REVOKE  the manager treats a revoked grant as free at once,
 *                  without waiting for the node's answer
 *   BROKEN_ACK     the watcher answers (writes IDLE) without the node-local
 *                  mutex and without ending the CACHED phase: the holder
 *                  re-acquires without checking
 *   BROKEN_DEAD    the manager ignores liveness: a waiter waits for ever
 *                  for a dead holder (invalid end state)
 *   BROKEN_ASK     (with PROC_DEATHS) the manager, which cannot see a
 *                  process on another host, never asks the node of a
 *                  CONTENDED holder whether it lives: a holder that died
 *                  while its node lives keeps the lock for ever (invalid
 *                  end state)
 *   BROKEN_TAKE    (with PROC_DEATHS) the manager takes a CONTENDED grant
 *                  of a live node back on its own, without the node's
 *                  answer: a live holder inside its critical section
 *                  loses the lock to another node (two holders inside:
 *                  the assertion, which `pan -E` reports; the first error
 *                  spin finds is a waiter blocked for ever)
 *   BROKEN_SWEEP   the watcher's sweep for a revocation looks only at
 *                  locks its node keeps or holds, not at one it has asked
 *                  for: a node that has read its grant but not yet marked
 *                  itself held is skipped, keeps the grant at release and
 *                  the other node waits for ever (invalid end state)
 *
 *   BROKEN_LAPSE   (with LAPSES) a node resumed after a heartbeat lapse
 *                  re-enters the grant it kept, which the manager gave to
 *                  another node meanwhile (two holders inside: assertion)
 *
 * LAPSES: a node may pause (at most once, outside its critical section)
 * for longer than the liveness limit: its heartbeat lapses and the manager,
 * on another host, judges it dead until it beats again, passing over its
 * kept grant and its request.  Its watcher is paused too.  When it resumes,
 * either its heartbeat runs first -- it gives up the kept grant (IDLE) or
 * flags it when the node-local mutex is busy, then beats -- or a process
 * runs first and finds the beat old: the sticky fast path refuses the kept
 * grant and asks anew (docs/locks.md "Heartbeat lapses").  The waiter's
 * periodic re-ring of its doorbell is folded into the beat.
 *
 * PROC_DEATHS: a process of a node may die (at most once) while its node
 * lives on (another process of the node beats and runs the watcher): the
 * manager, on another host, still judges the node alive; the dead process
 * leaves the node-local mutex held and marked owner-dead (robust mutex),
 * its phase and ticket as they were.  The manager asks the node of a
 * CONTENDED holder others wait for (REVOKED grant + counter bump, again
 * each time the watcher has swept); the watcher that finds the mutex
 * owner-dead writes IDLE for the dead holder's ticket and recovers the
 * mutex (uapi "Dead processes of live nodes"); one that finds a live
 * holder of a CONTENDED grant does nothing (its release writes IDLE).
 *
 * The watcher is edge-triggered, as in watcher.cpp: it sweeps once per bump
 * of its node's doorbell counter `revokes` (the manager bumps it after
 * writing the REVOKED grant; modelled as a flag the watcher clears).  The
 * code's extra periodic sweep is not modelled: the protocol must be right
 * without it.  WATCHER_LEVEL instead lets the watcher act whenever the
 * revoked grant and the node's phase allow (a coarser abstraction, used
 * where timeouts and deaths together make the edge-triggered state space
 * too big for make test).
 */
#ifndef N
#define N 2
#endif
#define ROUNDS 2
#define NONE 255

#define IDLE 0
#define WAITING 1

/* node-local phase */
#define P_IDLE 0
#define P_REQ 1
#define P_HELD 2
#define P_CACHED 3

byte req_ticket[N];   /* slot: ticket */
byte req_state[N];    /* slot: IDLE / WAITING */
bool doorbell[N];     /* node posted a request since the manager last looked */
bool alive[N];
byte grant_node = NONE;
byte grant_ticket = 0;
bool grant_revoked = false;
bool grant_contended = false;
byte in_cs = 0;       /* live nodes in the critical section */
byte done = 0;        /* nodes finished or dead */
byte deaths = 0;      /* at most one node dies (so the others cannot all escape by dying) */
bool dirty = false;   /* set by every node write: the manager sleeps until it is set */

/* node-local memory of each node (never seen by the manager) */
bool lmu[N];          /* the lock's node-local mutex */
byte phase[N];
byte ltk[N];          /* the node's ticket */
bool revoke[N];       /* set by the watcher when the mutex was busy */
bool bumped[N];       /* the doorbell counter `revokes` moved since the watcher last looked */
bool lmu_dead[N];     /* the node-local mutex's owner died (robust: EOWNERDEAD for the next taker) */
byte pdeaths = 0;     /* processes of live nodes that died (PROC_DEATHS) */
bool lapsed[N];       /* its heartbeat lapsed: judged dead by the manager until it beats (LAPSES) */
byte lapses = 0;

/* A node runs (its watcher acts) while alive and not paused past its heartbeat. */
#define RUNS(n) (alive[n] && !lapsed[n])
/* The sticky fast path trusts a kept grant only while the node's last beat is recent. */
#ifdef BROKEN_LAPSE
#define FRESH(n) true
#else
#define FRESH(n) (!lapsed[n])
#endif

#define W(stmt) atomic { stmt; dirty = true }

#ifdef DEATHS
/* die: the node (its processes and its watcher) stops for good */
#define MAYBE_DIE(incs) :: atomic { deaths < 1 -> deaths++; alive[me] = false; if :: incs -> in_cs-- :: else fi; done++; dirty = true }; goto dead
#elif defined(PROC_DEATHS)
/* die: this process stops holding the node-local mutex; the node lives on */
#define MAYBE_DIE(incs) :: atomic { pdeaths < 1 -> pdeaths++; lmu_dead[me] = true; if :: incs -> in_cs-- :: else fi; done++; dirty = true }; goto dead
#else
#define MAYBE_DIE(incs)
#endif

proctype node(byte me) {
  byte r = 0;
  bool rv;
  bool cont = false;   /* CONTENDED flag of the grant this node got */
  do
  :: r < ROUNDS ->
#ifdef LAPSES
       if
       :: atomic { lapses < 1 && !lmu[me] -> lapses++; lapsed[me] = true; dirty = true }   /* paused past the limit */
       :: true
       fi;
#endif
       /* local tier, then the sticky fast path: node-local memory only */
       atomic {
         !lmu[me] -> lmu[me] = true;
         if
         :: phase[me] == P_CACHED && !revoke[me] && FRESH(me) -> phase[me] = P_HELD; goto cs
         :: phase[me] == P_CACHED && (revoke[me] || !FRESH(me)) ->   /* answer, then ask anew */
              req_state[me] = IDLE; revoke[me] = false; phase[me] = P_IDLE; dirty = true
         :: phase[me] != P_CACHED -> skip
         fi
       };
       atomic { ltk[me]++; revoke[me] = false; phase[me] = P_REQ };
       W(req_ticket[me] = ltk[me]; req_state[me] = WAITING);  /* one NT store */
       W(doorbell[me] = true);
       if
#ifdef BROKEN
       /* broken variant: trust the grant's node without its ticket -- a
        * late grant for a withdrawn request admits a second holder */
       :: (grant_node == me) -> cont = grant_contended; phase[me] = P_HELD; goto cs
#else
       :: atomic { (grant_node == me && grant_ticket == ltk[me]) -> cont = grant_contended || grant_revoked }; phase[me] = P_HELD; goto cs
#endif
#ifdef TIMEOUTS
       :: true -> W(req_state[me] = IDLE); phase[me] = P_IDLE; lmu[me] = false; goto next   /* timeout: withdraw */
#endif
       MAYBE_DIE(false)
       fi;
cs:
       if
       :: atomic { in_cs++; assert(in_cs == 1) }   /* mutual exclusion among live nodes */
       MAYBE_DIE(false)
       fi;
       if
       :: in_cs--
       MAYBE_DIE(true)
       fi;
       /* release: keep the grant (nothing written to the pool) unless it is
        * contended or revoked; else hand it back (IDLE) */
       atomic { rv = revoke[me]; revoke[me] = false };
       if
       :: !cont && !rv -> phase[me] = P_CACHED
       :: W(req_state[me] = IDLE); phase[me] = P_IDLE
       fi;
       lmu[me] = false;
next:
       r++
  :: r == ROUNDS -> break
  od;
  W(done++);
  goto end;
dead:
  skip;
end:
  skip
}

/* The node's watcher: answers a revocation of the grant its node keeps or
 * holds.  Dies with its node. */
#ifdef WATCHER_LEVEL
proctype watcher(byte me) {   /* WATCHER_LEVEL: level-triggered abstraction */
  byte t;
end_idle:
  do
  :: atomic { RUNS(me) && grant_node == me && grant_revoked && grant_ticket == ltk[me] &&
              (phase[me] == P_CACHED || phase[me] == P_HELD) && !revoke[me] -> t = grant_ticket };
#ifdef BROKEN_ACK
       /* broken: release in the pool, leave the node-local phase CACHED */
       W(req_state[me] = IDLE);
end_broken:
       (grant_node != me || grant_ticket != t || !grant_revoked || done == N)   /* answered once */
#else
       /* under the node-local mutex (taken and given back in one step: no
        * other party of the node can look in between) */
       if
       :: atomic { !lmu[me] ->
            if
            :: ltk[me] == t && phase[me] == P_CACHED -> req_state[me] = IDLE; phase[me] = P_IDLE; revoke[me] = false; dirty = true
            :: else
            fi }
       :: atomic { lmu[me] -> if :: ltk[me] == t -> revoke[me] = true :: else fi }   /* busy: the release answers */
       fi
#endif
  :: done == N -> break
  od
}
#else
proctype watcher(byte me) {
  byte t;
  bool pending = false;
end_idle:
  do
  :: atomic { RUNS(me) && bumped[me] ->   /* the counter moved: one sweep */
       bumped[me] = false;
       if
       :: grant_node == me && grant_revoked && grant_ticket == ltk[me] &&
#ifdef BROKEN_SWEEP
          (phase[me] == P_CACHED || phase[me] == P_HELD) ->
#else
          (phase[me] == P_CACHED || phase[me] == P_HELD || phase[me] == P_REQ) ->
#endif
            pending = true; t = grant_ticket   /* an older pending ticket is moot: its answer would be dropped */
       :: else
       fi }
#ifdef BROKEN_ACK
  :: atomic { RUNS(me) && pending -> pending = false };
       /* broken: release in the pool, leave the node-local phase CACHED */
       W(req_state[me] = IDLE)
#else
       /* under the node-local mutex (taken and given back in one step: no
        * other party of the node can look in between) */
  :: atomic { RUNS(me) && pending && !lmu[me] ->
       if
       :: ltk[me] == t && phase[me] == P_CACHED -> req_state[me] = IDLE; phase[me] = P_IDLE; revoke[me] = false; dirty = true
       :: else
       fi;
       pending = false }
  :: atomic { RUNS(me) && pending && lmu[me] && lmu_dead[me] ->
       /* its owner died (EOWNERDEAD): release for the dead holder, recover the mutex */
       if
       :: phase[me] != P_IDLE -> req_state[me] = IDLE; phase[me] = P_IDLE; dirty = true
       :: else
       fi;
       revoke[me] = false; lmu_dead[me] = false; lmu[me] = false; pending = false }
  :: atomic { RUNS(me) && pending && lmu[me] && !lmu_dead[me] ->   /* busy: the release answers */
       if
       :: grant_contended -> pending = false   /* a CONTENDED grant's release writes IDLE */
       :: !grant_contended && ltk[me] == t -> revoke[me] = true
       :: !grant_contended && ltk[me] != t -> pending = false
       fi }
#endif
  :: done == N -> break
  od
}

#endif

#ifdef LAPSES
/* The node's heartbeat thread, resuming after a lapse: kept grants are
 * given up (or flagged while in use) before the beat makes the node alive. */
proctype heartbeat(byte me) {
end_hb:
  do
  :: atomic { lapsed[me] ->
#ifndef BROKEN_LAPSE
       if
       :: !lmu[me] && phase[me] == P_CACHED -> req_state[me] = IDLE; phase[me] = P_IDLE; revoke[me] = false
       :: lmu[me] && (phase[me] == P_CACHED || phase[me] == P_HELD) -> revoke[me] = true
       :: else
       fi;
#endif
       if :: phase[me] == P_REQ -> doorbell[me] = true :: else fi;   /* the waiter's re-ring */
       lapsed[me] = false; dirty = true }
  :: done == N -> break
  od
}
#endif

init {
  byte i;
  atomic {
    i = 0;
    do
#ifdef LAPSES
    :: i < N -> alive[i] = true; run node(i); run watcher(i); run heartbeat(i); i++
#else
    :: i < N -> alive[i] = true; run node(i); run watcher(i); i++
#endif
    :: else -> break
    od
  }
}

/* Liveness as the manager sees it. */
#ifdef BROKEN_DEAD
#define LIVE(n) true
#else
#define LIVE(n) (alive[n] && !lapsed[n])
#endif

active proctype manager() {
  bool waiters[N];
  byte holder = NONE;
  byte hticket = 0;
  byte last = N - 1;
  byte k, n;
  bool others, holds, progress, hcont;
  byte seen, sticket;
  do
  :: done == N -> break
  :: else ->
       /* doorbells (one step: the manager's own bookkeeping) */
       d_step {
         dirty = false;
         progress = false;
         k = 0;
         do
         :: k < N -> if :: doorbell[k] -> doorbell[k] = false; waiters[k] = true; progress = true :: else fi; k++
         :: else -> break
         od;
         others = false;
         k = 0;
         do
         :: k < N -> if :: k != holder && waiters[k] -> others = true :: else fi; k++
         :: else -> break
         od;
         k = 0
       };
       if
       :: holder != NONE ->
            /* one fresh read of the holder's slot (the request word) */
            atomic { seen = req_state[holder]; sticket = req_ticket[holder] };
            holds = (seen == WAITING && sticket == hticket);
            if
            :: !holds ->
                 /* released, answered, withdrawn, or a newer request */
                 if :: seen == WAITING -> waiters[holder] = true :: else fi;
                 holder = NONE; progress = true
            :: else ->
                 if
                 :: others && !grant_revoked && !hcont ->
                      grant_revoked = true;   /* whole grant line, fence, then the node's counter */
                      bumped[holder] = true;
                      progress = true;
#ifdef BROKEN_REVOKE
                      /* broken: do not wait for the node's answer */
                      holder = NONE
#endif
#if defined(PROC_DEATHS) && !defined(BROKEN_ASK)
                 /* a live node's CONTENDED holder: ask its node (again once
                  * its watcher has swept), the liveness period is abstract */
                 :: others && hcont && LIVE(holder) && !bumped[holder] ->
                      grant_revoked = true; bumped[holder] = true; progress = true
#endif
#ifdef BROKEN_TAKE
                 :: others && hcont -> holder = NONE; progress = true   /* broken: no answer awaited */
#endif
                 :: others && !LIVE(holder) -> holder = NONE; progress = true   /* dead node passed over */
                 :: else
                 fi
            fi
       :: else
       fi;
       /* grant round-robin after the last holder, live WAITING requests only */
       if
       :: holder == NONE ->
            k = 1;
            do
            :: k <= N ->
                 n = (last + k) % N;
                 if
                 :: waiters[n] ->
                      waiters[n] = false; progress = true;
                      if
                      :: req_state[n] == WAITING && LIVE(n) ->
                           d_step {
                             others = false;
                             k = 0;
                             do
                             :: k < N -> if :: waiters[k] -> others = true :: else fi; k++
                             :: else -> break
                             od;
                             grant_ticket = req_ticket[n]; grant_node = n; grant_revoked = false; grant_contended = others;
                             holder = n; hticket = grant_ticket; last = n; progress = true; hcont = others;
                             k = 0; n = 0
                           };
                           break
                      :: else
                      fi
                 :: else
                 fi;
                 k++
            :: else -> break
            od
       :: else
       fi;
       /* nothing to do: wait for a node to write something (or all to finish) */
       if
       :: progress
#if defined(PROC_DEATHS) && !defined(BROKEN_ASK)
       /* or for the next liveness period: it asks a CONTENDED holder's node
        * again once the watcher has swept (the code asks every period) */
       :: else -> (dirty || done == N || (holder != NONE && hcont && !bumped[holder]))
#else
       :: else -> (dirty || done == N)
#endif
       fi
  od
}
