# SPDX-License-Identifier: MIT
"""The adapters loaded the way each engine loads them, by the engine's own
code, wherever the engine is importable (skipped otherwise: none of them can
be installed on the build machines).  The call-sequence tests of each adapter
(test_vllm_connector, test_sglang_backend, test_lmcache_plugin) also run
against the real base classes when the engine is importable."""
import pytest

from engine_fakes import SGLangHostPool, sglang_config


def test_vllm_factory_loads_the_connector_by_module_path(env):
    factory = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.factory")
    base = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")
    from vllm.config import KVTransferConfig
    ktc = KVTransferConfig(kv_connector="CxlkvConnector", kv_connector_module_path="cxlkv.integrations.vllm",
                           kv_role="kv_both", kv_connector_extra_config={"pool": env.uri, "node": 2})
    get = getattr(factory.KVConnectorFactory, "get_connector_class", None)
    if get is None:
        pytest.skip("this vLLM has no KVConnectorFactory.get_connector_class")
    cls = get(ktc)
    assert issubclass(cls, base.KVConnectorBase_V1) and cls.__name__ == "CxlkvConnector"


def test_sglang_dynamic_backend_factory_builds_the_backend(env):
    bf = pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory")
    hs = pytest.importorskip("sglang.srt.mem_cache.hicache_storage")
    cfg = sglang_config(extra={"backend_name": "cxlkv", "module_path": "cxlkv.integrations.sglang",
                               "class_name": "CxlkvHiCacheStorage", "interface_v1": 1, "pool": env.uri, "node": 2})
    b = bf.StorageBackendFactory.create_backend("dynamic", cfg, SGLangHostPool())
    try:
        assert isinstance(b, hs.HiCacheStorage)
    finally:
        b.close()


def test_lmcache_native_plugin_factory_builds_the_adapter(env):
    npa = pytest.importorskip("lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter")
    cfg = npa.NativePluginL2AdapterConfig.from_dict(
        {"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache", "class_name": "CxlkvNativePlugin",
         "adapter_params": {"pool": env.uri, "node": 2}})
    adapter = npa._create_native_plugin_l2_adapter(cfg)
    adapter.close()
