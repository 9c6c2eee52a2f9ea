# SPDX-License-Identifier: MIT
"""A pin protects its block while ANY process (or store) of the node holds
it.  A pin is one bit per node in the pool entry; an engine's scheduler and
its workers may attach as the same node.  The first store's release must not
drop the node's pin under the second store's."""
import os

import numpy as np

import cxlkv
from conftest import make_uri

BLOCK = 2 << 20  # whole chunks: an eviction frees space any node can reuse


def _fill(kv, salt, n):
    keys = cxlkv.block_keys(np.arange(n * 16) + salt, 16)
    st = kv.put(keys, [np.full(BLOCK, (salt + i) % 251, np.uint8) for i in range(n)])
    return int(cxlkv.put_ok(st).sum()), keys


def _small_pool(tag):
    uri, path = make_uri(tag, 64 << 20)
    cxlkv.Pool.format(uri, max_nodes=4)
    pool = cxlkv.Pool(uri)
    return uri, path, pool, cxlkv.LockManager(pool)


def _drop(path, pool, mgr):
    mgr.stop()
    for node in range(4):
        pool.remove_node_local(node)
    pool.close()
    os.unlink(path)


def _reads_back(pins, first, n):
    out = [np.zeros(BLOCK, np.uint8) for _ in range(n)]
    st = pins.fetch(out)
    return cxlkv.get_ok(st).all() and all(int(o[0]) == int(o[-1]) == (first + i) % 251 for i, o in enumerate(out))


def test_the_nodes_pin_stays_until_its_last_store_releases_it():
    uri, path, pool, mgr = _small_pool("nodepin")
    try:
        c = cxlkv.KvStore(pool, 2)
        full, keys = _fill(c, 0, 40)  # more than the pool holds: it is full of these
        assert 4 < full < 40
        a = cxlkv.KvStore(pool, 1)  # two stores of node 1 (as two processes of it)
        b = cxlkv.KvStore(pool, 1)
        pa = a.pin(keys[:full])
        pb = b.pin(keys[:full])
        assert pa.pinned.all() and pb.pinned.all()
        pa.release()
        assert _fill(c, 10_000, 4)[0] == 0, "node 2 evicted blocks that store b of node 1 still pins"
        assert _reads_back(pb, 0, full)
        pb.release()
        got, _ = _fill(c, 10_000, 4)
        assert got == 4, c.last_error
        for s in (a, b, c):
            s.close()
    finally:
        _drop(path, pool, mgr)
