# SPDX-License-Identifier: MIT
"""The remote tier's parts that need no Mooncake (cxlkv.remote): the block
header check, the configuration, the tier staying off unless asked, and the
push's accounting against a stand-in for Mooncake's client (each published
block pushed, or counted as dropped with its reason; holds given back).
The tier against a real Mooncake Store: tests/engines/test_remote.py."""
import ctypes
import errno
import threading
import time

import numpy as np
import pytest

import cxlkv
from cxlkv import remote


def _obj(key, payload):
    o = np.zeros(remote.HEADER_BYTES + payload.size, np.uint8)
    o[remote.HEADER_BYTES:] = payload
    remote._header_into(o[:remote.HEADER_BYTES], key, payload.size,
                        remote.checksum64((o.ctypes.data + remote.HEADER_BYTES, payload.size)))
    return o


def test_header_accepts_the_block_and_refuses_every_kind_of_damage():
    key, other = (5, 7), (5, 8)
    pay = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    o = _obj(key, pay)
    assert remote.check_block(o, key, o.size) is None
    assert "names key" in remote.check_block(o, other, o.size)
    bad = o.copy()
    bad[remote.HEADER_BYTES + 17] ^= 1
    assert remote.check_block(bad, key, bad.size) == "payload checksum mismatch"
    bad = o.copy()
    bad[20] ^= 1  # the key field: the header's own checksum catches it first
    assert remote.check_block(bad, key, bad.size) == "block header checksum mismatch"
    assert "arrived" in remote.check_block(o[:-100], key, o.size - 100)
    assert "shorter" in remote.check_block(o[:10], key, 10)
    assert "no cxlkv block header" in remote.check_block(pay, key, pay.size)


def test_checksum_is_the_librarys_xxh3():
    a = np.arange(1000, dtype=np.uint8)
    assert remote.checksum64(a.tobytes()) == remote.checksum64((a.ctypes.data, a.size))
    assert remote.checksum64(b"") == remote.checksum64((0, 0))
    assert remote.checksum64(b"a") != remote.checksum64(b"b")


def test_config_from_env_and_dict():
    assert remote.RemoteConfig.from_env({}) is None
    c = remote.RemoteConfig.from_env({"CXLKV_REMOTE_MASTER": "10.0.0.1:50051", "CXLKV_REMOTE_TIMEOUT_S": "0.5",
                                      "CXLKV_REMOTE_PUBLISH": "0"})
    assert c.master == "10.0.0.1:50051" and c.timeout_s == 0.5 and c.publish is False
    assert c.metadata == "http://10.0.0.1:8080/metadata"
    with pytest.raises(ValueError, match="unknown settings"):
        remote.RemoteConfig.from_dict({"master": "h:1", "segmnet_bytes": 1})
    with pytest.raises(ValueError, match="host:port"):
        remote.RemoteConfig(master="nohost")
    with pytest.raises(ValueError, match="no master"):
        remote.RemoteConfig.from_dict({"protocol": "tcp"})
    c = remote.RemoteConfig.from_env({"CXLKV_REMOTE_MASTER": "h:1", "CXLKV_REMOTE_PUSH_MIN_BLOCKS": "0",
                                      "CXLKV_REMOTE_PUSH_PRESSURE_S": "0"})
    assert c.push_min_blocks == 0 and c.push_pressure_s == 0
    with pytest.raises(ValueError, match="push_min_blocks"):
        remote.RemoteConfig(master="h:1", push_min_blocks=-1)


def test_a_store_has_no_remote_tier_unless_asked(small_env, monkeypatch):
    monkeypatch.delenv("CXLKV_REMOTE_MASTER", raising=False)
    s = small_env.store(1)
    assert s.remote is None and not any(k.startswith("remote") for k in s.stats())
    m = cxlkv.metrics.Metrics()
    assert "remote" not in m.exposition()


class _StandInStore:
    """What the push calls of Mooncake's client, in memory: ``codes`` gives
    the put results to answer for an object name, in turn (then 0: stored);
    ``gate``, while clear, holds every existence check."""

    def __init__(self, codes=None):
        self.objects = {}
        self.codes = codes or {}
        self.gate = threading.Event()
        self.gate.set()

    def register_buffer(self, addr, n):
        return 0

    def unregister_buffer(self, addr):
        return 0

    def batch_is_exist(self, names):
        self.gate.wait(30)
        return [1 if n in self.objects else 0 for n in names]

    def batch_put_from(self, names, addrs, sizes):
        out = []
        for name, a, n in zip(names, addrs, sizes):
            seq = self.codes.get(name)
            rc = seq.pop(0) if seq else 0
            if rc == 0:
                self.objects[name] = np.frombuffer(ctypes.string_at(a, n), np.uint8)
            out.append(rc)
        return out

    def close(self):
        pass


