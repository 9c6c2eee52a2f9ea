#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Replay a Mooncake-format trace across racks: token hit ratio per tier.

    replay_racks.py --trace FILE --racks N [--requests 3000] [--capacity-blocks C]
                    [--hold-blocks H] [--push-min-blocks M] [--results FILE]

Three set-ups serve the same requests, each request on rack i % N
(requests go out in rounds, one chunk per rack at a time, the racks working
at once):

  shared     one rack, one pool                   (the upper bound)
  isolated   N racks, N pools, no remote tier     (today without this tier)
  remote     N racks, N pools sharing one Mooncake Store (cxlkv.remote)

and report the share of prompt tokens that were local pool hits, remote
hits and misses.  By default every pool holds the whole workload (no
eviction), so the figures measure sharing alone; --capacity-blocks C bounds
the pools to the same total capacity, C blocks for the shared pool and C / N
for each rack's (the pool-wide memory-tier bound: they evict, docs/eviction.md),
while the Mooncake Store keeps what its segments hold (--segment-mib per
rack); --hold-blocks sets how many published blocks each rack's tier holds
in its pool until their push (docs/remote.md "Holding a block until its
push"; 0 holds none); --push-min-blocks the tiers' push policy (docs/remote.md
"Pushing selectively"; 0 pushes every block).  The racks are real: each its own shm pool
and process (tests/engines/remote_env.py), in network namespaces where this
process may make them, with a real mooncake_master.  `cxlkv-replay --racks`
runs this driver (Mooncake has no C interface for the C++ tool to drive).

