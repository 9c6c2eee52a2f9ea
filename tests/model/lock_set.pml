/*
 * Promela model of lock sets (uapi/cxlkv_ctrl.h "Lock sets";
 * libruntime/src/sync/two_tier_lock.cpp acquire_set, lock_manager.cpp):
 * N nodes take the set {0, 1} of two global locks (node 0 ROUNDS times), with
 * sticky grants, revocation and the node's watcher as in global_lock.pml.
 * Checked by spin in `make test` (tests/model/run_spin.sh): mutual
 * exclusion on each lock (assertion) and no invalid end states (a set that
 * waits for ever: a deadlock between sets, or a lost grant).
 *
 * A set asks for all the locks it does not keep in one go: each request
 * names the set's previous request (lock and ticket: the link), and one
 * doorbell post names them.  Locks the node keeps (sticky) are entered at
 * once only before the first lock it must ask for; a kept lock after it is
 * asked for anew (a newer ticket: the kept grant's release and a request in
 * one write), so a set never uses a higher lock while it waits for a lower
 * one.  The manager walks the locks in ascending order each round and
 * grants a linked request only while the node holds the linked lock with
 * the linked ticket; it revokes a kept grant for any waiter, eligible or
 * not.  Grants are seen in ascending order (the node polls them in order).
 * A node may give up (TIMEOUTS): it withdraws the requests not yet granted
 * and seen (IDLE, racing with a grant) and releases what it entered.
 * Each variable is single-copy atomic (NT stores, whole-line writes, fresh
 * reads); the NonCoherentSim tests cover the cache side.  The watcher is
 * level-triggered (the WATCHER_LEVEL abstraction of global_lock.pml).
 *
 * Variants that spin must reject (ctest WILL_FAIL):
 *   BROKEN_ORDER  the manager ignores the links and grants a set's locks in
 *                 any order: two sets each hold a lock the other waits for
 *                 (invalid end state)
 *   BROKEN_KEEP   the node enters a lock it keeps above the first lock it
 *                 must ask for at once (out of order): a revocation of it
 *                 waits for a release that waits for the lower lock
 *                 (invalid end state)
 */
#ifndef N
#define N 2
#endif
#define L 2
/* Rounds of node 0 (it keeps grants and comes back: kept locks entered,
 * asked for anew, revoked); the other nodes take their set once (enough to
 * contend with it; more rounds for all make the state space too big for
 * make test). */
#ifndef ROUNDS
#define ROUNDS 2
#endif
#define MY_ROUNDS (me == 0 -> ROUNDS : 1)
#define NONE 255

#define IDLE 0
#define WAITING 1

#define P_IDLE 0
#define P_REQ 1
#define P_HELD 2
#define P_CACHED 3

/* pool: slot (node, lock) = request ticket + state + link; grant per lock */
byte req_ticket[N * L];
byte req_state[N * L];
bool req_link[N * L];      /* linked to the node's request of the lower lock (lock 1 only) */
byte req_link_tk[N * L];   /* that request's ticket */
bool doorbell[N];
byte grant_node[L];
byte grant_ticket[L];
bool grant_revoked[L];
bool grant_contended[L];
byte in_cs[L];
byte done = 0;
bool dirty = false;

/* node-local memory */
bool lmu[N * L];
byte phase[N * L];
byte ltk[N * L];
bool revoke[N * L];

#define S(n, l) ((n) * L + (l))
#define W(stmt) atomic { stmt; dirty = true }

/* Release lock l (descending order at the end of the set): keep the grant
 * unless it is contended or revoked. */
#define RELEASE(l, c) \
  atomic { rv = revoke[S(me, l)]; revoke[S(me, l)] = false }; \
  if \
  :: !(c) && !rv -> phase[S(me, l)] = P_CACHED \
  :: W(req_state[S(me, l)] = IDLE); phase[S(me, l)] = P_IDLE \
  fi; \
  lmu[S(me, l)] = false

