# SPDX-License-Identifier: MIT
"""LMCache multiprocess-mode native plugin over a cxlkv pool, written against
the L2 adapter that LMCache 0.5.6 wraps around a native plugin
(``lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py``,
``NativeConnectorL2Adapter``): ``event_fd``, ``submit_batch_get``,
``submit_batch_set``, ``submit_batch_exists``, ``submit_batch_delete``,
``drain_completions``, ``close``.

Turn it on with an L2 adapter of the LMCache server (multiprocess mode; the
engine side keeps LMCache's own connector)::

    python -m lmcache.v1.multiprocess.server ... --l2-adapter \\
        '{"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache",
          "class_name": "CxlkvNativePlugin",
          "adapter_params": {"pool": "dax:/dev/dax0.0", "node": 1}}'

(``adapter_params`` are the constructor's keywords: ``pool``, ``node``,
``namespace``, ``sub_batch``, ``lock_ttl_s``.  ``"max_capacity_gb"`` and an
``"eviction"`` policy beside them make LMCache count the bytes it stored and
delete its least recently used chunks past the watermark.)

LMCache is never imported: the protocol is duck-typed.  What the adapter
expects of each call, and what this plugin does:

* Keys (LMCache's ``model@rank@group@chunk_hash[@salt]`` strings) map by
  :func:`cxlkv.keys_from_hashes` in ``namespace``.
* ``submit_batch_set``: every chunk is stored on its own, as a root block of
  the pool (LMCache's batch is whatever its store controller gathered, not a
  prefix chain, so no chunk is made another's parent), each with its own
  size.  Per key: stored (or already there).  ``ok`` only when every key is
  in the pool: LMCache takes a store result for the whole batch, and a
  success lets its store policy drop the chunks from its L1.
* ``submit_batch_exists`` is LMCache's *lookup and lock*: every key found is
  pinned in the pool (so no node evicts it before LMCache loads it) and the
  pin is held, counted per key.  LMCache 0.5.6's adapter keeps its lock
  counts to itself and never passes ``submit_unlock`` on to the plugin; it
  unlocks a key right after the load that the lock was taken for.  So a
  lock's pin is given back when a ``submit_batch_get`` of that key completes
  (one lock per key per get, oldest first), by ``lock_ttl_s`` for a key that
  LMCache looked up and then did not load (its unlock is never seen), and at
  :meth:`close`.
* ``submit_batch_get`` reads each key into its memoryview (sizes may differ
  between keys): per key loaded or not.
* ``submit_batch_delete`` is LMCache's eviction of what it counted past its
  ``max_capacity_gb``.  The pool keeps its own capacity (its least recently
  used blocks are evicted when space is needed, by any node) and has no call
  that drops a given block, so a delete gives the chunk back to the pool's
  eviction: per key True, except a key this plugin still holds a lock on
  (False: LMCache keeps counting it and tries again later).  A deleted chunk
  may still be found by a later lookup until the pool evicts it; a chunk's
  bytes never change under its key, so such a hit is a correct one.

Completions are ``(id, ok, error, per_key_results)``: ``error`` is "" on
success, else the causes (status names and the library's messages) with the
keys they hit; ``per_key_results`` one bool per key for every operation.
"""
import collections
import errno
import threading
import time

import numpy as np

import cxlkv
from cxlkv.aio import AsyncKv

__all__ = ["CxlkvNativePlugin"]

_Lock = collections.namedtuple("_Lock", "pins index since")


def _nbytes(buf):
    return memoryview(buf).nbytes


def _failures(names, status, good, notes=None):
    """One text for the keys of a batch that failed: each cause once, with
    how many keys it hit and the first of them."""
    by_cause = {}
    for i, s in enumerate(status):
        if good[i]:
            continue
        note = (notes or {}).get(i)
        cause = f"{cxlkv.status_name(s)}: {note}" if note else cxlkv.status_name(s)
        by_cause.setdefault(cause, []).append(names[i])
    return "; ".join(f"{cause} ({len(ks)} key{'s' if len(ks) > 1 else ''}, first {ks[0]})"
                     for cause, ks in by_cause.items())


