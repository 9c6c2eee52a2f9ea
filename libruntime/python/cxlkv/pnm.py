# SPDX-License-Identifier: MIT
"""Near-memory long contexts (docs/near-memory.md): a request's KV stays in the pool
with per-page min/max key digests; each decode step scores the pages, keeps
the top ``token_budget`` tokens' pages and computes attention beside the
pool, returning output and log-sum-exp (mergeable with a GPU part).

    import cxlkv, cxlkv.pnm as pnm
    st = pnm.PnmStore(pool)                        # makes the "pnm" carve on first use
    ctx = st.create(request_id, layers=32, kv_heads=8, head_dim=128,
                    dtype="bf16", max_tokens=1 << 20)
    ctx.append(k, v)                               # [layers][kv_heads][n][head_dim]
    reader = pnm.PnmStore(pool, readonly=True).find(request_id)
    out, lse, stats = reader.attend(q, token_budget=2048)   # q: [layers][q_heads][head_dim]
    out, lse = pnm.merge(out_gpu, lse_gpu, out, lse)

K / V: numpy arrays (float32, float16, or uint16 holding bf16 bits) or
torch tensors (float32 / float16 / bfloat16, any device: copied to the CPU).
"""
import ctypes as C
import threading

from . import _lib

DTYPES = {"f32": 0, "bf16": 1, "f16": 2}
DIGESTS = {"minmax": 0, "q8": 1}
_STORE_F_READONLY = 1
_STEP_F_ALL_PAGES = 1
SCORE_UPPER_BOUND = 0
SCORE_COARSE = 1


class StoreOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("carve_bytes", C.c_uint64), ("partitions", C.c_uint32),
                ("slots_per_partition", C.c_uint32), ("partition", C.c_uint32), ("flags", C.c_uint32)]


class Geometry(C.Structure):
    _fields_ = [("size", C.c_size_t), ("layers", C.c_uint32), ("kv_heads", C.c_uint32), ("head_dim", C.c_uint32),
                ("dtype", C.c_uint32), ("page_tokens", C.c_uint32), ("reserved", C.c_uint32),
                ("max_tokens", C.c_uint64), ("digest", C.c_uint32), ("group_pages", C.c_uint32)]


class StepOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("token_budget", C.c_uint64), ("sink_pages", C.c_uint32),
                ("local_pages", C.c_uint32), ("score_mode", C.c_uint32), ("flags", C.c_uint32),
                ("refine_pages", C.c_uint32), ("reserved", C.c_uint32)]


class StepStats(C.Structure):
    _fields_ = [("size", C.c_size_t), ("ntokens", C.c_uint64), ("selected_pages", C.c_uint64),
                ("select_ms", C.c_double), ("attend_ms", C.c_double), ("digest_bytes", C.c_uint64),
                ("kv_bytes", C.c_uint64), ("link_bytes_near", C.c_uint64), ("link_bytes_selected", C.c_uint64),
                ("link_bytes_all", C.c_uint64)]


_vp, _u32, _u64, _fp = C.c_void_p, C.c_uint32, C.c_uint64, C.POINTER(C.c_float)
_PROTOS = {
    "cxlkv_pnm_store_open": (C.c_int, [_vp, C.POINTER(StoreOpts), C.POINTER(_vp)]),
    "cxlkv_pnm_store_close": (None, [_vp]),
    "cxlkv_pnm_create": (C.c_int, [_vp, _u64, C.POINTER(Geometry), C.POINTER(_vp)]),
    "cxlkv_pnm_find": (C.c_int, [_vp, _u64, C.POINTER(_vp)]),
    "cxlkv_pnm_destroy": (C.c_int, [_vp, _u64]),
    "cxlkv_pnm_context_close": (None, [_vp]),
    "cxlkv_pnm_geometry_of": (C.c_int, [_vp, C.POINTER(Geometry)]),
    "cxlkv_pnm_append": (C.c_int, [_vp, _vp, _vp, _u32]),
    "cxlkv_pnm_refresh": (C.c_int64, [_vp]),
    "cxlkv_pnm_engine_create": (C.c_int, [_u32, C.c_int, C.POINTER(_vp)]),
    "cxlkv_pnm_engine_destroy": (None, [_vp]),
    "cxlkv_pnm_attend": (C.c_int, [_vp, _vp, _fp, _u32, _u64, C.POINTER(StepOpts), _fp, _fp,
                                   C.POINTER(StepStats)]),
    "cxlkv_pnm_select": (C.c_int, [_vp, _fp, _u32, _u64, C.POINTER(StepOpts), C.POINTER(_u32), _u32,
                                   C.POINTER(_u32)]),
    "cxlkv_pnm_merge": (C.c_int, [C.c_size_t, _u32, _fp, _fp, _fp, _fp, _fp, _fp]),
}
_bound = None


