# SPDX-License-Identifier: MIT
"""cxlkv's SGLang HiCache storage backend inside the real SGLang (0.5.23) on
the CPU: SGLang's dynamic storage backend factory builds it from a real
HiCacheStorageConfig, real SGLang host memory pools (MHA, MLA, Mamba; CPU
tensors, no pinned memory) are registered with it, and SGLang's own cache
controller code (its v1 / generic page get and set functions and its storage
hit query, called unbound on a stand-in controller, as SGLang's server needs
a GPU and distributed groups to build the controller itself) moves pages.
Every host layout SGLang has, for MHA and MLA; pages read back into a second
host pool bit for bit; two nodes of one pool share pages; configurations
whose page bytes differ never see each other's keys."""
import warnings
from types import SimpleNamespace

import pytest
import torch

warnings.filterwarnings("ignore", message=".*support.*currently.*")

import cxlkv  # noqa: E402
from conftest import run_in_process  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout, KVBuffers, MambaStateBufferInfo, MHABufferInfo, MLABufferInfo, MLASplitBuffers)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage, HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

PS, LAYERS, TOKENS = 4, 2, 64
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head", "page_unified"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_unified", "page_first_kv_split"]
CPU = torch.device("cpu")


def _ptrs(ts):
    return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)


def mha_host(layout, dtype=torch.bfloat16, heads=2, head_dim=8):
    """SGLang's MHA host pool over CPU device buffers."""
    k = tuple(torch.zeros(TOKENS, heads, head_dim, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS, heads, head_dim, dtype=dtype) for _ in range(LAYERS))
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=_ptrs(k), v_data_ptrs=_ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=PS, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, dtype=dtype, device=CPU)
    return MHATokenToKVPoolHost(info, 2.0, 0, PS, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def mla_host(layout, dtype=torch.bfloat16, lora=12, rope=4):
    """SGLang's MLA host pool; page_first_kv_split (Ascend's split K / V
    buffers) from split device buffers, the others from packed rows."""
    if layout == "page_first_kv_split":
        bufs = MLASplitBuffers(k=torch.zeros(LAYERS, TOKENS, 1, lora, dtype=dtype),
                               v=torch.zeros(LAYERS, TOKENS, 1, rope, dtype=dtype), index_k=None, index_scales=None,
                               index_layer_indices=(), k_width=lora, v_width=rope, index_width=0)
        ptrs = None
    else:
        bufs = tuple(torch.zeros(TOKENS, 1, lora + rope, dtype=dtype) for _ in range(LAYERS))
        ptrs = _ptrs(bufs)
    info = MLABufferInfo(buffers=bufs, data_ptrs=ptrs, layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS,
                         page_size=PS, kv_lora_rank=lora, qk_rope_head_dim=rope, kv_cache_dim=lora + rope,
                         dtype=dtype, device=CPU)
    return MLATokenToKVPoolHost(info, 2.0, 0, PS, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
                                target_layer_num=LAYERS)


def mamba_host():
    info = MambaStateBufferInfo(temporal=torch.zeros(2, 9, 4, 8), conv=(torch.zeros(2, 9, 3, 8, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=8, pin_memory=False, device="cpu", layout="page_first")


def host_buffers(h):
    """Every host tensor of a pool (what a page's bytes live in)."""
    if getattr(h, "layout", None) == "page_first_kv_split":
        return [h.k_buffer, h.v_buffer]
    if isinstance(h, MambaPoolHost):
        return [h.temporal_buffer, *h.conv_buffer]
    return [h.kv_buffer]


def fill(h, seed):
    g = torch.Generator().manual_seed(seed)
    for b in host_buffers(h):
        b.view(torch.uint8).copy_(torch.randint(0, 256, b.view(torch.uint8).shape, generator=g, dtype=torch.uint8))


def page_bytes(h, start):
    """The bytes of the page starting at token ``start``, found through the
    pool's own page meta (or, where SGLang has none, its page block)."""
    if h.layout == "page_unified":
        return h.kv_buffer[start // h.page_size].contiguous().view(torch.uint8).clone()
    ptrs, sizes = h.get_page_buffer_meta(torch.arange(start, start + h.page_size))
    out = []
    for p, n in zip(ptrs, sizes):
        for b in host_buffers(h):
            base = b.data_ptr()
            if base <= p < base + b.numel() * b.element_size():
                flat = b.view(-1).view(torch.uint8) if b.is_contiguous() else None
                out.append(flat[p - base:p - base + n].clone())
                break
        else:
            raise AssertionError("a page piece outside the pool's buffers")
    return torch.cat(out)


def config(uri, node, tp=(0, 1), cp=(0, 1), mla=False, v1=True, model="tiny-model", **extra):
    ex = {"backend_name": "cxlkv", "module_path": "cxlkv.integrations.sglang", "class_name": "CxlkvHiCacheStorage",
          "pool": uri, "node": node, **extra}
    if v1:
        ex["interface_v1"] = 1
    return HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=cp[0],
                                attn_cp_size=cp[1], is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name=model, extra_config=ex)


def backend(cfg, host):
    """What HiCacheController.attach_storage_backend does: the factory, then the host pool."""
    b = StorageBackendFactory.create_backend("dynamic", cfg, host)
    b.register_mem_pool_host(host)
    b.on_host_pools_registered()
    return b


def hashes(n, seed=0):
    """Real SGLang page hashes of ``n`` pages of token ids."""
    return get_storage_hash_str(list(range(seed * 1000, seed * 1000 + n * PS)), None, page_size=PS)


def ctrl(b, host):
    """A stand-in for HiCacheController's state that its page functions read."""
    return SimpleNamespace(storage_backend=b, storage_host_pool=host, page_size=host.page_size)


class Op:
    request_id = "r"

    def is_terminated(self):
        return False


def pages_idx(starts, ps=PS):
    return torch.cat([torch.arange(s, s + ps) for s in starts])


def kind_host(kind, layout, **kw):
    return (mha_host if kind == "mha" else mla_host)(layout, **kw)


CASES = [("mha", x) for x in MHA_LAYOUTS] + [("mla", x) for x in MLA_LAYOUTS]


def test_factory_builds_a_hicache_storage(env):
    h = mha_host("page_first")
    b = backend(config(env.uri, 2), h)
    assert isinstance(b, HiCacheStorage) and type(b).__name__ == "CxlkvHiCacheStorage"
    assert b"layout=page_first;" in b.namespace and b"dtype=bfloat16;" in b.namespace
    b.close()


@pytest.mark.parametrize("kind,layout", CASES)
def test_v1_pages_round_trip_through_sglang_controller_code(env, kind, layout):
    """SGLang's _page_set_zero_copy / _storage_hit_query-style batch_exists /
    _page_get_zero_copy move pages of every layout into a second host pool."""
    src, dst = kind_host(kind, layout), kind_host(kind, layout)
    fill(src, 1)
    a = backend(config(env.uri, 2, mla=kind == "mla"), src)
    b = backend(config(env.uri, 3, mla=kind == "mla"), dst)
    keys = hashes(5)
    at, to = [8, 0, 24, 4, 40], [12, 32, 0, 20, 16]
    assert a.batch_exists(keys) == 0
    assert HiCacheController._page_set_zero_copy(ctrl(a, src), keys, pages_idx(at)) is True
    assert b.batch_exists(keys) == 5 and b.batch_exists(keys + hashes(1, 9)) == 5
    assert HiCacheController._page_get_zero_copy(ctrl(b, dst), Op(), keys, pages_idx(to)) == 5
    for s, d in zip(at, to):
        assert torch.equal(page_bytes(src, s), page_bytes(dst, d)), (s, d)
    # pages not in the pool: False, never None
    assert b.batch_get_v1(hashes(2, 7), pages_idx([0, 4])) == [False, False]
    a.close()
    b.close()


@pytest.mark.parametrize("kind,layout", [c for c in CASES if c[1] not in ("page_unified", "page_first_kv_split")])
def test_generic_path_round_trips_under_its_own_label(env, kind, layout):
    """SGLang without interface_v1: _generic_page_set / _generic_page_get
    (flat data pages); those keys are not the v1 keys (byte orders differ)."""
    src, dst = kind_host(kind, layout), kind_host(kind, layout)
    fill(src, 2)
    a = backend(config(env.uri, 2, mla=kind == "mla", v1=False), src)
    b = backend(config(env.uri, 3, mla=kind == "mla", v1=False), dst)
    keys = hashes(3, 1)
    at, to = [4, 16, 28], [40, 8, 0]
    assert HiCacheController._generic_page_set(ctrl(a, src), keys, pages_idx(at)) is True
    assert b.batch_exists(keys) == 3
    assert HiCacheController._generic_page_get(ctrl(b, dst), Op(), keys, pages_idx(to)) == 3
    for s, d in zip(at, to):
        assert torch.equal(src.get_data_page(s).view(torch.uint8), dst.get_data_page(d).view(torch.uint8))
    v1 = backend(config(env.uri, 4, mla=kind == "mla"), kind_host(kind, layout))
    assert v1.namespace != a.namespace and b"io=flat;" in a.namespace and b"io=v1;" in v1.namespace
    assert v1.batch_exists(keys) == 0
    for x in (a, b, v1):
        x.close()


def _other_node_reads(uri, node, keys, starts):
    h = mha_host("page_head")
    b = backend(config(uri, node, tp=(1, 2)), h)
    n = b.batch_exists(keys)
    ok = b.batch_get_v1(keys[:n], pages_idx(starts[:n]))
    out = [page_bytes(h, s).numpy() for s in starts[:n]]
    b.close()
    return n, ok, out


def test_two_nodes_share_pages(env):
    h = mha_host("page_head")
    fill(h, 3)
    b = backend(config(env.uri, 2, tp=(1, 2)), h)
    keys = hashes(4, 2)
    at = [0, 8, 16, 24]
    assert b.batch_set_v1(keys, pages_idx(at)) == [True] * 4
    n, ok, got = run_in_process(_other_node_reads, env.uri, 5, keys + hashes(1, 8), [4, 12, 20, 28, 32])
    assert n == 4 and ok == [True] * 4
    for s, g in zip(at, got):
        assert (page_bytes(h, s).numpy() == g).all()
    b.close()


def test_configurations_never_see_each_others_keys(env):
    """tp ranks, attention-cp ranks, layouts, KV dtypes, MHA / MLA, page
    sizes in bytes: each its own namespace; a page written under one is a
    miss under every other."""
    variants = {
        "base": (config(env.uri, 2), mha_host("page_first")),
        "tp1": (config(env.uri, 2, tp=(1, 2)), mha_host("page_first")),
        "tp0of2": (config(env.uri, 2, tp=(0, 2)), mha_host("page_first")),
        "cp1": (config(env.uri, 2, cp=(1, 2)), mha_host("page_first")),
        "cp0of2": (config(env.uri, 2, cp=(0, 2)), mha_host("page_first")),
        "direct": (config(env.uri, 2), mha_host("page_first_direct")),
        "head": (config(env.uri, 2), mha_host("page_head")),
        "layer": (config(env.uri, 2), mha_host("layer_first")),
        "fp16": (config(env.uri, 2), mha_host("page_first", dtype=torch.float16)),
        "fp32": (config(env.uri, 2), mha_host("page_first", dtype=torch.float32)),
        "mla": (config(env.uri, 2, mla=True), mla_host("page_first")),
        "mla_cp1": (config(env.uri, 2, mla=True, cp=(1, 2)), mla_host("page_first")),
        "model2": (config(env.uri, 2, model="other-model"), mha_host("page_first")),
    }
    bs = {k: backend(c, h) for k, (c, h) in variants.items()}
    nss = {k: b.namespace for k, b in bs.items()}
    assert len(set(nss.values())) == len(nss), nss
    keys = hashes(2, 3)
    kset = {tuple(map(tuple, cxlkv.keys_from_hashes(keys, ns).tolist())) for ns in nss.values()}
    assert len(kset) == len(nss)
    # pages under "base" only: a miss under every other configuration
    assert bs["base"].batch_set_v1(keys, pages_idx([0, 4])) == [True, True]
    for k, b in bs.items():
        assert b.batch_exists(keys) == (2 if k == "base" else 0), k
        assert b.batch_get_v1(keys, pages_idx([8, 12])) == ([True, True] if k == "base" else [False, False]), k
    # every configuration's own pages (other bytes each) come back as written
    for i, (k, b) in enumerate(bs.items()):
        h = variants[k][1]
        fill(h, 100 + i)
        if k != "base":
            assert b.batch_set_v1(keys, pages_idx([0, 4])) == [True, True], k
    for k, b in bs.items():
        h = variants[k][1]
        if k == "base":
            continue
        assert b.batch_get_v1(keys, pages_idx([8, 12])) == [True, True], k
        assert torch.equal(page_bytes(h, 0), page_bytes(h, 8)) and torch.equal(page_bytes(h, 4), page_bytes(h, 12)), k
    for b in bs.values():
        b.close()


def test_mla_replicated_pages_only_the_writer_writes(env):
    r0 = backend(config(env.uri, 2, tp=(0, 2), mla=True), mla_host("page_first"))
    r1h = mla_host("page_first")
    r1 = backend(config(env.uri, 3, tp=(1, 2), mla=True), r1h)
    fill(r0.mem_pool_host, 4)
    keys = hashes(2, 4)
    assert r0.namespace == r1.namespace  # MLA KV is the same on every tp rank
    assert r1.batch_set_v1(keys, pages_idx([0, 4])) == [True, True] and r1.batch_exists(keys) == 0
    assert r0.batch_set_v1(keys, pages_idx([0, 4])) == [True, True] and r1.batch_exists(keys) == 2
    assert r1.batch_get_v1(keys, pages_idx([8, 12])) == [True, True]
    assert torch.equal(page_bytes(r0.mem_pool_host, 4), page_bytes(r1h, 12))
    r0.close()
    r1.close()


def test_v2_side_pools_of_a_hybrid_model(env):
    """The hybrid cache controller's calls: side pools registered with
    register_mem_host_pool_v2 (an SWA MHA pool, a Mamba state pool), then
    batch_set_v2 / batch_exists_v2 (all_pages, trailing_pages) /
    batch_get_v2 into a second set of pools."""
    kv, swa, mamba = mha_host("page_first"), mha_host("page_first"), mamba_host()
    kv2, swa2, mamba2 = mha_host("page_first"), mha_host("page_first"), mamba_host()
    for h, s in ((kv, 5), (swa, 6), (mamba, 7)):
        fill(h, s)
    a = backend(config(env.uri, 2), kv)
    a.register_mem_host_pool_v2(swa, PoolName.SWA)
    a.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    a.on_host_pools_registered()
    b = backend(config(env.uri, 3), kv2)
    b.register_mem_host_pool_v2(swa2, PoolName.SWA)
    b.register_mem_host_pool_v2(mamba2, PoolName.MAMBA)
    keys = hashes(4, 5)
    assert a.batch_set_v1(keys, pages_idx([0, 4, 8, 12])) == [True] * 4
    # SWA pages of all 4 pages; Mamba state of the last page only (slot 3)
    res = a.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=pages_idx([16, 20, 24, 28]), keys=keys),
                          PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([3]), keys=keys[3:])])
    assert res == {PoolName.SWA: [True] * 4, PoolName.MAMBA: [True]}
    r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, hit_policy=PoolHitPolicy.ALL_PAGES),
                                 PoolTransfer(name=PoolName.MAMBA, keys=keys[3:],
                                              hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 4 and r.restorable_prefix_pages == [4]
    assert r.extra_pool_hit_pages[PoolName.SWA] == 4 and r.extra_pool_hit_pages[PoolName.MAMBA] == 4
    # Mamba state only for page 4: shorter prefixes cannot be restored
    r = b.batch_exists_v2(keys[:3], [PoolTransfer(name=PoolName.MAMBA, keys=keys[2:3],
                                                  hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
    got = b.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=pages_idx([40, 36, 32, 44]), keys=keys),
                          PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([5]), keys=keys[3:])])
    assert got == {PoolName.SWA: [True] * 4, PoolName.MAMBA: [True]}
    for s, d in zip([16, 20, 24, 28], [40, 36, 32, 44]):
        assert torch.equal(page_bytes(swa, s), page_bytes(swa2, d))
    assert torch.equal(page_bytes(mamba, 3), page_bytes(mamba2, 5))
    # a side pool's pages are not the KV pages of the same hashes
    assert b.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=pages_idx([0]), keys=hashes(1, 6))]) \
        == {PoolName.SWA: [False]}
    # a pool that was never registered: False per key, never an exception
    assert b.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=pages_idx([0]), keys=keys[:1])]) \
        == {PoolName.INDEXER: [False]}
    a.close()
    b.close()


def test_pools_it_cannot_address_are_refused_at_start_up(env):
    """page_unified / page_first_kv_split without interface_v1 (SGLang has no
    flat pages for them): the attach fails naming the pool and the layout."""
    for h in (mha_host("page_unified"), mla_host("page_first_kv_split")):
        with pytest.raises(ValueError, match=f"layout '{h.layout}'"):
            backend(config(env.uri, 2, v1=False), h)
