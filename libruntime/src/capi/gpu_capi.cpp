// SPDX-License-Identifier: MIT
// The GPU section of the C API (cxlkv.h): thin wrappers over GpuPool that
// turn Errors into -errno plus cxlkv_last_error().  Plain C types only, so
// Python's ctypes can drive it (cuda/cxlkv_gpu_ctypes.py).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cxlkv/cxlkv.h"
#include "cxlkv/gpu.hpp"
#include "cxlkv/kv.hpp"
#include <climits>
#include <vector>
#include "capi/capi.hpp"

struct cxlkv_gpu {
  std::unique_ptr<cxlkv::gpu::GpuPool> pool;
};

namespace {
using cxlkv::Error;
using cxlkv::Result;
namespace gpu = cxlkv::gpu;

int fail(const Error& e) { return cxlkv::capi::set_error(e); }
using cxlkv::capi::guarded;

int check(const Result<void>& r) { return r.ok() ? 0 : fail(r.error()); }

int transfer(cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const uint64_t* ids, const uint64_t* offs, size_t n,
             void* stream, bool gather) {
  return guarded(gather ? "cxlkv_gpu_gather" : "cxlkv_gpu_scatter", [&] {
    if (!g || !layout || (n && (!ids || !offs))) return fail(Error(-EINVAL, "GPU transfer: NULL argument"));
    if (layout->size < sizeof(cxlkv_gpu_layout))
      return fail(Error(-EINVAL, "GPU transfer: layout.size " + std::to_string(layout->size) + " is smaller than " +
                                     std::to_string(sizeof(cxlkv_gpu_layout))));
    auto l = gpu::PagedLayout::from_c(*layout);
    std::span<const uint64_t> bi(ids, n), po(offs, n);
    return check(gather ? g->pool->gather(l, bi, po, stream) : g->pool->scatter(l, bi, po, stream));
  });
}
}  // namespace

extern "C" {

int cxlkv_gpu_probe(char* msg, size_t msg_len) {
  return guarded("cxlkv_gpu_probe", [&] {
    gpu::Status s = gpu::probe();
    if (msg && msg_len) std::snprintf(msg, msg_len, "%s", s.message.c_str());
    switch (s.availability) {
      case gpu::Availability::ready: return 0;
      case gpu::Availability::library_not_found: return fail(Error(-ENOENT, s.message));
      case gpu::Availability::incompatible: return fail(Error(-EPROTO, s.message));
      case gpu::Availability::no_driver: return fail(Error(-ENOSYS, s.message));
      case gpu::Availability::no_device: return fail(Error(-ENODEV, s.message));
      case gpu::Availability::error: break;
    }
    return fail(Error(-EIO, s.message));
  });
}

uint64_t cxlkv_gpu_layout_block_bytes(const cxlkv_gpu_layout* layout) {
  if (!layout || layout->size < sizeof(cxlkv_gpu_layout)) return 0;
  try {
    auto l = gpu::PagedLayout::from_c(*layout);
    return l.validate() ? l.block_bytes() : 0;
  } catch (...) {
    return 0;
  }
}

int cxlkv_gpu_open(void* base, uint64_t size, const cxlkv_gpu_opts* opts, cxlkv_gpu** out) {
  return guarded("cxlkv_gpu_open", [&] {
    if (!out) return fail(Error(-EINVAL, "GPU open: out is NULL"));
    *out = nullptr;
    cxlkv_gpu_opts o{sizeof(cxlkv_gpu_opts), 0, 0, 0};
    if (opts) {
      if (opts->size < sizeof(cxlkv_gpu_opts))
        return fail(Error(-EINVAL, "GPU open: opts.size " + std::to_string(opts->size) + " is too small"));
      o = *opts;
    }
    std::shared_ptr<gpu::CudaLibrary> lib;
    if (o.flags & CXLKV_GPU_F_CPU_REFERENCE) {
      lib = gpu::CudaLibrary::cpu_reference();
    } else {
      auto l = gpu::CudaLibrary::load();
      if (!l) return fail(l.error());
      if (auto d = l.value()->probe(); !d) return fail(d.error());
      lib = l.value();
    }
    gpu::PinOptions po;
    if (o.pin_chunk_bytes) po.chunk_bytes = o.pin_chunk_bytes;
    po.force_io_memory = (o.flags & CXLKV_GPU_F_FORCE_IOMEMORY) != 0;
    po.try_io_memory = (o.flags & CXLKV_GPU_F_NO_IOMEMORY) == 0;
    po.eager = (o.flags & CXLKV_GPU_F_PIN_EAGER) != 0;
    po.background = (o.flags & CXLKV_GPU_F_PIN_BACKGROUND) != 0;
    auto p = gpu::GpuPool::open(std::move(lib), base, size, po, o.device);
    if (!p) return fail(p.error());
    *out = new cxlkv_gpu{std::move(p.value())};
    return 0;
  });
}

int cxlkv_gpu_open_pool(cxlkv_pool* pool, const cxlkv_gpu_opts* opts, cxlkv_gpu** out) {
  if (!pool || !pool->region) {
    if (out) *out = nullptr;
    return fail(Error(-EINVAL, "cxlkv_gpu_open_pool: pool is NULL"));
  }
  return cxlkv_gpu_open(pool->region->base(), pool->region->size(), opts, out);
}

void cxlkv_gpu_close(cxlkv_gpu* g) { delete g; }

const char* cxlkv_gpu_pin_method(cxlkv_gpu* g) { return g ? gpu::to_string(g->pool->pin().method()) : ""; }

int cxlkv_gpu_gather(cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const uint64_t* block_ids,
                     const uint64_t* pool_offs, size_t nblocks, void* stream) {
  return transfer(g, layout, block_ids, pool_offs, nblocks, stream, true);
}

int cxlkv_gpu_scatter(cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const uint64_t* block_ids,
                      const uint64_t* pool_offs, size_t nblocks, void* stream) {
  return transfer(g, layout, block_ids, pool_offs, nblocks, stream, false);
}

int cxlkv_gpu_sparse_read(cxlkv_gpu* g, const cxlkv_gpu_sparse_list* lists, size_t nlists, const uint32_t* tokens,
                          size_t ntokens, uint64_t piece_bytes, void* stream) {
  return guarded("cxlkv_gpu_sparse_read", [&] {
    if (!g || (nlists && !lists) || (ntokens && !tokens)) return fail(Error(-EINVAL, "GPU sparse read: NULL argument"));
    return check(g->pool->sparse_read({lists, nlists}, {tokens, ntokens}, piece_bytes, stream));
  });
}

int cxlkv_gpu_pin_stats(cxlkv_gpu* g, struct cxlkv_gpu_pin_stats* out) {
  return guarded("cxlkv_gpu_pin_stats", [&] {
    if (!g || !out) return fail(Error(-EINVAL, "GPU pin stats: NULL argument"));
    if (out->size < sizeof(struct cxlkv_gpu_pin_stats))
      return fail(Error(-EINVAL, "GPU pin stats: out.size " + std::to_string(out->size) + " is smaller than " +
                                     std::to_string(sizeof(struct cxlkv_gpu_pin_stats))));
    const gpu::PinStats s = g->pool->pin().stats();
    std::memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->chunk_bytes = g->pool->pin().chunk_bytes();
    out->chunks_total = s.chunks_total;
    out->chunks_pinned = s.chunks_pinned;
    out->bytes_pinned = s.bytes_pinned;
    out->on_demand = s.on_demand;
    out->background = s.background;
    out->pin_seconds = s.pin_seconds;
    out->max_chunk_seconds = s.max_chunk_seconds;
    out->open_seconds = s.open_seconds;
    out->background_running = s.background_running;
    return 0;
  });
}

int cxlkv_gpu_pin_range(cxlkv_gpu* g, uint64_t off, uint64_t len) {
  return guarded("cxlkv_gpu_pin_range", [&] {
    if (!g) return fail(Error(-EINVAL, "GPU pin range: NULL handle"));
    if (len == UINT64_MAX) {
      g->pool->pin().start_background();
      return 0;
    }
    return check(g->pool->pin().pin_range(off, len));
  });
}

int cxlkv_gpu_sync(cxlkv_gpu* g, void* stream) {
  return guarded("cxlkv_gpu_sync", [&] {
    if (!g) return fail(Error(-EINVAL, "GPU sync: NULL handle"));
    return check(g->pool->sync(stream));
  });
}

}  // extern "C"

