# SPDX-License-Identifier: MIT
"""cxlkv.integrations.sglang driven as SGLang HiCache drives an L3 backend:
construct with the storage config, register the host pool, backup thread
(batch_exists + batch_set_v1) and prefetch thread (batch_exists +
batch_get_v1) at once, pages read back on another host bit for bit, never a
None where SGLang indexes the result."""
import hashlib
import sys
import threading

import torch

import cxlkv
from conftest import run_in_process
from engine_fakes import SGLangHostPool, sglang_config, sglang_prefetch


def page_hashes(n, salt=b""):
    out, prior = [], b""
    for i in range(n):
        prior = hashlib.sha256(prior + salt + i.to_bytes(4, "little")).digest()
        out.append(prior.hex())
    return out


def test_module_imports_without_sglang():
    import cxlkv.integrations.sglang as cs
    assert "SGLang" in cs.__doc__ and "0.5" in cs.__doc__
    cls = cs.CxlkvHiCacheStorage
    for m in ("batch_exists", "batch_get_v1", "batch_set_v1", "get", "set", "exists", "batch_get", "batch_set",
              "register_mem_pool_host", "register_mem_host_pool_v2", "batch_exists_v2", "batch_get_v2",
              "batch_set_v2"):
        assert callable(getattr(cls, m)), m
    try:
        import sglang  # noqa: F401
    except ImportError:
        assert "sglang" not in sys.modules


def test_backup_then_prefetch_on_another_host(env):
    from cxlkv.integrations import sglang as cs
    b = cs.CxlkvHiCacheStorage(sglang_config(extra={"pool": env.uri, "node": 2}), None)
    host = SGLangHostPool()
    b.register_mem_pool_host(host)
    torch.manual_seed(0)
    host.kv_buffer.copy_(torch.randn_like(host.kv_buffer, dtype=torch.float32).to(host.kv_buffer.dtype))
    keys = page_hashes(6)
    first = [0, 32, 16, 64, 48, 96]  # the host pool pages holding the 6 pages
    idx = torch.cat([torch.arange(t, t + 16) for t in first])
    # backup thread: what is missing, then write it; a prefetch thread at the same time
    assert b.batch_exists(keys) == 0
    results = {}

    def backup():
        results["set"] = b.batch_set_v1(keys[:4], idx[: 4 * 16])

    def prefetch():
        results["exists"] = b.batch_exists(keys)

    ts = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    assert results["set"] == [True] * 4 and results["exists"] in range(0, 5)
    assert b.batch_set_v1(keys, idx) == [True] * 6  # 4 already there (EXISTS counts), 2 new
    assert b.batch_exists(keys) == 6 and b.exists(keys[5]) and not b.exists(page_hashes(1, b"x")[0])

    n, res, pages = run_in_process(sglang_prefetch, env.uri, 3, keys + page_hashes(1, b"missing"), first + [112])
    assert n == 6 and res == [True] * 6
    for p, t in zip(pages, first):
        assert (p == host.page(t).view(torch.int16).numpy()).all()
    # missing keys: a list of False, never None
    miss = page_hashes(2, b"nope")
    assert b.batch_get_v1(miss, torch.arange(0, 32)) == [False, False]
    assert b.batch_get_v1([], torch.zeros(0)) == [] and b.batch_set_v1([], torch.zeros(0)) == []
    # a bad host index list is reported per key, not raised
    assert b.batch_set_v1(keys[:2], torch.arange(0, 8)) in ([False, False], [True, True])
    b.close()


def test_layer_first_pages_are_pool_blocks_in_the_engine_independent_order(env):
    from cxlkv.integrations import sglang as cs
    b = cs.CxlkvHiCacheStorage(sglang_config(extra={"pool": env.uri, "node": 2}))
    host = SGLangHostPool(dtype=torch.float32)
    b.register_mem_pool_host(host)
    host.kv_buffer.copy_(torch.randn_like(host.kv_buffer))
    keys = page_hashes(1)
    assert b.batch_set_v1(keys, torch.arange(32, 48)) == [True]
    out = torch.zeros(3, 2, 16, 2, 16)  # [layers, K|V, tokens, heads, head]
    kv = env.store(4)
    assert cxlkv.get_ok(kv.get(cxlkv.keys_from_hashes(keys, b.namespace), [out])).all()
    assert torch.equal(out, host.kv_buffer[:, :, 32:48].transpose(0, 1))
    b.close()


