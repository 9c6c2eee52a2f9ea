// SPDX-License-Identifier: MIT
// Internal helpers shared by the C API files of every area (capi/*.cpp):
// the pool handle, the thread-local last error, and the exception guard
// that keeps C++ exceptions from crossing the C boundary.
#pragma once

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "cxlkv/cxlkv.h"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"

struct cxlkv_pool {
  std::unique_ptr<cxlkv::Region> region;
};

namespace cxlkv {
class KvStore;
class NodeContext;
}

namespace cxlkv::capi {

// The KvStore behind a cxlkv_kv handle (kv_capi.cpp), for other C API files.
KvStore& kv_store(cxlkv_kv* kv);
// The NodeContext behind a cxlkv_node handle (sync_capi.cpp), for other C API files.
NodeContext& node_context(cxlkv_node* node);

// Record `msg` as this thread's last error and return `neg_errno`.
int set_error(int neg_errno, const std::string& msg);
inline int set_error(const Error& e) { return set_error(e.code(), e.message()); }
void clear_error();

// A message written inside a lambda with __func__ begins with "operator()";
// name the C function instead, so the caller's message says which call failed.
inline void name_function(const char* fn) {
  static constexpr char kLambda[] = "operator()";
  const char* m = cxlkv_last_error();
  if (std::strncmp(m, kLambda, sizeof kLambda - 1) == 0) {
    std::string fixed = std::string(fn) + (m + sizeof kLambda - 1);
    set_error(0, fixed);
  }
}

// Run `f` (returning int), turning exceptions into -ENOMEM / -EIO + message.
template <class F>
int guarded(const char* fn, F&& f) noexcept {
  try {
    int rc = f();
    if (rc < 0) name_function(fn);
    return rc;
  } catch (const std::bad_alloc&) {
    return set_error(-ENOMEM, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return set_error(-EIO, std::string(fn) + ": " + e.what());
  } catch (...) {
    return set_error(-EIO, std::string(fn) + ": unexpected exception");
  }
}

// Size-carrying options: does a struct of `given` bytes include `field`?
#define CXLKV_OPT_HAS(opts, field) \
  ((opts) && (opts)->size >= offsetof(std::remove_pointer_t<decltype(opts)>, field) + sizeof((opts)->field))

}  // namespace cxlkv::capi
