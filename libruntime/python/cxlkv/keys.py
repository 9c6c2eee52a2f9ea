# SPDX-License-Identifier: MIT
"""Block keys: 128-bit names of KV blocks.

Two sources, one representation (a NumPy array of shape (n, 2), dtype
uint64, columns (lo, hi), the layout of ``struct cxlkv_kv_key``):

* ``block_keys(tokens, block_tokens, extras)`` -- keys from token ids, computed
  by the C library (``cxlkv_kv_block_keys``), so they are the same keys as
  every C, C++ and Python caller on every host computes:
  ``key_i = XXH3_128(key_{i-1} || tokens_i (u32 LE) || extras, seed "cxlkvkey")``.

* ``keys_from_hashes(hashes, namespace)`` -- keys from an engine's own block
  hashes (vLLM's ``request.block_hashes``, SGLang's hex page hashes,
  LMCache's chunk hashes).  Engine hashes are already chained by the engine,
  so each maps on its own (a suffix of a chain maps to a suffix of keys):

      key = BLAKE2b(digest_size=16, person=b"cxlkv-ekey-v1",
                    data = u32le(len(ns)) || ns || tag || payload)

  where ``ns`` is the namespace bytes (model, dtype, tensor-parallel rank: use
  :func:`namespace`), and (tag, payload) is (b"b", the bytes) for bytes-like
  hashes, (b"s", UTF-8) for str, (b"i", 32-byte little-endian two's
  complement) for int; objects with a ``hash_value`` attribute (older vLLM
  ``BlockHash`` tuples) use it.  The digest's bytes 0..7 are ``lo`` and 8..15
  ``hi`` (little-endian); the all-zero key is reserved and becomes lo = 1.
  The C library computes them (``cxlkv_kv_engine_keys``), as it does
  ``block_keys``.
"""
import array
import ctypes as C

import numpy as np

from . import _lib

KEY_DTYPE = np.uint64


def empty(n):
    """An (n, 2) uint64 key array."""
    return np.zeros((n, 2), dtype=KEY_DTYPE)


_KEY_FORMS = ("block keys are 128-bit unsigned ints, 32-hex-digit strings or (lo, hi) pairs of 64-bit ints, "
              "or an (n, 2) integer array; map an engine's block hashes with cxlkv.keys_from_hashes")
_U64_MAX = (1 << 64) - 1


