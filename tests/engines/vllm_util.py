# SPDX-License-Identifier: MIT
"""Running real vLLM engines (tests/engines/vllm_engine.py) as separate
processes for the engine tests and the engine benchmark, and the keys vLLM's
connector gives a prompt's blocks (vLLM's own block hashing)."""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
ENGINE = os.path.join(HERE, "vllm_engine.py")
BLOCK = 32  # vLLM's CPU attention takes multiples of 32 tokens per block
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


def engine_env():
    """The environment of an engine process: this checkout's package and
    library, the same PYTHONHASHSEED everywhere (vLLM's block hashes need
    it), quiet logs."""
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = os.path.join(ROOT, "libruntime", "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CXLKV_LIB", os.path.join(env.get("CXLKV_BUILD", os.path.join(ROOT, "build")), "libruntime",
                                             "libcxlkv.so"))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def start_engine(workdir, name, spec, prefix=()):
    """Start an engine process (its own process group: its engine core and
    workers go with it on a kill); returns (Popen, out path, log path).
    ``prefix``: a command the engine runs under (``ip netns exec NS`` puts
    it in a network namespace)."""
    spec_path = os.path.join(workdir, f"{name}.spec.json")
    out = os.path.join(workdir, f"{name}.out.json")
    logp = os.path.join(workdir, f"{name}.log")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    log = open(logp, "w")
    env = engine_env()
    env.update(spec.get("env", {}))
    p = subprocess.Popen([*prefix, sys.executable, ENGINE, spec_path, out], env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return p, out, logp


def finish_engine(p, out, logp, timeout=900):
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_engine(p)
        rc = "timeout"
    if rc != 0 or not os.path.exists(out):
        with open(logp) as f:
            tail = f.read()[-6000:]
        raise AssertionError(f"vLLM engine {os.path.basename(logp)} failed (exit {rc}):\n{tail}")
    with open(out) as f:
        return json.load(f)


def run_engine(workdir, name, spec, timeout=900, prefix=()):
    """Run one engine to the end; its OUT (see vllm_engine.py)."""
    return finish_engine(*start_engine(workdir, name, spec, prefix), timeout=timeout)


def kill_engine(p):
    """SIGKILL the engine's whole process group and reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(60)


def wait_for_file(path, proc, timeout=300):
    t = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"engine exited ({proc.returncode}) before writing {path}")
        if time.monotonic() > t:
            raise AssertionError(f"engine did not write {path} within {timeout} s")
        time.sleep(0.1)


def connector(uri, node, role="kv_both", **extra):
    return dict(pool=uri, node=node, kv_role=role, **extra)


# vLLM's CPU workers bind their threads to cores; with tensor parallelism on
# one NUMA node they must be told which (one core each here).
TP2 = dict(tp=2, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})


def spec(model, rounds, conn=None, **kw):
    """An engine spec (see vllm_engine.py); ``env``: extra environment."""
    s = dict(model=model, connector=conn, rounds=rounds, block_size=BLOCK)
    s.update(kw)
    return s


def same_outputs(got, want, atol=1e-4, what=""):
    """Greedy tokens identical; log-probabilities equal within ``atol``.

    Up to a greedy tie: where the tokens first part, every earlier
    log-probability agrees within ``atol`` and the two chosen tokens have
    the same log-probability within ``atol`` (two tokens equally likely:
    float rounding picks either, e.g. a prefix loaded, not recomputed), the
    outputs are compared up to there.  A wrong KV block moves the
    log-probabilities by far more from the first token on
    (test_the_oracle_catches_a_wrong_block)."""
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        n = len(g["tokens"])
        if g["tokens"] != w["tokens"]:
            at = next(j for j, (a, b) in enumerate(zip(g["tokens"] + [None], w["tokens"] + [None])) if a != b)
            before = max((abs(a - b) for a, b in zip(g["logprobs"][:at], w["logprobs"][:at])), default=0.0)
            there = g["logprobs"][at:at + 1], w["logprobs"][at:at + 1]
            tie = len(g["tokens"]) == len(w["tokens"]) and at < n and before <= atol and \
                abs(there[0][0] - there[1][0]) <= atol
            assert tie, (f"{what} prompt {i}: tokens {g['tokens']} != oracle {w['tokens']} (first at {at}; "
                         f"log-probabilities before it within {before:.3g}; there {there[0]} against {there[1]})")
            n = at
        diff = max((abs(a - b) for a, b in zip(g["logprobs"][:n], w["logprobs"][:n])), default=0.0)
        assert diff <= atol, f"{what} prompt {i}: log-probabilities differ from the oracle's by {diff} > {atol}"


def prompts_with_shared_prefix(n, prefix_tokens, suffix_tokens, seed=7, vocab=512):
    """``n`` prompts sharing their first ``prefix_tokens`` token ids."""
    import random
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_tokens)]
    return [prefix + [rng.randrange(1, vocab) for _ in range(suffix_tokens)] for _ in range(n)]


def vllm_block_hashes(tokens, block_size=BLOCK):
    """vLLM's own block hashes of a token-id prompt (its default sha256
    prefix-cache hash, seeded by PYTHONHASHSEED=0 as the engines are)."""
    os.environ["PYTHONHASHSEED"] = "0"
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as u
    fn = get_hash_fn_by_name("sha256")
    u.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = u.hash_block_tokens(fn, parent, tuple(tokens[i * block_size:(i + 1) * block_size]), None)
        out.append(parent)
    return out


def connector_namespace(model, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dtype="float32/auto", extra=""):
    """The namespace the cxlkv connector gives a worker's keys (spelled out
    here as a specification: the connector must match it)."""
    import hashlib

    import cxlkv
    layers = hashlib.blake2b("\n".join(sorted(LAYERS)).encode(), digest_size=8).hexdigest()
    return cxlkv.namespace(model=model, dtype=dtype, tp_rank=tp_rank, tp_size=tp_size, extra=extra,
                           pp=f"{pp_rank}/{pp_size}", block=BLOCK, layers=layers, mla=0)


def read_metrics(path):
    import cxlkv.metrics
    return cxlkv.metrics.read_textfile(path)


def pinned_blocks(uri):
    """Sum of the PINS column of ``cxlkvctl kv ls`` (every node's pins)."""
    tool = os.path.join(os.environ.get("CXLKV_TEST_TOOLS", os.path.join(ROOT, "build", "tools")), "cxlkvctl")
    r = subprocess.run([tool, "--pool", uri, "kv", "ls", "--all"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    total = 0
    for line in r.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 6:
            total += int(cols[4])
    return total
