# SPDX-License-Identifier: MIT
"""cxlkv: a KV cache for LLM serving in a memory pool shared by several hosts
(CXL memory, or a shared-memory file for development), from Python.

Pure Python over ``libcxlkv.so`` (ctypes); found through ``$CXLKV_LIB``,
beside the package, the source tree's ``build/``, or the library path.

    import cxlkv
    cxlkv.Pool.format("shm:demo:1073741824")
    pool = cxlkv.Pool("shm:demo:1073741824")
    mgr = cxlkv.LockManager(pool)            # or run cxlkvd
    kv = cxlkv.KvStore(pool, node=1)
    keys = cxlkv.block_keys(token_ids, 16)
    cache = cxlkv.PagedKV.vllm(kv_caches)    # PyTorch tensors, CPU or CUDA
    kv.put(keys, cache, block_ids)           # one C call for the whole chain
    hit = kv.lookup(keys)
    kv.get(keys[:hit], cache, other_block_ids)

Engine adapters: :mod:`cxlkv.integrations.vllm`, :mod:`cxlkv.integrations.sglang`,
:mod:`cxlkv.integrations.lmcache`.  Asynchronous batches: :mod:`cxlkv.aio`.
Metrics: :mod:`cxlkv.metrics`.
"""
from ._lib import BUSY, CANCELED, EXISTS, MISS, NODE_ANY, RESERVED, CxlkvError, last_error
from .keys import as_keys, block_keys, engine_key, keys_from_hashes, namespace, to_hex, to_int
from .kv import Gpu, KvStore, Pins, get_ok, put_ok, status_name
from .layout import PagedKV
from .pool import LockManager, Pool
from . import aio, metrics  # noqa: E402,F401
from . import pnm  # noqa: E402,F401
from . import layerwise  # noqa: E402,F401  (docs/gpu.md "Layer-wise transfers"; layer-wise GPU load / save)

__version__ = "0.1.0"

__all__ = [
    "Pool", "LockManager", "KvStore", "Pins", "Gpu", "PagedKV", "CxlkvError", "last_error",
    "block_keys", "keys_from_hashes", "engine_key", "namespace", "as_keys", "to_hex", "to_int",
    "put_ok", "get_ok", "status_name", "RESERVED", "EXISTS", "BUSY", "MISS", "CANCELED", "NODE_ANY",
]
