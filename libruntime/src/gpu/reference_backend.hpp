// SPDX-License-Identifier: MIT
// The CPU reference implementation of the GPU copy kernels: the oracle.
// It runs the kernels' own per-thread code (cuda/copy_core.h) with thread
// blocks and threads emulated in loops, over the same descriptor formats, so
// a GPU test compares a kernel with exactly what it was meant to compute and
// a CPU test compares that with plain memcpy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/cxlkv_cuda_abi.h"

namespace cxlkv::gpu {

// Execute a copy batch: every descriptor's len bytes from src to dst
// (addresses are this process's pointers).
void reference_copy(const cxlkv_copy_desc* descs, size_t n);
// The same in a given launch shape (CXLKV_CUDA_SHAPE_*), emulating that
// shape's grid, threads and tiles exactly; 0 or -E2BIG.
int reference_copy_shaped(const cxlkv_copy_desc* descs, size_t n, uint32_t shape);

// Execute a sparse batch; -EINVAL when the list table is not a prefix sum
// over ntokens indices or piece_bytes is 0.
int reference_sparse_copy(const cxlkv_sparse_list* lists, size_t nlists, const uint32_t* tokens,
                          size_t ntokens, uint64_t piece_bytes);

// A function table with the library's ABI whose "device" is the CPU:
// device_alloc is malloc, host_register maps a range to itself, streams and
// events complete immediately, copy / sparse_copy run the reference.
const cxlkv_cuda_ops& reference_ops();

}  // namespace cxlkv::gpu
