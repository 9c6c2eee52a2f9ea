# SPDX-License-Identifier: MIT
"""cxlkv's LMCache native plugin inside the real LMCache (PyPI lmcache 0.5.6),
driven by LMCache's own code: the multiprocess server's storage core
(``StorageManager``, built from the server's own argument parser with an
``--l2-adapter`` of type ``native_plugin``: its L1, store controller,
prefetch controller and L2 eviction controller) and the native-plugin L2
adapter that LMCache's factory builds around the plugin
(``NativeConnectorL2Adapter``: store, lookup and lock, load, unlock,
delete).  Two LMCache servers are two processes attached as two nodes of one
pool.  The pool itself (a KV store of node 1) checks what the pool holds."""
import json
import select
import time

import numpy as np
import pytest
import torch

import cxlkv
from pool_env import PoolEnv, run_in_process

# No skip: an LMCache that does not import fails these tests.
from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
from lmcache.v1.distributed.config import parse_args
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (
    NativeConnectorL2Adapter, _object_key_to_string)
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
    NativePluginL2AdapterConfig, _create_native_plugin_l2_adapter)
from lmcache.v1.distributed.storage_manager import StorageManager
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

from cxlkv.integrations.lmcache import CxlkvNativePlugin

MODEL = "tiny-llama"
# one LMCache chunk of a small model: [K/V, layers, tokens, hidden] bf16 = 16 KiB
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 4, 16, 64])], dtypes=[torch.bfloat16])
CHUNK = 2 * 4 * 16 * 64 * 2


def _adapter_json(uri, node, **extra):
    return json.dumps(dict({"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache",
                            "class_name": "CxlkvNativePlugin", "adapter_params": {"pool": uri, "node": node}},
                           **extra))


def _server(uri, node, **extra):
    """The storage core of an LMCache multiprocess server, configured as the
    server configures it (its own argument parser), with cxlkv as its L2."""
    cfg = parse_args(["--l1-size-gb", "0.0625", "--eviction-policy", "LRU",
                      "--l2-adapter", _adapter_json(uri, node, **extra)])
    return StorageManager(cfg)


def _key(i, salt=""):
    return ObjectKey(chunk_hash=i.to_bytes(4, "little") * 8, model_name=MODEL, kv_rank=0, cache_salt=salt)


def _pattern(seed, nbytes):
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)).numpy()


def _pool_keys(keys):
    """The pool's keys of LMCache ObjectKeys: LMCache's own wire string, then
    the plugin's mapping."""
    return CxlkvNativePlugin.pool_keys([_object_key_to_string(k) for k in keys])


def _in_pool(kv, keys):
    with kv.pin(_pool_keys(keys)) as p:
        return [bool(x) for x in p.pinned]


def _until(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def _write(sm, keys, seeds):
    """A serving engine's store: reserve L1 objects, fill them, finish the
    write (LMCache's store controller then sends them to the L2)."""
    objs = sm.reserve_write(keys, LAYOUT)
    assert set(objs) == set(keys), "L1 refused a write"
    for k, s in zip(keys, seeds):
        np.frombuffer(objs[k].byte_array, dtype=np.uint8)[:] = _pattern(s, CHUNK)
    sm.finish_write(keys)


def _l2_bytes(sm):
    return sum(u[0] for u in sm.get_l2_usages())


def _prefetch(sm, keys, seeds):
    """A serving engine's load: prefetch (L1 hits, else LMCache's lookup and
    lock, load and unlock on the L2), read the objects, release them.
    Returns (hits from L2, each loaded chunk equal to its pattern)."""
    spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=LAYOUT)])
    h = sm.submit_prefetch_task(spec)
    assert sm.wait_prefetch_status(h, 60), "prefetch did not finish"
    res = sm.query_prefetch_status(h)
    hit = res.hit_cells[0].get_indices_list()
    got = [keys[i] for i in hit]
    same = []
    with sm.read_prefetched_results(got, res.l1_owners) as objs:
        assert objs is not None
        for i, o in zip(hit, objs):
            same.append(bool((np.frombuffer(o.byte_array, dtype=np.uint8) == _pattern(seeds[i], CHUNK)).all()))
    sm.finish_read_prefetched(got, l1_owners=res.l1_owners)
    return res.l2_hit_cells[0].get_indices_list(), hit, same


