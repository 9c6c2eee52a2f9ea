# SPDX-License-Identifier: MIT
"""SGLang HiCache storage backend (L3) over a cxlkv pool (written against
SGLang's ``HiCacheStorage`` of ``sglang/srt/mem_cache/hicache_storage.py``,
SGLang 0.5.x, with the zero-copy ``interface_v1`` calls).

Turn it on with::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "cxlkv", "module_path": "cxlkv.integrations.sglang",
          "class_name": "CxlkvHiCacheStorage", "interface_v1": 1,
          "pool": "dax:/dev/dax0.0", "node": 1}'

SGLang is imported lazily (``CxlkvHiCacheStorage`` subclasses the real
``HiCacheStorage`` when SGLang is importable), so this module imports and is
tested without SGLang.

Keys: SGLang's page hashes (chained SHA-256 hex strings) mapped by
:func:`cxlkv.keys_from_hashes` in a namespace of model, tensor/pipeline ranks
and host layout (with MLA every rank reads rank 0's pages and only rank 0
writes).  A page is one pool block made of the pieces
``get_page_buffer_meta(host_indices)`` names, in that order; with the
``layer_first`` host layout this is the engine-independent pool block order
(per layer K then V), shared with vLLM for the same model.

Every list-returning call returns a list (never None: SGLang's prefetch and
backup threads die on a None); ``get`` returns None only for a missing key, as
the interface defines.
"""

import logging

import cxlkv
from cxlkv.layout import RawChunks

__all__ = ["CxlkvHiCacheStorage"]

log = logging.getLogger("cxlkv.sglang")


def _cfg(storage_config, name, default=None):
    if storage_config is None:
        return default
    if isinstance(storage_config, dict):
        return storage_config.get(name, default)
    return getattr(storage_config, name, default)


