# SPDX-License-Identifier: MIT
"""vLLM v1 KV connector over a cxlkv pool (written against vLLM 0.32's
``KVConnectorBase_V1``, ``vllm/distributed/kv_transfer/kv_connector/v1/base.py``,
and tested inside the real engine: ``tests/engines/test_vllm*.py``).

Turn it on with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "CxlkvConnector",
        "kv_connector_module_path": "cxlkv.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"pool": "dax:/dev/dax0.0", "node": 1}}'

(every host the same ``PYTHONHASHSEED`` and ``--prefix-caching-hash-algo``,
as vLLM's block hashes require).

**Keys.**  vLLM's ``request.block_hashes`` (chained per block) mapped by
:func:`cxlkv.keys_from_hashes` into a namespace of: the model, the KV cache
dtype (not the model's: fp8 and bf16 KV never share a key), the block size,
the cached layers (a digest of their names: a draft model's or a KV-sharing
model's layer set differs), MLA or not, and the **worker's own**
tensor-parallel and pipeline-parallel rank.  The scheduler has no rank: it
looks a prefix up under every rank's namespace and counts only the blocks
every rank holds, and pins them all.  The keys its lookups made (every
rank's) go along with the loads and saves it plans, each worker putting and
getting by those of its own namespace, which it picks by the namespace
bytes: a block is hashed once per rank, not again in each step's transfer.
A plan without them (keys the scheduler never made, as a producer's, which
looks nothing up) carries the hashes alone, and each worker makes its own
keys.

**Transfers do not depend on the per-layer hooks.**  A pool block holds one
vLLM block of every layer (layer-major, K then V, each ``[tokens, heads,
head]``).  The step's loads run, whole, in ``start_load_kv`` (vLLM calls it
before the forward pass when the step has synchronous loads, which is what
this connector asks for), and its saves in ``wait_for_save`` (called once per
step after the target's and any draft model's forward).  So full CUDA graphs,
KV-sharing layers and draft layers neither lose a save nor race a load, and
``requires_piecewise_for_cudagraph`` is False.

**Blocks.**  vLLM 0.32 hands the connector one ``[B, H, N, C]`` view per layer
(C = K then V of one head and token; strides in any of vLLM's physical
orders; B counts kernel blocks, ``block_size / N`` of them per vLLM block).
Layers that share one cache (KV sharing) are stored once.

**Refused at start-up, with the reason**: decode or prefill context
parallelism (their hash block spans several ranks' tokens), several KV cache
groups (hybrid models: vLLM turns its hybrid allocator off for connectors
without ``SupportsHMA``; Mamba layers then need it and are refused), CUDA
caches whose per-head K and V are not contiguous pieces the GPU path can
copy (vLLM 0.32 keeps K and V of a token side by side).

Between the scheduler's lookup and the worker's load the blocks a request
will load are pinned (taken in ``update_state_after_alloc``, when vLLM has
committed to the load; given back ``load_pin_steps`` scheduler steps later,
when the request finishes or is aborted, or at shutdown; a scheduler process
that dies holds nothing, its node's pins end with it).

A request resumed after preemption comes with its whole new block list,
which replaces the old one (``scheduled_cached_reqs.resumed_req_ids``).

``kv_role`` "kv_producer" on prefill instances and "kv_consumer" on decode
instances gives a prefill-to-decode handoff through the pool: the producer
publishes the prompt's blocks and leases them to the request, the consumer
finds them by the same block hashes, loads them and releases the lease.

vLLM is imported lazily: ``CxlkvConnector`` (a module attribute built on first
access) subclasses the real ``KVConnectorBase_V1``.
"""
import dataclasses
import errno
import hashlib
import itertools
import logging
import os
import time
import zlib

import numpy as np

import cxlkv

__all__ = ["CxlkvConnector", "CxlkvConnectorMetadata", "CxlkvConnectorImpl"]

_VLLM_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"

log = logging.getLogger("cxlkv.vllm")


@dataclasses.dataclass
class _Transfer:
    req_id: str
    hashes: list              # vLLM block hashes, one per block
    block_ids: list           # vLLM (manager) block ids, one per hash
    parent: object = None    # hash of the block before hashes[0], for saves
    # {namespace: bytes}: the key of the block before hashes[0] (16 zero
    # bytes for a root) and then one key per hash, 16 bytes each, for every
    # rank, where the scheduler had made them already (its lookups); None:
    # the workers hash (docs/engines.md "One call a step").
    keys: dict = None


_ROOT_KEY = bytes(16)  # a root chain's parent key


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


