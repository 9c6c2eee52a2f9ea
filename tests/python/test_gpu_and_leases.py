# SPDX-License-Identifier: MIT
"""GPU transfers of paged tensors (cxlkv_kv_gpu_put_chain / _get_many, or
the batch calls around one gather / scatter launch where the library lacks
them) through the CPU reference backend, and handoff leases (run when the
loaded libcxlkv has cxlkv_kv_lease)."""
import numpy as np
import pytest
import torch

import cxlkv
from cxlkv import _lib

needs_leases = pytest.mark.skipif(not _lib.has("cxlkv_kv_lease"), reason="libcxlkv lacks cxlkv_kv_lease")


def test_gpu_probe_says_why_not():
    ok, msg = cxlkv.Gpu.probe()
    assert isinstance(ok, bool) and msg


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


@needs_leases
def test_a_lease_names_its_consumer_and_is_released(env):
    kv = env.store(2)
    keys = cxlkv.block_keys(np.arange(2 * 16), 16)
    kv.put(keys, [np.zeros(256, np.uint8)] * 2)
    st = kv.lease(keys, consumer_id=77, ttl_ms=60000)
    assert (st == cxlkv.RESERVED).all()
    consumer = env.store(3)
    assert (consumer.lease_release(keys, 77) == cxlkv.RESERVED).all()
    missing = cxlkv.block_keys(np.arange(16) + 999, 16)
    assert kv.lease(missing, consumer_id=78)[0] != cxlkv.RESERVED
