#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The `py` bench group: KV publish / fetch through the Python package on CPU
tensors, in the geometry of cxlkv-bench's `kv` group (2 MiB blocks of
Llama-3.1-8B: 32 layers x K,V x 16 tokens x 8 heads x 128 x bf16, i.e. 64
chunks of 32 KiB gathered from a vLLM-layout paged cache), beside the C++
kv.publish_gbps / kv.fetch_gbps of the same run.

    py_bench.py [--results build/bench/results.json]

Merges into the results file (one flat JSON object):
  py.publish_gbps, py.fetch_gbps             through cxlkv.KvStore.put / get (batches of 32
                                             blocks; best of 3 passes; a 1 GiB pool with at
                                             most 192 blocks cached, evicting as it goes;
                                             fetches cycle over the 192 most recent blocks,
                                             as the kv group)
  py.kv_publish_gbps_interleaved, py.kv_fetch_gbps_interleaved
                                             best of 3 `cxlkv-bench --only kv` runs interleaved
                                             with the Python passes (same load)
  py.capi_per_block_publish_gbps             the C API's reserve/write/publish per block from
                                             Python, same pool and handle (and its ratio
                                             py.publish_vs_capi_per_block)
  py.publish_vs_kv, py.fetch_vs_kv           py / interleaved C++ (kv.*_gbps of the file
                                             when cxlkv-bench is not built)
