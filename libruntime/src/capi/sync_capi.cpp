// SPDX-License-Identifier: MIT
// C API of the sync area: nodes, cross-host locks, lock manager, allocator,
// object store (declarations in cxlkv.h, section "sync").
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "capi/capi.hpp"
#include "cxlkv/alloc.hpp"
#include "cxlkv/cxlkv.h"
#include "cxlkv/objstore.hpp"
#include "cxlkv/sync.hpp"
#include "index/index_check.hpp"

struct cxlkv_node {
  std::unique_ptr<cxlkv::NodeContext> ctx;
  std::unique_ptr<cxlkv::NodeHeap> heap;  // opened on first cxlkv_alloc/free
  std::mutex mu;
};

struct cxlkv_lock_manager {
  std::unique_ptr<cxlkv::LockManager> mgr;
};

cxlkv::NodeContext& cxlkv::capi::node_context(cxlkv_node* node) { return *node->ctx; }

using cxlkv::capi::guarded;
using cxlkv::capi::set_error;

namespace {
int einval(const char* fn) { return set_error(-EINVAL, std::string(fn) + ": NULL argument"); }

cxlkv::Result<cxlkv::NodeHeap*> heap_of(cxlkv_node* n) {
  std::lock_guard<std::mutex> g(n->mu);
  if (!n->heap) {
    auto h = cxlkv::NodeHeap::open(*n->ctx);
    if (!h) return h.error();
    n->heap = std::move(h.value());
  }
  return n->heap.get();
}

// A block the KV store's index names (reserved, published or
// being evicted) is never handed back by cxlkv_free: the index still points
// at it and would serve whatever the next owner writes there.
cxlkv::Result<void> refuse_index_block(cxlkv::NodeContext& ctx, cxlkv::NodeHeap& heap, uint64_t off) {
  auto size = heap.usable_size(off);
  if (!size) return {};  // not an allocated block: free() names the error
  auto named = cxlkv::index_entry_naming(ctx.region(), ctx.domain(), off, size.value());
  if (!named) return named.error();
  if (!named.value()) return {};
  return cxlkv::Error(-EBUSY, "pool " + ctx.region().uri() + ": free of offset " + std::to_string(off) +
                                  ": the KV store's index names it as " + cxlkv::describe_named_block(*named.value()) +
                                  "; KV blocks are freed by eviction or `cxlkvctl kv rm`, not by cxlkv_free");
}

int lock_result(const cxlkv::Result<cxlkv::Acquired>& r) {
  if (!r) return set_error(r.error());
  cxlkv::capi::clear_error();
  return r.value() == cxlkv::Acquired::recovered ? 1 : 0;
}
}  // namespace

extern "C" {

int cxlkv_node_attach(struct cxlkv_pool* pool, const struct cxlkv_node_opts* opts, struct cxlkv_node** out) {
  return guarded(__func__, [&, fn = __func__] {
    if (!pool || !opts || !out) return einval(fn);
    // DESIGN.md "Conventions": the struct carries its size; one too small
    // to hold the node id (0: never set) is a caller's bug, not a default.
    if (!CXLKV_OPT_HAS(opts, node))
      return set_error(-EINVAL, std::string(fn) + ": opts->size " + std::to_string(opts->size) +
                                    " is smaller than the oldest struct cxlkv_node_opts (set it to sizeof)");
    if (CXLKV_OPT_HAS(opts, flags) && (opts->flags & ~CXLKV_NODE_F_HEARTBEAT))
      return set_error(-EINVAL, std::string(fn) + ": unknown flags " + std::to_string(opts->flags & ~CXLKV_NODE_F_HEARTBEAT));
    cxlkv::NodeOptions o;
    o.node = opts->node;
    if (CXLKV_OPT_HAS(opts, flags)) o.heartbeat = (opts->flags & CXLKV_NODE_F_HEARTBEAT) != 0;
    if (CXLKV_OPT_HAS(opts, heartbeat_ms) && opts->heartbeat_ms) o.heartbeat_ms = opts->heartbeat_ms;
    auto r = cxlkv::NodeContext::attach(*pool->region, o);
    if (!r) return set_error(r.error());
    auto* n = new cxlkv_node;
    n->ctx = std::move(r.value());
    *out = n;
    return 0;
  });
}

void cxlkv_node_detach(struct cxlkv_node* node) { delete node; }

int cxlkv_node_remove_local(struct cxlkv_pool* pool, uint32_t node) {
  return guarded(__func__, [&, fn = __func__] {
    if (!pool) return einval(fn);
    auto r = cxlkv::remove_node_local(*pool->region, node);
    if (!r) return set_error(r.error().code(), std::string(fn) + ": " + r.error().message());
    cxlkv::capi::clear_error();
    return 0;
  });
}

namespace {
// Lock ids below CXLKV_LOCK_FIRST_USER belong to cxlkv's own layers (the
// prefix index's stripe locks, the allocator, the object store); a C user
// taking one would stall those layers on every host.
int reserved_lock(const char* fn, uint32_t lock_id) {
  return set_error(-EINVAL, std::string(fn) + ": lock id " + std::to_string(lock_id) +
                                " is reserved for cxlkv's own locks (user lock ids start at " +
                                std::to_string(CXLKV_LOCK_FIRST_USER) + ")");
}
}  // namespace

int cxlkv_lock_acquire(struct cxlkv_node* node, uint32_t lock_id) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node) return einval(fn);
    if (lock_id < CXLKV_LOCK_FIRST_USER) return reserved_lock(fn, lock_id);
    cxlkv::TwoTierLock l(*node->ctx, lock_id);
    return lock_result(l.lock());
  });
}

