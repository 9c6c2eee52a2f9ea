# SPDX-License-Identifier: MIT
"""The cxlkv package: pools, keys, errors, batched put / get / pin over NumPy
arrays and PyTorch tensors in every paged layout."""
import array
import errno
import hashlib
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import cxlkv
from cxlkv import _lib


def test_pool_format_open_info_and_errors_name_the_pool(env):
    info = env.pool.info()
    assert info["uri"] == env.uri and info["size"] == 256 << 20
    assert {"control", "index", "alloc", "kv"} <= {c["name"] for c in info["carves"]}
    with pytest.raises(cxlkv.CxlkvError) as e:
        cxlkv.Pool(env.uri + "x")  # another size: no such pool file
    assert e.value.errno in (errno.ENOENT, errno.EINVAL)
    assert "shm:" in str(e.value) and cxlkv.last_error() in str(e.value)
    with pytest.raises(cxlkv.CxlkvError) as e:
        cxlkv.Pool.format(env.uri)  # formatting a valid pool needs force
    assert env.uri.split(":")[1] in str(e.value)


def test_block_keys_are_chained_and_match_the_c_api():
    toks = list(range(100, 164))
    k = cxlkv.block_keys(toks, 16)
    assert k.shape == (4, 2) and k.dtype == np.uint64
    # a prefix's keys are a prefix of the keys; one token changes all later keys
    assert (cxlkv.block_keys(toks[:40], 16) == k[:2]).all()
    t2 = list(toks)
    t2[20] += 1
    k2 = cxlkv.block_keys(t2, 16)
    assert (k2[0] == k[0]).all() and not (k2[1:] == k[1:]).all(axis=1).any()
    assert not (cxlkv.block_keys(toks, 16, extras=b"model-b") == k).all(axis=1).any()
    # The documented formula (keys.hpp) with an independent XXH3 is not in the
    # stdlib; compare against the C API called directly instead.
    import ctypes as C
    out = (_lib.KvKey * 4)()
    arr = (C.c_uint32 * 64)(*toks)
    assert _lib.lib().cxlkv_kv_block_keys(arr, 64, 16, None, 0, out, 4) == 4
    assert [(o.lo, o.hi) for o in out] == [tuple(map(int, r)) for r in k]
    assert cxlkv.block_keys(torch.tensor(toks), 16).tolist() == k.tolist()
    with pytest.raises(ValueError):
        cxlkv.block_keys([-1, 2], 1)


def test_engine_hash_keys_follow_the_documented_rule():
    ns = cxlkv.namespace(model="m", dtype="bf16", tp_rank=1, tp_size=2)
    h = hashlib.sha256(b"block").digest()
    d = hashlib.blake2b(digest_size=16, person=b"cxlkv-ekey-v1")
    d.update(struct.pack("<I", len(ns)) + ns + b"b" + h)
    want = struct.unpack("<QQ", d.digest())
    assert cxlkv.engine_key(h, ns) == want
    ks = cxlkv.keys_from_hashes([h, "abc", 12345, -7], ns)
    assert ks.shape == (4, 2) and len({tuple(r) for r in ks.tolist()}) == 4
    assert tuple(cxlkv.keys_from_hashes([h], b"other")[0]) != want  # namespaces separate
    assert cxlkv.to_hex(ks[0]) == f"{want[1]:016x}{want[0]:016x}"
    assert (cxlkv.as_keys([cxlkv.to_hex(ks[0]), cxlkv.to_int(ks[1])]) == ks[:2]).all()


def _hashlib_key(h, ns):
    """The documented rule (keys.py) written with hashlib, beside the C library's."""
    if hasattr(h, "hash_value"):
        h = h.hash_value
    if isinstance(h, (bytes, bytearray, memoryview)):
        item = b"b" + bytes(h)
    elif isinstance(h, str):
        item = b"s" + h.encode()
    else:
        item = b"i" + int(h).to_bytes(32, "little", signed=True)
    d = hashlib.blake2b(digest_size=16, person=b"cxlkv-ekey-v1")
    d.update(struct.pack("<I", len(ns)) + ns + item)
    lo, hi = struct.unpack("<QQ", d.digest())
    return (1 if lo == 0 and hi == 0 else lo), hi


