#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The vLLM connector's save and load calls outside an engine, beside the
raw copy of the same blocks, in seconds instead of the engine bench's
minutes: a tool for working on the per-block cost of those calls
(docs/benchmarks.md "Serving engines"), not a `make bench` group.

A KV cache shaped as vLLM's CPU cache views ([blocks, heads, tokens, K|V]
per layer, torch CPU tensors; the geometry of engine_bench.py's tiny or
wide model, 32-token blocks) and a fresh shm pool with its lock manager.
Each call:

  save   KvStore.put_engine_step of --blocks fresh engine hashes as one
         chain (what the connector's wait_for_save sends), against
         cxlkv_gather_write of the same blocks' chunk lists, one call a
         block, into a scratch ring of the same pool's kv carve;
  load   KvStore.get_engine of --blocks blocks put earlier (random ones),
         against cxlkv_scatter_read of as many blocks from the ring into a
         mirror of the cache (the raw copy never writes the cache the
         connector reads into).

With --by-key the calls are those a worker makes when the scheduler's plan
carries the keys its lookups made (docs/engines.md "One call a step"):
KvStore.put_paged_step and get_paged_step of the same blocks, the keys made
untimed beforehand, as the scheduler makes them.

The raw copy goes before the connector's call on one call and after it on
the next, as the connector's raw_baseline does.  --cold-mib M trashes M MiB
of memory before each timed part, as a forward pass does between an
engine's steps (64 is twice this machine's L3); 0 runs warm.

    connector_micro.py [--geometry tiny|wide] [--blocks N] [--calls N]
                       [--cold-mib M] [--by-key] [--results FILE]

