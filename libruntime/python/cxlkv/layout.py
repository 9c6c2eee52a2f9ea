# SPDX-License-Identifier: MIT
"""Engine KV memory described for transfers: paged caches (PyTorch tensors on
the CPU or CUDA, NumPy arrays) and plain per-block buffers.

A pool block always holds one engine block in the engine-independent order of
``cxlkv/layout.hpp``: for each layer, its K slice then its V slice, each
``[block_tokens, num_kv_heads, head_size]`` in C order.  So a block published
from one layout (vLLM's per-layer ``[2, blocks, tokens, heads, head]``) reads
back into any other (SGLang's per-layer token buffers, a block-first tensor)
and through either the CPU path or the GPU path.

The chunk list of a batch (the gather / scatter list handed to the C batch
calls) is computed with NumPy from a per-layout template: one vector operation
per batch, no Python loop per block.
"""
import ctypes as C

import numpy as np

from . import _lib

CHUNK_DTYPE = np.dtype([("addr", "<u8"), ("len", "<u8")])


def tensor_info(x):
    """(address, shape, byte strides, item size, is_cuda) of a PyTorch tensor,
    a NumPy array or a buffer (bytes, bytearray, memoryview)."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):
        e = x.element_size()
        return x.data_ptr(), tuple(x.shape), tuple(s * e for s in x.stride()), e, bool(x.is_cuda)
    if not isinstance(x, np.ndarray):
        x = np.frombuffer(x, dtype=np.uint8)
    return x.ctypes.data, tuple(x.shape), tuple(x.strides), x.itemsize, False


def is_writable(x):
    """Whether a transfer may write into ``x``: False for ``bytes``, read-only
    NumPy arrays and read-only memoryviews (a get into them would change an
    immutable object under Python); tensors are writable."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):
        return True
    if isinstance(x, np.ndarray):
        return bool(x.flags.writeable)
    if isinstance(x, memoryview):
        return not x.readonly
    if isinstance(x, bytearray):
        return True
    try:
        return not memoryview(x).readonly
    except TypeError:
        return False


def _runs(shape, strides, itemsize):
    """Byte offsets and length of the contiguous runs of a strided view, in C
    order of its elements."""
    run = itemsize
    i = len(shape) - 1
    while i >= 0 and (shape[i] == 1 or strides[i] == run):
        run *= shape[i]
        i -= 1
    offs = np.zeros(1, dtype=np.int64)
    for d in range(i + 1):
        offs = (offs[:, None] + np.arange(shape[d], dtype=np.int64)[None, :] * strides[d]).reshape(-1)
    return offs, run


