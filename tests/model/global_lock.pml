/*
 * Promela model of the cxlkv global lock protocol (uapi/cxlkv_ctrl.h,
 * libruntime/src/sync/two_tier_lock.cpp, lock_manager.cpp), one lock,
 * N nodes, one manager.  Checked by spin in `make test`
 * (tests/model/run_spin.sh): mutual exclusion among live nodes (assertion)
 * and no invalid end states (a live waiter blocked for ever is one).
 *
 * Modelled: slot request = (ticket, state) written by the node, state IDLE,
 * WAITING or STICKY; grant = (node, ticket, revoked) written by the manager;
 * the doorbell as a hint set; sticky grants (a release may keep the grant,
 * re-entry writes WAITING with the same ticket and then reads the grant);
 * revocation (the manager sets REVOKED, then re-reads the slot: the Dekker
 * pair with the node's re-entry); a node may give up (timeout, TIMEOUTS)
 * by writing IDLE, racing with a grant; a node may die anywhere (DEATHS),
 * and the manager, which sees liveness (the process check on its host),
 * passes over a dead holder or waiter.  The manager grants only after
 * re-reading the slot WAITING.  Each variable is single-copy atomic (8-byte
 * NT stores, whole-line grant writes, fresh reads): the NonCoherentSim
 * tests cover the cache side.  Tickets are bounded by ROUNDS per node.
 *
 * Variants that spin must reject (ctest WILL_FAIL):
 *   BROKEN         the node trusts a grant's node without its ticket
 *   BROKEN_REVOKE  the manager decides from the slot it read before
 *                  writing the revocation (no re-read after it)
 *   BROKEN_DEAD    the manager ignores liveness: a waiter waits for ever
 *                  for a dead holder (invalid end state)
 */
#ifndef N
#define N 2
#endif
#define ROUNDS 2
#define NONE 255

#define IDLE 0
#define WAITING 1
#define STICKY 2

byte req_ticket[N];   /* slot: ticket */
byte req_state[N];    /* slot: IDLE / WAITING / STICKY */
bool doorbell[N];     /* node posted a request since the manager last looked */
bool alive[N];
byte grant_node = NONE;
byte grant_ticket = 0;
bool grant_revoked = false;
byte in_cs = 0;       /* live nodes in the critical section */
byte done = 0;        /* nodes finished or dead */
byte deaths = 0;      /* at most one node dies (so the others cannot all escape by dying) */
byte ver = 0;         /* bumped by every node write: the manager sleeps until it changes */

#define W(stmt) atomic { stmt; ver++ }

#ifdef DEATHS
/* die: the node stops for good; a dead holder leaves the critical section */
#define MAYBE_DIE(incs) :: atomic { deaths < 1 -> deaths++; alive[me] = false; if :: incs -> in_cs-- :: else fi; done++; ver++ }; goto dead
#else
#define MAYBE_DIE(incs)
#endif

proctype node(byte me) {
  byte t = 0;
  byte r = 0;
  bool cached = false;   /* released with STICKY, grant kept */
  do
  :: r < ROUNDS ->
       if
       :: cached ->
            /* sticky re-entry: WAITING with the same ticket, fence, read the grant */
            W(req_state[me] = WAITING);
            if
            :: (grant_node == me && grant_ticket == t && !grant_revoked) -> goto cs
            :: else -> cached = false   /* revoked or regranted: request anew */
            fi
       :: else -> skip
       fi;
       t++;
       W(req_ticket[me] = t; req_state[me] = WAITING);  /* one NT store */
       W(doorbell[me] = true);
       if
#ifdef BROKEN
       /* broken variant: trust the grant's node without its ticket -- a
        * late grant for a withdrawn request admits a second holder */
       :: (grant_node == me) -> goto cs
#else
       :: (grant_node == me && grant_ticket == t) -> goto cs
#endif
#ifdef TIMEOUTS
       :: true -> W(req_state[me] = IDLE); goto next   /* timeout: withdraw, may race a grant */
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
       /* release: keep the grant (STICKY) or hand it back (IDLE) */
       if
       :: W(req_state[me] = STICKY); cached = true
       :: W(req_state[me] = IDLE); cached = false
       fi;
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

init {
  byte i;
  atomic {
    i = 0;
    do
    :: i < N -> alive[i] = true; run node(i); i++
    :: else -> break
    od
  }
}

/* Liveness as the manager sees it. */
#ifdef BROKEN_DEAD
#define LIVE(n) true
#else
#define LIVE(n) alive[n]
#endif

active proctype manager() {
  bool waiters[N];
  byte holder = NONE;
  byte hticket = 0;
  byte last = N - 1;
  byte k, n;
  bool others, in_use, progress;
  byte seen, sticket, v;
  do
  :: done == N -> break
  :: else ->
       v = ver;
       progress = false;
       /* doorbells */
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
       if
       :: holder != NONE ->
            /* one fresh read of the holder's slot (the request word) */
            atomic { seen = req_state[holder]; sticket = req_ticket[holder] };
            in_use = (seen == WAITING && sticket == hticket);
            if
            :: !in_use && !(seen == STICKY && sticket == hticket && !grant_revoked) ->
                 /* released, withdrawn, revoked sticky, or a newer request */
                 if :: seen == WAITING -> waiters[holder] = true :: else fi;
                 holder = NONE; progress = true
            :: else ->
                 if
                 :: others && !grant_revoked ->
                      grant_revoked = true;   /* whole grant line, then fence */
                      progress = true;
#ifdef BROKEN_REVOKE
                      /* broken: decide from the slot read before the revocation */
                      if
                      :: seen == STICKY -> holder = NONE
                      :: else
                      fi
#else
                      atomic { seen = req_state[holder]; sticket = req_ticket[holder] };  /* fresh re-read */
                      if
                      :: !(seen == WAITING && sticket == hticket) ->
                           if :: seen == WAITING -> waiters[holder] = true :: else fi;
                           holder = NONE
                      :: else
                      fi
#endif
                 :: others && in_use && !LIVE(holder) -> holder = NONE; progress = true   /* dead holder passed over */
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
                           atomic { grant_ticket = req_ticket[n]; grant_node = n; grant_revoked = false };
                           holder = n; hticket = grant_ticket; last = n; progress = true;
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
       :: else -> (ver != v || done == N)
       fi
  od
}
