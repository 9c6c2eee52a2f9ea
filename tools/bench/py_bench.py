#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The `py` bench group: KV publish / fetch through the Python package on CPU
tensors, beside two C++ baselines of the same run.  The like-for-like one
(cxlkv-bench's kv_capi group) runs in lockstep with the Python passes, batch
beside batch (CXLKV_KVCAPI_LOCKSTEP: after each Python batch the C++ process
runs its batches of the same position, the C API's, then the kv.* design's
stand-in's), so a load spike on this shared machine hits the batches of a
position alike and cancels in their ratios; the ratios are medians over
every such position of N runs.  The order is one fixed cycle (Python, C API,
stand-in), and every side has engine memory of its own, so every side's
batch has the same two batches of the other sides since its own previous
one: the same share of its memory still in cache.  (An order that
alternated gave a Python batch that followed its own previous batch ~1.2x
the rate of one that followed the C++ process's two batches sharing one
cache, the pair ratios two modes apart, and their median anywhere from
0.6x to 1.2x between runs.)  Each side works on a pool of its own with its
own lock manager, as the kv.* design does (CXLKV_PYBENCH_PEER=shared: the
C++ side works as node 2 on the Python side's pool under cxlkvd, with keys
of its own; then the Python and C API batches also take their stripe grants
back from each other every batch, and the stand-in's do not).

Geometry, the same in the Python passes and in the like-for-like C++ baseline
(cxlkv-bench's kv_capi group, tools/bench/bench_kv_capi.cpp): 2 MiB blocks of
Llama-3.1-8B (32 layers x K,V x 16 tokens x 8 heads x 128 x bf16), i.e. 64
chunks of 32 KiB gathered from a vLLM FlashAttention-layout paged cache of 16
engine blocks; batches of 32 blocks, one C call each (cxlkv_kv_put_chain /
cxlkv_kv_get_many); a 1 GiB shm pool (max_nodes 4) with a lock manager in the
process (two-tier stripe locks, node heap), the KV store opened as node 1, at
most 192 blocks cached (evicting as it goes); the kv carve faulted in, one
warm-up pass, then 3 passes of n = 512 blocks published and n fetched cycling
over the 128 most recently published; a fresh pool for every run of either
side.  Each side's figure of a run is its
median batch rate (bytes of the blocks the call did / the call's time, chunk
list building included), as kv.* are medians of 32-block rounds.

    py_bench.py [--results build/bench/results.json]

Merges into the results file (one flat JSON object):
  py.publish_gbps, py.fetch_gbps       through cxlkv.KvStore.put / get on torch CPU tensors
                                       (cxlkv.PagedKV.vllm); median over the runs
  py.kv_capi_publish_gbps_interleaved, py.kv_capi_fetch_gbps_interleaved
                                       the same C calls from C++ (`cxlkv-bench --only kv_capi`:
                                       kv_capi.publish_gbps / fetch_gbps) in the paired runs: the
                                       like-for-like baseline (same locks, allocator, geometry,
                                       batch size); median over the runs
  py.kv_publish_gbps_interleaved, py.kv_fetch_gbps_interleaved
                                       `cxlkv-bench --only kv`'s kv.publish_gbps / kv.fetch_gbps in
                                       the same runs (in-process mutex stripe locks, a first-fit
                                       range allocator, one block per call)
  py.publish_vs_kv_capi, py.fetch_vs_kv_capi
                                       the median over all lockstep pairs (py.*_lockstep_pairs of
                                       them) of Python batch rate / C++ batch rate (docs/benchmarks.md "Latest figures"; >= 0.9)
  py.publish_vs_kv, py.fetch_vs_kv     the Python package's ratio: the median over every lockstep pair of
                                       (Python batch rate / kv.* design batch rate), that design (the
                                       C++ KvStore over in-process mutex stripe locks and a first-fit
                                       allocator, one block per call, same bound and geometry, a pool
                                       of its own) run by the peer beside each Python batch
                                       (CXLKV_KVCAPI_LOCAL); py.kv_publish_gbps_lockstep /
                                       py.kv_fetch_gbps_lockstep its median rates
  py.publish_vs_kv_separate_run, py.fetch_vs_kv_separate_run
                                       the median over the runs of each run's py / kv.*_gbps of the
                                       separate `cxlkv-bench --only kv` run just before it (paired by
                                       time only; rates swing 2-3x between minutes here)
  py.publish_gb_per_cpu_s, py.fetch_gb_per_cpu_s, py.*_per_cpu_s_vs_kv_capi
                                       the same per CPU-second of the calling thread, beside
                                       kv_capi.*_gb_per_cpu_s: less sensitive to the load of
                                       other processes than wall-clock rates
  py.capi_per_block_publish_gbps       the C API's reserve/write/publish per block from Python,
                                       same pool and handle (py.publish_vs_capi_per_block)
  py.publish_vs_c_call_same_process, py.fetch_vs_c_call_same_process
                                       the package's own cost: median batch rate of
                                       KvStore.put / get over that of cxlkv_kv_put_chain /
                                       get_many called directly (chunk arrays built once),
                                       alternating batch by batch, same pool and handle
CXLKV_BENCH_SCALE scales the block count as for cxlkv-bench; CXLKV_PYBENCH_REPS
sets N (default 3).
"""
import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "libruntime", "python"))

CAPACITY = 192  # blocks cached at most (pool-wide memory-tier bound)
RECENT = 128    # fetches cycle over this many most recently published blocks
PASSES = 3      # publish + fetch passes per run (as the kv_capi group's)
CACHE_BLOCKS = 16
# The lockstep peer works on a pool of its own (as the kv.* design does), or
# (CXLKV_PYBENCH_PEER=shared) on our pool as node 2 (same pool, bound and lock
# manager, the manager being cxlkvd, in neither side's process).
SHARED_POOL = os.environ.get("CXLKV_PYBENCH_PEER", "own") == "shared"


def median(v):
    v = sorted(v)
    return float(v[len(v) // 2]) if v else 0.0


def bound_capacity(build, uri):
    """At most CAPACITY blocks cached: the pool-wide memory-tier bound, set as
    an operator does (cxlkvctl kv ... --mem-capacity); the pool is left empty."""
    ctl = os.path.join(build, "tools", "cxlkvctl")
    if not os.path.exists(ctl):
        print("py bench: cxlkvctl not built: the pool is not bounded to 192 blocks", file=sys.stderr)
        return
    tmp = f"/tmp/cxlkv-pybench-{os.getpid()}.blk"
    with open(tmp, "wb") as f:
        f.write(b"\0" * 4096)
    try:
        subprocess.run([ctl, "--pool", uri, "kv", "put", "pybench-capacity", tmp, "--mem-capacity", str(CAPACITY)],
                       stdout=subprocess.DEVNULL, check=True)
        subprocess.run([ctl, "--pool", uri, "kv", "rm", "pybench-capacity"], stdout=subprocess.DEVNULL, check=True)
    finally:
        os.unlink(tmp)


@contextlib.contextmanager
def lock_manager(build, pool, own_process):
    """The pool's lock manager: a thread of this process, or (own_process)
    cxlkvd, so that a lockstep peer on the same pool is served by a manager
    that lives in neither side's process."""
    import cxlkv
    d = os.path.join(build, "tools", "cxlkvd")
    if not own_process or not os.path.exists(d):
        with cxlkv.LockManager(pool):
            yield
        return
    p = subprocess.Popen([d, "--pool", pool.uri, "--foreground", "--metrics-listen", "none"],
                         stderr=subprocess.PIPE, text=True)
    try:
        while True:  # until it manages (or gives up)
            ln = p.stderr.readline()
            if not ln or "managing locks" in ln:
                break
        yield
    finally:
        p.terminate()
        p.wait(60)


@contextlib.contextmanager
def fresh_pool(build, tag, manager_process=False):
    """A new 1 GiB shm pool (max_nodes 4) with its lock manager and a KV store
    of node 1, bounded to CAPACITY blocks, kv carve faulted in; removed after."""
    import cxlkv
    name = f"cxlkv-pybench-{tag}-{os.getpid()}"
    uri = f"shm:{name}:{1 << 30}"
    cxlkv.Pool.format(uri, max_nodes=4)
    try:
        with cxlkv.Pool(uri) as pool:
            try:
                with lock_manager(build, pool, manager_process):
                    # The bound first, as an operator configures a pool before
                    # serving (a store opened before it reads it within 50 ms).
                    bound_capacity(build, uri)
                    with cxlkv.KvStore(pool, 1) as kv:
                        kc = next(c for c in pool.carves() if c["name"] == "kv")
                        ctypes.memset(pool.base + kc["offset"], 0, kc["size"])
                        yield kv
            finally:
                pool.remove_node_local(1)
    finally:
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


class Engine:
    """vLLM FlashAttention layout, per layer [2, 16 blocks, 16, 8, 128] bf16."""

    def __init__(self, batch):
        import torch

        import cxlkv
        self.cxlkv, self.batch = cxlkv, batch
        self.caches = [torch.zeros(2, CACHE_BLOCKS, 16, 8, 128, dtype=torch.bfloat16) for _ in range(32)]
        for i, c in enumerate(self.caches):
            c.view(torch.int16).view(-1)[::2048] = i  # touch every page
        self.paged = cxlkv.PagedKV.vllm(self.caches)
        assert self.paged.block_bytes == 2 << 20 and self.paged.chunks_per_block == 64

    peer = None       # a Peer in lockstep: its batch runs right beside each of ours
    pairs = None      # {"P": [(py rates, peer rates)], "F": [...]}: batches side by side

    def timed(self, call, rates, kind="W"):
        # one batch: (wall GB/s, GB per CPU-second of this thread) of the blocks it did;
        # then the peer's batches of the same position (the C API's, then the
        # stand-in's): one fixed cycle, so every side's batch has the other two
        # sides' batches between it and its own previous one (an order that
        # alternated made a side's batch after its own previous one far
        # faster than one after the other process's, and the pair ratios
        # bimodal: their median jumped between the two modes from run to run)
        t0, c0 = time.perf_counter(), time.thread_time()
        done = int((call() == self.cxlkv.RESERVED).sum()) * self.paged.block_bytes
        w, c = time.perf_counter() - t0, time.thread_time() - c0
        peer = self._peer_step(kind) if self.peer else None
        mine = (done / max(w, 1e-9) / 1e9, done / max(c, 1e-9) / 1e9)
        if rates is not None:
            rates.append(mine)
            if peer:
                self.pairs[kind].append((mine, peer[0]))
                if peer[1]:
                    self.pairs["kv" + kind].append((mine, peer[1]))
        return done

    def _peer_step(self, want):
        kind, done, w, c, local = self.peer.step()
        if kind != want:
            raise RuntimeError(f"py bench: lockstep lost: the peer ran a {kind} batch beside our {want} batch")
        rate = lambda d, w, c: (d / max(w, 1e-9) / 1e9, d / max(c, 1e-9) / 1e9)
        return rate(done, w, c), rate(*local) if local else None

    def publish(self, kv, tag, count, rates=None):
        keys = self.cxlkv.keys_from_hashes(range(tag, tag + count))
        for lo in range(0, count, self.batch):
            k = keys[lo:lo + self.batch]
            blk = [(lo + j) % CACHE_BLOCKS for j in range(len(k))]
            self.timed(lambda: kv.put(k, self.paged, blk), rates, "P" if rates is not None else "W")
        return keys

    def fetch(self, kv, recent, count, rates):
        got = 0
        for lo in range(0, count, self.batch):
            idx = [(lo + j) % len(recent) for j in range(min(self.batch, count - lo))]
            blk = [(lo + j) % CACHE_BLOCKS for j in range(len(idx))]
            got += self.timed(lambda: kv.get(recent[idx], self.paged, blk), rates, "F") // self.paged.block_bytes
        if got != count:
            print(f"py bench: fetched {got} of {count} blocks", file=sys.stderr)

    def publish_per_block(self, kv, tag, count):
        """The C API's single-block calls (reserve, write, publish per block)
        made from Python, over the same handle and pool; GB/s."""
        from cxlkv import _lib
        L = _lib.lib()
        keys = self.cxlkv.keys_from_hashes(range(tag, tag + count))
        done = 0
        t0 = time.perf_counter()
        for i in range(count):
            ch, cnt = self.paged.chunks([i % CACHE_BLOCKS])
            b = _lib.KvBlock()
            kp = keys[i:i + 1].ctypes.data_as(ctypes.POINTER(_lib.KvKey))
            if L.cxlkv_kv_reserve(kv.handle, kp, None, self.paged.block_bytes, ctypes.byref(b)) != 0:
                continue
            if L.cxlkv_kv_write(kv.handle, ctypes.byref(b), ch.ctypes.data_as(ctypes.POINTER(_lib.Chunk)),
                                int(cnt[0])) == 0 and L.cxlkv_kv_publish(kv.handle, ctypes.byref(b)) == 0:
                done += 1
            else:
                L.cxlkv_kv_abort(kv.handle, ctypes.byref(b))
        return done * self.paged.block_bytes / (time.perf_counter() - t0) / 1e9

    def run(self, kv, n, peer=None):
        """One run, as the kv_capi group's: warm-up pass, PASSES x (publish n,
        fetch n); the median batch of each, wall and per CPU-second.  With a
        peer (the kv_capi group in lockstep), each of our batches is followed
        by the peer's batches of the same position, and the run's ratios are
        those of the medians over the same stretch of time."""
        self.peer, self.pairs = peer, {"P": [], "F": [], "kvP": [], "kvF": []}
        try:
            self.publish(kv, 0x5000000, n)
            pub, fet = [], []
            for p in range(PASSES):
                keys = self.publish(kv, 0x6000000 + p * n, n, pub)
                self.fetch(kv, keys[-RECENT:], n, fet)
        finally:
            self.peer = None
        out = {"py.publish_gbps": median(x[0] for x in pub), "py.fetch_gbps": median(x[0] for x in fet),
               "py.publish_gb_per_cpu_s": median(x[1] for x in pub),
               "py.fetch_gb_per_cpu_s": median(x[1] for x in fet)}
        if peer:
            cp, cf = [x[1] for x in self.pairs["P"]], [x[1] for x in self.pairs["F"]]
            out.update({"kv_capi.publish_gbps": median(x[0] for x in cp), "kv_capi.fetch_gbps": median(x[0] for x in cf),
                        "kv_capi.publish_gb_per_cpu_s": median(x[1] for x in cp),
                        "kv_capi.fetch_gb_per_cpu_s": median(x[1] for x in cf)})
            out["_pairs"] = self.pairs
        out["py.capi_per_block_publish_gbps"] = self.publish_per_block(kv, 0x9000000, n)
        return out

    def same_process(self, kv, n):
        """Median per-batch rate of KvStore.put / get over that of the same C
        call made directly (chunk arrays built once), alternating batch by
        batch, order-balanced (1.0: the package adds nothing)."""
        import numpy as np
        from cxlkv import _lib
        L, batch, cx = _lib.lib(), self.batch, self.cxlkv
        blk = [j % CACHE_BLOCKS for j in range(batch)]
        ch, cnt = self.paged.chunks(blk)
        chp = ch.ctypes.data_as(ctypes.POINTER(_lib.Chunk))
        cntp = cnt.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
        st = np.zeros(batch, np.int32)
        stp = st.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        kp = ctypes.POINTER(_lib.KvKey)
        rates = {"py_put": [], "c_put": [], "py_get": [], "c_get": []}

        def c_put(keys):
            L.cxlkv_kv_put_chain(kv.handle, None, keys.ctypes.data_as(kp), batch, self.paged.block_bytes, chp,
                                 cntp, stp)
            return st

        def c_get(keys):
            L.cxlkv_kv_get_many(kv.handle, keys.ctypes.data_as(kp), batch, chp, cntp, stp)
            return st

        self.publish(kv, 0xB000000, n)  # warm-up: the pool at its bound, as in the runs
        tag = 0xA000000
        for i in range(max(8, 3 * n // batch)):
            pk = cx.keys_from_hashes(range(tag, tag + batch))
            ck = cx.keys_from_hashes(range(tag + batch, tag + 2 * batch))
            tag += 2 * batch
            puts = [("py_put", lambda: kv.put(pk, self.paged, blk)), ("c_put", lambda: c_put(ck))]
            gets = [("py_get", lambda: kv.get(pk, self.paged, blk)), ("c_get", lambda: c_get(ck))]
            if i % 2:  # alternate which goes first: no order bias
                puts.reverse()
                gets.reverse()
            for name, f in puts + gets:
                r = []
                self.timed(f, r)
                rates[name].append(r[0][0])
        m = {k: median(v) for k, v in rates.items()}
        return {"py.publish_vs_c_call_same_process": m["py_put"] / m["c_put"] if m["c_put"] else 0,
                "py.fetch_vs_c_call_same_process": m["py_get"] / m["c_get"] if m["c_get"] else 0}


class Peer:
    """cxlkv-bench's kv_capi group in lockstep (CXLKV_KVCAPI_LOCKSTEP, see
    bench_kv_capi.cpp): one C++ batch per step(), in the same sequence of
    batches as Engine.run (warm-up, then publish / fetch passes)."""

    def __init__(self, build, shared_uri=None):
        bench = os.path.join(build, "tools", "cxlkv-bench")
        self.tmp = f"/tmp/cxlkv-pybench-peer-{os.getpid()}.json"
        env = dict(os.environ, CXLKV_KVCAPI_LOCKSTEP="1", CXLKV_KVCAPI_LOCAL="1")
        if shared_uri:
            env["CXLKV_KVCAPI_SHARED_POOL"] = shared_uri
        self.p = subprocess.Popen([bench, "--only", "kv_capi", "--out", self.tmp], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    def step(self):
        """(kind W|P|F, bytes done, wall s, cpu s) of the peer's next C API
        batch, and the same of its kv.*-design stand-in batch at the same
        position (None when the peer could not open the stand-in's pool)."""
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        ln = self.p.stdout.readline().split()
        if len(ln) not in (4, 7):
            raise RuntimeError("py bench: the kv_capi peer stopped (see its messages above)")
        local = (int(ln[4]), float(ln[5]), float(ln[6])) if len(ln) == 7 else None
        return ln[0], int(ln[1]), float(ln[2]), float(ln[3]), local

    def close(self):
        self.p.stdin.close()
        self.p.wait(300)
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def same_build(build):
    """None, or why the Python side (libcxlkv.so) and the C++ side
    (cxlkv-bench, linked with libcxlkv.a) would not run the same code: both
    libraries are linked from the same objects, and a partial build
    (`--target cxlkv-bench` alone) relinks only the static one.  (A
    libcxlkv.so left 8 hours old made the Python side take its stripe locks
    one at a time and sleep on them: 0.6-0.8x for no fault of the package.)"""
    objs = os.path.join(build, "libruntime", "CMakeFiles", "cxlkv_objs.dir")
    so = os.path.join(build, "libruntime", "libcxlkv.so")
    if not os.path.isdir(objs) or os.path.realpath(os.environ.get("CXLKV_LIB", so)) != os.path.realpath(so):
        return None
    newest = max((os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(objs) for f in fs
                  if f.endswith(".o")), default=0)
    for lib in (so, os.path.join(build, "tools", "cxlkv-bench")):
        if os.path.exists(lib) and os.path.getmtime(os.path.realpath(lib)) < newest:
            return (f"{lib} is older than the library's objects: build it "
                    f"(cmake --build {build} --target cxlkv_shared cxlkv-bench)")
    return None


def cxx_run(build):
    """One run of cxlkv-bench's kv group ({} when not built): kv.publish_gbps
    / kv.fetch_gbps, another design (in-process mutex locks, a range
    allocator, one block per call), paired with a Python run by time only."""
    bench = os.path.join(build, "tools", "cxlkv-bench")
    if not os.path.exists(bench):
        return {}
    tmp = f"/tmp/cxlkv-pybench-kv-{os.getpid()}.json"
    try:
        if subprocess.run([bench, "--only", "kv", "--out", tmp], stdout=subprocess.DEVNULL).returncode != 0:
            return {}
        with open(tmp) as f:
            return json.load(f)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


BASE = ("kv.publish_gbps", "kv.fetch_gbps", "kv_capi.publish_gbps", "kv_capi.fetch_gbps",
        "kv_capi.publish_gb_per_cpu_s", "kv_capi.fetch_gb_per_cpu_s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    build = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
    ap.add_argument("--results", default=os.path.join(build, "bench", "results.json"))
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("CXLKV_LIB", os.path.join(build, "libruntime", "libcxlkv.so"))

    have_bench = os.path.exists(os.path.join(build, "tools", "cxlkv-bench"))
    why = same_build(build) if have_bench else None
    if why:
        print(f"py bench: the two sides would run different code: {why}", file=sys.stderr)
        return 2
    scale = float(os.environ.get("CXLKV_BENCH_SCALE", "1") or 1)
    n = max(64, int(512 * scale))
    reps = int(os.environ.get("CXLKV_PYBENCH_REPS", "3"))
    eng = Engine(args.batch)
    runs = []
    for r in range(reps):
        # The like-for-like baseline (kv_capi) in lockstep, batch beside
        # batch; the kv group's run just before (paired by time only).
        base = {k: v for k, v in cxx_run(build).items() if k in BASE}
        with fresh_pool(build, f"run{r}", manager_process=SHARED_POOL) as kv:
            peer = Peer(build, kv.pool.uri if SHARED_POOL else None) if have_bench else None
            try:
                runs.append(dict(base, **eng.run(kv, n, peer)))
            finally:
                if peer:
                    peer.close()
    with fresh_pool(build, "same") as kv:
        out = eng.same_process(kv, n)

    def across(key):
        return median(x[key] for x in runs if key in x)


    for k in ("py.publish_gbps", "py.fetch_gbps", "py.publish_gb_per_cpu_s", "py.fetch_gb_per_cpu_s",
              "py.capi_per_block_publish_gbps"):
        out[k] = across(k)
    out["py.publish_vs_capi_per_block"] = (out["py.publish_gbps"] / out["py.capi_per_block_publish_gbps"]
                                           if out["py.capi_per_block_publish_gbps"] else 0)
    for k in BASE:
        if any(k in x for x in runs):
            g, m = k.split(".")
            out[f"py.{g}_{m}_interleaved"] = across(k)
    # Ratios: the median over the runs of each run's py / C++ (paired in time).
    for g, k, unit in (("kv", "publish", "gbps"), ("kv", "fetch", "gbps"), ("kv_capi", "publish", "gbps"),
                       ("kv_capi", "fetch", "gbps"), ("kv_capi", "publish", "gb_per_cpu_s"),
                       ("kv_capi", "fetch", "gb_per_cpu_s")):
        pairs = [x[f"py.{k}_{unit}"] / x[f"{g}.{k}_{unit}"] for x in runs if x.get(f"{g}.{k}_{unit}")]
        if pairs:
            out[f"py.{k}_vs_{g}" if unit == "gbps" else f"py.{k}_per_cpu_s_vs_{g}"] = median(pairs)
    # Like for like (kv_capi), batch beside batch: the median over every
    # lockstep pair of all runs of (Python batch rate / C++ batch rate).  A
    # load spike hits both batches of a pair, so it cancels in the ratio.
    for kind, k in (("P", "publish"), ("F", "fetch")):
        pairs = [p for x in runs for p in x.get("_pairs", {}).get(kind, []) if p[1][0] > 0 and p[1][1] > 0]
        if pairs:
            out[f"py.{k}_vs_kv_capi"] = median(py[0] / c[0] for py, c in pairs)
            out[f"py.{k}_per_cpu_s_vs_kv_capi"] = median(py[1] / c[1] for py, c in pairs)
            out[f"py.{k}_lockstep_pairs"] = len(pairs)
    # The Python package's ratio (docs/benchmarks.md "Latest figures"), py / kv: the kv.* design (the C++ KvStore, one block
    # per call, in-process mutex locks, first-fit allocator, same bound, a
    # pool of its own) run by the peer at every position beside the Python
    # batch, the same pairing.  The time-paired ratio against the separate
    # `cxlkv-bench --only kv` run stays as py.*_vs_kv_separate_run: on this
    # shared machine a run's rates swing 2-3x from one minute to the next.
    for kind, k in (("kvP", "publish"), ("kvF", "fetch")):
        pairs = [p for x in runs for p in x.get("_pairs", {}).get(kind, []) if p[1][0] > 0 and p[1][1] > 0]
        if pairs:
            if f"py.{k}_vs_kv" in out:
                out[f"py.{k}_vs_kv_separate_run"] = out[f"py.{k}_vs_kv"]
            out[f"py.{k}_vs_kv"] = median(py[0] / c[0] for py, c in pairs)
            out[f"py.{k}_per_cpu_s_vs_kv"] = median(py[1] / c[1] for py, c in pairs)
            out[f"py.kv_{k}_gbps_lockstep"] = median(c[0] for _, c in pairs)

    res = {}
    if os.path.exists(args.results):
        with open(args.results) as f:
            res = json.load(f)
    for g in ("kv", "kv_capi"):  # no cxlkv-bench to pair with: the figures of the results file
        for k in ("publish", "fetch"):
            b = res.get(f"{g}.{k}_gbps")
            if f"py.{k}_vs_{g}" not in out and b:
                out[f"py.{k}_vs_{g}"] = out[f"py.{k}_gbps"] / b
    res.update({k: round(v, 4) for k, v in out.items()})
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
