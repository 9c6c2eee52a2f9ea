# SPDX-License-Identifier: MIT
"""cxlkv.integrations.vllm driven through vLLM v1's call sequence: a prefill
instance (producer) and a decode instance (consumer), each with its
scheduler-role connector in this process and its worker-role connector in a
worker process with a real model and paged cache; the decode instance's
suffix logits on the KV handed over through the pool equal the logits on the
locally computed prefix, bit for bit."""
import multiprocessing as mp
import sys

import numpy as np
import pytest
import torch

import cxlkv
from engine_fakes import Blocks, scheduler_output, vllm_config, vllm_request, vllm_role, vllm_worker
from tiny_llama import Config, PagedCache, TinyLlama

BS = 16


class Worker:
    def __init__(self, uri, node, kv_role, layout, nblocks=12):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.p = ctx.Process(target=vllm_worker, args=(child, uri, node, kv_role, BS, layout, nblocks))
        self.p.start()

    def step(self, meta, tokens, start, table):
        self.conn.send(("step", meta, tokens, start, table))
        if not self.conn.poll(240):
            raise AssertionError("worker step timed out")
        return self.conn.recv()

    def stop(self):
        self.conn.send(("stop",))
        assert self.conn.poll(120) and self.conn.recv() == "stopped"
        self.p.join(60)


def test_module_imports_without_vllm():
    import cxlkv.integrations.vllm as cv
    assert "vLLM" in cv.__doc__ and "0.11" in cv.__doc__
    cls = cv.CxlkvConnector
    for m in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
              "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
              "get_finished", "get_block_ids_with_load_errors", "shutdown"):
        assert callable(getattr(cls, m)), m
    try:
        import vllm  # noqa: F401
        assert any(c.__name__ == "KVConnectorBase_V1" for c in cls.__mro__)
    except ImportError:
        assert "vllm" not in sys.modules


@pytest.mark.parametrize("d_layout", ["vllm", "flashinfer"])
def test_prefill_to_decode_handoff_through_the_pool(env, d_layout):
    from cxlkv.integrations import vllm as cv
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, Config.vocab, 5 * BS + 3).tolist()
    # ---- prefill instance: scheduler here, worker in its own process
    sched_p = cv.CxlkvConnector(vllm_config(env.uri, 2, "kv_producer", BS), vllm_role("SCHEDULER"), None)
    wp = Worker(env.uri, 4, "kv_producer", "vllm")
    try:
        req = vllm_request("req-1", prompt, BS)
        assert sched_p.get_num_new_matched_tokens(req, 0) == (0, False)
        table_p = [3, 7, 1, 0, 5, 2]
        sched_p.update_state_after_alloc(req, Blocks(table_p), 0)
        meta = sched_p.build_connector_meta(scheduler_output("req-1", table_p, 0, len(prompt)))
        assert [len(t.keys) for t in meta.saves] == [5] and not meta.loads
        assert not sched_p.build_connector_meta(scheduler_output("req-1", table_p, len(prompt), 0)).saves  # reset
        _, errors, _ = wp.step(meta, prompt, 0, table_p)
        assert errors == set()
        delay, params = sched_p.request_finished(req, table_p)
        assert delay is False
    finally:
        wp.stop()

    # ---- decode instance: finds the prompt's blocks by vLLM's block hashes
    sched_d = cv.CxlkvConnector(vllm_config(env.uri, 3, "kv_consumer", BS), vllm_role("SCHEDULER"), None)
    wd = Worker(env.uri, 5, "kv_consumer", d_layout)
    try:
        req_d = vllm_request("req-1", prompt, BS, kv_transfer_params=params)
        n, load_async = sched_d.get_num_new_matched_tokens(req_d, 0)
        assert (n, load_async) == (5 * BS, False)
        assert sched_d.get_num_new_matched_tokens(req_d, 2 * BS) == (3 * BS, False)  # beyond local prefix hits
        sched_d.get_num_new_matched_tokens(req_d, 0)
        table_d = [9, 4, 6, 2, 8, 1]
        sched_d.update_state_after_alloc(req_d, Blocks(table_d), n)
        meta = sched_d.build_connector_meta(scheduler_output("req-1", table_d, 0, len(prompt) - n))
        assert [t.block_ids for t in meta.loads] == [table_d[:5]] and not meta.saves
        logits, errors, _ = wd.step(meta, prompt[n:], n, table_d)
        assert errors == set()

        # the oracle: the same prompt prefilled in process, then the suffix
        torch.set_num_threads(1)
        model = TinyLlama(Config())
        local = PagedCache("vllm", Config(), 12, BS, torch.float32)
        model(prompt, 0, local, table_p)
        want = model(prompt[n:], n, local, table_p)
        assert torch.equal(logits, want)
        assert sched_d.request_finished(req_d, table_d) == (False, None)
        assert sched_d.metrics.counters["cxlkv_client_hit_tokens_total"] >= 5 * BS

        # a block gone at load time is reported by block id and recomputed
        req_2 = vllm_request("req-2", prompt, BS)
        sched_d.get_num_new_matched_tokens(req_2, 0)
        table_2 = [0, 3, 5, 7, 10, 11]
        sched_d.update_state_after_alloc(req_2, Blocks(table_2), n)
        meta = sched_d.build_connector_meta(scheduler_output("req-2", table_2, 0, len(prompt) - n))
        meta.loads[0].keys[2] = cxlkv.keys_from_hashes([b"evicted"])[0]
        _, errors, _ = wd.step(meta, prompt[n:], n, table_2)
        assert errors == {table_2[2]}
    finally:
        wd.stop()
    sched_p.shutdown()
    sched_d.shutdown()


