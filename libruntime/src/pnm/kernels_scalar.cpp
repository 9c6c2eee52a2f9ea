// SPDX-License-Identifier: MIT
// Scalar kernels of the near-memory engine: the fallback on any x86-64 and
// the definition the AVX2 / AVX-512 kernels are tested against:
// kernels_template.hpp with one lane per vector and one query head at a
// time, so every sum is taken in index order, as a plain loop takes it.
// Also the table lookup, the digest update and the start-up choice of
// instruction set.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "coherence/cpu_paths.hpp"
#include "pnm/dtype.hpp"
#include "pnm/pnm_internal.hpp"

#define CXLKV_PNM_TARGET
#include "pnm/kernels_template.hpp"

namespace cxlkv::pnm {
namespace detail {
namespace {

struct Scalar {
  using F = float;
  using I = int16_t;
  static constexpr uint32_t kF = 1, kI = 1, kHeadChunk = 1, kAcc = 1;

  static F zero() { return 0; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static F load_elems(Dtype t, const void* base, uint32_t i) { return load_elem(t, base, i); }
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  static F max(F a, F b) { return std::max(a, b); }
  static F min(F a, F b) { return std::min(a, b); }
  static F fmadd(F a, F b, F c) { return a * b + c; }
  static float hsum(F v) { return v; }
  static F round(F x) { return std::nearbyint(x); }
  static F pow2i(F n) { return std::ldexp(1.f, int(n)); }
  static F load_i8(const int8_t* p) { return float(*p); }
  static void hsums(const F* a, uint32_t n, float* out) {
    for (uint32_t h = 0; h < n; h++) out[h] = a[h];
  }
  static F reduce(const F* a) { return a[0]; }
  static F tile(const float* x, uint32_t) { return x[0]; }

  static I load16(const int16_t* p) { return *p; }
  static void store16(int16_t* p, I v) { *p = v; }
  static I min16(I a, I b) { return std::min(a, b); }
  static I max16(I a, I b) { return std::max(a, b); }
  static I key16(I x) { return order_key(x); }
};

}  // namespace

const Kernels kScalarKernels = kernel_table<Scalar>();

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
  if (t == Dtype::f32) {  // the same order map on 32-bit sign-magnitude floats
    auto* mn = reinterpret_cast<int32_t*>(dg);
    minmax_columns(static_cast<const int32_t*>(rows), ntok, dim, 0, mn, mn + dim);
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
