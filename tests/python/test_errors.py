# SPDX-License-Identifier: MIT
"""What an engine engineer gets wrong first, and what the package answers:
a Python exception that names the object and the cause, never a crash, a
hang, a silent conversion or bytes written where they must not go."""
import errno

import numpy as np
import pytest
import torch

import cxlkv


def _published(kv, n=2, size=64, salt=0):
    keys = cxlkv.block_keys(np.arange(n * 16) + salt, 16)
    assert cxlkv.put_ok(kv.put(keys, [np.full(size, 7 + i, np.uint8) for i in range(n)])).all()
    return keys


@pytest.mark.parametrize("make", [
    lambda: bytes(64),
    lambda: memoryview(bytes(64)),
    lambda: np.frombuffer(bytes(64), np.uint8),
    lambda: _readonly(np.zeros(64, np.uint8)),
], ids=["bytes", "readonly-memoryview", "ndarray-over-bytes", "readonly-ndarray"])
def test_a_get_never_writes_into_a_read_only_buffer(env, make):
    kv = env.store()
    keys = _published(kv)
    dst = make()
    before = bytes(dst)
    with pytest.raises(ValueError, match=r"buffer 0 .*read-only"):
        kv.get(keys[:1], [dst])
    with kv.pin(keys[:1]) as p:
        with pytest.raises(ValueError, match="read-only"):
            p.fetch([dst])
    assert bytes(dst) == before  # before the check, the block's 7s landed in an immutable object
    ro = _readonly(np.zeros((2, 1, 2, 16, 1, 1), np.uint8))
    with pytest.raises(ValueError, match="PagedKV is read-only"):
        kv.get(keys[:1], cxlkv.PagedKV.block_first(ro), [0])
    # a writable buffer of the same size reads the block
    out = bytearray(64)
    assert cxlkv.get_ok(kv.get(keys[:1], [out])).all() and out == bytes([7]) * 64


def _readonly(a):
    a.flags.writeable = False
    return a


def test_a_read_only_memoryview_in_an_lmcache_get_fails_that_batch_not_the_bytes(env):
    from cxlkv.integrations.lmcache import CxlkvNativePlugin
    p = CxlkvNativePlugin(pool=env.uri, node=2)
    try:
        sid = p.submit_batch_set(["c0"], [memoryview(bytearray(b"x" * 256))])
        gid = p.submit_batch_get(["c0"], [memoryview(bytes(256))])
        got = {}
        for c in (p._aio.wait(sid, 60), p._aio.wait(gid, 60)):
            got[c.id] = c
        assert got[sid].ok
        assert not got[gid].ok and "read-only" in got[gid].error
    finally:
        p.close()


@pytest.mark.parametrize("keys,exc,words", [
    ([b"0123456789abcdef"], TypeError, ["key 0", "bytes", "keys_from_hashes"]),
    ([1.5], TypeError, ["key 0", "float"]),
    ([None], TypeError, ["key 0", "NoneType"]),
    (np.array([[1.5, 2.7]]), TypeError, ["dtype float64"]),
    ([(1 << 64, 0)], ValueError, ["key 0", "64 bits"]),
    # A negative Python int wrapped to 2**64-1 (while 2**64 was refused).
    ([(-1, 0)], ValueError, ["key 0", "lo -1 is outside 0 .. 2**64-1"]),
    ([(0, -5)], ValueError, ["key 0", "hi -5 is outside"]),
    (["zz" * 16], ValueError, ["key 0", "32 hex digits"]),
    (["abc"], ValueError, ["key 0", "32 hex digits"]),
    ("0" * 32, TypeError, ["sequence of keys", "str"]),
    (None, TypeError, ["sequence of keys"]),
    ([(1, 2, 3)], TypeError, ["key 0", "length 3"]),
    (np.zeros((2, 3), np.uint64), ValueError, ["shape (n, 2)"]),
])
def test_keys_of_the_wrong_type_or_length_raise_naming_the_key(env, keys, exc, words):
    kv = env.store()
    for call in (kv.lookup, lambda k: kv.put(k, [np.zeros(8, np.uint8)]), kv.pin):
        with pytest.raises(exc) as e:
            call(keys)
        for w in words:
            assert w in str(e.value), (w, str(e.value))


def test_keys_in_every_documented_form_name_the_same_blocks(env):
    kv = env.store()
    keys = _published(kv, n=3)
    as_ints = [cxlkv.to_int(k) for k in keys]
    as_hex = [cxlkv.to_hex(k) for k in keys]
    as_pairs = [(int(k[0]), int(k[1])) for k in keys]
    as_int64 = keys.view(np.int64)                       # what a torch / int64 array holds
    as_torch = torch.from_numpy(keys.view(np.int64).copy())
    for form in (as_ints, as_hex, as_pairs, as_int64, as_torch, [tuple(np.int64(x) for x in p) for p in as_int64]):
        assert (cxlkv.as_keys(form) == keys).all(), form
        assert kv.lookup(form) == 3


