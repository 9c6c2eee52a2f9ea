# SPDX-License-Identifier: MIT
"""The KV store: lookup, batched publish / fetch / pin / unpin, leases, GPU
transfers.  Every batch is one C call (``cxlkv_kv_put_chain``,
``cxlkv_kv_get_many``, ``cxlkv_kv_pin_many``, ...), never a call per block.

Per-block results are ``int32`` status arrays with the codes of cxlkv.h:
``RESERVED`` (0: done), ``EXISTS`` (1: already cached), ``BUSY`` (2: another
node writes it), ``MISS`` (3: not cached), a negative errno for a failed
block, ``-ECANCELED`` for a block not attempted after an earlier block of the
same chain failed.
"""
import array
import ctypes as C
import errno
import threading
import time
import weakref

import numpy as np

from . import _lib
from .keys import as_keys, empty as empty_keys, encode_items, keys_from_hashes
from .layout import PagedKV, RawChunks, buffer_chunks

RESERVED, EXISTS, BUSY, MISS, CANCELED = _lib.RESERVED, _lib.EXISTS, _lib.BUSY, _lib.MISS, _lib.CANCELED
NODE_ANY = _lib.NODE_ANY

_KEYP = C.POINTER(_lib.KvKey)
_CHP = C.POINTER(_lib.Chunk)
_U32P = C.POINTER(C.c_uint32)
_U64P = C.POINTER(C.c_uint64)
_I32P = C.POINTER(C.c_int32)


def _kp(a):
    return a.ctypes.data_as(_KEYP)


def status_name(s):
    """Text of one per-block status code."""
    s = int(s)
    if s >= 0:
        return {0: "RESERVED", 1: "EXISTS", 2: "BUSY", 3: "MISS"}.get(s, f"status {s}")
    return f"{errno.errorcode.get(-s, str(-s))} ({__import__('os').strerror(-s)})"


def _uint(v, bits, what):
    """``v`` as an unsigned C integer of ``bits`` bits, or TypeError /
    ValueError naming ``what`` (ctypes would truncate it silently)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"cxlkv: {what} must be an int, got {type(v).__name__}")
    v = int(v)
    if not 0 <= v < (1 << bits):
        raise ValueError(f"cxlkv: {what} {v} is not in 0 .. 2**{bits}-1")
    return v


def put_ok(status):
    """Blocks of a put that are in the pool now (written, or already there)."""
    return (status == RESERVED) | (status == EXISTS)


def _addr(a):
    """The address of an ``array.array``'s items."""
    return a.buffer_info()[0]


def _uints(code, values, what):
    """``values`` as an ``array.array(code)`` of unsigned integers, or
    ValueError naming ``what``."""
    try:
        return array.array(code, values)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"cxlkv: {what} must be unsigned integers ({e})") from None


def _require_writable(kv):
    """ValueError unless a get may write into the PagedKV ``kv``."""
    if not kv.writable:
        raise ValueError("cxlkv: the PagedKV is read-only (a read-only array or buffer); a get writes into it")


def _parent_keys(parents, ns):
    """The keys of an engine step's chain parents (hashes, None for a root)
    in namespace ``ns``: a key each, None where the parent is None."""
    at = iter(keys_from_hashes([p for p in parents if p is not None], ns))
    return [next(at) if p is not None else None for p in parents]


def get_ok(status):
    """Blocks of a get that were read."""
    return status == RESERVED


