# SPDX-License-Identifier: MIT
"""GPU transfers of paged tensors through cxlkv_kv_gpu_put_chain /
cxlkv_kv_gpu_get_many (one C call per batch; the CPU reference backend stands
in for the GPU here), and handoff leases through cxlkv_kv_lease /
cxlkv_kv_lease_release, with lease ends in the shared Prometheus definition."""
import errno
import os
import re
import subprocess
import time

import numpy as np
import pytest
import torch

import cxlkv
from cxlkv import _lib
from cxlkv.metrics import Metrics

from conftest import ROOT


def test_gpu_probe_says_why_not():
    ok, msg = cxlkv.Gpu.probe()
    assert isinstance(ok, bool) and msg


class CallCounter:
    """Counts calls of libcxlkv functions made through the package."""

    def __init__(self, names):
        self.L = _lib.lib()
        self.names = names
        self.calls = {}
        self.orig = {n: getattr(self.L, n) for n in names}

    def _wrap(self, n):
        def f(*a):
            self.calls[n] = self.calls.get(n, 0) + 1
            return self.orig[n](*a)
        return f

    def __enter__(self):
        for n in self.names:
            setattr(self.L, n, self._wrap(n))
        return self

    def __exit__(self, *exc):
        for n in self.names:
            setattr(self.L, n, self.orig[n])


def test_engine_hash_calls_take_the_gpu_path_with_a_gpu(env):
    """put_engine_chains / get_engine given a cxlkv.Gpu go through the GPU
    batch calls (the reference backend here), under the same keys as the
    CPU path's engine calls: a block put through one reads back through
    the other, a chain below a parent hash included."""
    layers, blocks, bt, heads, head = 2, 6, 8, 2, 16
    g = torch.Generator().manual_seed(4)
    ref = torch.randn(blocks, layers, 2, bt, heads, head, generator=g).to(torch.bfloat16)
    src = cxlkv.PagedKV.block_first(ref.clone())
    hs = [b"g0", b"g1", b"g2"]
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store()
        with CallCounter(["cxlkv_kv_gpu_put_chain", "cxlkv_kv_gpu_get_many"]) as cc:
            st = kv.put_engine_chains(b"ns", hs, [2, 1], [None, b"g1"], src, [3, 1, 5], gpu=gpu)
            assert list(st) == [cxlkv.RESERVED] * 3
            out = torch.zeros_like(ref)
            st = kv.get_engine(b"ns", hs, cxlkv.PagedKV.block_first(out), [0, 1, 2], gpu=gpu)
            assert list(st) == [cxlkv.RESERVED] * 3
        assert cc.calls["cxlkv_kv_gpu_put_chain"] == 2 and cc.calls["cxlkv_kv_gpu_get_many"] == 1
        for d, s_ in zip([0, 1, 2], [3, 1, 5]):
            assert torch.equal(out[d], ref[s_]), d
        back = torch.zeros_like(ref)  # and through the CPU path's engine call
        assert cxlkv.get_ok(kv.get_engine(b"ns", hs, cxlkv.PagedKV.block_first(back), [5, 4, 3])).all()
        assert torch.equal(back[3], ref[5]) and torch.equal(back[5], ref[3])
        keys = cxlkv.keys_from_hashes(hs, b"ns")
        assert kv.lookup(keys[[0, 1, 2]]) == 3  # g2 is g1's child


@pytest.mark.parametrize("layout", ["vllm", "block_first"])
def test_reference_backend_moves_paged_blocks_like_the_cpu_path(env, layout):
    layers, blocks, bt, heads, head = 2, 6, 8, 2, 16
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(blocks, layers, 2, bt, heads, head, generator=g).to(torch.bfloat16)
    if layout == "vllm":
        src = cxlkv.PagedKV.vllm([ref[:, l].transpose(0, 1).contiguous() for l in range(layers)])
    else:
        src = cxlkv.PagedKV.block_first(ref.clone())
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        assert gpu.pin_method == "cpu-reference"
        kv = env.store()
        keys = cxlkv.block_keys(np.arange(3 * bt), bt)
        assert cxlkv.put_ok(kv.put(keys, src, [4, 0, 2], gpu=gpu)).all()
        out = torch.zeros_like(ref)
        # read back through the CPU path: same pool block order
        assert cxlkv.get_ok(kv.get(keys, cxlkv.PagedKV.block_first(out), [1, 3, 5])).all()
        assert torch.equal(out[[1, 3, 5]], ref[[4, 0, 2]])
        # and through the GPU path into another layout
        out2 = torch.zeros_like(ref)
        st = kv.get(keys, cxlkv.PagedKV.block_first(out2), [5, 4, 3], gpu=gpu)
        assert cxlkv.get_ok(st).all()
        assert torch.equal(out2[[5, 4, 3]], ref[[4, 0, 2]])
        # a miss is a per-block status; blocks already there are EXISTS
        more = cxlkv.block_keys(np.arange(4 * bt), bt)
        st = kv.get(more, cxlkv.PagedKV.block_first(out2), [0, 1, 2, 3], gpu=gpu)
        assert st.tolist() == [0, 0, 0, cxlkv.MISS]
        st = kv.put(more, src, [4, 0, 2, 1], gpu=gpu)
        assert st.tolist() == [cxlkv.EXISTS] * 3 + [cxlkv.RESERVED]


