// SPDX-License-Identifier: MIT
// The near-memory engine's kernels (docs/near-memory.md "A decode step"),
// written once over a vector-traits type V and instantiated once per
// instruction set: kernels_avx512.cpp, kernels_avx2.cpp and
// kernels_scalar.cpp (V of one lane: the scalar kernels, which the vector
// ones are tested against, come from the same code).
//
// V provides float vectors of V::kF lanes (V::F) and vectors of V::kI
// 16-bit keys (V::I):
//   F zero(), set1(float), load(const float*); store(float*, F)
//   F load_elems(Dtype, const void* base, uint32_t i): V::kF elements of
//     base from element i, as floats
//   F add(F, F), mul(F, F), max(F, F), min(F, F), fmadd(F a, F b, F c) (a * b + c)
//   float hsum(F): the sum of the lanes; hsums(const F* a, n, float* out):
//     out[h] = hsum(a[h]) for h < n <= kHeadChunk, several at once;
//     F reduce(const F* a): lane j = hsum(a[j]) for the V::kF vectors a
//   F tile(const float* x, n): lane j = x[j % n] (n divides V::kF)
//   F load_i8(const int8_t*): V::kF int8 elements as floats (q8 digests)
//   F round(F): to the nearest integer; F pow2i(F n): 2^n for integer n in
//     [-126, 127] (the exponential of the attention kernels)
//   I load16(const int16_t*); store16(int16_t*, I); I min16(I, I), max16(I, I)
//   I key16(I): the order map of bf16 / fp16 bits on each lane (order_key)
//   kHeadChunk: query heads scored together against one digest (their
//     accumulators stay in registers)
//   kAcc: float vectors an attention kernel keeps as accumulators (rows x
//     heads of scores, or value blocks x heads), the rest of the registers
//     holding its operands
// Dimensions that are not a multiple of the lane count finish with a scalar
// tail.
//
// The including file defines CXLKV_PNM_TARGET first: its instruction set's
// target attribute (empty for scalar), which every kernel here and every
// member of V carries, so that the intrinsics inline into the kernels and
// no file needs per-file -m flags.  The table a file builds is only handed
// out when CPUID says its instruction set is usable (isa_supported), so
// nothing compiled for AVX-512 runs on a CPU without it.  Everything here
// has internal linkage: an instantiation compiled for one instruction set
// is never the copy the linker keeps for another file.
#pragma once

#ifndef CXLKV_PNM_TARGET
#error "define CXLKV_PNM_TARGET (the instruction set's target attribute) before including pnm/kernels_template.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"
#include "cxlkv/format/pnm_format.h"