int cxlkv_lock_acquire_timeout(struct cxlkv_node* node, uint32_t lock_id, uint64_t timeout_ns) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node) return einval(fn);
    if (lock_id < CXLKV_LOCK_FIRST_USER) return reserved_lock(fn, lock_id);
    cxlkv::TwoTierLock l(*node->ctx, lock_id);
    return lock_result(l.try_lock_for(std::chrono::nanoseconds(timeout_ns)));
  });
}

int cxlkv_lock_release(struct cxlkv_node* node, uint32_t lock_id) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node) return einval(fn);
    if (lock_id < CXLKV_LOCK_FIRST_USER) return reserved_lock(fn, lock_id);
    cxlkv::TwoTierLock l(*node->ctx, lock_id);
    auto r = l.unlock();
    return r ? 0 : set_error(r.error());
  });
}

int cxlkv_lock_manager_start(struct cxlkv_pool* pool, const struct cxlkv_lock_manager_opts* opts,
                             struct cxlkv_lock_manager** out) {
  return guarded(__func__, [&, fn = __func__] {
    if (!pool || !out) return einval(fn);
    cxlkv::LockManagerOptions o;
    if (CXLKV_OPT_HAS(opts, node)) o.node = opts->node;
    if (CXLKV_OPT_HAS(opts, lease_ms) && opts->lease_ms) o.lease_ms = opts->lease_ms;
    if (CXLKV_OPT_HAS(opts, flags)) o.wait_for_lease = (opts->flags & CXLKV_LOCK_MANAGER_F_WAIT) != 0;
    auto r = cxlkv::LockManager::create(*pool->region, o);
    if (!r) return set_error(r.error());
    r.value()->start();
    *out = new cxlkv_lock_manager{std::move(r.value())};
    return 0;
  });
}

void cxlkv_lock_manager_stop(struct cxlkv_lock_manager* mgr) { delete mgr; }

int cxlkv_alloc(struct cxlkv_node* node, uint64_t size, uint64_t* off) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node || !off) return einval(fn);
    auto h = heap_of(node);
    if (!h) return set_error(h.error());
    auto r = h.value()->alloc(size);
    if (!r) return set_error(r.error());
    *off = r.value();
    return 0;
  });
}

int cxlkv_free(struct cxlkv_node* node, uint64_t off) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node) return einval(fn);
    auto h = heap_of(node);
    if (!h) return set_error(h.error());
    if (auto busy = refuse_index_block(*node->ctx, *h.value(), off); !busy) return set_error(busy.error());
    auto r = h.value()->free(off);
    return r ? 0 : set_error(r.error());
  });
}

int cxlkv_heap_stats(struct cxlkv_node* node, struct cxlkv_heap_stats* out) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node || !out) return einval(fn);
    auto h = heap_of(node);
    if (!h) return set_error(h.error());
    auto s = h.value()->stats();
    out->allocs = s.allocs;
    out->frees = s.frees;
    out->remote_frees_sent = s.remote_frees_sent;
    out->remote_frees_drained = s.remote_frees_drained;
    out->bytes_in_use = s.bytes_in_use;
    out->chunks_owned = s.chunks_owned;
    out->chunk_refills = s.chunk_refills;
    out->chunk_returns = s.chunk_returns;
    out->enospc = s.enospc;
    return 0;
  });
}

int cxlkv_obj_put(struct cxlkv_node* node, const char* name, uint64_t off) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node || !name) return einval(fn);
    auto s = cxlkv::ObjectStore::open(*node->ctx);
    if (!s) return set_error(s.error());
    auto r = s.value().put(name, off);
    return r ? 0 : set_error(r.error());
  });
}

int cxlkv_obj_get(struct cxlkv_node* node, const char* name, uint64_t* off) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node || !name || !off) return einval(fn);
    auto s = cxlkv::ObjectStore::open(*node->ctx);
    if (!s) return set_error(s.error());
    auto r = s.value().get(name);
    if (!r) return set_error(r.error());
    *off = r.value();
    return 0;
  });
}

int cxlkv_obj_destroy(struct cxlkv_node* node, const char* name) {
  return guarded(__func__, [&, fn = __func__] {
    if (!node || !name) return einval(fn);
    auto s = cxlkv::ObjectStore::open(*node->ctx);
    if (!s) return set_error(s.error());
    auto r = s.value().destroy(name);
    return r ? 0 : set_error(r.error());
  });
}

}  // extern "C"
