// SPDX-License-Identifier: MIT
// Finding and opening libcxlkv-cuda.so at run time.  libcxlkv never links
// CUDA: everything CUDA goes through the function table the library hands
// out (cuda/cxlkv_cuda_abi.h), checked for ABI version and size here.
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "gpu/reference_backend.hpp"
#include "util/log.hpp"

namespace cxlkv::gpu {
namespace {

// Directory of the object holding this code: libcxlkv.so, or the
// executable when libcxlkv is linked statically.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return {};
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) return {};
  return p.parent_path().string();
}

std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("CXLKV_CUDA_LIB"); env && *env) {
    c.emplace_back(env);
    return c;  // an explicit choice is the only choice
  }
  if (auto dir = own_directory(); !dir.empty()) c.push_back(dir + "/" CXLKV_CUDA_LIBRARY_NAME);
#ifdef CXLKV_CUDA_BUILD_DIR
  c.push_back(CXLKV_CUDA_BUILD_DIR "/" CXLKV_CUDA_LIBRARY_NAME);
#endif
  c.emplace_back(CXLKV_CUDA_LIBRARY_NAME);  // dynamic linker search path
  return c;
}

}  // namespace

const char* to_string(Availability a) {
  switch (a) {
    case Availability::ready: return "ready";
    case Availability::library_not_found: return "library not found";
    case Availability::incompatible: return "incompatible library";
    case Availability::no_driver: return "no CUDA driver";
    case Availability::no_device: return "no GPU";
    case Availability::error: return "error";
  }
  return "?";
}

CudaLibrary::~CudaLibrary() {
  // Never dlclose: static cudart registers atexit handlers and fatbinaries
  // that must outlive every CUDA call of the process.
}

Result<std::shared_ptr<CudaLibrary>> CudaLibrary::load_from(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return Error(-ENOENT, "GPU library " + path + ": " + dlerror());
  auto get = reinterpret_cast<cxlkv_cuda_get_ops_fn>(dlsym(h, CXLKV_CUDA_ENTRY));
  if (!get) return Error(-EPROTO, "GPU library " + path + ": no symbol " CXLKV_CUDA_ENTRY);
  const cxlkv_cuda_ops* ops = get(CXLKV_CUDA_ABI_VERSION);
  if (!ops || ops->abi_version != CXLKV_CUDA_ABI_VERSION || ops->size < sizeof(cxlkv_cuda_ops))
    return Error(-EPROTO, "GPU library " + path + ": does not provide ABI version " +
                              std::to_string(CXLKV_CUDA_ABI_VERSION) + " (table " +
                              (ops ? "v" + std::to_string(ops->abi_version) + ", " + std::to_string(ops->size) +
                                         " bytes; need " + std::to_string(sizeof(cxlkv_cuda_ops))
                                   : std::string("refused")) +
                              ")");
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  return std::shared_ptr<CudaLibrary>(new CudaLibrary(h, ops, ec ? path : abs.string()));
}

Result<std::shared_ptr<CudaLibrary>> CudaLibrary::load() {
  std::string tried;
  for (const auto& c : candidates()) {
    // A path that does not exist is "not here", not an error worth reporting
    // in full; a file that exists but fails to load is reported as is.
    bool is_path = c.find('/') != std::string::npos;
    if (is_path && !std::filesystem::exists(c)) {
      tried += (tried.empty() ? "" : ", ") + c;
      continue;
    }
    auto r = load_from(c);
    if (r.ok()) {
      log().debug("gpu: loaded {}", r.value()->path());
      return r;
    }
    if (is_path || r.error().code() != -ENOENT) return r.error();
    tried += (tried.empty() ? "" : ", ") + c + " (linker search path)";
  }
  return Error(-ENOENT, "GPU library " CXLKV_CUDA_LIBRARY_NAME " not found (tried " + tried +
                            "; set CXLKV_CUDA_LIB to its path)");
}

std::shared_ptr<CudaLibrary> CudaLibrary::cpu_reference() {
  return std::shared_ptr<CudaLibrary>(new CudaLibrary(nullptr, &reference_ops(), "cpu-reference", true));
}

std::shared_ptr<CudaLibrary> CudaLibrary::from_table(const cxlkv_cuda_ops* ops, std::string name) {
  return std::shared_ptr<CudaLibrary>(new CudaLibrary(nullptr, ops, std::move(name)));
}

Error CudaLibrary::error(int rc, std::string_view what) const {
  const char* m = ops_->last_error();
  return Error(rc, std::string(what) + ": " + (m && *m ? m : "error " + std::to_string(rc)));
}

Result<DeviceInfo> CudaLibrary::probe() const {
  cxlkv_cuda_device_info i{};
  if (int rc = ops_->probe(&i); rc < 0) return error(rc, "GPU probe (" + path_ + ")");
  DeviceInfo d;
  d.device_count = i.device_count;
  d.name = i.name;
  d.cc_major = i.cc_major;
  d.cc_minor = i.cc_minor;
  d.can_use_host_pointer = i.can_use_host_pointer != 0;
  d.total_mem = i.total_mem;
  d.driver_version = i.driver_version;
  d.runtime_version = i.runtime_version;
  return d;
}

Status probe() {
  Status s;
  auto lib = CudaLibrary::load();
  if (!lib.ok()) {
    s.availability = lib.error().code() == -EPROTO ? Availability::incompatible : Availability::library_not_found;
    s.message = lib.error().message();
    return s;
  }
  s.library = lib.value()->path();
  auto dev = lib.value()->probe();
  if (!dev.ok()) {
    const int c = dev.error().code();
    s.availability = c == -ENOSYS ? Availability::no_driver : c == -ENODEV ? Availability::no_device : Availability::error;
    s.message = dev.error().message();
    return s;
  }
  s.device = dev.value();
  s.availability = Availability::ready;
  s.message = "GPU " + s.device.name + " (sm_" + std::to_string(s.device.cc_major) +
              std::to_string(s.device.cc_minor) + ", " + std::to_string(s.device.device_count) +
              " device(s), driver " + std::to_string(s.device.driver_version) + ") via " + s.library;
  return s;
}

}  // namespace cxlkv::gpu
