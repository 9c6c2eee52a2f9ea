// SPDX-License-Identifier: MIT
// The host MemoryDomain on this CPU: every flush and non-temporal copy path
// the CPU supports (forced one by one) copies exactly the bytes asked for, at
// any alignment and length, and touches nothing else.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "coherence/cpu_paths.hpp"
#include "cxlkv/memory_domain.hpp"

namespace cxlkv {
namespace {

using coherence::cpu_has;

std::vector<const char*> supported_ntcopy() {
  std::vector<const char*> v;
  for (auto i : {NtCopyInsn::sse2, NtCopyInsn::avx2, NtCopyInsn::avx512})
    if (cpu_has(i)) v.push_back(coherence::ntcopy_name(i));
  return v;
}

std::vector<const char*> supported_flush() {
  std::vector<const char*> v;
  for (auto i : {FlushInsn::clflush, FlushInsn::clflushopt, FlushInsn::clwb})
    if (cpu_has(i)) v.push_back(coherence::flush_name(i));
  return v;
}

// Copies random (dst offset, src offset, length) triples with `copy` and checks
// the destination: the copied range equals the source, everything around it
// keeps its canary bytes.
template <class Copy>
void expect_exact_copies(Copy copy, uint32_t seed) {
  constexpr size_t kMax = 10240, kSlack = 256;
  std::vector<unsigned char> src(kMax + kSlack), dst(kMax + 2 * kSlack);
  std::mt19937 rng(seed);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (int iter = 0; iter < 600; iter++) {
    // Small lengths are where the head/tail cases live: bias towards them.
    const size_t len = iter % 3 == 0 ? rng() % 200 : rng() % kMax;
    const size_t doff = rng() % 192, soff = rng() % 192;
    std::memset(dst.data(), 0xa5, dst.size());
    copy(dst.data() + kSlack + doff - 64, src.data() + soff, len);
    const size_t start = kSlack + doff - 64;
    for (size_t i = 0; i < dst.size(); i++) {
      const bool inside = i >= start && i < start + len;
      const unsigned char want = inside ? src[soff + (i - start)] : 0xa5;
      if (dst[i] != want) {
        FAIL() << "len " << len << " dst offset " << doff << " src offset " << soff
               << ": byte " << i << " is " << int(dst[i]) << ", want " << int(want)
               << (inside ? " (inside)" : " (outside: written past the range)");
      }
    }
  }
}

TEST(HostDomain, EveryNtCopyPathCopiesExactlyAnyAlignmentAndLength) {
  for (const char* nt : supported_ntcopy()) {
    SCOPED_TRACE(nt);
    auto d = make_host_domain({.mode = DomainMode::flush, .force_ntcopy = nt});
    expect_exact_copies([&](void* dst, const void* src, size_t n) { d->copy_to_pool(dst, src, n); d->fence(); }, 1);
    expect_exact_copies([&](void* dst, const void* src, size_t n) { d->store_nt(dst, src, n); d->fence(); }, 2);
  }
}

TEST(HostDomain, EveryFlushPathCopiesFromPoolExactly) {
  for (const char* fl : supported_flush()) {
    SCOPED_TRACE(fl);
    auto d = make_host_domain({.mode = DomainMode::flush, .force_flush = fl});
    expect_exact_copies([&](void* dst, const void* src, size_t n) { d->copy_from_pool(dst, src, n); }, 3);
  }
}

TEST(HostDomain, FlushAndInvalidateKeepTheDataOnEveryPath) {
  for (const char* fl : supported_flush()) {
    SCOPED_TRACE(fl);
    auto d = make_host_domain({.mode = DomainMode::flush, .force_flush = fl});
    std::vector<uint64_t> buf(1000);
    for (size_t i = 0; i < buf.size(); i++) d->write(&buf[i], uint64_t{i * 3});
    d->flush_bulk(buf.data() + 1, 4000);
    d->flush(buf.data() + 3, 17);
    d->invalidate(buf.data(), buf.size() * 8);
    d->fence();
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(d->read_fresh(&buf[i]), i * 3);
  }
}

TEST(HostDomain, EveryModeCopiesBothWays) {
  for (auto mode : {DomainMode::coherent, DomainMode::flush, DomainMode::uncached}) {
    SCOPED_TRACE(to_string(mode));
    auto d = make_host_domain({.mode = mode});
    EXPECT_EQ(d->mode(), mode);
    expect_exact_copies([&](void* dst, const void* src, size_t n) { d->copy_to_pool(dst, src, n); d->fence(); }, 4);
    expect_exact_copies([&](void* dst, const void* src, size_t n) { d->copy_from_pool(dst, src, n); }, 5);
  }
}

TEST(HostDomain, AlignedEightByteNtStoreLandsWhole) {
  auto d = make_host_domain();
  alignas(64) uint64_t line[8] = {};
  d->write_nt(&line[3], uint64_t{0x0123456789abcdef});
  d->fence();
  EXPECT_EQ(line[3], 0x0123456789abcdefu);
  EXPECT_EQ(line[2], 0u);
  EXPECT_EQ(line[4], 0u);
}

TEST(HostDomain, PublishLineWritesTheWholeLine) {
  auto d = make_host_domain();
  alignas(64) unsigned char src[64], dst[128];
  for (int i = 0; i < 64; i++) src[i] = static_cast<unsigned char>(i + 1);
  std::memset(dst, 0, sizeof dst);
  d->publish_line(dst + 64, src);
  d->fence();
  EXPECT_EQ(std::memcmp(dst + 64, src, 64), 0);
  EXPECT_EQ(dst[63], 0);
}

TEST(HostDomain, NtCopyAtTheEndOfAMappingDoesNotTouchTheNextPage) {
  // The tail's byte-granular store (maskmovdqu) must stay inside the page.
  const size_t page = 4096;
  void* m = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<char*>(m) + page, page, PROT_NONE), 0);
  char src[7] = {1, 2, 3, 4, 5, 6, 7};
  for (const char* nt : supported_ntcopy()) {
    auto d = make_host_domain({.force_ntcopy = nt});
    for (size_t len = 1; len <= 7; len++) {
      char* dst = static_cast<char*>(m) + page - len;
      d->store_nt(dst, src, len);
      d->fence();
      EXPECT_EQ(std::memcmp(dst, src, len), 0) << nt << " len " << len;
    }
  }
  munmap(m, 2 * page);
}

