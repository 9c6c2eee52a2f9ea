# SPDX-License-Identifier: MIT
"""cxlkvd's metrics endpoint (docs/operations.md "Metrics"), scraped with a real HTTP
client (urllib, raw sockets) and read with Prometheus' own parser
(python3-prometheus-client): HELP and TYPE for every family, units in the
names, cumulative latency histograms, per-node and pool-wide families that
count what a KV store did; bad requests get 4xx and never stop the server;
concurrent scrapes and a stalled client do not block each other.  The
Grafana dashboard names only families the endpoint exports."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
TOOLS = os.environ.get("CXLKV_TEST_TOOLS", os.path.join(BUILD, "tools"))
sys.path.insert(0, os.path.join(ROOT, "libruntime", "python"))
os.environ.setdefault("CXLKV_LIB", os.path.join(BUILD, "libruntime", "libcxlkv.so"))

import cxlkv  # noqa: E402
import numpy as np  # noqa: E402

BLOCK = 8192


def ctl(uri, *args):
    r = subprocess.run([os.path.join(TOOLS, "cxlkvctl"), "--pool", uri, *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


class Daemon:
    """cxlkvd in the foreground on a fresh pool; `url` from its own
    announcement on stderr."""

    def __init__(self, uri, *extra):
        self.p = subprocess.Popen([os.path.join(TOOLS, "cxlkvd"), "--pool", uri, "--foreground", *extra],
                                  stderr=subprocess.PIPE, text=True)
        self.lines, self.url = [], None
        deadline = time.time() + 120
        while time.time() < deadline:
            ln = self.p.stderr.readline()
            if not ln:
                break
            self.lines.append(ln)
            m = re.search(r"metrics at (http://\S+)", ln)
            if m:
                self.url = m.group(1)
            if "managing locks" in ln:
                break
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for ln in self.p.stderr:
            self.lines.append(ln)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture
def pool():
    name = f"cxlkv-ops-metrics-{os.getpid()}-{time.monotonic_ns()}"
    uri = f"shm:{name}:{128 << 20}"
    ctl(uri, "format", "--max-nodes", "4")
    yield uri
    try:
        os.unlink(f"/dev/shm/{name}")
    except FileNotFoundError:
        pass


@pytest.fixture
def daemon(pool):
    d = Daemon(pool, "--metrics-listen", "127.0.0.1:0")
    assert d.url, "cxlkvd did not announce its metrics URL:\n" + "".join(d.lines)
    yield d
    d.stop()
    assert d.p.returncode == 0, "".join(d.lines)


def scrape(url, timeout=60):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family, sample, **labels):
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample}{labels} not in the exposition")


def work_as_node(uri, node):
    """A KV store of `node` (cxlkvd grants its locks): 4 blocks published,
    a lookup of 6 (4 hits, 2 misses), the 4 fetched."""
    with cxlkv.Pool(uri) as pool:
        try:
            with cxlkv.KvStore(pool, node) as kv:
                keys = cxlkv.block_keys(np.arange(6 * 16), 16)
                st = kv.put(keys[:4], [np.full(BLOCK, i, np.uint8) for i in range(4)])
                assert (st == cxlkv.RESERVED).all(), st
                assert kv.lookup(keys) == 4
                out = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
                assert (kv.get(keys[:4], out) == cxlkv.RESERVED).all()
                kv.stats()  # the handle's counters reach the pool
        finally:
            pool.remove_node_local(node)


def test_scrape_has_help_type_units_and_counts_what_a_node_did(pool, daemon):
    work_as_node(pool, 2)
    text = scrape(daemon.url)
    fams = families(text)
    # HELP and TYPE for every family (the parser takes types from TYPE lines,
    # documentation from HELP lines; a family without them parses "unknown" / "").
    for f in fams.values():
        assert f.type in ("counter", "gauge", "histogram"), f.name
        assert f.documentation, f"family {f.name} has no HELP"
    helps = re.findall(r"^# HELP (\S+) ", text, re.M)
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(helps) == len(set(helps)) == len(types), "one HELP and one TYPE per family"
    # Units in the names: latencies are histograms in seconds, byte counts end _bytes(_total).
    for name in types:
        if fams_type(fams, name) == "histogram":
            assert name.endswith("_seconds"), name
        if fams_type(fams, name) == "counter":
            assert name.endswith("_total"), name
    assert not re.search(r"_(us|ms|ns|micro\w*|kib|mib)\b", text), "units are seconds and bytes"
    # Latency histograms: cumulative buckets, +Inf == _count.
    f = fams["cxlkv_kv_put_seconds"]
    assert f.type == "histogram"
    b = [(float(s.labels["le"]), s.value) for s in f.samples if s.name.endswith("_bucket") and s.labels["node"] == "2"]
    assert [v for _, v in b] == sorted(v for _, v in b) and b[-1][0] == float("inf")
    assert b[-1][1] == value(fams, "cxlkv_kv_put_seconds", "cxlkv_kv_put_seconds_count", node="2") >= 1
    # Per-node KV families count what node 2 did.
    assert value(fams, "cxlkv_kv_hit_blocks", "cxlkv_kv_hit_blocks_total", node="2") == 4
    assert value(fams, "cxlkv_kv_miss_blocks", "cxlkv_kv_miss_blocks_total", node="2") == 2
    assert value(fams, "cxlkv_kv_store_bytes", "cxlkv_kv_store_bytes_total", node="2") == 4 * BLOCK
    assert value(fams, "cxlkv_kv_load_bytes", "cxlkv_kv_load_bytes_total", node="2") == 4 * BLOCK
    assert value(fams, "cxlkv_kv_evictions", "cxlkv_kv_evictions_total", node="2") == 0
    for f in ("demoted_blocks", "demoted_bytes", "read_blocks", "read_bytes", "read_failures", "full"):
        assert value(fams, f"cxlkv_ssd_{f}", f"cxlkv_ssd_{f}_total", node="2") == 0  # no SSD tier here
    # Pool-wide: blocks per tier, leases, allocator, locks.
    assert value(fams, "cxlkv_kv_cached_blocks", "cxlkv_kv_cached_blocks", tier="mem") == 4
    assert value(fams, "cxlkv_kv_cached_blocks", "cxlkv_kv_cached_blocks", tier="ssd") == 0
    assert value(fams, "cxlkv_kv_cached_bytes", "cxlkv_kv_cached_bytes", tier="mem") == 4 * BLOCK
    assert value(fams, "cxlkv_kv_lease_expiries", "cxlkv_kv_lease_expiries_total") == 0
    assert value(fams, "cxlkv_alloc_used_bytes", "cxlkv_alloc_used_bytes") > 0
    assert value(fams, "cxlkv_alloc_capacity_bytes", "cxlkv_alloc_capacity_bytes") > value(
        fams, "cxlkv_alloc_used_bytes", "cxlkv_alloc_used_bytes")
    assert value(fams, "cxlkv_alloc_owned_chunks", "cxlkv_alloc_owned_chunks", node="2") >= 1
    assert value(fams, "cxlkv_lock_waits", "cxlkv_lock_waits_total", node="2") >= 1
    assert value(fams, "cxlkv_lock_waiting", "cxlkv_lock_waiting", node="2") == 0
    assert value(fams, "cxlkv_lock_manager_grants", "cxlkv_lock_manager_grants_total") >= 1
    assert value(fams, "cxlkv_lock_grants", "cxlkv_lock_grants_total") >= 1
    assert value(fams, "cxlkv_node_up", "cxlkv_node_up", node="2") in (0, 1)
    # The endpoint serves the same definition as `cxlkvctl stats --prometheus`
    # (plus the manager's own counters): every family of one is in the other.
    ctl_fams = families(ctl(pool, "stats", "--prometheus"))
    assert set(ctl_fams) <= set(fams)
    assert {n for n in fams if not n.startswith("cxlkv_lock_manager_") or n == "cxlkv_lock_manager_epoch"} == \
        set(ctl_fams)


def fams_type(fams, type_line_name):
    for f in fams.values():
        if type_line_name in (f.name, f.name + "_total"):
            return f.type
    return None


def raw(url, data, read=65536, timeout=30):
    """Send bytes on a fresh TCP connection; the reply's first line ('' if closed)."""
    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        try:
            while b"\r\n" not in buf:
                c = s.recv(read)
                if not c:
                    break
                buf += c
        except (ConnectionResetError, socket.timeout):
            pass
    return buf.split(b"\r\n", 1)[0].decode(errors="replace")


