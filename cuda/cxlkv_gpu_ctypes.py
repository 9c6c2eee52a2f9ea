#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Drive cxlkv's GPU C API from Python with ctypes (no build step, no cffi).

    python3 cuda/cxlkv_gpu_ctypes.py [--lib build/libruntime/libcxlkv.so] [--reference]

Prints what cxlkv_gpu_probe() says about this machine (exit 0 whether or not
a GPU is present).  With --reference it also runs a gather / scatter round
trip of a small paged KV cache through the CPU reference backend
(CXLKV_GPU_F_CPU_REFERENCE: "device pointers" are host memory), which shows
the structs and calls below are right.  With a GPU, pass device pointers
(e.g. torch.Tensor.data_ptr()) and torch.cuda.current_stream().cuda_stream
as the stream instead.
"""
import argparse
import ctypes as C
import mmap
import os
import sys

LAYER_FIRST = 0
F_CPU_REFERENCE = 1 << 0


class GpuLayout(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("kind", C.c_uint32),
        ("num_layers", C.c_uint32),
        ("num_kv_heads", C.c_uint32),
        ("head_size", C.c_uint32),
        ("block_tokens", C.c_uint32),
        ("elem_bytes", C.c_uint32),
        ("num_blocks", C.c_uint64),
        ("block_stride", C.c_uint64),
        ("tensors", C.POINTER(C.c_uint64)),
        ("ntensors", C.c_size_t),
    ]


class GpuOpts(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("flags", C.c_uint32),
        ("device", C.c_int32),
        ("pin_chunk_bytes", C.c_uint64),
    ]


def load(path):
    lib = C.CDLL(path)
    lib.cxlkv_gpu_probe.argtypes = [C.c_char_p, C.c_size_t]
    lib.cxlkv_gpu_probe.restype = C.c_int
    lib.cxlkv_last_error.restype = C.c_char_p
    lib.cxlkv_gpu_open.argtypes = [C.c_void_p, C.c_uint64, C.POINTER(GpuOpts), C.POINTER(C.c_void_p)]
    lib.cxlkv_gpu_open.restype = C.c_int
    lib.cxlkv_gpu_close.argtypes = [C.c_void_p]
    lib.cxlkv_gpu_pin_method.argtypes = [C.c_void_p]
    lib.cxlkv_gpu_pin_method.restype = C.c_char_p
    lib.cxlkv_gpu_layout_block_bytes.argtypes = [C.POINTER(GpuLayout)]
    lib.cxlkv_gpu_layout_block_bytes.restype = C.c_uint64
    for fn in (lib.cxlkv_gpu_gather, lib.cxlkv_gpu_scatter):
        fn.argtypes = [C.c_void_p, C.POINTER(GpuLayout), C.POINTER(C.c_uint64), C.POINTER(C.c_uint64),
                       C.c_size_t, C.c_void_p]
        fn.restype = C.c_int
    lib.cxlkv_gpu_sync.argtypes = [C.c_void_p, C.c_void_p]
    lib.cxlkv_gpu_sync.restype = C.c_int
    return lib


def check(lib, rc, what):
    if rc < 0:
        raise RuntimeError(f"{what}: {os.strerror(-rc)}: {lib.cxlkv_last_error().decode()}")


def reference_round_trip(lib):
    layers, heads, head, tokens, elem, blocks = 2, 2, 16, 4, 2, 8
    chunk = tokens * heads * head * elem
    # "GPU" tensors: host buffers, since the reference backend's device is the CPU.
    tensors = [C.create_string_buffer(bytes((i * 7 + j) % 251 for j in range(blocks * chunk)))
               for i in range(2 * layers)]
    ptrs = (C.c_uint64 * len(tensors))(*[C.addressof(t) for t in tensors])
    layout = GpuLayout(C.sizeof(GpuLayout), LAYER_FIRST, layers, heads, head, tokens, elem, blocks, 0, ptrs,
                       len(tensors))
    block_bytes = lib.cxlkv_gpu_layout_block_bytes(C.byref(layout))
    assert block_bytes == 2 * layers * chunk, block_bytes

    pool = mmap.mmap(-1, 1 << 20)  # page-aligned, like a pool mapping
    base = C.addressof(C.c_char.from_buffer(pool))
    opts = GpuOpts(C.sizeof(GpuOpts), F_CPU_REFERENCE, 0, 0)
    gpu = C.c_void_p()
    check(lib, lib.cxlkv_gpu_open(base, len(pool), C.byref(opts), C.byref(gpu)), "cxlkv_gpu_open")
    print(f"pinned by {lib.cxlkv_gpu_pin_method(gpu).decode()}")

    ids = (C.c_uint64 * 2)(5, 2)
    offs = (C.c_uint64 * 2)(0, 4 * block_bytes)
    check(lib, lib.cxlkv_gpu_gather(gpu, C.byref(layout), ids, offs, 2, None), "cxlkv_gpu_gather")
    check(lib, lib.cxlkv_gpu_sync(gpu, None), "cxlkv_gpu_sync")
    for i, bid in enumerate(ids):
        want = b"".join(t.raw[bid * chunk:(bid + 1) * chunk] for t in tensors)
        got = pool[offs[i]:offs[i] + block_bytes]
        assert got == want, f"pool block {i} differs from GPU block {bid}"

    back = (C.c_uint64 * 2)(0, 1)
    check(lib, lib.cxlkv_gpu_scatter(gpu, C.byref(layout), back, offs, 2, None), "cxlkv_gpu_scatter")
    for i in range(2):
        for t in tensors:
            assert t.raw[back[i] * chunk:(back[i] + 1) * chunk] == t.raw[ids[i] * chunk:(ids[i] + 1) * chunk]
    lib.cxlkv_gpu_close(gpu)
    del base
    print("reference round trip: ok")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=os.environ.get("CXLKV_LIB",
                                                    os.path.join(here, "..", "build", "libruntime", "libcxlkv.so")))
    ap.add_argument("--reference", action="store_true", help="also run a round trip on the CPU reference backend")
    args = ap.parse_args()
    lib = load(args.lib)
    msg = C.create_string_buffer(512)
    rc = lib.cxlkv_gpu_probe(msg, len(msg))
    state = "GPU ready" if rc == 0 else f"no GPU path ({os.strerror(-rc)})"
    print(f"cxlkv_gpu_probe: {rc} {state}: {msg.value.decode()}")
    if args.reference:
        reference_round_trip(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