def _attention_spec(kv_cache_config):
    """The one KV cache group's spec; refuses what the connector cannot
    store correctly (see the module docstring)."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups) or "none"
        raise ValueError(f"cxlkv: vLLM KV cache groups [{kinds}]: the cxlkv connector stores one group of attention "
                         "layers; hybrid models (Mamba / linear-attention layers beside attention) are not "
                         "supported")
    spec = groups[0].kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    if per_layer:
        spec = next(iter(per_layer.values()))
    if not hasattr(spec, "num_kv_heads") or not hasattr(spec, "head_size"):
        raise ValueError(f"cxlkv: vLLM KV cache spec {type(spec).__name__} is not an attention cache; the cxlkv "
                         "connector stores attention KV only")
    return spec, list(groups[0].layer_names)


def _check_parallel(pc):
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        n = int(getattr(pc, name, 1) or 1)
        if n > 1:
            raise ValueError(f"cxlkv: vLLM {name}={n}: context parallelism is not supported by the cxlkv connector "
                             "(a hash block then spans several ranks' tokens); run without it")


class CxlkvConnectorImpl:
    """vLLM v1 KV connector over a cxlkv pool (both roles).

    ``CxlkvConnector(vllm_config, role, kv_cache_config)``: vLLM builds it
    once in the scheduler (role SCHEDULER: lookups, the step's load / save
    plan, producer leases) and once per worker (role WORKER: the step's
    loads before the forward pass, its saves after it).  Config comes from
    ``kv_transfer_config.kv_connector_extra_config``: ``pool`` (URI,
    required), ``node`` (default 1), ``namespace`` (added to every key's
    namespace), ``lease_ttl_ms`` (default 60000), ``load_pin_steps``
    (default 3: the scheduler steps a load's pins outlive its plan; vLLM's
    asynchronous scheduling runs one step ahead), ``metrics_textfile`` (a
    path, ``{role}`` and ``{rank}`` filled in: the process's client metrics
    written there after each step that moved blocks and at shutdown, for a
    node exporter's textfile collector).  Blocks whose load fails are
    returned by :meth:`get_block_ids_with_load_errors` (vLLM recomputes
    them)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        base_init = getattr(super(), "__init__", None)
        if _has_vllm_base(type(self)):
            base_init(vllm_config, role, kv_cache_config)
        self._role_name = _role_name(role)
        ktc, cfg = _extra(vllm_config)
        if "pool" not in cfg:
            raise ValueError("cxlkv: kv_connector_extra_config has no 'pool' (the pool URI, e.g. shm:NAME:SIZE)")
        self.kv_role = getattr(ktc, "kv_role", "kv_both") or "kv_both"
        self.block_size = int(vllm_config.cache_config.block_size)
        pc = vllm_config.parallel_config
        _check_parallel(pc)
        spec, layer_names = _attention_spec(kv_cache_config)
        self._spec = spec
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        mc = getattr(vllm_config, "model_config", None)
        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
        self._ns_parts = dict(
            model=getattr(mc, "model", ""),
            dtype=f"{str(spec.dtype).replace('torch.', '')}/{cache_dtype}",
            extra=str(cfg.get("namespace", "")),
            block=self.block_size,
            layers=hashlib.blake2b("\n".join(sorted(layer_names)).encode(), digest_size=8).hexdigest(),
            mla=int(type(spec).__name__.startswith("MLA") or getattr(spec, "head_size_v", 1) == 0))
        self.lease_ttl_ms = int(cfg.get("lease_ttl_ms", 60000))
        self.load_pin_steps = int(cfg.get("load_pin_steps", 3))
        if self.load_pin_steps < 1:
            raise ValueError(f"cxlkv: load_pin_steps {self.load_pin_steps} is not at least 1")
        self._textfile = cfg.get("metrics_textfile")
        self._raw_baseline_on = bool(cfg.get("raw_baseline", False))
        self._raw = None
        self.pool = cxlkv.Pool(cfg["pool"])
        self.node = int(cfg.get("node", 1))
        self.metrics = cxlkv.metrics.Metrics(labels={"engine": "vllm", "role": self._role_name.lower()})
        self.store = cxlkv.KvStore(self.pool, self.node, metrics=self.metrics, block_tokens=self.block_size)
        if self._role_name == "SCHEDULER":
            # Every rank's namespace: a block is a hit only if every worker stored its shard.
            self._namespaces = [self._namespace(t, p) for p in range(self.pp_size) for t in range(self.tp_size)]
            self._keys_of = {}   # req_id -> [keys array per namespace], grown as hashes arrive
            self._key_bytes = {}  # req_id -> those keys as bytes per namespace, for the transfers it plans
            self._reqs = {}      # req_id -> dict(keys, saved, block_ids, request)
            self._loads = []     # this step's loads
            self._computed = {}  # req_id -> num_computed_tokens vLLM asked about
            self._steps = 0      # plans built (build_connector_meta calls)
            self._load_pins = {}  # req_id -> [([cxlkv.Pins per namespace], the step whose plan loads them)]
            self._rank = "scheduler"
        else:
            tp_rank, pp_rank = self._worker_ranks()
            self._ns = self._namespace(tp_rank, pp_rank)
            self._rank = f"tp{tp_rank}pp{pp_rank}"
            self.gpu = None
            self.kv = None
            self._load_errors = set()
            self._meta = None
            self._moved = False
            # Hashes of blocks this worker's saves found or put in the pool
            # or its loads read (bounded, oldest forgotten first): requests sharing a prefix each save
            # it, and a block already there would cost an index call for
            # no copy (_save_step).
            self._in_pool = {}  # insertion-ordered: the oldest first (_remember)

    # ---- helpers ---------------------------------------------------------------
    def _namespace(self, tp_rank, pp_rank):
        p = self._ns_parts
        return cxlkv.namespace(model=p["model"], dtype=p["dtype"], tp_rank=tp_rank, tp_size=self.tp_size,
                               extra=p["extra"], pp=f"{pp_rank}/{self.pp_size}", block=p["block"],
                               layers=p["layers"], mla=p["mla"])

    def _worker_ranks(self):
        """This worker's own tensor- and pipeline-parallel ranks (vLLM's
        process groups exist when the worker builds its connector)."""
        from vllm.distributed import parallel_state as ps
        tp = ps.get_tensor_model_parallel_rank() if self.tp_size > 1 else 0
        pp = ps.get_pp_group().rank_in_group if self.pp_size > 1 else 0
        return int(tp), int(pp)

    def _failed(self, what, e):
        """A pool failure vLLM must not see raise (an exception in the
        scheduler ends the engine): log why, the first time a cause is seen
        and then at powers of two; the caller answers as for a miss."""
        fails = self.__dict__.setdefault("_failures", {})
        msg = f"cxlkv connector ({self._role_name.lower()}) {what} failed: {type(e).__name__}: {e}"
        n = fails[msg] = fails.get(msg, 0) + 1
        if n & (n - 1) == 0:
            log.warning("%s%s", msg, f" ({n} times)" if n > 1 else "")

    # The scheduler's counters (lookups, remote hits) reach its textfile
    # while it runs, not only at shutdown: vLLM kills an engine core whose
    # shutdown outlasts its grace period.  A step writes the file when they
    # changed, at most every _METRICS_EVERY_S (a few writes a second at
    # most, each a small file renamed over the last).
    _METRICS_EVERY_S = 0.05

    def _write_metrics_every(self):
        if not self._textfile:
            return
        now = time.monotonic()
        if now - getattr(self, "_metrics_at", -1e9) < self._METRICS_EVERY_S:
            return
        total = self.metrics.counters_total()
        if total != getattr(self, "_metrics_total", None):
            self._metrics_at, self._metrics_total = now, total
            self._write_metrics()

    def _write_metrics(self):
        if self._textfile:
            try:
                self.metrics.write_textfile(self._textfile.format(role=self._role_name.lower(), rank=self._rank))
            except OSError as e:
                self._failed(f"writing metrics to {self._textfile}", e)

    # ==============================
    # Scheduler side
    # ==============================
    def _keys(self, request):
        """The request's keys under every rank's namespace (a list of (n, 2)
        arrays), computed once per block as its hash arrives."""
        hashes = request.block_hashes
        have = self._keys_of.get(request.request_id)
        n = len(hashes)
        if have is None or len(have[0]) > n:
            have = [cxlkv.keys_from_hashes(list(hashes), ns) for ns in self._namespaces]
        elif len(have[0]) < n:
            new = list(hashes[len(have[0]):])
            have = [np.concatenate([k, cxlkv.keys_from_hashes(new, ns)]) for k, ns in zip(have, self._namespaces)]
        if self._keys_of.get(request.request_id) is not have:
            self._key_bytes[request.request_id] = [k.tobytes() for k in have]
        self._keys_of[request.request_id] = have
        return have

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens beyond ``num_computed_tokens`` whose KV the pool holds for
        every rank (full blocks; never the whole prompt, vLLM must compute the
        last token).  Side-effect free (a lookup); loads are synchronous."""
        if self.kv_role == "kv_producer":
            return 0, False
        self._computed[request.request_id] = num_computed_tokens
        per_ns = self._keys(request)
        try:
            hit = min(self.store.lookup(k) if len(k) else 0 for k in per_ns)
        except Exception as e:  # noqa: BLE001 -- a cache failure is a miss, not a dead engine
            self._failed("lookup", e)
            hit = 0
        hit_tokens = hit * self.block_size
        if hit_tokens >= request.num_tokens:
            hit_tokens = (request.num_tokens - 1) // self.block_size * self.block_size
        new = max(0, hit_tokens - num_computed_tokens)
        return new, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Remember the request's blocks; plan the load of
        ``num_external_tokens`` tokens into them and pin those blocks."""
        block_ids = list(blocks.get_block_ids()[0]) if blocks is not None else []
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = dict(request=request, block_ids=[], saved=0)
        st["request"] = request
        if block_ids:
            st["block_ids"] = block_ids
        if num_external_tokens <= 0:
            return
        first = self._computed.pop(request.request_id, 0) // self.block_size
        last = first + num_external_tokens // self.block_size
        hashes = list(request.block_hashes[first:last])
        per_ns = self._keys(request)
        self._loads.append(_Transfer(request.request_id, hashes, st["block_ids"][first:last],
                                     keys=self._plan_keys(request.request_id, first, last)))
        st["saved"] = max(st["saved"], last)  # already in the pool: never saved again
        self._pin_load(request.request_id, [k[first:last] for k in per_ns])

    def _pin_load(self, rid, keys_per_ns):
        """Pin the blocks of a planned load, under every rank's namespace,
        until the workers have read them (see the module docstring).  A
        block evicted since the lookup is not pinned; its load fails and vLLM
        recomputes it."""
        pins = []
        try:
            for k in keys_per_ns:
                pins.append(self.store.pin(k))
        except Exception as e:  # noqa: BLE001 -- unpinned, the load may fail and be recomputed
            self._failed("pin", e)
        if pins:
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
                for p in pins:
                    try:
                        p.release()
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
        self._write_metrics_every()
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
            resumed = getattr(cr, "resumed_req_ids", None) or set()
            for i, rid in enumerate(cr.req_ids):
                st = self._reqs.get(rid)
                if st is None:
                    continue
                nb = cr.new_block_ids[i]
                if rid in resumed:
                    # Preempted and resumed: its blocks were freed and it has
                    # a whole new list (vLLM's CachedRequestData contract).
                    st["block_ids"] = list(nb[0]) if nb else []
                elif nb:
                    st["block_ids"].extend(nb[0])
                self._plan_save(meta, rid, cr.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[rid])
        return meta

    def _plan_save(self, meta, rid, computed_after_step):
        st = self._reqs[rid]
        req = st["request"]
        if req is None:
            return
        hashes = req.block_hashes
        full = min(computed_after_step // self.block_size, len(hashes), len(st["block_ids"]))
        lo = st["saved"]
        if full > lo:
            parent = hashes[lo - 1] if lo > 0 else None
            meta.saves.append(_Transfer(rid, list(hashes[lo:full]), st["block_ids"][lo:full], parent,
                                        self._plan_keys(rid, lo, full)))
            st["saved"] = full

    def _plan_keys(self, rid, lo, hi):
        """A transfer's keys (_Transfer.keys) of blocks [lo, hi) of request
        ``rid``, from those its lookups made already (the workers then hash
        nothing); keys are never made here for a transfer: where the
        scheduler has none, each worker hashes its own."""
        kb = self._key_bytes.get(rid)
        if kb is None or len(kb[0]) < 16 * hi:
            return None
        return {ns: (b[16 * lo - 16:16 * hi] if lo else _ROOT_KEY + b[:16 * hi]) for ns, b in zip(self._namespaces, kb)}

    def request_finished(self, request, block_ids):
        """Saves finish inside the step (wait_for_save), so blocks are freed at
        once (False).  A producer leases the request's blocks to its consumer
        (the decode instance) and says so in the returned kv_transfer_params;
        a consumer releases the lease it was handed."""
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        self._unpin_loads(rid)  # finished or aborted: its loads are over
        lease = self.kv_role == "kv_producer" and st is not None and st["saved"]
        tp = getattr(request, "kv_transfer_params", None) or {}
        # Keys only for a lease to give or release: a plain request's finish hashes nothing.
        per_ns = self._keys(request) if lease or "cxlkv_lease" in tp else None
        self._keys_of.pop(rid, None)
        self._key_bytes.pop(rid, None)
        self._computed.pop(rid, None)
        params = None
        if lease:
            cid = consumer_id(rid)
            try:
                leased = min(int((self.store.lease(k[: st["saved"]], cid, cxlkv.NODE_ANY, self.lease_ttl_ms)
                                  == cxlkv.RESERVED).sum()) for k in per_ns)
                params = dict(cxlkv_lease=cid, cxlkv_blocks=leased)
            except Exception as e:  # noqa: BLE001 -- the request finishes; the consumer recomputes
                self._failed("lease", e)
        if "cxlkv_lease" in tp:
            try:
                for k in per_ns:
                    self.store.lease_release(k[: int(tp.get("cxlkv_blocks", len(k)))], int(tp["cxlkv_lease"]))
            except Exception as e:  # noqa: BLE001 -- the lease ends by its ttl
                self._failed("lease release", e)
        return False, params

    # ==============================
    # Worker side
    # ==============================
    def register_kv_caches(self, kv_caches):
        """vLLM's per-layer ``[B, H, N, C]`` views (see the module docstring)."""
        self.kv = paged_kv_of(kv_caches, self.block_size)
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._raw_baseline_on and not self.kv.is_cuda:
            self._raw = _RawBaseline(self.kv, f"{self._rank}-{os.getpid()}")
        if self.kv.is_cuda:
            self.kv.gpu_layout()  # refuses, naming why, a layout the GPU path cannot copy
            first = next(iter(kv_caches.values()))
            self.gpu = cxlkv.Gpu(self.pool, device=first.device.index or 0)

    def start_load_kv(self, forward_context, **kwargs):
        """Load the step's blocks, every request's, with one batched call
        (by the scheduler's keys, or hashed in the same call) before the
        forward pass."""
        meta = self._get_connector_metadata()
        self._meta = meta
        if meta is None or not meta.loads or self.kv is None:
            return
        ids = [b for t in meta.loads for b in t.block_ids]
        raw_first = self._raw is not None and self._raw.first("load")
        if raw_first:
            self._raw.load(ids, self.metrics)
        t0 = time.perf_counter()
        try:
            # One C call (hashing only where the plan has no keys) builds the
            # chunk lists and reads; Python lists, not numpy, for the step's
            # few dozen statuses: numpy calls run cold between forward passes
            # (docs/engines.md "One call a step").
            ns = self._ns
            if self._by_key(meta.loads):
                # By the scheduler's keys for this worker's own namespace: no hashing here.
                st = self.store.get_paged_step(b"".join(t.keys[ns][16:] for t in meta.loads), self.kv, ids)
            else:
                st = self.store.get_engine(ns, [h for t in meta.loads for h in t.hashes], self.kv, ids, gpu=self.gpu)
            ok = [s == cxlkv.RESERVED for s in st.tolist()]
        except Exception as e:  # noqa: BLE001 -- every block of the step is recomputed instead
            self._failed("load", e)
            ok = [False] * len(ids)
        if self.kv.is_cuda:
            import torch
            torch.cuda.current_stream().synchronize()  # the blocks are in place before attention reads them
        loaded = sum(ok)
        if loaded < len(ok):
            self._load_errors.update(int(b) for b, f in zip(ids, ok) if not f)
        # A block just loaded is in the pool: the request's saves skip it as
        # they skip what earlier saves put (_save_step).
        if self.kv_role != "kv_consumer":
            self._remember(itertools.compress((h for t in meta.loads for h in t.hashes), ok))
        self.metrics.inc("cxlkv_client_loaded_blocks_total", loaded)
        self.metrics.inc("cxlkv_client_load_failed_blocks_total", len(ok) - loaded)
        self.metrics.inc("cxlkv_client_adapter_load_seconds_total", time.perf_counter() - t0)
        if self._raw is not None and not raw_first:
            self._raw.load([b for b, f in zip(ids, ok) if f], self.metrics)
        self._moved = True

    def wait_for_layer_load(self, layer_name):
        """Nothing to wait for: the step's loads completed in start_load_kv."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing per layer: the step's saves go out in wait_for_save."""

    def wait_for_save(self):
        """Publish the blocks that became full in this step (after every
        layer, draft layers included, wrote them); vLLM may reuse the blocks
        once this returns."""
        meta = self._meta if self._meta is not None else self._get_connector_metadata()
        if meta is not None and meta.saves and self.kv is not None:
            # The raw baseline's own bookkeeping and copy (a benchmark
            # option) stay outside the connector's time, whichever goes
            # first (docs/engines.md "One call a step").
            raw_ids = None
            if self._raw is not None:
                raw_ids = self._raw_save_ids(meta.saves)
                if self._raw.first("save"):
                    self._raw.save(raw_ids, self.metrics)
                    raw_ids = None
            t0 = time.perf_counter()
            if self.kv.is_cuda:
                import torch
                torch.cuda.current_stream().synchronize()  # the step's KV is written before the DMA reads it
            # Every request's chain in one C call that builds the chunk
            # lists and puts, by the scheduler's keys or hashing them
            # (docs/engines.md "One call a step"): a
            # decode step fills one block per request, and Python per block
            # or per request cost more than the copy of a small block.
            try:
                self._save_step(meta.saves)
            except Exception as e:  # noqa: BLE001 -- a save that fails is a later miss, never wrong KV
                self._failed("save", e)
            self.metrics.inc("cxlkv_client_adapter_save_seconds_total", time.perf_counter() - t0)
            if raw_ids is not None:
                self._raw.save(raw_ids, self.metrics)
            self._moved = True
        if self._moved:
            self._moved = False
            self._write_metrics()

    def _raw_save_ids(self, saves):
        """The blocks of this step's chains the raw baseline copies: those
        the connector may write, each hash once.  Not a block known in the
        pool, and not a second block of one hash (two requests of a step
        that recompute one prefix): the connector copies neither, and the
        baseline copied them from sources nobody else read, always cold,
        which made it slower per block than a copy of the same bytes."""
        seen = self._in_pool
        step, ids = set(), []
        for t in saves:
            for h, b in zip(t.hashes, t.block_ids):
                if h not in seen and h not in step:
                    step.add(h)
                    ids.append(b)
        return ids

    _IN_POOL_MAX = 1 << 16

    def _remember(self, hashes):
        """Note blocks known to be in the pool (bounded: past the bound the
        older half, in the order first noted, is forgotten; one forgotten
        too early costs an index call that finds it there, nothing more).
        A plain dict: an OrderedDict's insert cost twice as much, cold
        between forward passes."""
        seen = self._in_pool
        seen.update(dict.fromkeys(hashes))
        if len(seen) > self._IN_POOL_MAX:
            for h in list(itertools.islice(seen, len(seen) - self._IN_POOL_MAX // 2)):
                del seen[h]

    def _by_key(self, transfers):
        """Whether the step's ``transfers`` go by the scheduler's keys: a CPU
        cache, and every transfer has this worker's own namespace's keys, one
        a hash and the parent's (_Transfer.keys)."""
        ns = self._ns
        return self.gpu is None and all(
            t.keys is not None and len(t.keys.get(ns, b"")) == 16 * len(t.hashes) + 16 for t in transfers)

    def _save_step(self, saves):
        """Put the step's chains, each without its leading blocks this worker
        already saw in the pool or an earlier chain of the step puts (then a
        child of the last of them): only blocks that may need a copy go to
        the index.  A block evicted since
        makes the trimmed chain's first put fail for want of its parent
        (-ENOENT), and that chain goes again whole.  Blocks put or found are
        remembered by their hash (the worker's namespace is fixed)."""
        seen = self._in_pool
        # The scheduler's keys where every chain of the step has them (then
        # no hashing here), else the hashes.
        ns = self._ns
        by_key = self._by_key(saves)
        # Per chain: (its first block put, the transfer); the step's lists
        # grow by slices (list.extend: no Python loop per block, which runs
        # cold between forward passes, docs/engines.md "One call a step").
        todo, this_step = [], set()
        hashes, lens, parents, ids, keys = [], [], [], [], []
        for t in saves:
            # Blocks an earlier chain of this call puts count as seen: the
            # chains go in order, so this one starts below them.
            hs, skip = t.hashes, 0
            while skip < len(hs) and (hs[skip] in seen or hs[skip] in this_step):
                skip += 1
            if skip < len(hs):
                todo.append((skip, t))
                part = hs[skip:] if skip else hs
                this_step.update(part)
                hashes += part
                ids += t.block_ids[skip:] if skip else t.block_ids
                lens.append(len(part))
                if by_key:
                    kb = t.keys[ns]
                    parents.append(kb[16 * skip:16 * skip + 16])
                    keys.append(kb[16 * skip + 16:])
                else:
                    parents.append(hs[skip - 1] if skip else t.parent)
        for attempt in (0, 1):
            if not todo:
                return
            # The statuses as an array.array, no numpy: numpy calls run cold
            # between forward passes (docs/engines.md "One call a step").
            if by_key:
                rc, st = self.store.put_paged_step(b"".join(keys), lens, b"".join(parents), self.kv, ids)
            else:
                rc, st = self.store.put_engine_step(ns, hashes, lens, parents, self.kv, ids, gpu=self.gpu)
            if rc == len(hashes):  # every block is in the pool now: nothing to go again
                self._remember(hashes)
                return
            self._remember(h for h, s in zip(hashes, st) if s == cxlkv.RESERVED or s == cxlkv.EXISTS)
            again, at = [], 0
            hashes, lens, parents, ids, keys = [], [], [], [], []
            for skip, t in todo:
                first = st[at]
                at += len(t.hashes) - skip
                if attempt == 0 and first == -errno.ENOENT and skip:
                    for h in t.hashes[:skip]:
                        seen.pop(h, None)
                    again.append((0, t))
                    hashes += t.hashes
                    ids += t.block_ids
                    lens.append(len(t.hashes))
                    if by_key:
                        parents.append(t.keys[ns][:16])
                        keys.append(t.keys[ns][16:])
                    else:
                        parents.append(t.parent)
            todo = again

    def get_finished(self, finished_req_ids):
        """Transfers finish inside their step: nothing is pending across steps."""
        return None, None

    def get_block_ids_with_load_errors(self):
        """Blocks whose load failed (vLLM recomputes them); reported once."""
        out, self._load_errors = self._load_errors, set()
        return out

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """False: loads and saves do not run in the per-layer hooks."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """None: any of vLLM's physical orders is read through its strides."""
        return None

    def shutdown(self):
        """Close what this side opened: GPU pinning, the KV store and the pool."""
        if getattr(self, "gpu", None) is not None:
            self.gpu.close()
            self.gpu = None
        if getattr(self, "_load_pins", None):
            self._unpin_loads()
        if getattr(self, "_raw", None) is not None:
            self._raw.close()
            self._raw = None
        if getattr(self, "store", None) is not None:
            self._write_metrics()
            self.store.close()
            self.store = None
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


class _RawBaseline:
    """The raw copy of a worker's loads and saves, timed in the engine
    process beside them (``kv_connector_extra_config`` ``raw_baseline``: a
    benchmark's baseline, docs/benchmarks.md "Serving engines"): the same
    engine blocks' chunk lists, one ``cxlkv_gather_write`` /
    ``cxlkv_scatter_read`` a block, into and out of a scratch pool of this
    process's own, under the same threads and caches as the connector.
    Saves read the engine's blocks (no harm to them); loads write a mirror
    of the engine's cache (never the engine's blocks, which hold the loaded
    KV).  Both go before the connector's call on one step and after it on
    the next, so that neither always meets the caches, or the engine's
    other threads, the other one left."""

    RING = 256  # scratch pool blocks, reused in turn

    def __init__(self, kv, tag):
        self.kv = kv
        bb = kv.block_bytes
        self.ring = max(1, min(self.RING, kv.num_blocks))
        name = f"cxlkv-raw-baseline-{tag}"
        self.path = f"/dev/shm/{name}"
        size = self.ring * bb + (128 << 20)  # the ring and the pool's own carves
        self.uri = f"shm:{name}:{-(-size // (2 << 20)) * (2 << 20)}"  # a multiple of 2 MiB
        cxlkv.Pool.format(self.uri, force=True)
        self.pool = cxlkv.Pool(self.uri)
        carve = next(c for c in self.pool.carves() if c["name"] == "kv")
        self.ring = min(self.ring, carve["size"] // bb)
        self.base = carve["offset"]
        lib = cxlkv._lib.lib()
        self._write, self._read = lib.cxlkv_gather_write, lib.cxlkv_scatter_read
        # The mirror: a copy of every address range the engine's blocks
        # span (a layer's tensor each, wherever the engine allocated them),
        # touched now so that no first-touch fault lands in a timed copy.
        offs = kv._offs.astype(np.int64)
        reach = (kv.num_blocks - 1) * kv._strides
        lo = np.minimum(offs, offs + reach)
        hi = np.maximum(offs, offs + reach) + kv._lens.astype(np.int64)
        order = np.argsort(lo)
        segs = []  # [lo, hi, chunk indices]
        for i in order:
            if segs and lo[i] <= segs[-1][1]:
                segs[-1][1] = max(segs[-1][1], int(hi[i]))
                segs[-1][2].append(i)
            else:
                segs.append([int(lo[i]), int(hi[i]), [i]])
        # Allocated as the engine allocates its cache (a torch CPU tensor),
        # so that both get the same pages (transparent huge pages or not).
        import torch  # noqa: PLC0415 -- vLLM's own dependency
        self.mirrors = [torch.ones(h - l, dtype=torch.uint8) for l, h, _ in segs]
        self.shift = np.zeros(kv.chunks_per_block, dtype=np.int64)  # mirror address - engine address, per chunk
        for (l, _h, idx), m in zip(segs, self.mirrors):
            self.shift[idx] = m.data_ptr() - l
        self.at = 0
        self.steps = {}
        # Map the whole ring now (the pool maps its pages on first use): the
        # timed copies take no page-table faults the connector's pool, long
        # in use, does not take either.
        ch, _ = kv.chunks([0])
        for i in range(self.ring):
            self._write(self.pool.handle, self.base + i * bb, ch.ctypes.data, len(ch))

    def first(self, what):
        """Whether this step's raw copies of ``what`` go before the
        connector's call (every other step)."""
        self.steps[what] = self.steps.get(what, 0) + 1
        return self.steps[what] % 2 == 0

    def _copy(self, fn, ids, shift, metrics, what):
        if not ids:
            return
        per = []
        for b in ids:
            ch, _ = self.kv.chunks([b])
            if shift is not None:
                ch = ch.copy()
                ch["addr"] = (ch["addr"].astype(np.int64) + shift).astype(np.uint64)
            per.append(ch)
        h, bb = self.pool.handle, self.kv.block_bytes
        t0 = time.perf_counter()
        for ch in per:
            rc = fn(h, self.base + (self.at % self.ring) * bb, ch.ctypes.data, len(ch))
            self.at += 1
            if rc != 0:
                raise cxlkv.CxlkvError(rc, f"raw baseline copy of {self.uri}", cxlkv.last_error())
        metrics.inc(f"cxlkv_client_raw_{what}_seconds_total", time.perf_counter() - t0)
        metrics.inc(f"cxlkv_client_raw_{what}_blocks_total", len(ids))

    def save(self, ids, metrics):
        self._guarded(self._write, ids, None, metrics, "save")

    def load(self, ids, metrics):
        self._guarded(self._read, ids, self.shift, metrics, "load")

    def _guarded(self, *args):
        try:
            self._copy(*args)
        except Exception as e:  # noqa: BLE001 -- a benchmark's baseline never stops the engine
            log.warning("cxlkv connector: raw baseline copy failed: %s: %s", type(e).__name__, e)

    def close(self):
        self.pool.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def paged_kv_of(kv_caches, block_size):
    """A :class:`cxlkv.PagedKV` over vLLM 0.32's per-layer caches: each a
    ``[B, H, N, C]`` view (any strides) with C = K then V of one head and
    token, B = kernel blocks (``block_size / N`` per vLLM block).  A vLLM
    block becomes, per layer, K as ``[tokens, heads, C/2]`` then V likewise
    (for MLA, whose C is one latent vector, its two halves).  Layers that
    share one cache are taken once."""
    layers, seen = [], set()
    for name, t in kv_caches.items():
        shape = tuple(t.shape)
        if len(shape) != 4:
            raise ValueError(f"cxlkv: vLLM layer {name}: KV cache of shape {shape} is not vLLM's [blocks, heads, "
                             "tokens, K|V] view (the cxlkv connector is written for vLLM 0.32)")
        ident = (t.data_ptr(), shape, tuple(t.stride()))
        if ident in seen:
            continue  # a KV-sharing layer: the same cache as an earlier layer
        seen.add(ident)
        B, H, N, C = shape
        if block_size % N or B % (block_size // N) or C % 2:
            raise ValueError(f"cxlkv: vLLM layer {name}: KV cache of shape {shape} does not split into blocks of "
                             f"{block_size} tokens with K and V halves")
        ratio = block_size // N
        x = t.unflatten(0, (B // ratio, ratio))                # [blocks, kernel blocks, H, N, C]
        k = x[..., : C // 2].permute(0, 1, 3, 2, 4)            # [blocks, kernel blocks, N, H, C/2]
        v = x[..., C // 2:].permute(0, 1, 3, 2, 4)
        if ratio == 1:
            k, v = k[:, 0], v[:, 0]
        layers.append((k, v))
    if not layers:
        raise ValueError("cxlkv: vLLM registered no KV cache layers")
    return cxlkv.PagedKV.layer_first(layers)


def _has_vllm_base(cls):
    return any(c.__name__ == "KVConnectorBase_V1" for c in cls.__mro__)


_built = {}


def _build():
    if "cls" in _built:
        return _built["cls"]
    import importlib
    base = importlib.import_module(_VLLM_BASE)
    meta_base = base.KVConnectorMetadata
    cls = type("CxlkvConnector", (CxlkvConnectorImpl, base.KVConnectorBase_V1),
               {"__doc__": CxlkvConnectorImpl.__doc__, "__module__": __name__})
    # The metadata must be a KVConnectorMetadata for vLLM.
    globals()["CxlkvConnectorMetadata"] = type("CxlkvConnectorMetadata",
                                               (CxlkvConnectorMetadata, meta_base), {"__module__": __name__})
    _built["cls"] = cls
    return cls


def __getattr__(name):
    if name == "CxlkvConnector":
        return _build()
    raise AttributeError(name)
