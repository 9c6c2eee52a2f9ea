// SPDX-License-Identifier: MIT
// CPU feature detection, once per process, from CPUID (+ XGETBV for the OS
// side of AVX / AVX-512 state), and the parsing of forced path names.
#include <cpuid.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "coherence/cpu_paths.hpp"

namespace cxlkv {

namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;        // XMM + YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = os_avx && (b & (1u << 5));
  f.avx512f = os_avx512 && (b & (1u << 16));
  f.clflushopt = b & (1u << 23);
  f.clwb = b & (1u << 24);
  f.movdir64b = c & (1u << 28);
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool coherence::cpu_has_sse41() {
  static const bool has = [] {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 19));
  }();
  return has;
}

const char* to_string(DomainMode m) {
  switch (m) {
    case DomainMode::coherent: return "coherent";
    case DomainMode::flush: return "flush";
    case DomainMode::uncached: return "uncached";
  }
  return "unknown";
}

namespace coherence {

const char* flush_name(FlushInsn insn) {
  switch (insn) {
    case FlushInsn::clflush: return "clflush";
    case FlushInsn::clflushopt: return "clflushopt";
    case FlushInsn::clwb: return "clwb";
  }
  return "unknown";
}

const char* ntcopy_name(NtCopyInsn insn) {
  switch (insn) {
    case NtCopyInsn::sse2: return "sse2";
    case NtCopyInsn::avx2: return "avx2";
    case NtCopyInsn::avx512: return "avx512";
  }
  return "unknown";
}

bool cpu_has(FlushInsn insn, const CpuFeatures& cpu) {
  switch (insn) {
    case FlushInsn::clflush: return true;  // part of x86-64 (with SSE2)
    case FlushInsn::clflushopt: return cpu.clflushopt;
    case FlushInsn::clwb: return cpu.clwb;
  }
  return false;
}

bool cpu_has(NtCopyInsn insn, const CpuFeatures& cpu) {
  switch (insn) {
    case NtCopyInsn::sse2: return true;  // baseline of x86-64
    case NtCopyInsn::avx2: return cpu.avx2;
    case NtCopyInsn::avx512: return cpu.avx512f;
  }
  return false;
}

FlushInsn parse_flush(const char* name, const char* origin, const CpuFeatures& cpu) {
  for (auto insn : {FlushInsn::clflush, FlushInsn::clflushopt, FlushInsn::clwb}) {
    if (std::strcmp(name, flush_name(insn)) != 0) continue;
    if (!cpu_has(insn, cpu))
      throw std::invalid_argument(std::string(origin) + "=" + name +
                                  ": this CPU does not have " + name + " (CPUID)");
    return insn;
  }
  throw std::invalid_argument(std::string(origin) + "=" + name +
                              ": unknown flush instruction (expected clflush|clflushopt|clwb)");
}

NtCopyInsn parse_ntcopy(const char* name, const char* origin, const CpuFeatures& cpu) {
  for (auto insn : {NtCopyInsn::sse2, NtCopyInsn::avx2, NtCopyInsn::avx512}) {
    if (std::strcmp(name, ntcopy_name(insn)) != 0) continue;
    if (!cpu_has(insn, cpu))
      throw std::invalid_argument(std::string(origin) + "=" + name + ": this CPU does not have " +
                                  (insn == NtCopyInsn::avx2 ? "AVX2" : "AVX-512F") +
                                  " (CPUID / XGETBV)");
    return insn;
  }
  throw std::invalid_argument(std::string(origin) + "=" + name +
                              ": unknown non-temporal copy path (expected sse2|avx2|avx512)");
}

}  // namespace coherence
}  // namespace cxlkv
