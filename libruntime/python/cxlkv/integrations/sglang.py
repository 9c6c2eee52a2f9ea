# SPDX-License-Identifier: MIT
"""SGLang HiCache storage backend (L3) over a cxlkv pool (written against
SGLang's ``HiCacheStorage`` of ``sglang/srt/mem_cache/hicache_storage.py``,
SGLang 0.5.23, with the zero-copy ``interface_v1`` calls and the ``v2``
calls of the hybrid cache controller).

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
:func:`cxlkv.keys_from_hashes` in a namespace (:func:`cxlkv.namespace`) of
everything that changes a page's bytes: model (with the host pool's
``storage_format_tag``), KV dtype, tensor rank (none for rank-replicated MLA
KV, which only the storage writer rank writes), pipeline rank, attention
context-parallel rank, decode context-parallel rank, the host pool's class,
layout, page tokens and page bytes, and how a page is cut into bytes
(``io``): ``v1`` -- the pieces ``get_page_buffer_meta(host_indices)`` names,
in that order -- or ``flat`` -- ``get_data_page(index)`` of the older
per-tensor interface, whose byte order differs for MHA ``layer_first`` --
or ``block`` -- a ``page_unified`` page block as the host buffer holds it.
Each side pool of a hybrid model (``register_mem_host_pool_v2``: Mamba
state, SWA, indexer, ...) has its own namespace (``pool=NAME``) and is
sharded by tensor rank unless it is rank-replicated like MLA KV.

Every list-returning call returns a list (never None: SGLang's prefetch and
backup threads die on a None); ``get`` returns None only for a missing key, as
the interface defines.  A host pool whose pages this backend cannot address
is refused when it is registered (the attach fails, naming the pool and
layout), never later in a storage thread.
"""

import logging
import threading
from dataclasses import dataclass, field

import cxlkv
from cxlkv.layout import RawChunks

__all__ = ["CxlkvHiCacheStorage"]

log = logging.getLogger("cxlkv.sglang")

# Side pools that stay sharded by tensor rank even in a rank-replicated (MLA)
# model: SGLang backs them up on every rank (hybrid_cache_controller.should_backup).
_RANK_SHARDED_SIDE_POOLS = {"mamba"}


def _cfg(storage_config, name, default=None):
    if storage_config is None:
        return default
    if isinstance(storage_config, dict):
        return storage_config.get(name, default)
    v = getattr(storage_config, name, default)
    return default if v is None else v


def _pool_label(name):
    """A pool name as text: SGLang passes ``PoolName`` members (a str Enum
    whose hash is not the hash of its value) or plain strings."""
    return str(getattr(name, "value", name))


def _dtype_name(host):
    dt = getattr(host, "dtype", None)
    if dt is None and getattr(host, "kv_buffer", None) is not None:
        dt = host.kv_buffer.dtype
    s = str(dt).replace("torch.", "")
    # Mamba state pages mix a conv and a temporal dtype.
    other = getattr(host, "temporal_dtype", None)
    if other is not None and other != dt:
        s += "+" + str(other).replace("torch.", "")
    return s


@dataclass
class _HostIO:
    """How the pages of one registered host pool travel: the pool, its page
    size in tokens, the cut (``v1`` / ``block`` / ``flat``), the namespace of
    each cut it supports, and whether this rank writes it."""
    name: str
    host: object
    page_size: int
    io: str                # the cut the batch calls use
    namespaces: dict = field(default_factory=dict)   # cut -> namespace bytes
    why_not: dict = field(default_factory=dict)      # cut -> why the pool cannot be cut so
    writes: bool = True


class _Result:
    """``PoolTransferResult``'s fields, for use without SGLang (tests with fakes)."""

    def __init__(self, kv_hit_pages, extra_pool_hit_pages, restorable_prefix_pages=None):
        self.kv_hit_pages = kv_hit_pages
        self.extra_pool_hit_pages = extra_pool_hit_pages
        self.restorable_prefix_pages = restorable_prefix_pages


def _sglang_storage_module():
    try:
        import importlib
        return importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        return None