def test_engine_keys_hashed_in_c_equal_hashlibs_for_every_kind_and_length():
    """keys_from_hashes runs in the C library (cxlkv_kv_engine_keys): the
    same keys as hashlib, across BLAKE2b's 128-byte block edges, for bytes of
    any length (vLLM's one-join path and the mixed path), str, int and
    objects with a hash_value."""
    import random

    class Old:  # an older vLLM BlockHash tuple
        def __init__(self, v):
            self.hash_value = v
    rng = random.Random(7)
    for trial in range(200):
        ns = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 95, 122, 123, 124, 127, 128, 129, 300])))
        same = rng.random() < 0.5
        n = rng.randrange(1, 9)
        if same:
            ln = rng.choice([0, 1, 32, 118, 123, 127, 128, 250])
            hs = [bytes(rng.randrange(256) for _ in range(ln)) for _ in range(n)]
        else:
            hs = [rng.choice([bytes(rng.randrange(256) for _ in range(rng.randrange(0, 140))), bytearray(b"xy"),
                              "h\u00e9" * rng.randrange(0, 50), rng.randrange(-2 ** 255, 2 ** 255),
                              Old(rng.randrange(1 << 60))]) for _ in range(n)]
        got = cxlkv.keys_from_hashes(hs, ns)
        assert [tuple(map(int, r)) for r in got] == [_hashlib_key(h, ns) for h in hs], (trial, ns, hs)
        assert cxlkv.engine_key(hs[0], ns) == _hashlib_key(hs[0], ns)
    assert cxlkv.keys_from_hashes([], b"ns").shape == (0, 2)
    assert cxlkv.keys_from_hashes(iter([b"a", b"b"]), b"ns").shape == (2, 2)
    with pytest.raises(TypeError, match="float"):
        cxlkv.keys_from_hashes([b"a", 1.5], b"ns")


def test_put_chains_puts_every_chain_of_a_step_in_one_call(env):
    """Several requests' chains in one put: a chain below a block an earlier
    chain of the same call publishes, a shared prefix found EXISTS, a chain
    whose parent is not cached failing alone; every block reads back."""
    kv = env.store()
    blocks = np.random.default_rng(3).integers(0, 255, (9, 4096), dtype=np.uint8)
    ks = cxlkv.keys_from_hashes([f"b{i}" for i in range(9)], b"chains")
    a, b, x = ks[0:3], ks[3:5], ks[5:7]
    keys = np.concatenate([a, b, x, a[:2]])  # A: root; B: below A[2]; X: parent unknown; A again
    src = [blocks[i] for i in (0, 1, 2, 3, 4, 5, 6, 0, 1)]
    st = kv.put_chains(keys, [3, 2, 2, 2], [None, a[2], cxlkv.engine_key("nowhere", b"chains"), None], src)
    assert list(st) == [0, 0, 0, 0, 0, -errno.ENOENT, cxlkv.CANCELED, cxlkv.EXISTS, cxlkv.EXISTS]
    assert kv.lookup(np.concatenate([a, b])) == 5 and kv.lookup(x) == 0
    out = [bytearray(4096) for _ in range(5)]
    assert cxlkv.get_ok(kv.get(np.concatenate([a, b]), out)).all()
    assert all(bytes(o) == blocks[i].tobytes() for i, o in enumerate(out))
    with pytest.raises(ValueError, match="add up"):
        kv.put_chains(keys, [3, 2], [None, None], src)
    with pytest.raises(ValueError, match="parents"):
        kv.put_chains(keys, [9], [None, None], src)
    assert len(kv.put_chains(keys[:0], [], [], [])) == 0


