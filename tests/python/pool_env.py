# SPDX-License-Identifier: MIT
"""What the Python tests and the engine tests share: the package and
libcxlkv.so of this checkout on the path, a fresh shm pool with its lock
manager (PoolEnv), and functions run in another process (spawned, so it maps
the pool and attaches as its own node, like another host)."""

import itertools
import multiprocessing as mp
import os
import sys

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


def tag_of(request):
    """A short name of the running test, for its pool's name."""
    return request.node.name[:24].replace("[", "_").replace("]", "_")


@pytest.fixture
def env(request):
    """A fresh pool of this test with its lock manager (PoolEnv)."""
    e = PoolEnv(tag_of(request))
    yield e
    e.close()
