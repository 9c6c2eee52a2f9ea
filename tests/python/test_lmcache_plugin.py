# SPDX-License-Identifier: MIT
"""cxlkv.integrations.lmcache driven as LMCache's native-connector L2
adapter drives a plugin: construct with adapter_params, poll the event fd,
submit set / exists / get batches of memoryviews, drain completions."""
import select
import sys

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
    assert "LMCache" in cl.__doc__ and "0.3" in cl.__doc__
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