class CxlkvHiCacheStorageImpl:
    """SGLang HiCache L3 storage backend over a cxlkv pool.

    ``CxlkvHiCacheStorage(storage_config, kwargs)`` then
    ``register_mem_pool_host(host_pool)``, as SGLang's dynamic backend
    factory does.  Config: ``extra_config`` of the storage config (or
    ``kwargs``): ``pool`` (URI, required), ``node`` (default 1),
    ``namespace``.  Thread-safe (SGLang's prefetch and backup threads call at
    once).  Every batch call returns a list, never None; a call that fails
    returns False / 0 for its keys and logs the cause on the ``cxlkv.sglang``
    logger (SGLang would lose its thread on an exception).
    :data:`CxlkvHiCacheStorage` adds SGLang's base class when SGLang is
    importable."""

    def __init__(self, storage_config=None, kwargs=None, **extra):
        cfg = dict(_cfg(storage_config, "extra_config") or {})
        cfg.update(kwargs or {})
        cfg.update(extra)
        self.tp_rank = int(_cfg(storage_config, "tp_rank", 0))
        self.is_mla = bool(_cfg(storage_config, "is_mla_model", False))
        layout = "page_first" if _cfg(storage_config, "is_page_first_layout", False) else "layer_first"
        ranks = "mla" if self.is_mla else (f"tp{self.tp_rank}/{_cfg(storage_config, 'tp_size', 1)}"
                                           f";pp{_cfg(storage_config, 'pp_rank', 0)}/{_cfg(storage_config, 'pp_size', 1)}")
        self.namespace = cxlkv.namespace(model=_cfg(storage_config, "model_name", "") or "",
                                         extra=f"sglang;{ranks};{layout};{cfg.get('namespace', '')}")
        self.pool = cxlkv.Pool(cfg["pool"])
        node = int(cfg.get("node", 1))
        self.store = cxlkv.KvStore(self.pool, node)
        import threading
        # SGLang calls from a prefetch and a backup thread at once; a handle is
        # used by one thread at a time.
        self._lock = threading.Lock()
        self.mem_pool_host = None
        self._failures = {}  # message -> times seen (logged at 1, 2, 4, 8, ...)

    def _failed(self, what, e):
        """A call that SGLang must not see raise: log why (the first time a
        cause is seen, then at powers of two) and let the caller answer False."""
        msg = f"cxlkv HiCache {what} failed: {type(e).__name__}: {e}"
        n = self._failures[msg] = self._failures.get(msg, 0) + 1
        if n & (n - 1) == 0:
            log.warning("%s%s", msg, f" ({n} times)" if n > 1 else "")

    def register_mem_pool_host(self, mem_pool_host):
        """The host KV pool whose ``get_page_buffer_meta`` names each page's pieces."""
        self.mem_pool_host = mem_pool_host

    def _keys(self, keys):
        return cxlkv.keys_from_hashes(list(keys), self.namespace)

    def _pages(self, keys, host_indices):
        if self.mem_pool_host is None:
            raise RuntimeError("no host memory pool: register_mem_pool_host() was not called")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        n = len(keys)
        if n == 0 or len(ptrs) % n:
            raise ValueError(f"cxlkv: {len(ptrs)} page pieces for {n} keys")
        return RawChunks(ptrs, sizes, len(ptrs) // n)

    def _note_blocks(self, what, st, fine):
        """Log the cause of blocks that failed (not a plain miss / busy)."""
        if not fine.all():
            bad = sorted({cxlkv.status_name(x) for x in st[~fine]})
            self._failed(what, RuntimeError(f"{int((~fine).sum())} of {len(st)} pages: {', '.join(bad)}"
                                            f"{'; ' + self.store.last_error if self.store.last_error else ''}"))

    # ---- zero-copy v1 -----------------------------------------------------------
    def batch_exists(self, keys, extra_info=None):
        """Number of consecutive pages from the start that are in the pool."""
        if not keys:
            return 0
        try:
            with self._lock:
                return int(self.store.lookup(self._keys(keys)))
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_exists", e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Load pages into the host pool at ``host_indices``; one bool per key."""
        if not keys:
            return []
        try:
            pages = self._pages(keys, host_indices)
            with self._lock:
                st = self.store.get(self._keys(keys), pages)
            self._note_blocks("batch_get_v1", st, cxlkv.get_ok(st) | (st == cxlkv.MISS))
            return [bool(x) for x in cxlkv.get_ok(st)]
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_get_v1", e)
            return [False] * len(keys)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store pages from the host pool; one bool per key (with MLA only
        rank 0 writes, other ranks report success)."""
        if not keys:
            return []
        if self.is_mla and self.tp_rank != 0:
            return [True] * len(keys)
        try:
            pages = self._pages(keys, host_indices)
            with self._lock:
                st = self.store.put(self._keys(keys), pages)
            self._note_blocks("batch_set_v1", st, cxlkv.put_ok(st) | (st == cxlkv.BUSY))
            return [bool(x) for x in cxlkv.put_ok(st)]
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_set_v1", e)
            return [False] * len(keys)

    # ---- the older per-tensor interface ----------------------------------------------
    def exists(self, key):
        """Whether page ``key`` is in the pool."""
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        """Read one page into ``target_location`` (a tensor); returns it, or None
        when the key is not in the pool (SGLang's meaning of None here)."""
        if target_location is None:
            return None
        try:
            with self._lock:
                st = self.store.get(self._keys([key]), [target_location])
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            return None
        return target_location if cxlkv.get_ok(st)[0] else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """:meth:`get` of each key into its target: a list (None for a miss)."""
        locs = list(target_locations) if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store one page from tensor ``value``; True when it is in the pool."""
        if value is None:
            return False
        if self.is_mla and self.tp_rank != 0:
            return True
        try:
            with self._lock:
                st = self.store.put(self._keys([key]), [value.contiguous() if hasattr(value, "contiguous") else value])
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return False
        return bool(cxlkv.put_ok(st)[0])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """:meth:`set` of each (key, value); True when every page is in the pool."""
        if values is None:
            return False
        return all([self.set(k, v) for k, v in zip(keys, values)])

    def clear(self):
        """Nothing to do: the pool is shared with other hosts and engines;
        its blocks leave by eviction (or ``cxlkvctl kv evict``)."""

    def get_stats(self):
        """None: the pool's statistics are ``cxlkv.Pool.prometheus()`` /
        cxlkvd's metrics endpoint."""
        return None

    def close(self):
        """Close the KV store and the pool."""
        self.store.close()
        self.pool.close()


_built = {}


def _build():
    if "cls" in _built:
        return _built["cls"]
    bases = (CxlkvHiCacheStorageImpl,)
    try:
        import importlib
        bases = (CxlkvHiCacheStorageImpl, importlib.import_module("sglang.srt.mem_cache.hicache_storage").HiCacheStorage)
    except ImportError:
        pass
    cls = type("CxlkvHiCacheStorage", bases, {"__doc__": CxlkvHiCacheStorageImpl.__doc__, "__module__": __name__})
    _built["cls"] = cls
    return cls


def __getattr__(name):
    if name == "CxlkvHiCacheStorage":
        return _build()
    raise AttributeError(name)