# ---- store then load, two servers on two nodes -------------------------------------

def _other_server(uri, node, keys_i, seeds, own_i, own_seeds):
    """Another LMCache server (another host): loads what the first stored,
    then stores its own chunks."""
    sm = _server(uri, node)
    try:
        keys = [_key(i) for i in keys_i]
        l2, hit, same = _prefetch(sm, keys, seeds)
        own = [_key(i) for i in own_i]
        _write(sm, own, own_seeds)
        _until(lambda: _l2_bytes(sm) == len(own) * CHUNK, "the second server's L2 store")
        return l2, hit, same
    finally:
        sm.close()


def test_two_servers_share_chunks_through_the_pool(env):
    """Server A (node 2) stores chunks; server B (node 3, another process)
    finds them in its L2 (the pool) and loads them bit for bit, then stores
    chunks that A loads the same way."""
    kv = env.store(1)
    a = _server(env.uri, 2)
    try:
        keys = [_key(i) for i in range(6)]
        _write(a, keys, range(100, 106))
        _until(lambda: all(_in_pool(kv, keys)), "A's chunks in the pool")
        assert _l2_bytes(a) == 6 * CHUNK
        # B asks for A's chunks plus one nobody stored (a prefix: it stops there)
        l2, hit, same = run_in_process(_other_server, env.uri, 3, [0, 1, 2, 3, 4, 5, 999],
                                       list(range(100, 106)) + [0], [50, 51, 52], [200, 201, 202])
        assert hit == l2 == [0, 1, 2, 3, 4, 5] and same == [True] * 6
        theirs = [_key(i) for i in (50, 51, 52)]
        assert _in_pool(kv, theirs) == [True] * 3
        l2, hit, same = _prefetch(a, theirs, [200, 201, 202])
        assert hit == l2 == [0, 1, 2] and same == [True] * 3
    finally:
        a.close()


# ---- LMCache's native-plugin L2 adapter --------------------------------------------------

def _adapter(uri, node, **params):
    cfg = NativePluginL2AdapterConfig.from_dict(
        {"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache", "class_name": "CxlkvNativePlugin",
         "adapter_params": dict({"pool": uri, "node": node}, **params)})
    a = _create_native_plugin_l2_adapter(cfg)
    assert isinstance(a, NativeConnectorL2Adapter) and isinstance(a._client, CxlkvNativePlugin)
    return a


def _obj(nbytes, seed=None):
    raw = torch.from_numpy(_pattern(seed, nbytes).copy()) if seed is not None else torch.zeros(nbytes, dtype=torch.uint8)
    return TensorMemoryObj(raw, MemoryObjMetadata(shape=torch.Size([nbytes]), dtype=torch.uint8, address=0,
                                                  phy_size=nbytes, ref_count=1), None)


def _wait(fd, query, task, what):
    return _until(lambda: (select.select([fd], [], [], 0.05), query(task))[1], what, 60)


def _store(a, keys, objs):
    t = a.submit_store_task(keys, objs)
    _until(lambda: t in a._completed_stores, "store result", 60)
    return a.pop_completed_store_tasks()[t]


def _lock(a, keys):
    t = a.submit_lookup_and_lock_task(keys, {})
    return _wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t, "lookup").get_indices_list()


def _load(a, keys, objs):
    t = a.submit_load_task(keys, objs)
    return _wait(a.get_load_event_fd(), a.query_load_result, t, "load").get_indices_list()


