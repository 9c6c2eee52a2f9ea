// SPDX-License-Identifier: MIT
// Digests of KV that comes from a GPU (docs/near-memory.md "Pages and digests"): the pnm digest
// kernel of libcxlkv-cuda.so (cuda/pnm_digest.cu), or its CPU reference with
// the stand-in library, and Context::append_gpu, which moves the pages to
// the pool and publishes them with those digests.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "cuda/cxlkv_cuda_abi.h"
#include "cuda/cxlkv_pnm_abi.h"
#include "cuda/pnm_attend_core.h"
#include "cuda/pnm_digest_core.h"
#include "cxlkv/gpu.hpp"
#include "cxlkv/pnm.hpp"
#include "cxlkv/region.hpp"

namespace cxlkv::pnm {

namespace {

// The kernel's per-thread code, threads emulated in loops.
void reference_digest(const cxlkv_pnm_digest_args& a) {
  const uint64_t np = pnmcore::npages(a);
  for (uint32_t r = 0; r < a.rows; r++)
    for (uint64_t p = 0; p < np; p++)
      for (uint32_t d = 0; d < a.head_dim; d++) pnmcore::digest_element(a, r, p, d);
}

// The pnm table of the CUDA library `path` (already loaded by CudaLibrary).
Result<const cxlkv_cuda_pnm_ops*> pnm_ops_of(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return Error(-ENOENT, "pnm digest: " + path + " is not loaded");
  auto get = reinterpret_cast<cxlkv_cuda_pnm_get_ops_fn>(dlsym(h, CXLKV_CUDA_PNM_ENTRY));
  dlclose(h);  // CudaLibrary keeps its own reference
  if (!get) return Error(-ENOSYS, "pnm digest: " + path + " has no " CXLKV_CUDA_PNM_ENTRY " (built without it)");
  const cxlkv_cuda_pnm_ops* ops = get(CXLKV_CUDA_PNM_ABI_VERSION);
  if (!ops || ops->size < offsetof(cxlkv_cuda_pnm_ops, attend))  // digest at least; attend is checked at use
    return Error(-EPROTO, "pnm digest: " + path + " speaks another pnm ABI version");
  return ops;
}

}  // namespace

namespace testing {
const cxlkv_cuda_pnm_ops*& pnm_ops_override() {
  static const cxlkv_cuda_pnm_ops* o = nullptr;
  return o;
}
}  // namespace testing

namespace detail {
Result<const cxlkv_cuda_pnm_ops*> pnm_ops(gpu::CudaLibrary& lib) {
  if (testing::pnm_ops_override()) return testing::pnm_ops_override();
  return pnm_ops_of(lib.path());
}

void reference_attend(const cxlkv_pnm_attend_args& a) {
  for (uint32_t i = 0; i < a.nq; i++) pnmcore::attend_query(a, i);
}
}  // namespace detail

Result<void> gpu_digests(gpu::CudaLibrary& lib, Dtype dtype, uint64_t k_dev, uint64_t out_dev, uint32_t rows,
                         uint64_t ntokens, uint32_t head_dim, uint32_t page_tokens, void* stream) {
  const cxlkv_pnm_digest_args a{k_dev, out_dev, ntokens, rows, head_dim, page_tokens, static_cast<uint32_t>(dtype)};
  if (const char* why = pnmcore::check_args(&a)) return Error(-EINVAL, std::string("pnm digest: ") + why);
  if (lib.is_reference()) {
    reference_digest(a);
    return {};
  }
  auto ops = detail::pnm_ops(lib);
  if (!ops.ok()) return ops.error();
  if (int rc = (*ops)->digest(&a, stream); rc < 0) return Error(rc, (*ops)->last_error());
  return {};
}

Result<void> Context::append_gpu(gpu::GpuPool& gp, uint64_t k_dev, uint64_t v_dev, uint32_t n, void* stream) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string C = "pool " + region_->uri() + ": pnm context " + std::to_string(request_id_) + ": append_gpu: ";
  if (!writable_) return Error(-EPERM, C + "read-only handle");
  const uint32_t pt = geo_.page_tokens;
  if (tokens_ % pt) return Error(-EINVAL, C + "the last page is partial (" + std::to_string(tokens_) + " tokens)");
  if (n == 0) return {};
  if (!k_dev || !v_dev) return Error(-EINVAL, C + "K or V device pointer is 0");
  const uint32_t np = (n + pt - 1) / pt;
  if (tokens_ / pt + np > max_pages_)
    return Error(-ENOSPC, C + std::to_string(n) + " tokens after " + std::to_string(tokens_) +
                              " exceed the capacity of " + std::to_string(uint64_t(max_pages_) * pt));
  if (reinterpret_cast<uint64_t>(gp.pin().base()) > reinterpret_cast<uint64_t>(region_->base()) ||
      reinterpret_cast<uint64_t>(region_->base()) + region_->size() >
          reinterpret_cast<uint64_t>(gp.pin().base()) + gp.pin().size())
    return Error(-ERANGE, C + "the GPU pool does not cover the context's pool mapping");
  const uint64_t pin_delta = reinterpret_cast<uint64_t>(region_->base()) - reinterpret_cast<uint64_t>(gp.pin().base());
  const size_t es = dtype_size(geo_.dtype);
  const uint64_t row = uint64_t(geo_.head_dim) * es;
  const uint32_t rows = geo_.layers * geo_.kv_heads;