def _tier(env, fake, **kw):
    """A tier of env's pool, node 1, joined to ``fake`` instead of a master
    (its connect finds no master, then the stand-in takes the client's place)."""
    cfg = remote.RemoteConfig(master="127.0.0.1:9", timeout_s=0.5, retry_s=3600, close_drain_s=0, **kw)
    t = remote.RemoteTier(env.pool, 1, cfg)
    t._client = fake
    t._recovered()
    return t


def test_each_published_block_is_pushed_or_counted_by_why_not(small_env):
    keys = cxlkv.block_keys(np.arange(6 * 16, dtype=np.int64), 16, extras=b"push-outcomes")
    fake = _StandInStore()
    tier = _tier(small_env, fake)
    names = [tier.name(k) for k in keys]
    # 0 and 5 stored; 1 refused by a full store once, then stored; 2 refused
    # twice (dropped: store full); 3 put by another rack meanwhile (present);
    # 4 a failed transfer (dropped: failed).
    fake.codes = {names[1]: [remote.MC_NO_AVAILABLE_HANDLE], names[2]: [remote.MC_NO_AVAILABLE_HANDLE] * 2,
                  names[3]: [remote.MC_ALREADY_EXISTS], names[4]: [-800]}
    store = small_env.store(1, remote=tier)
    pay = [np.full(4096, i, np.uint8) for i in range(6)]
    assert cxlkv.put_ok(store.put(keys, pay)).all()
    assert tier.flush(20)
    st = tier.stats()
    got = {k: st[k] for k in ("remote_pushed_blocks", "remote_push_retried_blocks", "remote_push_store_full_blocks",
                              "remote_push_present_blocks", "remote_push_failed_blocks", "remote_push_evicted_blocks",
                              "remote_push_queue_full_blocks", "remote_push_dropped_blocks", "remote_errors")}
    assert got == dict(remote_pushed_blocks=3, remote_push_retried_blocks=2, remote_push_store_full_blocks=1,
                       remote_push_present_blocks=1, remote_push_failed_blocks=1, remote_push_evicted_blocks=0,
                       remote_push_queue_full_blocks=0, remote_push_dropped_blocks=2, remote_errors=1), got
    assert sorted(fake.objects) == sorted(names[i] for i in (0, 1, 5))
    for i in (0, 1, 5):  # each object carries our header and the block's bytes
        o = fake.objects[names[i]]
        assert remote.check_block(o, keys[i], o.size) is None and (o[remote.HEADER_BYTES:] == i).all()
    # Every hold was given back: none of the tier's leases is left in the pool.
    assert st["remote_held_blocks"] == 0 and st["remote_hold_peak_blocks"] == 6
    assert (store.lease_release(keys, tier._consumer) == -errno.ENOENT).all()
    tier.close()


def test_blocks_past_a_full_queue_are_counted_as_queue_full_and_held_ones_stay_held(small_env):
    keys = cxlkv.block_keys(np.arange(10 * 16, dtype=np.int64), 16, extras=b"queue-full")
    fake = _StandInStore()
    fake.gate.clear()  # the store does not answer yet: the pusher waits in its first call
    tier = _tier(small_env, fake, queue_blocks=4, batch_blocks=2)
    store = small_env.store(1, remote=tier)
    pay = [np.full(4096, i, np.uint8) for i in range(10)]
    store.put(keys[:2], pay[:2])
    end = time.monotonic() + 10
    while not (tier._pushing and tier.stats()["remote_held_blocks"] == 2) and time.monotonic() < end:
        time.sleep(0.01)
    store.put(keys[2:], pay[2:], parent=keys[1])  # 8 more: room for 4 in the queue
    end = time.monotonic() + 10
    while tier.stats()["remote_held_blocks"] < 6 and time.monotonic() < end:
        time.sleep(0.01)
    st = tier.stats()
    assert st["remote_push_queue_full_blocks"] == 4 and st["remote_push_dropped_blocks"] == 4, st
    assert st["remote_held_blocks"] == 6  # the two in flight and the four queued, each held in the pool
    fake.gate.set()
    assert tier.flush(20)
    st = tier.stats()
    assert st["remote_pushed_blocks"] == 6 and st["remote_held_blocks"] == 0, st
    assert sorted(fake.objects) == sorted(tier.name(k) for k in keys[:6])
    tier.close()


