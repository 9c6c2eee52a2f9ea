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
//   F add(F, F), mul(F, F), max(F, F), fmadd(F a, F b, F c) (a * b + c)
//   float hsum(F): the sum of the lanes
//   I load16(const int16_t*); store16(int16_t*, I); I min16(I, I), max16(I, I)
//   I key16(I): the order map of bf16 / fp16 bits on each lane (order_key)
//   kHeadChunk: query heads scored together against one digest (their
//     accumulators stay in registers)
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
#include <limits>

#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

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

template <class V>
CXLKV_PNM_TARGET void score_kernel(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                                   ScoreMode mode, float* out) {
  using F = typename V::F;
  constexpr uint32_t kChunk = V::kHeadChunk;
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / V::kF * V::kF;
  for (uint32_t p = 0; p < np; p++) {
    const auto* mn = static_cast<const unsigned char*>(dig) + size_t(p) * 2 * dim * es;
    const auto* mx = mn + dim * es;
    float best = -INFINITY;
    for (uint32_t h0 = 0; h0 < nq; h0 += kChunk) {
      const uint32_t nh = std::min(kChunk, nq - h0);
      F a[kChunk], b[kChunk];
      for (uint32_t h = 0; h < nh; h++) a[h] = b[h] = V::zero();
      for (uint32_t d = 0; d < vd; d += V::kF) {
        const F vmn = V::load_elems(t, mn, d), vmx = V::load_elems(t, mx, d);
        for (uint32_t h = 0; h < nh; h++) {
          const F qv = V::load(q + size_t(h0 + h) * dim + d);
          if (mode == ScoreMode::upper_bound) {
            a[h] = V::add(a[h], V::max(V::mul(qv, vmn), V::mul(qv, vmx)));
          } else {
            a[h] = V::fmadd(qv, vmn, a[h]);
            b[h] = V::fmadd(qv, vmx, b[h]);
          }
        }
      }
      for (uint32_t h = 0; h < nh; h++) {
        const float* qh = q + size_t(h0 + h) * dim;
        float s;
        if (mode == ScoreMode::upper_bound) {
          s = V::hsum(a[h]);
          for (uint32_t d = vd; d < dim; d++)
            s += std::max(qh[d] * load_elem(t, mn, d), qh[d] * load_elem(t, mx, d));
        } else {
          float s0 = V::hsum(a[h]), s1 = V::hsum(b[h]);
          for (uint32_t d = vd; d < dim; d++) {
            s0 += qh[d] * load_elem(t, mn, d);
            s1 += qh[d] * load_elem(t, mx, d);
          }
          s = std::max(s0, s1);
        }
        best = std::max(best, s);
      }
    }
    out[p] = best;
  }
}

template <class V>
CXLKV_PNM_TARGET void dot_kernel(Dtype t, const void* k, uint32_t ntok, uint32_t dim, const float* q, float* out) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / V::kF * V::kF;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(k) + size_t(i) * dim * es;
    typename V::F acc = V::zero();
    for (uint32_t d = 0; d < vd; d += V::kF) acc = V::fmadd(V::load(q + d), V::load_elems(t, r, d), acc);
    float s = V::hsum(acc);
    for (uint32_t d = vd; d < dim; d++) s += q[d] * load_elem(t, r, d);
    out[i] = s;
  }
}

template <class V>
CXLKV_PNM_TARGET void axpy_kernel(Dtype t, const void* v, uint32_t ntok, uint32_t dim, const float* w, float* acc) {
  const size_t es = dtype_size(t);
  const uint32_t vd = dim / V::kF * V::kF;
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(v) + size_t(i) * dim * es;
    const typename V::F wv = V::set1(w[i]);
    for (uint32_t d = 0; d < vd; d += V::kF)
      V::store(acc + d, V::fmadd(wv, V::load_elems(t, r, d), V::load(acc + d)));
    for (uint32_t d = vd; d < dim; d++) acc[d] += w[i] * load_elem(t, r, d);
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
  return {score_kernel<V>, dot_kernel<V>, axpy_kernel<V>, minmax16_kernel<V>};
}

}  // namespace
}  // namespace cxlkv::pnm::detail