class CxlkvNativePlugin:
    """LMCache native plugin: asynchronous batches on a cxlkv pool.

    ``pool``: the pool URI; ``node``: this server's node of the pool (one per
    host or process attached); ``namespace``: keeps these keys apart from
    other users of the pool; ``sub_batch``: blocks per C call of a get or a
    lookup; ``lock_ttl_s``: how long the pin of a lookup's lock outlives it
    when no load of that key follows."""

    def __init__(self, pool, node=1, namespace="lmcache", sub_batch=256, lock_ttl_s=60.0, **_):
        self._pool = cxlkv.Pool(pool)
        self._name = f"LMCache plugin of node {node} on {pool}"
        try:
            self._ns = cxlkv.namespace(extra=f"lmcache;{namespace}")
            self._sub = max(1, int(sub_batch))
            self._ttl = float(lock_ttl_s)
            if not self._ttl > 0:
                raise ValueError(f"cxlkv: {self._name}: lock_ttl_s must be > 0 seconds, got {lock_ttl_s!r}")
            self._aio = AsyncKv(self._pool, int(node), sub_batch=self._sub)
        except BaseException:
            self._pool.close()
            raise
        # key string -> locks held on it, oldest first (a key LMCache looked
        # up twice before loading it holds two).
        self._locks = collections.defaultdict(collections.deque)
        self._locks_mu = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, name=f"cxlkv-lmcache-locks-{node}", daemon=True)
        self._sweeper.start()

    def _keys(self, keys):
        return cxlkv.keys_from_hashes(list(keys), self._ns)

    @staticmethod
    def pool_keys(keys, namespace="lmcache"):
        """The pool's keys of LMCache key strings in ``namespace`` (to look
        at them with another KV store or cxlkvctl)."""
        return cxlkv.keys_from_hashes(list(keys), cxlkv.namespace(extra=f"lmcache;{namespace}"))

    def _check(self, what, keys, bufs):
        if self._closed:
            raise ValueError(f"cxlkv: {self._name} is closed ({what})")
        if bufs is not None and len(bufs) != len(keys):
            raise ValueError(f"cxlkv: {self._name}: {what} got {len(keys)} keys but {len(bufs)} buffers")

    def event_fd(self):
        """Readable while completions wait for drain_completions()."""
        return self._aio.event_fd()

    # ---- store -------------------------------------------------------------
    def submit_batch_set(self, keys, memoryviews):
        """Store each memoryview's bytes under its key, each chunk on its own
        (a failing key does not stop the others); returns the batch id."""
        names, bufs = [str(k) for k in keys], list(memoryviews)
        self._check("submit_batch_set", names, bufs)
        return self._aio.submit_call("set", self._keys(names), lambda store, k: self._set(store, k, names, bufs))

    def _set(self, store, k, names, bufs):
        n = len(k)
        status = np.full(n, -errno.ECANCELED, np.int32)
        notes = {}
        for i in range(n):
            try:
                # parent None: a root block, unrelated to the other chunks
                status[i] = store.put(k[i:i + 1], [bufs[i]])[0]
                if not cxlkv.put_ok(status[i:i + 1])[0] and store.last_error:
                    notes[i] = store.last_error
            except Exception as e:  # this key's buffer or call; the next keys still go
                status[i] = -errno.EINVAL
                notes[i] = f"{type(e).__name__}: {e}"
        good = cxlkv.put_ok(status)
        return bool(good.all()), status, _failures(names, status, good, notes) or None

    # ---- lookup and lock -----------------------------------------------------
    def submit_batch_exists(self, keys):
        """LMCache's lookup and lock: which keys are in the pool, each on its
        own; every key found stays pinned until its load completes (or
        ``lock_ttl_s``, or close).  Returns the batch id."""
        names = [str(k) for k in keys]
        self._check("submit_batch_exists", names, None)
        return self._aio.submit_call("exists", self._keys(names), lambda store, k: self._lookup_and_lock(store, k, names))

    def _lookup_and_lock(self, store, k, names):
        status = np.full(len(k), cxlkv.MISS, np.int32)
        now = time.monotonic()
        for lo in range(0, len(k), self._sub):
            hi = min(len(k), lo + self._sub)
            pins = store.pin(k[lo:hi])
            status[lo:hi] = np.where(pins.pinned, cxlkv.RESERVED, pins.status)
            held = np.flatnonzero(pins.pinned)
            if not held.size:
                pins.release()
                continue
            with self._locks_mu:
                for j in held:
                    self._locks[names[lo + j]].append(_Lock(pins, int(j), now))
        # ok: the lookup ran (a key not found is only its False)
        return True, status, None

    def _unlock_one(self, name):
        """Give back the oldest lock on ``name``; False if it holds none."""
        with self._locks_mu:
            q = self._locks.get(name)
            if not q:
                return False
            lk = q.popleft()
            if not q:
                del self._locks[name]
        lk.pins.release([lk.index])
        return True

    def locked(self, key):
        """How many lookups' locks (pins) this plugin holds on ``key`` now."""
        with self._locks_mu:
            return len(self._locks.get(str(key), ()))

    def _sweep_loop(self):
        # A key LMCache looked up but did not load is unlocked on its side
        # only; its pin goes after lock_ttl_s so the pool can evict it again.
        while not self._stop.wait(max(0.05, min(1.0, self._ttl / 4))):
            self._sweep(time.monotonic() - self._ttl)

    def _sweep(self, older_than):
        expired = []
        with self._locks_mu:
            for name in list(self._locks):
                q = self._locks[name]
                while q and q[0].since <= older_than:
                    expired.append(q.popleft())
                if not q:
                    del self._locks[name]
        for lk in expired:
            try:
                lk.pins.release([lk.index])
            except ValueError:  # the store closed meanwhile: its close unpinned it
                pass

    # ---- load -------------------------------------------------------------------
    def submit_batch_get(self, keys, memoryviews):
        """Read each key's bytes into its memoryview (kept valid by the caller
        until the completion is drained; sizes may differ between keys), then
        give back one lookup lock per key; returns the batch id."""
        names, bufs = [str(k) for k in keys], list(memoryviews)
        self._check("submit_batch_get", names, bufs)
        return self._aio.submit_call("get", self._keys(names), lambda store, k: self._get(store, k, names, bufs))

    def _get(self, store, k, names, bufs):
        n = len(k)
        status = np.full(n, -errno.ECANCELED, np.int32)
        notes = {}
        try:
            groups = collections.defaultdict(list)  # one C call needs blocks of one size
            for i, b in enumerate(bufs):
                try:
                    groups[_nbytes(b)].append(i)
                except TypeError as e:
                    status[i] = -errno.EINVAL
                    notes[i] = f"cxlkv: buffer {i} ({type(b).__name__}) is not a buffer: {e}"
            for idx in groups.values():
                for lo in range(0, len(idx), self._sub):
                    part = np.asarray(idx[lo:lo + self._sub])
                    try:
                        status[part] = store.get(k[part], [bufs[i] for i in part])
                        if store.last_error:
                            for i in part:
                                if status[i] < 0:
                                    notes[i] = store.last_error
                    except Exception as e:  # these buffers (e.g. read-only); the other groups still go
                        status[part] = -errno.EINVAL
                        for i in part:
                            notes[i] = f"{type(e).__name__}: {e}"
        finally:
            # LMCache unlocks the keys of a load once it completes, read or not.
            for name in names:
                self._unlock_one(name)
        good = cxlkv.get_ok(status)
        return bool(good.all()), status, _failures(names, status, good, notes) or None

    # ---- delete -------------------------------------------------------------------
    def submit_batch_delete(self, keys):
        """LMCache's eviction: give the keys back to the pool's own eviction.
        Per key True, False for a key still locked by a lookup of this plugin
        (LMCache retries it later).  Returns the batch id."""
        names = [str(k) for k in keys]
        self._check("submit_batch_delete", names, None)
        return self._aio.submit_call("delete", self._keys(names), lambda store, k: self._delete(names))

    def _delete(self, names):
        with self._locks_mu:
            held = [bool(self._locks.get(n)) for n in names]
        status = np.where(held, -errno.EBUSY, cxlkv.RESERVED).astype(np.int32)
        good = status == cxlkv.RESERVED
        notes = {i: "locked by a lookup whose load has not come" for i, h in enumerate(held) if h}
        return bool(good.all()), status, _failures(names, status, good, notes) or None

    # ---- completions ----------------------------------------------------------------
    def drain_completions(self):
        """``[(id, ok, error, per_key_results)]`` of every finished batch."""
        out = []
        for c in self._aio.drain():
            per = cxlkv.put_ok(c.status) if c.op == "set" else c.status == cxlkv.RESERVED
            out.append((c.id, bool(c.ok), c.error or "", [bool(x) for x in per]))
        return out

    def close(self):
        """Finish submitted batches, give back every lock's pin, then close
        the async store and the pool (twice is harmless)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._sweeper.join()
        self._aio.close()  # its store's close unpins the Pins still held
        with self._locks_mu:
            self._locks.clear()
        self._pool.close()