def _hold_then_hang(uri, keys, q):
    """In another process: a tier of node 1 holds ``keys`` for a push that
    never ends (its store never answers), says its consumer id, then waits
    to be killed."""
    pool = cxlkv.Pool(uri)
    fake = _StandInStore()
    fake.gate.clear()
    cfg = remote.RemoteConfig(master="127.0.0.1:9", timeout_s=0.5, retry_s=3600, close_drain_s=0, hold_ttl_s=600)
    tier = remote.RemoteTier(pool, 1, cfg)
    tier._client = fake
    tier._recovered()
    store = cxlkv.KvStore(pool, 1, remote=tier)
    store.put(keys, [np.full(4096, i, np.uint8) for i in range(len(keys))])
    end = time.monotonic() + 30
    while tier.stats()["remote_held_blocks"] < len(keys) and time.monotonic() < end:
        time.sleep(0.01)
    q.put((tier._consumer, tier.stats()["remote_held_blocks"]))
    time.sleep(600)


def test_holds_of_a_process_killed_mid_push_end_with_it(env):
    # docs/remote.md "Holding a block until its push": a hold is a lease for
    # the tier's node, so it ends when that node dies (docs/coherence.md
    # "Liveness"), long before its time to live (600 s here).
    import multiprocessing as mp
    import os
    import signal
    keys = cxlkv.block_keys(np.arange(8 * 16, dtype=np.int64), 16, extras=b"killed-holder")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_hold_then_hang, args=(env.uri, keys, q))
    p.start()
    try:
        consumer, held = q.get(timeout=120)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
    assert held == len(keys)
    other = env.store(2, remote=False)
    st = other.lease_release(keys, consumer)
    assert (st == -errno.ETIMEDOUT).all(), st  # ended, by its node's death (a live hold answers 0)


# ---- pushing selectively (docs/remote.md "Pushing selectively") --------------------
def _pushed_and_kept(tier):
    assert tier.flush(20)
    st = tier.stats()
    return st["remote_pushed_blocks"], st["remote_push_skipped_blocks"], st["remote_push_dropped_blocks"]


def test_a_chain_is_kept_back_until_it_reaches_push_min_blocks_then_pushed_root_first(small_env):
    keys = cxlkv.block_keys(np.arange(8 * 16, dtype=np.int64), 16, extras=b"min-blocks")
    other = cxlkv.block_keys(np.arange(3 * 16, dtype=np.int64), 16, extras=b"short-chain")
    fake = _StandInStore()
    tier = _tier(small_env, fake, push_min_blocks=8, push_pressure_s=0)  # the bound always applies
    store = small_env.store(1, remote=tier)
    pay = [np.full(4096, i, np.uint8) for i in range(8)]
    store.put(keys[:4], pay[:4])
    store.put(keys[4:7], pay[4:7], parent=keys[3])
    assert _pushed_and_kept(tier) == (0, 7, 0) and not fake.objects  # 7 blocks: short of 8
    store.put(other, pay[:3])
    store.put(keys[7:], pay[7:], parent=keys[6])  # the chain reaches 8 blocks: all of it goes
    assert _pushed_and_kept(tier) == (8, 10, 0)
    assert list(fake.objects) == [tier.name(k) for k in keys]  # in chain order, root first
    for i in range(8):
        o = fake.objects[tier.name(keys[i])]
        assert remote.check_block(o, keys[i], o.size) is None and (o[remote.HEADER_BYTES:] == i).all()
    assert tier.stats()["remote_held_blocks"] == 0
    tier.close()


def test_a_lookup_tells_the_policy_how_deep_a_put_starts(small_env):
    # The pool holds the first 6 blocks (published by a store without the
    # tier); a lookup through the tier sees them as the chain's first 6, so
    # the 3 blocks put below them make a chain of 9 and are pushed.
    keys = cxlkv.block_keys(np.arange(9 * 16, dtype=np.int64), 16, extras=b"lookup-depth")
    pay = [np.full(4096, i, np.uint8) for i in range(9)]
    small_env.store(2, remote=False).put(keys[:6], pay[:6])
    fake = _StandInStore()
    tier = _tier(small_env, fake, push_min_blocks=8, push_pressure_s=0)
    store = small_env.store(1, remote=tier)
    assert store.lookup(keys) == 6
    store.put(keys[6:], pay[6:], parent=keys[5])
    assert _pushed_and_kept(tier) == (3, 0, 0)
    assert sorted(fake.objects) == sorted(tier.name(k) for k in keys[6:])
    # Without that lookup the put's parent has no known depth: 3 blocks
    # below it make a chain of at least 4, kept back.
    more = cxlkv.block_keys(np.arange(9 * 16, dtype=np.int64), 16, extras=b"no-lookup")
    small_env.store(2, remote=False).put(more[:6], pay[:6])
    store.put(more[6:], pay[6:], parent=more[5])
    assert _pushed_and_kept(tier) == (3, 3, 0)
    tier.close()


