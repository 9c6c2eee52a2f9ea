# SPDX-License-Identifier: MIT
"""Asynchronous batches: submit loads / stores / existence checks, collect
completions from a queue whose event fd becomes readable when completions are
waiting (select / poll / asyncio ``loop.add_reader``), cancel what has not run.

    a = AsyncKv(pool, node=1)
    rid = a.submit_get(keys, cache, block_ids)
    select.select([a.event_fd()], [], [])
    for c in a.drain():          # Completion(id, op, ok, status, error)
        ...

One worker thread owns its own :class:`cxlkv.KvStore` handle (a handle is
used by one thread at a time) and runs batches in submission order, in
sub-batches of ``sub_batch`` blocks (one C call each); a cancelled request
that has started stops at the next sub-batch boundary, and its blocks not
attempted get ``-ECANCELED``.  Every completion carries a status per block.
"""
import collections
import errno
import os
import threading

import numpy as np

from . import _lib
from .keys import as_keys
from .kv import KvStore, get_ok, put_ok

Completion = collections.namedtuple("Completion", "id op ok status error")
Completion.__doc__ = """One finished request: ``op`` is "get", "put", "exists" or "exists_each"; ``status``
the per-block int32 status array (for "exists": RESERVED for a cached
block, MISS otherwise); ``ok`` whether every block succeeded; ``error`` a
message for a failed call (CxlkvError text), a cancellation, or the
library's message about blocks that failed (e.g. a lock not granted: no lock
manager), else None (a block that is simply not cached is only its MISS)."""


