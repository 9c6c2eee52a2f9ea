# SPDX-License-Identifier: MIT
"""The cxlkv connector against vLLM's own configuration and KV cache code,
without starting an engine: vLLM's factory loads it by module path from the
snippet in docs/engines.md; the KV cache views vLLM's allocator makes (every physical
layout, kernel blocks smaller than vLLM blocks, MLA) round-trip through the
pool; what the connector does not support is refused at construction with
a message naming the feature."""
import json
import os
import re
import types

import pytest
import torch

import cxlkv
from vllm_util import ROOT

from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,  # noqa: E402
                                        MambaSpec, MLAAttentionSpec, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from cxlkv.integrations import vllm as cv  # noqa: E402

BS = 32


def readme_snippet():
    """The JSON of the vLLM snippet in docs/engines.md (section "vLLM")."""
    with open(os.path.join(ROOT, "docs", "engines.md")) as f:
        text = f.read()
    m = re.search(r"--kv-transfer-config '(\{.*?\})'", text, re.S)
    assert m, "docs/engines.md has no vLLM --kv-transfer-config snippet"
    return json.loads(m.group(1))


def _kvcc(spec, layers=("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"), extra_groups=()):
    groups = [KVCacheGroupSpec(layer_names=list(layers), kv_cache_spec=spec)] + list(extra_groups)
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)


def _vllm_config(uri, **parallel):
    return types.SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector="CxlkvConnector",
                                            kv_connector_module_path="cxlkv.integrations.vllm", kv_role="kv_both",
                                            kv_connector_extra_config={"pool": uri, "node": 2}),
        cache_config=CacheConfig(block_size=BS), parallel_config=ParallelConfig(**parallel),
        model_config=types.SimpleNamespace(model="tiny"))


def _attn(dtype=torch.float32):
    return FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=dtype)


def test_vllms_factory_loads_the_readme_snippets_connector(env):
    cfg = readme_snippet()
    ktc = KVTransferConfig(**dict(cfg, kv_connector_extra_config=dict(cfg["kv_connector_extra_config"],
                                                                      pool=env.uri)))
    cls = KVConnectorFactory.get_connector_class(ktc)
    assert issubclass(cls, KVConnectorBase_V1) and cls.__name__ == "CxlkvConnector"
    assert cls.requires_piecewise_for_cudagraph(ktc.kv_connector_extra_config) is False
    vc = _vllm_config(env.uri)
    vc.kv_transfer_config = ktc
    c = cls(vc, KVConnectorRole.SCHEDULER, _kvcc(_attn()))
    try:
        assert c.pool.uri == env.uri and c.node == cfg["kv_connector_extra_config"]["node"]
    finally:
        c.shutdown()


@pytest.mark.parametrize("parallel", [dict(tensor_parallel_size=2, decode_context_parallel_size=2),
                                      dict(prefill_context_parallel_size=2)])
def test_context_parallelism_is_refused_naming_it(env, parallel):
    cls = cv.CxlkvConnector
    with pytest.raises(ValueError, match="context parallel"):
        cls(_vllm_config(env.uri, **parallel), KVConnectorRole.SCHEDULER, _kvcc(_attn()))


def test_a_hybrid_model_is_refused_naming_it(env):
    mamba = KVCacheGroupSpec(layer_names=["model.layers.2.mixer"],
                             kv_cache_spec=MambaSpec(block_size=BS, shapes=((4, 8),), dtypes=(torch.float32,)))
    with pytest.raises(ValueError, match="hybrid models"):
        cv.CxlkvConnector(_vllm_config(env.uri), KVConnectorRole.SCHEDULER, _kvcc(_attn(), extra_groups=[mamba]))


def test_kv_cache_dtype_and_ranks_are_in_the_namespace(env):
    """fp8 and fp32 KV of one model never share keys; nor do two ranks; the
    scheduler looks up every rank's keys."""
    def ns(spec, cache_dtype="auto", **par):
        vc = _vllm_config(env.uri, **par)
        vc.cache_config = CacheConfig(block_size=BS, cache_dtype=cache_dtype)
        c = cv.CxlkvConnector(vc, KVConnectorRole.SCHEDULER, _kvcc(spec))
        try:
            return c._namespaces
        finally:
            c.shutdown()
    f32 = ns(_attn())
    fp8 = ns(_attn(torch.float8_e4m3fn), cache_dtype="fp8_e4m3")
    tp2 = ns(_attn(), tensor_parallel_size=2)
    assert len(f32) == 1 and len(tp2) == 2 and len(set(tp2)) == 2
    assert f32[0] != fp8[0] and f32[0] not in tp2