namespace {
// Common part of the two KV batch calls: arguments, the KvGpu over `g`,
// the status array, and the C return value.
template <class Op>
int kv_gpu_batch(const char* fn, cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout,
                 const cxlkv_kv_key* keys, const uint64_t* ids, size_t n, int32_t* status, Op op) {
  return guarded(fn, [&] {
    auto bad = [&](const std::string& m) { return fail(Error(-EINVAL, std::string(fn) + ": " + m)); };
    if (!kv || !g || !layout) return bad("kv, gpu and layout are required");
    if (layout->size < sizeof(cxlkv_gpu_layout)) return bad("layout.size is too small");
    if (n > INT_MAX) return bad("too many blocks");
    if (n && (!keys || !ids)) return bad("keys and block_ids are required");
    cxlkv::KvStore& store = cxlkv::capi::kv_store(kv);
    const auto& devs = store.devices();
    if (devs.empty() || g->pool->pin().base() != devs[0].base)
      return bad("gpu is not opened over this kv's pool (cxlkv_gpu_open_pool with the pool given to cxlkv_kv_open)");
    auto l = gpu::PagedLayout::from_c(*layout);
    std::vector<int32_t> scratch;
    if (!status) {
      scratch.resize(n);
      status = scratch.data();
    }
    std::vector<cxlkv::BlockKey> k(n);
    for (size_t i = 0; i < n; i++) k[i] = cxlkv::BlockKey{keys[i].lo, keys[i].hi};
    gpu::KvGpu kg(store, {g->pool.get()});
    Result<size_t> r = op(kg, l, std::span<const cxlkv::BlockKey>(k), std::span<const uint64_t>(ids, n),
                          std::span<int32_t>(status, n));
    if (!r) return fail(Error(r.error().code(), std::string(fn) + ": " + r.error().message()));
    if (!store.last_block_error().empty()) cxlkv::capi::set_error(0, store.last_block_error());
    else cxlkv::capi::clear_error();
    return static_cast<int>(r.value());
  });
}
}  // namespace

extern "C" {
int cxlkv_kv_gpu_put_chain(cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const cxlkv_kv_key* parent,
                           const cxlkv_kv_key* keys, const uint64_t* block_ids, size_t n, void* stream,
                           int32_t* status) {
  cxlkv::BlockKey pk = parent ? cxlkv::BlockKey{parent->lo, parent->hi} : cxlkv::BlockKey{};
  return kv_gpu_batch("cxlkv_kv_gpu_put_chain", kv, g, layout, keys, block_ids, n, status,
                      [&](gpu::KvGpu& kg, const gpu::PagedLayout& l, auto k, auto ids, auto st) {
                        return kg.put_chain(parent ? &pk : nullptr, k, l, ids, stream, st);
                      });
}

int cxlkv_kv_gpu_get_many(cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const cxlkv_kv_key* keys,
                          const uint64_t* block_ids, size_t n, void* stream, int32_t* status) {
  return kv_gpu_batch("cxlkv_kv_gpu_get_many", kv, g, layout, keys, block_ids, n, status,
                      [&](gpu::KvGpu& kg, const gpu::PagedLayout& l, auto k, auto ids, auto st) {
                        return kg.get_many(k, l, ids, stream, st);
                      });
}
}  // extern "C"

// ---- layer-wise load and save (docs/gpu.md "Layer-wise transfers") ----------------------------------------