class Gpu:
    """The pool pinned for GPU DMA (``cxlkv_gpu_open_pool``).  ``reference``
    uses the CPU reference backend (no GPU: "device pointers" are host memory),
    for tests and examples."""

    def __init__(self, pool, device=0, reference=False):
        self.pool = pool
        self._hd = _lib.Handle(_lib.lib().cxlkv_gpu_close, 2)
        o = _lib.GpuOpts(C.sizeof(_lib.GpuOpts), _lib.GPU_F_CPU_REFERENCE if reference else 0, device, 0)
        with pool._lock:
            _lib.check(_lib.lib().cxlkv_gpu_open_pool(pool.handle, C.byref(o), C.byref(self._hd.h)),
                       f"pin pool {pool.uri} for the GPU")
            pool._hold(self._hd)
            pool._adopt(self)

    _close_rank = 2

    def _close_for_pool(self):
        self.close()

    @staticmethod
    def probe():
        """(ok, message): whether a GPU path is usable here, and why not."""
        msg = C.create_string_buffer(512)
        rc = _lib.lib().cxlkv_gpu_probe(msg, len(msg))
        return rc == 0, msg.value.decode(errors="replace")

    @property
    def _h(self):
        return self._hd.h

    @property
    def handle(self):
        """The C handle (``struct cxlkv_gpu *``); ValueError once closed."""
        if not self._h:
            raise ValueError(f"cxlkv: the GPU pinning of pool {self.pool.uri} is closed")
        return self._h

    @property
    def pin_method(self):
        """How the pool was registered for DMA (the C library's name for it)."""
        return (_lib.lib().cxlkv_gpu_pin_method(self.handle) or b"").decode()

    def close(self):
        """Unpin the pool (after the caller's streams are idle); twice is harmless."""
        self._hd.close()
        self.pool._release(self._hd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _current_stream(kv):
    if not kv.is_cuda:
        return None
    import torch
    return C.c_void_p(torch.cuda.current_stream().cuda_stream)


class KvStore:
    """One node's handle on a pool's KV store (``cxlkv_kv_open``).  A lock
    manager must run for the pool (cxlkvd or :class:`cxlkv.LockManager`).

    Thread-safe: the C handle serves one thread at a time, so the calls of
    several threads (an engine's scheduler, prefetch and backup threads) take
    turns on it, and :meth:`close` (or closing the pool) waits for a call in
    progress, after which calls raise ValueError.  For batches that overlap,
    give each thread its own store, or use :class:`cxlkv.aio.AsyncKv`.

    ``metrics``: a :class:`cxlkv.metrics.Metrics` to count into (tokens,
    bytes, latency histograms); ``block_tokens`` lets it count tokens.

    ``remote``: the remote tier (:mod:`cxlkv.remote`, docs/remote.md): None
    (the default) takes it from the ``CXLKV_REMOTE_*`` environment, which
    leaves it off unless ``CXLKV_REMOTE_MASTER`` is set; False turns it off; a
    :class:`cxlkv.remote.RemoteConfig`, a dict or a
    :class:`cxlkv.remote.RemoteTier` turns it on.  With a tier, published
    blocks are also pushed to it in the background, and a lookup that misses
    in the pool fetches the rest of the prefix from it into the pool."""

    def __init__(self, pool, node, metrics=None, block_tokens=0, remote=None):
        self.pool = pool
        self.node = node = _uint(node, 32, f"node of a KV store of {pool.uri}")
        self._what = f"pool {pool.uri}: the KV store of node {node}"  # in the engine calls' errors
        # Serialises the C calls on the handle and close() (one thread at a
        # time per handle: cxlkv.h).  Re-entrant: a Pins released by the
        # garbage collector inside a call of this thread unpins at once.
        self._lock = threading.RLock()
        self._hd = _lib.Handle(_lib.lib().cxlkv_kv_close, 1, self._lock)
        # What this handle holds in the pool on behalf of Python objects
        # (Pins, layer-wise loads and saves): released by close() first.
        self._held = weakref.WeakSet()
        o = _lib.KvOpts(C.sizeof(_lib.KvOpts), node, 0)
        with pool._lock:
            _lib.check(_lib.lib().cxlkv_kv_open(pool.handle, C.byref(o), C.byref(self._hd.h)),
                       f"open KV store of {pool.uri} as node {node}")
            pool._hold(self._hd)
            pool._adopt(self)
        self._lib = _lib.lib()
        # The hot batch calls through their own function objects taking plain
        # addresses (c_void_p): no POINTER casts per call (docs/api.md "Python").
        vp, sz = C.c_void_p, C.c_size_t
        self._put_chain = self._lib["cxlkv_kv_put_chain"]
        self._put_chain.restype, self._put_chain.argtypes = C.c_int, [vp, vp, vp, sz, C.c_uint64, vp, vp, vp]
        self._put_chains = self._lib["cxlkv_kv_put_chains"]
        self._put_chains.restype = C.c_int
        self._put_chains.argtypes = [vp, vp, vp, sz, vp, sz, C.c_uint64, vp, vp, vp]
        self._get_many = self._lib["cxlkv_kv_get_many"]
        self._get_many.restype, self._get_many.argtypes = C.c_int, [vp, vp, sz, vp, vp, vp]
        # The engine-step calls give the GIL up (CDLL) like the other copies:
        # a step's copy may take milliseconds, and an engine process has
        # Python threads of its own (vLLM's engine core I/O threads).
        self._engine_put = self._lib["cxlkv_kv_engine_put_chains"]
        self._engine_put.restype = C.c_int
        self._engine_put.argtypes = [vp, vp, C.c_char_p, sz, C.c_char_p, sz, vp, sz, vp, sz, vp, vp, vp]
        self._paged_put = self._lib["cxlkv_kv_paged_put_chains"]
        self._paged_put.restype = C.c_int
        self._paged_put.argtypes = [vp, vp, C.c_char_p, sz, C.c_char_p, vp, sz, vp, vp]
        self._paged_get = self._lib["cxlkv_kv_paged_get_many"]
        self._paged_get.restype = C.c_int
        self._paged_get.argtypes = [vp, vp, C.c_char_p, sz, vp, vp]
        self._engine_get = self._lib["cxlkv_kv_engine_get_many"]
        self._engine_get.restype = C.c_int
        self._engine_get.argtypes = [vp, vp, C.c_char_p, sz, C.c_char_p, sz, vp, sz, vp, vp]
        self.metrics = metrics
        self.block_tokens = block_tokens
        self.remote = None
        if remote is not False:
            from . import remote as _remote  # noqa: PLC0415 -- only when a tier may be wanted
            self.remote = _remote.attach(pool, node, remote, metrics)

    _close_rank = 1

    def _close_for_pool(self):
        self.close()

    @property
    def _h(self):
        return self._hd.h

    @property
    def handle(self):
        """The C handle (``struct cxlkv_kv *``); ValueError once closed.  A
        C call on it must hold ``self._lock``."""
        if not self._h:
            raise ValueError(f"cxlkv: KV store of node {self.node} on {self.pool.uri} is closed")
        return self._h

    def close(self):
        """Detach this node's handle (after a call in progress on another
        thread returns), unpinning the pins of :class:`Pins` not yet released
        and ending unfinished layer-wise loads / saves first.  Later calls
        raise ValueError; closing twice is harmless."""
        with self._lock:
            if self._h:
                # Pins and reservations are the node's, and the node stays
                # alive while this process lives: closing without giving them
                # back kept those blocks unevictable for every node.
                for obj in list(self._held):
                    try:
                        obj._release_for_store()
                    except Exception:  # noqa: BLE001 -- closing must reach the C close
                        pass
                self._hd.close()
            self.pool._release(self._hd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _settle(self, rc, n, what):
        """Raise CxlkvError for a failed call; remember the library's message
        about the blocks a batch did not do (``last_error``)."""
        _lib.check(rc, what)
        self.last_error = _lib.last_error() if rc < n else ""

    # ---- lookup -------------------------------------------------------------
    def lookup(self, keys, remote=True):
        """Number of leading blocks of the chain ``keys`` that are cached.
        With a remote tier (and ``remote``), blocks past the pool's hits
        that the tier holds are fetched into the pool first and counted."""
        k = as_keys(keys)
        t0 = time.perf_counter()
        with self._lock:
            n = _lib.check(self._lib.cxlkv_kv_lookup(self.handle, _kp(k), len(k)), "cxlkv_kv_lookup")
        if self.metrics:
            self.metrics.observe_lookup(len(k), n, self.block_tokens, time.perf_counter() - t0)
        if remote and self.remote is not None and n < len(k):
            n = self.remote.fill(self, k, n)
        return n

    # ---- bulk put / get -----------------------------------------------------
    def _chunk_args(self, src, keys, block_ids, writable=False):
        """(arrays to keep alive, chunks address, counts address, bytes per
        block).  ``writable``: the call writes into ``src`` (a get)."""
        if isinstance(src, PagedKV):
            if writable:
                _require_writable(src)
            if block_ids is None:
                raise ValueError("cxlkv: a PagedKV transfer needs block_ids (one per key)")
            if len(block_ids) != len(keys):
                raise ValueError(f"cxlkv: {len(keys)} keys but {len(block_ids)} block ids")
            ch, counts, chp, cntp = src.chunk_args(block_ids)
            return (ch, counts), chp, cntp, src.block_bytes
        ch, counts, nbytes = self._chunks(src, keys, block_ids, writable)
        return (ch, counts), ch.ctypes.data, counts.ctypes.data, nbytes

    def _chunks(self, src, keys, block_ids, writable=False):
        if isinstance(src, PagedKV):
            if writable:
                _require_writable(src)
            if block_ids is None:
                raise ValueError("cxlkv: a PagedKV transfer needs block_ids (one per key)")
            if len(block_ids) != len(keys):
                raise ValueError(f"cxlkv: {len(keys)} keys but {len(block_ids)} block ids")
            ch, counts = src.chunks(block_ids)
            return ch, counts, src.block_bytes
        if isinstance(src, RawChunks):
            if len(src) != len(keys):
                raise ValueError(f"cxlkv: {len(keys)} keys but {len(src)} blocks of chunks")
            return src.chunks, src.counts, src.block_bytes
        if len(src) != len(keys):
            raise ValueError(f"cxlkv: {len(keys)} keys but {len(src)} buffers")
        ch, counts, sizes = buffer_chunks(src, writable)
        if len(sizes) and (sizes != sizes[0]).any():
            raise ValueError("cxlkv: every block buffer of one put must have the same size")
        return ch, counts, int(sizes[0]) if len(sizes) else 0

    def put(self, keys, src, block_ids=None, parent=None, gpu=None, stream=None, _remote=True):
        """Publish a chain of blocks: ``keys[0]`` is a child of ``parent`` (a
        key, or None for a root), ``keys[i]`` of ``keys[i-1]``.  ``src`` is a
        :class:`PagedKV` (with ``block_ids``, the engine blocks holding the
        keys' KV), a :class:`RawChunks`, or a list of one contiguous buffer
        per key.  A CUDA PagedKV
        (or ``gpu`` given) goes through the GPU path on ``stream`` (default:
        the current CUDA stream).  Returns the status array; ``put_ok()``
        tells which blocks are in the pool."""
        k = as_keys(keys)
        n = len(k)
        status = np.zeros(n, dtype=np.int32)
        if n == 0:
            return status
        par = as_keys([parent]) if parent is not None else None
        t0 = time.perf_counter()
        if isinstance(src, PagedKV) and (src.is_cuda or gpu is not None):
            bytes_ = self._gpu_put(k, par, src, block_ids, gpu, stream, status)
        else:
            _keep, chp, cntp, nbytes = self._chunk_args(src, k, block_ids)
            bytes_ = nbytes
            with self._lock:
                rc = self._put_chain(self.handle, par.ctypes.data if par is not None else None, k.ctypes.data, n,
                                     nbytes, chp, cntp, status.ctypes.data)
            self._settle(rc, n, "cxlkv_kv_put_chain")
        if self.metrics:
            self.metrics.observe_store(int((status == RESERVED).sum()) * bytes_, int(put_ok(status).sum()),
                                       time.perf_counter() - t0)
        if _remote and self.remote is not None:
            # Keys only: the tier's own thread reads the blocks back from the pool.
            self.remote.publish(k, status, bytes_, parents=(par[0] if par is not None else None,))
        return status

    def put_chains(self, keys, chain_lens, parents, src, block_ids=None, gpu=None, stream=None):
        """Several chains in one call (an engine step's requests): chain j is
        the next ``chain_lens[j]`` of ``keys``, a child of ``parents[j]`` (a
        key, or None for a root); ``src`` and ``block_ids`` as for
        :meth:`put`, over all blocks.  The chains are put in order, so one
        may start below a block an earlier chain publishes.  Returns the
        status array of all blocks.  CPU: one C call
        (``cxlkv_kv_put_chains``); a CUDA PagedKV: one GPU put per chain."""
        k = as_keys(keys)
        n = len(k)
        lens = np.ascontiguousarray(chain_lens, dtype=np.uint32).reshape(-1)
        if len(parents) != lens.size:
            raise ValueError(f"cxlkv: {lens.size} chains but {len(parents)} parents")
        if int(lens.sum()) != n:
            raise ValueError(f"cxlkv: chain lengths add up to {int(lens.sum())} blocks, {n} keys given")
        status = np.zeros(n, dtype=np.int32)
        if n == 0:
            return status
        if isinstance(src, PagedKV) and (src.is_cuda or gpu is not None):
            at = 0
            ids = list(block_ids) if block_ids is not None else None
            for m, par in zip(lens.tolist(), parents):
                status[at:at + m] = self.put(k[at:at + m], src, ids[at:at + m] if ids is not None else None,
                                             parent=par, gpu=gpu, stream=stream)
                at += m
            return status
        # All-zero parent rows are roots (the zero key is never a block's).
        par = empty_keys(lens.size)
        for j, p in enumerate(parents):
            if p is not None:
                par[j] = p if isinstance(p, np.ndarray) and p.shape == (2,) and p.dtype == np.uint64 else as_keys([p])[0]
                if not par[j].any():
                    raise ValueError(f"cxlkv: parent of chain {j} is the all-zero key, which is reserved")
        t0 = time.perf_counter()
        _keep, chp, cntp, nbytes = self._chunk_args(src, k, block_ids)
        with self._lock:
            rc = self._put_chains(self.handle, par.ctypes.data, lens.ctypes.data, lens.size, k.ctypes.data, n,
                                  nbytes, chp, cntp, status.ctypes.data)
        self._settle(rc, n, "cxlkv_kv_put_chains")
        if self.metrics:
            self.metrics.observe_store(int((status == RESERVED).sum()) * nbytes, int(put_ok(status).sum()),
                                       time.perf_counter() - t0)
        if self.remote is not None:
            # As put(): keys only, the tier's thread reads the blocks back.
            self.remote.publish(k, status, nbytes, parents=[p if p.any() else None for p in par],
                                chain_lens=lens.tolist())
        return status

    # ---- an engine step -----------------------------------------------------
    def put_engine_chains(self, namespace, hashes, chain_lens, parents, kv, block_ids, gpu=None, stream=None):
        """:meth:`put_chains` from an engine's own block hashes (keys as
        :func:`cxlkv.keys_from_hashes` in ``namespace``; ``parents`` hashes
        or None) into the :class:`PagedKV` ``kv``'s blocks ``block_ids``.  A
        CPU ``kv``: one C call hashes, builds the chunk lists and puts
        (``cxlkv_kv_engine_put_chains``, docs/engines.md "One call a step");
        a CUDA one goes through :meth:`put_chains`.  Returns the status array."""
        _rc, status = self.put_engine_step(namespace, hashes, chain_lens, parents, kv, block_ids, gpu=gpu,
                                           stream=stream)
        if isinstance(status, np.ndarray):
            return status
        return np.frombuffer(status, dtype=np.int32) if len(status) else np.zeros(0, dtype=np.int32)

    def put_engine_step(self, namespace, hashes, chain_lens, parents, kv, block_ids, gpu=None, stream=None):
        """:meth:`put_engine_chains` as an engine adapter calls it once a
        step: returns (the blocks in the pool now, written or there already;
        the statuses).  For a CPU ``kv`` the statuses are an
        ``array.array("i")``, no numpy on the way (docs/engines.md "One call
        a step"); a CUDA one goes through :meth:`put_chains`."""
        if kv.is_cuda or gpu is not None:
            ns = bytes(namespace)
            st = self.put_chains(keys_from_hashes(hashes, ns), chain_lens, _parent_keys(parents, ns), kv,
                                 block_ids, gpu=gpu, stream=stream)
            return int(np.count_nonzero(put_ok(st))), st
        n = len(hashes)
        if len(parents) != len(chain_lens):
            raise ValueError(f"cxlkv: {len(chain_lens)} chains but {len(parents)} parents")
        if len(block_ids) != n:
            raise ValueError(f"cxlkv: {n} hashes but {len(block_ids)} block ids")
        status = array.array("i", bytes(4 * n))
        if n == 0:
            return 0, status
        # array.array, not numpy, for the step's small arrays (encode_items says why).
        lens = _uints("I", chain_lens, "chain lengths")
        items, ilens = encode_items(hashes, parents)
        ids = _uints("Q", block_ids, "block ids")
        keys = empty_keys(n) if self.remote is not None else None
        ns = bytes(namespace)
        t0 = time.perf_counter()
        with self._lock:
            rc = self._engine_put(self.handle, C.addressof(kv.paged_chunks()), ns, len(ns), items, len(items),
                                  _addr(ilens), n, _addr(lens), len(lens), _addr(ids), _addr(status),
                                  keys.ctypes.data if keys is not None else None)
        self._settle(rc, n, self._what)
        if self.metrics:
            # rc: the blocks in the pool now (written or there already).
            self.metrics.observe_store(status.count(RESERVED) * kv.block_bytes, rc, time.perf_counter() - t0)
        if keys is not None:
            # As put(): the tier's thread reads the blocks back; the chains'
            # parents for the push policy (docs/remote.md "Pushing selectively").
            par = _parent_keys(parents, ns) if self.remote.policy.on else [None] * len(lens)
            self.remote.publish(keys, np.frombuffer(status, dtype=np.int32), kv.block_bytes, parents=par,
                                chain_lens=lens.tolist())
        return rc, status

    def put_paged_step(self, keys, chain_lens, parent_keys, kv, block_ids):
        """:meth:`put_engine_step` with the keys at hand instead of the
        hashes (a CPU ``kv``): ``keys`` the blocks' keys and ``parent_keys``
        one per chain (all-zero: a root), each as bytes of 16 per key (an
        (n, 2) uint64 key array's ``tobytes()``), made once by whoever had
        them (an engine's scheduler makes every rank's keys for its lookups;
        docs/engines.md "One call a step").  Returns (the blocks in the pool
        now, the statuses as an ``array.array("i")``)."""
        n = len(keys) // 16
        if len(keys) != 16 * n or len(parent_keys) != 16 * len(chain_lens):
            raise ValueError(f"cxlkv: {len(keys)} bytes of keys and {len(parent_keys)} of parent keys for "
                             f"{len(chain_lens)} chains: 16 bytes a key")
        if len(block_ids) != n:
            raise ValueError(f"cxlkv: {n} keys but {len(block_ids)} block ids")
        if kv.is_cuda:
            raise ValueError("cxlkv: put_paged_step takes a CPU PagedKV (a CUDA one: put_chains)")
        status = array.array("i", bytes(4 * n))
        if n == 0:
            return 0, status
        lens = _uints("I", chain_lens, "chain lengths")
        ids = _uints("Q", block_ids, "block ids")
        t0 = time.perf_counter()
        with self._lock:
            rc = self._paged_put(self.handle, C.addressof(kv.paged_chunks()), keys, n, parent_keys, _addr(lens),
                                 len(lens), _addr(ids), _addr(status))
        self._settle(rc, n, self._what)
        if self.metrics:
            self.metrics.observe_store(status.count(RESERVED) * kv.block_bytes, rc, time.perf_counter() - t0)
        if self.remote is not None:
            k = np.frombuffer(keys, dtype=np.uint64).reshape(n, 2)
            pk = np.frombuffer(parent_keys, dtype=np.uint64).reshape(-1, 2)
            par = [p if p.any() else None for p in pk] if self.remote.policy.on else [None] * len(lens)
            self.remote.publish(k, np.frombuffer(status, dtype=np.int32), kv.block_bytes, parents=par,
                                chain_lens=lens.tolist())
        return rc, status

    def get_engine(self, namespace, hashes, kv, block_ids, gpu=None, stream=None):
        """:meth:`get` of an engine's own block hashes (keys as
        :func:`cxlkv.keys_from_hashes` in ``namespace``) into the
        :class:`PagedKV` ``kv``'s blocks ``block_ids``: for a CPU ``kv`` one C
        call (``cxlkv_kv_engine_get_many``).  Returns the status array."""
        n = len(hashes)
        if kv.is_cuda or gpu is not None:
            return self.get(keys_from_hashes(hashes, bytes(namespace)), kv, block_ids, gpu=gpu, stream=stream)
        if len(block_ids) != n:
            raise ValueError(f"cxlkv: {n} hashes but {len(block_ids)} block ids")
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        _require_writable(kv)
        items, ilens = encode_items(hashes)
        ids = _uints("Q", block_ids, "block ids")
        status = array.array("i", bytes(4 * n))
        ns = bytes(namespace)
        t0 = time.perf_counter()
        with self._lock:
            rc = self._engine_get(self.handle, C.addressof(kv.paged_chunks()), ns, len(ns), items, len(items),
                                  _addr(ilens), n, _addr(ids), _addr(status))
        self._settle(rc, n, self._what)
        if self.metrics:
            self.metrics.observe_load(status.count(RESERVED) * kv.block_bytes, time.perf_counter() - t0)
        return np.frombuffer(status, dtype=np.int32)

    def get_paged_step(self, keys, kv, block_ids):
        """:meth:`get_engine` with the keys at hand (bytes, 16 a key, as
        :meth:`put_paged_step` takes them) into the CPU :class:`PagedKV`
        ``kv``'s blocks ``block_ids``: one C call
        (``cxlkv_kv_paged_get_many``).  Returns the statuses as an
        ``array.array("i")``."""
        n = len(keys) // 16
        if len(keys) != 16 * n:
            raise ValueError(f"cxlkv: {len(keys)} bytes of keys: 16 bytes a key")
        if len(block_ids) != n:
            raise ValueError(f"cxlkv: {n} keys but {len(block_ids)} block ids")
        if kv.is_cuda:
            raise ValueError("cxlkv: get_paged_step takes a CPU PagedKV (a CUDA one: get)")
        _require_writable(kv)
        status = array.array("i", bytes(4 * n))
        if n == 0:
            return status
        ids = _uints("Q", block_ids, "block ids")
        t0 = time.perf_counter()
        with self._lock:
            rc = self._paged_get(self.handle, C.addressof(kv.paged_chunks()), keys, n, _addr(ids), _addr(status))
        self._settle(rc, n, self._what)
        if self.metrics:
            self.metrics.observe_load(status.count(RESERVED) * kv.block_bytes, time.perf_counter() - t0)
        return status

    def get(self, keys, dst, block_ids=None, gpu=None, stream=None):
        """Read blocks ``keys`` into ``dst`` (a :class:`PagedKV` with
        ``block_ids``, or one buffer per key).  Returns the status array:
        RESERVED (0) for a block read, MISS for one not cached; ``get_ok()``."""
        k = as_keys(keys)
        n = len(k)
        status = np.zeros(n, dtype=np.int32)
        if n == 0:
            return status
        t0 = time.perf_counter()
        if isinstance(dst, PagedKV) and (dst.is_cuda or gpu is not None):
            nbytes = self._gpu_get(k, dst, block_ids, gpu, stream, status)
        else:
            _keep, chp, cntp, nbytes = self._chunk_args(dst, k, block_ids, writable=True)
            with self._lock:
                rc = self._get_many(self.handle, k.ctypes.data, n, chp, cntp, status.ctypes.data)
            self._settle(rc, n, "cxlkv_kv_get_many")
        if self.metrics:
            self.metrics.observe_load(int(get_ok(status).sum()) * nbytes, time.perf_counter() - t0)
        return status

    # ---- GPU ------------------------------------------------------------------
    def _gpu_put(self, k, par, kv, block_ids, gpu, stream, status):
        if gpu is None:
            raise ValueError("cxlkv: a CUDA transfer needs a cxlkv.Gpu (the pool pinned for DMA)")
        ids = kv.block_id_array(block_ids)
        if ids.size != len(k):
            raise ValueError(f"cxlkv: {len(k)} keys but {ids.size} block ids")
        lay, _keep = kv.gpu_layout()
        s = stream if stream is not None else _current_stream(kv)
        with self._lock:
            rc = self._lib.cxlkv_kv_gpu_put_chain(self.handle, gpu.handle, C.byref(lay),
                                                  _kp(par) if par is not None else None, _kp(k),
                                                  ids.ctypes.data_as(_U64P), len(k), s, status.ctypes.data_as(_I32P))
        self._settle(rc, len(k), "cxlkv_kv_gpu_put_chain")
        return kv.block_bytes

    def _gpu_get(self, k, kv, block_ids, gpu, stream, status):
        if gpu is None:
            raise ValueError("cxlkv: a CUDA transfer needs a cxlkv.Gpu (the pool pinned for DMA)")
        ids = kv.block_id_array(block_ids)
        if ids.size != len(k):
            raise ValueError(f"cxlkv: {len(k)} keys but {ids.size} block ids")
        lay, _keep = kv.gpu_layout()
        s = stream if stream is not None else _current_stream(kv)
        with self._lock:
            rc = self._lib.cxlkv_kv_gpu_get_many(self.handle, gpu.handle, C.byref(lay), _kp(k),
                                                 ids.ctypes.data_as(_U64P), len(k), s, status.ctypes.data_as(_I32P))
        self._settle(rc, len(k), "cxlkv_kv_gpu_get_many")
        return kv.block_bytes

    # ---- pins -----------------------------------------------------------------
    def pin(self, keys):
        """Pin blocks (they are not evicted while pinned): a :class:`Pins`
        context manager that unpins on exit.  ``pins.status`` has RESERVED
        for a pinned block, MISS for one not cached."""
        k = as_keys(keys)
        blocks = (_lib.KvBlock * max(len(k), 1))()
        status = np.zeros(len(k), dtype=np.int32)
        with self._lock:
            rc = self._lib.cxlkv_kv_pin_many(self.handle, _kp(k), len(k), blocks, status.ctypes.data_as(_I32P))
            _lib.check(rc, "cxlkv_kv_pin_many")
            return Pins(self, k, blocks, status)

    # ---- leases -----------------------------------------------------------------
    def lease(self, keys, consumer_id, consumer_node=NODE_ANY, ttl_ms=30000):
        """Lease published blocks to a consumer (a request id; optionally its
        node): they are not evicted until released, expired, or the consumer
        node dies.  Returns the status array."""
        k = as_keys(keys)
        consumer_id = _uint(consumer_id, 64, "lease consumer_id")
        consumer_node = _uint(consumer_node, 32, "lease consumer_node")
        ttl_ms = _uint(ttl_ms, 32, "lease ttl_ms")
        status = np.zeros(len(k), dtype=np.int32)
        with self._lock:
            _lib.check(self._lib.cxlkv_kv_lease(self.handle, _kp(k), len(k), consumer_id, consumer_node, ttl_ms,
                                                status.ctypes.data_as(_I32P)), "cxlkv_kv_lease")
        return status

    def lease_release(self, keys, consumer_id):
        """The consumer's release of its lease on ``keys``.  Per block:
        RESERVED (released), ``-ETIMEDOUT`` (the lease had ended: its ttl
        passed or its consumer node died; counted in the metrics'
        ``cxlkv_client_lease_expiries_total``), MISS (not cached), ``-ENOENT``
        (not leased to this consumer)."""
        k = as_keys(keys)
        consumer_id = _uint(consumer_id, 64, "lease consumer_id")
        status = np.zeros(len(k), dtype=np.int32)
        with self._lock:
            _lib.check(self._lib.cxlkv_kv_lease_release(self.handle, _kp(k), len(k), consumer_id,
                                                        status.ctypes.data_as(_I32P)), "cxlkv_kv_lease_release")
        if self.metrics:
            ended = int((status == -errno.ETIMEDOUT).sum())
            if ended:
                self.metrics.inc("cxlkv_client_lease_expiries_total", ended)
        return status

    # ---- stats -------------------------------------------------------------------
    def stats(self):
        """This handle's counters (dict); the pool-wide view is
        :meth:`cxlkv.Pool.prometheus`."""
        s = _lib.KvStats()
        s.size = C.sizeof(s)
        with self._lock:
            _lib.check(self._lib.cxlkv_kv_stats(self.handle, C.byref(s)), "cxlkv_kv_stats")
        out = {name: getattr(s, name) for name, _ in _lib.KvStats._fields_ if name != "size"}
        if self.remote is not None:
            out.update(self.remote.stats())
        return out


class Pins:
    """Pinned blocks (from :meth:`KvStore.pin`); unpinned by :meth:`release`
    or on leaving the ``with`` block."""

    def __init__(self, store, keys, blocks, status):
        self.store, self.keys, self._blocks, self.status = store, keys, blocks, status
        self._released = False
        self._given_back = np.zeros(len(keys), dtype=bool)  # unpinned one by one (release(which))
        store._held.add(self)

    def _release_for_store(self):
        self.release()

    @property
    def pinned(self):
        """Boolean mask of the blocks that are pinned (and not given back by
        a partial :meth:`release`)."""
        return (self.status == RESERVED) & ~self._given_back

    def lengths(self):
        """Bytes of each pinned block (uint64 array; 0 for a block not pinned)."""
        return np.array([self._blocks[i].length for i in range(len(self.keys))], dtype=np.uint64)

    def fetch(self, dst, block_ids=None):
        """Read the pinned blocks into ``dst`` (PagedKV + block_ids, or buffers);
        returns the status array (blocks not pinned keep their status)."""
        st = self.status.copy()
        ch, counts, _ = self.store._chunks(dst, self.keys, block_ids, writable=True)
        L = self.store._lib
        if self._released:
            raise ValueError("cxlkv: fetch of pins already released")
        # Blocks not pinned are skipped by the C call (their handle status is not 0).
        with self.store._lock:
            _lib.check(L.cxlkv_kv_fetch_many(self.store.handle, self._blocks, len(self.keys), ch.ctypes.data_as(_CHP),
                                             counts.ctypes.data_as(_U32P), st.ctypes.data_as(_I32P)),
                       "cxlkv_kv_fetch_many")
        return st

    def release(self, which=None):
        """Unpin (each block once; later calls do nothing).  ``which``: the
        indices of the blocks to unpin now (default: all still pinned); the
        others stay pinned, so the blocks of one batched pin can be given
        back at different times (LMCache unlocks per key).  After the store
        closed there is nothing to unpin: closing detached the node and its
        pins."""
        with self.store._lock:
            if self._released or not self.store._h:
                return
            if which is not None:
                self._release_some(which)
                return
            self._released = True
            self.store._held.discard(self)
            # One call; handles of blocks that were not pinned are skipped by it.
            out = np.zeros(len(self.keys), dtype=np.int32)
            if len(self.keys):
                self.store._lib.cxlkv_kv_unpin_many(self.store.handle, self._blocks, len(self.keys),
                                                    out.ctypes.data_as(_I32P))

    def _release_some(self, which):
        # caller holds the store's lock
        idx = sorted({int(i) for i in which})
        if idx and not 0 <= idx[0] <= idx[-1] < len(self.keys):
            raise IndexError(f"cxlkv: release of pins {idx}: these pins hold {len(self.keys)} blocks (0 .. "
                             f"{len(self.keys) - 1})")
        idx = [i for i in idx if self.status[i] == RESERVED and not self._given_back[i]]
        if idx:
            part = (_lib.KvBlock * len(idx))(*[self._blocks[i] for i in idx])
            out = np.zeros(len(idx), dtype=np.int32)
            self.store._lib.cxlkv_kv_unpin_many(self.store.handle, part, len(idx), out.ctypes.data_as(_I32P))
            for i in idx:
                self._given_back[i] = True
                # A handle whose status is not RESERVED is skipped by the C
                # calls: a later fetch or full release leaves these alone.
                self._blocks[i].status = MISS
        if not ((self.status == RESERVED) & ~self._given_back).any():
            self._released = True
            self.store._held.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass
