# SPDX-License-Identifier: MIT
"""cxlkv.integrations.lmcache driven as LMCache's native-connector L2
adapter drives a plugin: construct with adapter_params, poll the event fd,
submit set / exists (lookup and lock) / get / delete batches of memoryviews,
drain completions."""
import select
import sys
import time

import numpy as np

from cxlkv.integrations.lmcache import CxlkvNativePlugin


def _drain_until(p, ids, timeout=60):
    got = {}
    while set(ids) - set(got):
        r, _, _ = select.select([p.event_fd()], [], [], timeout)
        assert r, "event fd never became readable"
        for c in p.drain_completions():
            got[c[0]] = c
    return got


def test_module_is_importable_without_lmcache():
    import cxlkv.integrations.lmcache as cl
    assert "LMCache" in cl.__doc__ and "0.5.6" in cl.__doc__
    assert "lmcache" not in sys.modules


def test_set_exists_get_through_the_event_fd(env):
    p = CxlkvNativePlugin(**{"pool": env.uri, "node": 2})
    keys = [f"chunk-{i:04x}" for i in range(5)]
    bufs = [bytearray(np.random.default_rng(i).integers(0, 255, 4096, dtype=np.uint8).tobytes()) for i in range(5)]
    s = p.submit_batch_set(keys[:3], [memoryview(b) for b in bufs[:3]])
    got = _drain_until(p, [s])
    assert got[s] == (s, True, "", [True, True, True])
    e = p.submit_batch_exists(keys)
    outs = [bytearray(4096) for _ in range(4)]
    g = p.submit_batch_get([keys[2], keys[0], keys[4], keys[1]], [memoryview(o) for o in outs])
    got = _drain_until(p, [e, g])
    assert got[e][1:] == (True, "", [True, True, True, False, False])
    assert got[g][1] is False and got[g][3] == [True, True, False, True]
    assert "MISS" in got[g][2]
    assert outs[0] == bufs[2] and outs[1] == bufs[0] and outs[3] == bufs[1]
    assert select.select([p.event_fd()], [], [], 0)[0] == []
    p.close()
    p.close()


def test_two_lmcache_servers_share_chunks_through_the_pool(env):
    """Host A's LMCache stores KV chunks (tensor-backed memoryviews, LMCache's
    key wire format) through its adapter; host B (another process) looks them
    up and loads them bit for bit; a missing chunk is a per-key False."""
    from conftest import run_in_process
    from engine_fakes import LMCacheL2Adapter, lmcache_chunk, lmcache_key, lmcache_other_host
    keys = [lmcache_key("tiny-llama", 0, 0, bytes([i]) * 32) for i in range(4)]
    a = LMCacheL2Adapter(CxlkvNativePlugin(pool=env.uri, node=2))
    try:
        chunks = [lmcache_chunk(i) for i in range(4)]
        op, ok, err, per = a.wait(a.store(keys, chunks))
        assert (op, ok, err, per) == ("store", True, "", [True] * 4)
        # storing again is a success with nothing rewritten
        assert a.wait(a.store(keys[:2], chunks[:2]))[1:] == (True, "", [True, True])
    finally:
        a.close()
    missing = lmcache_key("tiny-llama", 0, 0, b"\xee" * 32)
    found, ok, err, loaded, same = run_in_process(lmcache_other_host, env.uri, 3, [keys[3], missing, keys[0]],
                                                  [3, 99, 0])
    assert found == [True, False, True]
    assert ok is False and "MISS" in err and loaded == [True, False, True]
    assert same[0] and same[2]


def test_a_set_stores_each_key_on_its_own_with_its_own_size(env):
    """LMCache's store batch is not a chain: a key that fails (here a buffer
    that is no buffer) does not stop the others, the keys are unrelated root
    blocks (the first can be looked up alone as a chain of one, and so can
    the last), and chunks of different sizes share one batch, stored and
    loaded back."""
    p = CxlkvNativePlugin(pool=env.uri, node=2)
    try:
        sizes = [64, 4096, 100, 1000]
        bufs = [bytearray(np.random.default_rng(i).integers(0, 255, n, dtype=np.uint8).tobytes())
                for i, n in enumerate(sizes)]
        keys = ["m0", "m1", "bad", "m3", "m4"]
        views = [memoryview(bufs[0]), memoryview(bufs[1]), None, memoryview(bufs[2]), memoryview(bufs[3])]
        s = p.submit_batch_set(keys, views)
        (cid, ok, err, per), = _drain_until(p, [s]).values()
        assert (cid, ok, per) == (s, False, [True, True, False, True, True])
        assert "EINVAL" in err and "bad" in err and "NoneType" in err, err
        kv = env.store(1)
        pk = CxlkvNativePlugin.pool_keys(keys)
        assert kv.lookup(pk[4:5]) == 1 and kv.lookup(pk[:1]) == 1
        outs = [bytearray(n) for n in sizes]
        g = p.submit_batch_get(["m4", "m0", "m3", "m1"], [memoryview(o) for o in (outs[3], outs[0], outs[2], outs[1])])
        assert _drain_until(p, [g])[g] == (g, True, "", [True] * 4)
        assert outs == bufs
        # a get whose buffer size differs from the block's fails that key only
        short = bytearray(10)
        g = p.submit_batch_get(["m0", "m1"], [memoryview(short), memoryview(bytearray(4096))])
        (_, ok, err, per), = _drain_until(p, [g]).values()
        assert ok is False and per == [False, True] and "m0" in err, err
    finally:
        p.close()


