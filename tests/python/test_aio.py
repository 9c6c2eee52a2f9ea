# SPDX-License-Identifier: MIT
"""Asynchronous batches: completions wake the event fd, per-block statuses,
cancellation of queued and running requests."""
import errno
import select

import numpy as np

import cxlkv
from cxlkv.aio import AsyncKv


def _wait_fd(fd, timeout=60):
    r, _, _ = select.select([fd], [], [], timeout)
    assert r == [fd], "event fd did not become readable"


def test_completions_wake_the_event_fd_with_a_status_per_block(env):
    with AsyncKv(env.pool, node=2, sub_batch=3) as a:
        keys = cxlkv.block_keys(np.arange(7 * 16), 16)
        src = [np.full(2048, i, np.uint8) for i in range(7)]
        assert select.select([a.event_fd()], [], [], 0)[0] == []  # nothing yet
        rid = a.submit_put(keys, src)
        _wait_fd(a.event_fd())
        (c,) = a.drain()
        assert (c.id, c.op, c.ok, c.error) == (rid, "put", True, None)
        assert (c.status == cxlkv.RESERVED).all() and c.status.size == 7
        assert select.select([a.event_fd()], [], [], 0)[0] == []  # drained: not readable
        # exists: the leading cached blocks; a get with a missing block
        missing = cxlkv.block_keys(np.arange(16) + 5555, 16)
        r1 = a.submit_exists(np.concatenate([keys[:4], missing]))
        dst = [np.zeros(2048, np.uint8) for _ in range(3)]
        r2 = a.submit_get(np.concatenate([keys[5:7], missing]), dst)
        c1, c2 = a.wait(r1, 60), a.wait(r2, 60)
        assert c1.status.tolist() == [0, 0, 0, 0, cxlkv.MISS] and not c1.ok
        assert c2.status.tolist() == [0, 0, cxlkv.MISS] and not c2.ok
        assert [int(d[0]) for d in dst[:2]] == [5, 6]


def test_cancel_queued_request_completes_every_block_ecanceled(env):
    with AsyncKv(env.pool, node=2, sub_batch=1) as a:
        keys = cxlkv.block_keys(np.arange(64 * 16), 16)
        big = [np.full(1 << 16, i % 251, np.uint8) for i in range(64)]
        r1 = a.submit_put(keys, big)
        r2 = a.submit_put(cxlkv.block_keys(np.arange(16) + 1, 16), big[:1])
        assert a.cancel(r2)
        a.cancel(r1)  # running (or queued): stops at a sub-batch boundary
        done = {}
        while len(done) < 2:
            _wait_fd(a.event_fd())
            for c in a.drain():
                done[c.id] = c
        assert done[r2].status.tolist() == [-errno.ECANCELED] and done[r2].error == "cancelled"
        st = done[r1].status
        # a prefix written, the rest not attempted: never a hole in the chain
        n_ok = int(cxlkv.put_ok(st).sum())
        assert (st[n_ok:] == -errno.ECANCELED).all() and cxlkv.put_ok(st[:n_ok]).all()
        kv = env.store(3)
        assert kv.lookup(keys) == n_ok


def test_a_failed_call_is_reported_not_raised(env):
    with AsyncKv(env.pool, node=2) as a:
        keys = cxlkv.block_keys(np.arange(32), 16)
        rid = a.submit_put(keys, [np.zeros(10, np.uint8)])  # 2 keys, 1 buffer
        c = a.wait(rid, 60)
        assert not c.ok and "ValueError" in c.error and (c.status == -errno.ECANCELED).all()


def test_after_close_the_event_fd_is_not_handed_out_or_read(env):
    """A closed AsyncKv's fd number goes back to the process: the next file
    opened gets it.  event_fd() then raised nothing and drain() read 8 bytes
    from that other file (an LMCache server's socket, say)."""
    import os
    import pytest
    a = AsyncKv(env.pool, node=2)
    fd = a.event_fd()
    a.close()
    r, w = os.pipe()
    try:
        assert fd in (r, w)  # the number was reused
        os.write(w, b"12345678")
        with pytest.raises(ValueError, match="AsyncKv of node 2 on .* is closed"):
            a.event_fd()
        assert a.drain() == []
        assert os.read(r, 8) == b"12345678"
        with pytest.raises(ValueError, match="is closed"):
            a.submit_exists(cxlkv.block_keys(np.arange(16), 16))
    finally:
        os.close(r)
        os.close(w)
