# SPDX-License-Identifier: MIT
"""A pool whose lock manager never started, or died (kill -9): every KV call
returns within its bound (CXLKV_LOCK_TIMEOUT_MS; 30 s by default) with
-ETIMEDOUT and the library's story of the lock -- "no lock manager holds the
pool's lease (start one: cxlkvd --pool ...)" or "lease renewed N ms ago
(expired: is it still running?)" -- and the engine adapters report it (a
list of False, a completion with that error) instead of hanging the engine
thread for good."""
import errno
import multiprocessing as mp
import os
import select
import threading
import time

import numpy as np
import pytest

import cxlkv
from conftest import make_uri

BOUND_MS = 1000


@pytest.fixture
def bare_pool(monkeypatch, request):
    monkeypatch.setenv("CXLKV_LOCK_TIMEOUT_MS", str(BOUND_MS))  # read when a store opens
    uri, path = make_uri("nomgr")
    cxlkv.Pool.format(uri, max_nodes=4)
    pool = cxlkv.Pool(uri)
    yield uri, pool
    for node in range(4):
        pool.remove_node_local(node)
    pool.close()
    os.unlink(path)


def _manager_process(uri, ready):
    m = cxlkv.LockManager(cxlkv.Pool(uri))  # noqa: F841 -- runs until the process is killed
    ready.set()
    time.sleep(600)


def _bounded(fn, bound_s):
    """fn() run on a thread: its result, or a failure if it does not return in bound_s."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _catch(fn)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(bound_s)
    assert not t.is_alive(), f"call still blocked after {bound_s} s"
    return out["r"], time.monotonic() - t0


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 -- the test looks at it
        return e


def _check_store_answers(uri, pool, *says):
    kv = cxlkv.KvStore(pool, 1)
    try:
        keys = cxlkv.block_keys(np.arange(4 * 16), 16)
        st, took = _bounded(lambda: kv.put(keys, [np.zeros(256, np.uint8)] * 4), 60)
        assert isinstance(st, np.ndarray), st
        assert st.tolist() == [-errno.ETIMEDOUT] + [cxlkv.CANCELED] * 3
        assert took >= BOUND_MS / 1000 * 0.9
        assert all(w in kv.last_error for w in says + (uri,)), kv.last_error
        # A pin needs the stripe locks: it fails in the bound, naming the manager.
        e, _ = _bounded(lambda: kv.pin(keys), 60)
        assert isinstance(e, cxlkv.CxlkvError) and e.errno == errno.ETIMEDOUT, e
        assert all(w in str(e) for w in says + ("not granted within the timeout",)), str(e)
        # A get does not: blocks whose stripes this node does not keep are
        # read without the locks (docs/coherence.md "Optimistic reads"), so
        # it answers at once with the manager down (these keys: misses).
        got, took = _bounded(lambda: kv.get(keys, [bytearray(256) for _ in range(4)]), 60)
        assert isinstance(got, np.ndarray) and got.tolist() == [cxlkv.MISS] * 4, got
        assert took < BOUND_MS / 1000 * 0.5, took
    finally:
        kv.close()


def test_without_a_lock_manager_calls_fail_in_bound_and_say_start_one(bare_pool):
    uri, pool = bare_pool
    _check_store_answers(uri, pool, f"no lock manager holds the pool's lease (start one: `cxlkvd --pool {uri}`)")


def test_a_killed_lock_manager_makes_calls_fail_in_bound_naming_its_expired_lease(bare_pool):
    uri, pool = bare_pool
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_manager_process, args=(uri, ready))
    p.start()
    try:
        assert ready.wait(120), "lock manager process did not start"
        kv = cxlkv.KvStore(pool, 2)
        keys = cxlkv.block_keys(np.arange(16) + 5, 16)
        assert cxlkv.put_ok(kv.put(keys, [np.zeros(256, np.uint8)])).all()  # granted while it runs
        kv.close()
    finally:
        p.kill()
        p.join(60)
    time.sleep(2.5)  # past the manager's lease (2 s): the story says it expired
    _check_store_answers(uri, pool, f"pid {p.pid}, lease renewed", "(expired: is it still running?)")


def test_engine_adapters_report_a_missing_lock_manager_instead_of_hanging(bare_pool):
    uri, pool = bare_pool
    from cxlkv.integrations.lmcache import CxlkvNativePlugin
    from cxlkv.integrations.sglang import CxlkvHiCacheStorage
    from engine_fakes import SGLangHostPool, sglang_config
    b = CxlkvHiCacheStorage(sglang_config(extra={"pool": uri, "node": 2}), None)
    b.register_mem_pool_host(SGLangHostPool())
    import torch
    try:
        res, _ = _bounded(lambda: b.batch_set_v1(["a" * 64, "b" * 64], torch.arange(0, 32)), 60)
        assert res == [False, False]
    finally:
        b.close()
    p = CxlkvNativePlugin(pool=uri, node=3)
    try:
        sid = p.submit_batch_set(["c0", "c1"], [memoryview(bytearray(64)), memoryview(bytearray(64))])
        got = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            select.select([p.event_fd()], [], [], 5)
            got = p.drain_completions()
        assert got, "no completion within 60 s"
        (cid, ok, err, per) = got[0]
        assert (cid, ok, per) == (sid, False, [False, False])
        assert "no lock manager holds the pool's lease" in err, err
    finally:
        p.close()


def test_a_put_whose_allocator_lock_nobody_grants_fails_in_bound_and_leaves_nothing(bare_pool):
    """The store keeps its stripe locks' grants (sticky) from a lookup while
    the manager ran, but never held the allocator's lock: the put needs
    ALLOC, which nobody grants any more.  It fails within the bound naming
    the allocator lock, leaves no entry, and succeeds once a manager runs."""
    uri, pool = bare_pool
    mgr = cxlkv.LockManager(pool)
    kv = cxlkv.KvStore(pool, 1)
    try:
        keys = cxlkv.block_keys(np.arange(4 * 16) + 11, 16)
        with kv.pin(keys) as pins:  # looked up under the stripe locks: their grants stay
            assert pins.status.tolist() == [cxlkv.MISS] * 4
        mgr.stop()
        st, took = _bounded(lambda: kv.put(keys, [np.zeros(256, np.uint8)] * 4), 60)
        assert isinstance(st, np.ndarray), st
        assert st.tolist() == [-errno.ETIMEDOUT] + [cxlkv.CANCELED] * 3
        assert took >= BOUND_MS / 1000 * 0.9
        for w in ("allocator lock (ALLOC)", f"pool {uri}",
                  f"no lock manager holds the pool's lease (start one: `cxlkvd --pool {uri}`)"):
            assert w in kv.last_error, kv.last_error
        assert kv.lookup(keys) == 0, "a failed put left an entry"
        mgr = cxlkv.LockManager(pool)
        assert cxlkv.put_ok(kv.put(keys, [np.zeros(256, np.uint8)] * 4)).all(), kv.last_error
    finally:
        kv.close()
        mgr.stop()