def _l():
    """libcxlkv with this module's prototypes set."""
    global _bound
    if _bound is None:
        h = _lib.lib()
        for name, (res, args) in _PROTOS.items():
            fn = getattr(h, name, None)
            if fn is None:
                raise ImportError(f"cxlkv.pnm: {h._name} lacks {name} (library too old)")
            fn.restype, fn.argtypes = res, args
        _bound = h
    return _bound


def _np():
    import numpy
    return numpy


def _as_array(x, dtype):
    """A C-contiguous numpy array of x's bytes in the context's element type."""
    np = _np()
    try:
        import torch
        if isinstance(x, torch.Tensor):
            x = x.detach().to("cpu").contiguous()
            if x.dtype == torch.bfloat16:
                x = x.view(torch.int16)
            x = x.numpy()
    except ImportError:
        pass
    a = np.ascontiguousarray(x)
    want = {"f32": (np.float32,), "f16": (np.float16,), "bf16": (np.uint16, np.int16)}[dtype]
    if a.dtype.type not in want:
        if dtype == "bf16":
            raise TypeError(f"cxlkv.pnm: bf16 context takes torch.bfloat16 or uint16 bf16 bits, not {a.dtype}")
        a = a.astype(want[0])
    return a


def _floats(x, what):
    np = _np()
    try:
        import torch
        if isinstance(x, torch.Tensor):
            x = x.detach().to("cpu").float().numpy()
    except ImportError:
        pass
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim != 3:
        raise ValueError(f"cxlkv.pnm: {what} must be [layers][heads][head_dim], got shape {a.shape}")
    return a


def _fptr(a):
    return a.ctypes.data_as(_fp)


def _step_opts(token_budget, sink_pages, local_pages, coarse, all_pages, refine_pages=0):
    return StepOpts(C.sizeof(StepOpts), int(token_budget), int(sink_pages), int(local_pages),
                    SCORE_COARSE if coarse else SCORE_UPPER_BOUND, _STEP_F_ALL_PAGES if all_pages else 0,
                    int(refine_pages), 0)


class Engine:
    """A near-memory engine: ``threads`` threads, bound to ``numa_node``'s CPUs (-1: none)."""

    def __init__(self, threads=1, numa_node=-1):
        self._h = _vp()
        _lib.check(_l().cxlkv_pnm_engine_create(int(threads), int(numa_node), C.byref(self._h)), "pnm engine")

    def close(self):
        if self._h:
            _l().cxlkv_pnm_engine_destroy(self._h)
            self._h = _vp()

    __del__ = close