struct cxlkv_gpu_load {
  std::unique_ptr<cxlkv::gpu::LayerLoad> load;
  size_t n = 0;
};
struct cxlkv_gpu_save {
  std::unique_ptr<cxlkv::gpu::LayerSave> save;
  size_t n = 0;
};

namespace {
// Arguments shared by the layer-wise entry points: the store (checked to be
// the one the gpu was opened over), the layout and the keys.
struct LayerArgs {
  cxlkv::KvStore* store = nullptr;
  gpu::PagedLayout layout;
  std::vector<cxlkv::BlockKey> keys;
};
int layer_args(const char* fn, cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const cxlkv_kv_key* keys,
               const uint64_t* ids, size_t n, void* out, LayerArgs& a) {
  auto bad = [&](const std::string& m) { return fail(Error(-EINVAL, std::string(fn) + ": " + m)); };
  if (!out) return bad("out is NULL");
  if (!kv || !g || !layout) return bad("kv, gpu and layout are required");
  if (layout->size < sizeof(cxlkv_gpu_layout)) return bad("layout.size is too small");
  if (n > INT_MAX) return bad("too many blocks");
  if (n && (!keys || !ids)) return bad("keys and block_ids are required");
  a.store = &cxlkv::capi::kv_store(kv);
  const auto& devs = a.store->devices();
  if (devs.empty() || g->pool->pin().base() != devs[0].base)
    return bad("gpu is not opened over this kv's pool (cxlkv_gpu_open_pool with the pool given to cxlkv_kv_open)");
  a.layout = gpu::PagedLayout::from_c(*layout);
  a.keys.resize(n);
  for (size_t i = 0; i < n; i++) a.keys[i] = cxlkv::BlockKey{keys[i].lo, keys[i].hi};
  return 0;
}
}  // namespace

