# SPDX-License-Identifier: MIT
"""The remote tier (cxlkv.remote, docs/remote.md) against a real Mooncake
Store: a real mooncake_master and one Mooncake client per rack, two racks
with a pool each, their hosts in network namespaces joined by veth links
where this process may make them (remote_env.py), over TCP.

A prefix published in rack A is a remote hit in rack B with the same bytes,
then a local hit; the master killed with -9 mid-run and started again; a
peer killed; damaged remote objects.  In every case: no wrong byte, no
lookup slower than the tier's timeout (plus scheduling slack)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from remote_env import Master, Net, RackProc, Racks, cxlkvctl_stats, mooncake_master_path, pool_remote_counters

OUT = os.environ.get("CXLKV_REMOTE_LOGDIR", f"/tmp/cxlkv-remote-tests-{os.getpid()}")
N = 32               # blocks per prefix
TIMEOUT = 1.0        # the racks' remote timeout_s
SLACK = 2.0          # scheduling slack on a loaded machine


def test_mooncake_is_installed():
    # Not a skip: the engine environment pins Mooncake (tools/engines/requirements.txt).
    mooncake_master_path()
    import mooncake.store  # noqa: F401


@pytest.fixture(scope="module")
def racks():
    r = Racks(["a", "b"], OUT, timeout=TIMEOUT)
    print(f"remote tests: racks on {r.mode}; A {r.net.addr['a']}, B {r.net.addr['b']}, "
          f"master {r.master.rpc}")
    yield r
    r.close()


def _remote_stats(rack):
    return {k: v for k, v in rack.call("stats")["stats"].items() if k.startswith("remote") and v}


def _cxlkvctl_stats(rack, *args):
    return cxlkvctl_stats(rack.pool, *args)


def _pool_remote(rack):
    return pool_remote_counters(rack.pool)


def _wait_up(rack, seed, timeout=30):
    """Lookups until the rack's tier answers again (its probes run from lookups)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rack.call("fetch", seed=seed, n=1)
        if rack.call("stats")["stats"]["remote_up"]:
            return True
        time.sleep(0.3)
    return False


