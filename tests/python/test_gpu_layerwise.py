# SPDX-License-Identifier: MIT
"""Layer-wise GPU load and save from Python (cxlkv.layerwise; docs/gpu.md "Layer-wise transfers") on
the CPU reference backend: a save is invisible until finish and then holds
exactly the tensors' bytes; a load delivers layer groups with one event
each, waits per layer, reports misses; one C call to start, one per layer,
one to finish -- never one per block."""
import errno

import numpy as np
import pytest
import torch

import cxlkv
from cxlkv import _lib, layerwise


@pytest.fixture
def env():
    from conftest import PoolEnv
    e = PoolEnv("layerwise")
    yield e
    e.close()


def _vllm(layers, blocks, bt, heads, head, seed):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(blocks, layers, 2, bt, heads, head, generator=g).to(torch.float16)
    return ref, cxlkv.PagedKV.vllm([ref[:, l].transpose(0, 1).contiguous() for l in range(layers)])


def test_a_layer_wise_save_then_load_moves_every_byte(env):
    layers, blocks, bt, heads, head = 4, 8, 4, 2, 16
    ref, src = _vllm(layers, blocks, bt, heads, head, 1)
    outs = [torch.zeros(2, blocks, bt, heads, head, dtype=torch.float16) for _ in range(layers)]
    dst = cxlkv.PagedKV.vllm(outs)
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store()
        keys = cxlkv.block_keys(np.arange(3 * bt), bt)
        save = layerwise.save_layers(kv, keys, src, [5, 1, 6], gpu)
        assert save.status.tolist() == [cxlkv.RESERVED] * 3
        for layer in range(layers):
            save.save_layer(layer)
            assert kv.lookup(keys) == 0, "blocks visible before the last layer was saved"
        st = save.finish()
        assert cxlkv.put_ok(st).all()
        assert kv.lookup(keys) == 3
        # The CPU path reads back what the tensors held.
        back = torch.zeros_like(ref)
        assert cxlkv.get_ok(kv.get(keys, cxlkv.PagedKV.block_first(back), [0, 1, 2])).all()
        assert torch.equal(back[[0, 1, 2]], ref[[5, 1, 6]])

        # Load layer group by layer group into another cache, a miss among the keys.
        more = cxlkv.block_keys(np.arange(4 * bt), bt)
        probe = cxlkv.block_keys(np.arange(4 * bt) + 10 ** 6, bt)[:1]
        mixed = np.concatenate([more[:3], probe])
        load = layerwise.load_layers(kv, mixed, dst, [2, 3, 4, 7], gpu, layers_per_group=2)
        assert load.loading == 3 and load.groups == 2
        assert load.status.tolist()[:3] == [0, 0, 0] and load.status[3] == cxlkv.MISS
        assert load.event(0) != 0 and load.event(layers) == 0
        load.wait(0)
        load.stream_wait(3)
        assert load.ready(3)
        with pytest.raises(cxlkv.CxlkvError) as e:
            load.wait(layers)
        assert e.value.errno == errno.EINVAL
        st = load.finish()
        assert st.tolist() == [0, 0, 0, cxlkv.MISS]
        for layer in range(layers):
            for d, s in zip([2, 3, 4], [5, 1, 6]):
                assert torch.equal(outs[layer][:, d], ref[s, layer]), f"layer {layer} block {d}"
            assert not outs[layer][:, 7].any(), "a missing block's tensor slot was written"
        with pytest.raises(ValueError):
            load.finish()


def test_an_unfinished_save_publishes_nothing_and_frees_its_blocks(env):
    layers, blocks, bt, heads, head = 3, 4, 4, 2, 8
    _ref, src = _vllm(layers, blocks, bt, heads, head, 2)
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store()
        keys = cxlkv.block_keys(np.arange(2 * bt), bt)
        with pytest.raises(RuntimeError):
            with layerwise.save_layers(kv, keys, src, [0, 1], gpu) as save:
                save.save_layer(0)
                raise RuntimeError("prefill failed")
        assert kv.lookup(keys) == 0
        save = layerwise.save_layers(kv, keys, src, [0, 1], gpu)
        assert save.status.tolist() == [cxlkv.RESERVED] * 2, "the aborted save left its blocks reserved"
        save.save_layer(0)
        st = save.finish()  # layers 1 and 2 never saved
        assert st.tolist() == [-errno.ENODATA, -errno.ECANCELED]
        assert kv.lookup(keys) == 0


def test_a_layer_wise_load_is_one_call_per_layer_not_per_block(env):
    layers, blocks, bt, heads, head = 4, 16, 4, 2, 8
    ref, src = _vllm(layers, blocks, bt, heads, head, 3)
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store()
        keys = cxlkv.block_keys(np.arange(16 * bt), bt)
        assert cxlkv.put_ok(kv.put(keys, src, list(range(16)), gpu=gpu)).all()
        out = torch.zeros_like(ref)
        dst = cxlkv.PagedKV.block_first(out)
        L = _lib.lib()
        names = ["cxlkv_kv_gpu_load_layers", "cxlkv_gpu_load_wait", "cxlkv_gpu_load_finish", "cxlkv_kv_pin_many",
                 "cxlkv_kv_gpu_get_many", "cxlkv_gpu_scatter"]
        calls = {}
        orig = {n: getattr(L, n) for n in names}

        def wrap(n):
            def f(*a):
                calls[n] = calls.get(n, 0) + 1
                return orig[n](*a)
            return f
        layerwise._L()  # prototypes declared before wrapping
        for n in names:
            setattr(L, n, wrap(n))
        try:
            with layerwise.load_layers(kv, keys, dst, list(range(15, -1, -1)), gpu) as load:
                for layer in range(layers):
                    load.wait(layer)
        finally:
            for n in names:
                setattr(L, n, orig[n])
        assert calls == {"cxlkv_kv_gpu_load_layers": 1, "cxlkv_gpu_load_wait": layers, "cxlkv_gpu_load_finish": 1}
        assert torch.equal(out, ref.flip(0))


def test_closing_the_store_ends_an_unfinished_layer_wise_save_and_load(env):
    """An engine that stops mid-request (its store closed with a save half
    done and a load not finished): the save's reservations and the load's
    pins are given back, so the blocks are not BUSY / pinned for every node
    for as long as the process lives (before: another node's put of the same
    keys was BUSY for good)."""
    layers, blocks, bt, heads, head = 2, 4, 4, 2, 16
    _, src = _vllm(layers, blocks, bt, heads, head, 3)
    with cxlkv.Gpu(env.pool, reference=True) as gpu:
        kv = env.store(1)
        done = cxlkv.block_keys(np.arange(2 * bt) + 500, bt)
        assert cxlkv.put_ok(kv.put(done, src, [0, 1])).all()
        keys = cxlkv.block_keys(np.arange(2 * bt) + 900, bt)
        save = layerwise.save_layers(kv, keys, src, [2, 3], gpu)
        assert save.status.tolist() == [cxlkv.RESERVED] * 2
        save.save_layer(0)  # the other layer never comes
        load = layerwise.load_layers(kv, done, src, [2, 3], gpu)
        assert load.loading == 2
        kv.close()
        other = env.store(2)
        st = other.put(keys, [np.zeros(src.block_bytes, np.uint8)] * 2)
        assert st.tolist() == [cxlkv.RESERVED] * 2, st
        with other.pin(done) as p:  # unpinned by node 1: node 2's pin is the only one
            assert p.pinned.all()
        with pytest.raises(ValueError, match="finished"):
            save.save_layer(1)