CXLKV_BENCH_SCALE scales the block count as for cxlkv-bench.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "libruntime", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    build = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
    ap.add_argument("--results", default=os.path.join(build, "bench", "results.json"))
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("CXLKV_LIB", os.path.join(build, "libruntime", "libcxlkv.so"))
    import numpy as np
    import torch

    import cxlkv

    scale = float(os.environ.get("CXLKV_BENCH_SCALE", "1") or 1)
    n = max(64, int(512 * scale))
    layers, bt, heads, head = 32, 16, 8, 128
    cache_blocks = 16  # as cxlkv-bench's kv group (llama31_8b_layout(16))
    # vLLM FlashAttention layout, per layer [2, blocks, 16, 8, 128] bf16
    caches = [torch.zeros(2, cache_blocks, bt, heads, head, dtype=torch.bfloat16) for _ in range(layers)]
    for i, c in enumerate(caches):
        c.view(torch.int16).view(-1)[::2048] = i  # touch every page
    paged = cxlkv.PagedKV.vllm(caches)
    assert paged.block_bytes == 2 << 20 and paged.chunks_per_block == 64

    name = f"cxlkv-pybench-{os.getpid()}"
    reps = int(os.environ.get("CXLKV_PYBENCH_REPS", "3"))  # best of N: a loaded machine makes single passes noisy
    uri = f"shm:{name}:{1 << 30}"  # 1 GiB, at most 192 blocks cached: as cxlkv-bench's kv group
    cxlkv.Pool.format(uri, max_nodes=4)
    pool = cxlkv.Pool(uri)
    mgr = cxlkv.LockManager(pool)
    kv = cxlkv.KvStore(pool, 1)
    # Fault in the kv carve's pages once (cxlkv-bench's pools recycle 192
    # blocks' pages after its warm-up; here every block gets fresh pages).
    import ctypes
    kc = next(c for c in pool.carves() if c["name"] == "kv")
    ctypes.memset(pool.base + kc["offset"], 0, kc["size"])
    out = {}
    ctl = os.path.join(build, "tools", "cxlkvctl")
    if os.path.exists(ctl):
        # At most 192 blocks cached, the kv group's bound: the pool-wide
        # memory-tier capacity, set as an operator does (cxlkvctl --mem-capacity).
        tmp = f"/tmp/cxlkv-pybench-{os.getpid()}.blk"
        with open(tmp, "wb") as f:
            f.write(b"\0" * 4096)
        subprocess.run([ctl, "--pool", uri, "kv", "put", "pybench-capacity", tmp, "--mem-capacity", "192"],
                       stdout=subprocess.DEVNULL, check=True)
        os.unlink(tmp)
    try:
        def publish(tag, count):
            ids = np.arange(count, dtype=np.uint64) + np.uint64(tag)
            keys = cxlkv.keys_from_hashes([int(i) for i in ids])
            done = 0
            t0 = time.perf_counter()
            for lo in range(0, count, args.batch):
                k = keys[lo:lo + args.batch]
                blk = [(lo + j) % cache_blocks for j in range(len(k))]
                st = kv.put(k, paged, blk)
                done += int((st == cxlkv.RESERVED).sum())
            sec = time.perf_counter() - t0
            return keys, done * paged.block_bytes / sec / 1e9

        def publish_per_block(tag, count):
            # Baseline: the C API's single-block calls (reserve, write, publish per
            # block) made from Python, over the same handle and pool.
            import ctypes as C
            from cxlkv import _lib
            L = _lib.lib()
            keys = cxlkv.keys_from_hashes(list(range(tag, tag + count)))
            done = 0
            t0 = time.perf_counter()
            for i in range(count):
                ch, cnt = paged.chunks([i % cache_blocks])
                b = _lib.KvBlock()
                kp = keys[i:i + 1].ctypes.data_as(C.POINTER(_lib.KvKey))
                if L.cxlkv_kv_reserve(kv.handle, kp, None, paged.block_bytes, C.byref(b)) != 0:
                    continue
                if L.cxlkv_kv_write(kv.handle, C.byref(b), ch.ctypes.data_as(C.POINTER(_lib.Chunk)), int(cnt[0])) == 0 \
                        and L.cxlkv_kv_publish(kv.handle, C.byref(b)) == 0:
                    done += 1
                else:
                    L.cxlkv_kv_abort(kv.handle, C.byref(b))
            return done * paged.block_bytes / (time.perf_counter() - t0) / 1e9

        pub, fet, cpub, cfet, single = [], [], [], [], []
        bench = os.path.join(build, "tools", "cxlkv-bench")
        for r in range(reps):
            # The C++ kv group interleaved with the Python passes, so both see
            # the same machine load (best of each is compared).
            if os.path.exists(bench):
                tmp = f"/tmp/cxlkv-pybench-kv-{os.getpid()}.json"
                if subprocess.run([bench, "--only", "kv", "--out", tmp], stdout=subprocess.DEVNULL).returncode == 0:
                    with open(tmp) as f:
                        kvres = json.load(f)
                    os.unlink(tmp)
                    cpub.append(kvres.get("kv.publish_gbps", 0))
                    cfet.append(kvres.get("kv.fetch_gbps", 0))
            single.append(publish_per_block(0x9000000 + r * n, n))
            keys, rate = publish(0x6000000 + r * n, n)
            pub.append(rate)
            # Fetch n blocks cycling over the 192 most recently published (cached).
            recent = keys[-192:]
            got = 0
            t0 = time.perf_counter()
            for lo in range(0, n, args.batch):
                idx = [(lo + j) % len(recent) for j in range(min(args.batch, n - lo))]
                blk = [(lo + j) % cache_blocks for j in range(len(idx))]
                got += int(cxlkv.get_ok(kv.get(recent[idx], paged, blk)).sum())
            sec = time.perf_counter() - t0
            fet.append(got * paged.block_bytes / sec / 1e9)
            if got != n:
                print(f"py bench: fetched {got} of {n} blocks", file=sys.stderr)
        out["py.publish_gbps"], out["py.fetch_gbps"] = max(pub), max(fet)
        out["py.capi_per_block_publish_gbps"] = max(single)
        out["py.publish_vs_capi_per_block"] = max(pub) / max(single) if max(single) else 0
        if cpub:
            out["py.kv_publish_gbps_interleaved"], out["py.kv_fetch_gbps_interleaved"] = max(cpub), max(cfet)
    finally:
        kv.close()
        mgr.stop()
        pool.close()
        os.unlink(f"/dev/shm/{name}")

    res = {}
    if os.path.exists(args.results):
        with open(args.results) as f:
            res = json.load(f)
    for k in ("publish", "fetch"):
        base = out.get(f"py.kv_{k}_gbps_interleaved") or res.get(f"kv.{k}_gbps")
        if base:
            out[f"py.{k}_vs_kv"] = out[f"py.{k}_gbps"] / base
    res.update({k: round(v, 4) for k, v in out.items()})
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
