// SPDX-License-Identifier: MIT
#include "transfer/cpu_copy.hpp"

#include <cerrno>
#include <string>

namespace cxlkv {

Result<size_t> chunk_list_bytes(std::span<const Chunk> chunks) {
  size_t total = 0;
  for (size_t i = 0; i < chunks.size(); i++) {
    const Chunk& c = chunks[i];
    if (c.addr == nullptr && c.len != 0)
      return Error(-EINVAL, "chunk list: chunk " + std::to_string(i) + " has a null address and " +
                                std::to_string(c.len) + " bytes");
    if (c.len > SIZE_MAX - total)
      return Error(-EOVERFLOW, "chunk list: total length overflows at chunk " + std::to_string(i));
    total += c.len;
  }
  return total;
}

namespace {
Result<size_t> check(const void* pool, std::span<const Chunk> chunks, const char* what) {
  auto total = chunk_list_bytes(chunks);
  if (!total) return Error(total.error().code(), std::string(what) + ": " + total.error().message());
  if (pool == nullptr && *total != 0)
    return Error(-EINVAL, std::string(what) + ": null pool block for " + std::to_string(*total) +
                              " bytes");
  return total;
}
}  // namespace

Result<size_t> gather_write(MemoryDomain& d, void* pool_dst, std::span<const Chunk> chunks) {
  auto total = check(pool_dst, chunks, "gather_write");
  if (!total) return total;
  char* dst = static_cast<char*>(pool_dst);
  for (const Chunk& c : chunks) {
    if (c.len == 0) continue;  // may have a null address
    d.copy_to_pool(dst, c.addr, c.len);
    dst += c.len;
  }
  // rule 3/5: the whole block is in pool memory before the caller publishes
  // the index entry that makes it visible.
  d.fence();
  return total;
}

Result<size_t> scatter_read(MemoryDomain& d, const void* pool_src, std::span<const Chunk> chunks) {
  auto total = check(pool_src, chunks, "scatter_read");
  if (!total) return total;
  const char* src = static_cast<const char*>(pool_src);
  if (*total == 0) return total;
  // rules 4/6: the whole block is invalidated in one sweep and one fence
  // orders it before every load, instead of a fence per chunk.
  d.invalidate_payload(src, *total);
  d.fence();
  for (const Chunk& c : chunks) {
    if (c.len == 0) continue;
    d.load_payload(c.addr, src, c.len);
    src += c.len;
  }
  return total;
}

}  // namespace cxlkv