def test_a_short_prompt_fully_cached_still_leaves_the_last_token_to_compute(env):
    from cxlkv.integrations import vllm as cv
    kv = env.store(6)
    prompt = list(range(2 * BS))
    s = cv.CxlkvConnector(vllm_config(env.uri, 7, "kv_both", BS), vllm_role("SCHEDULER"), None)
    req = vllm_request("r", prompt, BS)
    keys = cxlkv.keys_from_hashes(req.block_hashes, s.namespace)
    kv.put(keys, [np.zeros(64, np.uint8)] * 2)
    assert s.get_num_new_matched_tokens(req, 0) == (BS, False)  # not 2*BS: vLLM computes the last token
    s.shutdown()


def test_register_kv_caches_refuses_layouts_it_would_store_in_another_order(env):
    """The worker reads the K|V dimension from the tensors' shape.  A
    FlashAttention cache of 2 blocks ([2, 2, ...]) was taken for FlashInfer's
    and stored K/V and blocks swapped (the bytes another engine read back
    were other blocks'); a heads-before-tokens cache was stored as if its
    heads were tokens.  Both are refused now, naming the layer and shape;
    ``kv_layout`` in the extra config settles the 2-block case."""
    from cxlkv.integrations import vllm as cv
    L, H, D = 2, 2, 8
    torch.manual_seed(5)

    def worker(kv_layout=None):
        cfg = vllm_config(env.uri, 2, "kv_both", BS)
        if kv_layout:
            cfg.kv_transfer_config.kv_connector_extra_config["kv_layout"] = kv_layout
        return cv.CxlkvConnector(cfg, vllm_role("WORKER"), None)

    c = worker()
    try:
        hnd = {f"layers.{l}": torch.zeros(2, 6, H, BS, D) for l in range(L)}  # [2, blocks, heads, tokens, head]
        with pytest.raises(ValueError, match=r"layers\.0: KV cache of shape \(2, 6, 2, 16, 8\) is neither"):
            c.register_kv_caches(hnd)
        two = {f"layers.{l}": torch.randn(2, 2, BS, H, D) for l in range(L)}  # FlashAttention, 2 blocks
        with pytest.raises(ValueError, match="ambiguous"):
            c.register_kv_caches(two)
    finally:
        c.shutdown()
    c = worker("flash_attn")
    try:
        c.register_kv_caches(two)
        keys = cxlkv.block_keys(np.arange(2 * BS) + 123, BS)
        kv = env.store(3)
        # publish through the connector's layout, read back block-first: block b, layer l, K|V
        assert cxlkv.put_ok(kv.put(keys, c.kv, [1, 0])).all()
        back = torch.zeros(2, L, 2, BS, H, D)
        assert cxlkv.get_ok(kv.get(keys, cxlkv.PagedKV.block_first(back), [0, 1])).all()
        for i, b in enumerate([1, 0]):
            for l in range(L):
                assert torch.equal(back[i, l, 0], two[f"layers.{l}"][0, b])  # K of block b
                assert torch.equal(back[i, l, 1], two[f"layers.{l}"][1, b])  # V of block b
    finally:
        c.shutdown()


