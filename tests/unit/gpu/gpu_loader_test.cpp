// SPDX-License-Identifier: MIT
// Loading libcxlkv-cuda.so at run time: found in the build tree, explicit
// paths honoured, wrong files refused, and a machine without a GPU or CUDA
// driver gets a clear "why not" instead of a crash.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "cxlkv/cxlkv.h"
#include "cxlkv/gpu.hpp"

using namespace cxlkv::gpu;
namespace fs = std::filesystem;

namespace {

fs::path build_dir() {
  const char* t = std::getenv("CXLKV_TEST_TOOLS");  // <build>/tools
  return t ? fs::path(t).parent_path() : fs::path();
}
fs::path built_cuda_library() { return build_dir() / "libruntime" / "libcxlkv-cuda.so"; }

// Sets an environment variable for one test.
struct ScopedEnv {
  ScopedEnv(const char* k, const char* v) : key(k) {
    if (const char* old = std::getenv(k)) saved = old, had = true;
    if (v) setenv(k, v, 1);
    else unsetenv(k);
  }
  ~ScopedEnv() {
    if (had) setenv(key, saved.c_str(), 1);
    else unsetenv(key);
  }
  const char* key;
  std::string saved;
  bool had = false;
};

}  // namespace

TEST(GpuLoader, FindsTheLibraryBuiltBesideTheRuntimeOrSaysWhereItLooked) {
  ScopedEnv env("CXLKV_CUDA_LIB", nullptr);
  auto lib = CudaLibrary::load();
  if (fs::exists(built_cuda_library())) {
    ASSERT_TRUE(lib.ok()) << lib.error().message();
    EXPECT_EQ(fs::canonical(built_cuda_library()), fs::canonical(lib.value()->path()));
  } else {
    ASSERT_FALSE(lib.ok()) << "libcxlkv-cuda was not built (no nvcc), yet something loaded";
    EXPECT_EQ(-ENOENT, lib.error().code());
    EXPECT_NE(std::string::npos, lib.error().message().find("CXLKV_CUDA_LIB"));
  }
}

TEST(GpuLoader, ProbeSaysWhyNoGpuIsUsable) {
  Status s = probe();
  std::printf("gpu probe: %s: %s\n", to_string(s.availability), s.message.c_str());
  ASSERT_FALSE(s.message.empty());
  if (s.availability == Availability::ready) {
    EXPECT_GT(s.device.device_count, 0);
    EXPECT_FALSE(s.device.name.empty());
  } else {
    EXPECT_TRUE(s.availability == Availability::library_not_found || s.availability == Availability::no_driver ||
                s.availability == Availability::no_device)
        << to_string(s.availability) << ": " << s.message;
  }
}

TEST(GpuLoader, AnExplicitPathThatDoesNotExistIsNamed) {
  ScopedEnv env("CXLKV_CUDA_LIB", "/nonexistent/libcxlkv-cuda.so");
  auto lib = CudaLibrary::load();
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(-ENOENT, lib.error().code());
  EXPECT_NE(std::string::npos, lib.error().message().find("/nonexistent/libcxlkv-cuda.so"));
  EXPECT_EQ(Availability::library_not_found, probe().availability);
}

TEST(GpuLoader, ALibraryWithoutTheEntryPointIsRefused) {
  const fs::path runtime = build_dir() / "libruntime" / "libcxlkv.so";
  if (!fs::exists(runtime)) GTEST_SKIP() << runtime << " not built";
  ScopedEnv env("CXLKV_CUDA_LIB", runtime.c_str());
  auto lib = CudaLibrary::load();
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(-EPROTO, lib.error().code());
  EXPECT_NE(std::string::npos, lib.error().message().find("cxlkv_cuda_get_ops"));
  EXPECT_EQ(Availability::incompatible, probe().availability);
}

TEST(GpuLoader, CApiProbeReturnsAnErrnoAndAMessage) {
  char msg[512] = {};
  int rc = cxlkv_gpu_probe(msg, sizeof msg);
  EXPECT_GT(std::strlen(msg), 0u);
  if (rc == 0) return;  // a GPU is here
  EXPECT_TRUE(rc == -ENOENT || rc == -ENOSYS || rc == -ENODEV) << rc << ": " << msg;
  EXPECT_STREQ(msg, cxlkv_last_error());
}

TEST(GpuLoader, OpeningTheGpuPathWithoutAGpuFailsCleanly) {
  if (probe().availability == Availability::ready) GTEST_SKIP() << "a GPU is present";
  const size_t n = 1 << 20;
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, p);
  cxlkv_gpu* g = reinterpret_cast<cxlkv_gpu*>(0x1);
  int rc = cxlkv_gpu_open(p, n, nullptr, &g);
  EXPECT_LT(rc, 0);
  EXPECT_EQ(nullptr, g);
  EXPECT_GT(std::strlen(cxlkv_last_error()), 0u);
  munmap(p, n);
}

TEST(GpuLoader, APoolOpensOnTheReferenceBackendThroughTheCApi) {
  const std::string uri = "shm:cxlkv-gpu-test-" + std::to_string(getpid()) + ":8M";
  cxlkv_format_opts fo;
  std::memset(&fo, 0, sizeof fo);
  fo.size = sizeof fo;
  fo.flags = CXLKV_FORMAT_F_NO_STANDARD;
  ASSERT_EQ(0, cxlkv_pool_format(uri.c_str(), &fo)) << cxlkv_last_error();
  cxlkv_pool* pool = nullptr;
  ASSERT_EQ(0, cxlkv_pool_open(uri.c_str(), &pool)) << cxlkv_last_error();
  cxlkv_gpu_opts go{sizeof(cxlkv_gpu_opts), CXLKV_GPU_F_CPU_REFERENCE, 0, 0};
  cxlkv_gpu* g = nullptr;
  ASSERT_EQ(0, cxlkv_gpu_open_pool(pool, &go, &g)) << cxlkv_last_error();
  EXPECT_STREQ("cpu-reference", cxlkv_gpu_pin_method(g));
  EXPECT_EQ(-EINVAL, cxlkv_gpu_sync(nullptr, nullptr));
  EXPECT_NE(nullptr, std::strstr(cxlkv_last_error(), "NULL"));
  cxlkv_gpu_close(g);
  cxlkv_pool_close(pool);
  shm_unlink(("cxlkv-gpu-test-" + std::to_string(getpid())).c_str());
}
