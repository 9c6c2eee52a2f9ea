// SPDX-License-Identifier: MIT
// Until the C API core lands its own cxlkv_last_error(), this file provides
// one, weak, so the core's definition replaces it without a link conflict.
#include "gpu/c_error.hpp"

#include <string>

#include "cxlkv/cxlkv.h"

namespace cxlkv::gpu {
namespace {
thread_local std::string g_message;
}

int set_c_error(const Error& e) {
  g_message = e.message();
  return e.code();
}

const char* c_error_message() { return g_message.c_str(); }
}  // namespace cxlkv::gpu

extern "C" __attribute__((weak)) const char* cxlkv_last_error(void) { return cxlkv::gpu::c_error_message(); }