def _word(v, i, what):
    """One 64-bit half of key ``i``: a Python int 0 .. 2**64-1 (a negative
    one is refused, as a 128-bit int key is, not wrapped), or a NumPy integer
    (a signed one is taken as its two's-complement bits, as the rows of an
    int64 array or PyTorch tensor hold them)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"cxlkv: key {i}: {what} is a {type(v).__name__}; {_KEY_FORMS}")
    bits = isinstance(v, np.signedinteger)
    v = int(v)
    if not (-(1 << 63) if bits else 0) <= v <= _U64_MAX:
        raise ValueError(f"cxlkv: key {i}: {what} {v} is outside 0 .. 2**64-1 (64 bits, unsigned)")
    return v & _U64_MAX


def as_keys(keys):
    """Convert keys to a C-contiguous (n, 2) uint64 array.

    Accepts such an array (any integer dtype; int64 values are taken as
    their bits), a PyTorch integer tensor of shape (n, 2), or a sequence of
    128-bit ints, of 32-hex-digit strings (hi then lo, as ``cxlkvctl`` prints
    them) or of (lo, hi) pairs.  Anything else raises TypeError / ValueError
    naming the key and the accepted forms (floats, bytes and None are never
    silently converted)."""
    if hasattr(keys, "detach") and hasattr(keys, "numpy"):  # a torch tensor
        keys = keys.detach().cpu().numpy()
    if isinstance(keys, np.ndarray):
        if keys.dtype.kind not in "iu":
            raise TypeError(f"cxlkv: key array of dtype {keys.dtype}; {_KEY_FORMS}")
        a = np.ascontiguousarray(keys, dtype=KEY_DTYPE)
        if a.ndim == 1 and a.size == 2:
            a = a.reshape(1, 2)
        if a.ndim != 2 or a.shape[1] != 2:
            raise ValueError(f"cxlkv: key array must have shape (n, 2), got {keys.shape}")
        return a
    if keys is None or isinstance(keys, (str, bytes, bytearray, memoryview)) or not hasattr(keys, "__len__"):
        raise TypeError(f"cxlkv: keys must be a sequence of keys or an (n, 2) array, got {type(keys).__name__}")
    out = empty(len(keys))
    for i, k in enumerate(keys):
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            k = int(k)
            if k < 0 or k >> 128:
                raise ValueError(f"cxlkv: key {i} ({k}) is not a 128-bit unsigned int")
            out[i, 0], out[i, 1] = k & _U64_MAX, k >> 64
        elif isinstance(k, str):
            try:
                if len(k) != 32:
                    raise ValueError
                v = int(k, 16)
            except ValueError:
                raise ValueError(f"cxlkv: key {i} ({k!r}) is not 32 hex digits") from None
            out[i, 0], out[i, 1] = v & _U64_MAX, v >> 64
        elif isinstance(k, (tuple, list, np.ndarray)) and len(k) == 2:
            out[i, 0], out[i, 1] = _word(k[0], i, "lo"), _word(k[1], i, "hi")
        else:
            raise TypeError(f"cxlkv: key {i} is a {type(k).__name__}"
                            f"{f' of length {len(k)}' if hasattr(k, '__len__') else ''}; {_KEY_FORMS}")
    return out


def to_int(key):
    """One key (a row of a key array) as a 128-bit int."""
    return int(key[0]) | (int(key[1]) << 64)


def to_hex(key):
    """One key as 32 hex digits, hi then lo (the text form of cxlkvctl)."""
    return f"{int(key[1]):016x}{int(key[0]):016x}"


def _key_ptr(a):
    return a.ctypes.data_as(C.POINTER(_lib.KvKey))


def block_keys(tokens, block_tokens, extras=b""):
    """Chained keys of the full blocks of ``tokens`` (ints, a NumPy array or a
    tensor of token ids, each < 2**32), ``block_tokens`` per block, with
    ``extras`` bytes (model id, LoRA id, salt) hashed into every block.
    The same keys as ``cxlkv_kv_block_keys`` / ``cxlkv::block_keys``."""
    if hasattr(tokens, "detach"):
        tokens = tokens.detach().cpu().numpy()
    t = np.asarray(tokens)
    if t.size and t.dtype.kind not in "iu":
        # np.asarray(..., int64) truncated 1.7 to 1 and hashed other tokens than given
        raise TypeError(f"cxlkv: token ids must be integers, got dtype {t.dtype}")
    t = np.ascontiguousarray(t, dtype=np.int64)
    if t.ndim != 1:
        raise ValueError("cxlkv: tokens must be one-dimensional")
    if t.size and (t.min() < 0 or t.max() > 0xFFFFFFFF):
        raise ValueError("cxlkv: token ids must be in 0 .. 2**32-1")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, (int, np.integer)):
        raise TypeError(f"cxlkv: block_tokens must be an int, got {type(block_tokens).__name__}")
    if block_tokens <= 0:
        raise ValueError("cxlkv: block_tokens must be positive")
    t = t.astype(np.uint32)
    ex = bytes(extras)
    n = t.size // block_tokens  # a trailing partial block has no key
    out = empty(n)
    if n == 0:
        return out
    exbuf = C.create_string_buffer(ex, len(ex)) if ex else None
    rc = _lib.lib().cxlkv_kv_block_keys(t.ctypes.data_as(C.POINTER(C.c_uint32)), n * block_tokens,
                                         block_tokens, exbuf, len(ex), _key_ptr(out), n)
    _lib.check(rc, "cxlkv_kv_block_keys")
    return out[:rc]


def namespace(model="", dtype="", tp_rank=0, tp_size=1, extra="", **parts):
    """Namespace bytes for :func:`keys_from_hashes`: keys of different models,
    KV dtypes or shards never meet.  ``dtype`` is the dtype of the KV cache
    (not of the model's weights: fp8 and bf16 KV of one model differ).
    ``parts`` name everything else that changes the bytes of a block: other
    ranks (``pp="1/2"``, ``pcp=...``, ``dcp=...``, ``attn_cp=...``), the
    engine's page layout (``layout="page_first"``), the block size.  They
    are written sorted by name, so the order of the arguments does not
    matter; a part that is None is left out."""
    tail = "".join(f"{k}={v};" for k, v in sorted(parts.items()) if v is not None)
    return f"model={model};dtype={dtype};tp={tp_rank}/{tp_size};{tail}{extra}".encode()


def _encode_hash(h):
    if hasattr(h, "hash_value"):
        h = h.hash_value
    if isinstance(h, (bytes, bytearray, memoryview)):
        return b"b" + bytes(h)
    if isinstance(h, str):
        return b"s" + h.encode()
    if isinstance(h, (int, np.integer)):
        return b"i" + int(h).to_bytes(32, "little", signed=True)
    raise TypeError(f"cxlkv: cannot hash a block hash of type {type(h).__name__}")


def _encode_all(hashes):
    """(items, lengths): the encoded hashes one after the other and the
    length of each (uint32), for ``cxlkv_kv_engine_keys``."""
    if all(type(h) is bytes for h in hashes):  # vLLM's block hashes: one join, no loop per hash
        lens = np.fromiter(map(len, hashes), dtype=np.uint32, count=len(hashes)) + 1
        return b"b" + b"b".join(hashes), lens
    enc = [_encode_hash(h) for h in hashes]
    return b"".join(enc), np.fromiter(map(len, enc), dtype=np.uint32, count=len(enc))


def encode_items(hashes, parents=()):
    """(items, lengths) of ``hashes`` and then ``parents`` for the engine-step
    calls (``cxlkv_kv_engine_put_chains``): a parent None is an empty item
    (a root).  The lengths are an ``array.array("I")``: an engine step's
    few dozen items cost a numpy call more than they cost in Python, and
    such calls run cold between an engine's forward passes."""
    # map() and set() keep the per-hash work in C: an engine's hashes are
    # bytes of one length (vLLM's: 32).
    if set(map(type, hashes)) <= {bytes} and all(p is None or type(p) is bytes for p in parents):
        sizes = set(map(len, hashes))
        if len(sizes) == 1:
            lens = array.array("I", [sizes.pop() + 1]) * len(hashes)
        else:
            lens = array.array("I", [len(h) + 1 for h in hashes])
        lens.extend([len(p) + 1 if p is not None else 0 for p in parents])
        head = b"b" + b"b".join(hashes) if hashes else b""
        return head + b"".join(b"b" + p for p in parents if p is not None), lens
    enc = [_encode_hash(h) for h in hashes] + [_encode_hash(p) if p is not None else b"" for p in parents]
    return b"".join(enc), array.array("I", [len(e) for e in enc])


_engine_keys_fn = None


def _engine_keys():
    global _engine_keys_fn
    if _engine_keys_fn is None:
        # A call of microseconds, made with the GIL held (PyDLL): a CDLL
        # call gives the GIL up and must take it back, which in an engine
        # process with busy Python threads may wait a switch interval.
        lib = _lib.lib()
        f = C.PyDLL(lib._name, handle=lib._handle)["cxlkv_kv_engine_keys"]
        f.restype = C.c_int
        f.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_void_p]
        _engine_keys_fn = f
    return _engine_keys_fn


def engine_key(h, ns=b""):
    """The 128-bit key (lo, hi) of one engine block hash (see the module doc)."""
    k = keys_from_hashes([h], ns)[0]
    return int(k[0]), int(k[1])


def keys_from_hashes(hashes, namespace=b""):
    """Keys (an (n, 2) array) of an engine's block hashes, see the module doc.
    Hashed by the C library (``cxlkv_kv_engine_keys``) in one call: the
    namespace once, then one short BLAKE2b per hash (in Python each key cost
    about a microsecond, a share of an engine's per-block budget)."""
    ns = bytes(namespace)
    if not isinstance(hashes, (list, tuple)):
        hashes = list(hashes)
    out = empty(len(hashes))
    if not len(hashes):
        return out
    items, lens = _encode_all(hashes)
    _lib.check(_engine_keys()(ns, len(ns), items, len(items), lens.ctypes.data, len(hashes), out.ctypes.data),
               "cxlkv_kv_engine_keys")
    return out