namespace cxlkv::pnm::detail {
namespace {

// bf16, fp16 and f32 are sign-magnitude: for 16 bits x ^ ((x >> 15) &
// 0x7fff) (arithmetic shift; 31 and 0x7fffffff for 32 bits) maps them to
// two's-complement integers of the same order (NaN aside), and the map is
// its own inverse.
template <class T>
inline T order_key(T x) {
  return T(x ^ ((x >> (8 * sizeof(T) - 1)) & std::numeric_limits<T>::max()));
}

// Columns [from, dim) of the element-wise min / max of order-mapped keys:
// mn / mx [dim] widened by ntok rows [ntok][dim] (the scalar form of
// minmax16_kernel, and the f32 digest update).
template <class T>
void minmax_columns(const T* rows, uint32_t ntok, uint32_t dim, uint32_t from, T* mn, T* mx) {
  for (uint32_t d = from; d < dim; d++) {
    T a = order_key(mn[d]), b = order_key(mx[d]);
    for (uint32_t i = 0; i < ntok; i++) {
      const T k = order_key(rows[size_t(i) * dim + d]);
      a = std::min(a, k);
      b = std::max(b, k);
    }
    mn[d] = order_key(a);
    mx[d] = order_key(b);
  }
}

// Digest rows as the score kernel reads them (cxlkv/format/pnm_format.h): a row's
// min and max halves and their elements as floats, with the row's scale.
// Min/max rows of the KV element type T: [min][max] of dim elements.
template <Dtype T>
struct MinMaxRows {
  uint32_t dim;
  size_t stride() const { return 2ull * dim * (T == Dtype::f32 ? 4 : 2); }
  const unsigned char* mn(const unsigned char* r) const { return r; }
  const unsigned char* mx(const unsigned char* r) const { return r + size_t(dim) * (T == Dtype::f32 ? 4 : 2); }
  float scale(const unsigned char*) const { return 1.f; }
  template <class V>
  CXLKV_PNM_TARGET typename V::F load(const unsigned char* half, uint32_t d) const {
    return V::load_elems(T, half, d);
  }
  float load1(const unsigned char* half, uint32_t d) const { return load_elem(T, half, d); }
};

// Quantized rows (struct cxlkv_pnm_q8_row): an 8-byte head (scale, tokens)
// then int8 min and max; element = scale * int8 (rounded outward when
// written, docs/near-memory.md#digest-kinds), the scale applied once per
// row after the sum.
struct Q8Rows {
  uint32_t dim;
  size_t stride() const { return sizeof(cxlkv_pnm_q8_row) + 2ull * dim; }
  const unsigned char* mn(const unsigned char* r) const { return r + sizeof(cxlkv_pnm_q8_row); }
  const unsigned char* mx(const unsigned char* r) const { return r + sizeof(cxlkv_pnm_q8_row) + dim; }
  float scale(const unsigned char* r) const {
    float s;
    std::memcpy(&s, r, sizeof s);
    return s;
  }
  template <class V>
  CXLKV_PNM_TARGET typename V::F load(const unsigned char* half, uint32_t d) const {
    return V::load_i8(reinterpret_cast<const int8_t*>(half) + d);
  }
  float load1(const unsigned char* half, uint32_t d) const { return float(int8_t(half[d])); }
};

// The score of one digest row (halves mn, mx) for NH query heads at once,
// weights w [NH][2][dim] (w[h][0] multiplies mn, w[h][1] mx): upper_bound
// sum_d (w0_d mn_d + w1_d mx_d) with w0 = min(q, 0), w1 = max(q, 0), which
// is sum_d max(q_d mn_d, q_d mx_d) with two fused multiply-adds per element
// instead of two products, a max and an add; coarse max(q.mn, q.mx), two
// sums.  NH and the mode are compile-time constants so that the NH
// accumulators stay in registers (a run-time head count kept them on the
// stack, a store and a load per multiply-add:
// docs/near-memory.md#selection-at-the-read-bound).
template <class V, uint32_t NH, bool UB, class Rows>
CXLKV_PNM_TARGET inline float score_row(const Rows& rows, const unsigned char* mn, const unsigned char* mx,
                                        uint32_t dim, const float* w) {
  using F = typename V::F;
  const uint32_t vd = dim / V::kF * V::kF;
  F a[NH], b[NH];
  for (uint32_t h = 0; h < NH; h++) a[h] = b[h] = V::zero();
  for (uint32_t d = 0; d < vd; d += V::kF) {
    const F vmn = rows.template load<V>(mn, d), vmx = rows.template load<V>(mx, d);
    for (uint32_t h = 0; h < NH; h++) {
      const float* wh = w + size_t(h) * 2 * dim;
      if constexpr (UB) {
        a[h] = V::fmadd(V::load(wh + dim + d), vmx, V::fmadd(V::load(wh + d), vmn, a[h]));
      } else {
        a[h] = V::fmadd(V::load(wh + d), vmn, a[h]);
        b[h] = V::fmadd(V::load(wh + dim + d), vmx, b[h]);
      }
    }
  }
  float s0[NH], s1[NH];
  V::hsums(a, NH, s0);
  if constexpr (!UB) V::hsums(b, NH, s1);
  float best = -INFINITY;
  for (uint32_t h = 0; h < NH; h++) {
    const float* wh = w + size_t(h) * 2 * dim;
    float s;
    if constexpr (UB) {
      s = s0[h];
      for (uint32_t d = vd; d < dim; d++) s += wh[dim + d] * rows.load1(mx, d) + wh[d] * rows.load1(mn, d);
    } else {
      float x0 = s0[h], x1 = s1[h];
      for (uint32_t d = vd; d < dim; d++) {
        x0 += wh[d] * rows.load1(mn, d);
        x1 += wh[dim + d] * rows.load1(mx, d);
      }
      s = std::max(x0, x1);
    }
    best = std::max(best, s);
  }
  return best;
}

// out[p] = max over every head chunk of score_row, for np rows; `nh` heads
// in the last chunk picks the instantiation (NH counts down from kHeadChunk).
template <class V, bool UB, class Rows, uint32_t NH = V::kHeadChunk>
CXLKV_PNM_TARGET void score_chunk(const Rows& rows, const void* dig, uint32_t np, uint32_t dim, const float* w,
                                  uint32_t nh, float* out) {
  if constexpr (NH > 1) {
    if (nh < NH) return score_chunk<V, UB, Rows, NH - 1>(rows, dig, np, dim, w, nh, out);
  }
  const size_t stride = rows.stride();
  for (uint32_t p = 0; p < np; p++) {
    const auto* r = static_cast<const unsigned char*>(dig) + size_t(p) * stride;
    out[p] = std::max(out[p], score_row<V, NH, UB>(rows, rows.mn(r), rows.mx(r), dim, w));
  }
}

// Scores of np digest rows against nq query heads (the max over heads).
// The per-head weights are made once per call; the row's scale, positive
// (checked before scoring), keeps the order of the heads' sums and applies
// once at the end.
template <class V, class Rows>
CXLKV_PNM_TARGET void score_rows(const Rows& rows, const void* dig, uint32_t np, uint32_t dim, const float* q,
                                 uint32_t nq, ScoreMode mode, float* out) {
  const bool ub = mode == ScoreMode::upper_bound;
  thread_local std::vector<float> w;
  w.resize(size_t(nq) * 2 * dim);
  for (uint32_t h = 0; h < nq; h++)
    for (uint32_t d = 0; d < dim; d++) {
      const float x = q[size_t(h) * dim + d];
      w[(size_t(h) * 2) * dim + d] = ub ? std::min(x, 0.f) : x;
      w[(size_t(h) * 2 + 1) * dim + d] = ub ? std::max(x, 0.f) : x;
    }
  std::fill(out, out + np, -INFINITY);
  for (uint32_t h0 = 0; h0 < nq; h0 += V::kHeadChunk) {
    const uint32_t nh = std::min(V::kHeadChunk, nq - h0);
    const float* wc = w.data() + size_t(h0) * 2 * dim;
    if (ub)
      score_chunk<V, true>(rows, dig, np, dim, wc, nh, out);
    else
      score_chunk<V, false>(rows, dig, np, dim, wc, nh, out);
  }
  const size_t stride = rows.stride();
  for (uint32_t p = 0; p < np; p++) out[p] *= rows.scale(static_cast<const unsigned char*>(dig) + size_t(p) * stride);
}

template <class V>
CXLKV_PNM_TARGET void score_kernel(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                                   ScoreMode mode, float* out) {
  switch (t) {
    case Dtype::f32: return score_rows<V>(MinMaxRows<Dtype::f32>{dim}, dig, np, dim, q, nq, mode, out);
    case Dtype::bf16: return score_rows<V>(MinMaxRows<Dtype::bf16>{dim}, dig, np, dim, q, nq, mode, out);
    case Dtype::f16: return score_rows<V>(MinMaxRows<Dtype::f16>{dim}, dig, np, dim, q, nq, mode, out);
  }
}

template <class V>
CXLKV_PNM_TARGET void score_q8_kernel(const void* rows, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                                      ScoreMode mode, float* out) {
  score_rows<V>(Q8Rows{dim}, rows, np, dim, q, nq, mode, out);
}

// ---- attention over a head group (docs/near-memory.md#attention-at-the-read-bound)

// exp(x) on V::kF lanes for x <= 0 (scores minus their maximum): Cephes'
// expf, 2^n times a degree-6 polynomial of the remainder (about 1 ulp),
// x clamped below so that 2^n stays a normal float.
template <class V>
CXLKV_PNM_TARGET inline typename V::F vexp(typename V::F x) {
  using F = typename V::F;
  x = V::max(x, V::set1(-87.3f));
  const F n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  x = V::fmadd(n, V::set1(-0.693359375f), x);
  x = V::fmadd(n, V::set1(2.12194440e-4f), x);
  F y = V::set1(1.9875691500e-4f);
  y = V::fmadd(y, x, V::set1(1.3981999507e-3f));
  y = V::fmadd(y, x, V::set1(8.3334519073e-3f));
  y = V::fmadd(y, x, V::set1(4.1665795894e-2f));
  y = V::fmadd(y, x, V::set1(1.6666665459e-1f));
  y = V::fmadd(y, x, V::set1(5.0000001201e-1f));
  y = V::fmadd(y, V::mul(x, x), V::add(x, V::set1(1.f)));
  return V::mul(y, V::pow2i(n));
}

// out[i] = exp(x[i] - m), i < n; returns their sum.  x[i] <= m.
template <class V>
CXLKV_PNM_TARGET float exp_sum_kernel(const float* x, uint32_t n, float m, float* out) {
  const uint32_t vn = n / V::kF * V::kF;
  typename V::F acc = V::zero();
  const typename V::F vm = V::set1(m);
  for (uint32_t i = 0; i < vn; i += V::kF) {
    const typename V::F e = vexp<V>(V::add(V::load(x + i), V::mul(vm, V::set1(-1.f))));
    V::store(out + i, e);
    acc = V::add(acc, e);
  }
  float s = V::hsum(acc);
  for (uint32_t i = vn; i < n; i++) s += out[i] = std::exp(x[i] - m);
  return s;
}

// Bytes of an element of T, a constant (dtype_size is an out-of-line call).
template <Dtype T>
constexpr size_t elem_bytes() {
  return T == Dtype::f32 ? 4 : 2;
}

// Lines of memory to be used later, prefetched a few at a time while the
// kernel works (docs/near-memory.md#attention-at-the-read-bound): a burst
// of prefetches fills the core's miss buffers and stalls the work behind
// it, while a few per block of work keep the reads in flight under the
// multiply-adds.
struct Ahead {
  const char* p = nullptr;
  uint32_t lines = 0;
  inline void issue(uint32_t count) {
    for (uint32_t i = 0; i < count && lines > 0; i++, lines--, p += 64) __builtin_prefetch(p);
  }
};

// Rows of a page scored together: with NH heads, R rows keep R x NH
// accumulators in registers (V::kAcc of them), so that each query vector
// loaded serves R rows and each key vector converted serves NH heads.
template <class V, uint32_t NH>
constexpr uint32_t score_rows_per_block() {
  return V::kAcc / NH > 0 ? V::kAcc / NH : 1;
}

// Whether a block's R x NH scores fill one vector (V::kAcc == V::kF and
// NH divides it: 1, 2, 4, 8 heads on AVX-512): then a block's sums are
// reduced to one vector at once (V::reduce) and the online softmax runs on
// whole vectors, lane r * NH + h the score of row r for head h; other
// group sizes take a horizontal sum per (row, head).
template <class V, uint32_t NH>
constexpr bool packed_scores() {
  return score_rows_per_block<V, NH>() * NH == V::kF;
}

// Where the keys call leaves row i's weight for head h in w, for the
// values call: [row][head] when packed, else [head][ld].
template <class V, uint32_t NH>
inline uint32_t weight_index(uint32_t i, uint32_t h, uint32_t ld) {
  if constexpr (packed_scores<V, NH>())
    return i * NH + h;
  else
    return h * ld + i;
}

// a[r * NH + h] = q_h . row_r over the vector part of the dimension (vd
// elements) for R rows and NH heads q [NH][dim] (already scaled): R x NH
// accumulators, each key element read and converted once for every head of
// the group.  score_block and score_vector reduce them their own ways.
template <class V, Dtype T, uint32_t NH, uint32_t R>
CXLKV_PNM_TARGET __attribute__((always_inline)) inline void dot_rows(const unsigned char* const* row, uint32_t vd,
                                                                     uint32_t dim, const float* q, typename V::F* a,
                                                                     Ahead& ahead, uint32_t per_step) {
  using F = typename V::F;
#pragma GCC unroll 16
  for (uint32_t j = 0; j < R * NH; j++) a[j] = V::zero();
  for (uint32_t d = 0; d < vd; d += V::kF) {
    ahead.issue(per_step);
    F qq[NH];
#pragma GCC unroll 16
    for (uint32_t h = 0; h < NH; h++) qq[h] = V::load(q + size_t(h) * dim + d);
#pragma GCC unroll 16
    for (uint32_t r = 0; r < R; r++) {
      const F kk = V::load_elems(T, row[r], d);
#pragma GCC unroll 16
      for (uint32_t h = 0; h < NH; h++) a[r * NH + h] = V::fmadd(qq[h], kk, a[r * NH + h]);
    }
  }
}

// s[h * ld + i] = q_h . k_i for R rows of K from row i0 and NH heads q
// [NH][dim] (already scaled), a horizontal sum per (row, head).
template <class V, Dtype T, uint32_t NH, uint32_t R>
CXLKV_PNM_TARGET __attribute__((always_inline)) inline void score_block(const unsigned char* k, uint32_t i0, uint32_t dim, const float* q, float* s,
                                         uint32_t ld, Ahead& ahead, uint32_t per_step) {
  using F = typename V::F;
  const uint32_t vd = dim / V::kF * V::kF;
  const size_t rb = size_t(dim) * elem_bytes<T>();
  const unsigned char* row[R];
#pragma GCC unroll 16
  for (uint32_t r = 0; r < R; r++) row[r] = k + (i0 + r) * rb;
  F a[R * NH];
  dot_rows<V, T, NH, R>(row, vd, dim, q, a, ahead, per_step);
#pragma GCC unroll 16
  for (uint32_t r = 0; r < R; r++) {
    float x[NH];
    V::hsums(a + r * NH, NH, x);
    for (uint32_t h = 0; h < NH; h++) {
      for (uint32_t d = vd; d < dim; d++) x[h] += q[size_t(h) * dim + d] * load_elem(T, row[r], d);
      s[h * ld + i0 + r] = x[h];
    }
  }
}

// Value vectors accumulated together per row: B blocks of V::kF elements
// for NH heads stay in registers over the rows (B x NH of them).
template <class V, uint32_t NH>
constexpr uint32_t value_blocks() {
  return V::kAcc / NH > 0 ? V::kAcc / NH : 1;
}

// acc[h][d0 + j] += sum_i w[h * ld + i] v_i[d0 + j], j < NB x V::kF, for NH
// heads over n rows: NB vectors of each head's accumulator stay in
// registers over the rows (a page of rows is in L1), each value element
// converted once for all heads.
template <class V, Dtype T, uint32_t NH, uint32_t NB>
CXLKV_PNM_TARGET __attribute__((always_inline)) inline void value_block(const unsigned char* v, uint32_t n, uint32_t dim, uint32_t d0,
                                         const float* w, uint32_t ld, float* acc, Ahead& ahead, uint32_t per_step) {
  using F = typename V::F;
  const size_t rb = size_t(dim) * elem_bytes<T>();
  F a[NH][NB];
#pragma GCC unroll 16
  for (uint32_t h = 0; h < NH; h++)
#pragma GCC unroll 16
    for (uint32_t b = 0; b < NB; b++) a[h][b] = V::load(acc + size_t(h) * dim + d0 + b * V::kF);
  for (uint32_t i = 0; i < n; i++) {
    ahead.issue(per_step);
    F x[NB];
#pragma GCC unroll 16
    for (uint32_t b = 0; b < NB; b++) x[b] = V::load_elems(T, v + i * rb, d0 + b * V::kF);
#pragma GCC unroll 16
    for (uint32_t h = 0; h < NH; h++) {
      const F wv = V::set1(w[weight_index<V, NH>(i, h, ld)]);
#pragma GCC unroll 16
      for (uint32_t b = 0; b < NB; b++) a[h][b] = V::fmadd(wv, x[b], a[h][b]);
    }
  }
#pragma GCC unroll 16
  for (uint32_t h = 0; h < NH; h++)
#pragma GCC unroll 16
    for (uint32_t b = 0; b < NB; b++) V::store(acc + size_t(h) * dim + d0 + b * V::kF, a[h][b]);
}

// acc[h][d] += sum_i w[h * ld + i] v_i[d] for NH heads over n rows, in
// blocks of value_blocks() vectors, then single vectors, then a scalar tail.
template <class V, Dtype T, uint32_t NH>
CXLKV_PNM_TARGET inline void accumulate_values(const unsigned char* v, uint32_t n, uint32_t dim, const float* w,
                                               uint32_t ld, float* acc, Ahead& ahead) {
  constexpr uint32_t B = value_blocks<V, NH>();
  const uint32_t vd = dim / V::kF * V::kF;
  // Rows x blocks steps share the lines to prefetch.
  const uint32_t steps = n * std::max<uint32_t>(1, vd / (B * V::kF));
  const uint32_t per = (ahead.lines + steps - 1) / steps;
  uint32_t d = 0;
  for (; d + B * V::kF <= vd; d += B * V::kF) value_block<V, T, NH, B>(v, n, dim, d, w, ld, acc, ahead, per);
  for (; d < vd; d += V::kF) value_block<V, T, NH, 1>(v, n, dim, d, w, ld, acc, ahead, per);
  ahead.issue(ahead.lines);
  const size_t rb = size_t(dim) * elem_bytes<T>();
  for (; d < dim; d++)
    for (uint32_t i = 0; i < n; i++) {
      const float x = load_elem(T, v + i * rb, d);
      for (uint32_t h = 0; h < NH; h++) acc[size_t(h) * dim + d] += w[weight_index<V, NH>(i, h, ld)] * x;
    }
}

// One page's key rows for NH query heads of the online softmax
// (docs/near-memory.md#attention-at-the-read-bound): the scores of n <=
// kAttendRows rows (q already scaled), each head's running maximum m and
// sum l and its accumulator acc [NH][dim] brought up to the new maximum
// (acc rescaled only when it moved), and the rows' weights exp(score - m)
// left in w [NH][ld] for the value rows (group sizes that are not packed,
// packed_scores: attend_scores_packed).
template <class V, Dtype T, uint32_t NH>
CXLKV_PNM_TARGET void attend_scores_heads(const void* kp, uint32_t n, uint32_t dim, const float* q, float* m,
                                          float* l, float* acc, float* w, uint32_t ld, Ahead& ahead) {
  constexpr uint32_t R = score_rows_per_block<V, NH>();
  const auto* k = static_cast<const unsigned char*>(kp);
  const uint32_t steps = std::max<uint32_t>(1, (n / R + n % R) * (dim / V::kF));
  const uint32_t per = (ahead.lines + steps - 1) / steps;
  uint32_t i = 0;
  for (; i + R <= n; i += R) score_block<V, T, NH, R>(k, i, dim, q, w, ld, ahead, per);
  for (; i < n; i++) score_block<V, T, NH, 1>(k, i, dim, q, w, ld, ahead, per);
  ahead.issue(ahead.lines);
  for (uint32_t h = 0; h < NH; h++) {
    float* sh = w + h * ld;
    float mx = m[h];
    for (uint32_t j = 0; j < n; j++) mx = std::max(mx, sh[j]);
    // The sums so far, rescaled to the new maximum (nothing yet: c = 0;
    // most pages leave the maximum where it was: c = 1, no exp).
    const float c = std::isinf(m[h]) ? 0.f : mx == m[h] ? 1.f : std::exp(m[h] - mx);
    const float sum = exp_sum_kernel<V>(sh, n, mx, sh);
    if (c != 1.f) {
      float* a = acc + size_t(h) * dim;
      const typename V::F cv = V::set1(c);
      const uint32_t vd = dim / V::kF * V::kF;
      for (uint32_t d = 0; d < vd; d += V::kF) V::store(a + d, V::mul(cv, V::load(a + d)));
      for (uint32_t d = vd; d < dim; d++) a[d] *= c;
    }
    l[h] = l[h] * c + sum;
    m[h] = mx;
  }
}

// The scores of rows [i0, i0 + R) (the last row repeated past n) for NH
// heads, lane r * NH + h the score of row i0 + r for head h: R x NH
// accumulators over the dimension, reduced to one vector at once.
template <class V, Dtype T, uint32_t NH, uint32_t R>
CXLKV_PNM_TARGET __attribute__((always_inline)) inline typename V::F score_vector(
    const unsigned char* k, uint32_t i0, uint32_t n, uint32_t dim, const float* q, Ahead& ahead, uint32_t per_step) {
  using F = typename V::F;
  const uint32_t vd = dim / V::kF * V::kF;
  const size_t rb = size_t(dim) * elem_bytes<T>();
  const unsigned char* row[R];
#pragma GCC unroll 16
  for (uint32_t r = 0; r < R; r++) row[r] = k + std::min(i0 + r, n - 1) * rb;
  F a[R * NH];
  dot_rows<V, T, NH, R>(row, vd, dim, q, a, ahead, per_step);
  F s = V::reduce(a);
  if (vd < dim) {  // a dimension that is not a multiple of the lanes
    alignas(64) float t[V::kF];
    V::store(t, s);
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t h = 0; h < NH; h++)
        for (uint32_t d = vd; d < dim; d++) t[r * NH + h] += q[size_t(h) * dim + d] * load_elem(T, row[r], d);
    s = V::load(t);
  }
  return s;
}

// attend_scores_heads for a packed group (packed_scores): the blocks'
// score vectors, each head's new maximum from their lane-wise maximum, the
// weights exp(score - maximum) a vector at a time, and each head's sum
// from their lane-wise sum; lanes of rows past n are -inf before the
// maximum and 0 after the exponential.  The weights are left in w [n][NH].
template <class V, Dtype T, uint32_t NH>
CXLKV_PNM_TARGET void attend_scores_packed(const void* kp, uint32_t n, uint32_t dim, const float* q, float* m,
                                           float* l, float* acc, float* w, Ahead& ahead) {
  using F = typename V::F;
  constexpr uint32_t R = V::kF / NH;
  const auto* k = static_cast<const unsigned char*>(kp);
  const uint32_t nb = (n + R - 1) / R, tail = n - (nb - 1) * R;  // rows of the last block
  const uint32_t steps = std::max<uint32_t>(1, nb * (dim / V::kF));
  const uint32_t per = (ahead.lines + steps - 1) / steps;
  alignas(64) float t[V::kF], keep[V::kF];
  if (tail < R)
    for (uint32_t j = 0; j < V::kF; j++) keep[j] = j / NH < tail ? 1.f : 0.f;
  F mx = V::set1(-INFINITY);
  for (uint32_t b = 0; b < nb; b++) {
    F s = score_vector<V, T, NH, R>(k, b * R, n, dim, q, ahead, per);
    if (b + 1 == nb && tail < R) {  // the repeated rows: -inf, below every score
      for (uint32_t j = 0; j < V::kF; j++) t[j] = keep[j] > 0.f ? INFINITY : -INFINITY;
      s = V::min(s, V::load(t));
    }
    V::store(w + b * V::kF, s);
    mx = V::max(mx, s);
  }
  ahead.issue(ahead.lines);
  V::store(t, mx);
  float mnew[NH], c[NH];
  for (uint32_t h = 0; h < NH; h++) {
    float x = m[h];
    for (uint32_t r = 0; r < R; r++) x = std::max(x, t[r * NH + h]);
    mnew[h] = x;
    // The sums so far, rescaled to the new maximum (nothing yet: c = 0;
    // most pages leave the maximum where it was: c = 1, no exp).
    c[h] = std::isinf(m[h]) ? 0.f : x == m[h] ? 1.f : std::exp(m[h] - x);
  }
  const F neg = V::mul(V::tile(mnew, NH), V::set1(-1.f));
  F sum = V::zero();
  for (uint32_t b = 0; b < nb; b++) {
    F e = vexp<V>(V::add(V::load(w + b * V::kF), neg));
    if (b + 1 == nb && tail < R) e = V::mul(e, V::load(keep));
    V::store(w + b * V::kF, e);
    sum = V::add(sum, e);
  }
  V::store(t, sum);
  for (uint32_t h = 0; h < NH; h++) {
    float sh = 0.f;
    for (uint32_t r = 0; r < R; r++) sh += t[r * NH + h];
    if (c[h] != 1.f) {
      float* a = acc + size_t(h) * dim;
      const F cv = V::set1(c[h]);
      const uint32_t vd = dim / V::kF * V::kF;
      for (uint32_t d = 0; d < vd; d += V::kF) V::store(a + d, V::mul(cv, V::load(a + d)));
      for (uint32_t d = vd; d < dim; d++) a[d] *= c[h];
    }
    l[h] = l[h] * c[h] + sh;
    m[h] = mnew[h];
  }
}

// The above and accumulate_values for nq heads in chunks of at most
// kHeadChunk, NH a compile-time constant in each (counting down to the
// chunk's size).
template <class V, Dtype T, uint32_t NH = V::kHeadChunk>
CXLKV_PNM_TARGET void attend_chunk(bool keys, const void* rows, uint32_t n, uint32_t dim, const float* q,
                                   uint32_t nh, float* m, float* l, float* acc, float* w, uint32_t ld, Ahead& ahead) {
  if constexpr (NH > 1) {
    if (nh < NH) return attend_chunk<V, T, NH - 1>(keys, rows, n, dim, q, nh, m, l, acc, w, ld, ahead);
  }
  if (keys) {
    if constexpr (packed_scores<V, NH>())
      attend_scores_packed<V, T, NH>(rows, n, dim, q, m, l, acc, w, ahead);
    else
      attend_scores_heads<V, T, NH>(rows, n, dim, q, m, l, acc, w, ld, ahead);
  }
  else
    accumulate_values<V, T, NH>(static_cast<const unsigned char*>(rows), n, dim, w, ld, acc, ahead);
}

template <class V, Dtype T>
CXLKV_PNM_TARGET void attend_all(bool keys, const void* rows, uint32_t n, uint32_t dim, const float* q, uint32_t nq,
                                 float* m, float* l, float* acc, float* w, uint32_t ld, Ahead& ahead) {
  for (uint32_t h0 = 0; h0 < nq; h0 += V::kHeadChunk)
    attend_chunk<V, T>(keys, rows, n, dim, keys ? q + size_t(h0) * dim : nullptr, std::min(V::kHeadChunk, nq - h0),
                       m + h0, l + h0, acc + size_t(h0) * dim, w + h0 * ld, ld, ahead);
}

template <class V>
CXLKV_PNM_TARGET void attend_rows_kernel(bool keys, Dtype t, const void* rows, uint32_t n, uint32_t dim,
                                         const float* q, uint32_t nq, float* m, float* l, float* acc, float* w,
                                         uint32_t ld, const void* next, uint32_t next_bytes) {
  Ahead ahead{static_cast<const char*>(next), next ? (next_bytes + 63) / 64 : 0};
  if (n == 0) return ahead.issue(ahead.lines);
  switch (t) {
    case Dtype::f32: return attend_all<V, Dtype::f32>(keys, rows, n, dim, q, nq, m, l, acc, w, ld, ahead);
    case Dtype::bf16: return attend_all<V, Dtype::bf16>(keys, rows, n, dim, q, nq, m, l, acc, w, ld, ahead);
    case Dtype::f16: return attend_all<V, Dtype::f16>(keys, rows, n, dim, q, nq, m, l, acc, w, ld, ahead);
  }
}

template <class V>
CXLKV_PNM_TARGET void minmax16_kernel(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx) {
  const uint32_t vd = dim / V::kI * V::kI;
  for (uint32_t d = 0; d < vd; d += V::kI) {
    typename V::I a = V::key16(V::load16(mn + d)), b = V::key16(V::load16(mx + d));
    for (uint32_t i = 0; i < ntok; i++) {
      const typename V::I k = V::key16(V::load16(rows + size_t(i) * dim + d));
      a = V::min16(a, k);
      b = V::max16(b, k);
    }
    V::store16(mn + d, V::key16(a));
    V::store16(mx + d, V::key16(b));
  }
  minmax_columns(rows, ntok, dim, vd, mn, mx);
}

// The function table of V's instruction set.
template <class V>
constexpr Kernels kernel_table() {
  return {score_kernel<V>, minmax16_kernel<V>, score_q8_kernel<V>, attend_rows_kernel<V>, exp_sum_kernel<V>};
}

}  // namespace
}  // namespace cxlkv::pnm::detail
