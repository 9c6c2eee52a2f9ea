# SPDX-License-Identifier: MIT
"""A pin protects its block while ANY process (or store) of the node holds
it.  A pin is one bit per node in the pool entry; an engine's scheduler and
its workers may attach as the same node.  The first store's release must not
drop the node's pin under the second store's, and a process of the node that
is killed holding pins must not keep its blocks pinned for good while the
node's other process keeps its own."""
import time

import numpy as np

import cxlkv
from conftest import BLOCK, fill_chain, fill_chain_within, process_killed_after


def _reads_back(pins, first, n):
    out = [np.zeros(BLOCK, np.uint8) for _ in range(n)]
    st = pins.fetch(out)
    return cxlkv.get_ok(st).all() and all(int(o[0]) == int(o[-1]) == (first + i) % 251 for i, o in enumerate(out))


def test_the_nodes_pin_stays_until_its_last_store_releases_it(small_env):
    pool = small_env.pool
    c = cxlkv.KvStore(pool, 2)
    full, keys = fill_chain(c, 0, 40)  # more than the pool holds: it is full of these
    assert 4 < full < 40
    a = cxlkv.KvStore(pool, 1)  # two stores of node 1 (as two processes of it)
    b = cxlkv.KvStore(pool, 1)
    pa = a.pin(keys[:full])
    pb = b.pin(keys[:full])
    assert pa.pinned.all() and pb.pinned.all()
    pa.release()
    assert fill_chain(c, 10_000, 4)[0] == 0, "node 2 evicted blocks that store b of node 1 still pins"
    assert _reads_back(pb, 0, full)
    pb.release()
    got, _ = fill_chain(c, 10_000, 4)
    assert got == 4, c.last_error
    for s in (a, b, c):
        s.close()


def _holder(uri, first, n, ready):
    """A process of node 1 that pins blocks first..n-1 of the chain and is killed."""
    pool = cxlkv.Pool(uri)
    kv = cxlkv.KvStore(pool, 1)
    keys = cxlkv.block_keys(np.arange(n * 16), 16)[first:n]
    pins = kv.pin(keys)
    assert pins.pinned.all()
    ready.set()
    time.sleep(600)


def test_a_killed_process_of_the_node_leaves_its_pins_but_not_the_others(small_env):
    c = cxlkv.KvStore(small_env.pool, 2)
    full, keys = fill_chain(c, 0, 40)
    assert full >= 10
    half = full // 2
    # node 1's surviving process's store pins the first half (a prefix:
    # prefix closure keeps it anyway while anything below is cached);
    # the process that is killed pins the rest, down to the leaf.
    b = cxlkv.KvStore(small_env.pool, 1)
    pb = b.pin(keys[:half])
    assert pb.pinned.all()
    with process_killed_after(_holder, small_env.uri, half, full):
        assert fill_chain(c, 10_000, 4)[0] == 0, "a pinned block was evicted"
    # At once: node 2 wants the whole pool.  The node table may still
    # name the killed process for node 1 (it attached last; b's process
    # beats again within a period): node 1 lives on all the same, by
    # b's pin record, so b's blocks must not be taken.
    fill_chain(c, 30_000, full)
    # The holder's pins go once node 1's live process notices it is gone
    # (bounded); b's blocks stay pinned and read back as themselves.
    got, _ = fill_chain_within(c, 20_000, 4)
    assert got == 4, f"the killed process's blocks are still pinned: {c.last_error}"
    assert _reads_back(pb, 0, half), "node 1's surviving pins lost their blocks"
    pb.release()
    for s in (b, c):
        s.close()