def test_bad_requests_get_4xx_and_the_server_keeps_serving(daemon):
    base = daemon.url[: -len("/metrics")]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(daemon.url, data=b"x=1", method="POST"), timeout=30)
    assert e.value.code == 405 and "GET" in e.value.headers["Allow"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/nope", timeout=30)
    assert e.value.code == 404
    # Malformed HTTP: 400; an unknown version: 505; bytes that are no HTTP
    # request line at all: the connection is closed (nothing to answer).
    assert raw(daemon.url, b"GET /metrics\r\n\r\n").startswith("HTTP/1.1 400")
    assert raw(daemon.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nNoColonHeader\r\n\r\n").startswith("HTTP/1.1 400")
    assert raw(daemon.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n").startswith(
        "HTTP/1.1 400")
    assert raw(daemon.url, b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n").startswith("HTTP/1.1 505")
    for junk in (b"GARBAGE\r\n\r\n", b"\x00\xff\x16\x03\x01binary\r\n\r\n", b"GET\r\n\r\n"):
        reply = raw(daemon.url, junk)
        assert reply == "" or reply.startswith("HTTP/1.1 4"), (junk, reply)
    # Requests are bounded: a 1 MiB header or URL is refused (431 / 414), not buffered.
    big = raw(daemon.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    assert big.startswith("HTTP/1.1 4"), big
    big = raw(daemon.url, b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert big == "" or big.startswith("HTTP/1.1 4"), big
    # HTTP/1.0 and HEAD work; the server is still up after all of the above.
    assert raw(daemon.url, b"GET /metrics HTTP/1.0\r\n\r\n").startswith("HTTP/1.")
    with urllib.request.urlopen(urllib.request.Request(daemon.url, method="HEAD"), timeout=30) as r:
        assert r.status == 200 and r.read() == b""
    assert "cxlkv_lock_manager_rounds_total" in scrape(daemon.url)
    assert daemon.p.poll() is None


def test_concurrent_scrapes_and_a_stalled_client(daemon):
    host, port = re.match(r"http://([^:/]+):(\d+)", daemon.url).groups()
    stalled = socket.create_connection((host, int(port)), timeout=30)
    stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    results, errors = [], []

    def scraper():
        try:
            for _ in range(3):
                results.append(len(families(scrape(daemon.url))))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=scraper) for _ in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    stalled.close()
    assert not errors, errors
    assert len(results) == 36 and len(set(results)) == 1 and results[0] > 30


def test_idle_connections_do_not_starve_a_scrape(daemon):
    # docs/operations.md "Metrics": 64 connections held open without a request (the
    # endpoint's cap) refused every scrape until they timed out.  A new
    # connection past the cap closes the one idle the longest.
    host, port = re.match(r"http://([^:/]+):(\d+)", daemon.url).groups()
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(64)]
    try:
        time.sleep(0.5)  # all accepted and idle
        for _ in range(3):
            t0 = time.monotonic()
            assert len(families(scrape(daemon.url, timeout=5))) > 30
            assert time.monotonic() - t0 < 5
    finally:
        for s in idle:
            s.close()
    assert daemon.p.poll() is None, "".join(daemon.lines)


def test_listen_option_none_bad_and_busy(pool):
    d = Daemon(pool, "--metrics-listen", "none")
    try:
        assert d.url is None and d.p.poll() is None, "".join(d.lines)
    finally:
        d.stop()
    for bad in ("localhost:80", "127.0.0.1", "127.0.0.1:99999", "1.2.3.4.5:1", "[::1:80", "127.0.0.1:-1"):
        r = subprocess.run([os.path.join(TOOLS, "cxlkvd"), "--pool", pool, "--foreground", "--metrics-listen", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--metrics-listen" in r.stderr, (bad, r.stderr)
    # A port given explicitly must work: busy -> exit 1 naming the address.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([os.path.join(TOOLS, "cxlkvd"), "--pool", pool, "--foreground", "--metrics-listen",
                            f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and f"127.0.0.1:{port}" in r.stderr, r.stderr


def dashboard_exprs(path):
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))

    walk(dash["panels"])
    return dash, exprs


def test_grafana_dashboard_names_only_exported_families(pool, daemon):
    work_as_node(pool, 1)
    fams = families(scrape(daemon.url))
    samples = {s.name for f in fams.values() for s in f.samples}
    names = samples | {n for f in fams.values() for n in (f.name, f.name + "_total", f.name + "_bucket",
                                                           f.name + "_sum", f.name + "_count")}
    dash, exprs = dashboard_exprs(os.path.join(ROOT, "tools", "grafana", "cxlkv-dashboard.json"))
    assert dash["title"] and dash["schemaVersion"] >= 30 and len(exprs) >= 12
    used = set()
    for e in exprs:
        for n in re.findall(r"\bcxlkv_[a-z0-9_]+", e):
            assert n in names, f"dashboard expr {e!r} names {n}, which cxlkvd does not export"
            used.add(n)
    # The dashboard covers every area the issue names.
    for area in ("hit_blocks", "miss_blocks", "evictions", "lease", "lock_wait", "alloc_", "tier", "ssd_",
                 "remote_", "_seconds_bucket"):
        assert any(area in e for e in exprs), f"no panel shows {area}"
