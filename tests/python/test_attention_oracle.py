# SPDX-License-Identifier: MIT
"""Real attention as the oracle: a prefix KV published by another process and
fetched from the pool gives bit-identical logits for a suffix to the same
prefix KV kept in process, across engine layouts, block sizes and dtypes."""
import numpy as np
import pytest
import torch

import cxlkv
from conftest import run_in_process
from tiny_llama import Config, PagedCache, TinyLlama, prefill_and_publish

CASES = [
    ("vllm", "sglang", 16, "float32"),
    ("block_first", "vllm", 8, "float32"),
    ("sglang", "flashinfer", 4, "bfloat16"),
    ("flashinfer", "block_first", 32, "float32"),  # CPU torch has no fp16 matmul
]


@pytest.mark.parametrize("src_layout,dst_layout,bt,dtype_name", CASES)
def test_suffix_logits_on_a_pool_prefix_equal_logits_on_the_local_prefix(env, src_layout, dst_layout, bt,
                                                                         dtype_name):
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    cfg = Config()
    rng = np.random.default_rng(bt)
    nblocks = 4
    prefix = rng.integers(0, cfg.vocab, nblocks * bt).tolist()
    suffix = rng.integers(0, cfg.vocab, bt + 3).tolist()
    # the producer (another process, another node) prefills and publishes
    st = run_in_process(prefill_and_publish, env.uri, 2, src_layout, bt, dtype_name, prefix, [5, 2, 7, 0, 3])
    assert st == [cxlkv.RESERVED] * nblocks

    model = TinyLlama(cfg, dtype=dtype)
    total_blocks = nblocks + 2 + 4
    # reference: the same prefix prefilled in this process
    local = PagedCache(dst_layout, cfg, total_blocks, bt, dtype)
    table = list(range(total_blocks))
    model(prefix, 0, local, table)
    want = model(suffix, len(prefix), local, table)

    # consumer: look the prefix up, fetch it into other blocks, run only the suffix
    kv = env.store(3)
    keys = cxlkv.block_keys(prefix, bt, extras=b"tiny-llama")
    assert kv.lookup(keys) == nblocks
    cache = PagedCache(dst_layout, cfg, total_blocks, bt, dtype)
    table2 = [9, 4, 1, 6, 8, 0, 2, 3, 5, 7][:total_blocks]
    assert cxlkv.get_ok(kv.get(keys, cache.paged, table2[:nblocks])).all()
    got = model(suffix, len(prefix), cache, table2)
    assert got.dtype == dtype and got.shape == (len(suffix), cfg.vocab)
    assert torch.equal(got, want), f"max diff {(got.float() - want.float()).abs().max()}"

    # and a corrupted prefix is caught by the oracle (the check can fail)
    K, _ = cache.views[1]
    K[table2[1], 0, 0, 0] += 1
    assert not torch.equal(model(suffix, len(prefix), cache, table2), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_suffix_logits_on_a_pool_prefix_are_bit_identical(env):
    dtype, bt = torch.float16, 16
    cfg = Config()
    prefix = list(range(3 * bt))
    suffix = [1, 2, 3, 4, 5]
    model = TinyLlama(cfg, dtype=dtype, device="cuda")
    src = PagedCache("vllm", cfg, 8, bt, dtype, "cuda")
    model(prefix, 0, src, list(range(8)))
    want = model(suffix, len(prefix), src, list(range(8)))
    gpu = cxlkv.Gpu(env.pool)
    kv = env.store(2)
    keys = cxlkv.block_keys(prefix, bt)
    assert cxlkv.put_ok(kv.put(keys, src.paged, [0, 1, 2], gpu=gpu)).all()
    dst = PagedCache("block_first", cfg, 8, bt, dtype, "cuda")
    assert cxlkv.get_ok(kv.get(keys, dst.paged, [6, 3, 1], gpu=gpu)).all()
    torch.cuda.current_stream().synchronize()
    got = model(suffix, len(prefix), dst, [6, 3, 1, 0, 2, 4, 5, 7])
    assert torch.equal(got, want)
    gpu.close()