proctype node(byte me) {
  byte r = 0;
  bool rv;
  bool ask0, ask1;       /* asked the manager for lock 0 / 1 this round */
  bool got0, got1;       /* entered */
  bool c0, c1;           /* the grant must not be kept (contended or revoked) */
  do
  :: r < MY_ROUNDS ->
       ask0 = false; ask1 = false; got0 = false; got1 = false; c0 = false; c1 = false;
       /* local tier of lock 0; kept and not revoked: entered at once (prefix) */
       atomic {
         !lmu[S(me, 0)] -> lmu[S(me, 0)] = true;
         if
         :: phase[S(me, 0)] == P_CACHED && !revoke[S(me, 0)] -> phase[S(me, 0)] = P_HELD; got0 = true
         :: else -> ltk[S(me, 0)]++; revoke[S(me, 0)] = false; phase[S(me, 0)] = P_REQ; ask0 = true
         fi
       };
       if
       :: ask0 -> W(req_ticket[S(me, 0)] = ltk[S(me, 0)]; req_link[S(me, 0)] = false; req_state[S(me, 0)] = WAITING)
       :: else
       fi;
       /* local tier of lock 1 */
       atomic {
         !lmu[S(me, 1)] -> lmu[S(me, 1)] = true;
         if
#ifdef BROKEN_KEEP
         :: phase[S(me, 1)] == P_CACHED && !revoke[S(me, 1)] -> phase[S(me, 1)] = P_HELD; got1 = true
#else
         :: got0 && phase[S(me, 1)] == P_CACHED && !revoke[S(me, 1)] -> phase[S(me, 1)] = P_HELD; got1 = true
#endif
         :: else -> ltk[S(me, 1)]++; revoke[S(me, 1)] = false; phase[S(me, 1)] = P_REQ; ask1 = true
         fi
       };
       if
       :: ask1 -> W(req_ticket[S(me, 1)] = ltk[S(me, 1)]; req_link[S(me, 1)] = ask0; req_link_tk[S(me, 1)] = ltk[S(me, 0)];
                    req_state[S(me, 1)] = WAITING)
       :: else
       fi;
       if
       :: ask0 || ask1 -> W(doorbell[me] = true)
       :: else
       fi;
       /* grants, in ascending order */
       if
       :: ask0 ->
            if
            :: atomic { grant_node[0] == me && grant_ticket[0] == ltk[S(me, 0)] ->
                 c0 = grant_contended[0] || grant_revoked[0]; phase[S(me, 0)] = P_HELD; got0 = true }
#ifdef TIMEOUTS
            :: goto giveup
#endif
            fi
       :: else
       fi;
       if
       :: ask1 ->
            if
            :: atomic { grant_node[1] == me && grant_ticket[1] == ltk[S(me, 1)] ->
                 c1 = grant_contended[1] || grant_revoked[1]; phase[S(me, 1)] = P_HELD; got1 = true }
#ifdef TIMEOUTS
            :: goto giveup
#endif
            fi
       :: else
       fi;
       /* critical section on both locks */
       atomic { in_cs[0]++; in_cs[1]++; assert(in_cs[0] == 1 && in_cs[1] == 1) };
       atomic { in_cs[0]--; in_cs[1]-- };
       RELEASE(1, c1);
       RELEASE(0, c0);
       goto next;
#ifdef TIMEOUTS
giveup:
       /* withdraw what is not entered (same word as a release), release the rest */
       if
       :: !got1 -> W(req_state[S(me, 1)] = IDLE); phase[S(me, 1)] = P_IDLE; lmu[S(me, 1)] = false
       :: else -> RELEASE(1, c1)
       fi;
       if
       :: !got0 -> W(req_state[S(me, 0)] = IDLE); phase[S(me, 0)] = P_IDLE; lmu[S(me, 0)] = false
       :: else -> RELEASE(0, c0)
       fi;
#endif
next:
       r++
  :: r == MY_ROUNDS -> break
  od;
  W(done++)
}

/* The node's watcher, level-triggered: answers a revocation of a grant its
 * node keeps, or flags it for the release when a process of the node has
 * the lock's node-local mutex. */
/* A revoked grant of lock l that the watcher can answer now (its mutex is
 * free and the node keeps the grant) or flag (a process of the node has the
 * mutex).  Like watcher.cpp, it retries a flagged one until it is answered. */
#define ANSWER(l) (grant_node[l] == me && grant_revoked[l] && grant_ticket[l] == ltk[S(me, l)] && \
                   ((!lmu[S(me, l)] && phase[S(me, l)] == P_CACHED) || (lmu[S(me, l)] && !revoke[S(me, l)])))