def _views(spec, layout, num_blocks=6, layers=2, kernel=None, seed=0):
    """vLLM's own per-layer views of a fresh cache in ``layout``, filled
    with seeded random bytes."""
    lay = KVCacheLayout[layout]
    page = spec.page_size_bytes
    if lay.is_block_outermost:
        block_stride, layer_stride = layers * page, page
    else:
        block_stride, layer_stride = page, num_blocks * page
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-100, 100, (layers * num_blocks * page,), dtype=torch.int8, generator=g)
    t = KVCacheTensor(size=raw.numel(), layers=[f"model.layers.{i}.attn" for i in range(layers)],
                      layer_stride=layer_stride, block_stride=block_stride)
    views = create_kv_cache_views(raw, spec, num_blocks, lay, t, kernel_block_size=kernel)
    return dict(zip(t.layers, views))


def _logical_block(view, b, block_size=BS):
    """Block ``b`` of a [B, H, N, C] view, as [tokens, H, C] (kernel blocks joined)."""
    B, H, N, C = view.shape
    r = block_size // N
    x = view.view(torch.int32).unflatten(0, (B // r, r))[b]    # [r, H, N, C]; int32: random bytes hold NaNs
    return x.permute(0, 2, 1, 3).reshape(r * N, H, C)


LAYOUTS = [("LBHNC", None), ("LBNHC", None), ("BLHNC", None), ("BLNHC", None), ("LBHNC", 16), ("LBNHC", 8)]


@pytest.mark.parametrize("src", LAYOUTS, ids=[f"{a}-k{b}" for a, b in LAYOUTS])
@pytest.mark.parametrize("dst", LAYOUTS[:2] + LAYOUTS[4:5], ids=lambda x: f"{x[0]}-k{x[1]}")
def test_vllm_cache_views_round_trip_through_the_pool_in_every_layout(env, src, dst):
    spec = _attn()
    a = _views(spec, src[0], kernel=src[1], seed=1)
    b = _views(spec, dst[0], kernel=dst[1], seed=2)
    kv = env.store(2)
    keys = cxlkv.block_keys(torch.arange(3 * BS).numpy(), BS)
    assert cxlkv.put_ok(kv.put(keys, cv.paged_kv_of(a, BS), [1, 3, 4])).all()
    assert cxlkv.get_ok(kv.get(keys, cv.paged_kv_of(b, BS), [0, 2, 5])).all()
    for name in a:
        for s, d in ((1, 0), (3, 2), (4, 5)):
            assert torch.equal(_logical_block(a[name], s), _logical_block(b[name], d)), (name, s, d)
    # The pool holds K then V, each [tokens, heads, head] (the order every engine reads).
    buf = [bytearray(cv.paged_kv_of(a, BS).block_bytes)]
    assert cxlkv.get_ok(kv.get(keys[:1], buf)).all()
    got = torch.frombuffer(buf[0], dtype=torch.int32).view(2, 2, BS, 2, 64)  # layer, K|V, tokens, heads, head
    lb = _logical_block(a["model.layers.0.attn"], 1)                             # [tokens, heads, K|V]
    assert torch.equal(got[0, 0], lb[..., :64]) and torch.equal(got[0, 1], lb[..., 64:])


def test_mla_cache_round_trips_and_kv_sharing_layers_are_stored_once(env):
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=576, dtype=torch.float32)
    a = _views(spec, "LBHNC", seed=3)
    shared = dict(a, **{"model.layers.9.attn": a["model.layers.0.attn"]})  # a layer reusing layer 0's cache
    assert cv.paged_kv_of(shared, BS).block_bytes == cv.paged_kv_of(a, BS).block_bytes
    b = _views(spec, "LBHNC", seed=4)
    kv = env.store(2)
    keys = cxlkv.block_keys(torch.arange(2 * BS).numpy(), BS)
    assert cxlkv.put_ok(kv.put(keys, cv.paged_kv_of(shared, BS), [0, 5])).all()
    assert cxlkv.get_ok(kv.get(keys, cv.paged_kv_of(b, BS), [1, 2])).all()
    for name in a:
        x, y = a[name].view(torch.int32), b[name].view(torch.int32)
        assert torch.equal(x[0], y[1]) and torch.equal(x[5], y[2])


def test_the_raw_baseline_times_the_same_blocks_and_leaves_the_engines_kv_alone(env):
    """kv_connector_extra_config raw_baseline (a benchmark's baseline): the
    raw copies of a step's saved and loaded blocks are counted beside the
    connector's, the loaded blocks hold the pool's bytes (the raw reads go
    to a mirror, never to the engine's blocks), the saves publish as
    without it, the saves skip blocks the worker just loaded, the baseline
    copies what the connector copies (a prefix two requests of a step
    recomputed, once), and its scratch pool is gone after shutdown."""
    spec = _attn()
    views = _views(spec, "LBHNC", seed=11)
    vc = _vllm_config(env.uri)
    vc.kv_transfer_config.kv_connector_extra_config["raw_baseline"] = True
    c = cv.CxlkvConnector(vc, KVConnectorRole.WORKER, _kvcc(spec))
    try:
        c.register_kv_caches(views)
        scratch = c._raw.path
        assert os.path.exists(scratch)
        h = [bytes([0x40 + i]) * 32 for i in range(6)]
        for step in range(2):  # raw copies before the save on one step, after it on the next
            c._meta = cv.CxlkvConnectorMetadata(saves=[cv._Transfer("r", h[3 * step:3 * step + 3],
                                                                     [3 * step, 3 * step + 1, 3 * step + 2],
                                                                     h[2] if step else None)])
            c.wait_for_save()
        m = c.metrics
        assert m.counter("cxlkv_client_stored_blocks_total") == 6
        assert m.counter("cxlkv_client_raw_save_blocks_total") == 6 and m.counter("cxlkv_client_raw_save_seconds_total") > 0
        # Load them into another cache's blocks: the pool's bytes land there.
        other = _views(spec, "LBHNC", seed=12)
        c.register_kv_caches(other)
        c.bind_connector_metadata(cv.CxlkvConnectorMetadata(loads=[cv._Transfer("q", h, [5, 4, 3, 2, 1, 0])]))
        c.start_load_kv(None)
        c._meta = None
        assert m.counter("cxlkv_client_loaded_blocks_total") == 6
        assert m.counter("cxlkv_client_raw_load_blocks_total") == 6 and m.counter("cxlkv_client_raw_load_seconds_total") > 0
        for name in views:
            for a, b in zip(range(6), [5, 4, 3, 2, 1, 0]):
                assert torch.equal(_logical_block(views[name], a), _logical_block(other[name], b)), (name, a)
        # A block just loaded is known to be in the pool: a save of it sends nothing.
        c._meta = cv.CxlkvConnectorMetadata(saves=[cv._Transfer("q", h, [5, 4, 3, 2, 1, 0])])
        c.wait_for_save()
        assert m.counter("cxlkv_client_stored_blocks_total") == 6 and m.counter("cxlkv_client_raw_save_blocks_total") == 6
        # Two requests of one step that recomputed one prefix: the connector
        # copies its blocks once, and so does the baseline (the same bytes).
        p = [bytes([0x60 + i]) * 32 for i in range(3)]
        c._meta = cv.CxlkvConnectorMetadata(saves=[cv._Transfer("s1", p[:2], [0, 1], None),
                                                   cv._Transfer("s2", p, [2, 3, 4], None)])
        c.wait_for_save()
        assert m.counter("cxlkv_client_stored_blocks_total") == 9
        assert m.counter("cxlkv_client_raw_save_blocks_total") == 9
    finally:
        c.shutdown()
    assert not os.path.exists(scratch)


def test_workers_put_and_get_by_the_keys_the_schedulers_lookups_made_and_hash_where_they_have_none(env):
    """The scheduler's lookup makes every rank's keys; the saves and loads
    it plans carry them, and a worker puts and gets by them (one call, no
    hashing) under the very keys its own hashing gives, a later chain of
    the request under its parent.  A plan without the worker's own
    namespace (another rank's keys only, or a blob of the wrong length) goes
    by the hashes instead."""
    spec = _attn()
    sched = cv.CxlkvConnector(_vllm_config(env.uri), KVConnectorRole.SCHEDULER, _kvcc(spec))
    worker = cv.CxlkvConnector(_vllm_config(env.uri), KVConnectorRole.WORKER, _kvcc(spec))
    calls = {"by_key": 0, "by_hash": 0}
    by_key, by_hash = worker.store.put_paged_step, worker.store.put_engine_step

    def counted(name, fn):
        def call(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return call
    worker.store.put_paged_step = counted("by_key", by_key)
    worker.store.put_engine_step = counted("by_hash", by_hash)
    reader = cv.CxlkvConnector(_vllm_config(env.uri), KVConnectorRole.WORKER, _kvcc(spec))
    reader.store.get_paged_step = counted("get_by_key", reader.store.get_paged_step)
    reader.store.get_engine = counted("get_by_hash", reader.store.get_engine)
    calls.update(get_by_key=0, get_by_hash=0)
    try:
        views = _views(spec, "LBHNC", num_blocks=8, seed=11)
        worker.register_kv_caches(views)

        def step(rid, hashes, first, new_blocks, computed_after, tamper=None):
            req = types.SimpleNamespace(request_id=rid, block_hashes=hashes, num_tokens=len(hashes) * BS + 3)
            if first:
                assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
                sched.update_state_after_alloc(req, None, 0)
                out = types.SimpleNamespace(
                    scheduled_new_reqs=[types.SimpleNamespace(req_id=rid, block_ids=(new_blocks,),
                                                              num_computed_tokens=0)],
                    scheduled_cached_reqs=None, num_scheduled_tokens={rid: computed_after})
            else:
                out = types.SimpleNamespace(
                    scheduled_new_reqs=[], num_scheduled_tokens={rid: BS},
                    scheduled_cached_reqs=types.SimpleNamespace(req_ids=[rid], new_block_ids=[(new_blocks,)],
                                                                num_computed_tokens=[computed_after - BS],
                                                                resumed_req_ids=set()))
            meta = sched.build_connector_meta(out)
            if tamper:
                tamper(meta.saves[0])
            worker._meta = meta
            worker.wait_for_save()
            return meta

        h = [bytes([0x40 + i]) * 32 for i in range(5)]
        m = step("r", h, True, [0, 1, 2, 3, 4], 3 * BS)
        assert [t.hashes for t in m.saves] == [h[:3]] and set(m.saves[0].keys) == {worker._ns}
        assert (calls["by_key"], calls["by_hash"]) == (1, 0)
        sched._reqs["r"]["request"].block_hashes = h  # vLLM's request object: the same list, grown
        step("r", h, False, [], 4 * BS)  # block 3, a child of block 2: by the parent key the plan carries
        assert (calls["by_key"], calls["by_hash"]) == (2, 0)
        # Another rank's keys only, then a blob a key short: the worker hashes.
        g = [bytes([0x60 + i]) * 32 for i in range(2)]
        step("o", g, True, [5], BS, tamper=lambda t: setattr(t, "keys", {b"another rank": t.keys[worker._ns]}))
        k = [bytes([0x70 + i]) * 32 for i in range(2)]
        step("p", k, True, [6], BS, tamper=lambda t: t.keys.update({worker._ns: t.keys[worker._ns][16:]}))
        assert (calls["by_key"], calls["by_hash"]) == (2, 2)
        kv = env.store(3)
        assert kv.lookup(cxlkv.keys_from_hashes(h, worker._ns)) == 4
        assert kv.lookup(cxlkv.keys_from_hashes(g[:1], worker._ns)) == 1
        assert kv.lookup(cxlkv.keys_from_hashes(k[:1], worker._ns)) == 1
        other = _views(spec, "LBHNC", num_blocks=8, seed=12)
        keys = cxlkv.keys_from_hashes(h[:4] + g[:1] + k[:1], worker._ns)
        assert cxlkv.get_ok(kv.get(keys, cv.paged_kv_of(other, BS), [0, 1, 2, 3, 4, 5])).all()
        for name in views:
            for b in range(4):
                assert torch.equal(_logical_block(views[name], b), _logical_block(other[name], b)), (name, b)
            for src, dst in ((5, 4), (6, 5)):
                assert torch.equal(_logical_block(views[name], src), _logical_block(other[name], dst)), (name, src)
        # A request with the same prefix: the scheduler plans the load of its
        # four blocks by the keys its lookup made; the reader gets by them.
        into = _views(spec, "LBHNC", num_blocks=8, seed=13)
        reader.register_kv_caches(into)
        q = types.SimpleNamespace(request_id="q", block_hashes=h, num_tokens=5 * BS + 3)
        assert sched.get_num_new_matched_tokens(q, 0) == (4 * BS, False)
        sched.update_state_after_alloc(q, types.SimpleNamespace(get_block_ids=lambda: ([7, 6, 5, 4, 3],)), 4 * BS)
        meta = sched.build_connector_meta(types.SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=None,
                                                                num_scheduled_tokens={}))
        assert [t.hashes for t in meta.loads] == [h[:4]]
        reader.bind_connector_metadata(meta)
        reader.start_load_kv(None)
        assert (calls["get_by_key"], calls["get_by_hash"]) == (1, 0)
        assert reader.metrics.counter("cxlkv_client_loaded_blocks_total") == 4
        for name in views:
            for a, b in zip(range(4), [7, 6, 5, 4]):
                assert torch.equal(_logical_block(views[name], a), _logical_block(into[name], b)), (name, a)
        # The same plan with another rank's keys only: the reader hashes.
        meta.loads[0].keys = {b"another rank": meta.loads[0].keys[reader._ns]}
        reader.bind_connector_metadata(meta)
        reader.start_load_kv(None)
        assert (calls["get_by_key"], calls["get_by_hash"]) == (1, 1)
        assert reader.metrics.counter("cxlkv_client_loaded_blocks_total") == 8
    finally:
        reader.shutdown()
        worker.shutdown()
        sched.shutdown()


def test_a_cache_that_does_not_split_into_blocks_is_refused_naming_the_layer():
    with pytest.raises(ValueError, match="model.layers.0.attn"):
        cv.paged_kv_of({"model.layers.0.attn": torch.zeros(4, 2, 24, 128)}, BS)


def test_a_worker_saves_a_prefix_it_saw_in_the_pool_once_and_puts_a_chain_whole_when_its_parent_is_gone(env):
    """Requests sharing a prefix each save it; the worker sends the index
    only the blocks past what its saves already found or put in the pool
    (one block copied, none looked up again), and a chain whose remembered
    parent is no longer cached (evicted) goes again whole: the pool ends up
    with every block, byte for byte."""
    spec = _attn()
    views = _views(spec, "LBHNC", seed=5)
    c = cv.CxlkvConnector(_vllm_config(env.uri), KVConnectorRole.WORKER, _kvcc(spec))
    try:
        c.register_kv_caches(views)
        h = [bytes([i]) * 32 for i in range(8)]

        def save(*transfers):
            c._meta = cv.CxlkvConnectorMetadata(saves=list(transfers))
            c.wait_for_save()
            return c.metrics.counter("cxlkv_client_store_bytes_total"), c.metrics.counter(
                "cxlkv_client_stored_blocks_total")

        block = cv.paged_kv_of(views, BS).block_bytes
        b1, s1 = save(cv._Transfer("r1", h[:3], [0, 1, 2]))
        assert (b1, s1) == (3 * block, 3)
        # r2 shares r1's three blocks and adds one: only that one reaches the index.
        b2, s2 = save(cv._Transfer("r2", h[:4], [0, 1, 2, 3]))
        assert (b2 - b1, s2 - s1) == (block, 1)
        # A remembered block the pool no longer has (as if evicted): the
        # trimmed chain's put finds no parent, and the chain goes whole.
        c._in_pool[b"\xee" * 32] = None
        b3, s3 = save(cv._Transfer("r3", [b"\xee" * 32, h[5]], [4, 5]))
        assert (b3 - b2, s3 - s2) == (2 * block, 2)
        keys = cxlkv.keys_from_hashes(h[:4] + [b"\xee" * 32, h[5]], c._ns)
        kv = env.store(3)
        other = _views(spec, "LBHNC", seed=9)
        assert cxlkv.get_ok(kv.get(keys, cv.paged_kv_of(other, BS), [0, 1, 2, 3, 4, 5])).all()
        for name in views:
            for b in range(6):
                assert torch.equal(_logical_block(views[name], b), _logical_block(other[name], b)), (name, b)
    finally:
        c.shutdown()
