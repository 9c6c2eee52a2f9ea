// SPDX-License-Identifier: MIT
// Internal to the near-memory engine: test faults and the per-ISA kernels.
#pragma once

#include <cstdint>

#include "cxlkv/pnm.hpp"

struct cxlkv_cuda_pnm_ops;
struct cxlkv_pnm_attend_args;

namespace cxlkv::pnm {

namespace testing {
// Switches that remove one step of the coherence protocol, so that a test
// can show NonCoherentSim catches its absence.  Never set outside tests.
struct Faults {
  bool skip_writer_flush = false;       // page-table entries and digests: no clflush
  bool skip_reader_invalidate = false;  // reads without invalidate + fence
};
Faults& faults();
// The pnm kernel table used for every non-reference CUDA library instead of
// the one the library exports (tests: a fake GPU library); nullptr: none.
const cxlkv_cuda_pnm_ops*& pnm_ops_override();
}  // namespace testing

namespace detail {

// One instruction set's kernels (kernels_template.hpp, instantiated in
// kernels_*.cpp); chosen once per call site from Isa, never per element.
struct Kernels {
  // out[p] = max over nq heads of score(q_h, digest p); digests [np][2][dim].
  void (*score)(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                ScoreMode mode, float* out);
  // out[t] = q . k_t for ntok rows [ntok][dim].
  void (*dot_rows)(Dtype t, const void* k, uint32_t ntok, uint32_t dim, const float* q, float* out);
  // acc[d] += sum_t w[t] v_t[d].
  void (*axpy_rows)(Dtype t, const void* v, uint32_t ntok, uint32_t dim, const float* w, float* acc);
  // Element-wise min / max of 16-bit keys (order-mapped bf16 / fp16, see digest.cpp).
  void (*minmax16)(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx);
  // score over q8 digest rows (struct cxlkv_pnm_q8_row + int8 [2][dim] each).
  void (*score_q8)(const void* rows, uint32_t np, uint32_t dim, const float* q, uint32_t nq, ScoreMode mode,
                   float* out);
  // Every head of a group over ntok rows at once.  dot: io[h * ld + i] =
  // x_h . row_i (x: queries [nq][dim]); else io[h][d] += sum_i x[h * ld +
  // i] row_i[d] (x: weights, io: accumulators [nq][dim]).
  void (*rows_heads)(bool dot, Dtype t, const void* rows, uint32_t ntok, uint32_t dim, const float* x, size_t ld,
                     uint32_t nq, float* io);
  // out[i] = exp(x[i] - m) (x[i] <= m), returning the sum.
  float (*exp_sum)(const float* x, uint32_t n, float m, float* out);
};
const Kernels& kernels(Isa isa);
extern const Kernels kScalarKernels;
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();

// One (layer, KV head) of a step, shared by select_pages / attend and the
// engines that split a step's heads over threads.  q: the group's query
// heads [group][head_dim].
Result<std::vector<uint32_t>> select_head(const Context& ctx, const float* q, uint32_t group, uint32_t layer,
                                          uint32_t head, uint64_t ntokens, const SelectOptions& o, Isa isa,
                                          std::vector<float>* scores_out = nullptr,
                                          uint64_t* bytes_read = nullptr);
// Attention of the group's query heads over `pages` (page table `table`):
// out [group][head_dim], lse [group].
Result<void> attend_head(const Context& ctx, const uint64_t* table, std::span<const uint32_t> pages, uint32_t layer,
                         uint32_t head, const float* q, uint32_t group, uint64_t ntokens, float scale, Isa isa,
                         float* out, float* lse);
// The pnm kernel table of a loaded (non-reference) CUDA library.
Result<const cxlkv_cuda_pnm_ops*> pnm_ops(gpu::CudaLibrary& lib);
// The GPU partial-attention kernel's per-thread code over every query head
// of a launch, on the CPU (its reference; "device" pointers are host memory).
void reference_attend(const cxlkv_pnm_attend_args& a);

// Shape checks of a step; "" when fine.
std::string check_step(const Context& ctx, std::span<const float> queries, uint32_t q_heads, uint64_t ntokens);

}  // namespace detail
}  // namespace cxlkv::pnm
