# SPDX-License-Identifier: MIT
"""LMCache multiprocess-mode native plugin over a cxlkv pool (written against
LMCache's native-connector protocol of the L2 adapters,
``lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py``,
LMCache 0.3.x: ``event_fd``, ``submit_batch_get``, ``submit_batch_set``,
``submit_batch_exists``, ``drain_completions``, ``close``).

Turn it on with an L2 adapter of the LMCache server (multiprocess mode; the
engine side keeps LMCache's own connector)::

    python -m lmcache.v1.multiprocess.server ... --l2-adapter \
        '{"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache",
          "class_name": "CxlkvNativePlugin",
          "adapter_params": {"pool": "dax:/dev/dax0.0", "node": 1}}'

(``adapter_params`` are the constructor's keywords: ``pool``, ``node``,
``namespace``, ``sub_batch``.)

LMCache is never imported: the protocol is duck-typed.  Keys (LMCache's chunk
hash strings) map by :func:`cxlkv.keys_from_hashes` in ``namespace``; a batch
of a set is stored as one chain (LMCache submits a request's consecutive
chunks together).  Completions are ``(id, ok, error, per_key_results)`` with
``error`` "" on success and per-key results (a bool per key) for every
operation.
"""
import cxlkv
from cxlkv.aio import AsyncKv

__all__ = ["CxlkvNativePlugin"]


class CxlkvNativePlugin:
    """LMCache native plugin: asynchronous batches on a cxlkv pool."""

    def __init__(self, pool, node=1, namespace="lmcache", sub_batch=256, **_):
        self._pool = cxlkv.Pool(pool)
        self._ns = cxlkv.namespace(extra=f"lmcache;{namespace}")
        self._aio = AsyncKv(self._pool, int(node), sub_batch=int(sub_batch))
        self._closed = False

    def _keys(self, keys):
        return cxlkv.keys_from_hashes(list(keys), self._ns)

    def event_fd(self):
        """Readable while completions wait for drain_completions()."""
        return self._aio.event_fd()

    def submit_batch_get(self, keys, memoryviews):
        """Read each key's bytes into its memoryview (kept valid by the caller
        until the completion is drained); returns the batch id."""
        return self._aio.submit_get(self._keys(keys), list(memoryviews))

    def submit_batch_set(self, keys, memoryviews):
        """Store the memoryviews' bytes under the keys; returns the batch id."""
        return self._aio.submit_put(self._keys(keys), list(memoryviews))

    def submit_batch_exists(self, keys):
        """Which keys are in the pool (each on its own); returns the batch id."""
        return self._aio.submit_exists_each(self._keys(keys))

    def drain_completions(self):
        """``[(id, ok, error, per_key_results)]`` of every finished batch."""
        out = []
        for c in self._aio.drain():
            if c.op == "put":
                per = cxlkv.put_ok(c.status)
            else:
                per = c.status == cxlkv.RESERVED
            err = c.error or ("" if c.ok or c.op == "exists_each" else "; ".join(
                sorted({cxlkv.status_name(s) for s in c.status if s not in (cxlkv.RESERVED, cxlkv.EXISTS)})))
            ok = c.ok if c.op != "exists_each" else c.error is None
            out.append((c.id, bool(ok), err, [bool(x) for x in per]))
        return out

    def close(self):
        """Finish submitted batches, then close the async store and the pool
        (twice is harmless)."""
        if not self._closed:
            self._closed = True
            self._aio.close()
            self._pool.close()
