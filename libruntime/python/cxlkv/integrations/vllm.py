# SPDX-License-Identifier: MIT
"""vLLM v1 KV connector over a cxlkv pool (written against vLLM's
``KVConnectorBase_V1`` as of vLLM 0.11 .. 0.12, ``vllm/distributed/kv_transfer/
kv_connector/v1/base.py``).

Turn it on with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "CxlkvConnector",
        "kv_connector_module_path": "cxlkv.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"pool": "dax:/dev/dax0.0", "node": 1}}'

(every host the same ``PYTHONHASHSEED``, as vLLM's block hashes require).
Between the scheduler's lookup and the worker's load the blocks a request
will load are pinned (taken in ``update_state_after_alloc``, when vLLM has
committed to the load; given back ``load_pin_steps`` scheduler steps later,
when the request finishes or is aborted, or at shutdown; a scheduler process
that dies holds nothing, its node's pins end with it), so an eviction in
between no longer turns a hit into a load error and a recomputation.

``kv_role`` "kv_producer" on prefill instances and "kv_consumer" on decode
instances gives a prefill-to-decode handoff through the pool: the producer
publishes the prompt's blocks and leases them to the request, the consumer
finds them by the same block hashes, loads them and releases the lease.

vLLM is imported lazily: ``CxlkvConnector`` (a module attribute built on first
access) subclasses the real ``KVConnectorBase_V1`` when vLLM is importable and
is a plain class otherwise, so this module imports and is tested without vLLM.

Keys are vLLM's ``request.block_hashes`` (already chained per block) mapped by
:func:`cxlkv.keys_from_hashes` in a namespace of model, dtype and
tensor-parallel rank.  A pool block holds one vLLM block of every layer
(layer-major K then V), so loads complete before the first layer runs
(``wait_for_layer_load`` waits once) and saves go out when the last layer's
KV is written (``save_kv_layer`` of the last layer), one batched call each.
"""
import dataclasses
import logging
import zlib

import numpy as np

import cxlkv
from cxlkv.aio import AsyncKv

__all__ = ["CxlkvConnector", "CxlkvConnectorMetadata", "CxlkvConnectorImpl"]

_VLLM_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"

log = logging.getLogger("cxlkv.vllm")


@dataclasses.dataclass
class _Transfer:
    req_id: str
    keys: np.ndarray          # (n, 2) uint64
    block_ids: list           # GPU block ids, one per key
    parent: object = None    # key (lo, hi) of the block before keys[0], for saves


@dataclasses.dataclass
class CxlkvConnectorMetadata:
    """The step's plan, built by the scheduler side and sent to the workers
    (picklable)."""
    loads: list = dataclasses.field(default_factory=list)
    saves: list = dataclasses.field(default_factory=list)


def consumer_id(req_id):
    """The 64-bit lease consumer id of a request id (stable across processes)."""
    return zlib.crc32(req_id.encode()) | (zlib.crc32(req_id.encode()[::-1]) << 32)


def _extra(vllm_config):
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    cfg = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
    return ktc, cfg


def _role_name(role):
    return getattr(role, "name", str(role)).upper()


