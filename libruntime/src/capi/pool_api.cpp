// SPDX-License-Identifier: MIT
// C API core: errors, pools, offsets, carves.
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "capi/capi.hpp"
#include "kv/index_service.hpp"
#include "pool/format.hpp"

using cxlkv::capi::guarded;
using cxlkv::capi::set_error;

namespace cxlkv::capi {

namespace {
thread_local std::string last_error;
}

int set_error(int neg_errno, const std::string& msg) {
  last_error = msg;
  return neg_errno;
}

void clear_error() { last_error.clear(); }

}  // namespace cxlkv::capi

namespace {

void fill_info(const cxlkv::CarveInfo& c, cxlkv_carve_info* out) {
  std::memset(out, 0, sizeof *out);
  std::strncpy(out->name, c.name.c_str(), sizeof out->name - 1);
  out->offset = c.offset;
  out->size = c.size;
  out->memtype = static_cast<uint32_t>(c.memtype);
  out->flags = c.flags;
}

int no_pool(const char* fn) { return set_error(-EINVAL, std::string(fn) + ": pool is NULL"); }

}  // namespace

extern "C" {

const char* cxlkv_last_error(void) { return cxlkv::capi::last_error.c_str(); }

int cxlkv_pool_format(const char* uri, const struct cxlkv_format_opts* opts) {
  return guarded(__func__, [&] {
    if (!uri) return set_error(-EINVAL, "cxlkv_pool_format: uri is NULL");
    if (opts && opts->size < offsetof(cxlkv_format_opts, flags) + sizeof opts->flags)
      return set_error(-EINVAL, "cxlkv_pool_format: opts->size " + std::to_string(opts->size) +
                                    " is smaller than the oldest struct cxlkv_format_opts");
    cxlkv::PoolFormatOptions o;
    uint32_t flags = 0;
    if (opts) {
      o.size = opts->pool_size;
      if (opts->max_nodes) o.max_nodes = opts->max_nodes;
      flags = opts->flags;
      if (CXLKV_OPT_HAS(opts, max_locks) && opts->max_locks) o.max_locks = opts->max_locks;
      if (CXLKV_OPT_HAS(opts, index_entries)) o.index_entries = opts->index_entries;
      if (CXLKV_OPT_HAS(opts, rpc_bytes) && opts->rpc_bytes) o.extra_carves.emplace_back(CXLKV_CARVE_RPC, opts->rpc_bytes);
    }
    if (flags & CXLKV_FORMAT_F_INDEX_SERVICE)  // the pool's index mode
      o.extra_carves.emplace_back(cxlkv::kIndexServiceCarve, cxlkv::kIndexServiceCarveBytes);
    if (flags & ~(CXLKV_FORMAT_F_FORCE | CXLKV_FORMAT_F_NO_STANDARD | CXLKV_FORMAT_F_INDEX_SERVICE))
      return set_error(-EINVAL, "cxlkv_pool_format: unknown flags " + std::to_string(flags));
    o.force = flags & CXLKV_FORMAT_F_FORCE;
    o.standard = !(flags & CXLKV_FORMAT_F_NO_STANDARD);
    auto r = cxlkv::format_pool(uri, o);
    if (!r) return set_error(r.error());
    return 0;
  });
}

int cxlkv_pool_open(const char* uri, struct cxlkv_pool** out) {
  return guarded(__func__, [&] {
    if (!uri || !out) return set_error(-EINVAL, "cxlkv_pool_open: uri and out must not be NULL");
    *out = nullptr;
    auto r = cxlkv::Region::open(uri);
    if (!r) return set_error(r.error());
    *out = new cxlkv_pool{std::move(r).value()};
    return 0;
  });
}

void cxlkv_pool_close(struct cxlkv_pool* pool) { delete pool; }

void* cxlkv_pool_base(struct cxlkv_pool* pool) { return pool ? pool->region->base() : nullptr; }

uint64_t cxlkv_pool_size(struct cxlkv_pool* pool) { return pool ? pool->region->size() : 0; }

void* cxlkv_off_to_ptr(struct cxlkv_pool* pool, uint64_t off) {
  if (!pool || off >= pool->region->size()) return nullptr;
  return pool->region->at(off);
}

uint64_t cxlkv_ptr_to_off(struct cxlkv_pool* pool, const void* p) {
  if (!pool || !p) return CXLKV_BAD_OFFSET;
  auto* b = static_cast<const std::byte*>(p);
  const cxlkv::Region& r = *pool->region;
  if (b < r.base() || b >= r.base() + r.size()) return CXLKV_BAD_OFFSET;
  return r.offset_of(p);
}

int cxlkv_carve_create(struct cxlkv_pool* pool, const char* name, uint64_t size, uint32_t memtype,
                       struct cxlkv_carve_info* out) {
  return guarded(__func__, [&] {
    if (!pool) return no_pool(__func__);
    if (!name) return set_error(-EINVAL, "cxlkv_carve_create: name is NULL");
    if (memtype > CXLKV_MEM_MAX)
      return set_error(-EINVAL, "pool " + pool->region->uri() + ": carve '" + name + "': unknown memory type " +
                                    std::to_string(memtype));
    auto c = pool->region->carve_create(name, size, static_cast<cxlkv::MemType>(memtype));
    if (!c) return set_error(c.error());
    if (out) fill_info(c.value(), out);
    return 0;
  });
}

int cxlkv_carve_lookup(struct cxlkv_pool* pool, const char* name, struct cxlkv_carve_info* out) {
  return guarded(__func__, [&] {
    if (!pool) return no_pool(__func__);
    if (!name) return set_error(-EINVAL, "cxlkv_carve_lookup: name is NULL");
    auto c = pool->region->carve(name);
    if (!c) return set_error(c.error());
    if (out) fill_info(c.value(), out);
    return 0;
  });
}

int cxlkv_carve_list(struct cxlkv_pool* pool, struct cxlkv_carve_info* out, int max) {
  return guarded(__func__, [&] {
    if (!pool) return no_pool(__func__);
    if (max < 0 || (max > 0 && !out))
      return set_error(-EINVAL, "cxlkv_carve_list: out must hold max >= 0 entries");
    auto cs = pool->region->carves();
    for (int i = 0; i < max && i < static_cast<int>(cs.size()); i++) fill_info(cs[i], &out[i]);
    return static_cast<int>(cs.size());
  });
}

int cxlkv_carve_remove(struct cxlkv_pool* pool, const char* name) {
  return cxlkv_carve_remove_flags(pool, name, 0);
}

int cxlkv_carve_remove_flags(struct cxlkv_pool* pool, const char* name, uint32_t flags) {
  return guarded(__func__, [&] {
    if (!pool) return no_pool(__func__);
    if (!name) return set_error(-EINVAL, "cxlkv_carve_remove: name is NULL");
    if (flags & ~CXLKV_CARVE_RM_F_FORCE)
      return set_error(-EINVAL, "cxlkv_carve_remove: unknown flags " + std::to_string(flags));
    auto r = pool->region->carve_remove(name, flags & CXLKV_CARVE_RM_F_FORCE);
    if (!r) return set_error(r.error());
    return 0;
  });
}

}  // extern "C"
