# SPDX-License-Identifier: MIT
"""Pools (format / open / info) and the in-process lock manager."""
import ctypes as C
import threading
import weakref

from . import _lib


def _check_uri(uri, call):
    """A clear TypeError for a URI that is not a str (None gave an
    AttributeError from uri.encode()): docs/api.md "Python": bad input raises
    naming what is wrong."""
    if not isinstance(uri, str):
        raise TypeError(f"cxlkv: {call}: the pool URI must be a str ('shm:NAME:SIZE', 'file:PATH', "
                        f"'dax:/dev/daxX.Y', 'dev:/dev/cxlkvN'), not {type(uri).__name__}")


class Pool:
    """An open cxlkv pool (``shm:NAME:SIZE``, ``file:PATH``, ``dax:/dev/daxX.Y``,
    ``dev:/dev/cxlkvN``).  Use as a context manager or call :meth:`close`.

    >>> Pool.format("shm:demo:268435456", max_nodes=4)
    >>> with Pool("shm:demo:268435456") as pool:
    ...     print(pool.info())
    """

    def __init__(self, uri):
        _check_uri(uri, "Pool(uri)")
        self.uri = uri
        self._h = C.c_void_p()
        self._deps = weakref.WeakSet()  # objects whose C handles point into this mapping
        self._handles = {}  # id -> _lib.Handle of every C handle still open over it (strong)
        # Held by this object's C calls, by the opening of objects over the
        # pool and by close(), so the mapping is never unmapped under a call.
        self._lock = threading.RLock()
        _lib.check(_lib.lib().cxlkv_pool_open(uri.encode(), C.byref(self._h)), f"open pool {uri}")

    @staticmethod
    def format(uri, pool_size=0, max_nodes=0, max_locks=0, index_entries=0, force=False):
        """Format a pool (explicit, never implicit).  ``force`` overwrites a
        valid pool.  0 means the library's default for every size."""
        _check_uri(uri, "Pool.format(uri)")
        o = _lib.FormatOpts(C.sizeof(_lib.FormatOpts), pool_size, max_nodes,
                            _lib.FORMAT_F_FORCE if force else 0, max_locks, 0, index_entries)
        _lib.check(_lib.lib().cxlkv_pool_format(uri.encode(), C.byref(o)), f"format pool {uri}")

    @property
    def handle(self):
        """The C handle (``struct cxlkv_pool *``); ValueError once closed."""
        if not self._h:
            raise ValueError(f"cxlkv: pool {self.uri} is closed")
        return self._h

    @property
    def size(self):
        """Bytes of the pool mapping."""
        with self._lock:
            return int(_lib.lib().cxlkv_pool_size(self.handle))

    @property
    def base(self):
        """Address of this process's mapping of the pool."""
        with self._lock:
            return int(_lib.lib().cxlkv_pool_base(self.handle))

    def carves(self):
        """The carve table: a list of dicts (name, offset, size, memtype, flags)."""
        arr = (_lib.CarveInfo * 64)()
        with self._lock:
            n = _lib.check(_lib.lib().cxlkv_carve_list(self.handle, arr, 64), f"list carves of {self.uri}")
        return [dict(name=c.name.decode(), offset=c.offset, size=c.size, memtype=c.memtype, flags=c.flags)
                for c in arr[: min(n, 64)]]

    def remove_node_local(self, node):
        """Remove this host's node-local file of ``node``
        (/dev/shm/cxlkv-node-<pool id>-<node>) once no process of that node
        uses it: what a tool or a test that attached the node leaves behind.
        A missing file is not an error."""
        with self._lock:
            _lib.check(_lib.lib().cxlkv_node_remove_local(self.handle, int(node)),
                       f"remove node-local file of node {node} of {self.uri}")

    def info(self):
        """uri, size and carves of the pool."""
        return dict(uri=self.uri, size=self.size, carves=self.carves())

    def prometheus(self):
        """Prometheus exposition of the pool's KV counters and latency
        histograms (every node), the same text as ``cxlkvctl stats --prometheus``
        (one definition: the C call ``cxlkv_stats_prometheus``)."""
        from . import metrics
        with self._lock:
            return metrics.pool_exposition(self)

    def _adopt(self, obj):
        """Register an object built over this pool (it has ``_close_rank`` and
        ``_close_for_pool()``): closing the pool closes it first."""
        self._deps.add(obj)

    def _hold(self, handle):
        """Register an open C handle (a :class:`_lib.Handle`) over this pool."""
        self._handles[id(handle)] = handle

    def _release(self, handle):
        """Forget a handle its owner closed."""
        self._handles.pop(id(handle), None)

    def close(self):
        """Unmap the pool.  What was opened over it (async stores, KV stores,
        GPU pins, the lock manager, in that order) is closed first, so no C
        handle outlives the mapping; their later calls raise ValueError."""
        with self._lock:
            if not self._h:
                return
            for d in sorted(list(self._deps), key=lambda d: d._close_rank):
                try:
                    d._close_for_pool()
                except Exception:  # noqa: BLE001 -- closing must reach the unmap
                    pass
            # Handles whose owners the garbage collector is finalizing (their
            # weak references are gone already): closed all the same.
            for hd in sorted(self._handles.values(), key=lambda hd: hd.rank):
                try:
                    hd.close()
                except Exception:  # noqa: BLE001
                    pass
            self._handles.clear()
            _lib.lib().cxlkv_pool_close(self._h)
            self._h = C.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return f"Pool({self.uri!r})"


class LockManager:
    """The pool's lock manager on a thread of this process (one per pool; the
    daemon ``cxlkvd`` is the usual owner).  ``wait`` waits for a previous
    manager's lease instead of failing with EBUSY."""

    def __init__(self, pool, node=0, lease_ms=0, wait=False):
        self.pool = pool
        self._hd = _lib.Handle(_lib.lib().cxlkv_lock_manager_stop, 3)
        o = _lib.LockManagerOpts(C.sizeof(_lib.LockManagerOpts), node, lease_ms, 1 if wait else 0, 0)
        with pool._lock:
            _lib.check(_lib.lib().cxlkv_lock_manager_start(pool.handle, C.byref(o), C.byref(self._hd.h)),
                       f"start lock manager of {pool.uri}")
            pool._hold(self._hd)
            pool._adopt(self)

    _close_rank = 3

    def _close_for_pool(self):
        self.stop()

    def stop(self):
        """Stop the manager thread and give its lease back (twice is harmless)."""
        self._hd.close()
        self.pool._release(self._hd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass
