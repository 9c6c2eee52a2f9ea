# SPDX-License-Identifier: MIT
"""The remote tier's parts that need no Mooncake (cxlkv.remote): the block
header check, the configuration, and the tier staying off unless asked.
The tier against a real Mooncake Store: tests/engines/test_remote.py."""
import numpy as np
import pytest

import cxlkv
from cxlkv import remote


def _obj(key, payload):
    o = np.zeros(remote.HEADER_BYTES + payload.size, np.uint8)
    o[remote.HEADER_BYTES:] = payload
    remote._header_into(o[:remote.HEADER_BYTES], key, payload.size,
                        remote.checksum64((o.ctypes.data + remote.HEADER_BYTES, payload.size)))
    return o


def test_header_accepts_the_block_and_refuses_every_kind_of_damage():
    key, other = (5, 7), (5, 8)
    pay = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    o = _obj(key, pay)
    assert remote.check_block(o, key, o.size) is None
    assert "names key" in remote.check_block(o, other, o.size)
    bad = o.copy()
    bad[remote.HEADER_BYTES + 17] ^= 1
    assert remote.check_block(bad, key, bad.size) == "payload checksum mismatch"
    bad = o.copy()
    bad[20] ^= 1  # the key field: the header's own checksum catches it first
    assert remote.check_block(bad, key, bad.size) == "block header checksum mismatch"
    assert "arrived" in remote.check_block(o[:-100], key, o.size - 100)
    assert "shorter" in remote.check_block(o[:10], key, 10)
    assert "no cxlkv block header" in remote.check_block(pay, key, pay.size)


def test_checksum_is_the_librarys_xxh3():
    a = np.arange(1000, dtype=np.uint8)
    assert remote.checksum64(a.tobytes()) == remote.checksum64((a.ctypes.data, a.size))
    assert remote.checksum64(b"") == remote.checksum64((0, 0))
    assert remote.checksum64(b"a") != remote.checksum64(b"b")


def test_config_from_env_and_dict():
    assert remote.RemoteConfig.from_env({}) is None
    c = remote.RemoteConfig.from_env({"CXLKV_REMOTE_MASTER": "10.0.0.1:50051", "CXLKV_REMOTE_TIMEOUT_S": "0.5",
                                      "CXLKV_REMOTE_PUBLISH": "0"})
    assert c.master == "10.0.0.1:50051" and c.timeout_s == 0.5 and c.publish is False
    assert c.metadata == "http://10.0.0.1:8080/metadata"
    with pytest.raises(ValueError, match="unknown settings"):
        remote.RemoteConfig.from_dict({"master": "h:1", "segmnet_bytes": 1})
    with pytest.raises(ValueError, match="host:port"):
        remote.RemoteConfig(master="nohost")
    with pytest.raises(ValueError, match="no master"):
        remote.RemoteConfig.from_dict({"protocol": "tcp"})


def test_a_store_has_no_remote_tier_unless_asked(small_env, monkeypatch):
    monkeypatch.delenv("CXLKV_REMOTE_MASTER", raising=False)
    s = small_env.store(1)
    assert s.remote is None and not any(k.startswith("remote") for k in s.stats())
    m = cxlkv.metrics.Metrics()
    assert "remote" not in m.exposition()