TEST(HostDomain, DescribeNamesTheChosenPaths) {
  for (const char* nt : supported_ntcopy())
    for (const char* fl : supported_flush()) {
      auto d = make_host_domain({.force_flush = fl, .force_ntcopy = nt});
      const std::string s = d->describe();
      EXPECT_NE(s.find(std::string("flush(") + fl + ","), std::string::npos) << s;
      EXPECT_NE(s.find(std::string(nt) + "-nt"), std::string::npos) << s;
    }
}

TEST(HostDomain, UncachedModeReadsWithStreamingLoadsWhereTheCpuHasThem) {
  const std::string s = make_host_domain({.mode = DomainMode::uncached})->describe();
  EXPECT_EQ(s.rfind("uncached(", 0), 0u) << s;
  if (coherence::cpu_has_sse41()) {
    EXPECT_NE(s.find("movntdqa"), std::string::npos) << s;
  }
}

TEST(HostDomain, EnvironmentForcesAPath) {
  ASSERT_EQ(setenv("CXLKV_NTCOPY", "sse2", 1), 0);
  ASSERT_EQ(setenv("CXLKV_FLUSH", "clflush", 1), 0);
  const std::string s = make_host_domain()->describe();
  unsetenv("CXLKV_NTCOPY");
  unsetenv("CXLKV_FLUSH");
  EXPECT_EQ(s.rfind("flush(clflush, sse2-nt", 0), 0u) << s;
}

TEST(HostDomain, UnknownForcedPathIsAClearError) {
  try {
    make_host_domain({.force_ntcopy = "avx1024"});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("avx1024"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sse2|avx2|avx512"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_host_domain({.force_flush = "wbinvd"}), std::invalid_argument);
  ASSERT_EQ(setenv("CXLKV_FLUSH", "nope", 1), 0);
  EXPECT_THROW(make_host_domain(), std::invalid_argument);
  unsetenv("CXLKV_FLUSH");
}

TEST(HostDomain, ForcingAPathAnOlderCpuLacksIsAClearError) {
  const CpuFeatures baseline{};  // an x86-64 CPU with nothing beyond SSE2 / clflush
  try {
    coherence::parse_ntcopy("avx512", "CXLKV_NTCOPY", baseline);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "CXLKV_NTCOPY=avx512: this CPU does not have AVX-512F (CPUID / XGETBV)");
  }
  EXPECT_THROW(coherence::parse_ntcopy("avx2", "CXLKV_NTCOPY", baseline), std::invalid_argument);
  EXPECT_THROW(coherence::parse_flush("clwb", "CXLKV_FLUSH", baseline), std::invalid_argument);
  EXPECT_THROW(coherence::parse_flush("clflushopt", "CXLKV_FLUSH", baseline), std::invalid_argument);
  EXPECT_EQ(coherence::parse_flush("clflush", "CXLKV_FLUSH", baseline), FlushInsn::clflush);
  EXPECT_EQ(coherence::parse_ntcopy("sse2", "CXLKV_NTCOPY", baseline), NtCopyInsn::sse2);
}

TEST(HostDomain, UnsupportedForcedPathOnThisCpuIsAClearError) {
  bool any = false;
  for (auto i : {NtCopyInsn::avx2, NtCopyInsn::avx512}) {
    if (cpu_has(i)) continue;
    any = true;
    try {
      make_host_domain({.force_ntcopy = coherence::ntcopy_name(i)});
      FAIL() << "no error for " << coherence::ntcopy_name(i);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("does not have"), std::string::npos) << e.what();
    }
  }
  for (auto i : {FlushInsn::clflushopt, FlushInsn::clwb}) {
    if (cpu_has(i)) continue;
    any = true;
    EXPECT_THROW(make_host_domain({.force_flush = coherence::flush_name(i)}), std::invalid_argument);
  }
  if (!any) GTEST_SKIP() << "this CPU has every path";
}

// Protocols that let every line carry its own flag (the RPC; docs/rpc.md "The RPC") rely
// on publish_line landing in one piece: only movdir64b guarantees that.
TEST(HostDomain, PublishLineIsWholeExactlyWhenTheCpuHasMovdir64b) {
  for (DomainMode m : {DomainMode::coherent, DomainMode::flush, DomainMode::uncached})
    EXPECT_EQ(make_host_domain({.mode = m})->publish_line_whole(), cpu_features().movdir64b) << to_string(m);
}

TEST(HostDomain, ModeNamesAreStable) {
  EXPECT_STREQ(to_string(DomainMode::coherent), "coherent");
  EXPECT_STREQ(to_string(DomainMode::flush), "flush");
  EXPECT_STREQ(to_string(DomainMode::uncached), "uncached");
}

}  // namespace
}  // namespace cxlkv