def test_a_pool_failure_in_the_scheduler_is_a_miss_and_a_log_line_not_a_dead_engine(env, caplog):
    """An exception out of get_num_new_matched_tokens or request_finished
    ends vLLM's engine core.  When the pool fails (here: the store is closed
    under the connector; in service mode an index service that is down), the
    scheduler side answers as for a miss and logs the cause on cxlkv.vllm."""
    import logging
    from cxlkv.integrations import vllm as cv
    c = cv.CxlkvConnector(vllm_config(env.uri, 2, "kv_both", BS), vllm_role("SCHEDULER"), None)
    try:
        req = vllm_request("r1", list(range(3 * BS + 1)), BS, kv_transfer_params={"cxlkv_lease": 5, "cxlkv_blocks": 2})
        assert c.get_num_new_matched_tokens(req, 0) == (0, False)
        c.store.close()
        with caplog.at_level(logging.WARNING, logger="cxlkv.vllm"):
            assert c.get_num_new_matched_tokens(req, 0) == (0, False)
            assert c.request_finished(req, [0, 1, 2]) == (False, None)
        assert "lookup failed: ValueError" in caplog.text and "lease release failed" in caplog.text
        assert f"KV store of node 2 on {env.uri} is closed" in caplog.text
    finally:
        c.shutdown()


# ---- pins between the scheduler's lookup and the worker's load ---------------------
L_, H_, D_ = 2, 2, 8  # a small cache: 4 KiB pool blocks


def _cached_prompt(env, node=2):
    """A 5-block prompt (+3 tokens) whose blocks another node published."""
    prompt = list(range(1000, 1000 + 5 * BS + 3))
    torch.manual_seed(11)
    src = {f"layers.{l}": torch.randn(2, 8, BS, H_, D_) for l in range(L_)}
    return prompt, src


def _publish(env, sched, req, src, node=2):
    keys = cxlkv.keys_from_hashes(req.block_hashes, sched.namespace)
    kv = env.store(node)
    assert cxlkv.put_ok(kv.put(keys, cxlkv.PagedKV.vllm(src, kv_dim=0), list(range(5)))).all()
    return keys, kv