@pytest.mark.parametrize("src_name", ["vllm", "sglang"])
def test_engine_step_calls_put_and_get_by_the_engines_hashes(env, src_name):
    """put_engine_chains / get_engine (one C call each: keys from the
    engine's hashes, chunk lists from the layout) store what put_chains of
    keys_from_hashes stores, under the same keys, and read it back into any
    layout; hashes of every kind, None parents, bad ids refused."""
    layers, blocks, tokens, heads, head = 2, 6, 8, 2, 16  # _read_block's 6 blocks
    ref, lay = _layouts(layers, blocks, tokens, heads, head, torch.float32)
    kv = env.store()
    src = lay[src_name][0]
    hs = [b"h0", b"h1", b"h2", 7, "h4"]  # bytes, an int, a str: the encodings of keys_from_hashes
    st = kv.put_engine_chains(b"ns", hs, [3, 2], [None, b"h1"], src, [5, 1, 4, 0, 2])
    assert list(st) == [cxlkv.RESERVED] * 5
    keys = cxlkv.keys_from_hashes(hs, b"ns")
    assert kv.lookup(keys[:2]) == 2 and kv.lookup(np.concatenate([keys[:2], keys[3:]])) == 4  # 7 below h1
    assert list(kv.put_engine_chains(b"ns", hs[:3], [3], [None], src, [5, 1, 4])) == [cxlkv.EXISTS] * 3
    for name, (dst, raw) in _layouts(layers, blocks, tokens, heads, head, torch.float32)[1].items():
        for t in (raw if isinstance(raw, (list, tuple)) else [raw]):
            for x in (t if isinstance(t, list) else [t]):
                x.zero_()
        st = kv.get_engine(b"ns", hs + [b"not cached"], dst, [0, 1, 2, 3, 4, 5])
        assert list(st) == [cxlkv.RESERVED] * 5 + [cxlkv.MISS], name
        for d, s in zip(range(5), [5, 1, 4, 0, 2]):
            assert torch.equal(_read_block(name, raw, d, layers), ref[s]), (name, d)
    # The same keys as the key-based calls: a get by key finds them.
    out = _layouts(layers, blocks, tokens, heads, head, torch.float32)[1][src_name][0]
    assert cxlkv.get_ok(kv.get(keys, out, [5, 4, 3, 2, 1])).all()
    assert (kv.get_engine(b"other ns", hs[:1], out, [0]) == cxlkv.MISS).all()
    with pytest.raises(cxlkv.CxlkvError, match="out of range"):
        kv.get_engine(b"ns", hs[:1], out, [blocks])
    with pytest.raises(ValueError, match="block ids"):
        kv.put_engine_chains(b"ns", hs[:2], [2], [None], src, [0])
    with pytest.raises(ValueError, match="parents"):
        kv.put_engine_chains(b"ns", hs[:2], [2], [None, None], src, [0, 1])
    with pytest.raises(cxlkv.CxlkvError, match="chain lengths"):
        kv.put_engine_chains(b"ns", hs[:2], [3], [None], src, [0, 1])
    assert len(kv.get_engine(b"ns", [], out, [])) == 0


@pytest.mark.parametrize("sizes", [[32] * 5, [32, 8, 32, 1, 16]])
def test_engine_step_put_of_bytes_hashes_stores_under_keys_from_hashes(env, sizes):
    """put_engine_step (the adapters' once-a-step put: no numpy on the way)
    of bytes hashes, all of one length (vLLM's 32: the encoding's fast
    path) or of several, stores each block under keys_from_hashes's key of
    its hash, with its parent's link; returns the blocks in the pool and an
    array.array of statuses."""
    layers, blocks, tokens, heads, head = 2, 6, 8, 2, 16
    ref, lay = _layouts(layers, blocks, tokens, heads, head, torch.float32)
    kv = env.store()
    src = lay["vllm"][0]
    hs = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    rc, st = kv.put_engine_step(b"ns", hs, [2, 3], [None, hs[1]], src, [5, 1, 4, 0, 2])
    assert rc == 5 and isinstance(st, array.array) and list(st) == [cxlkv.RESERVED] * 5
    keys = cxlkv.keys_from_hashes(hs, b"ns")
    assert kv.lookup(keys) == 5  # the second chain hangs below hs[1]
    rc, st = kv.put_engine_step(b"ns", hs[:2], [2], [None], src, [5, 1])
    assert rc == 2 and list(st) == [cxlkv.EXISTS] * 2
    out = _layouts(layers, blocks, tokens, heads, head, torch.float32)[1]["vllm"]
    assert cxlkv.get_ok(kv.get(keys, out[0], [0, 1, 2, 3, 4])).all()
    for d, s in zip(range(5), [5, 1, 4, 0, 2]):
        assert torch.equal(_read_block("vllm", out[1], d, layers), ref[s]), d
    assert kv.put_engine_step(b"ns", [], [], [], src, []) == (0, array.array("i"))