def test_block_ids_must_be_integers_in_range(env):
    kv = env.store()
    cache = cxlkv.PagedKV.vllm([torch.zeros(2, 4, 4, 2, 8)])
    keys = cxlkv.block_keys(np.arange(8) + 31, 4)
    with pytest.raises(TypeError, match="block ids must be integers"):
        kv.put(keys[:1], cache, [1.7])  # was truncated to block 1 without a word
    with pytest.raises(IndexError, match=r"out of range 0\.\.3"):
        kv.put(keys[:1], cache, [4])
    with pytest.raises(ValueError, match="2 keys but 1 block ids"):
        kv.put(keys, cache, [0])
    assert cxlkv.put_ok(kv.put(keys, cache, torch.tensor([1, 2]))).all()


def test_lease_arguments_are_checked_not_truncated(env):
    kv = env.store()
    keys = _published(kv)
    with pytest.raises(ValueError, match=r"ttl_ms 1099511627776 is not in 0 \.\. 2\*\*32-1"):
        kv.lease(keys, 5, ttl_ms=1 << 40)  # ctypes made it 0 and the C error said "ttl 0 ms"
    with pytest.raises(TypeError, match="consumer_id must be an int, got str"):
        kv.lease(keys, "req-1")
    with pytest.raises(ValueError, match="consumer_id -1"):
        kv.lease_release(keys, -1)
    with pytest.raises(cxlkv.CxlkvError) as e:
        kv.lease(keys, 5, ttl_ms=0)
    assert e.value.errno == errno.EINVAL and "ttl" in str(e.value)
    with pytest.raises(TypeError, match="node of a KV store of shm:.* must be an int, got str"):
        cxlkv.KvStore(env.pool, "1")


def test_closed_objects_say_which_and_that_they_are_closed(env):
    kv = env.store(2)
    keys = _published(kv)
    gpu = cxlkv.Gpu(env.pool, reference=True)
    gpu.close()
    cache = cxlkv.PagedKV.vllm([torch.zeros(2, 4, 4, 2, 8)])
    with pytest.raises(ValueError, match=f"GPU pinning of pool {env.uri} is closed"):
        kv.put(cxlkv.block_keys(np.arange(4) + 1, 4), cache, [0], gpu=gpu)
    with pytest.raises(ValueError, match="is closed"):
        gpu.pin_method  # noqa: B018 -- was a C call on a NULL handle
    pins = kv.pin(keys)
    pins.release()
    with pytest.raises(ValueError, match="already released"):
        pins.fetch([bytearray(64), bytearray(64)])
    kv.close()
    with pytest.raises(ValueError, match=f"KV store of node 2 on {env.uri} is closed"):
        kv.get(keys, [bytearray(64), bytearray(64)])


def test_buffers_that_are_not_bytes_like_are_named(env):
    kv = env.store()
    keys = cxlkv.block_keys(np.arange(16) + 77, 16)
    with pytest.raises(TypeError, match=r"buffer 0 \(list\) is not a contiguous tensor, array or bytes-like"):
        kv.put(keys, [[1, 2, 3]])
    with pytest.raises(TypeError, match=r"buffer 0 \(memoryview\)"):
        kv.put(keys, [memoryview(bytearray(128))[::2]])
    with pytest.raises(ValueError, match="buffer 0 is not contiguous"):
        kv.put(keys, [torch.zeros(8, 8).t()])


def test_token_ids_and_block_size_of_the_wrong_type_are_refused():
    toks = list(range(32))
    with pytest.raises(TypeError, match="token ids must be integers, got dtype float64"):
        cxlkv.block_keys([1.7, 2.2] * 16, 16)  # was hashed as [1, 2] * 16
    with pytest.raises(TypeError, match="token ids must be integers, got dtype float32"):
        cxlkv.block_keys(torch.arange(32, dtype=torch.float32), 16)
    with pytest.raises(TypeError, match="block_tokens must be an int, got str"):
        cxlkv.block_keys(toks, "16")
    assert (cxlkv.block_keys(torch.arange(32), 16) == cxlkv.block_keys(np.arange(32, dtype=np.uint32), 16)).all()
    assert cxlkv.block_keys([], 16).shape == (0, 2)


@pytest.mark.parametrize("uri", [None, b"shm:x:64M", 5])
def test_a_pool_uri_that_is_not_a_str_raises_a_type_error_naming_it(uri):
    # Pool(None) raised AttributeError ('NoneType' object has no attribute 'encode').
    for call in (cxlkv.Pool, cxlkv.Pool.format):
        with pytest.raises(TypeError, match=r"pool URI must be a str .* not " + type(uri).__name__):
            call(uri)
