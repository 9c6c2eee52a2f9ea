# SPDX-License-Identifier: MIT
"""Nothing a Python object holds in the pool outlives it: pins still open
when their store (or pool) is closed, and everything a process held when it
was killed with SIGKILL (pins, a put in flight, leases it took) stop
blocking eviction, so another node can fill the pool again."""
import time

import numpy as np

import cxlkv
from conftest import BLOCK, fill_chain, fill_chain_within, make_uri, process_killed_after, remove_pool_files


def test_pins_left_open_are_released_when_their_store_closes(small_env):
    a = cxlkv.KvStore(small_env.pool, 1)
    full, keys = fill_chain(a, 0, 40)  # more than the pool holds: it is full of these
    assert 0 < full < 40
    pins = a.pin(keys[:full])
    assert pins.pinned.all()
    b = cxlkv.KvStore(small_env.pool, 2)
    assert fill_chain(b, 10_000, 4)[0] == 0  # every block pinned: nothing to evict
    a.close()  # the pins object is still alive and was never released
    # Before: node 1's pin bits stayed (this process, so node 1, lives on)
    # and node 2 got -ENOSPC for good.
    got, _ = fill_chain(b, 10_000, 4)
    assert got == 4, b.last_error
    assert pins._released
    pins.release()  # harmless now
    b.close()


def _holder(uri, salt, ready):
    """Another host's engine: pins a chain, leases it, and keeps a long put
    running on an async store when it is killed."""
    from cxlkv.aio import AsyncKv
    pool = cxlkv.Pool(uri)
    kv = cxlkv.KvStore(pool, 2)
    full, keys = fill_chain(kv, salt, 40)
    pins = kv.pin(keys[:full])
    assert pins.pinned.all()
    # leased to a consumer on node 3 (this process): it ends when node 3 dies
    assert (kv.lease(keys[:full], consumer_id=99, consumer_node=3, ttl_ms=600000) == cxlkv.RESERVED).all()
    a = AsyncKv(pool, 3, sub_batch=1)
    big = cxlkv.block_keys(np.arange(100 * 16) + salt + 50_000, 16)
    a.submit_put(big, [np.zeros(BLOCK, np.uint8)] * 100)
    ready.set()
    time.sleep(600)


def test_a_killed_process_leaves_no_pin_reservation_or_lease_behind(small_env):
    with process_killed_after(_holder, small_env.uri, 0):
        time.sleep(0.2)  # its put is under way
    kv = cxlkv.KvStore(small_env.pool, 1)
    got, keys = fill_chain_within(kv, 20_000, 4)
    assert got == 4, f"after the kill only {got} of 4 blocks fit: {kv.last_error}"
    out = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
    assert cxlkv.get_ok(kv.get(keys, out)).all()
    assert all(int(o[0]) == (20_000 + i) % 251 for i, o in enumerate(out))
    kv.close()


_EXIT_SCRIPT = r"""
import sys
import numpy as np
import cxlkv
uri = sys.argv[1]
cxlkv.Pool.format(uri, max_nodes=4)
pool = cxlkv.Pool(uri)
mgr = cxlkv.LockManager(pool)

def fill(kv, salt, n):  # a module-level function: the module's globals sit in a reference cycle
    keys = cxlkv.block_keys(np.arange(n * 16) + salt, 16)
    return kv.put(keys, [np.zeros(4096, np.uint8)] * n), keys

a = cxlkv.KvStore(pool, 1)
b = cxlkv.KvStore(pool, 2)
st, keys = fill(a, 0, 4)
pins = b.pin(keys)
print("ok", int(cxlkv.put_ok(st).sum()), int(pins.pinned.sum()))
# exit with the pool, two stores, pins and the manager open
"""


def test_exiting_with_stores_pins_and_a_manager_open_does_not_crash(tmp_path):
    """At interpreter exit the collector clears the pool's weak references to
    its stores before it finalizes them; the pool then unmapped the mapping
    under the stores' heartbeat and watcher threads (SIGSEGV at exit)."""
    import subprocess
    import sys
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_SCRIPT)
    for i in range(3):
        uri, path = make_uri("exit")
        try:
            r = subprocess.run([sys.executable, "-X", "faulthandler", str(script), uri], capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0 and r.stdout.split() == ["ok", "4", "4"], (i, r.returncode, r.stdout,
                                                                                 r.stderr[-3000:])
        finally:
            remove_pool_files(uri, path)