class CxlkvHiCacheStorageImpl:
    """SGLang HiCache L3 storage backend over a cxlkv pool.

    ``CxlkvHiCacheStorage(storage_config, kwargs)`` then
    ``register_mem_pool_host(host_pool)`` (and, for hybrid models,
    ``register_mem_host_pool_v2(pool, name)`` per side pool), as SGLang's
    dynamic backend factory and cache controllers do.  Config:
    ``extra_config`` of the storage config (or ``kwargs``): ``pool`` (URI,
    required), ``node`` (default 1), ``namespace`` (text added to every
    key's namespace), ``interface_v1`` (SGLang's switch to the zero-copy
    calls).  Thread-safe (SGLang's prefetch and backup threads call at
    once).  Every batch call returns a list, never None; a call that fails
    returns False / 0 for its keys and logs the cause on the ``cxlkv.sglang``
    logger (SGLang would lose its thread on an exception).
    :data:`CxlkvHiCacheStorage` adds SGLang's base class when SGLang is
    importable."""

    def __init__(self, storage_config=None, kwargs=None, **extra):
        cfg = dict(_cfg(storage_config, "extra_config") or {})
        cfg.update(kwargs or {})
        cfg.update(extra)
        if "pool" not in cfg:
            raise ValueError("cxlkv HiCache backend: no 'pool' (the cxlkv pool URI) in the storage backend's "
                             "extra config (--hicache-storage-backend-extra-config)")
        c = storage_config
        self.model = _cfg(c, "model_name", "") or ""
        self.tp_rank, self.tp_size = int(_cfg(c, "tp_rank", 0)), int(_cfg(c, "tp_size", 1))
        self.pp = f"{_cfg(c, 'pp_rank', 0)}/{_cfg(c, 'pp_size', 1)}"
        # Context-parallel attention ranks hold different slices of one page.
        self.attn_cp = f"{_cfg(c, 'attn_cp_rank', 0)}/{_cfg(c, 'attn_cp_size', 1)}"
        dcp_rank, dcp_size = int(_cfg(c, "dcp_rank", 0)), int(_cfg(c, "dcp_size", 1))
        self.dcp = f"{dcp_rank}/{dcp_size}" if dcp_size > 1 else None
        self.is_mla = bool(_cfg(c, "is_mla_model", False))
        # SGLang's writer of rank-replicated KV: one per DCP shard (tp rank ==
        # dcp rank); every rank writes its own shard otherwise.
        self.is_writer = (not self.is_mla) or self.tp_rank == dcp_rank
        self.interface_v1 = bool(cfg.get("interface_v1", 0))
        self.user_namespace = str(cfg.get("namespace", ""))
        self.pool = cxlkv.Pool(cfg["pool"])
        try:
            self.store = cxlkv.KvStore(self.pool, int(cfg.get("node", 1)))
        except BaseException:
            self.pool.close()
            raise
        # SGLang calls from a prefetch and a backup thread at once; a handle is
        # used by one thread at a time.
        self._lock = threading.Lock()
        self.mem_pool_host = None
        self.namespace = None        # the KV pages' namespace of the batch calls (after registration)
        self._hosts = {}             # pool label -> _HostIO
        self._failures = {}          # message -> times seen (logged at 1, 2, 4, 8, ...)

    def _failed(self, what, e):
        """A call that SGLang must not see raise: log why (the first time a
        cause is seen, then at powers of two) and let the caller answer False."""
        msg = f"cxlkv HiCache {what} failed: {type(e).__name__}: {e}"
        n = self._failures[msg] = self._failures.get(msg, 0) + 1
        if n & (n - 1) == 0:
            log.warning("%s%s", msg, f" ({n} times)" if n > 1 else "")

    # ---- host pools and namespaces ------------------------------------------------
    def _namespace(self, host, io, page_bytes, pool, sharded, geometry=None):
        tp_rank, tp_size = (self.tp_rank, self.tp_size) if sharded else (0, 1)
        return cxlkv.namespace(
            self.model, _dtype_name(host), tp_rank, tp_size, self.user_namespace,
            engine="sglang", pp=self.pp, attn_cp=self.attn_cp, dcp=self.dcp,
            host=type(host).__name__, layout=getattr(host, "layout", None), io=io,
            page_tokens=int(host.page_size), page_bytes=page_bytes, pool=pool, geometry=geometry,
            format=getattr(host, "storage_format_tag", None))

    @staticmethod
    def _unified_block(host):
        """(buffer, geometry) when ``host`` keeps ``page_unified`` pages as
        whole blocks ``kv_buffer[page]`` (SGLang's own page meta does not
        cover that layout); else raises why not."""
        buf, lay = getattr(host, "kv_buffer", None), getattr(host, "page_unified_layout", None)
        if buf is None or lay is None:
            raise ValueError("no kv_buffer / page_unified_layout")
        if not buf.is_contiguous() or buf.shape[0] != host.page_num or buf[0].nbytes != lay.bytes_per_page:
            raise ValueError(f"kv_buffer {tuple(buf.shape)} is not {host.page_num} contiguous page blocks "
                             f"of {lay.bytes_per_page} bytes")
        return buf, f"groups={lay.head_group_num},heads={lay.head_num},layers={lay.layer_num},dim={lay.head_dim}"

    def _describe(self, host, label, sharded, kv):
        """A _HostIO for ``host``: probe each way of cutting its pages on the
        first page, so a pool this backend cannot address is refused here,
        at registration, with the reason."""
        import torch
        if getattr(host, "layout", None) is None or not getattr(host, "page_size", None):
            raise ValueError(f"cxlkv HiCache: host pool {label!r} ({type(host).__name__}) has no layout / page_size")
        ps = int(host.page_size)
        pool = None if label == "kv" else label
        hio = _HostIO(label, host, ps, "")
        try:
            ptrs, sizes = host.get_page_buffer_meta(torch.arange(ps))
            if not len(ptrs):
                raise ValueError("no pieces for a page")
            hio.namespaces["v1"] = self._namespace(host, "v1", int(sum(sizes)), pool, sharded)
        except Exception as e:  # noqa: BLE001 -- SGLang pools raise ValueError / NotImplementedError / AssertionError
            hio.why_not["v1"] = f"get_page_buffer_meta: {type(e).__name__}: {e}"
        if host.layout == "page_unified":
            try:
                buf, geo = self._unified_block(host)
                hio.namespaces["block"] = self._namespace(host, "block", int(buf[0].nbytes), pool, sharded, geo)
            except Exception as e:  # noqa: BLE001
                hio.why_not["block"] = f"page blocks: {type(e).__name__}: {e}"
        try:
            page = host.get_data_page(0, flat=True)
            hio.namespaces["flat"] = self._namespace(host, "flat", int(page.numel() * page.element_size()),
                                                     pool, sharded)
        except Exception as e:  # noqa: BLE001
            hio.why_not["flat"] = f"get_data_page: {type(e).__name__}: {e}"
        # The cut of the batch calls: SGLang's KV pool goes through the
        # zero-copy calls with interface_v1 and through get/set otherwise;
        # side pools (v2 calls) take the first cut they support.
        order = (("v1", "block") if self.interface_v1 else ("flat",)) if kv else ("v1", "block", "flat")
        hio.io = next((io for io in order if io in hio.namespaces), "")
        if not hio.io:
            why = "; ".join(f"{io}: {hio.why_not.get(io, 'not this layout')}" for io in order)
            raise ValueError(f"cxlkv HiCache: cannot store pages of host pool {label!r} ({type(host).__name__}, "
                             f"layout {host.layout!r}, dtype {_dtype_name(host)}): {why}")
        hio.writes = sharded or self.is_writer
        return hio

    def register_mem_pool_host(self, mem_pool_host):
        """The host KV pool whose pages the batch calls move; fixes the KV
        namespace (its dtype, layout and page size are part of it).  Raises
        ValueError when its pages cannot be addressed (SGLang's attach fails)."""
        hio = self._describe(mem_pool_host, "kv", sharded=not self.is_mla, kv=True)
        self.mem_pool_host = mem_pool_host
        self._hosts["kv"] = hio
        self.namespace = hio.namespaces.get(hio.io)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """A side pool of a hybrid model (Mamba state, SWA, indexer, ...),
        moved by the v2 calls under its own namespace.  Raises ValueError
        when its pages cannot be addressed."""
        label = _pool_label(host_pool_name)
        sharded = (not self.is_mla or label in _RANK_SHARDED_SIDE_POOLS
                   or hasattr(host_pool, "head_num"))  # an MHA pool (a draft model's) is split by heads
        self._hosts[label] = self._describe(host_pool, label, sharded, kv=False)
        # SGLang's base class keeps this map; so do we, for code that reads it.
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def on_host_pools_registered(self):
        """Nothing to finalise: every pool was checked when registered."""

    def _kv(self):
        hio = self._hosts.get("kv")
        if hio is None:
            raise RuntimeError("no host memory pool: register_mem_pool_host() was not called")
        return hio

    def _keys(self, keys, ns):
        return cxlkv.keys_from_hashes(list(keys), ns)

    def _pages(self, hio, io, n, host_indices):
        """The pool blocks of ``n`` pages at ``host_indices`` cut ``io``."""
        if len(host_indices) != n * hio.page_size:
            raise ValueError(f"{len(host_indices)} host indices for {n} pages of {hio.page_size} tokens "
                             f"(host pool {hio.name!r})")
        if io == "block":
            buf, _ = self._unified_block(hio.host)
            starts = host_indices[::hio.page_size].tolist()
            if any(s % hio.page_size for s in starts):
                raise ValueError(f"host index not at a page start (host pool {hio.name!r})")
            return [buf[s // hio.page_size] for s in starts]
        ptrs, sizes = hio.host.get_page_buffer_meta(host_indices)
        if n == 0 or len(ptrs) % n:
            raise ValueError(f"{len(ptrs)} page pieces for {n} keys (host pool {hio.name!r})")
        return RawChunks(ptrs, sizes, len(ptrs) // n)

    def _note_blocks(self, what, st, fine):
        """Log the cause of blocks that failed (not a plain miss / busy)."""
        if not fine.all():
            bad = sorted({cxlkv.status_name(x) for x in st[~fine]})
            self._failed(what, RuntimeError(f"{int((~fine).sum())} of {len(st)} pages: {', '.join(bad)}"
                                            f"{'; ' + self.store.last_error if self.store.last_error else ''}"))

    def _exists(self, keys, ns):
        with self._lock:
            return int(self.store.lookup(self._keys(keys, ns)))

    def _read(self, what, hio, keys, host_indices):
        """Pages ``keys`` of ``hio`` into its host pool at ``host_indices``; one bool per key."""
        io, ns = hio.io, hio.namespaces[hio.io]
        if io == "flat":
            starts = host_indices[::hio.page_size]
            if len(host_indices) != len(keys) * hio.page_size:
                raise ValueError(f"{len(host_indices)} host indices for {len(keys)} pages of {hio.page_size} "
                                 f"tokens (host pool {hio.name!r})")
            bufs = [hio.host.get_dummy_flat_data_page() for _ in keys]
            with self._lock:
                st = self.store.get(self._keys(keys, ns), bufs)
            ok = cxlkv.get_ok(st)
            for i in range(len(keys)):
                if ok[i]:
                    hio.host.set_from_flat_data_page(int(starts[i]), bufs[i])
        else:
            pages = self._pages(hio, io, len(keys), host_indices)
            with self._lock:
                st = self.store.get(self._keys(keys, ns), pages)
            ok = cxlkv.get_ok(st)
        self._note_blocks(what, st, ok | (st == cxlkv.MISS))
        return [bool(x) for x in ok]

    def _write(self, what, hio, keys, host_indices):
        """Pages of ``hio`` at ``host_indices`` stored as ``keys``; one bool
        per key (a rank that does not write replicated pages reports True)."""
        if not hio.writes:
            return [True] * len(keys)
        io, ns = hio.io, hio.namespaces[hio.io]
        if io == "flat":
            if len(host_indices) != len(keys) * hio.page_size:
                raise ValueError(f"{len(host_indices)} host indices for {len(keys)} pages of {hio.page_size} "
                                 f"tokens (host pool {hio.name!r})")
            pages = [hio.host.get_data_page(int(host_indices[i * hio.page_size]), flat=True).contiguous()
                     for i in range(len(keys))]
        else:
            pages = self._pages(hio, io, len(keys), host_indices)
        with self._lock:
            st = self.store.put(self._keys(keys, ns), pages)
        ok = cxlkv.put_ok(st)
        self._note_blocks(what, st, ok | (st == cxlkv.BUSY))
        return [bool(x) for x in ok]

    # ---- zero-copy v1 -----------------------------------------------------------
    def batch_exists(self, keys, extra_info=None):
        """Number of consecutive pages from the start that are in the pool."""
        if not keys:
            return 0
        try:
            hio = self._kv()
            return self._exists(keys, hio.namespaces[hio.io])
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_exists", e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Load pages into the host pool at ``host_indices``; one bool per key."""
        if not keys:
            return []
        try:
            return self._read("batch_get_v1", self._kv(), keys, host_indices)
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_get_v1", e)
            return [False] * len(keys)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store pages from the host pool; one bool per key (rank-replicated
        MLA pages are written by the writer rank only, other ranks report
        success)."""
        if not keys:
            return []
        try:
            return self._write("batch_set_v1", self._kv(), keys, host_indices)
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_set_v1", e)
            return [False] * len(keys)

    # ---- v2: hybrid models' side pools --------------------------------------------
    def _side(self, transfer):
        label = _pool_label(transfer.name)
        hio = self._hosts.get(label)
        if hio is None:
            raise RuntimeError(f"host pool {label!r} was not registered (register_mem_host_pool_v2)")
        return hio

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix of ``keys``: the KV pages from the start that are
        in the pool, cut to the prefix lengths every side pool can restore
        (``all_pages``: all its pages up to there; ``trailing_pages``: its
        last ``len(transfer.keys)`` pages).  A pool of another hit policy
        gets no verdict and does not limit the prefix."""
        mod = _sglang_storage_module()
        result = getattr(mod, "PoolTransferResult", _Result)
        kv_name = getattr(getattr(mod, "PoolName", None), "KV", "kv")
        try:
            kv = self.batch_exists(keys, extra_info) if keys else 0
            hits = {kv_name: kv} if kv else {}
            restorable = set(range(1, kv + 1))
            for t in pool_transfers or []:
                if not restorable:
                    break
                policy = _pool_label(getattr(t, "hit_policy", "all_pages"))
                if policy not in ("all_pages", "trailing_pages"):
                    continue
                hio = self._side(t)
                ns = hio.namespaces[hio.io]
                have = [self._exists([k], ns) == 1 for k in keys[:kv]]
                if policy == "all_pages":
                    edge = have.index(False) if False in have else kv
                    ok = set(range(1, edge + 1))
                else:
                    window = max(1, len(t.keys or []))
                    ok = {p for p in range(1, kv + 1) if all(have[max(0, p - window):p])}
                if ok:
                    hits[t.name] = max(ok)
                restorable &= ok
            order = sorted(restorable)
            return result(order[-1] if order else 0, hits, order)
        except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
            self._failed("batch_exists_v2", e)
            return result(0, {}, [])

    def _batch_v2(self, what, transfers, op):
        out = {}
        for t in transfers or []:
            keys = list(t.keys or [])
            try:
                if t.host_indices is None:
                    raise ValueError(f"no host indices for pool {_pool_label(t.name)!r}")
                out[t.name] = op(what, self._side(t), keys, t.host_indices) if keys else []
            except Exception as e:  # noqa: BLE001 -- SGLang's thread must live on
                self._failed(what, e)
                out[t.name] = [False] * len(keys)
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        """Load each transfer's pages into its host pool: {pool name: [bool per key]}."""
        return self._batch_v2("batch_get_v2", transfers, self._read)

    def batch_set_v2(self, transfers, extra_info=None):
        """Store each transfer's pages from its host pool: {pool name: [bool per key]}."""
        return self._batch_v2("batch_set_v2", transfers, self._write)

    # ---- the older per-tensor interface (SGLang without interface_v1) ---------------
    def _flat_ns(self):
        hio = self._kv()
        if "flat" not in hio.namespaces:
            raise RuntimeError(f"host pool of layout {hio.host.layout!r} has no flat pages: {hio.why_not['flat']}")
        return hio.namespaces["flat"]

    def exists(self, key):
        """Whether page ``key`` is in the pool (as :meth:`batch_exists` sees it)."""
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        """Read one page into ``target_location`` (a tensor); returns it, or None
        when the key is not in the pool (SGLang's meaning of None here)."""
        if target_location is None:
            return None
        try:
            with self._lock:
                st = self.store.get(self._keys([key], self._flat_ns()), [target_location])
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            return None
        self._note_blocks("get", st, cxlkv.get_ok(st) | (st == cxlkv.MISS))
        return target_location if cxlkv.get_ok(st)[0] else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """:meth:`get` of each key into its target: a list (None for a miss)."""
        locs = list(target_locations) if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store one page from tensor ``value``; True when it is in the pool."""
        if value is None:
            return False
        try:
            if not self._kv().writes:
                return True
            with self._lock:
                st = self.store.put(self._keys([key], self._flat_ns()),
                                    [value.contiguous() if hasattr(value, "contiguous") else value])
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return False
        self._note_blocks("set", st, cxlkv.put_ok(st) | (st == cxlkv.BUSY))
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
    mod = _sglang_storage_module()
    if mod is not None:
        bases = (CxlkvHiCacheStorageImpl, mod.HiCacheStorage)
    cls = type("CxlkvHiCacheStorage", bases, {"__doc__": CxlkvHiCacheStorageImpl.__doc__, "__module__": __name__})
    _built["cls"] = cls
    return cls


def __getattr__(name):
    if name == "CxlkvHiCacheStorage":
        return _build()
    raise AttributeError(name)