  // Pages from the partition heap.
  std::vector<uint64_t> offs(np);
  for (uint32_t p = 0; p < np; p++) {
    auto off = store_->heap_alloc(page_bytes());
    if (!off.ok()) return Error(-ENOSPC, C + off.error().message());
    offs[p] = *off;
  }
  CXLKV_TRY(store_->write_part());
  // GPU -> pool: one descriptor per (page, layer, K|V, head) piece.
  std::vector<cxlkv_copy_desc> descs;
  std::vector<gpu::DevicePiece> pieces;
  for (uint32_t p = 0; p < np; p++) {
    const uint32_t nt = std::min<uint32_t>(pt, n - p * pt);
    for (uint32_t l = 0; l < geo_.layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < geo_.kv_heads; h++) {
          const uint64_t src = (kv ? v_dev : k_dev) + ((uint64_t(l) * geo_.kv_heads + h) * n + uint64_t(p) * pt) * row;
          const uint64_t dst = offs[p] + ((uint64_t(l) * 2 + kv) * geo_.kv_heads + h) * pt * row;
          pieces.clear();
          CXLKV_TRY(gp.pin().to_device(dst + pin_delta, nt * row, pieces));
          uint64_t done = 0;
          for (const auto& pc : pieces) {
            descs.push_back(cxlkv_copy_desc{src + done, pc.dev, pc.len});
            done += pc.len;
          }
        }
  }
  CXLKV_TRY(gp.copy(descs, stream));
  // Digests on the GPU into a device buffer, then to the host.
  const uint64_t dbytes = uint64_t(rows) * np * 2 * row;
  auto& ops = gp.library().ops();
  void* ddev = nullptr;
  if (int rc = ops.device_alloc(&ddev, dbytes); rc < 0) return Error(rc, C + "digest buffer: " + ops.last_error());
  struct Free {
    const cxlkv_cuda_ops& o;
    void* p;
    ~Free() { o.device_free(p); }
  } free_ddev{ops, ddev};
  CXLKV_TRY(gpu_digests(gp.library(), geo_.dtype, k_dev, reinterpret_cast<uint64_t>(ddev), rows, n, geo_.head_dim, pt,
                        stream));
  std::vector<unsigned char> dg(dbytes);
  if (int rc = ops.memcpy_async(dg.data(), ddev, dbytes, stream); rc < 0)
    return Error(rc, C + "digest download: " + ops.last_error());
  // Rule 5: the pages' DMA (and the digests) completed before anything that
  // publishes them is written.
  CXLKV_TRY(gp.sync(stream));
  // The kernel wrote [rows][np][2][d] -- append_pages' layout.
  CXLKV_TRY(append_pages_impl(offs, dg.data(), n));
  store_->record_digest_build(n, dbytes, true,
                              static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                        std::chrono::steady_clock::now() - t0)
                                                        .count()));
  return {};
}

}  // namespace cxlkv::pnm