def test_lookup_locks_pins_until_the_load_the_ttl_or_close(env):
    """submit_batch_exists is LMCache's lookup and lock: each key found stays
    pinned (counted per lookup) until a get of it completes; a key never
    loaded is given back after lock_ttl_s; delete refuses a locked key and
    takes an unlocked one; close gives back the rest."""
    p = CxlkvNativePlugin(pool=env.uri, node=2, lock_ttl_s=1.5)
    kv = env.store(1)
    pk = CxlkvNativePlugin.pool_keys(["a", "b", "c"])

    def pinned_by_node2():
        # the locks (pool pins) the plugin holds per key
        return [p.locked(k) for k in ("a", "b", "c")]
    try:
        s = p.submit_batch_set(["a", "b", "c"], [memoryview(bytearray(256)) for _ in range(3)])
        assert _drain_until(p, [s])[s][1] is True
        e1 = p.submit_batch_exists(["a", "b", "zz"])
        e2 = p.submit_batch_exists(["a"])
        got = _drain_until(p, [e1, e2])
        assert got[e1] == (e1, True, "", [True, True, False]) and got[e2] == (e2, True, "", [True])
        assert pinned_by_node2() == [2, 1, 0]
        d = p.submit_batch_delete(["a", "c", "zz"])
        (_, ok, err, per), = _drain_until(p, [d]).values()
        assert per == [False, True, True] and ok is False and "locked" in err and "a" in err
        g = p.submit_batch_get(["a"], [memoryview(bytearray(256))])
        assert _drain_until(p, [g])[g][1] is True
        assert pinned_by_node2() == [1, 1, 0]
        deadline = time.monotonic() + 10
        while pinned_by_node2() != [0, 0, 0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pinned_by_node2() == [0, 0, 0]
        d = p.submit_batch_delete(["a", "b"])
        assert _drain_until(p, [d])[d] == (d, True, "", [True, True])
        e = p.submit_batch_exists(["b", "c"])
        assert _drain_until(p, [e])[e][3] == [True, True]
        assert pinned_by_node2() == [0, 1, 1]
        with kv.pin(pk) as pins:
            assert pins.pinned.tolist() == [True, True, True]
    finally:
        p.close()
    assert p.locked("b") == 0 and p.locked("c") == 0
    p.close()


def test_partial_release_of_pins(env):
    """Pins.release(which): the blocks of one batched pin given back one by
    one; a later full release and the store's close leave them alone."""
    import cxlkv
    kv = env.store(2)
    keys = cxlkv.keys_from_hashes(["p0", "p1", "p2"], b"t")
    assert cxlkv.put_ok(kv.put(keys[:1], [bytearray(64)])).all()
    assert cxlkv.put_ok(kv.put(keys[2:], [bytearray(64)])).all()
    pins = kv.pin(keys)
    assert pins.pinned.tolist() == [True, False, True]
    pins.release([0, 1])
    assert pins.pinned.tolist() == [False, False, True]
    out = [bytearray(64) for _ in range(3)]
    st = pins.fetch(out)
    assert st[2] == cxlkv.RESERVED and st[0] == cxlkv.MISS
    pins.release([2, 2])
    assert not pins.pinned.any() and pins not in kv._held
    pins.release()
    try:
        pins.release([5])
    except IndexError as e:
        raise AssertionError(f"a released Pins should ignore later releases: {e}")
    p2 = kv.pin(keys)
    try:
        p2.release([3])
        raise AssertionError("index 3 of 3 pins accepted")
    except IndexError as e:
        assert "3 blocks" in str(e)
    p2.release()