def test_prefix_published_in_a_is_a_remote_hit_in_b_then_local(racks):
    a, b = racks["a"], racks["b"]
    assert a.hello["up"] and b.hello["up"], (a.hello, b.hello)
    pub = a.call("publish", seed=1, n=N)
    assert pub["ok"] == N and pub["flushed"]
    want = a.call("expected_sha256", seed=1, n=N)["sha256"]
    r = b.call("fetch", seed=1, n=N)
    assert r["local_before"] == 0
    assert r["hit"] == N and r["read"] == N and r["wrong"] == 0
    assert r["sha256"] == want
    assert r["local_after"] == N  # inserted into B's pool: the next request of rack B hits locally
    s = b.call("stats")
    st = s["stats"]
    assert st["remote_hit_blocks"] == N and st["remote_hit_bytes"] == N * (64 << 10)
    assert st["remote_refused_blocks"] == 0 and st["remote_errors"] == 0
    assert "cxlkv_client_remote_hit_blocks_total" in s["exposition"]
    # Where operators look (docs/remote.md "Counters"): the node's counters
    # in rack B's pool, in cxlkvctl stats (text, JSON, Prometheus) and in the
    # Python package's pool exposition, node 1 being the rack's store.
    pr = _pool_remote(b)
    assert (pr["hit_blocks"], pr["hit_bytes"], pr["fetch_failures"]) == (N, N * (64 << 10), 0), pr
    assert "remote tier: hit_blocks 32 hit_bytes 2097152" in _cxlkvctl_stats(b)
    prom = _cxlkvctl_stats(b, "--prometheus")
    assert f'cxlkv_remote_hit_blocks_total{{node="1"}} {N}\n' in prom
    assert f'cxlkv_remote_hit_bytes_total{{node="1"}} {N * (64 << 10)}\n' in prom
    assert f'cxlkv_remote_hit_blocks_total{{node="1"}} {N}\n' in s["pool_exposition"]
    pa = _pool_remote(a)  # rack A pushed them
    assert pa["pushed_blocks"] >= N and pa["pushed_bytes"] >= N * (64 << 10) and pa["hit_blocks"] == 0, pa
    # Again: a local hit, nothing more from the remote tier.
    r2 = b.call("fetch", seed=1, n=N)
    assert r2["local_before"] == N and r2["sha256"] == want
    assert b.call("stats")["stats"]["remote_hit_blocks"] == N
    # The rest of a prefix: B holds the first half of prefix 2 itself, A all of it.
    a.call("publish", seed=2, n=N)
    b.call("publish", seed=2, n=N // 2)
    r3 = b.call("fetch", seed=2, n=N)
    assert (r3["local_before"], r3["hit"], r3["wrong"]) == (N // 2, N, 0)
    assert r3["sha256"] == a.call("expected_sha256", seed=2, n=N)["sha256"]


@pytest.mark.parametrize("damage", [None, "payload", "key"])
def test_fetch_straight_into_the_pool(racks, damage):
    # docs/remote.md "Straight from the pool": the payloads land in blocks
    # reserved in B's pool (the pool mapping registered with Mooncake), are
    # checked there, flushed and published; a refused block and those after
    # it are aborted, never published.
    a, b = racks["a"], racks["b"]
    seed = {None: 60, "payload": 61, "key": 62}[damage]
    a.call("publish", seed=seed, n=8)
    if damage:
        assert a.call("damage", seed=seed, n=8, index=4, how=damage)["put"] == 0
    before = b.call("stats")["in_place_blocks"]
    r = b.call("fetch", seed=seed, n=8, in_place=True)
    want = 4 if damage else 8
    assert b.call("stats")["in_place_blocks"] - before == want, r  # they came the in-place way
    assert (r["local_before"], r["hit"], r["read"], r["wrong"], r["local_after"]) == (0, want, want, 0, want), r
    assert r["sha256"] == a.call("expected_sha256", seed=seed, n=want)["sha256"]
    if damage:  # the refused block was aborted: the next lookup asks the store again, gets the same refusal
        assert b.call("fetch", seed=seed, n=8, in_place=True)["hit"] == 4


def test_a_process_that_exits_right_after_publishing_still_shares_its_blocks(racks):
    # A prefill process whose last publishes are still queued for the store
    # when it exits: the tier drains them (close_drain_s) at exit, so rack B
    # gets the whole prefix.  The process lends the store no memory; rack
    # A's host does.
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r})\n"
            "import cxlkv\n"
            "from remote_rack import chain, block\n"
            f"pool = cxlkv.Pool({racks['a'].pool!r})\n"
            "store = cxlkv.KvStore(pool, 3, block_tokens=16)\n"
            "assert store.remote is not None, 'no remote tier from the CXLKV_REMOTE_* environment'\n"
            f"store.put(chain(7, {N}), [block(7, i, 64 << 10) for i in range({N})])\n")
    env = dict(os.environ, CXLKV_REMOTE_MASTER=racks.master.rpc, CXLKV_REMOTE_METADATA=racks.master.metadata,
               CXLKV_REMOTE_HOST=racks.net.addr["a"], CXLKV_REMOTE_NAMESPACE=racks.namespace,
               CXLKV_REMOTE_SEGMENT_BYTES="0", CXLKV_REMOTE_TIMEOUT_S="10", CXLKV_REMOTE_CLOSE_DRAIN_S="30")
    r = subprocess.run(racks.net.prefix("a") + [sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = racks["b"].call("fetch", seed=7, n=N)
    assert (got["local_before"], got["hit"], got["read"], got["wrong"]) == (0, N, N, 0), got
    assert got["sha256"] == racks["a"].call("expected_sha256", seed=7, n=N)["sha256"]


@pytest.mark.parametrize("how", ["payload", "key", "short", "foreign"])
def test_damaged_remote_block_is_refused(racks, how):
    a, b = racks["a"], racks["b"]
    seed = {"payload": 11, "key": 12, "short": 13, "foreign": 14}[how]
    a.call("publish", seed=seed, n=8)
    before = b.call("stats")["stats"]["remote_refused_blocks"]
    failures = _pool_remote(b)["fetch_failures"]
    d = a.call("damage", seed=seed, n=8, index=4, how=how)
    assert d["put"] == 0, d
    r = b.call("fetch", seed=seed, n=8)
    # Blocks 0..3 arrive and are right; block 4 is refused, so the prefix stops there.
    assert r["hit"] == 4 and r["wrong"] == 0 and r["local_after"] == 4, r
    assert r["sha256"] == a.call("expected_sha256", seed=seed, n=4)["sha256"]
    assert b.call("stats")["stats"]["remote_refused_blocks"] == before + 1
    assert _pool_remote(b)["fetch_failures"] == failures + 1  # the refusal, in the pool's counters


def test_master_killed_mid_run_then_restarted(racks):
    a, b = racks["a"], racks["b"]
    a.call("publish", seed=20, n=N)
    # Rack B fetches prefix 20 (remote, then local) and 21.. (published by A
    # during the run, some not yet: misses that ask the master) for 8 s; the
    # master is killed 2 s in.
    a.send("publish_loop", first_seed=21, n=8, seconds=6)
    b.send("soak", seeds=list(range(20, 56)), n=8, seconds=8)
    time.sleep(2)
    racks.master.kill()
    soak = b.reply(60)
    loop = a.reply(60)
    assert soak["wrong"] == 0 and soak["rounds"] > 0, soak
    assert soak["worst_lookup_s"] < TIMEOUT + SLACK, soak
    assert loop["worst_put_s"] < TIMEOUT + SLACK, loop  # the local publish never waited for Mooncake
    st = b.call("stats")["stats"]
    assert st["remote_up"] == 0 and st["remote_degraded"] >= 1, {k: v for k, v in st.items() if "remote" in k}
    assert _pool_remote(b)["degraded"] == st["remote_degraded"]
    # Local-only while it is down: what B's pool holds is still served.
    r = b.call("fetch", seed=20, n=N)
    assert r["wrong"] == 0 and r["local_before"] >= 8
    assert r["lookup_s"] < TIMEOUT + SLACK
    # Back: a restarted master knows no objects; new publishes flow again.
    racks.master.start()
    assert _wait_up(a, 90) and _wait_up(b, 91), (a.call("stats"), b.call("stats"))
    a.call("publish", seed=40, n=N)
    r = b.call("fetch", seed=40, n=N)
    assert (r["local_before"], r["hit"], r["wrong"]) == (0, N, 0), r
    assert r["sha256"] == a.call("expected_sha256", seed=40, n=N)["sha256"]
    st = b.call("stats")["stats"]
    assert st["remote_recovered"] >= 1 and st["remote_up"] == 1


def test_peer_killed(racks):
    a, b = racks["a"], racks["b"]
    a.call("publish", seed=50, n=N)
    racks["a"].kill()  # rack A's host dies with -9; part of the store's memory was its segment
    t0 = time.monotonic()
    r = b.call("fetch", seed=50, n=N, timeout=60)
    took = time.monotonic() - t0
    # Whatever B could still fetch is right; what lived in A's segment is a miss.
    assert r["wrong"] == 0 and r["read"] == r["hit"], r
    assert took < TIMEOUT + SLACK + 1, took
    assert r["sha256"] == b.call("expected_sha256", seed=50, n=r["hit"])["sha256"]
    # A comes back (a new process, a new pool): sharing works again once the
    # master has dropped the dead client's segment (its client_ttl, 3 s
    # here): until then puts placed there fail, and are dropped and counted.
    a = racks.restart_rack("a")
    assert a.hello["up"]
    time.sleep(4)
    a.call("publish", seed=51, n=N)
    # B's fetch from the dead segment may have run past its timeout: then B
    # is local-only until its probe (started by a lookup) sees Mooncake answer.
    assert _wait_up(b, 52)
    r = b.call("fetch", seed=51, n=N)
    assert (r["hit"], r["wrong"]) == (N, 0), f"{r} {_remote_stats(a)} {_remote_stats(b)}"


def test_a_rack_started_while_the_master_does_not_answer_is_local_only_at_once_then_joins():
    """A master that takes connections but answers nothing (stopped): a
    rack starting then must not wait for Mooncake's own retries (its setup
    holds the interpreter lock, 30 s a try; docs/remote.md "Faults")."""
    os.makedirs(OUT, exist_ok=True)
    net = Net(["z"], loopback=True)
    master = Master(net.master_addr, OUT)
    rack = None
    try:
        os.kill(master.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        rack = RackProc("z", net, master, OUT, f"z{os.getpid()}", timeout=TIMEOUT, segment_mib=16, pool_mib=64)
        took = time.monotonic() - t0
        assert not rack.hello["up"], rack.hello
        # Its pool's format, its cxlkvd and its process start come on top
        # (seconds on a busy machine); Mooncake's first try alone is 30 s.
        assert took < 2 * TIMEOUT + SLACK + 13, f"the rack took {took:.1f} s to start"
        st = rack.call("stats")["stats"]
        assert st["remote_degraded"] == 1 and st["remote_up"] == 0, st
        # Local-only: what it publishes is served from its pool at once.
        assert rack.call("publish", seed=70, n=4, flush=False)["ok"] == 4
        t0 = time.monotonic()
        r = rack.call("fetch", seed=70, n=4)
        assert (r["local_before"], r["hit"], r["wrong"]) == (4, 4, 0), r
        assert time.monotonic() - t0 < TIMEOUT + SLACK
        # The master answers again: a probe joins the store, pushes flow.
        os.kill(master.proc.pid, signal.SIGCONT)
        assert _wait_up(rack, 71, 60), rack.call("stats")
        pushed = rack.call("stats")["stats"]["remote_pushed_blocks"]
        assert rack.call("publish", seed=72, n=4)["flushed"]
        st = rack.call("stats")["stats"]
        assert st["remote_recovered"] == 1 and st["remote_pushed_blocks"] >= pushed + 4, st
    finally:
        if master.proc.poll() is None:
            os.kill(master.proc.pid, signal.SIGCONT)
        if rack is not None:
            rack.close()
        master.stop()
        net.close()


# ---- a small pool that evicts, a slow store: docs/remote.md "Holding a block until its push"
SMALL_CAP = 256  # the small pool's capacity in blocks
SMALL_N = 8      # blocks per prefix
BURST = 15       # prefixes per burst: 120 blocks


@pytest.fixture(scope="module")
def small_rack():
    """One rack whose pool holds 256 blocks of 4 KiB, pushing 8 blocks a put."""
    r = Racks(["p"], os.path.join(OUT, "small"), block_bytes=4096, batch_blocks=8, capacity_blocks=SMALL_CAP,
              timeout=TIMEOUT)
    yield r["p"]
    r.close()


def _burst_then_pressure(p, first_seed, filler_seed):
    """A burst of 120 published blocks, half a second for the tier to take
    them in, then 512 blocks of another node that are never pushed (twice
    the pool's capacity: every block that can go, goes), then the push
    drained.  The tier's counters before and after, and how many of the
    burst's blocks the store holds."""
    before = p.call("stats")["stats"]
    pool_before = _pool_remote(p)
    seeds = list(range(first_seed, first_seed + BURST))
    assert p.call("publish_burst", seeds=seeds, n=SMALL_N)["ok"] == BURST * SMALL_N
    time.sleep(0.5)
    # The holds never make the pool refuse a local publish.
    assert p.call("fill", first_seed=filler_seed, chains=2 * SMALL_CAP // SMALL_N, n=SMALL_N)["ok"] == 2 * SMALL_CAP
    assert p.call("flush", timeout=120)["flushed"]
    after = p.call("stats")["stats"]
    pool_after = _pool_remote(p)
    d = {k: after[k] - before[k] for k in after if k.startswith("remote_push") or k == "remote_pushed_blocks"}
    dpool = {k: pool_after[k] - pool_before[k] for k in pool_after}
    return d, dpool, p.call("in_store", seeds=seeds, n=SMALL_N)["held"]


def test_every_published_block_reaches_a_slow_store_though_its_small_pool_evicts_it(small_rack):
    p = small_rack
    p.call("slow_store", put_s=0.25)  # 15 puts of 8 blocks: some 4 s, while the pool turns over twice
    try:
        d, dpool, in_store = _burst_then_pressure(p, 1000, 5000)
    finally:
        p.call("slow_store", put_s=0)
    assert in_store == BURST * SMALL_N, (in_store, d)
    assert d["remote_pushed_blocks"] == BURST * SMALL_N and d["remote_push_dropped_blocks"] == 0, d
    assert (dpool["pushed_blocks"], dpool["push_dropped_blocks"]) == (BURST * SMALL_N, 0), dpool
    assert p.call("stats")["stats"]["remote_held_blocks"] == 0  # every hold given back


def test_a_block_evicted_before_its_push_is_counted_as_evicted(small_rack):
    # The tier holds 8 blocks at a time: the rest of the burst waits in the
    # queue unheld, and the pressure evicts most of it.  Every block of the
    # burst is then in the store or counted as evicted, and nothing else.
    p = small_rack
    p.call("set_hold", hold_blocks=8)
    p.call("slow_store", put_s=0.25)
    try:
        d, dpool, in_store = _burst_then_pressure(p, 2000, 7000)
    finally:
        p.call("slow_store", put_s=0)
        p.call("set_hold", hold_blocks=1024)
    assert d["remote_push_evicted_blocks"] > 0, d
    assert in_store + d["remote_push_evicted_blocks"] == BURST * SMALL_N, (in_store, d)
    assert d["remote_pushed_blocks"] == in_store, d
    assert d["remote_push_dropped_blocks"] == d["remote_push_evicted_blocks"], d
    assert d["remote_push_store_full_blocks"] == d["remote_push_queue_full_blocks"] == 0, d
    assert d["remote_push_failed_blocks"] == 0, d
    # The pool's counters, which `cxlkvctl stats` shows, have the total and
    # the reason, as the tier counted them.
    assert dpool["push_dropped_blocks"] == d["remote_push_dropped_blocks"], dpool
    assert dpool["push_evicted_blocks"] == d["remote_push_evicted_blocks"], dpool
    assert dpool["push_store_full_blocks"] == dpool["push_queue_full_blocks"] == dpool["push_failed_blocks"] == 0
