# SPDX-License-Identifier: MIT
"""Metrics: the package's pool exposition is byte-for-byte what `cxlkvctl
stats --prometheus` prints (one definition), names carry units, histograms
are cumulative; client metrics count hit / queried tokens, bytes, latency."""
import os
import re
import subprocess

import numpy as np
import pytest

import cxlkv
from cxlkv.metrics import Metrics

from conftest import ROOT

LINE = re.compile(r'^(cxlkv_[a-z_]+)(\{[^}]*\})? (\S+)$')


def parse(text):
    samples, types = {}, {}
    for ln in text.splitlines():
        if ln.startswith("# TYPE"):
            _, _, name, t = ln.split()
            types[name] = t
        elif ln and not ln.startswith("#"):
            m = LINE.match(ln)
            assert m, f"not a Prometheus sample line: {ln!r}"
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples, types


def test_pool_exposition_is_cxlkvctls_and_names_carry_units(env):
    kv = env.store(2)
    keys = cxlkv.block_keys(np.arange(4 * 16), 16)
    kv.put(keys, [np.zeros(4096, np.uint8)] * 4)
    kv.lookup(keys)
    kv.get(keys, [np.zeros(4096, np.uint8) for _ in range(4)])
    kv.stats()  # counters reach the pool when the handle writes them
    text = env.pool.prometheus()
    samples, types = parse(text)
    assert types["cxlkv_kv_store_bytes_total"] == "counter" and types["cxlkv_kv_fetch_seconds"] == "histogram"
    for name, t in types.items():  # gauges: counts, or a unit suffix (_bytes, _seconds)
        assert name.endswith("_total") if t == "counter" else name.endswith("_seconds") if t == "histogram" \
            else t == "gauge", name
    tools = os.environ.get("CXLKV_TEST_TOOLS", os.path.join(ROOT, "build", "tools"))
    ctl = os.path.join(tools, "cxlkvctl")
    if not os.path.exists(ctl):
        pytest.skip("cxlkvctl not built")
    kv.close()
    text = env.pool.prometheus()
    out = subprocess.run([ctl, "--pool", env.uri, "stats", "--prometheus"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == text
    samples, _ = parse(text)
    assert samples['cxlkv_kv_hit_blocks_total{node="2"}'] == 4
    assert samples['cxlkv_kv_store_bytes_total{node="2"}'] == 4 * 4096
    assert samples['cxlkv_kv_load_bytes_total{node="2"}'] == 4 * 4096
    # cumulative buckets ending at the count
    b = [v for k, v in samples.items() if k.startswith('cxlkv_kv_publish_seconds_bucket{node="2"')]
    assert b == sorted(b) and b[-1] == samples['cxlkv_kv_publish_seconds_count{node="2"}'] >= 1


def test_client_metrics_count_tokens_bytes_and_latency(env):
    m = Metrics(labels={"engine": "test"})
    kv = env.store(3, metrics=m, block_tokens=16)
    keys = cxlkv.block_keys(np.arange(6 * 16), 16)
    kv.put(keys[:4], [np.zeros(1000, np.uint8)] * 4)
    assert kv.lookup(keys) == 4
    kv.get(keys, [np.zeros(1000, np.uint8) for _ in range(6)])
    assert m.counters["cxlkv_client_query_tokens_total"] == 96
    assert m.counters["cxlkv_client_hit_tokens_total"] == 64 and m.hit_rate() == pytest.approx(64 / 96)
    assert m.counters["cxlkv_client_store_bytes_total"] == 4000
    assert m.counters["cxlkv_client_load_bytes_total"] == 4000  # the 2 misses load nothing
    samples, types = parse(m.exposition())
    assert types["cxlkv_client_load_seconds"] == "histogram"
    assert samples['cxlkv_client_lookup_seconds_count{engine="test"}'] == 1
    assert samples['cxlkv_client_store_seconds_bucket{engine="test",le="+Inf"}'] == 1
    full = cxlkv.metrics.exposition(env.pool, m)
    assert "cxlkv_kv_lookups_total" in full and "cxlkv_client_hit_tokens_total" in full
