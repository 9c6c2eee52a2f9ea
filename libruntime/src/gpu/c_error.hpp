// SPDX-License-Identifier: MIT
// The GPU C API's half of cxlkv_last_error(): a failed call stores its
// message for the calling thread and returns the negative errno.
#pragma once

#include "cxlkv/result.hpp"

namespace cxlkv::gpu {
int set_c_error(const Error& e);
const char* c_error_message();
}  // namespace cxlkv::gpu