def test_paged_step_calls_put_and_get_by_keys_at_hand_as_the_hash_calls_do(env):
    """put_paged_step / get_paged_step (an engine step by keys some other
    process made, 16 bytes a key: cxlkv_kv_paged_put_chains / _get_many)
    store and read what put_engine_step / get_engine do by the hashes, under
    the same keys, parents included; malformed arguments are refused with
    the cause named, the all-zero key per block."""
    layers, blocks, tokens, heads, head = 2, 6, 8, 2, 16
    ref, lay = _layouts(layers, blocks, tokens, heads, head, torch.float32)
    kv = env.store()
    src = lay["vllm"][0]
    hs = [bytes([i + 1]) * 32 for i in range(5)]
    keys = cxlkv.keys_from_hashes(hs, b"ns")
    root = bytes(16)
    rc, st = kv.put_paged_step(keys.tobytes(), [2, 3], root + keys[1].tobytes(), src, [5, 1, 4, 0, 2])
    assert rc == 5 and isinstance(st, array.array) and list(st) == [cxlkv.RESERVED] * 5
    assert kv.lookup(keys) == 5  # the second chain hangs below hs[1]
    rc, st = kv.put_engine_step(b"ns", hs[:2], [2], [None], src, [5, 1])  # the hash call finds them
    assert rc == 2 and list(st) == [cxlkv.EXISTS] * 2
    out = _layouts(layers, blocks, tokens, heads, head, torch.float32)[1]["vllm"]
    st = kv.get_paged_step(keys.tobytes() + cxlkv.keys_from_hashes([b"not cached"], b"ns").tobytes(), out[0],
                           [0, 1, 2, 3, 4, 5])
    assert isinstance(st, array.array) and list(st) == [cxlkv.RESERVED] * 5 + [cxlkv.MISS]
    for d, s in zip(range(5), [5, 1, 4, 0, 2]):
        assert torch.equal(_read_block("vllm", out[1], d, layers), ref[s]), d
    # A chain whose parent is not cached; a reserved (all-zero) key.
    rc, st = kv.put_paged_step(cxlkv.keys_from_hashes([b"x"], b"ns").tobytes(), [1],
                               cxlkv.keys_from_hashes([b"nowhere"], b"ns").tobytes(), src, [3])
    assert rc == 0 and list(st) == [-errno.ENOENT]
    rc, st = kv.put_paged_step(root, [1], root, src, [3])
    assert rc == 0 and list(st) == [-errno.EINVAL] and "all-zero" in kv.last_error
    with pytest.raises(ValueError, match="16 bytes a key"):
        kv.put_paged_step(keys.tobytes()[:-1], [5], root, src, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="16 bytes a key"):
        kv.put_paged_step(keys.tobytes(), [5], root * 2, src, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="block ids"):
        kv.put_paged_step(keys.tobytes(), [5], root, src, [0])
    with pytest.raises(cxlkv.CxlkvError, match="chain lengths add up to 4 blocks, 5 keys"):
        kv.put_paged_step(keys.tobytes(), [4], root, src, [0, 1, 2, 3, 4])
    with pytest.raises(cxlkv.CxlkvError, match="out of range"):
        kv.get_paged_step(keys[:1].tobytes(), out[0], [blocks])
    with pytest.raises(ValueError, match="16 bytes a key"):
        kv.get_paged_step(b"short", out[0], [0])
    assert kv.put_paged_step(b"", [], b"", src, []) == (0, array.array("i"))
    assert len(kv.get_paged_step(b"", out[0], [])) == 0