proctype watcher(byte me) {
  byte l;
end_idle:
  do
  :: atomic {
       ANSWER(0) || ANSWER(1) ->
       if
       :: ANSWER(0) -> l = 0
       :: ANSWER(1) -> l = 1
       fi;
       if
       :: !lmu[S(me, l)] -> req_state[S(me, l)] = IDLE; phase[S(me, l)] = P_IDLE; revoke[S(me, l)] = false; dirty = true
       :: else -> revoke[S(me, l)] = true   /* busy: the release answers */
       fi;
       l = 0 }
  :: done == N -> break
  od
}

init {
  byte i;
  atomic {
    grant_node[0] = NONE; grant_node[1] = NONE;
    i = 0;
    do
    :: i < N -> run node(i); run watcher(i); i++
    :: else -> break
    od
  }
}

active proctype manager() {
  bool waiters[N * L];
  byte holder[L];
  byte hticket[L];
  bool hcont[L];
  byte last[L];
  byte l, k, n;
  bool others, later_any, progress, holds;
  bool later[N];
  byte seen, sticket;
  atomic { holder[0] = NONE; holder[1] = NONE; last[0] = N - 1; last[1] = N - 1 };
  do
  :: done == N -> break
  :: else ->
       /* doorbells: a post names the locks the node asked for (here: both, a
        * superset -- hints are only hints) */
       d_step {
         dirty = false;
         progress = false;
         k = 0;
         do
         :: k < N -> if :: doorbell[k] -> doorbell[k] = false; waiters[S(k, 0)] = true; waiters[S(k, 1)] = true; progress = true :: else fi; k++
         :: else -> break
         od;
         l = 0
       };
       /* the locks in ascending order */
       do
       :: l < L ->
            d_step {
              others = false;
              k = 0;
              do
              :: k < N -> if :: k != holder[l] && waiters[S(k, l)] -> others = true :: else fi; k++
              :: else -> break
              od
            };
            if
            :: holder[l] != NONE ->
                 atomic { seen = req_state[S(holder[l], l)]; sticket = req_ticket[S(holder[l], l)];
                          holds = seen == WAITING && sticket == hticket[l]; seen = 0; sticket = 0 };
                 if
                 :: !holds ->
                      /* released, answered, withdrawn, or a newer request */
                      if :: req_state[S(holder[l], l)] == WAITING -> waiters[S(holder[l], l)] = true :: else fi;
                      holder[l] = NONE; progress = true
                 :: else ->
                      if
                      :: others && !grant_revoked[l] && !hcont[l] ->
                           atomic { grant_revoked[l] = true; dirty = true };   /* the watcher answers */
                           progress = true
                      :: else
                      fi
                 fi
            :: else
            fi;
            /* grant: round-robin after the last holder; a linked request only
             * while its node holds the linked lock with the linked ticket */
            if
            :: holder[l] == NONE ->
                 d_step {
                   k = 0;
                   do
                   :: k < N -> later[k] = false; k++
                   :: else -> break
                   od;
                   later_any = false;
                   k = 1;
                   do
                   :: k <= N ->
                        n = (last[l] + k) % N;
                        if
                        :: waiters[S(n, l)] ->
                             waiters[S(n, l)] = false;
                             if
                             :: req_state[S(n, l)] != WAITING -> skip
#ifndef BROKEN_ORDER
                             :: req_state[S(n, l)] == WAITING && req_link[S(n, l)] &&
                                !(holder[0] == n && hticket[0] == req_link_tk[S(n, l)]) ->
                                  later[n] = true; later_any = true
#endif
                             :: else ->
                                  others = later_any;
                                  k = 0;
                                  do
                                  :: k < N -> if :: waiters[S(k, l)] -> others = true :: else fi; k++
                                  :: else -> break
                                  od;
                                  grant_ticket[l] = req_ticket[S(n, l)]; grant_node[l] = n; grant_revoked[l] = false;
                                  grant_contended[l] = others;
                                  holder[l] = n; hticket[l] = grant_ticket[l]; last[l] = n; hcont[l] = others;
                                  progress = true; dirty = true;
                                  k = N
                             fi
                        :: else
                        fi;
                        k++
                   :: else -> break
                   od;
                   k = 0;
                   do
                   :: k < N -> if :: later[k] -> waiters[S(k, l)] = true :: else fi; later[k] = false; k++
                   :: else -> break
                   od;
                   k = 0; n = 0; later_any = false
                 }
            :: else
            fi;
            others = false; holds = false;
            l++
       :: else -> l = 0; break
       od;
       /* nothing to do: wait for a node to write something (or all to finish) */
       if
       :: progress
       :: else -> (dirty || done == N)
       fi
  od
}
