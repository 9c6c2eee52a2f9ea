// SPDX-License-Identifier: MIT
// The near-memory engine's page-digest kernel (docs/near-memory.md "Pages and digests"): digests of
// KV that comes from a GPU are computed on the GPU, next to the data, before
// the pages go to the pool.  One thread block per (page, row), threads over
// head_dim; the per-thread code is cuda/pnm_digest_core.h, which the CPU
// reference in libcxlkv runs too.  Beside it the hybrid mode's GPU
// partial-attention kernel (docs/near-memory.md "Hybrid mode"): one thread per query head,
// per-thread code cuda/pnm_attend_core.h (output + log-sum-exp over the
// GPU-resident pages).  Simple and untuned; it has not run on a GPU yet
// (tests run its per-thread code on the CPU through a fake library).
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

#include "cuda/cxlkv_pnm_abi.h"
#include "cuda/pnm_attend_core.h"
#include "cuda/pnm_digest_core.h"

namespace pc = cxlkv::pnmcore;

namespace {

thread_local char g_pnm_error[512];

int pnm_fail(int err, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_pnm_error, sizeof g_pnm_error, fmt, ap);
  va_end(ap);
  return err;
}

__global__ void digest_kernel(cxlkv_pnm_digest_args a) {
  const uint64_t page = blockIdx.x;
  const uint32_t row = blockIdx.y;
  for (uint32_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) pc::digest_element(a, row, page, d);
}

const char* op_last_error() { return g_pnm_error; }

int op_digest(const cxlkv_pnm_digest_args* a, void* stream) {
  if (const char* why = pc::check_args(a)) return pnm_fail(-EINVAL, "pnm digest: %s", why);
  const uint32_t threads = a->head_dim < 256 ? ((a->head_dim + 31) / 32) * 32 : 256;
  const dim3 grid(static_cast<unsigned>(pc::npages(*a)), a->rows);
  digest_kernel<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(*a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return pnm_fail(e == cudaErrorNoDevice ? -ENODEV : -EIO, "pnm digest kernel launch: %s: %s", cudaGetErrorName(e),
                    cudaGetErrorString(e));
  return 0;
}

__global__ void attend_kernel(cxlkv_pnm_attend_args a) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < a.nq) pc::attend_query(a, i);
}

int op_attend(const cxlkv_pnm_attend_args* a, void* stream) {
  if (const char* why = pc::check_attend_args(a)) return pnm_fail(-EINVAL, "pnm attend: %s", why);
  const uint32_t threads = 64;
  attend_kernel<<<(a->nq + threads - 1) / threads, threads, 0, static_cast<cudaStream_t>(stream)>>>(*a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return pnm_fail(e == cudaErrorNoDevice ? -ENODEV : -EIO, "pnm attend kernel launch: %s: %s", cudaGetErrorName(e),
                    cudaGetErrorString(e));
  return 0;
}

const cxlkv_cuda_pnm_ops g_pnm_ops = {CXLKV_CUDA_PNM_ABI_VERSION, sizeof(cxlkv_cuda_pnm_ops), op_last_error,
                                      op_digest, op_attend};

}  // namespace

extern "C" __attribute__((visibility("default"))) const cxlkv_cuda_pnm_ops* cxlkv_cuda_pnm_get_ops(
    uint32_t abi_version) {
  return abi_version == CXLKV_CUDA_PNM_ABI_VERSION ? &g_pnm_ops : nullptr;
}