def test_each_key_of_a_batch_is_stored_on_its_own_with_mixed_sizes():
    """One store batch of chunks of four sizes, one of them too large for the
    pool: the others are stored, found and loaded with identical bytes; the
    store result is the batch's (LMCache's store results are per batch) and
    the plugin's completion says which key failed and why."""
    env = PoolEnv("lmcache-sizes", size=32 << 20)  # 24 MiB of payload space
    try:
        kv = env.store(1)
        a = _adapter(env.uri, 2)
        try:
            sizes = [4096, 3 * CHUNK, 25 << 20, 1000, CHUNK]  # 25 MiB: more than the whole pool
            keys = [_key(i) for i in range(5)]
            objs = [_obj(n, 10 + i) for i, n in enumerate(sizes)]
            assert not _store(a, keys, objs).is_successful()
            assert _in_pool(kv, keys) == [True, True, False, True, True]
            assert _lock(a, keys) == [0, 1, 3, 4]
            outs = [_obj(n) for n in sizes]
            assert _load(a, keys, outs) == [0, 1, 3, 4]
            for i in (0, 1, 3, 4):
                assert bytes(outs[i].byte_array) == bytes(objs[i].byte_array), i
            # the same batch without the large chunk: a success, nothing rewritten
            assert _store(a, [keys[i] for i in (0, 1, 3, 4)], [objs[i] for i in (0, 1, 3, 4)]).is_successful()
        finally:
            a.close()
        # the plugin's own completion of such a batch: a status per key and the cause
        p = CxlkvNativePlugin(pool=env.uri, node=3)
        try:
            sid = p.submit_batch_set(["x0", "x1", "x2"], [memoryview(bytearray(64)), memoryview(bytearray(25 << 20)),
                                                         memoryview(bytearray(128))])
            got = _until(lambda: p.drain_completions() if select.select([p.event_fd()], [], [], 0.1)[0] else None,
                         "completion", 60)
            (cid, ok, err, per), = got
            assert (cid, ok, per) == (sid, False, [True, False, True])
            assert "EFBIG" in err and "x1" in err and "larger than the whole kv carve" in err, err
        finally:
            p.close()
    finally:
        env.close()


def _fill(kv, tag, gone, kept, rounds=12):
    """Another node fills the pool with unrelated blocks (1 MiB each, 24 MiB
    a round: the pool's whole payload space) until the chunks ``gone`` are
    evicted; the chunks ``kept`` must stay through it (at least 3 rounds).
    Each fill block is read back once: the pool keeps blocks used again (hot)
    over blocks seen once, so a fill of blocks seen once would spare the
    chunks LMCache loaded for far longer."""
    buf = bytearray(1 << 20)
    for r in range(rounds):
        keys = cxlkv.keys_from_hashes([f"fill-{tag}-{r}-{i}" for i in range(24)], b"fill")
        for i in range(24):
            st = kv.put(keys[i:i + 1], [buf])
            assert cxlkv.put_ok(st).all(), (r, i, cxlkv.status_name(st[0]), kv.last_error)
            assert cxlkv.get_ok(kv.get(keys[i:i + 1], [buf])).all()
        assert _in_pool(kv, kept) == [True] * len(kept), f"a pinned chunk was evicted in round {r}"
        if r >= 2 and not any(_in_pool(kv, gone)):
            return
    raise AssertionError(f"{_in_pool(kv, gone)}: unpinned chunks still in the pool after {rounds} fills")


