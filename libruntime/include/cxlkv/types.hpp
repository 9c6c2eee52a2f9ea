// SPDX-License-Identifier: MIT
// Small value types shared by several layers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlkv/cxlkv.h"  // struct cxlkv_chunk (C layout, shared with the C API)

namespace cxlkv {

// One contiguous piece of caller memory (engine tensor slice) in a gather /
// scatter list.  Same layout as the C API's struct cxlkv_chunk.
using Chunk = cxlkv_chunk;

}  // namespace cxlkv
