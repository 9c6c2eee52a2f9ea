# SPDX-License-Identifier: MIT
"""Fixtures of the Python tests: a fresh shm pool per test with its lock
manager running in the test process (as tests/unit/kv_c_api_test.c does),
and helpers to run a function in another process (spawned, so it maps the
pool and attaches as its own node, like another host)."""
import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PKG = os.path.join(ROOT, "libruntime", "python")
if PKG not in sys.path:
    sys.path.insert(0, PKG)
os.environ.setdefault("CXLKV_LIB", os.path.join(os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build")),
                                               "libruntime", "libcxlkv.so"))
os.environ["PYTHONPATH"] = PKG + os.pathsep + os.environ.get("PYTHONPATH", "")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import cxlkv  # noqa: E402
import numpy as np  # noqa: E402

_seq = itertools.count()


def make_uri(tag, size=256 << 20):
    name = f"cxlkv-py-{tag}-{os.getpid()}-{next(_seq)}"
    return f"shm:{name}:{size}", f"/dev/shm/{name}"


def remove_pool_files(uri, path, nodes=4):
    """After a test whose pool was used by other processes: the node-local
    files of nodes 0..nodes-1, then the pool file (nothing if it is gone)."""
    if os.path.exists(path):
        with cxlkv.Pool(uri) as p:
            for node in range(nodes):
                p.remove_node_local(node)
        os.unlink(path)


class PoolEnv:
    """A formatted pool, its lock manager and a KV store of node 1."""

    def __init__(self, tag, size=256 << 20, max_nodes=8):
        self.uri, self.path = make_uri(tag, size)
        cxlkv.Pool.format(self.uri, max_nodes=max_nodes)
        self.max_nodes = max_nodes
        self.pool = cxlkv.Pool(self.uri)
        self.mgr = cxlkv.LockManager(self.pool)
        self._stores = []

    def store(self, node=1, **kw):
        s = cxlkv.KvStore(self.pool, node, **kw)
        self._stores.append(s)
        return s

    def close(self):
        for s in self._stores:
            s.close()
        self.mgr.stop()
        for node in range(self.max_nodes):  # every node a test (or its processes) attached
            self.pool.remove_node_local(node)
        self.pool.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _tag(request):
    return request.node.name[:24].replace("[", "_").replace("]", "_")


@pytest.fixture
def env(request):
    e = PoolEnv(_tag(request))
    yield e
    e.close()


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


def run_in_process(fn, *args, timeout=240):
    """Run fn(*args) in a spawned process; return its result (re-raising
    its exception here)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, fn, args))
    p.start()
    try:
        ok, val = q.get(timeout=timeout)
    except Exception as e:
        p.kill()
        p.join()
        raise AssertionError(f"process running {fn.__name__} gave no result (exit code {p.exitcode}): {e!r}")
    p.join(timeout)
    if not ok:
        raise AssertionError(f"{fn.__name__} in another process failed:\n{val}")
    return val


def _child(q, fn, args):
    import traceback
    try:
        q.put((True, fn(*args)))
    except BaseException:
        q.put((False, traceback.format_exc()))
