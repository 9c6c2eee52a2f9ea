// SPDX-License-Identifier: MIT
// Superblock helpers shared by Region, the pool formatter and tests.
// The layout itself is uapi/cxlkv_pool.h; validate_superblock() is declared in
// cxlkv/region.hpp.
#pragma once

#include <string>
#include <string_view>

#include "uapi/cxlkv_pool.h"

namespace cxlkv::region {

// A carve name: 1 .. CXLKV_CARVE_NAME_MAX-1 characters of [a-z0-9_.-].
bool valid_carve_name(std::string_view name);
// Why `name` is not a valid carve name, for messages.
std::string carve_name_rule();

// Set `checksum` for the current contents (the field itself read as zero).
void seal_superblock(cxlkv_superblock& sb);

// "1 GiB", "2 MiB", "4096 B": sizes in messages.
std::string human_size(uint64_t bytes);

}  // namespace cxlkv::region
