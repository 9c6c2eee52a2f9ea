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
  // Element-wise min / max of 16-bit keys (order-mapped bf16 / fp16, see digest.cpp).
  void (*minmax16)(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx);
  // score over q8 digest rows (struct cxlkv_pnm_q8_row + int8 [2][dim] each).
  void (*score_q8)(const void* rows, uint32_t np, uint32_t dim, const float* q, uint32_t nq, ScoreMode mode,
                   float* out);
  // A query-head group's online softmax over n <= kAttendRows rows of a
  // page ([n][dim] of t), in two calls so that a caller can read a page's
  // key rows of several heads and then their value rows, each stretch in
  // order (docs/near-memory.md#attention-at-the-read-bound).  keys: the
  // rows' scores against q [nq][dim] (already scaled), each head's running
  // maximum m [nq] and sum l [nq] and its unnormalized output acc [nq][dim]
  // rescaled to the new maximum, the rows' weights left in w (nq x ld
  // floats, ld >= kAttendRows, laid out as the kernel chooses for its
  // values call); values (q, m, l unused): acc += w x the value rows.  m = -inf, l = 0,
  // acc = 0 before the first rows; the output is acc / l, the log-sum-exp
  // m + log l.  next_bytes at next (nullptr: none) are prefetched a few
  // lines at a time while the rows are used: the rows a caller uses a
  // little later (docs/near-memory.md#attention-at-the-read-bound).
  void (*attend_rows)(bool keys, Dtype t, const void* rows, uint32_t n, uint32_t dim, const float* q, uint32_t nq,
                      float* m, float* l, float* acc, float* w, uint32_t ld, const void* next,
                      uint32_t next_bytes);
  // out[i] = exp(x[i] - m) (x[i] <= m), returning the sum.
  float (*exp_sum)(const float* x, uint32_t n, float m, float* out);
};
// The most rows Kernels::attend_rows takes at a time.
constexpr uint32_t kAttendRows = 32;
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
// Attention of KV heads [h0, h0 + nh) of one layer, each over its own
// selected pages pages[i] (page table `table`), for their query-head
// groups q [nh * group][head_dim]: out [nh * group][head_dim], lse [nh *
// group].
Result<void> attend_heads(const Context& ctx, const uint64_t* table, const std::span<const uint32_t>* pages,
                          uint32_t layer, uint32_t h0, uint32_t nh, const float* q, uint32_t group, uint64_t ntokens,
                          float scale, Isa isa, float* out, float* lse);
// The same for one KV head: out [group][head_dim], lse [group].
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