extern "C" {

int cxlkv_kv_gpu_load_layers(cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const cxlkv_kv_key* keys,
                             const uint64_t* block_ids, size_t n, uint32_t layers_per_group, void* stream,
                             int32_t* status, cxlkv_gpu_load** out) {
  return guarded("cxlkv_kv_gpu_load_layers", [&] {
    if (out) *out = nullptr;
    LayerArgs a;
    if (int rc = layer_args("cxlkv_kv_gpu_load_layers", kv, g, layout, keys, block_ids, n, out, a)) return rc;
    std::vector<int32_t> scratch;
    if (!status) {
      scratch.resize(n);
      status = scratch.data();
    }
    gpu::KvGpu kg(*a.store, {g->pool.get()});
    auto l = kg.load_layers(a.keys, a.layout, {block_ids, n}, stream,
                            layers_per_group ? layers_per_group : a.layout.num_layers, {status, n});
    if (!l) return fail(Error(l.error().code(), "cxlkv_kv_gpu_load_layers: " + l.error().message()));
    const int loading = static_cast<int>(l.value()->blocks_loading());
    *out = new cxlkv_gpu_load{std::move(l.value()), n};
    cxlkv::capi::clear_error();
    return loading;
  });
}

int cxlkv_gpu_load_groups(cxlkv_gpu_load* load) {
  if (!load) return fail(Error(-EINVAL, "cxlkv_gpu_load_groups: load is NULL"));
  return static_cast<int>(load->load->groups());
}

int cxlkv_gpu_load_wait(cxlkv_gpu_load* load, uint32_t layer) {
  return guarded("cxlkv_gpu_load_wait", [&] {
    if (!load) return fail(Error(-EINVAL, "cxlkv_gpu_load_wait: load is NULL"));
    return check(load->load->wait_layer(layer));
  });
}

int cxlkv_gpu_load_stream_wait(cxlkv_gpu_load* load, uint32_t layer, void* stream) {
  return guarded("cxlkv_gpu_load_stream_wait", [&] {
    if (!load) return fail(Error(-EINVAL, "cxlkv_gpu_load_stream_wait: load is NULL"));
    return check(load->load->stream_wait_layer(layer, stream));
  });
}

int cxlkv_gpu_load_ready(cxlkv_gpu_load* load, uint32_t layer) {
  return guarded("cxlkv_gpu_load_ready", [&] {
    if (!load) return fail(Error(-EINVAL, "cxlkv_gpu_load_ready: load is NULL"));
    auto r = load->load->layer_ready(layer);
    if (!r) return fail(r.error());
    return r.value() ? 1 : 0;
  });
}

void* cxlkv_gpu_load_event(cxlkv_gpu_load* load, uint32_t layer) { return load ? load->load->event(layer) : nullptr; }

int cxlkv_gpu_load_finish(cxlkv_gpu_load* load, int32_t* status) {
  return guarded("cxlkv_gpu_load_finish", [&] {
    if (!load) return fail(Error(-EINVAL, "cxlkv_gpu_load_finish: load is NULL"));
    std::unique_ptr<cxlkv_gpu_load> own(load);
    std::vector<int32_t> scratch;
    if (!status) {
      scratch.resize(own->n);
      status = scratch.data();
    }
    auto r = own->load->finish({status, own->n});
    if (!r) return fail(r.error());
    cxlkv::capi::clear_error();
    return static_cast<int>(r.value());
  });
}

int cxlkv_kv_gpu_save_begin(cxlkv_kv* kv, cxlkv_gpu* g, const cxlkv_gpu_layout* layout, const cxlkv_kv_key* parent,
                            const cxlkv_kv_key* keys, const uint64_t* block_ids, size_t n, int32_t* status,
                            cxlkv_gpu_save** out) {
  return guarded("cxlkv_kv_gpu_save_begin", [&] {
    if (out) *out = nullptr;
    LayerArgs a;
    if (int rc = layer_args("cxlkv_kv_gpu_save_begin", kv, g, layout, keys, block_ids, n, out, a)) return rc;
    std::vector<int32_t> scratch;
    if (!status) {
      scratch.resize(n);
      status = scratch.data();
    }
    cxlkv::BlockKey pk = parent ? cxlkv::BlockKey{parent->lo, parent->hi} : cxlkv::BlockKey{};
    gpu::KvGpu kg(*a.store, {g->pool.get()});
    auto s = kg.save_layers(parent ? &pk : nullptr, a.keys, a.layout, {block_ids, n}, {status, n});
    if (!s) return fail(Error(s.error().code(), "cxlkv_kv_gpu_save_begin: " + s.error().message()));
    int ok = 0;
    for (size_t i = 0; i < n; i++) ok += status[i] == CXLKV_KV_RESERVED || status[i] == CXLKV_KV_EXISTS;
    *out = new cxlkv_gpu_save{std::move(s.value()), n};
    cxlkv::capi::clear_error();
    return ok;
  });
}

int cxlkv_gpu_save_layer(cxlkv_gpu_save* save, uint32_t layer, void* stream) {
  return guarded("cxlkv_gpu_save_layer", [&] {
    if (!save) return fail(Error(-EINVAL, "cxlkv_gpu_save_layer: save is NULL"));
    return check(save->save->save_layer(layer, stream));
  });
}

int cxlkv_gpu_save_finish(cxlkv_gpu_save* save, int32_t* status) {
  return guarded("cxlkv_gpu_save_finish", [&] {
    if (!save) return fail(Error(-EINVAL, "cxlkv_gpu_save_finish: save is NULL"));
    std::unique_ptr<cxlkv_gpu_save> own(save);
    std::vector<int32_t> scratch;
    if (!status) {
      scratch.resize(own->n);
      status = scratch.data();
    }
    auto r = own->save->finish({status, own->n});
    if (!r) return fail(r.error());
    cxlkv::capi::clear_error();
    return static_cast<int>(r.value());
  });
}

void cxlkv_gpu_save_abort(cxlkv_gpu_save* save) {
  try {
    delete save;  // LayerSave's destructor aborts (after the enqueued DMA)
  } catch (...) {
  }
}

}  // extern "C"