Blocks are 1 KiB by default (the bytes do not change a hit ratio, only
how many blocks the store's segments hold: --block-bytes); a trace block is
--block-tokens tokens (Mooncake traces: 512).
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines"))

from remote_env import Racks, pool_remote_counters  # noqa: E402

# The pools' own remote tier counters (docs/remote.md "Counters", what
# `cxlkvctl stats` shows), summed over the racks, in the summary.
POOL_COUNTERS = ("hit_blocks", "hit_bytes", "miss_blocks", "fetch_failures", "degraded", "pushed_blocks",
                 "pushed_bytes", "push_dropped_blocks")


def load(path, limit):
    reqs = []
    with open(path) as f:
        for line in f:
            if len(reqs) >= limit:
                break
            r = json.loads(line)
            reqs.append((r["hash_ids"], int(r["input_length"])))
    return reqs


def run(names, reqs, remote, args, logdir):
    distinct = len({h for hs, _ in reqs for h in hs})
    entries = 1 << max(distinct * 2, 1024).bit_length()
    cap = args.capacity_blocks // len(names) if args.capacity_blocks else 0
    racks = Racks(names, logdir, master_args=args.master_args.split(), block_bytes=args.block_bytes, timeout=5.0,
                  segment_mib=args.segment_mib,
                  index_entries=entries, remote=remote, pool_mib=args.pool_mib, capacity_blocks=cap,
                  hold_blocks=args.hold_blocks if remote else None,
                  push_min_blocks=args.push_min_blocks if remote else None)
    tot = dict(local=0, remote=0, miss=0)
    try:
        n = len(names)
        for start in range(0, len(reqs), args.chunk * n):
            step = reqs[start:start + args.chunk * n]
            for i, name in enumerate(names):
                racks[name].send("replay", reqs=step[i::n], block_tokens=args.block_tokens)
            for name in names:
                r = racks[name].reply(600)
                for k in tot:
                    tot[k] += r[k]
        # Every push queued before the figures are taken has ended (pushed or dropped).
        for name in names:
            racks[name].call("flush", timeout=300)
        stats = {name: {k: v for k, v in racks[name].call("stats")["stats"].items() if k.startswith("remote")}
                 for name in names}
        pools = {k: 0 for k in POOL_COUNTERS}
        for name in names:
            for k, v in pool_remote_counters(racks[name].pool).items():
                pools[k] = pools.get(k, 0) + v
    finally:
        racks.close()
    all_ = sum(tot.values())
    return dict(tokens=all_, local=tot["local"] / all_, remote=tot["remote"] / all_, miss=tot["miss"] / all_,
                hit=(tot["local"] + tot["remote"]) / all_, mode=racks.mode, tier=stats, pools=pools)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.path.join(ROOT, "..", "shared", "traces", "synthetic_trace.jsonl"))
    ap.add_argument("--racks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=10, help="requests per rack per round")
    ap.add_argument("--pool-mib", type=int, default=512)
    ap.add_argument("--segment-mib", type=int, default=256,
                    help="memory each rack lends the store (Mooncake takes at least 16)")
    ap.add_argument("--block-bytes", type=int, default=1024)
    ap.add_argument("--capacity-blocks", type=int, default=0,
                    help="total pool capacity in blocks, split over the racks (0: every pool holds everything)")
    ap.add_argument("--hold-blocks", type=int, default=None,
                    help="the tiers' hold_blocks (blocks held in the pool until their push; 0: none; default: "
                         "the tier's own)")
    ap.add_argument("--push-min-blocks", type=int, default=None,
                    help="the tiers' push_min_blocks (push a block once its chain reaches this many blocks while "
                         "the store is short of room; 0: every block; default: the tier's own)")
    ap.add_argument("--master-args", default="",
                    help="more mooncake_master flags, space-separated (e.g. its eviction settings: "
                         "'-eviction_high_watermark_ratio=0.98 -eviction_ratio=0.02')")
    ap.add_argument("--results", help="merge replay_racks.* into this JSON file")
    ap.add_argument("--logdir", default=f"/tmp/cxlkv-replay-racks-{os.getpid()}")
    a = ap.parse_args()
    reqs = load(a.trace, a.requests)
    t0 = time.monotonic()
    out = {}
    shared = run(["s"], reqs, False, a, a.logdir)
    print(f"shared pool: token hit {shared['hit']:.4f}", file=sys.stderr)
    out["replay_racks.shared_hit"] = shared["hit"]
    for n in a.racks:
        names = [chr(ord("a") + i) for i in range(n)]
        iso = run(names, reqs, False, a, a.logdir)
        rem = run(names, reqs, True, a, a.logdir)
        print(f"{n} racks: isolated hit {iso['hit']:.4f}; with Mooncake: local {rem['local']:.4f} remote "
              f"{rem['remote']:.4f} miss {rem['miss']:.4f} (hit {rem['hit']:.4f}, {rem['hit'] / shared['hit']:.3f}x "
              f"shared, {rem['hit'] / max(iso['hit'], 1e-9):.2f}x isolated); {rem['mode']}", file=sys.stderr)
        out.update({f"replay_racks.r{n}.isolated_hit": iso["hit"], f"replay_racks.r{n}.local": rem["local"],
                    f"replay_racks.r{n}.remote": rem["remote"], f"replay_racks.r{n}.miss": rem["miss"],
                    f"replay_racks.r{n}.hit": rem["hit"],
                    f"replay_racks.r{n}.hit_vs_shared": rem["hit"] / shared["hit"],
                    f"replay_racks.r{n}.hit_vs_isolated": rem["hit"] / max(iso["hit"], 1e-9),
                    f"replay_racks.r{n}.push_dropped_blocks": sum(s.get("remote_push_dropped_blocks", 0)
                                                                  for s in rem["tier"].values())})
        # Per tier as the pools count it: remote hits and bytes, pushes, failures.
        p = rem["pools"]
        print(f"{n} racks, the pools' remote tier counters: hits {p['hit_blocks']} blocks "
              f"({p['hit_bytes'] / 1e6:.1f} MB), misses {p['miss_blocks']}, fetch failures {p['fetch_failures']}, "
              f"degraded {p['degraded']}; pushed {p['pushed_blocks']} blocks ({p['pushed_bytes'] / 1e6:.1f} MB), "
              f"push dropped {p['push_dropped_blocks']}", file=sys.stderr)
        out.update({f"replay_racks.r{n}.pool.{k}": v for k, v in p.items()})
        # Why blocks were not pushed: the tiers' split of push_dropped_blocks
        # (the pools count the same reasons; retries and holds are the tiers'
        # alone: docs/remote.md "Counters").
        why = {k: sum(s.get(f"remote_push_{k}_blocks", 0) for s in rem["tier"].values())
               for k in ("evicted", "store_full", "queue_full", "failed", "retried", "present", "skipped")}
        peak = max(s.get("remote_hold_peak_blocks", 0) for s in rem["tier"].values())
        print(f"{n} racks, push dropped by reason: evicted before the push {why['evicted']}, refused by a full store "
              f"{why['store_full']} (after {why['retried']} retries), queue full {why['queue_full']}, failed "
              f"{why['failed']}; already in the store {why['present']}; kept back by the push policy "
              f"{why['skipped']}; most blocks held at once {peak}",
              file=sys.stderr)
        out.update({f"replay_racks.r{n}.push_{k}_blocks": v for k, v in why.items()})
        out[f"replay_racks.r{n}.hold_peak_blocks"] = peak
    out["replay_racks.requests"] = len(reqs)
    out["replay_racks.capacity_blocks"] = a.capacity_blocks
    out["replay_racks.block_bytes"] = a.block_bytes
    out["replay_racks.segment_mib"] = a.segment_mib
    out["replay_racks.hold_blocks"] = a.hold_blocks if a.hold_blocks is not None else -1
    out["replay_racks.push_min_blocks"] = a.push_min_blocks if a.push_min_blocks is not None else -1
    out["replay_racks.distinct_blocks"] = len({h for hs, _ in reqs for h in hs})
    out["replay_racks.netns"] = int(shared["mode"] == "netns+veth")
    out["replay_racks.seconds"] = time.monotonic() - t0
    if a.results:
        res = {}
        if os.path.exists(a.results):
            with open(a.results) as f:
                res = json.load(f)
        res.update(out)
        with open(a.results, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
