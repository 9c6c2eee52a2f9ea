// SPDX-License-Identifier: MIT
// C API: CPU gather-write / scatter-read (transfer/cpu_copy.hpp) with the
// pool-bounds checks the C caller cannot express in types.
#include <span>

#include "capi/capi.hpp"
#include "transfer/cpu_copy.hpp"

using cxlkv::capi::guarded;
using cxlkv::capi::set_error;

namespace {

// The block [off, off + bytes of chunks) must lie inside the pool.
int check_block(const char* fn, cxlkv_pool* pool, uint64_t off, const cxlkv_chunk* chunks, size_t n,
                std::span<const cxlkv::Chunk>* span) {
  if (!pool) return set_error(-EINVAL, std::string(fn) + ": pool is NULL");
  if (n && !chunks) return set_error(-EINVAL, std::string(fn) + ": chunks is NULL with nchunks " + std::to_string(n));
  *span = std::span<const cxlkv::Chunk>(chunks, n);
  auto bytes = cxlkv::chunk_list_bytes(*span);
  if (!bytes) return set_error(bytes.error().code(), std::string(fn) + ": " + bytes.error().message());
  if (!pool->region->contains(off, bytes.value()))
    return set_error(-ERANGE, std::string(fn) + ": pool " + pool->region->uri() + ": block at offset " +
                                  std::to_string(off) + " of " + std::to_string(bytes.value()) +
                                  " bytes lies outside the pool (" + std::to_string(pool->region->size()) +
                                  " bytes)");
  return 0;
}

}  // namespace

extern "C" {

int cxlkv_gather_write(struct cxlkv_pool* pool, uint64_t dst_off, const struct cxlkv_chunk* chunks,
                       size_t nchunks) {
  return guarded(__func__, [&] {
    std::span<const cxlkv::Chunk> span;
    if (int rc = check_block(__func__, pool, dst_off, chunks, nchunks, &span)) return rc;
    auto r = cxlkv::gather_write(pool->region->domain(), pool->region->at(dst_off), span);
    if (!r) return set_error(r.error().code(), std::string(__func__) + ": " + r.error().message());
    return 0;
  });
}

int cxlkv_scatter_read(struct cxlkv_pool* pool, uint64_t src_off, const struct cxlkv_chunk* chunks,
                       size_t nchunks) {
  return guarded(__func__, [&] {
    std::span<const cxlkv::Chunk> span;
    if (int rc = check_block(__func__, pool, src_off, chunks, nchunks, &span)) return rc;
    auto r = cxlkv::scatter_read(pool->region->domain(), pool->region->at(src_off), span);
    if (!r) return set_error(r.error().code(), std::string(__func__) + ": " + r.error().message());
    return 0;
  });
}

}  // extern "C"
