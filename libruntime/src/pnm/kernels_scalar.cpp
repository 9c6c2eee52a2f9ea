// SPDX-License-Identifier: MIT
// Scalar kernels of the near-memory engine: the fallback on any x86-64 and
// the definition the AVX2 / AVX-512 kernels are tested against.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "coherence/cpu_paths.hpp"
#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

namespace cxlkv::pnm {
namespace detail {
namespace {

void score_scalar(Dtype t, const void* dig, uint32_t np, uint32_t dim, const float* q, uint32_t nq,
                  ScoreMode mode, float* out) {
  const size_t es = dtype_size(t);
  for (uint32_t p = 0; p < np; p++) {
    const auto* mn = static_cast<const unsigned char*>(dig) + size_t(p) * 2 * dim * es;
    const auto* mx = mn + dim * es;
    float best = -INFINITY;
    for (uint32_t h = 0; h < nq; h++) {
      const float* qh = q + size_t(h) * dim;
      float s, smin = 0, smax = 0;
      if (mode == ScoreMode::upper_bound) {
        s = 0;
        for (uint32_t d = 0; d < dim; d++) s += std::max(qh[d] * load_elem(t, mn, d), qh[d] * load_elem(t, mx, d));
      } else {
        for (uint32_t d = 0; d < dim; d++) {
          smin += qh[d] * load_elem(t, mn, d);
          smax += qh[d] * load_elem(t, mx, d);
        }
        s = std::max(smin, smax);
      }
      best = std::max(best, s);
    }
    out[p] = best;
  }
}

void dot_scalar(Dtype t, const void* k, uint32_t ntok, uint32_t dim, const float* q, float* out) {
  const size_t es = dtype_size(t);
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(k) + size_t(i) * dim * es;
    float s = 0;
    for (uint32_t d = 0; d < dim; d++) s += q[d] * load_elem(t, r, d);
    out[i] = s;
  }
}

void axpy_scalar(Dtype t, const void* v, uint32_t ntok, uint32_t dim, const float* w, float* acc) {
  const size_t es = dtype_size(t);
  for (uint32_t i = 0; i < ntok; i++) {
    const auto* r = static_cast<const unsigned char*>(v) + size_t(i) * dim * es;
    for (uint32_t d = 0; d < dim; d++) acc[d] += w[i] * load_elem(t, r, d);
  }
}

// bf16 and fp16 are sign-magnitude: x ^ ((x >> 15) & 0x7fff) (arithmetic
// shift) maps them to two's-complement integers of the same order (NaN
// aside), and the map is its own inverse.
inline int16_t key16(int16_t x) { return int16_t(x ^ ((x >> 15) & 0x7fff)); }

void minmax16_scalar(const int16_t* rows, uint32_t ntok, uint32_t dim, int16_t* mn, int16_t* mx) {
  for (uint32_t d = 0; d < dim; d++) {
    int16_t a = key16(mn[d]), b = key16(mx[d]);
    for (uint32_t i = 0; i < ntok; i++) {
      const int16_t k = key16(rows[size_t(i) * dim + d]);
      a = std::min(a, k);
      b = std::max(b, k);
    }
    mn[d] = key16(a);
    mx[d] = key16(b);
  }
}

}  // namespace

const Kernels kScalarKernels = {score_scalar, dot_scalar, axpy_scalar, minmax16_scalar};

const Kernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512: return avx512_kernels();
    case Isa::avx2: return avx2_kernels();
    case Isa::scalar: break;
  }
  return kScalarKernels;
}

void digest_rows(Dtype t, const void* rows, uint32_t ntok, uint32_t dim, void* d, bool fresh) {
  if (ntok == 0) return;
  const size_t es = dtype_size(t);
  auto* dg = static_cast<unsigned char*>(d);
  if (fresh) {  // min = max = the first row
    std::memcpy(dg, rows, dim * es);
    std::memcpy(dg + dim * es, rows, dim * es);
  }
  if (t == Dtype::f32) {
    // The same order map on 32-bit sign-magnitude floats.
    auto key = [](int32_t x) { return int32_t(x ^ ((x >> 31) & 0x7fffffff)); };
    auto* mn = reinterpret_cast<int32_t*>(dg);
    auto* mx = mn + dim;
    const auto* r = static_cast<const int32_t*>(rows);
    for (uint32_t i = 0; i < dim; i++) {
      int32_t a = key(mn[i]), b = key(mx[i]);
      for (uint32_t j = 0; j < ntok; j++) {
        const int32_t k = key(r[size_t(j) * dim + i]);
        a = std::min(a, k);
        b = std::max(b, k);
      }
      mn[i] = key(a);
      mx[i] = key(b);
    }
    return;
  }
  auto* mn = reinterpret_cast<int16_t*>(dg);
  kernels(default_isa()).minmax16(static_cast<const int16_t*>(rows), ntok, dim, mn, mn + dim);
}

}  // namespace detail

const char* to_string(Isa i) {
  switch (i) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

const char* to_string(ScoreMode m) { return m == ScoreMode::coarse ? "coarse" : "upper_bound"; }

bool isa_supported(Isa i) {
  switch (i) {
    case Isa::scalar: return true;
    case Isa::avx2:
      return cpu_features().avx2 && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return cpu_features().avx512f && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

Isa default_isa() {
  static const Isa isa = [] {
    if (const char* e = std::getenv("CXLKV_PNM_ISA"); e && *e) {
      for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
        if (std::strcmp(e, to_string(i)) == 0) {
          if (!isa_supported(i))
            throw std::invalid_argument(std::string("CXLKV_PNM_ISA=") + e + ": this CPU does not have it (CPUID)");
          return i;
        }
      throw std::invalid_argument(std::string("CXLKV_PNM_ISA=") + e + ": unknown (expected scalar|avx2|avx512)");
    }
    if (isa_supported(Isa::avx512)) return Isa::avx512;
    if (isa_supported(Isa::avx2)) return Isa::avx2;
    return Isa::scalar;
  }();
  return isa;
}

}  // namespace cxlkv::pnm
