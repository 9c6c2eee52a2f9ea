# SPDX-License-Identifier: MIT
"""The lines a user writes to turn cxlkv on (each adapter's module docstring,
docs/engines.md and docs/api.md) name real config keys: each snippet's JSON is taken from
the docstring and fed through what the engine does with it (SGLang: the
dynamic backend factory's import of module_path / class_name and backend_class(storage_config, kwargs); LMCache: the native
plugin factory's connector_cls(**adapter_params) and its method check).
The vLLM snippet runs inside the real vLLM: tests/engines/test_vllm_config.py."""
import importlib
import json
import re

import numpy as np
import pytest

import cxlkv
from engine_fakes import sglang_config


def snippet_json(module, start):
    """The JSON object in `module`'s docstring that begins at `start`."""
    return _json_at(importlib.import_module(module).__doc__, start)


def _json_at(doc, start):
    i = doc.index(start)
    depth, j = 0, i
    for j in range(i, len(doc)):
        depth += {"{": 1, "}": -1}.get(doc[j], 0)
        if depth == 0:
            break
    text = re.sub(r"\\\s*\n", " ", doc[i:j + 1])  # shell line continuations
    return json.loads(text)


def test_sglang_snippet(env):
    extra = snippet_json("cxlkv.integrations.sglang", '{"backend_name"')
    assert extra["interface_v1"] == 1 and extra["pool"].startswith("dax:")
    for field in ("backend_name", "module_path", "class_name"):  # required by the dynamic factory
        assert field in extra
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    extra = dict(extra, pool=env.uri)
    b = cls(sglang_config(extra=extra), {})  # backend_class(storage_config, kwargs)
    try:
        assert b.pool.uri == env.uri and b.batch_exists(["00" * 32]) == 0
    finally:
        b.close()


def test_lmcache_snippet(env):
    cfg = snippet_json("cxlkv.integrations.lmcache", '{"type"')
    assert cfg["type"] == "native_plugin" and cfg["adapter_params"]["pool"].startswith("dax:")
    cls = getattr(importlib.import_module(cfg["module_path"]), cfg["class_name"])
    client = cls(**dict(cfg["adapter_params"], pool=env.uri))
    try:
        for m in ("event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists", "drain_completions",
                  "close"):
            assert callable(getattr(client, m)), m
        assert isinstance(client.event_fd(), int)
    finally:
        client.close()


@pytest.mark.parametrize("module,start", [("cxlkv.integrations.sglang", '{"backend_name"'),
                                          ("cxlkv.integrations.lmcache", '{"type": "native_plugin"')])
def test_doc_engine_snippets_are_the_tested_ones(module, start):
    """The SGLang and LMCache snippets of docs/engines.md carry the same JSON as the adapters' docstrings, which the tests above
    feed through what the engine does (the vLLM one runs inside vLLM:
    tests/engines/test_vllm_config.py)."""
    import os
    from conftest import ROOT
    text = open(os.path.join(ROOT, "docs", "engines.md"), encoding="utf-8").read()
    assert _json_at(text, start) == snippet_json(module, start)


def test_package_docstring_example_runs(env):
    """The package docstring's few lines run as written."""
    import torch
    kv = cxlkv.KvStore(env.pool, node=2)
    kv_caches = [torch.randn(2, 8, 16, 2, 32) for _ in range(3)]  # vLLM, per layer [2, blocks, 16, heads, head]
    token_ids = np.arange(3 * 16 + 5)
    keys = cxlkv.block_keys(token_ids, 16)
    cache = cxlkv.PagedKV.vllm(kv_caches)
    assert cxlkv.put_ok(kv.put(keys, cache, [5, 1, 7])).all()
    hit = kv.lookup(keys)
    assert hit == 3
    assert cxlkv.get_ok(kv.get(keys[:hit], cache, [0, 2, 3])).all()
    assert all(torch.equal(t[:, [0, 2, 3]], t[:, [5, 1, 7]]) for t in kv_caches)
    kv.close()


def test_doc_python_example_runs_as_written(env):
    """The Python block of docs/api.md (section "Python"), as
    written, on a pool of this test: only the pool URI is replaced and the
    engine's variables (token ids, paged caches, block ids) are given."""
    import os
    import torch
    from conftest import ROOT
    text = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read()
    sec = text[text.index("## Python\n"):]
    code = sec[sec.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    assert 'cxlkv.Pool("dax:/dev/dax0.0")' in code
    code = code.replace('"dax:/dev/dax0.0"', repr(env.uri))
    kv_caches = {f"layers.{l}": torch.randn(2, 8, 16, 2, 32) for l in range(3)}  # vLLM FlashAttention layout
    before = {k: v.clone() for k, v in kv_caches.items()}
    g = dict(token_ids=list(range(1000, 1000 + 4 * 16 + 3)), kv_caches=kv_caches, block_ids=[6, 2, 4, 0],
             other_ids=[1, 3, 5, 7])
    exec(compile(code, "docs/api.md", "exec"), g)  # noqa: S102 -- the documented example
    try:
        assert g["hit"] == 4 and cxlkv.get_ok(g["st"]).all()
        for k, t in kv_caches.items():
            assert torch.equal(t[:, [1, 3, 5, 7]], before[k][:, [6, 2, 4, 0]]), k
    finally:
        g["kv"].close()
        g["pool"].close()
