# SPDX-License-Identifier: MIT
"""Engine threads on one KvStore: an engine's scheduler, prefetch and backup
threads call the same store at once, and one of them (or the engine's
shutdown) closes it or its pool while another is inside a call.  The C
handle serves one thread at a time (cxlkv.h), so the package takes turns on
it: every call returns the right bytes or raises ValueError ("closed"),
never a crash."""
import subprocess
import sys
import threading

import numpy as np
import torch

import cxlkv
from conftest import make_uri, remove_pool_files

_CLOSE_RACE = r"""
import sys, threading, time
import numpy as np
import cxlkv
uri, what, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
cxlkv.Pool.format(uri, max_nodes=4)
seen = {"closed": 0, "rounds": 0}
for rnd in range(rounds):
    pool = cxlkv.Pool(uri)
    mgr = cxlkv.LockManager(pool)
    kv = cxlkv.KvStore(pool, 1 + rnd % 3)
    keys = cxlkv.block_keys(np.arange(64 * 16) + rnd, 16)
    bufs = [np.full(16384, i, np.uint8) for i in range(64)]
    assert cxlkv.put_ok(kv.put(keys, bufs)).all()
    started = threading.Event()
    def reader():
        out = [np.zeros(16384, np.uint8) for _ in range(64)]
        while True:
            try:
                st = kv.get(keys, out)
            except ValueError as e:  # the store or the pool was closed: said so
                assert "closed" in str(e), e
                seen["closed"] += 1
                return
            assert cxlkv.get_ok(st).all() and all(int(o[0]) == i for i, o in enumerate(out)), st
            started.set()
    t = threading.Thread(target=reader)
    t.start()
    started.wait(30)
    time.sleep(0.002 * (rnd % 4))
    if what == "store":
        kv.close()   # while the reader is (most likely) inside cxlkv_kv_get_many
        mgr.stop()
        t.join()
        pool.close()
    else:
        pool.close()  # closes kv and the manager first, then unmaps
        t.join()
    seen["rounds"] += 1
print(seen["rounds"], seen["closed"])
"""


def _run_close_race(tmp_path, what):
    uri, path = make_uri("closerace")
    script = tmp_path / "close_race.py"
    script.write_text(_CLOSE_RACE)
    try:
        r = subprocess.run([sys.executable, str(script), uri, what, "30"], capture_output=True, text=True,
                           timeout=300)
    finally:
        remove_pool_files(uri, path)
    # Before the store took turns on its handle, this died of SIGSEGV (-11):
    # close() freed the C session under the reader's cxlkv_kv_get_many.
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert r.stdout.split() == ["30", "30"], r.stdout


def test_closing_a_store_while_another_thread_reads_waits_for_the_call(tmp_path):
    _run_close_race(tmp_path, "store")


def test_closing_the_pool_while_another_thread_reads_waits_for_the_call(tmp_path):
    _run_close_race(tmp_path, "pool")


def test_scheduler_prefetch_and_backup_threads_share_one_store(env):
    """Four threads on one store, each publishing its own chains of real KV
    (a vLLM-layout paged cache) and reading other threads' chains back:
    every block read is bit for bit what its writer published."""
    kv = env.store()
    layers, tokens, heads, head, nblocks = 2, 16, 2, 32, 32
    torch.manual_seed(3)
    caches = [torch.randn(2, nblocks, tokens, heads, head, dtype=torch.bfloat16) for _ in range(layers)]
    src = cxlkv.PagedKV.vllm(caches)
    chains = [cxlkv.block_keys(np.arange(8 * tokens) + 1000 * t, tokens) for t in range(4)]
    errors = []
    barrier = threading.Barrier(4)

    def engine_thread(t):
        try:
            out_caches = [torch.zeros_like(c) for c in caches]
            dst = cxlkv.PagedKV.vllm(out_caches)
            ids = [(t * 8 + i) % nblocks for i in range(8)]
            barrier.wait(30)
            for rnd in range(40):
                st = kv.put(chains[t], src, ids)
                if not cxlkv.put_ok(st).all():
                    errors.append(f"thread {t} put {st}")
                other = (t + 1 + rnd) % 4
                oids = [(other * 8 + i) % nblocks for i in range(8)]
                st = kv.get(chains[other], dst, oids)
                for i, (ok, b) in enumerate(zip(cxlkv.get_ok(st), oids)):
                    if ok and not all(torch.equal(o[:, b], c[:, b]) for o, c in zip(out_caches, caches)):
                        errors.append(f"thread {t}: block {i} of chain {other} read wrong bytes")
                with kv.pin(chains[t]) as p:
                    if not p.pinned.all():
                        errors.append(f"thread {t}: own chain not pinned: {p.status}")
                kv.lookup(chains[other])
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=engine_thread, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(240)
    assert not any(t.is_alive() for t in ts), "an engine thread hung"
    assert errors == []
    assert all(kv.lookup(c) == 8 for c in chains)
