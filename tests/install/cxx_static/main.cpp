// The C++ API from an installed cxlkv (static library): format a pool in
// this process's memory, open it again, compare what both report.
#include <cxlkv/region.hpp>
#include <cxlkv/version.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main() {
  constexpr uint64_t kSize = 8ull << 20;
  void* mem = std::aligned_alloc(1 << 21, kSize);
  if (!mem) return 1;
  std::memset(mem, 0, kSize);
  cxlkv::FormatOptions fo;
  auto f = cxlkv::Region::format_memory("install-test", mem, kSize, fo);
  if (!f) {
    std::fprintf(stderr, "cxx_static: format: %s\n", f.error().message().c_str());
    return 1;
  }
  auto formatted = std::move(f).value();
  auto o = cxlkv::Region::open_memory("install-test", mem, kSize);
  if (!o) {
    std::fprintf(stderr, "cxx_static: open: %s\n", o.error().message().c_str());
    return 1;
  }
  auto opened = std::move(o).value();
  if (opened->size() != kSize || formatted->size() != kSize) {
    std::fprintf(stderr, "cxx_static: sizes %llu / %llu, want %llu\n", (unsigned long long)formatted->size(),
                 (unsigned long long)opened->size(), (unsigned long long)kSize);
    return 1;
  }
  std::printf("cxx_static: ok (cxlkv %s, C++ API, %llu-byte pool in memory)\n", CXLKV_VERSION,
              (unsigned long long)opened->size());
  opened.reset();
  formatted.reset();
  std::free(mem);
  return 0;
}