Prints per-block figures and the ratios; --results merges
connector_micro.<geometry>.<cold|warm>[.by_key].{save,load}_vs_raw and the
per-block times into that JSON file.
"""

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "python"), os.path.join(ROOT, "libruntime", "python")]

from engine_bench import BLOCK, TINY, WIDE  # noqa: E402  -- the engine bench's geometries, the same blocks
from pool_env import PoolEnv  # noqa: E402

import cxlkv  # noqa: E402

GEOMETRY = {"tiny": TINY, "wide": WIDE}


def _positive(v):
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v} is not a positive integer")
    return n


def run(geometry, blocks, calls, cold_mib, by_key=False, seed=1):
    import numpy as np
    import torch
    from cxlkv.integrations.vllm import paged_kv_of
    g = GEOMETRY[geometry]
    saved_blocks = blocks * calls
    nb = saved_blocks + blocks  # every save gets engine blocks of its own; loads reuse them
    shape = (nb, g["kv_heads"], BLOCK, 2 * g["head_dim"])
    cache = {f"l{i}": torch.randn(*shape) for i in range(g["layers"])}
    mirror = {f"l{i}": torch.ones(*shape) for i in range(g["layers"])}
    kv, kvm = paged_kv_of(cache, BLOCK), paged_kv_of(mirror, BLOCK)
    bb = kv.block_bytes
    ring = 64
    # Room for every block saved, the ring and the pool's own carves.
    size = -(-((saved_blocks + ring) * bb * 5 // 4 + (256 << 20)) // (2 << 20)) * (2 << 20)
    env = PoolEnv("connector-micro", size=size)
    try:
        store = env.store(1)
        lib = cxlkv._lib.lib()
        carve = next(c for c in env.pool.carves() if c["name"] == "kv")
        base = carve["offset"] + carve["size"] - ring * bb
        h = env.pool.handle
        ch0, _ = kv.chunks([0])
        for i in range(ring):  # mapped and written once, as a pool long in use
            if lib.cxlkv_gather_write(h, base + i * bb, ch0.ctypes.data, len(ch0)) != 0:
                raise SystemExit(f"connector_micro: raw write into {env.uri} failed: {cxlkv.last_error()}")
        trash = np.ones(cold_mib << 20, dtype=np.uint8) if cold_mib else None
        at = 0  # the ring block the next raw copy uses

        def cold():
            if trash is not None:
                trash[::64] += 1

        def raw(fn, view, ids):
            nonlocal at
            per = [view.chunks([b])[0] for b in ids]
            cold()
            t0 = time.perf_counter()
            for ch in per:
                rc = fn(h, base + (at % ring) * bb, ch.ctypes.data, len(ch))
                at += 1
                if rc != 0:
                    raise SystemExit(f"connector_micro: raw copy on {env.uri} failed: {cxlkv.last_error()}")
            return time.perf_counter() - t0

        ns = b"connector-micro"
        rng = random.Random(seed)
        # A running engine's figures, not a fresh process's: its first calls
        # wait for the lock manager's stripe grants (docs/locks.md "Two tiers
        # and sticky grants").  Untimed puts of 8192 small blocks of another
        # namespace take them.
        small = paged_kv_of({"w": torch.zeros(512, 1, BLOCK, 8)}, BLOCK)
        for _ in range(16):
            n, _st = store.put_engine_step(b"connector-micro-warm-up", [rng.randbytes(32) for _ in range(512)],
                                           [512], [None], small, list(range(512)))
            if n != 512:
                raise SystemExit(f"connector_micro: a warm-up put stored {n} of 512 blocks")
        hashes = [rng.randbytes(32) for _ in range(saved_blocks)]
        keys = cxlkv.keys_from_hashes(hashes, ns) if by_key else None
        root = bytes(16)
        t = {"save": 0.0, "save_raw": 0.0, "load": 0.0, "load_raw": 0.0}
        for c in range(calls):
            ids = list(range(c * blocks, (c + 1) * blocks))
            hs = hashes[c * blocks:(c + 1) * blocks]
            kb = keys[c * blocks:(c + 1) * blocks].tobytes() if by_key else None
            if c % 2:
                t["save_raw"] += raw(lib.cxlkv_gather_write, kv, ids)
            cold()
            t0 = time.perf_counter()
            if by_key:
                n, st = store.put_paged_step(kb, [blocks], root, kv, ids)
            else:
                n, st = store.put_engine_step(ns, hs, [blocks], [None], kv, ids)
            t["save"] += time.perf_counter() - t0
            if n != blocks:
                raise SystemExit(f"connector_micro: a save put {n} of {blocks} blocks (statuses {list(st)})")
            if not c % 2:
                t["save_raw"] += raw(lib.cxlkv_gather_write, kv, ids)
        for c in range(calls):
            pick = rng.sample(range(saved_blocks), blocks)
            dst = list(range(saved_blocks, saved_blocks + blocks))
            kb = keys[pick].tobytes() if by_key else None
            if c % 2:
                t["load_raw"] += raw(lib.cxlkv_scatter_read, kvm, dst)
            cold()
            t0 = time.perf_counter()
            if by_key:
                st = store.get_paged_step(kb, kv, dst)
            else:
                st = store.get_engine(ns, [hashes[i] for i in pick], kv, dst)
            t["load"] += time.perf_counter() - t0
            found = sum(1 for s in st if s == cxlkv.RESERVED)
            if found != blocks:
                raise SystemExit(f"connector_micro: a load found {found} of {blocks} blocks")
            for i, d in zip(pick, dst):  # the bytes are the saved block's
                for name in cache:
                    if not torch.equal(cache[name][i], cache[name][d]):
                        raise SystemExit(f"connector_micro: layer {name}: block {d} does not hold block {i}'s bytes")
            if not c % 2:
                t["load_raw"] += raw(lib.cxlkv_scatter_read, kvm, dst)
        per = blocks * calls
        us = {k: v / per * 1e6 for k, v in t.items()}
        return bb, us
    finally:
        env.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometry", choices=sorted(GEOMETRY), default="tiny",
                    help="tiny: 64 KiB blocks (2 layers, 2 KV heads of 64); wide: 1 MiB (4 layers, 8 KV heads of 128)")
    ap.add_argument("--blocks", type=_positive, default=24, help="blocks a call (default 24)")
    ap.add_argument("--calls", type=_positive, default=200, help="calls of each kind (default 200)")
    ap.add_argument("--cold-mib", type=int, default=64, help="MiB trashed before each timed part; 0: warm (default 64)")
    ap.add_argument("--by-key", action="store_true",
                    help="the calls by the keys a scheduler's plan carries (put_paged_step / get_paged_step), "
                         "not by the engine's hashes")
    ap.add_argument("--results", help="merge the figures into this JSON file")
    a = ap.parse_args()
    if a.cold_mib < 0:
        ap.error("--cold-mib must be 0 or more")
    bb, us = run(a.geometry, a.blocks, a.calls, a.cold_mib, a.by_key)
    mode = "cold" if a.cold_mib else "warm"
    res = {}
    p = f"connector_micro.{a.geometry}.{mode}." + ("by_key." if a.by_key else "")
    for op in ("save", "load"):
        res[p + f"{op}_us_per_block"] = round(us[op], 3)
        res[p + f"{op}_raw_us_per_block"] = round(us[op + "_raw"], 3)
        res[p + f"{op}_vs_raw"] = round(us[op] / us[op + "_raw"], 3)
    print(f"connector_micro: {a.geometry} ({bb // 1024} KiB blocks), {a.blocks} blocks a call, {a.calls} calls, {mode}, "
          f"by {'the keys' if a.by_key else 'the hashes'}")
    for op in ("save", "load"):
        print(f"  {op}: {us[op]:.2f} us a block against the raw copy's {us[op + '_raw']:.2f}: "
              f"{res[p + op + '_vs_raw']:.3f}x")
    if a.results:
        try:
            with open(a.results) as f:
                old = json.load(f)
        except FileNotFoundError:
            old = {}
        old.update(res)
        os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
        with open(a.results, "w") as f:
            json.dump(old, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