def test_a_gpu_batch_is_one_c_call(env):
    layers, blocks, bt, heads, head = 2, 8, 4, 2, 8
    t = torch.randn(blocks, layers, 2, bt, heads, head)
    src = cxlkv.PagedKV.block_first(t)
    names = ["cxlkv_kv_gpu_put_chain", "cxlkv_kv_gpu_get_many", "cxlkv_kv_reserve_chain", "cxlkv_kv_publish_many",
             "cxlkv_kv_pin_many", "cxlkv_kv_unpin_many", "cxlkv_gpu_gather", "cxlkv_gpu_scatter", "cxlkv_gpu_sync"]
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store()
        keys = cxlkv.block_keys(np.arange(8 * bt), bt)
        out = torch.zeros_like(t)
        with CallCounter(names) as cc:
            assert cxlkv.put_ok(kv.put(keys, src, list(range(8)), gpu=gpu)).all()
            assert cxlkv.get_ok(kv.get(keys, cxlkv.PagedKV.block_first(out), list(range(7, -1, -1)), gpu=gpu)).all()
        assert cc.calls == {"cxlkv_kv_gpu_put_chain": 1, "cxlkv_kv_gpu_get_many": 1}
        assert torch.equal(out, t.flip(0))


def test_a_lease_names_its_consumer_and_is_released(env):
    kv = env.store(2)
    keys = cxlkv.block_keys(np.arange(2 * 16), 16)
    kv.put(keys, [np.zeros(256, np.uint8)] * 2)
    st = kv.lease(keys, consumer_id=77, ttl_ms=60000)
    assert (st == cxlkv.RESERVED).all()
    consumer = env.store(3)
    assert (consumer.lease_release(keys, 77) == cxlkv.RESERVED).all()
    # released: a second release finds no lease of this consumer
    assert (consumer.lease_release(keys, 77) == -errno.ENOENT).all()
    missing = cxlkv.block_keys(np.arange(16) + 999, 16)
    assert kv.lease(missing, consumer_id=78)[0] == cxlkv.MISS


LEASE_LINE = re.compile(r"^(cxlkv_kv_lease_[a-z_]+_total) (\d+)$", re.M)


def pool_lease_counters(text):
    return {m.group(1): int(m.group(2)) for m in LEASE_LINE.finditer(text)}


def test_an_expired_lease_is_reported_and_counted_in_the_shared_metrics(env):
    producer = env.store(2)
    m = Metrics()
    consumer = env.store(3, metrics=m)
    keys = cxlkv.block_keys(np.arange(3 * 16), 16)
    assert cxlkv.put_ok(producer.put(keys, [np.zeros(256, np.uint8)] * 3)).all()
    text = env.pool.prometheus()
    assert "# TYPE cxlkv_kv_lease_expiries_total counter" in text
    assert pool_lease_counters(text) == {"cxlkv_kv_lease_expiries_total": 0, "cxlkv_kv_lease_dead_consumer_total": 0}
    assert (producer.lease(keys[:2], consumer_id=5, ttl_ms=1) == cxlkv.RESERVED).all()
    assert (producer.lease(keys[2:], consumer_id=5, ttl_ms=600000) == cxlkv.RESERVED).all()
    time.sleep(0.05)
    st = consumer.lease_release(keys, 5)
    assert st.tolist() == [-errno.ETIMEDOUT, -errno.ETIMEDOUT, cxlkv.RESERVED]
    assert m.counters["cxlkv_client_lease_expiries_total"] == 2
    text = env.pool.prometheus()
    assert pool_lease_counters(text) == {"cxlkv_kv_lease_expiries_total": 2, "cxlkv_kv_lease_dead_consumer_total": 0}
    ctl = os.path.join(os.environ.get("CXLKV_TEST_TOOLS", os.path.join(ROOT, "build", "tools")), "cxlkvctl")
    if not os.path.exists(ctl):
        pytest.skip("cxlkvctl not built")
    producer.close()
    consumer.close()
    out = subprocess.run([ctl, "--pool", env.uri, "stats", "--prometheus"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == env.pool.prometheus()  # one definition (cxlkv/metrics.hpp)
    assert pool_lease_counters(out.stdout)["cxlkv_kv_lease_expiries_total"] == 2


def test_a_lease_to_a_dead_consumer_node_ends_and_is_counted_as_dead(env):
    producer = env.store(2)
    keys = cxlkv.block_keys(np.arange(16) + 4242, 16)
    assert cxlkv.put_ok(producer.put(keys, [np.zeros(256, np.uint8)])).all()
    # Node 6 never attached to the pool: judged dead, so its lease is over at once.
    assert (producer.lease(keys, consumer_id=9, consumer_node=6, ttl_ms=600000) == cxlkv.RESERVED).all()
    assert producer.lease_release(keys, 9).tolist() == [-errno.ETIMEDOUT]
    assert pool_lease_counters(env.pool.prometheus()) == {"cxlkv_kv_lease_expiries_total": 1,
                                                          "cxlkv_kv_lease_dead_consumer_total": 1}