def test_mla_only_rank_0_writes_and_old_interface(env):
    from cxlkv.integrations import sglang as cs
    r1 = cs.CxlkvHiCacheStorage(sglang_config(tp_rank=1, tp_size=2, is_mla=True, extra={"pool": env.uri, "node": 2}))
    r0 = cs.CxlkvHiCacheStorage(sglang_config(tp_rank=0, tp_size=2, is_mla=True, extra={"pool": env.uri, "node": 3}))
    for b in (r0, r1):
        b.register_mem_pool_host(SGLangHostPool())
    keys = page_hashes(2, b"mla")
    assert r1.batch_set_v1(keys, torch.arange(0, 32)) == [True, True]
    assert r1.batch_exists(keys) == 0  # rank 1 wrote nothing
    assert r0.batch_set_v1(keys, torch.arange(0, 32)) == [True, True]
    assert r1.batch_exists(keys) == 2  # and reads rank 0's pages
    v = torch.arange(64, dtype=torch.float32)
    assert r0.set("k-old", v)
    t = torch.zeros(64)
    assert r0.get("k-old", t) is t and torch.equal(t, v)
    assert r0.get("k-none", torch.zeros(64)) is None
    assert r0.batch_get(["k-old", "k-none"], [torch.zeros(64), torch.zeros(64)])[1] is None
    r0.close()
    r1.close()


def test_a_failing_call_answers_false_and_logs_why(env, caplog):
    """SGLang's threads must not see an exception, so a failed call answers
    False / 0 -- and says why on the cxlkv.sglang logger (before, nothing
    told the operator why every page came back False)."""
    import logging
    from cxlkv.integrations import sglang as cs
    b = cs.CxlkvHiCacheStorage(sglang_config(extra={"pool": env.uri, "node": 2}), None)
    keys = page_hashes(2, b"log")
    with caplog.at_level(logging.WARNING, logger="cxlkv.sglang"):
        assert b.batch_set_v1(keys, torch.arange(0, 32)) == [False, False]  # no host pool registered yet
        assert "register_mem_pool_host() was not called" in caplog.text
        caplog.clear()
        host = SGLangHostPool()
        b.register_mem_pool_host(host)
        assert b.batch_set_v1(keys, torch.arange(0, 32)) == [True, True]
        # host indices that are not whole pages: per-key False, the cause logged
        assert b.batch_get_v1(keys, torch.arange(0, 24)) == [False, False]
        assert "batch_get_v1 failed" in caplog.text and "24 host indices for 2 pages" in caplog.text
        caplog.clear()
        # a page of another size under a stored key: the library's message
        v = torch.arange(16, dtype=torch.float32)
        assert b.set("k-sized", v)
        assert b.get("k-sized", torch.zeros(8)) is None
        assert "get failed" in caplog.text and "EINVAL" in caplog.text
        caplog.clear()
        b.store.close()
        assert b.batch_exists(keys) == 0 and b.batch_get_v1(keys, torch.arange(0, 32)) == [False, False]
        assert b.batch_exists(keys) == 0  # the same cause again: counted, logged at powers of two
        assert f"KV store of node 2 on {env.uri} is closed" in caplog.text
        assert "(2 times)" in caplog.text
    b.close()