def test_lookup_and_lock_pins_until_the_unlock_and_close():
    """A key LMCache locked (lookup and lock) is pinned in the pool: another
    node filling the pool three times over does not evict it, while the
    unlocked chunk stored first in the same batch goes (so it is no parent of
    the others: chunks of a batch are unrelated blocks).  LMCache's unlock of
    a loaded key (right after its load) gives the pin back, so the next fill
    evicts it; a key looked up and never loaded is given back after
    lock_ttl_s; closing the adapter gives back the rest.  LMCache's delete of
    a locked key is refused (it stays counted), of an unlocked one done."""
    env = PoolEnv("lmcache-lock", size=32 << 20)  # 24 MiB of payload space
    try:
        kv = env.store(1)
        a = _adapter(env.uri, 2, lock_ttl_s=8)
        plugin = a._client
        # 0: never locked, 1: loaded then unlocked, 2: never loaded, 3: closed
        keys = [_key(i) for i in range(4)]
        objs = [_obj(1 << 20, 30 + i) for i in range(4)]
        assert _store(a, keys, objs).is_successful()
        assert _lock(a, keys[1:]) == [0, 1, 2]
        wire = [_object_key_to_string(k) for k in keys]
        assert [plugin.locked(w) for w in wire] == [0, 1, 1, 1]
        used = a.get_usage().total_bytes_used
        a.delete(keys[:2])
        assert a.get_usage().total_bytes_used == used - (1 << 20)
        _fill(kv, "a", gone=keys[:1], kept=keys[1:])
        # the load LMCache locked key 1 for, then its unlock
        out = _obj(1 << 20)
        assert _load(a, keys[1:2], [out]) == [0]
        assert bytes(out.byte_array) == bytes(objs[1].byte_array)
        a.submit_unlock(keys[1:2])
        assert plugin.locked(wire[1]) == 0
        a.submit_unlock(keys[2:3])  # LMCache dropped key 2 from its plan: only lock_ttl_s frees it
        _fill(kv, "b", gone=keys[1:2], kept=keys[2:], rounds=6)
        _until(lambda: plugin.locked(wire[2]) == 0, "the lock of a key never loaded to expire", 20)
        # key 3's lock (same lookup) expired with it: LMCache looks it up again
        assert plugin.locked(wire[3]) == 0 and _lock(a, keys[3:]) == [0]
        a.delete(keys[1:])  # key 3 is locked: still counted
        assert a.get_usage().total_bytes_used == 1 << 20
        _fill(kv, "c", gone=keys[2:3], kept=keys[3:])
        a.close()
        _fill(kv, "d", gone=keys[3:], kept=[])
    finally:
        env.close()


def test_capacity_mode_deletes_and_stores_again(env):
    """max_capacity_gb with an LRU eviction policy: LMCache counts what its
    server stored in the pool, deletes its least recently used chunks past
    the watermark (the plugin's submit_batch_delete, without which its count
    never shrinks), and later stores succeed and load back."""
    kv = env.store(1)
    cap_chunks = 16
    sm = _server(env.uri, 2, max_capacity_gb=cap_chunks * CHUNK / (1 << 30),
                 eviction={"eviction_policy": "LRU", "trigger_watermark": 0.75, "eviction_ratio": 0.5})
    try:
        first = [_key(i) for i in range(cap_chunks)]
        _write(sm, first, range(cap_chunks))
        _until(lambda: all(_in_pool(kv, first)), "the first chunks in the pool")
        # the eviction controller (once a second) brings the count under the watermark
        _until(lambda: 0 < _l2_bytes(sm) < 0.75 * cap_chunks * CHUNK, "LMCache's L2 eviction", 20)
        after_evict = _l2_bytes(sm)
        more = [_key(100 + i) for i in range(6)]
        _write(sm, more, range(100, 106))
        _until(lambda: _l2_bytes(sm) == after_evict + 6 * CHUNK or _l2_bytes(sm) < after_evict,
               "the later store counted")
        assert _in_pool(kv, more) == [True] * 6
    finally:
        sm.close()
    # a fresh server (empty L1) loads the later chunks from the pool
    sm = _server(env.uri, 3)
    try:
        l2, hit, same = _prefetch(sm, more, list(range(100, 106)))
        assert hit == l2 == list(range(6)) and same == [True] * 6
    finally:
        sm.close()
