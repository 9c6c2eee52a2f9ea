# SPDX-License-Identifier: MIT
"""The remote tier (docs/remote.md) under real vLLM engines: an engine in
rack A computes prompts into pool A; an engine in rack B (pool B, the same
Mooncake Store) serves the same prompts and loads their prefix through the
remote tier instead of computing it.

Each rack is its own pool with its own ``cxlkvd`` and a host process lending
the store memory (remote_env.py), in a network namespace of its own where
this process may make one; the engines run in their rack's namespace, join
the store through the ``CXLKV_REMOTE_*`` environment (the adapters need no
setting of their own, docs/remote.md "With the engine adapters") and lend it
none, so what rack A computed lives on in rack A's host after engine A has
gone.  The oracle is test_vllm.py's: the same engine without the connector,
whose second round reads its own prefix cache; greedy tokens identical and
log-probabilities within 1e-4."""
import os

import pytest

import cxlkv
from remote_env import Racks
from tiny_model import make_tiny_llama
from vllm_util import (BLOCK, connector, connector_namespace, prompts_with_shared_prefix, read_metrics, run_engine,
                       same_outputs, spec, vllm_block_hashes)

OUT = os.environ.get("CXLKV_REMOTE_LOGDIR", f"/tmp/cxlkv-remote-vllm-tests-{os.getpid()}")
PROMPTS = prompts_with_shared_prefix(4, 8 * BLOCK, 40, seed=23)  # 8 shared blocks, each prompt 9 full + 8 tokens
FULL = len(PROMPTS[0]) // BLOCK


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture(scope="module")
def racks():
    r = Racks(["a", "b"], OUT, timeout=10.0)
    print(f"remote vLLM tests: racks on {r.mode}; master {r.master.rpc}")
    yield r
    r.close()


def _metrics(tmp_path, name, role, rank):
    path = tmp_path / f"{name}-{role}-{rank}.prom"
    assert path.exists(), f"engine {name} wrote no {role} metrics ({path})"
    return read_metrics(str(path))


def test_engine_in_rack_b_serves_rack_a_prefix_from_the_remote_tier(racks, model, tmp_path):
    rounds = [dict(prompts=PROMPTS, max_tokens=12)]
    keys = [cxlkv.keys_from_hashes(vllm_block_hashes(p), connector_namespace(model)) for p in PROMPTS]
    want = sorted({(int(k[0]), int(k[1])) for ks in keys for k in ks})
    hb = racks["b"]
    assert hb.call("keys_state", keys=want)["remote"] == [0] * len(want), "the store holds the blocks already"

    # Rack A computes; its worker's blocks go to pool A and, in the
    # background, to the store.  The engine stays up until the store holds
    # every block (its push would be dropped when it exits).
    metrics_a = str(tmp_path / "a-{role}-{rank}.prom")
    a, state = racks.run_engine_until_pushed("a", tmp_path, "a", spec(model, rounds, connector(
        racks["a"].pool, 2, metrics_textfile=metrics_a)), want)
    assert state is not None and state["remote"] == [1] * len(want), \
        f"rack A's engine did not get its {len(want)} blocks into the store: {state}"
    # Nothing of them in pool B: whatever engine B loads came through the store.
    assert hb.call("keys_state", keys=want)["local"] == [0] * len(want)

    metrics_b = str(tmp_path / "b-{role}-{rank}.prom")
    b = run_engine(tmp_path, "b", spec(model, rounds, connector(racks["b"].pool, 2, metrics_textfile=metrics_b),
                                       env=racks.engine_env("b")), prefix=racks.net.prefix("b"))
    oracle = run_engine(tmp_path, "oracle", spec(model, rounds + rounds))
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="rack A's engine (computes)")
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="rack B's engine (loads rack A's prefix)")

    # Rack B's scheduler brought the prefixes into pool B from the store
    # (its lookups), and its worker loaded them from pool B.
    sched = _metrics(tmp_path, "b", "scheduler", "scheduler")
    worker = _metrics(tmp_path, "b", "worker", "tp0pp0")
    assert sched.get("cxlkv_client_remote_hit_blocks_total", 0) >= FULL, sched
    assert sched.get("cxlkv_client_remote_hit_tokens_total", 0) >= FULL * BLOCK, sched
    assert sched.get("cxlkv_client_remote_refused_blocks_total", 0) == 0, sched
    assert worker.get("cxlkv_client_loaded_blocks_total", 0) >= FULL, worker
    assert worker.get("cxlkv_client_load_failed_blocks_total", 0) == 0, worker
    # Every prompt's full blocks are in pool B now: the rack's next engine hits locally.
    assert hb.call("keys_state", keys=want)["local"] == [1] * len(want)