def test_the_bound_applies_once_the_store_refused_a_put_as_full(small_env):
    keys = cxlkv.block_keys(np.arange(6 * 16, dtype=np.int64), 16, extras=b"pressure")
    fake = _StandInStore()
    tier = _tier(small_env, fake, push_min_blocks=8)  # while the store was full in the last 300 s
    store = small_env.store(1, remote=tier)
    pay = [np.full(4096, i, np.uint8) for i in range(6)]
    store.put(keys[:2], pay[:2])  # the store has room: a short chain is pushed
    assert _pushed_and_kept(tier) == (2, 0, 0) and tier.stats()["remote_push_selective"] == 0
    fake.codes = {tier.name(keys[2]): [remote.MC_NO_AVAILABLE_HANDLE] * 2}
    store.put(keys[2:3], pay[2:3])  # refused as full, twice: dropped
    assert _pushed_and_kept(tier) == (2, 0, 1) and tier.stats()["remote_push_selective"] == 1
    store.put(keys[3:6], pay[3:6])  # a short chain now stays in the pool
    assert _pushed_and_kept(tier) == (2, 3, 1)
    assert sorted(fake.objects) == sorted(tier.name(k) for k in keys[:2])
    tier.close()


def test_push_min_blocks_0_pushes_every_block_however_full_the_store(small_env):
    keys = cxlkv.block_keys(np.arange(3 * 16, dtype=np.int64), 16, extras=b"min-0")
    fake = _StandInStore()
    tier = _tier(small_env, fake, push_min_blocks=0, push_pressure_s=0)
    store = small_env.store(1, remote=tier)
    store.put(keys, [np.full(4096, i, np.uint8) for i in range(3)])
    assert _pushed_and_kept(tier) == (3, 0, 0) and tier.stats()["remote_push_selective"] == 0
    tier.close()


def test_puts_refused_as_full_just_after_the_tier_came_back_are_tried_until_the_store_takes_them(small_env):
    # A restarted master refuses puts as full until the clients mount their
    # segments again (docs/remote.md "Faults"): in the grace after the tier
    # comes back such a refusal is tried again, not dropped, and the push
    # policy does not take the store for full.  Past the grace, two
    # refusals drop the block as before.
    keys = cxlkv.block_keys(np.arange(4 * 16, dtype=np.int64), 16, extras=b"remount")
    fake = _StandInStore()
    tier = _tier(small_env, fake, push_min_blocks=8)
    tier._down("master gone (test)")
    tier._recovered()
    assert tier._remounting()
    names = [tier.name(k) for k in keys]
    fake.codes = {names[0]: [remote.MC_NO_AVAILABLE_HANDLE] * 5, names[1]: [remote.MC_NO_AVAILABLE_HANDLE] * 3}
    store = small_env.store(1, remote=tier)
    pay = [np.full(4096, i, np.uint8) for i in range(4)]
    assert cxlkv.put_ok(store.put(keys[:2], pay[:2])).all()
    assert tier.flush(20)
    st = tier.stats()
    assert st["remote_pushed_blocks"] == 2 and st["remote_push_dropped_blocks"] == 0, st
    assert st["remote_push_retried_blocks"] == 8 and st["remote_held_blocks"] == 0, st
    assert st["remote_push_selective"] == 0, st  # not taken as a full store
    assert sorted(fake.objects) == sorted(names[:2])
    # Past the grace: refused twice, dropped as a full store's.
    tier._back_at -= tier._remount_grace_s
    assert not tier._remounting()
    fake.codes = {names[2]: [remote.MC_NO_AVAILABLE_HANDLE] * 2}
    assert cxlkv.put_ok(store.put(keys[2:3], pay[2:3], parent=keys[1])).all()
    assert tier.flush(20)
    st = tier.stats()
    assert st["remote_push_store_full_blocks"] == 1 and st["remote_push_dropped_blocks"] == 1, st
    assert st["remote_push_selective"] == 1, st
    tier.close()