class PagedKV:
    """A paged KV cache: ``num_blocks`` blocks of ``block_tokens`` tokens, per
    layer a K and a V slice ``[block_tokens, num_kv_heads, head_size]``.

    Build it with one of the constructors: :meth:`layer_first` (a K and a V
    tensor per layer), :meth:`block_first` (one tensor), :meth:`vllm`,
    :meth:`sglang`.  Tensors may be views with any strides; they must stay
    alive (the object keeps references)."""

    def __init__(self, sources, keep, kind_hint=None):
        # sources: per (layer, K|V) in pool order:
        #   (address of block 0, block stride bytes, inner shape, inner strides, itemsize, is_cuda, num_blocks)
        self._keep = keep
        #: False when a source is read-only (a NumPy view of bytes, ...): loads into it are refused.
        self.writable = all(is_writable(t) for t in keep)
        s0 = sources[0]
        self.num_layers = len(sources) // 2
        # Inner shape [tokens, heads, head], or [..., tokens, heads, head] when
        # an engine splits a block into several kernel blocks (the leading
        # dims, in C order, are the block's tokens).
        *tok, self.num_kv_heads, self.head_size = s0[2]
        self.block_tokens = int(np.prod(tok))
        self.elem_bytes = s0[4]
        self.num_blocks = min(s[6] for s in sources)
        self.is_cuda = s0[5]
        for s in sources:
            if s[2] != s0[2] or s[4] != s0[4] or s[5] != s0[5]:
                raise ValueError("cxlkv: every layer's K and V must have the same block shape, dtype and device")
        self._sources = sources
        self.chunk_bytes = self.block_tokens * self.num_kv_heads * self.head_size * self.elem_bytes
        self.block_bytes = 2 * self.num_layers * self.chunk_bytes
        offs, strides, lens = [], [], []
        for base, bstride, shape, st, e, _, _ in sources:
            o, run = _runs(shape, st, e)
            offs.append(o + base)
            strides.append(np.full(o.size, bstride, dtype=np.int64))
            lens.append(np.full(o.size, run, dtype=np.uint64))
        self._offs = np.concatenate(offs)
        self._strides = np.concatenate(strides)
        self._lens = np.concatenate(lens)
        self.chunks_per_block = self._offs.size
        self._kind_hint = kind_hint
        # Chunk lists of recent block-id lists (engines reuse their block ids):
        # (chunks, counts, chunks address, counts address), read-only.
        self._chunk_cache = {}
        self._paged = None  # paged_chunks(), made on first use

    _CHUNK_CACHE_MAX = 256

    # ---- constructors -----------------------------------------------------
    @classmethod
    def layer_first(cls, layers):
        """``layers``: a list of (K, V), each ``[num_blocks, block_tokens, heads, head]``, or
        ``[num_blocks, kernel_blocks, kernel_tokens, heads, head]`` (an engine block split into
        kernel blocks: its tokens in that order)."""
        sources, keep = [], []
        for k, v in layers:
            for t in (k, v):
                p, shape, st, e, cuda = tensor_info(t)
                if len(shape) < 4:
                    raise ValueError(f"cxlkv: layer tensor must be [blocks, tokens, heads, head] (or "
                                     f"[blocks, ..., tokens, heads, head]), got {shape}")
                sources.append((p, st[0], shape[1:], st[1:], e, cuda, shape[0]))
                keep.append(t)
        if not sources:
            raise ValueError("cxlkv: no layers")
        return cls(sources, keep, "layer_first")

    @classmethod
    def block_first(cls, t):
        """``t``: ``[num_blocks, layers, 2, block_tokens, heads, head]``."""
        p, shape, st, e, cuda = tensor_info(t)
        if len(shape) != 6 or shape[2] != 2:
            raise ValueError(f"cxlkv: block-first tensor must be [blocks, layers, 2, tokens, heads, head], got {shape}")
        sources = [(p + l * st[1] + kv * st[2], st[0], shape[3:], st[3:], e, cuda, shape[0])
                   for l in range(shape[1]) for kv in range(2)]
        return cls(sources, [t], "block_first")

    @classmethod
    def vllm(cls, kv_caches, kv_dim=0):
        """vLLM's per-layer caches (a list, or a dict in layer order): each
        ``[2, num_blocks, block_size, heads, head]`` (FlashAttention, kv_dim=0)
        or ``[num_blocks, 2, block_size, heads, head]`` (FlashInfer, kv_dim=1)."""
        if isinstance(kv_caches, dict):
            kv_caches = list(kv_caches.values())
        if kv_dim == 0:
            return cls.layer_first([(t[0], t[1]) for t in kv_caches])
        return cls.layer_first([(t[:, 0], t[:, 1]) for t in kv_caches])

    @classmethod
    def sglang(cls, k_buffers, v_buffers, page_size):
        """SGLang's MHA token pools: per layer ``[num_tokens, heads, head]`` K
        and V buffers; a block is a page of ``page_size`` tokens."""
        layers = []
        for k, v in zip(k_buffers, v_buffers):
            n = k.shape[0] // page_size
            layers.append((k[: n * page_size].reshape(n, page_size, *k.shape[1:]),
                           v[: n * page_size].reshape(n, page_size, *v.shape[1:])))
        return cls.layer_first(layers)

    # ---- transfers ---------------------------------------------------------
    def chunks(self, block_ids):
        """(chunk array, per-block chunk counts) of GPU/engine blocks
        ``block_ids``, in pool order (read-only arrays)."""
        ch, counts, _, _ = self.chunk_args(block_ids)
        return ch, counts

    def chunk_args(self, block_ids):
        """(chunks, counts, address of chunks, address of counts) for the C
        batch calls.  Built with NumPy from the per-layout template; the
        last few hundred distinct block-id lists are kept, so an engine that
        reuses its block ids pays one dict lookup per batch."""
        ids = np.asarray(block_ids)
        if ids.dtype.kind not in "iu" and ids.size:
            raise TypeError(f"cxlkv: block ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=False).reshape(-1)
        key = ids.tobytes()
        hit = self._chunk_cache.get(key)
        if hit is not None:
            return hit
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise IndexError(f"cxlkv: block id out of range 0..{self.num_blocks - 1}")
        ch = np.empty((ids.size, self.chunks_per_block), dtype=CHUNK_DTYPE)
        ch["addr"] = (self._offs[None, :] + ids[:, None] * self._strides[None, :]).view(np.uint64)
        ch["len"] = self._lens[None, :]
        ch = ch.reshape(-1)
        counts = np.full(ids.size, self.chunks_per_block, dtype=np.uint32)
        ch.flags.writeable = False
        counts.flags.writeable = False
        out = (ch, counts, ch.ctypes.data, counts.ctypes.data)
        if len(self._chunk_cache) >= self._CHUNK_CACHE_MAX:
            self._chunk_cache.pop(next(iter(self._chunk_cache)))  # the oldest entry
        self._chunk_cache[key] = out
        return out

    def paged_chunks(self):
        """The ``struct cxlkv_paged_chunks`` of this layout (CPU): the per-block
        template the engine-step calls build chunk lists from in C."""
        if self._paged is None:
            arrays = (np.ascontiguousarray(self._offs).view(np.uint64), np.ascontiguousarray(self._strides),
                      np.ascontiguousarray(self._lens))
            st = _lib.PagedChunks(C.sizeof(_lib.PagedChunks), self.chunks_per_block, arrays[0].ctypes.data,
                                  arrays[1].ctypes.data, arrays[2].ctypes.data, self.num_blocks)
            self._paged = (st, arrays)
        return self._paged[0]

    def block_id_array(self, block_ids):
        """``block_ids`` as a uint64 array for the GPU calls: integers in
        0 .. num_blocks-1, else TypeError / IndexError."""
        ids = np.asarray(block_ids)
        if ids.dtype.kind not in "iu" and ids.size:
            raise TypeError(f"cxlkv: block ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=False).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise IndexError(f"cxlkv: block id out of range 0..{self.num_blocks - 1}")
        return np.ascontiguousarray(ids, dtype=np.uint64)

    def gpu_layout(self):
        """A ``struct cxlkv_gpu_layout`` for the GPU path (and the layout's
        tensor-pointer array, to keep alive)."""
        contiguous = all(_runs(s[2], s[3], s[4])[1] == self.chunk_bytes for s in self._sources)
        if not contiguous:
            raise ValueError("cxlkv: the GPU path needs each block's K and V slices contiguous")
        s = self._sources
        if self._kind_hint == "block_first" and all(
                x[0] == s[0][0] + i * self.chunk_bytes and x[1] == s[0][1] for i, x in enumerate(s)):
            kind, ptrs, stride = _lib.GPU_LAYOUT_BLOCK_FIRST, [s[0][0]], s[0][1]
        else:
            if len({x[1] for x in s}) != 1:
                raise ValueError("cxlkv: the GPU path needs one block stride for every layer tensor")
            kind, ptrs, stride = _lib.GPU_LAYOUT_LAYER_FIRST, [x[0] for x in s], s[0][1]
        arr = (C.c_uint64 * len(ptrs))(*ptrs)
        lay = _lib.GpuLayout(C.sizeof(_lib.GpuLayout), kind, self.num_layers, self.num_kv_heads, self.head_size,
                             self.block_tokens, self.elem_bytes, self.num_blocks, stride, arr, len(ptrs))
        return lay, arr


def buffer_chunks(buffers, writable=False):
    """(chunk array, counts, total bytes per block) for one contiguous buffer
    per block (tensors, arrays, bytearray, memoryview); every buffer is one
    chunk.  ``writable``: the transfer writes into the buffers (a get), so a
    read-only one is refused."""
    ch = np.empty(len(buffers), dtype=CHUNK_DTYPE)
    sizes = np.empty(len(buffers), dtype=np.uint64)
    for i, b in enumerate(buffers):
        try:
            p, shape, st, e, cuda = tensor_info(b)
        except (TypeError, ValueError, BufferError) as err:
            raise TypeError(f"cxlkv: buffer {i} ({type(b).__name__}) is not a contiguous tensor, array or "
                            f"bytes-like object: {err}") from None
        if cuda:
            raise ValueError("cxlkv: CUDA tensors go through a PagedKV and the GPU path")
        if writable and not is_writable(b):
            raise ValueError(f"cxlkv: buffer {i} ({type(b).__name__}) is read-only; a get writes into its buffers "
                             "(pass a bytearray, a writable array or a tensor)")
        o, run = _runs(shape, st, e)
        n = int(np.prod(shape)) * e
        if o.size != 1 and n:
            raise ValueError(f"cxlkv: buffer {i} is not contiguous")
        ch[i] = (p, n)
        sizes[i] = n
    return ch, np.ones(len(buffers), dtype=np.uint32), sizes


class RawChunks:
    """A caller-made chunk list: ``per_block`` consecutive (address, length)
    pieces make one block (e.g. SGLang's ``get_page_buffer_meta`` pointers:
    the K and V pieces of each page).  Every block must total the same bytes."""

    def __init__(self, addrs, lens, per_block):
        a = np.asarray(addrs, dtype=np.uint64).reshape(-1)
        ln = np.broadcast_to(np.asarray(lens, dtype=np.uint64), a.shape)
        if per_block <= 0 or a.size % per_block:
            raise ValueError(f"cxlkv: {a.size} pieces do not split into blocks of {per_block}")
        self.nblocks = a.size // per_block
        self.chunks = np.empty(a.size, dtype=CHUNK_DTYPE)
        self.chunks["addr"] = a
        self.chunks["len"] = ln
        sizes = ln.reshape(self.nblocks, per_block).sum(axis=1) if self.nblocks else np.zeros(0, np.uint64)
        if sizes.size and (sizes != sizes[0]).any():
            raise ValueError("cxlkv: blocks of one RawChunks must have the same size")
        self.block_bytes = int(sizes[0]) if sizes.size else 0
        self.counts = np.full(self.nblocks, per_block, dtype=np.uint32)

    def __len__(self):
        return self.nblocks

    def __getitem__(self, sl):
        """The blocks of a slice (a new RawChunks)."""
        per = int(self.counts[0]) if self.nblocks else 1
        idx = range(self.nblocks)[sl]
        if not len(idx):
            return RawChunks([], [], per)
        lo, hi = idx[0] * per, (idx[-1] + 1) * per
        return RawChunks(self.chunks["addr"][lo:hi], self.chunks["len"][lo:hi], per)
