# SPDX-License-Identifier: MIT
"""Layer-wise GPU load and save (docs/gpu.md "Layer-wise transfers"): a prefix hit's KV arrives layer
group by layer group, each with a CUDA event, so the engine computes layer 0
while later layers still travel (vLLM's ``wait_for_layer_load``, LMCache's
layer-wise mode); a prefill saves layer by layer as it produces them, and
the blocks are published only after the last layer's copy completed.

    load = cxlkv.layerwise.load_layers(kv, keys, cache, block_ids, gpu, layers_per_group=1)
    for layer in range(n_layers):
        load.stream_wait(layer)          # the compute stream waits on the GPU, not the host
        ... attention of `layer` ...
    status = load.finish()               # unpins

    save = cxlkv.layerwise.save_layers(kv, keys, cache, block_ids, gpu, parent=None)
    for layer in range(n_layers):
        ... compute `layer` ...
        save.save_layer(layer)           # enqueued on the current stream after the compute
    status = save.finish()               # waits for the copies, then publishes (rule 5)

Each is one C call to start, one per layer, one to finish (never per block).
Statuses are those of :meth:`KvStore.get` / :meth:`KvStore.put`.
"""
import contextlib
import ctypes as C

import numpy as np

from . import _lib
from .keys import as_keys
from .layout import PagedKV

__all__ = ["LayerLoad", "LayerSave", "load_layers", "save_layers"]

_P, _I, _SZ, _U32 = C.c_void_p, C.c_int, C.c_size_t, C.c_uint32
_KEYP = C.POINTER(_lib.KvKey)
_U64P = C.POINTER(C.c_uint64)
_I32P = C.POINTER(C.c_int32)
_LAYP = C.POINTER(_lib.GpuLayout)

_PROTOS = {
    "cxlkv_kv_gpu_load_layers": (_I, [_P, _P, _LAYP, _KEYP, _U64P, _SZ, _U32, _P, _I32P, C.POINTER(_P)]),
    "cxlkv_gpu_load_groups": (_I, [_P]),
    "cxlkv_gpu_load_wait": (_I, [_P, _U32]),
    "cxlkv_gpu_load_stream_wait": (_I, [_P, _U32, _P]),
    "cxlkv_gpu_load_ready": (_I, [_P, _U32]),
    "cxlkv_gpu_load_event": (_P, [_P, _U32]),
    "cxlkv_gpu_load_finish": (_I, [_P, _I32P]),
    "cxlkv_kv_gpu_save_begin": (_I, [_P, _P, _LAYP, _KEYP, _KEYP, _U64P, _SZ, _I32P, C.POINTER(_P)]),
    "cxlkv_gpu_save_layer": (_I, [_P, _U32, _P]),
    "cxlkv_gpu_save_finish": (_I, [_P, _I32P]),
    "cxlkv_gpu_save_abort": (None, [_P]),
}
_bound = None


def _L():
    """libcxlkv with the layer-wise prototypes declared."""
    global _bound
    L = _lib.lib()
    if _bound is not L:
        for name, (res, args) in _PROTOS.items():
            f = getattr(L, name)
            f.restype = res
            f.argtypes = args
        _bound = L
    return L


def _stream(kv, stream):
    if stream is not None:
        return stream if isinstance(stream, C.c_void_p) else C.c_void_p(int(stream))
    if not kv.is_cuda:
        return None
    import torch
    return C.c_void_p(torch.cuda.current_stream().cuda_stream)


def _store_lock(store):
    """The store's lock (its C session is used by the call), or nothing."""
    return store._lock if store is not None else contextlib.nullcontext()


def _args(keys, kv, block_ids, gpu):
    if not isinstance(kv, PagedKV):
        raise TypeError("cxlkv.layerwise: the KV cache must be a cxlkv.PagedKV")
    if gpu is None:
        raise ValueError("cxlkv.layerwise: a cxlkv.Gpu (the pool opened for DMA) is required")
    k = as_keys(keys)
    ids = kv.block_id_array(block_ids)
    if ids.size != len(k):
        raise ValueError(f"cxlkv.layerwise: {len(k)} keys but {ids.size} block ids")
    lay, keep = kv.gpu_layout()
    return k, ids, lay, keep