def test_put_get_numpy_buffers_and_statuses(env):
    kv = env.store()
    keys = cxlkv.block_keys(np.arange(8 * 16), 16)
    bufs = [np.random.default_rng(i).integers(0, 255, 8192, dtype=np.uint8) for i in range(8)]
    st = kv.put(keys, bufs)
    assert (st == cxlkv.RESERVED).all()
    assert (kv.put(keys, bufs) == cxlkv.EXISTS).all()
    assert kv.lookup(keys) == 8
    out = [np.zeros(8192, np.uint8) for _ in range(8)]
    assert cxlkv.get_ok(kv.get(keys, out)).all()
    assert all((a == b).all() for a, b in zip(out, bufs))
    other = cxlkv.block_keys(np.arange(16) + 9999, 16)
    st = kv.get(np.concatenate([keys[:1], other]), out[:2])
    assert st.tolist() == [cxlkv.RESERVED, cxlkv.MISS]
    with pytest.raises(ValueError):
        kv.put(keys, bufs[:3])
    with pytest.raises(ValueError):
        kv.put(keys[:2], [bufs[0], bufs[1][:100]])


def _layouts(layers, blocks, tokens, heads, head, dtype):
    """The same KV content in four engine layouts."""
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(blocks, layers, 2, tokens, heads, head, generator=g).to(dtype)
    bf = ref.clone()
    vllm = [ref[:, l].transpose(0, 1).contiguous() for l in range(layers)]  # [2, blocks, tokens, heads, head]
    flashinfer = [ref[:, l].contiguous() for l in range(layers)]          # [blocks, 2, tokens, heads, head]
    sgl_k = [ref[:, l, 0].reshape(blocks * tokens, heads, head).contiguous() for l in range(layers)]
    sgl_v = [ref[:, l, 1].reshape(blocks * tokens, heads, head).contiguous() for l in range(layers)]
    return ref, {
        "block_first": (cxlkv.PagedKV.block_first(bf), bf),
        "vllm": (cxlkv.PagedKV.vllm(vllm), vllm),
        "flashinfer": (cxlkv.PagedKV.vllm(flashinfer, kv_dim=1), flashinfer),
        "sglang": (cxlkv.PagedKV.sglang(sgl_k, sgl_v, tokens), (sgl_k, sgl_v)),
    }