class CxlkvConnectorImpl:
    """vLLM v1 KV connector over a cxlkv pool (both roles).

    ``CxlkvConnector(vllm_config, role, kv_cache_config)``: vLLM builds it
    once in the scheduler (role SCHEDULER: lookups, the step's load / save
    plan, producer leases) and once per GPU worker (role WORKER: one batched
    load before the first layer, one batched save after the last).  Config
    comes from ``kv_transfer_config.kv_connector_extra_config``: ``pool``
    (URI, required), ``node`` (default 1), ``namespace``, ``tp_rank``,
    ``lease_ttl_ms`` (default 60000), ``load_pin_steps`` (default 3: the
    scheduler steps a load's pins outlive its plan; vLLM's asynchronous
    scheduling runs one step ahead), ``kv_layout`` ("flash_attn" /
    "flashinfer"; read from the tensors' shape by default).  Blocks whose load fails are returned
    by :meth:`get_block_ids_with_load_errors` (vLLM recomputes them).  See
    the module docstring for turning it on; :data:`CxlkvConnector` adds
    vLLM's base class when vLLM is importable."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        base_init = getattr(super(), "__init__", None)
        if _has_vllm_base(type(self)):
            base_init(vllm_config, role, kv_cache_config)
        self._role_name = _role_name(role)
        ktc, cfg = _extra(vllm_config)
        self.kv_role = getattr(ktc, "kv_role", "kv_both") or "kv_both"
        self.block_size = int(vllm_config.cache_config.block_size)
        mc = getattr(vllm_config, "model_config", None)
        pc = getattr(vllm_config, "parallel_config", None)
        self.namespace = cxlkv.namespace(model=getattr(mc, "model", ""), dtype=str(getattr(mc, "dtype", "")),
                                         tp_rank=int(cfg.get("tp_rank", getattr(pc, "rank", 0) or 0)),
                                         tp_size=int(getattr(pc, "tensor_parallel_size", 1) or 1),
                                         extra=str(cfg.get("namespace", "")))
        self.lease_ttl_ms = int(cfg.get("lease_ttl_ms", 60000))
        self.load_pin_steps = int(cfg.get("load_pin_steps", 3))
        if self.load_pin_steps < 1:
            raise ValueError(f"cxlkv: load_pin_steps {self.load_pin_steps} is not at least 1")
        self.kv_layout = str(cfg.get("kv_layout", "") or "")
        self.pool = cxlkv.Pool(cfg["pool"])
        self.node = int(cfg.get("node", 1))
        self.metrics = cxlkv.metrics.Metrics(labels={"engine": "vllm", "role": self._role_name.lower()})
        if self._role_name == "SCHEDULER":
            self.store = cxlkv.KvStore(self.pool, self.node, metrics=self.metrics, block_tokens=self.block_size)
            self._reqs = {}      # req_id -> dict(keys, saved, block_ids, request)
            self._loads = []     # this step's loads
            self._computed = {}  # req_id -> num_computed_tokens vLLM asked about
            self._steps = 0      # plans built (build_connector_meta calls)
            self._load_pins = {}  # req_id -> [(cxlkv.Pins, the step whose plan loads them)]
        else:
            self.store = None
            self.aio = None
            self.gpu = None
            self.kv = None
            self._layer_names = []
            self._load_req = None
            self._save_req = None
            self._load_errors = set()
            self._meta = None

    # ---- helpers ---------------------------------------------------------------
    def _failed(self, what, e):
        """A pool failure vLLM must not see raise (an exception in the
        scheduler ends the engine): log why, the first time a cause is seen
        and then at powers of two; the caller answers as for a miss."""
        fails = self.__dict__.setdefault("_failures", {})
        msg = f"cxlkv connector ({self._role_name.lower()}) {what} failed: {type(e).__name__}: {e}"
        n = fails[msg] = fails.get(msg, 0) + 1
        if n & (n - 1) == 0:
            log.warning("%s%s", msg, f" ({n} times)" if n > 1 else "")

    def _keys(self, request):
        return cxlkv.keys_from_hashes(list(request.block_hashes), self.namespace)

    # ==============================
    # Scheduler side
    # ==============================
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens beyond ``num_computed_tokens`` whose KV the pool holds (full
        blocks; never the whole prompt, vLLM must compute the last token).
        Side-effect free (a lookup); loads are synchronous (False)."""
        if self.kv_role == "kv_producer":
            return 0, False
        self._computed[request.request_id] = num_computed_tokens
        keys = self._keys(request)
        try:
            hit = self.store.lookup(keys) if len(keys) else 0
        except Exception as e:  # noqa: BLE001 -- a cache failure is a miss, not a dead engine
            self._failed("lookup", e)
            hit = 0
        hit_tokens = hit * self.block_size
        if hit_tokens >= request.num_tokens:
            hit_tokens = (request.num_tokens - 1) // self.block_size * self.block_size
        new = max(0, hit_tokens - num_computed_tokens)
        return new, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Remember the request's GPU blocks; plan the load of
        ``num_external_tokens`` tokens into them."""
        block_ids = list(blocks.get_block_ids()[0]) if blocks is not None else []
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = dict(request=request, block_ids=[], saved=0)
        if block_ids:
            st["block_ids"] = block_ids
        if num_external_tokens <= 0:
            return
        keys = self._keys(request)
        first = self._computed.pop(request.request_id, 0) // self.block_size
        last = first + num_external_tokens // self.block_size
        self._loads.append(_Transfer(request.request_id, keys[first:last], st["block_ids"][first:last]))
        st["saved"] = max(st["saved"], last)  # already in the pool: never saved again
        self._pin_load(request.request_id, keys[first:last])

    def _pin_load(self, rid, keys):
        """Pin the blocks of a planned load until the worker has read them
        (see the module docstring).  A block evicted since the lookup is
        not pinned; its load fails and vLLM recomputes it, as before."""
        try:
            pins = self.store.pin(keys)
        except Exception as e:  # noqa: BLE001 -- unpinned, the load may fail and be recomputed
            self._failed("pin", e)
            return
        self._load_pins.setdefault(rid, []).append((pins, self._steps + 1))

    def _unpin_loads(self, rid=None, before_step=None):
        """Give back the load pins of request ``rid`` (None: every request)
        whose plan is older than ``before_step`` (None: all of them)."""
        for r in [rid] if rid is not None else list(self._load_pins):
            keep = []
            for pins, step in self._load_pins.pop(r, []):
                if before_step is not None and step >= before_step:
                    keep.append((pins, step))
                    continue
                try:
                    pins.release()
                except Exception as e:  # noqa: BLE001 -- closing the store gives them back
                    self._failed("unpin", e)
            if keep:
                self._load_pins[r] = keep

    def build_connector_meta(self, scheduler_output):
        """The step's loads (from update_state_after_alloc) and saves (blocks
        that become full in this step); resets the per-step state."""
        meta = CxlkvConnectorMetadata(loads=self._loads)
        self._loads = []
        self._steps += 1
        # Loads planned load_pin_steps plans ago have run: their pins go.
        if self._load_pins:
            self._unpin_loads(before_step=self._steps - self.load_pin_steps + 1)
        if self.kv_role == "kv_consumer":
            return meta
        for nr in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            st = self._reqs.setdefault(nr.req_id, dict(request=None, block_ids=[], saved=0))
            st["block_ids"] = list(nr.block_ids[0])
            self._plan_save(meta, nr.req_id, nr.num_computed_tokens + scheduler_output.num_scheduled_tokens[nr.req_id])
        cr = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cr is not None:
            for i, rid in enumerate(cr.req_ids):
                st = self._reqs.get(rid)
                if st is None:
                    continue
                nb = cr.new_block_ids[i]
                if nb:
                    st["block_ids"].extend(nb[0])
                self._plan_save(meta, rid, cr.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[rid])
        return meta

    def _plan_save(self, meta, rid, computed_after_step):
        st = self._reqs[rid]
        req = st["request"]
        if req is None:
            return
        keys = self._keys(req)
        full = min(computed_after_step // self.block_size, len(keys), len(st["block_ids"]))
        lo = st["saved"]
        if full > lo:
            parent = tuple(int(x) for x in keys[lo - 1]) if lo > 0 else None
            meta.saves.append(_Transfer(rid, keys[lo:full], st["block_ids"][lo:full], parent))
            st["saved"] = full

    def request_finished(self, request, block_ids):
        """Saves finish inside the step (wait_for_save), so blocks are freed at
        once (False).  A producer leases the request's blocks to its consumer
        (the decode instance) and says so in the returned kv_transfer_params;
        a consumer releases the lease it was handed."""
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        self._unpin_loads(rid)  # finished or aborted: its loads are over
        params = None
        keys = self._keys(request)
        if self.kv_role == "kv_producer" and st is not None and st["saved"]:
            cid = consumer_id(rid)
            try:
                status = self.store.lease(keys[: st["saved"]], cid, cxlkv.NODE_ANY, self.lease_ttl_ms)
                params = dict(cxlkv_lease=cid, cxlkv_blocks=int((status == cxlkv.RESERVED).sum()))
            except Exception as e:  # noqa: BLE001 -- the request finishes; the consumer recomputes
                self._failed("lease", e)
        tp = getattr(request, "kv_transfer_params", None) or {}
        if "cxlkv_lease" in tp:
            try:
                self.store.lease_release(keys[: int(tp.get("cxlkv_blocks", len(keys)))], int(tp["cxlkv_lease"]))
            except Exception as e:  # noqa: BLE001 -- the lease ends by its ttl
                self._failed("lease release", e)
        return False, params

    # ==============================
    # Worker side
    # ==============================
    def register_kv_caches(self, kv_caches):
        """vLLM's per-layer caches (``{layer_name: tensor}``), FlashAttention
        ``[2, blocks, block_size, heads, head]`` or FlashInfer
        ``[blocks, 2, block_size, heads, head]``."""
        self._layer_names = list(kv_caches.keys())
        first = next(iter(kv_caches.values()))
        self.kv = cxlkv.PagedKV.vllm(kv_caches, kv_dim=self._kv_dim(kv_caches))
        if self.kv.is_cuda:
            self.gpu = cxlkv.Gpu(self.pool, device=first.device.index or 0)
        self.aio = AsyncKv(self.pool, self.node, sub_batch=1 << 20, metrics=self.metrics, block_tokens=self.block_size,
                           gpu=self.gpu)

    def _kv_dim(self, kv_caches):
        """Which dimension of the layer tensors is K|V: 0 for FlashAttention's
        ``[2, blocks, block_size, heads, head]``, 1 for FlashInfer's
        ``[blocks, 2, block_size, heads, head]`` (extra config ``kv_layout``:
        "flash_attn" or "flashinfer" says it where the shape cannot: two
        blocks).  A layout whose third dimension is not the block size (heads
        before tokens, "HND") would be stored in another order than every
        other engine reads: refused."""
        for name, t in kv_caches.items():
            shape = tuple(t.shape)
            if len(shape) != 5 or 2 not in shape[:2] or shape[2] != self.block_size:
                raise ValueError(f"cxlkv: vLLM layer {name}: KV cache of shape {shape} is neither FlashAttention's "
                                 f"[2, blocks, {self.block_size}, heads, head] nor FlashInfer's "
                                 f"[blocks, 2, {self.block_size}, heads, head] (block_size {self.block_size})")
        if self.kv_layout in ("flash_attn", "flashinfer"):
            return 0 if self.kv_layout == "flash_attn" else 1
        if self.kv_layout:
            raise ValueError(f"cxlkv: kv_layout {self.kv_layout!r} is not 'flash_attn' or 'flashinfer'")
        shape = tuple(next(iter(kv_caches.values())).shape)
        if shape[0] == 2 and shape[1] == 2:
            raise ValueError(f"cxlkv: vLLM KV cache of shape {shape}: with 2 blocks the K|V dimension is ambiguous; "
                             "set kv_connector_extra_config kv_layout to 'flash_attn' or 'flashinfer'")
        return 0 if shape[0] == 2 else 1

    def start_load_kv(self, forward_context, **kwargs):
        """Submit this step's loads (one batched call) without waiting."""
        meta = self._get_connector_metadata()
        self._meta = meta
        self._load_req = None
        if meta is None or not meta.loads:
            return
        keys = np.concatenate([t.keys for t in meta.loads])
        ids = [b for t in meta.loads for b in t.block_ids]
        self._load_ids = ids
        self._load_req = self.aio.submit_get(keys, self.kv, ids)

    def wait_for_layer_load(self, layer_name):
        """Blocks until the step's loads are in the cache (a pool block carries
        every layer, so the first layer waits for all)."""
        if self._load_req is None:
            return
        c = self.aio.wait(self._load_req)
        self._load_req = None
        bad = ~cxlkv.get_ok(c.status)
        self._load_errors.update(int(b) for b, f in zip(self._load_ids, bad) if f)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """When the last layer's KV is written, submit the step's saves."""
        meta = self._meta if self._meta is not None else self._get_connector_metadata()
        if meta is None or not meta.saves or layer_name != self._layer_names[-1]:
            return
        if self.kv.is_cuda:
            import torch
            torch.cuda.current_stream().synchronize()  # the layer's KV is written before the DMA reads it
        self._save_reqs = [self.aio.submit_put(t.keys, self.kv, t.block_ids, parent=t.parent) for t in meta.saves]

    def wait_for_save(self):
        """Blocks until the step's saves are published (before vLLM may reuse the blocks)."""
        for rid in getattr(self, "_save_reqs", []):
            self.aio.wait(rid)
        self._save_reqs = []

    def get_finished(self, finished_req_ids):
        """Transfers finish inside their step: nothing is pending across steps."""
        return None, None

    def get_block_ids_with_load_errors(self):
        """GPU blocks whose load failed (vLLM recomputes them); reported once."""
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        """Close what this side opened: the async store, GPU pinning, the KV
        store and the pool (outstanding transfers finish first)."""
        if getattr(self, "aio", None) is not None:
            self.aio.close()
            self.aio = None
        if getattr(self, "gpu", None) is not None:
            self.gpu.close()
            self.gpu = None
        if getattr(self, "_load_pins", None):
            self._unpin_loads()
        if getattr(self, "store", None) is not None:
            self.store.close()
        self.pool.close()

    # Worker metadata plumbing for the plain class (vLLM's base provides these).
    def bind_connector_metadata(self, connector_metadata):
        """The step's plan from the scheduler (vLLM's base class does this when present)."""
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        """Forget the step's plan after the forward pass."""
        self._connector_metadata = None
        self._meta = None

    def _get_connector_metadata(self):
        return getattr(self, "_connector_metadata", None)


def _has_vllm_base(cls):
    return any(c.__name__ == "KVConnectorBase_V1" for c in cls.__mro__)


_built = {}


def _build():
    if "cls" in _built:
        return _built["cls"]
    try:
        import importlib
        base = importlib.import_module(_VLLM_BASE)
        meta_base = base.KVConnectorMetadata
        cls = type("CxlkvConnector", (CxlkvConnectorImpl, base.KVConnectorBase_V1),
                   {"__doc__": CxlkvConnectorImpl.__doc__, "__module__": __name__})
        # The metadata must be a KVConnectorMetadata for vLLM.
        globals()["CxlkvConnectorMetadata"] = type("CxlkvConnectorMetadata",
                                                   (CxlkvConnectorMetadata, meta_base), {"__module__": __name__})
    except ImportError:
        cls = type("CxlkvConnector", (CxlkvConnectorImpl,), {"__doc__": CxlkvConnectorImpl.__doc__,
                                                             "__module__": __name__})
    _built["cls"] = cls
    return cls


def __getattr__(name):
    if name == "CxlkvConnector":
        return _build()
    raise AttributeError(name)