class _Call:
    """A request of submit_call: the function the worker runs."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class AsyncKv:
    """An asynchronous KV store of ``node`` on ``pool``."""

    def __init__(self, pool, node, sub_batch=64, metrics=None, block_tokens=0, gpu=None):
        self.sub_batch = max(1, int(sub_batch))
        self.gpu = gpu  # a cxlkv.Gpu for PagedKV transfers on the GPU path
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._cv = threading.Condition()
        self._queue = collections.deque()
        self._done = collections.deque()
        self._cancel = set()
        self._next = 1
        self._closing = False
        self._store = KvStore(pool, node, metrics=metrics, block_tokens=block_tokens)
        self._thread = threading.Thread(target=self._run, name=f"cxlkv-aio-{node}", daemon=True)
        self._thread.start()
        pool._adopt(self)

    _close_rank = 0

    def _close_for_pool(self):
        self.close()

    # ---- submission ----------------------------------------------------------
    def _submit(self, op, keys, buf, block_ids, parent):
        k = as_keys(keys)
        with self._cv:
            if self._closing:
                raise ValueError(f"cxlkv: AsyncKv of node {self._store.node} on {self._store.pool.uri} is closed")
            rid = self._next
            self._next += 1
            self._queue.append((rid, op, k, buf, block_ids, parent))
            self._cv.notify()
        return rid

    def submit_get(self, keys, dst, block_ids=None):
        """Load blocks into ``dst`` (PagedKV + block_ids, or buffers); returns the request id."""
        return self._submit("get", keys, dst, block_ids, None)

    def submit_put(self, keys, src, block_ids=None, parent=None):
        """Store a chain of blocks from ``src``; returns the request id."""
        return self._submit("put", keys, src, block_ids, parent)

    def submit_exists(self, keys):
        """Which blocks are cached (prefix of the chain): returns the request id."""
        return self._submit("exists", keys, None, None, None)

    def submit_exists_each(self, keys):
        """Which of ``keys`` are cached, each on its own (not a chain): one
        batched pin + unpin.  Returns the request id."""
        return self._submit("exists_each", keys, None, None, None)

    def submit_call(self, op, keys, fn):
        """Run ``fn(store, keys)`` on the worker, in submission order with the
        other requests, for an operation these calls do not offer (an engine
        adapter's own batch: e.g. blocks stored each on its own, pins held
        past the call).  ``fn`` gets the worker's :class:`cxlkv.KvStore` and
        the keys as a key array, and returns ``(ok, status, error)``: the
        completion's fields, ``status`` one int32 per key.  Returns the
        request id; the completion's ``op`` is ``op``."""
        if not callable(fn):
            raise TypeError(f"cxlkv: submit_call of {op!r} needs a callable, got {type(fn).__name__}")
        return self._submit(op, keys, _Call(fn), None, None)

    def cancel(self, rid):
        """Cancel a request: a queued one completes with every block
        -ECANCELED; a running one stops at its next sub-batch.  True if the
        request was still pending."""
        with self._cv:
            for item in self._queue:
                if item[0] == rid:
                    self._queue.remove(item)
                    n = len(item[2])
                    self._complete(Completion(rid, item[1], False, np.full(n, -errno.ECANCELED, np.int32),
                                              "cancelled"))
                    return True
            if rid in self._running_ids():
                self._cancel.add(rid)
                return True
        return False

    def _running_ids(self):
        return {self._running} if getattr(self, "_running", None) else set()

    # ---- completions -------------------------------------------------------------
    def event_fd(self):
        """An event fd, readable while completions wait to be drained
        (ValueError once closed: its number may name another file by then)."""
        if self._efd < 0:
            raise ValueError(f"cxlkv: AsyncKv of node {self._store.node} on {self._store.pool.uri} is closed")
        return self._efd

    def _reset_fd(self):
        # caller holds self._cv
        if self._efd >= 0:
            try:
                os.eventfd_read(self._efd)
            except BlockingIOError:
                pass

    def drain(self):
        """All completions waiting (possibly none); resets the event fd."""
        with self._cv:
            out = list(self._done)
            self._done.clear()
            self._reset_fd()
        return out

    def wait(self, rid, timeout=None):
        """Block until request ``rid`` completes and return its completion
        (other completions stay queued for :meth:`drain`)."""
        with self._cv:
            ok = self._cv.wait_for(lambda: any(c.id == rid for c in self._done), timeout)
            if not ok:
                raise TimeoutError(f"cxlkv: request {rid} did not complete in {timeout} s")
            c = next(c for c in self._done if c.id == rid)
            self._done.remove(c)
            if not self._done:
                self._reset_fd()
            return c

    def pending(self):
        """Requests submitted and not completed yet (queued plus running)."""
        with self._cv:
            return len(self._queue) + (1 if getattr(self, "_running", None) else 0)

    def _complete(self, c):
        # caller holds self._cv
        self._done.append(c)
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)
        self._cv.notify_all()

    # ---- worker ------------------------------------------------------------------------
    def _run(self):
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closing)
                if not self._queue and self._closing:
                    return
                item = self._queue.popleft()
                self._running = item[0]
            c = self._execute(*item)
            with self._cv:
                self._running = None
                self._cancel.discard(item[0])
                self._complete(c)

    def _execute(self, rid, op, k, buf, block_ids, parent):
        n = len(k)
        status = np.full(n, -errno.ECANCELED, np.int32)
        why = None  # the library's message about blocks a sub-batch did not do
        try:
            if isinstance(buf, _Call):
                ok, st, why = buf.fn(self._store, k)
                return Completion(rid, op, bool(ok), np.asarray(st, dtype=np.int32), why)
            if op == "exists_each":
                with self._store.pin(k) as pins:
                    status[:] = np.where(pins.pinned, _lib.RESERVED, _lib.MISS)
                return Completion(rid, op, bool(pins.pinned.all()), status, None)
            if op == "exists":
                hit = self._store.lookup(k)
                status[:hit] = _lib.RESERVED
                status[hit:] = _lib.MISS
                return Completion(rid, op, hit == n, status, None)
            for lo in range(0, n, self.sub_batch):
                with self._cv:
                    if rid in self._cancel:
                        return Completion(rid, op, False, status, "cancelled")
                hi = min(n, lo + self.sub_batch)
                ids = None if block_ids is None else list(block_ids)[lo:hi]
                part = buf if ids is not None else buf[lo:hi]
                if op == "get" and isinstance(part, list) and len(part) != hi - lo:
                    raise ValueError(f"{n} keys but {len(buf)} buffers")
                if op == "get":
                    status[lo:hi] = self._store.get(k[lo:hi], part, ids, gpu=self.gpu)
                else:
                    par = parent if lo == 0 else k[lo - 1]
                    status[lo:hi] = self._store.put(k[lo:hi], part, ids, parent=par, gpu=self.gpu)
                why = why or self._store.last_error or None
                if op == "put" and not put_ok(status[lo:hi]).all():
                    break  # a chain stops at its first failed block (rest: -ECANCELED)
            ok = bool((get_ok(status) if op == "get" else put_ok(status)).all())
            return Completion(rid, op, ok, status, None if ok else why)
        except Exception as e:  # a whole-call failure (bad arguments, closed pool)
            return Completion(rid, op, False, status, f"{type(e).__name__}: {e}")

    def close(self):
        """Finish queued requests, stop the worker, close the handle and the fd."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        self._store.close()
        with self._cv:
            fd, self._efd = self._efd, -1
        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
