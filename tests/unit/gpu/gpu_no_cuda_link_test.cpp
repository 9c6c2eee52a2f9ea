// SPDX-License-Identifier: MIT
// Packaging: libcxlkv must build and run without CUDA, so neither the shared
// runtime nor a program linking it statically may need a CUDA library or
// reference a CUDA symbol; libcxlkv-cuda exports only its entry point.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

namespace fs = std::filesystem;

namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

bool have_tools() { return !run("command -v nm && command -v readelf").empty(); }

fs::path build_dir() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");
  return t ? fs::path(t).parent_path() : fs::path();
}

// Why a binary depends on CUDA ("" when it does not), from its `readelf -d`
// and `nm -D --undefined-only` output: a NEEDED CUDA library, or an
// undefined symbol of the CUDA runtime or driver API.
std::string cuda_dependency_in(const std::string& dynamic, const std::string& undefined) {
  std::smatch m;
  if (std::regex_search(dynamic, m, std::regex(R"(\[(libcuda[^\]]*|libcudart[^\]]*|libnvidia[^\]]*)\])")))
    return "needs " + m[1].str();
  if (std::regex_search(undefined, m, std::regex(R"(\b(cuda[A-Z]\w*|cu[A-Z]\w*|__cuda\w*))")))
    return "references " + m[1].str();
  return "";
}

std::string cuda_dependency(const fs::path& file) {
  return cuda_dependency_in(run("readelf -d '" + file.string() + "'"),
                            run("nm -D --undefined-only '" + file.string() + "'"));
}

}  // namespace

TEST(GpuPackaging, TheDependencyCheckRecognisesCudaLinkage) {
  // Lines as readelf / nm print them for a program linked with -lcudart or -lcuda.
  EXPECT_EQ("needs libcudart.so.13",
            cuda_dependency_in(" 0x0000000000000001 (NEEDED)             Shared library: [libcudart.so.13]\n", ""));
  EXPECT_EQ("needs libcuda.so.1",
            cuda_dependency_in(" 0x0000000000000001 (NEEDED)             Shared library: [libcuda.so.1]\n", ""));
  EXPECT_EQ("references cudaMemcpyAsync",
            cuda_dependency_in("", "                 U cudaMemcpyAsync@libcudart.so.13\n"));
  EXPECT_EQ("references cuMemHostRegister_v2", cuda_dependency_in("", "                 U cuMemHostRegister_v2\n"));
  EXPECT_EQ("", cuda_dependency_in(" 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n",
                                   "                 U memcpy@GLIBC_2.14\n                 U cxlkv_custom\n"));
}

TEST(GpuPackaging, SharedLibcxlkvDoesNotDependOnCuda) {
  if (!have_tools()) GTEST_SKIP() << "nm / readelf not installed";
  const fs::path lib = build_dir() / "libruntime" / "libcxlkv.so";
  ASSERT_TRUE(fs::exists(lib)) << lib;
  EXPECT_EQ("", cuda_dependency(lib));
}

TEST(GpuPackaging, AProgramLinkingLibcxlkvStaticallyDoesNotDependOnCuda) {
  if (!have_tools()) GTEST_SKIP() << "nm / readelf not installed";
  EXPECT_EQ("", cuda_dependency(fs::read_symlink("/proc/self/exe")));
}

TEST(GpuPackaging, TheCudaLibraryExportsOnlyItsEntryPoint) {
  if (!have_tools()) GTEST_SKIP() << "nm / readelf not installed";
  const fs::path lib = build_dir() / "libruntime" / "libcxlkv-cuda.so";
  if (!fs::exists(lib)) GTEST_SKIP() << "libcxlkv-cuda not built (no nvcc)";
  std::string defined = run("nm -D --defined-only '" + lib.string() + "'");
  EXPECT_NE(std::string::npos, defined.find(" T cxlkv_cuda_get_ops"));
  EXPECT_FALSE(std::regex_search(defined, std::regex(R"( [TD] cuda)"))) << defined;
  // Static cudart: only the driver is opened, at run time.
  std::string needed = run("readelf -d '" + lib.string() + "'");
  EXPECT_EQ(std::string::npos, needed.find("libcudart")) << needed;
}
