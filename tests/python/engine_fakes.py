# SPDX-License-Identifier: MIT
"""SGLang's HiCacheStorageConfig and host pool as plain Python, for the core
tests of the SGLang backend under Debian's python3 (the real SGLang drives
it in tests/engines/test_sglang.py).  vLLM has no fakes: its connector is
tested only inside the real vLLM (tests/engines/test_vllm*.py)."""
import types

import torch


NS = types.SimpleNamespace


class SGLangHostPool:
    """SGLang's MHA host KV pool, layer_first: kv_buffer [2, layers, tokens,
    heads, head]; get_page_buffer_meta(indices) names each page's K and V
    piece of every layer (the upstream layer_first order); get_data_page /
    set_from_flat_data_page are the older interface's flat pages, K of every
    layer then V (another byte order)."""

    def __init__(self, layers=3, tokens=256, heads=2, head=16, page_size=16, dtype=torch.bfloat16,
                 layout="layer_first"):
        self.page_size, self.layer_num, self.size, self.layout = page_size, layers, tokens, layout
        self.dtype = dtype
        self.kv_buffer = torch.zeros(2, layers, tokens, heads, head, dtype=dtype)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        idx = indices.tolist()
        for i in range(0, len(idx), self.page_size):
            t = idx[i]
            for l in range(self.layer_num):
                for kv in range(2):
                    piece = self.kv_buffer[kv, l, t:t + self.page_size]
                    ptrs.append(piece.data_ptr())
                    sizes.append(piece.numel() * piece.element_size())
        return ptrs, sizes

    def get_data_page(self, index, flat=True):
        p = self.kv_buffer[:, :, index:index + self.page_size]
        return p.flatten() if flat else p

    def get_dummy_flat_data_page(self):
        return torch.zeros_like(self.kv_buffer[:, :, :self.page_size]).flatten()

    def set_from_flat_data_page(self, index, page):
        self.kv_buffer[:, :, index:index + self.page_size] = page.reshape(self.kv_buffer[:, :, :self.page_size].shape)

    def page(self, first_token):
        return self.kv_buffer[:, :, first_token:first_token + self.page_size].clone()


def sglang_config(model="tiny", tp_rank=0, tp_size=1, is_mla=False, extra=None, attn_cp=(0, 1)):
    """SGLang's HiCacheStorageConfig fields; extra_config turns on the
    zero-copy calls (interface_v1) unless ``extra`` says otherwise."""
    return NS(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=attn_cp[0],
              attn_cp_size=attn_cp[1], is_mla_model=is_mla, enable_storage_metrics=False,
              is_page_first_layout=False, model_name=model, extra_config={"interface_v1": 1, **(extra or {})})


def sglang_prefetch(uri, node, keys, first_tokens):
    """Another host's prefetch thread: batch_exists then batch_get_v1 into its host pool."""
    from cxlkv.integrations import sglang as cs
    b = cs.CxlkvHiCacheStorage(sglang_config(extra={"pool": uri, "node": node}))
    host = SGLangHostPool()
    b.register_mem_pool_host(host)
    n = b.batch_exists(keys)
    idx = torch.cat([torch.arange(t, t + host.page_size) for t in first_tokens[:n]]) if n else torch.zeros(0)
    res = b.batch_get_v1(keys[:n], idx)
    pages = [host.page(t).view(torch.int16).numpy() for t in first_tokens[:n]]  # plain arrays cross the queue
    b.close()
    return n, res, pages


# ---- LMCache (multiprocess mode, L2 native-plugin adapter) ---------------------

def lmcache_key(model, kv_rank, group, chunk_hash):
    """LMCache's native-connector wire format of an ObjectKey
    (model@kv_rank_hex8@group_hex@chunk_hash_hex)."""
    return f"{model}@{kv_rank:08x}@{group:x}@{chunk_hash.hex()}"


def lmcache_byte_array(t):
    """A MemoryObj's byte_array: a ctypes-backed byte memoryview over a
    tensor's storage (what LMCache hands a native plugin)."""
    import ctypes
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr()))


class LMCacheL2Adapter:
    """What LMCache's NativeConnectorL2Adapter does with a native plugin:
    submits under its lock (so the demux thread never sees an unknown future
    id), a demux thread polls the plugin's event fd (500 ms) and routes
    drain_completions() by future id to store / lookup / load results."""

    def __init__(self, client):
        import select
        import threading
        self.client = client
        self.fd = int(client.event_fd())
        self.lock = threading.Lock()
        self.pending, self.results = {}, {}
        self.done = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self.thread = threading.Thread(target=self._demux, daemon=True)
        self.thread.start()

    def _submit(self, op, fn, *a):
        with self.lock:
            fid = int(fn(*a))
            self.pending[fid] = op
        return fid

    def store(self, keys, tensors):
        return self._submit("store", self.client.submit_batch_set, keys, [lmcache_byte_array(t) for t in tensors])

    def lookup(self, keys):
        return self._submit("lookup", self.client.submit_batch_exists, keys)

    def load(self, keys, tensors):
        return self._submit("load", self.client.submit_batch_get, keys, [lmcache_byte_array(t) for t in tensors])

    def _demux(self):
        while not self.stop.is_set():
            if not self.poller.poll(500):
                continue
            comps = self.client.drain_completions()
            with self.lock:
                for fid, ok, err, per in comps:
                    op = self.pending.pop(int(fid), None)
                    assert op is not None, f"completion for unknown future id {fid}"
                    self.results[int(fid)] = (op, ok, err, per)
                self.done.notify_all()

    def wait(self, fid, timeout=60):
        with self.lock:
            assert self.done.wait_for(lambda: fid in self.results, timeout), f"future {fid} never completed"
            return self.results.pop(fid)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.client.close()


def lmcache_chunk(i, shape=(2, 4, 16, 2, 32)):
    """Chunk i's KV tensor (a KV_2LTD-like [2, layers, tokens, heads, head] bf16)."""
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def lmcache_other_host(uri, node, keys, present):
    """Another LMCache server (another host): lookup then load through its own plugin."""
    from cxlkv.integrations.lmcache import CxlkvNativePlugin
    a = LMCacheL2Adapter(CxlkvNativePlugin(pool=uri, node=node))
    try:
        _, ok, err, found = a.wait(a.lookup(keys))
        assert ok and err == "", err
        outs = [torch.zeros_like(lmcache_chunk(0)) for _ in keys]
        _, ok, err, loaded = a.wait(a.load(keys, outs))
        same = [bool(torch.equal(o, lmcache_chunk(i))) for i, o in zip(present, outs)]
        return found, ok, err, loaded, same
    finally:
        a.close()