class Context:
    """One request's long context (a writer handle from create(), a reader from find())."""

    def __init__(self, store, h, request_id):
        """Made by :meth:`PnmStore.create` / :meth:`PnmStore.find` with the
        pool's and the store's locks held."""
        self._store, self.request_id = store, request_id
        # The KvStore mechanism (kv.py): the C calls on this handle and its
        # close take turns under this lock, so closing the context, its store
        # or its pool (from any thread) waits for a call in progress, and
        # later calls raise ValueError.  The handle lives in the pool's
        # registry and in the store's too: either closes it first.
        self._lock = threading.RLock()
        self._hd = _lib.Handle(_l().cxlkv_pnm_context_close, 0, self._lock)
        self._hd.h = h
        store._pool._hold(self._hd)
        store._contexts[id(self._hd)] = self._hd
        g = Geometry()
        g.size = C.sizeof(Geometry)
        try:
            with self._lock:
                _lib.check(_l().cxlkv_pnm_geometry_of(self._h, C.byref(g)), f"pnm context {request_id}")
        except Exception:
            self.close()
            raise
        self.layers, self.kv_heads, self.head_dim = g.layers, g.kv_heads, g.head_dim
        self.dtype = {v: k for k, v in DTYPES.items()}[g.dtype]
        self.page_tokens, self.max_tokens = g.page_tokens, g.max_tokens
        # What the context was made with: group_pages 1 is one level.
        self.digest = {v: k for k, v in DIGESTS.items()}[g.digest]
        self.group_pages = g.group_pages

    def append(self, k, v):
        """Append tokens: k, v are [layers][kv_heads][n][head_dim]; published on return."""
        a, b = _as_array(k, self.dtype), _as_array(v, self.dtype)
        want = (self.layers, self.kv_heads)
        if a.shape != b.shape or a.ndim != 4 or a.shape[:2] != want or a.shape[3] != self.head_dim:
            raise ValueError(f"cxlkv.pnm: K {a.shape} / V {b.shape} must both be "
                             f"[{self.layers}][{self.kv_heads}][n][{self.head_dim}]")
        with self._lock:
            _lib.check(_l().cxlkv_pnm_append(self._h, a.ctypes.data, b.ctypes.data, a.shape[2]),
                       f"pnm append to {self.request_id}")

    def refresh(self):
        """Published token count (fresh read from the pool)."""
        with self._lock:
            return _lib.check(_l().cxlkv_pnm_refresh(self._h), f"pnm refresh of {self.request_id}")

    def attend(self, queries, token_budget=2048, sink_pages=1, local_pages=1, coarse=False, all_pages=False,
               ntokens=0, engine=None, refine_pages=0):
        """One decode step: returns (out [layers][q_heads][head_dim], lse [layers][q_heads], stats dict)."""
        np = _np()
        q = _floats(queries, "queries")
        out = np.zeros(q.shape, dtype=np.float32)
        lse = np.zeros(q.shape[:2], dtype=np.float32)
        st = StepStats()
        st.size = C.sizeof(StepStats)
        o = _step_opts(token_budget, sink_pages, local_pages, coarse, all_pages, refine_pages)
        with self._lock:
            _lib.check(_l().cxlkv_pnm_attend(self._h, engine._h if engine else None, _fptr(q), q.shape[1],
                                             int(ntokens), C.byref(o), _fptr(out), _fptr(lse), C.byref(st)),
                       f"pnm attend on {self.request_id}")
        stats = {n: getattr(st, n) for n, _ in StepStats._fields_ if n != "size"}
        return out, lse, stats

    def select(self, queries, token_budget=2048, sink_pages=1, local_pages=1, coarse=False, ntokens=0):
        """The selected pages: a list (layer-major) of page-number arrays per (layer, KV head)."""
        np = _np()
        q = _floats(queries, "queries")
        n = ntokens or self.refresh()
        room = max(1, (n + self.page_tokens - 1) // self.page_tokens)
        pairs = self.layers * self.kv_heads
        pages = np.zeros(pairs * room, dtype=np.uint32)
        counts = np.zeros(pairs, dtype=np.uint32)
        o = _step_opts(token_budget, sink_pages, local_pages, coarse, False)
        with self._lock:
            _lib.check(_l().cxlkv_pnm_select(self._h, _fptr(q), q.shape[1], int(n), C.byref(o),
                                             pages.ctypes.data_as(C.POINTER(_u32)), room,
                                             counts.ctypes.data_as(C.POINTER(_u32))),
                       f"pnm select on {self.request_id}")
        return [pages[i * room: i * room + counts[i]].copy() for i in range(pairs)]

    @property
    def _h(self):
        """The C handle; a C call on it must hold ``self._lock``."""
        if not self._hd.h:
            raise ValueError(f"cxlkv.pnm: context {self.request_id} is closed (or its store or pool is)")
        return self._hd.h

    def close(self):
        """Close this handle on the context, after a call in progress on
        another thread returns (twice is harmless)."""
        hd = getattr(self, "_hd", None)
        if hd is not None:
            hd.close()
            self._store._pool._release(hd)
            self._store._contexts.pop(id(hd), None)

    __del__ = close


class PnmStore:
    """The pool's "pnm" carve.  A writer (default) holds partition ``partition``
    (one writer process per partition); ``readonly=True`` is a reader."""

    def __init__(self, pool, partition=0, readonly=False, carve_bytes=0, partitions=0, slots_per_partition=0):
        self._pool = pool
        # As KvStore (kv.py): C calls on the handle, the opening of contexts
        # and close() take turns under this lock; closing the store (or the
        # pool) waits for a call in progress and closes the store's contexts
        # first (their C handles point into the store).
        self._lock = threading.RLock()
        self._hd = _lib.Handle(_l().cxlkv_pnm_store_close, 1, self._lock)
        self._contexts = {}  # id -> _lib.Handle of each context opened through this store
        o = StoreOpts(C.sizeof(StoreOpts), int(carve_bytes), int(partitions), int(slots_per_partition),
                      int(partition), _STORE_F_READONLY if readonly else 0)
        with pool._lock:
            _lib.check(_l().cxlkv_pnm_store_open(pool.handle, C.byref(o), C.byref(self._hd.h)),
                       f"pnm store of {pool.uri}")
            pool._hold(self._hd)  # closing the pool closes it first
            pool._adopt(self)

    _close_rank = 1

    def _close_for_pool(self):
        self.close()

    @property
    def _h(self):
        """The C handle; a C call on it must hold ``self._lock``."""
        if not self._hd.h:
            raise ValueError(f"cxlkv.pnm: the pnm store of {self._pool.uri} is closed (or its pool is)")
        return self._hd.h

    def create(self, request_id, layers, kv_heads, head_dim, max_tokens, dtype="bf16", page_tokens=16,
               digest="minmax", group_pages=0):
        """A new context of ``request_id`` (up to ``max_tokens`` tokens) in this
        writer's partition: a :class:`Context` to append K/V to.  ``digest``:
        "minmax" or "q8" page digests; ``group_pages``: two-level digests, a
        group digest per that many pages (a power of two), 1 for one level, 0
        to let the store choose: 16 for a ``max_tokens`` of 4096 pages or
        more, else one level (docs/near-memory.md#digest-kinds); the context's
        ``group_pages`` says what it was made with."""
        if dtype not in DTYPES:
            raise ValueError(f"cxlkv.pnm: dtype {dtype!r} is not one of {sorted(DTYPES)}")
        if digest not in DIGESTS:
            raise ValueError(f"cxlkv.pnm: digest {digest!r} is not one of {sorted(DIGESTS)}")
        g = Geometry(C.sizeof(Geometry), layers, kv_heads, head_dim, DTYPES[dtype], page_tokens, 0, max_tokens,
                     DIGESTS[digest], int(group_pages))
        h = _vp()
        # Pool lock first, as Pool.close takes them: the new context's handle
        # is registered before a close can look for it.
        with self._pool._lock, self._lock:
            _lib.check(_l().cxlkv_pnm_create(self._h, int(request_id), C.byref(g), C.byref(h)),
                       f"pnm create {request_id}")
            return Context(self, h, request_id)

    def find(self, request_id):
        """The context of ``request_id`` (any partition): a :class:`Context`."""
        h = _vp()
        with self._pool._lock, self._lock:
            _lib.check(_l().cxlkv_pnm_find(self._h, int(request_id), C.byref(h)), f"pnm find {request_id}")
            return Context(self, h, request_id)

    def destroy(self, request_id):
        """Remove the context of ``request_id`` and free its slot."""
        with self._lock:
            _lib.check(_l().cxlkv_pnm_destroy(self._h, int(request_id)), f"pnm destroy {request_id}")

    def close(self):
        """Close the store and the contexts opened through it, each after a
        call in progress on another thread returns (twice is harmless)."""
        hd = getattr(self, "_hd", None)
        if hd is None:
            return
        with self._lock:
            for ch in list(self._contexts.values()):
                try:
                    ch.close()
                except Exception:  # noqa: BLE001 -- closing must reach the store's close
                    pass
                self._pool._release(ch)
            self._contexts.clear()
            hd.close()
        self._pool._release(hd)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def merge(out_a, lse_a, out_b, lse_b):
    """Merge two partials over disjoint token sets (log-sum-exp): (out, lse)."""
    np = _np()
    oa, ob = np.ascontiguousarray(out_a, np.float32), np.ascontiguousarray(out_b, np.float32)
    la, lb = np.ascontiguousarray(lse_a, np.float32), np.ascontiguousarray(lse_b, np.float32)
    if oa.shape != ob.shape or la.shape != lb.shape or la.size * oa.shape[-1] != oa.size:
        raise ValueError(f"cxlkv.pnm.merge: shapes {oa.shape}/{la.shape} and {ob.shape}/{lb.shape} differ")
    out, lse = np.empty_like(oa), np.empty_like(la)
    _lib.check(_l().cxlkv_pnm_merge(la.size, oa.shape[-1], _fptr(oa), _fptr(la), _fptr(ob), _fptr(lb),
                                    _fptr(out), _fptr(lse)), "pnm merge")
    return out, lse