class LayerLoad:
    """A layer-wise load in progress.  ``status`` has the per-block status of
    the start (0 loading, MISS, -errno), ``loading`` the blocks being loaded,
    ``groups`` the number of layer groups (one event each)."""

    def __init__(self, h, n, status, loading, kv, store=None):
        self._h = h
        self._n = n
        self.status = status
        self.loading = loading
        self._kv = kv
        self._store = store
        self.groups = _L().cxlkv_gpu_load_groups(h)
        if store is not None:
            store._held.add(self)  # closing the store finishes it (its pins) first

    def _release_for_store(self):
        if self._h:
            self.finish()

    def _live(self):
        if not self._h:
            raise ValueError("cxlkv.layerwise: the load is finished")
        return self._h

    def wait(self, layer):
        """Block this thread until ``layer`` is in place."""
        _lib.check(_L().cxlkv_gpu_load_wait(self._live(), layer), f"wait for layer {layer}")

    def stream_wait(self, layer, stream=None):
        """Make later work on ``stream`` (default: the current CUDA stream)
        wait on the GPU until ``layer`` is in place."""
        _lib.check(_L().cxlkv_gpu_load_stream_wait(self._live(), layer, _stream(self._kv, stream)),
                   f"stream wait for layer {layer}")

    def ready(self, layer):
        """Whether ``layer`` is in place (does not wait)."""
        return _lib.check(_L().cxlkv_gpu_load_ready(self._live(), layer), f"layer {layer} ready") == 1

    def event(self, layer):
        """The ``cudaEvent_t`` (an int) recorded after ``layer``'s group;
        valid until :meth:`finish`.  E.g. ``torch.cuda.ExternalEvent``-style
        use, or cudaStreamWaitEvent through another binding."""
        return _L().cxlkv_gpu_load_event(self._live(), layer) or 0

    def finish(self):
        """Wait for every group, unpin; returns the final status array (as
        :meth:`KvStore.get`: 0 loaded, MISS, -errno).  Once."""
        with _store_lock(self._store):
            h = self._live()
            self._h = None
            st = np.zeros(self._n, dtype=np.int32)
            _lib.check(_L().cxlkv_gpu_load_finish(h, st.ctypes.data_as(_I32P)), "cxlkv_gpu_load_finish")
        self.status = st
        return st

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._h:
            self.finish()

    def __del__(self):
        if getattr(self, "_h", None):
            try:
                self.finish()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class LayerSave:
    """A layer-wise save in progress.  ``status`` has the reservation of
    every block (RESERVED: this save writes it, EXISTS, BUSY, -errno)."""

    def __init__(self, h, n, status, kv, layers, store=None):
        self._h = h
        self._n = n
        self.status = status
        self._kv = kv
        self.layers = layers
        self._store = store
        if store is not None:
            store._held.add(self)  # closing the store aborts it (its reservations) first

    def _release_for_store(self):
        self.abort()

    def _live(self):
        if not self._h:
            raise ValueError("cxlkv.layerwise: the save is finished")
        return self._h

    def save_layer(self, layer, stream=None):
        """Gather ``layer`` of every reserved block, enqueued on ``stream``
        (default: the current CUDA stream) after the work that produced it."""
        _lib.check(_L().cxlkv_gpu_save_layer(self._live(), layer, _stream(self._kv, stream)),
                   f"save layer {layer}")

    def finish(self):
        """Wait for every layer's copy, then publish (parents first); blocks
        whose layers were not all saved are aborted (-ENODATA).  Returns the
        status array as :meth:`KvStore.put`.  Once."""
        with _store_lock(self._store):
            h = self._live()
            self._h = None
            st = np.zeros(self._n, dtype=np.int32)
            _lib.check(_L().cxlkv_gpu_save_finish(h, st.ctypes.data_as(_I32P)), "cxlkv_gpu_save_finish")
        self.status = st
        return st

    def abort(self):
        """Release every reservation (after the enqueued copies completed)."""
        with _store_lock(self._store):
            if self._h:
                h, self._h = self._h, None
                _L().cxlkv_gpu_save_abort(h)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.abort()
        elif self._h:
            self.finish()

    def __del__(self):
        if getattr(self, "_h", None):
            self.abort()


def load_layers(store, keys, dst, block_ids, gpu, layers_per_group=1, stream=None):
    """Start loading blocks ``keys`` into GPU blocks ``block_ids`` of ``dst``
    (a CUDA :class:`PagedKV`), ``layers_per_group`` layers per group, on
    ``stream`` (default: the current CUDA stream).  Returns a
    :class:`LayerLoad`."""
    k, ids, lay, _keep = _args(keys, dst, block_ids, gpu)
    n = len(k)
    st = np.zeros(n, dtype=np.int32)
    h = C.c_void_p()
    with store._lock:
        rc = _L().cxlkv_kv_gpu_load_layers(store.handle, gpu.handle, C.byref(lay), k.ctypes.data_as(_KEYP),
                                           ids.ctypes.data_as(_U64P), n, int(layers_per_group), _stream(dst, stream),
                                           st.ctypes.data_as(_I32P), C.byref(h))
        _lib.check(rc, "cxlkv_kv_gpu_load_layers")
        return LayerLoad(h, n, st, rc, dst, store)


def save_layers(store, keys, src, block_ids, gpu, parent=None):
    """Reserve blocks ``keys`` (a chain below ``parent``) for GPU blocks
    ``block_ids`` of ``src`` (a CUDA :class:`PagedKV`).  Returns a
    :class:`LayerSave`; call ``save_layer`` per layer, then ``finish``."""
    k, ids, lay, _keep = _args(keys, src, block_ids, gpu)
    n = len(k)
    par = as_keys([parent]) if parent is not None else None
    st = np.zeros(n, dtype=np.int32)
    h = C.c_void_p()
    with store._lock:
        rc = _L().cxlkv_kv_gpu_save_begin(store.handle, gpu.handle, C.byref(lay),
                                          par.ctypes.data_as(_KEYP) if par is not None else None,
                                          k.ctypes.data_as(_KEYP), ids.ctypes.data_as(_U64P), n,
                                          st.ctypes.data_as(_I32P), C.byref(h))
        _lib.check(rc, "cxlkv_kv_gpu_save_begin")
        return LayerSave(h, n, st, src, lay.num_layers, store)