def test_namespace_names_every_part_that_changes_page_bytes(env):
    """tp rank, attention-cp rank, layout, KV dtype, model, the flat (older
    interface) cut: each its own namespace, so a page of one is a miss for
    every other; MLA KV is shared by the tp ranks (the same bytes as an
    unsharded pool of that geometry)."""
    from cxlkv.integrations import sglang as cs
    ex = {"pool": env.uri, "node": 2}
    variants = {
        "base": (sglang_config(extra=ex), SGLangHostPool()),
        "tp1": (sglang_config(tp_rank=1, tp_size=2, extra=ex), SGLangHostPool()),
        "cp1": (sglang_config(attn_cp=(1, 2), extra=ex), SGLangHostPool()),
        "cp0": (sglang_config(attn_cp=(0, 2), extra=ex), SGLangHostPool()),
        "layout": (sglang_config(extra=ex), SGLangHostPool(layout="page_first")),
        "fp16": (sglang_config(extra=ex), SGLangHostPool(dtype=torch.float16)),
        "model": (sglang_config(model="other", extra=ex), SGLangHostPool()),
        "flat": (sglang_config(extra={**ex, "interface_v1": 0}), SGLangHostPool()),
    }
    bs = {}
    for k, (c, h) in variants.items():
        bs[k] = cs.CxlkvHiCacheStorage(c, None)
        bs[k].register_mem_pool_host(h)
    nss = [b.namespace for b in bs.values()]
    assert len(set(nss)) == len(nss)
    assert b"attn_cp=1/2;" in bs["cp1"].namespace and b"layout=page_first;" in bs["layout"].namespace
    assert b"dtype=float16;" in bs["fp16"].namespace and b"io=flat;" in bs["flat"].namespace
    keys = page_hashes(2, b"ns")
    assert bs["base"].batch_set_v1(keys, torch.arange(0, 32)) == [True, True]
    for k, b in bs.items():
        assert b.batch_exists(keys) == (2 if k == "base" else 0), k
    # rank-replicated (MLA) KV: every tp rank and size holds the unsharded pages
    mla = [cs.CxlkvHiCacheStorage(sglang_config(is_mla=True, tp_rank=r, tp_size=2, extra=ex), None) for r in (0, 1)]
    for m in mla:
        m.register_mem_pool_host(SGLangHostPool())
    assert mla[0].namespace == mla[1].namespace == bs["base"].namespace
    for b in [*bs.values(), *mla]:
        b.close()


def test_v2_side_pools(env):
    """The hybrid controller's v2 calls with a side pool (SGLang's
    PoolTransfer fields), and a side pool it cannot address refused when it
    is registered, naming the pool."""
    from types import SimpleNamespace as T
    import pytest
    from cxlkv.integrations import sglang as cs
    b = cs.CxlkvHiCacheStorage(sglang_config(extra={"pool": env.uri, "node": 2}), None)
    kv, swa, swa2 = SGLangHostPool(), SGLangHostPool(layers=1), SGLangHostPool(layers=1)
    swa.kv_buffer.copy_(torch.randn_like(swa.kv_buffer, dtype=torch.float32).to(swa.kv_buffer.dtype))
    b.register_mem_pool_host(kv)
    b.register_mem_host_pool_v2(swa, "swa")
    keys = page_hashes(3, b"v2")
    assert b.batch_set_v1(keys, torch.arange(0, 48)) == [True] * 3
    assert b.batch_set_v2([T(name="swa", host_indices=torch.arange(0, 32), keys=keys[:2])]) == {"swa": [True, True]}
    r = b.batch_exists_v2(keys, [T(name="swa", keys=None, hit_policy="all_pages")])
    assert r.kv_hit_pages == 2 and r.restorable_prefix_pages == [1, 2]
    r = b.batch_exists_v2(keys[:2], [T(name="swa", keys=keys[1:2], hit_policy="trailing_pages")])
    assert r.kv_hit_pages == 2 and r.restorable_prefix_pages == [1, 2]
    b.register_mem_host_pool_v2(swa2, "swa")
    assert b.batch_get_v2([T(name="swa", host_indices=torch.arange(64, 96), keys=keys[:2])]) == {"swa": [True, True]}
    assert torch.equal(swa2.page(64).view(torch.int16), swa.page(0).view(torch.int16))
    assert b.batch_get_v2([T(name="nope", host_indices=torch.arange(0, 16), keys=keys[:1])]) == {"nope": [False]}

    class NoPages:
        layout, page_size, dtype = "page_unified", 16, torch.bfloat16

        def get_page_buffer_meta(self, indices):
            raise ValueError("Unsupported layout: page_unified")

        def get_data_page(self, index, flat=True):
            raise ValueError("Unsupported layout: page_unified")

    with pytest.raises(ValueError, match="host pool 'indexer'.*layout 'page_unified'"):
        b.register_mem_host_pool_v2(NoPages(), "indexer")
    b.close()
