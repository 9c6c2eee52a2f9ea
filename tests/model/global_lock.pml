/*
 * Promela model of the cxlkv global lock protocol (uapi/cxlkv_ctrl.h,
 * libruntime/src/sync/two_tier_lock.cpp, lock_manager.cpp), one lock,
 * N nodes, one manager.  Checked by spin in `make test`
 * (tests/model/run_spin.sh): mutual exclusion (assertion) and no invalid
 * end states (deadlock).
 *
 * Modelled: slot request = (ticket, state) written by the node; grant =
 * (node, ticket) written by the manager; the doorbell as a hint set; a node
 * may give up (timeout) by writing IDLE, racing with a grant; the manager
 * grants only after re-reading the slot WAITING and treats the lock as
 * released once the holder's slot no longer shows the granted ticket.
 * Each variable is single-copy atomic (8-byte NT stores, fresh reads): the
 * NonCoherentSim tests cover the cache side.  Tickets are bounded by
 * ROUNDS per node.
 */
#define N 2
#define ROUNDS 2
#define NONE 255

byte req_ticket[N];   /* slot: ticket */
bool req_waiting[N];  /* slot: WAITING (else IDLE) */
bool doorbell[N];     /* node posted a request since the manager last looked */
byte grant_node = NONE;
byte grant_ticket = 0;
byte in_cs = 0;
byte done = 0;

active [N] proctype node() {
  byte me = _pid;
  byte t = 0;
  byte r = 0;
  do
  :: r < ROUNDS ->
       t++;
       atomic { req_ticket[me] = t; req_waiting[me] = true };  /* one NT store */
       doorbell[me] = true;
       if
#ifdef BROKEN
       /* broken variant: trust the grant's node without its ticket -- a
        * late grant for a withdrawn request admits a second holder */
       :: (grant_node == me) ->
#else
       :: (grant_node == me && grant_ticket == t) ->
#endif
            in_cs++;
            assert(in_cs == 1);   /* mutual exclusion */
            in_cs--;
            req_waiting[me] = false   /* release: (t<<2)|IDLE */
       :: true ->
            req_waiting[me] = false   /* timeout: withdraw, may race a grant */
       fi;
       r++
  :: r == ROUNDS -> break
  od;
  atomic { done++ }
}

active proctype manager() {
  bool waiters[N];
  byte holder = NONE;
  byte hticket = 0;
  byte last = N - 1;
  byte k, n;
  do
  :: done == N && holder == NONE -> break
  :: else ->
       /* doorbells */
       k = 0;
       do
       :: k < N -> if :: doorbell[k] -> doorbell[k] = false; waiters[k] = true :: else fi; k++
       :: else -> break
       od;
       /* release? */
       if
       :: holder != NONE && !(req_waiting[holder] && req_ticket[holder] == hticket) -> holder = NONE
       :: else
       fi;
       /* grant round-robin after the last holder */
       if
       :: holder == NONE ->
            k = 1;
            do
            :: k <= N ->
                 n = (last + k) % N;
                 if
                 :: waiters[n] ->
                      waiters[n] = false;
                      if
                      :: req_waiting[n] ->
                           atomic { grant_ticket = req_ticket[n]; grant_node = n };
                           holder = n; hticket = grant_ticket; last = n;
                           break
                      :: else
                      fi
                 :: else
                 fi;
                 k++
            :: else -> break
            od
       :: else
       fi
  od
}