@pytest.mark.parametrize("src_name", ["block_first", "vllm", "flashinfer", "sglang"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_paged_layouts_interoperate_through_the_pool(env, src_name, dtype):
    layers, blocks, tokens, heads, head = 3, 6, 8, 2, 16
    ref, lay = _layouts(layers, blocks, tokens, heads, head, dtype)
    kv = env.store()
    keys = cxlkv.block_keys(np.arange(4 * tokens) + 5, tokens, extras=str(dtype).encode())
    src = lay[src_name][0]
    assert src.block_bytes == 2 * layers * tokens * heads * head * ref.element_size()
    src_ids = [4, 1, 5, 0]
    assert cxlkv.put_ok(kv.put(keys, src, src_ids)).all()
    # read back into every layout, into other block ids
    _, empty = _layouts(layers, blocks, tokens, heads, head, dtype)
    for name, (dst, raw) in empty.items():
        if name == "block_first":
            raw.zero_()
        dst_ids = [2, 3, 0, 5]
        # zero the destination first
        for t in (raw if isinstance(raw, list) else raw if isinstance(raw, tuple) else [raw]):
            for x in (t if isinstance(t, list) else [t]):
                x.zero_()
        assert cxlkv.get_ok(kv.get(keys, dst, dst_ids)).all(), name
        for i, (s, d) in enumerate(zip(src_ids, dst_ids)):
            got = _read_block(name, raw, d, layers)
            assert torch.equal(got, ref[s]), f"{src_name} -> {name}: block {i}"


def _read_block(name, raw, b, layers):
    if name == "block_first":
        return raw[b]
    if name == "vllm":
        return torch.stack([raw[l][:, b] for l in range(layers)])
    if name == "flashinfer":
        return torch.stack([raw[l][b] for l in range(layers)])
    k, v = raw
    tokens = k[0].shape[0] // 6
    return torch.stack([torch.stack([k[l][b * tokens:(b + 1) * tokens], v[l][b * tokens:(b + 1) * tokens]])
                        for l in range(layers)])


def test_pins_are_released_by_the_context_manager(env):
    kv = env.store()
    keys = cxlkv.block_keys(np.arange(3 * 16), 16)
    kv.put(keys, [np.full(1024, i, np.uint8) for i in range(3)])
    missing = cxlkv.block_keys(np.arange(16) + 777, 16)
    with kv.pin(np.concatenate([keys, missing])) as pins:
        assert pins.pinned.tolist() == [True, True, True, False]
        assert pins.status[3] == cxlkv.MISS
        out = [np.zeros(1024, np.uint8) for _ in range(4)]
        st = pins.fetch(out)
        assert st.tolist()[:3] == [0, 0, 0] and [int(o[0]) for o in out[:3]] == [0, 1, 2]
        assert (pins.lengths()[:3] == 1024).all()
    assert pins._released
    pins.release()  # twice is harmless


def test_strided_views_are_gathered_by_runs(env):
    kv = env.store()
    big = torch.arange(4 * 2 * 8 * 4 * 16, dtype=torch.float32).reshape(4, 2, 8, 4, 16)
    # heads sliced: [blocks, tokens, 2 of 4 heads, head] is not contiguous per block
    k = big[:, 0, :, :2]
    v = big[:, 1, :, 2:]
    src = cxlkv.PagedKV.layer_first([(k, v)])
    assert src.chunks_per_block == 2 * 8
    keys = cxlkv.block_keys(np.arange(32), 8)
    assert cxlkv.put_ok(kv.put(keys, src, [0, 1, 2, 3])).all()
    out = torch.zeros(4, 1, 2, 8, 2, 16)
    assert cxlkv.get_ok(kv.get(keys, cxlkv.PagedKV.block_first(out), [0, 1, 2, 3])).all()
    assert torch.equal(out[:, 0, 0], k) and torch.equal(out[:, 0, 1], v)


def test_a_batch_is_one_c_call_not_calls_per_block(env):
    kv = env.store()
    L = _lib.lib()
    calls = {}
    names = ["cxlkv_kv_put_chain", "cxlkv_kv_get_many", "cxlkv_kv_reserve", "cxlkv_kv_write", "cxlkv_kv_publish",
             "cxlkv_kv_pin", "cxlkv_kv_fetch", "cxlkv_kv_unpin", "cxlkv_kv_pin_many", "cxlkv_kv_unpin_many"]
    orig = {n: getattr(L, n) for n in names}

    def counting(n):
        def f(*a):
            calls[n] = calls.get(n, 0) + 1
            return orig[n](*a)
        return f

    # KvStore's hot calls go through its own function objects (addresses, no casts)
    fast = {"_put_chain": "cxlkv_kv_put_chain", "_get_many": "cxlkv_kv_get_many"}
    own = {a: getattr(kv, a) for a in fast}

    def counting_own(a):
        def f(*args):
            calls[fast[a]] = calls.get(fast[a], 0) + 1
            return own[a](*args)
        return f

    try:
        for n in names:
            setattr(L, n, counting(n))
        for a in fast:
            setattr(kv, a, counting_own(a))
        keys = cxlkv.block_keys(np.arange(16 * 16), 16)
        assert cxlkv.put_ok(kv.put(keys, [np.zeros(512, np.uint8)] * 16)).all()
        assert cxlkv.get_ok(kv.get(keys, [np.zeros(512, np.uint8) for _ in range(16)])).all()
        with kv.pin(keys) as p:
            p.fetch([np.zeros(512, np.uint8) for _ in range(16)])
    finally:
        for n in names:
            setattr(L, n, orig[n])
        for a in fast:
            setattr(kv, a, own[a])
    assert calls == {"cxlkv_kv_put_chain": 1, "cxlkv_kv_get_many": 1, "cxlkv_kv_pin_many": 1,
                     "cxlkv_kv_unpin_many": 1}


_CLOSE_SCRIPT = r"""
import os, sys
import numpy as np
import cxlkv
from cxlkv.aio import AsyncKv
uri, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
cxlkv.Pool.format(uri, max_nodes=4)
pool = cxlkv.Pool(uri)
mgr = cxlkv.LockManager(pool)
kv = cxlkv.KvStore(pool, 1)
aio = AsyncKv(pool, 2)
gpu = cxlkv.Gpu(pool, reference=True)
keys = cxlkv.block_keys(np.arange(32), 16)
assert cxlkv.put_ok(kv.put(keys, [np.zeros(64, np.uint8)] * 2)).all()
rid = aio.submit_get(keys, [np.zeros(64, np.uint8) for _ in range(2)])
if mode == "close":
    pool.close()  # closes aio (after its queued request), kv, gpu, mgr first
    try:
        kv.lookup(keys)
    except ValueError as e:
        assert "closed" in str(e), e
    else:
        raise AssertionError("a KV store over a closed pool answered")
    mgr.stop(); kv.close(); aio.close(); gpu.close()  # closing twice is harmless
    print("ok")
else:
    print("ok")  # exit with everything open: interpreter teardown closes them in any order
"""


@pytest.mark.parametrize("mode", ["close", "exit"])
def test_closing_the_pool_first_or_exiting_with_everything_open_does_not_crash(tmp_path, mode):
    from conftest import make_uri, remove_pool_files
    uri, path = make_uri("close")
    script = tmp_path / "close.py"
    script.write_text(_CLOSE_SCRIPT)
    try:
        r = subprocess.run([sys.executable, str(script), uri, path, mode], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)
    finally:
        remove_pool_files(uri, path)


def test_help_explains_every_public_call():
    """help() on the package's classes and the engine adapters explains every
    public method and property (an engineer plugging cxlkv in reads these)."""
    import inspect
    from cxlkv.integrations import lmcache, sglang, vllm
    import cxlkv.aio
    import cxlkv.layerwise
    import cxlkv.metrics
    import cxlkv.pnm
    objs = {n: getattr(cxlkv, n) for n in cxlkv.__all__ if callable(getattr(cxlkv, n))}
    objs.update(AsyncKv=cxlkv.aio.AsyncKv, Metrics=cxlkv.metrics.Metrics, RawChunks=cxlkv.layout.RawChunks,
                LayerLoad=cxlkv.layerwise.LayerLoad, LayerSave=cxlkv.layerwise.LayerSave,
                PnmStore=cxlkv.pnm.PnmStore, CxlkvConnector=vllm.CxlkvConnectorImpl,
                CxlkvHiCacheStorage=sglang.CxlkvHiCacheStorage, CxlkvNativePlugin=lmcache.CxlkvNativePlugin)
    missing = []
    for name, o in objs.items():
        if not (inspect.getdoc(o) or "").strip():
            missing.append(name)
        if inspect.isclass(o):
            for m, f in inspect.getmembers(o):
                if not m.startswith("_") and (inspect.isfunction(f) or isinstance(f, property)) \
                        and not (f.__doc__ or "").strip():
                    missing.append(f"{name}.{m}")
    assert missing == []
    for cls, words in ((vllm.CxlkvConnectorImpl, ["pool", "node", "SCHEDULER", "WORKER"]),
                       (sglang.CxlkvHiCacheStorage, ["pool", "node", "register_mem_pool_host", "never None"])):
        doc = inspect.getdoc(cls)
        assert all(w in doc for w in words), (cls.__name__, doc)