def _cap_pool(env, blocks):
    """The pool-wide memory capacity (cxlkvctl kv --mem-capacity): the next
    reserve evicts down to it whatever is not pinned."""
    import os
    import subprocess
    from conftest import ROOT
    ctl = os.path.join(os.environ.get("CXLKV_TEST_TOOLS", os.path.join(ROOT, "build", "tools")), "cxlkvctl")
    if not os.path.exists(ctl):
        pytest.skip("cxlkvctl not built")
    # The policy is set when the command attaches; the block it asks for is not there.
    r = subprocess.run([ctl, "--pool", env.uri, "kv", "get", "no-such-block", "-", "--mem-capacity", str(blocks),
                        "--node", "7"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "not cached" in r.stderr, r.stderr


def _pressure(env, tag, n=3, node=4):
    """Another node stores n new blocks of the same size (past the capacity)."""
    kv = env.store(node) if not hasattr(env, "_press") else env._press
    env._press = kv
    return kv.put(cxlkv.block_keys(np.arange(n * BS) + 50000 + 1000 * tag, BS), [np.ones(4096, np.uint8)] * n)


def test_a_planned_load_finds_every_block_although_the_pool_evicts_in_between(env):
    """The scheduler found 5 blocks; before the worker loads them, another
    node stores past the pool's capacity.  The planned load's blocks are
    pinned from update_state_after_alloc, so nothing it needs is evicted:
    the worker reports no load error and its cache holds the published
    bytes.  load_pin_steps plans later the pins are gone and the blocks are
    evictable again."""
    from cxlkv.integrations import vllm as cv
    prompt, src = _cached_prompt(env)
    sched = cv.CxlkvConnector(vllm_config(env.uri, 3, "kv_consumer", BS), vllm_role("SCHEDULER"), None)
    w = cv.CxlkvConnector(vllm_config(env.uri, 5, "kv_consumer", BS), vllm_role("WORKER"), None)
    try:
        req = vllm_request("pinned", prompt, BS)
        keys, kvp = _publish(env, sched, req, src)
        n, _ = sched.get_num_new_matched_tokens(req, 0)
        assert n == 5 * BS
        table = [7, 2, 5, 0, 3, 1]
        sched.update_state_after_alloc(req, Blocks(table), n)
        meta = sched.build_connector_meta(scheduler_output("pinned", table, 0, len(prompt) - n))

        _cap_pool(env, 5)
        st = _pressure(env, 1)
        assert not cxlkv.put_ok(st).any(), "a block was stored by evicting the planned load's blocks"
        assert kvp.lookup(keys) == 5

        dst = {f"layers.{l}": torch.zeros(2, 8, BS, H_, D_) for l in range(L_)}
        w.register_kv_caches(dst)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_layer_load("layers.0")
        assert w.get_block_ids_with_load_errors() == set()
        for i, b in enumerate(table[:5]):
            for l in range(L_):
                assert torch.equal(dst[f"layers.{l}"][:, b], src[f"layers.{l}"][:, i]), (i, l)
        w.clear_connector_metadata()

        # Plans of later steps: after load_pin_steps of them the pins are given back.
        for step in range(sched.load_pin_steps):
            assert not cxlkv.put_ok(_pressure(env, 10 + step, n=1)).any(), f"unpinned after {step} steps"
            sched.build_connector_meta(scheduler_output("pinned", table, len(prompt) + step, 1))
        assert cxlkv.put_ok(_pressure(env, 2)).all(), kvp.last_error
        assert kvp.lookup(keys) == 2, "the load's blocks stayed pinned"
    finally:
        w.shutdown()
        sched.shutdown()


def test_a_finished_or_aborted_request_gives_its_load_pins_back_at_once(env):
    from cxlkv.integrations import vllm as cv
    prompt, src = _cached_prompt(env)
    sched = cv.CxlkvConnector(vllm_config(env.uri, 3, "kv_consumer", BS), vllm_role("SCHEDULER"), None)
    try:
        req = vllm_request("aborted", prompt, BS)
        keys, kvp = _publish(env, sched, req, src)
        n, _ = sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, Blocks([7, 2, 5, 0, 3, 1]), n)
        _cap_pool(env, 5)
        assert not cxlkv.put_ok(_pressure(env, 1)).any()
        assert sched.request_finished(req, [7, 2, 5, 0, 3, 1]) == (False, None)
        assert cxlkv.put_ok(_pressure(env, 2)).all(), kvp.last_error
        assert kvp.lookup(keys) == 2
    finally:
        sched.shutdown()


def _scheduler_pins_and_waits(conn, uri, prompt):
    from cxlkv.integrations import vllm as cv
    sched = cv.CxlkvConnector(vllm_config(uri, 6, "kv_consumer", BS), vllm_role("SCHEDULER"), None)
    req = vllm_request("dies", prompt, BS)
    n, _ = sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, Blocks([7, 2, 5, 0, 3, 1]), n)
    conn.send(n)
    import time
    time.sleep(600)  # killed here, holding its pins


def test_a_scheduler_process_killed_holding_load_pins_leaves_the_blocks_evictable(env):
    prompt, src = _cached_prompt(env)
    from cxlkv.integrations import vllm as cv
    probe = cv.CxlkvConnector(vllm_config(env.uri, 3, "kv_consumer", BS), vllm_role("SCHEDULER"), None)
    try:
        keys, kvp = _publish(env, probe, vllm_request("dies", prompt, BS), src)
    finally:
        probe.shutdown()
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    p = ctx.Process(target=_scheduler_pins_and_waits, args=(child, env.uri, prompt))
    p.start()
    try:
        assert conn.poll(120), "scheduler process did not pin"
        assert conn.recv() == 5 * BS
        _cap_pool(env, 5)
        assert not cxlkv.put_ok(_pressure(env, 1)).any(), "the scheduler process's pins did not hold"
    finally:
        p.kill()
        p.join(60)
    assert cxlkv.put_ok(_pressure(env, 2)).all(), kvp.last_error  # its node is dead: its pins count no more
    assert kvp.lookup(keys) == 2
