# SPDX-License-Identifier: MIT
"""Fixtures of the Python tests: a fresh shm pool per test with its lock
manager running in the test process (as tests/unit/capi/kv_c_api_test.c does),
and helpers to run a function in another process (pool_env.py, shared with
the engine tests)."""
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_env import HERE, PKG, ROOT, PoolEnv, env, make_uri, remove_pool_files, run_in_process  # noqa: E402,F401
from pool_env import tag_of as _tag  # noqa: E402

import cxlkv  # noqa: E402
import numpy as np  # noqa: E402


@pytest.fixture
def small_env(request):
    """A pool small enough to fill (64 MiB, 4 nodes), its lock manager in
    this process; the test makes (and closes) its own stores of it."""
    e = PoolEnv(_tag(request), size=64 << 20, max_nodes=4)
    yield e
    e.close()


# 2 MiB blocks: whole chunks, freed straight back to the pool's bitmap, so
# another node can reuse what an eviction frees (smaller blocks go back to
# their writer's heap).
BLOCK = 2 << 20


def fill_chain(kv, salt, n):
    """Put n fresh BLOCK-sized blocks as one chain, block i full of
    (salt + i) % 251; the number that made it in, and the keys."""
    keys = cxlkv.block_keys(np.arange(n * 16) + salt, 16)
    st = kv.put(keys, [np.full(BLOCK, (salt + i) % 251, np.uint8) for i in range(n)])
    return int(cxlkv.put_ok(st).sum()), keys


def fill_chain_within(kv, salt, n, seconds=60):
    """fill_chain again every 0.2 s until all n blocks make it in (space a
    killed process held frees once it is noticed) or `seconds` pass; the
    last try's count and keys."""
    deadline = time.monotonic() + seconds
    got, keys = 0, None
    while time.monotonic() < deadline:
        got, keys = fill_chain(kv, salt, n)
        if got == n:
            break
        time.sleep(0.2)
    return got, keys


@contextlib.contextmanager
def process_killed_after(target, *args, timeout=180):
    """Run target(*args, ready) in a spawned process (another host's
    process: it maps the pool and attaches as its own node) and wait until
    it sets the event `ready`; when the block ends, SIGKILL it."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=target, args=(*args, ready))
    p.start()
    try:
        assert ready.wait(timeout), "holder process did not get into position"
        yield p
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(60)
