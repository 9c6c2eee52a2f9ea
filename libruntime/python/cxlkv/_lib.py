# SPDX-License-Identifier: MIT
"""ctypes bindings of libcxlkv.so (the C API of cxlkv.h): structs, prototypes,
the library search, and errors raised as CxlkvError with cxlkv_last_error().

Nothing here is public API; use the classes of the cxlkv package.
"""
import ctypes as C
import ctypes.util
import errno as _errno
import os
import threading

# ---- per-block status codes (cxlkv.h; docs/coherence.md "PrefixIndex batch interface")
# C, C++ and Python share them.
RESERVED = 0   #: this caller writes it / the operation succeeded on it
EXISTS = 1     #: already READY: nothing to write
BUSY = 2       #: another node is writing it
MISS = 3       #: not cached (pin / fetch of a block that is not READY)
CANCELED = -_errno.ECANCELED  #: not attempted: an earlier block of the same chain failed

NODE_ANY = 0xFFFFFFFF

FORMAT_F_FORCE = 1 << 0
GPU_LAYOUT_LAYER_FIRST = 0
GPU_LAYOUT_BLOCK_FIRST = 1
GPU_F_CPU_REFERENCE = 1 << 0


class CxlkvError(OSError):
    """A cxlkv C call failed.  ``errno`` is the positive errno, ``strerror`` the
    library's message (cxlkv_last_error(): names the object and the cause)."""

    def __init__(self, rc, what, message=""):
        err = -rc if rc < 0 else rc
        text = f"{what}: {message}" if message else f"{what}: {os.strerror(err)}"
        super().__init__(err, text)
        self.what = what
        self.message = message


class Chunk(C.Structure):
    _fields_ = [("addr", C.c_void_p), ("len", C.c_size_t)]


class PagedChunks(C.Structure):
    """struct cxlkv_paged_chunks: engine block b's chunk i at addr[i] + b * stride[i]."""
    _fields_ = [("size", C.c_size_t), ("nchunks", C.c_size_t), ("addr", C.c_void_p), ("stride", C.c_void_p),
                ("len", C.c_void_p), ("num_blocks", C.c_uint64)]


class FormatOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("pool_size", C.c_uint64), ("max_nodes", C.c_uint32),
                ("flags", C.c_uint32), ("max_locks", C.c_uint32), ("reserved", C.c_uint32),
                ("index_entries", C.c_uint64)]


class CarveInfo(C.Structure):
    _fields_ = [("name", C.c_char * 32), ("offset", C.c_uint64), ("size", C.c_uint64),
                ("memtype", C.c_uint32), ("flags", C.c_uint32)]


class LockManagerOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("node", C.c_uint32), ("lease_ms", C.c_uint32),
                ("flags", C.c_uint32), ("reserved", C.c_uint32)]


class KvOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("node", C.c_uint32), ("flags", C.c_uint32)]


class KvKey(C.Structure):
    _fields_ = [("lo", C.c_uint64), ("hi", C.c_uint64)]


class KvBlock(C.Structure):
    """struct cxlkv_kv_block (48 bytes): a reservation or a pin."""
    _fields_ = [("key", KvKey), ("slot", C.c_uint32), ("status", C.c_uint32), ("length", C.c_uint64),
                ("loc_off", C.c_uint64), ("loc_dev", C.c_uint8), ("loc_tier", C.c_uint8),
                ("pin_tag", C.c_uint16), ("version", C.c_uint32)]


assert C.sizeof(KvBlock) == 48


class KvStats(C.Structure):
    _fields_ = [("size", C.c_size_t)] + [(n, C.c_uint64) for n in (
        "lookups", "hit_blocks", "miss_blocks", "reserves", "publishes", "fetches", "evictions", "reclaims",
        "bytes_in", "bytes_out", "nospc", "errors")] + [(n, C.c_double) for n in (
        "lookup_us_p50", "lookup_us_p99", "publish_us_p50", "publish_us_p99", "fetch_us_p50", "fetch_us_p99")]


class GpuLayout(C.Structure):
    _fields_ = [("size", C.c_size_t), ("kind", C.c_uint32), ("num_layers", C.c_uint32),
                ("num_kv_heads", C.c_uint32), ("head_size", C.c_uint32), ("block_tokens", C.c_uint32),
                ("elem_bytes", C.c_uint32), ("num_blocks", C.c_uint64), ("block_stride", C.c_uint64),
                ("tensors", C.POINTER(C.c_uint64)), ("ntensors", C.c_size_t)]


class GpuOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("flags", C.c_uint32), ("device", C.c_int32),
                ("pin_chunk_bytes", C.c_uint64)]


_P = C.c_void_p
_I = C.c_int
_SZ = C.c_size_t
_U32 = C.c_uint32
_U64 = C.c_uint64
_KEYP = C.POINTER(KvKey)
_BLKP = C.POINTER(KvBlock)
_CHP = C.POINTER(Chunk)
_U32P = C.POINTER(C.c_uint32)
_U64P = C.POINTER(C.c_uint64)
_I32P = C.POINTER(C.c_int32)
_LAYP = C.POINTER(GpuLayout)

# name: (restype, argtypes, required)
_PROTOS = {
    "cxlkv_last_error": (C.c_char_p, [], True),
    "cxlkv_pool_format": (_I, [C.c_char_p, C.POINTER(FormatOpts)], True),
    "cxlkv_pool_open": (_I, [C.c_char_p, C.POINTER(_P)], True),
    "cxlkv_pool_close": (None, [_P], True),
    "cxlkv_pool_base": (_P, [_P], True),
    "cxlkv_pool_size": (_U64, [_P], True),
    "cxlkv_carve_list": (_I, [_P, C.POINTER(CarveInfo), _I], True),
    "cxlkv_lock_manager_start": (_I, [_P, C.POINTER(LockManagerOpts), C.POINTER(_P)], True),
    "cxlkv_lock_manager_stop": (None, [_P], True),
    "cxlkv_node_remove_local": (_I, [_P, _U32], True),
    "cxlkv_kv_open": (_I, [_P, C.POINTER(KvOpts), C.POINTER(_P)], True),
    "cxlkv_kv_close": (None, [_P], True),
    "cxlkv_kv_block_keys": (_I, [_U32P, _SZ, _SZ, _P, _SZ, _KEYP, _SZ], True),
    "cxlkv_kv_lookup": (_I, [_P, _KEYP, _SZ], True),
    "cxlkv_checksum64": (_U64, [_P, _SZ], False),
    "cxlkv_kv_reserve": (_I, [_P, _KEYP, _KEYP, _U64, _BLKP], True),
    "cxlkv_kv_write": (_I, [_P, _BLKP, _CHP, _SZ], True),
    "cxlkv_kv_publish": (_I, [_P, _BLKP], True),
    "cxlkv_kv_abort": (_I, [_P, _BLKP], True),
    "cxlkv_kv_pin": (_I, [_P, _KEYP, _BLKP], True),
    "cxlkv_kv_fetch": (_I, [_P, _BLKP, _CHP, _SZ], True),
    "cxlkv_kv_unpin": (_I, [_P, _BLKP], True),
    "cxlkv_kv_stats": (_I, [_P, C.POINTER(KvStats)], True),
    # reserved blocks written in place (docs/remote.md "Straight from the pool")
    "cxlkv_kv_reserved_addrs": (_I, [_P, _BLKP, _SZ, C.POINTER(_P), _I32P], False),
    "cxlkv_kv_flush_in_place": (_I, [_P, _BLKP, _SZ, _I32P], False),
    # the node's remote tier counters in the pool (docs/remote.md "Counters")
    "cxlkv_kv_remote_count": (_I, [_P, C.c_char_p, _U64], False),
    # batch interface (docs/coherence.md "PrefixIndex batch interface")
    "cxlkv_kv_reserve_chain": (_I, [_P, _KEYP, _KEYP, _SZ, _U64, _BLKP, _I32P], True),
    "cxlkv_kv_write_many": (_I, [_P, _BLKP, _SZ, _CHP, _U32P, _I32P], True),
    "cxlkv_kv_publish_many": (_I, [_P, _BLKP, _SZ, _I32P], True),
    "cxlkv_kv_abort_many": (_I, [_P, _BLKP, _SZ, _I32P], True),
    "cxlkv_kv_pin_many": (_I, [_P, _KEYP, _SZ, _BLKP, _I32P], True),
    "cxlkv_kv_fetch_many": (_I, [_P, _BLKP, _SZ, _CHP, _U32P, _I32P], True),
    "cxlkv_kv_unpin_many": (_I, [_P, _BLKP, _SZ, _I32P], True),
    "cxlkv_kv_put_chain": (_I, [_P, _KEYP, _KEYP, _SZ, _U64, _CHP, _U32P, _I32P], True),
    "cxlkv_kv_get_many": (_I, [_P, _KEYP, _SZ, _CHP, _U32P, _I32P], True),
    # raw copies between chunk lists (given as addresses) and a pool offset
    "cxlkv_gather_write": (_I, [_P, _U64, _P, _SZ], True),
    "cxlkv_scatter_read": (_I, [_P, _U64, _P, _SZ], True),
    "cxlkv_kv_gpu_put_chain": (_I, [_P, _P, _LAYP, _KEYP, _KEYP, _U64P, _SZ, _P, _I32P], True),
    "cxlkv_kv_gpu_get_many": (_I, [_P, _P, _LAYP, _KEYP, _U64P, _SZ, _P, _I32P], True),
    # handoff leases
    "cxlkv_kv_lease": (_I, [_P, _KEYP, _SZ, _U64, _U32, _U32, _I32P], True),
    "cxlkv_kv_lease_release": (_I, [_P, _KEYP, _SZ, _U64, _I32P], True),
    # metrics: one Prometheus exposition shared with `cxlkvctl stats --prometheus`
    "cxlkv_stats_prometheus": (_I, [_P, C.c_char_p, _SZ], True),
    # GPU path
    "cxlkv_gpu_probe": (_I, [C.c_char_p, _SZ], True),
    "cxlkv_gpu_open": (_I, [_P, _U64, C.POINTER(GpuOpts), C.POINTER(_P)], True),
    "cxlkv_gpu_open_pool": (_I, [_P, C.POINTER(GpuOpts), C.POINTER(_P)], True),
    "cxlkv_gpu_close": (None, [_P], True),
    "cxlkv_gpu_pin_method": (C.c_char_p, [_P], True),
    "cxlkv_gpu_layout_block_bytes": (_U64, [_LAYP], True),
    "cxlkv_gpu_gather": (_I, [_P, _LAYP, _U64P, _U64P, _SZ, _P], True),
    "cxlkv_gpu_scatter": (_I, [_P, _LAYP, _U64P, _U64P, _SZ, _P], True),
    "cxlkv_gpu_sync": (_I, [_P, _P], True),
}

