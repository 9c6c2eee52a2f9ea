# SPDX-License-Identifier: MIT
"""A small Llama-style model in plain PyTorch (random weights): RMSNorm, RoPE,
grouped-query attention over a paged KV cache, SwiGLU MLP.  The oracle of the
Python tests: logits computed on a prefix KV that went through the pool must
equal, bit for bit, the logits on the same prefix KV kept in process.

The paged cache comes in the engines' layouts (vLLM, block-first, SGLang
token pools); the model reads and writes it through per-layer
``[blocks, block_tokens, kv_heads, head]`` views, whatever the layout.
"""
import torch

import cxlkv


class Config:
    vocab = 97
    dim = 64
    layers = 3
    heads = 4
    kv_heads = 2
    head = 16
    hidden = 128
    rope_theta = 10000.0
    eps = 1e-5


class PagedCache:
    """KV cache of ``blocks`` blocks of ``bt`` tokens in one engine layout."""

    def __init__(self, layout, cfg, blocks, bt, dtype, device="cpu"):
        self.layout, self.bt, self.blocks = layout, bt, blocks
        L, H, D = cfg.layers, cfg.kv_heads, cfg.head
        z = dict(dtype=dtype, device=device)
        if layout == "vllm":
            self.raw = [torch.zeros(2, blocks, bt, H, D, **z) for _ in range(L)]
            self.views = [(t[0], t[1]) for t in self.raw]
            self.paged = cxlkv.PagedKV.vllm(self.raw)
        elif layout == "flashinfer":
            self.raw = [torch.zeros(blocks, 2, bt, H, D, **z) for _ in range(L)]
            self.views = [(t[:, 0], t[:, 1]) for t in self.raw]
            self.paged = cxlkv.PagedKV.vllm(self.raw, kv_dim=1)
        elif layout == "block_first":
            self.raw = torch.zeros(blocks, L, 2, bt, H, D, **z)
            self.views = [(self.raw[:, l, 0], self.raw[:, l, 1]) for l in range(L)]
            self.paged = cxlkv.PagedKV.block_first(self.raw)
        elif layout == "sglang":
            self.k = [torch.zeros(blocks * bt, H, D, **z) for _ in range(L)]
            self.v = [torch.zeros(blocks * bt, H, D, **z) for _ in range(L)]
            self.views = [(k.view(blocks, bt, H, D), v.view(blocks, bt, H, D)) for k, v in zip(self.k, self.v)]
            self.paged = cxlkv.PagedKV.sglang(self.k, self.v, bt)
        else:
            raise ValueError(layout)

    def write(self, layer, block_table, start, k, v):
        """Store k, v ([n, kv_heads, head]) of positions start.. into the cache."""
        K, V = self.views[layer]
        for i in range(k.shape[0]):
            p = start + i
            b, o = block_table[p // self.bt], p % self.bt
            K[b, o] = k[i]
            V[b, o] = v[i]

    def read(self, layer, block_table, n):
        """k, v of positions 0..n-1 ([n, kv_heads, head])."""
        K, V = self.views[layer]
        nb = (n + self.bt - 1) // self.bt
        ids = torch.tensor(block_table[:nb], device=K.device)
        k = K.index_select(0, ids).reshape(-1, *K.shape[2:])[:n]
        v = V.index_select(0, ids).reshape(-1, *V.shape[2:])[:n]
        return k, v


class TinyLlama(torch.nn.Module):
    def __init__(self, cfg, seed=1234, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.nn.Parameter((torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(dtype).to(device),
                                      requires_grad=False)

        c = cfg
        self.emb = w(c.vocab, c.dim)
        self.out = w(c.vocab, c.dim)
        self.norm_f = torch.nn.Parameter(torch.ones(c.dim, dtype=dtype, device=device), requires_grad=False)
        self.blocks = []
        for _ in range(c.layers):
            self.blocks.append(dict(
                n1=torch.ones(c.dim, dtype=dtype, device=device), n2=torch.ones(c.dim, dtype=dtype, device=device),
                wq=w(c.heads * c.head, c.dim), wk=w(c.kv_heads * c.head, c.dim), wv=w(c.kv_heads * c.head, c.dim),
                wo=w(c.dim, c.heads * c.head), w1=w(c.hidden, c.dim), w3=w(c.hidden, c.dim), w2=w(c.dim, c.hidden)))
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head, 2, dtype=torch.float32) / c.head))
        self.inv_freq = inv.to(device)

    def rms(self, x, wgt):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)).to(x.dtype) * wgt

    def rope(self, x, pos):
        f = pos.float()[:, None] * self.inv_freq[None, :]
        cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return out.to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens, start, cache, block_table, pre_layer=None, post_layer=None):
        """Logits of ``tokens`` at positions start.., attending to the cached
        positions 0..start-1 and to each other (causal); writes their KV.
        pre_layer(l) runs before layer l reads the cache, post_layer(l) after
        it wrote its KV (where vLLM calls wait_for_layer_load / save_kv_layer)."""
        c = self.cfg
        n = len(tokens)
        pos = torch.arange(start, start + n, device=self.emb.device)
        x = self.emb[torch.tensor(tokens, device=self.emb.device)]
        for l, b in enumerate(self.blocks):
            h = self.rms(x, b["n1"])
            q = (h @ b["wq"].T).view(n, c.heads, c.head)
            k = (h @ b["wk"].T).view(n, c.kv_heads, c.head)
            v = (h @ b["wv"].T).view(n, c.kv_heads, c.head)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if pre_layer:
                pre_layer(l)
            cache.write(l, block_table, start, k, v)
            if post_layer:
                post_layer(l)
            K, V = cache.read(l, block_table, start + n)
            rep = c.heads // c.kv_heads
            K = K.repeat_interleave(rep, dim=1)  # GQA: kv head j serves query heads j*rep..
            V = V.repeat_interleave(rep, dim=1)
            s = torch.einsum("qhd,khd->hqk", q.float(), K.float()) / c.head ** 0.5
            mask = torch.arange(start + n, device=x.device)[None, :] > pos[:, None]
            s = s.masked_fill(mask[None], float("-inf"))
            a = torch.einsum("hqk,khd->qhd", s.softmax(-1), V.float()).to(x.dtype).reshape(n, -1)
            x = x + a @ b["wo"].T
            h = self.rms(x, b["n2"])
            x = x + (torch.nn.functional.silu(h @ b["w1"].T) * (h @ b["w3"].T)) @ b["w2"].T
        return self.rms(x, self.norm_f) @ self.out.T


def prefill_and_publish(uri, node, layout, bt, dtype_name, prefix, block_table):
    """Another process: compute the prefix KV in its own cache and publish it."""
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    cfg = Config()
    model = TinyLlama(cfg, dtype=dtype)
    cache = PagedCache(layout, cfg, max(block_table) + 1, bt, dtype)
    model(prefix, 0, cache, block_table)
    pool = cxlkv.Pool(uri)
    kv = cxlkv.KvStore(pool, node)
    keys = cxlkv.block_keys(prefix, bt, extras=b"tiny-llama")
    st = kv.put(keys, cache.paged, block_table[: len(keys)])
    kv.close()
    pool.close()
    return st.tolist()