_lib = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get("CXLKV_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "libcxlkv.so")]
    # In-tree use: libruntime/python/cxlkv -> build/libruntime/libcxlkv.so
    root = os.path.abspath(os.path.join(here, "..", "..", ".."))
    build = os.environ.get("CXLKV_BUILD", os.path.join(root, "build"))
    out.append(os.path.join(build, "libruntime", "libcxlkv.so"))
    found = ctypes.util.find_library("cxlkv")
    if found:
        out.append(found)
    out.append("libcxlkv.so")
    return out


def lib():
    """The loaded libcxlkv (searched in $CXLKV_LIB, beside the package, the
    source tree's build/, then the system library path)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        handle = None
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                errors.append(f"{path}: not found")
                continue
            try:
                handle = C.CDLL(path)
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if handle is None:
            raise ImportError("cxlkv: cannot load libcxlkv.so (set CXLKV_LIB): " + "; ".join(errors))
        for name, (res, args, required) in _PROTOS.items():
            fn = getattr(handle, name, None)
            if fn is None:
                if required:
                    raise ImportError(f"cxlkv: {handle._name} lacks {name} (library too old)")
                continue
            fn.restype = res
            fn.argtypes = args
        _lib = handle
        return _lib


class Handle:
    """A C handle opened over a pool, shared by its Python owner and the pool.

    The pool keeps its handles with strong references (this small object,
    not the owner), so closing the pool closes every handle still open even
    when the owner is unreachable garbage whose weak references the
    collector already cleared (interpreter exit): the pool is never unmapped
    under a live handle (its heartbeat and watcher threads crashed on it).
    ``close_fn(h)`` runs once, under ``lock`` (the owner's lock for its C
    calls)."""

    __slots__ = ("h", "close_fn", "rank", "lock")

    def __init__(self, close_fn, rank, lock=None):
        self.h = C.c_void_p()
        self.close_fn = close_fn
        self.rank = rank
        self.lock = lock if lock is not None else threading.RLock()

    def close(self):
        with self.lock:
            if self.h:
                h, self.h = self.h, C.c_void_p()
                self.close_fn(h)


def has(name):
    """Whether the loaded library exports C function `name`."""
    return hasattr(lib(), name)


def last_error():
    """The C library's message about the last failed call of this thread
    (``cxlkv_last_error()``; "" if none)."""
    return (lib().cxlkv_last_error() or b"").decode(errors="replace")


def check(rc, what):
    """Raise CxlkvError for a negative return code; return rc otherwise."""
    if rc < 0:
        raise CxlkvError(rc, what, last_error())
    return rc
