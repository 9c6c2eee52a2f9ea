// SPDX-License-Identifier: MIT
// C API of the KV store (cxlkv.h, "KV store" section) over KvSession.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "capi/capi.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/metrics.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"

using namespace cxlkv;

struct cxlkv_kv {
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

KvStore& capi::kv_store(cxlkv_kv* kv) { return kv->session->store(); }

namespace {

BlockKey key_of(const cxlkv_kv_key* k) { return BlockKey{k->lo, k->hi}; }

KvReservation res_of(const cxlkv_kv_block* b) {
  KvReservation r;
  r.key = BlockKey{b->key.lo, b->key.hi};
  r.slot = b->slot;
  r.status = b->status;
  r.length = b->length;
  r.loc_off = b->loc_off;
  r.loc_dev = b->loc_dev;
  r.loc_tier = b->loc_tier;
  r.version = b->version;
  return r;
}

KvPin pin_of(const cxlkv_kv_block* b) {
  KvPin p;
  p.key = BlockKey{b->key.lo, b->key.hi};
  p.slot = b->slot;
  p.length = b->length;
  p.loc_off = b->loc_off;
  p.loc_dev = b->loc_dev;
  p.loc_tier = b->loc_tier;
  p.status = b->status;
  p.version = b->version;
  p.tag = b->pin_tag;
  return p;
}

void to_c(const KvReservation& r, cxlkv_kv_block* b) {
  std::memset(b, 0, sizeof *b);
  b->key = cxlkv_kv_key{r.key.lo, r.key.hi};
  b->slot = r.slot;
  b->status = r.status;
  b->length = r.length;
  b->loc_off = r.loc_off;
  b->loc_dev = r.loc_dev;
  b->loc_tier = r.loc_tier;
  b->version = r.version;
}

void to_c(const KvPin& p, cxlkv_kv_block* b) {
  std::memset(b, 0, sizeof *b);
  b->key = cxlkv_kv_key{p.key.lo, p.key.hi};
  b->slot = p.slot;
  b->status = p.status;
  b->length = p.length;
  b->loc_off = p.loc_off;
  b->loc_dev = p.loc_dev;
  b->loc_tier = p.loc_tier;
  b->pin_tag = p.tag;
  b->version = p.version;
}

std::vector<BlockKey> keys_of(const cxlkv_kv_key* k, size_t n) {
  std::vector<BlockKey> v(n);
  for (size_t i = 0; i < n; i++) v[i] = key_of(&k[i]);
  return v;
}

// The status array of a batch call: the caller's, or scratch when it passed NULL.
struct StatusOut {
  StatusOut(int32_t* user, size_t n) : p(user) {
    if (!p) {
      scratch.resize(n);
      p = scratch.data();
    }
  }
  std::span<int32_t> span(size_t n) { return {p, n}; }
  int32_t* p;
  std::vector<int32_t> scratch;
};

size_t total_chunks(const uint32_t* nchunks, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; i++) t += nchunks[i];
  return t;
}

// Common argument checks of the batch calls; 0 or the -EINVAL to return.
int check_batch(const char* fn, cxlkv_kv* kv, const void* items, size_t n, bool with_chunks,
                const cxlkv_chunk* chunks, const uint32_t* nchunks) {
  if (!kv) return capi::set_error(-EINVAL, std::string(fn) + ": kv is required");
  if (n > INT_MAX) return capi::set_error(-EINVAL, std::string(fn) + ": " + std::to_string(n) + " blocks (at most INT_MAX)");
  if (n && !items) return capi::set_error(-EINVAL, std::string(fn) + ": " + std::to_string(n) + " blocks but no array");
  if (with_chunks && n) {
    if (!nchunks) return capi::set_error(-EINVAL, std::string(fn) + ": nchunks is required");
    if (!chunks && total_chunks(nchunks, n))
      return capi::set_error(-EINVAL, std::string(fn) + ": chunks is required");
  }
  return 0;
}

// Turn a batch call's result into the C return value and last error.
int batch_result(const Result<size_t>& r, KvStore& s) {
  if (!r) return capi::set_error(r.error());
  if (!s.last_block_error().empty()) capi::set_error(0, s.last_block_error());
  else capi::clear_error();
  return static_cast<int>(r.value());
}

int bad(const char* fn, const std::string& what) { return capi::set_error(-EINVAL, std::string(fn) + ": " + what); }

// An engine step's chains: nchains lengths that add up to its n blocks
// (`what`: "hashes" or "keys", as the caller gave them).  0 or the -EINVAL to return.
int check_chains(const char* fn, const uint32_t* chain_lens, size_t nchains, size_t n, const char* what) {
  if (nchains && !chain_lens) return bad(fn, "chain_lens is required");
  if (nchains > INT_MAX) return bad(fn, "more than INT_MAX chains");
  uint64_t sum = 0;
  for (size_t j = 0; j < nchains; j++) sum += chain_lens[j];
  if (sum != n)
    return bad(fn, "chain lengths add up to " + std::to_string(sum) + " blocks, " + std::to_string(n) + " " + what +
                       " given");
  return 0;
}

template <class Handle, class Conv, class Op>
int handle_batch(const char* fn, cxlkv_kv* kv, const cxlkv_kv_block* blocks, size_t n, int32_t* status, Conv conv,
                 Op op) {
  if (int e = check_batch(fn, kv, blocks, n, false, nullptr, nullptr)) return e;
  StatusOut st(status, n);
  std::vector<Handle> hs(n);
  for (size_t i = 0; i < n; i++) hs[i] = conv(&blocks[i]);
  KvStore& s = kv->session->store();
  return batch_result(op(s, std::span<const Handle>(hs), st.span(n)), s);
}
// One engine step's keys and chunk lists (cxlkv_kv_engine_put_chains /
// _get_many): the keys from the engine's hashes, the chunks from its paged
// cache's per-block template.  Each returns 0 or the -EINVAL to return.  A
// thread keeps one (step()), so a step's call reuses the last one's arrays.
struct EngineStep {
  std::vector<BlockKey> keys;
  std::vector<Chunk> ch;
  std::vector<uint32_t> counts;
  uint64_t bytes = 0;

  int hash(const char* fn, const void* ns, size_t ns_len, const void* items, size_t items_len,
           const uint32_t* item_lens, size_t nitems) {
    if ((!ns && ns_len) || (!items && items_len) || (nitems && !item_lens)) return bad(fn, "null buffer");
    auto r = engine_keys({static_cast<const std::byte*>(ns), ns_len}, {static_cast<const std::byte*>(items), items_len},
                         {item_lens, nitems});
    if (!r) return capi::set_error(r.error().code(), std::string(fn) + ": " + r.error().message());
    keys = std::move(r.value());
    return 0;
  }

  int chunks(const char* fn, const cxlkv_paged_chunks* p, const uint64_t* ids, size_t n) {
    bytes = 0;
    if (!n) return 0;
    if (!p) return bad(fn, "paged is required");
    if (p->size < sizeof *p) return bad(fn, "paged.size " + std::to_string(p->size) + " is too small");
    if (!p->nchunks || p->nchunks > UINT32_MAX || !p->addr || !p->stride || !p->len)
      return bad(fn, "paged has " + std::to_string(p->nchunks) + " chunks a block or a null array");
    for (size_t i = 0; i < p->nchunks; i++) bytes += p->len[i];
    ch.resize(n * p->nchunks);
    counts.assign(n, static_cast<uint32_t>(p->nchunks));
    Chunk* c = ch.data();
    for (size_t b = 0; b < n; b++) {
      if (ids[b] >= p->num_blocks)
        return bad(fn, "block id " + std::to_string(ids[b]) + " out of range 0.." + std::to_string(p->num_blocks - 1));
      const int64_t at = static_cast<int64_t>(ids[b]);
      for (size_t i = 0; i < p->nchunks; i++, c++)
        *c = Chunk{reinterpret_cast<void*>(p->addr[i] + static_cast<uint64_t>(at * p->stride[i])), p->len[i]};
    }
    return 0;
  }
};

EngineStep& step() {
  thread_local EngineStep s;
  return s;
}

}  // namespace

extern "C" {

int cxlkv_kv_open(struct cxlkv_pool* pool, const struct cxlkv_kv_opts* opts, struct cxlkv_kv** out) {
  return capi::guarded(__func__, [&] {
    if (!pool || !pool->region || !out) return bad(__func__, "pool and out are required");
    if (!CXLKV_OPT_HAS(opts, node)) return bad(__func__, "options (with size and node) are required");
    NodeOptions no;
    no.node = opts->node;
    no.heartbeat = true;
    auto node = NodeContext::attach(*pool->region, no);
    if (!node) return capi::set_error(node.error());
    KvOpenOptions ko;  // the index mode
    if (opts->flags & ~(CXLKV_KV_INDEX_LOCKS | CXLKV_KV_INDEX_SERVICE))
      return bad(__func__, "unknown flags");
    if ((opts->flags & CXLKV_KV_INDEX_LOCKS) && (opts->flags & CXLKV_KV_INDEX_SERVICE))
      return bad(__func__, "CXLKV_KV_INDEX_LOCKS and CXLKV_KV_INDEX_SERVICE both set");
    if (opts->flags & CXLKV_KV_INDEX_LOCKS) ko.index_mode = KvIndexMode::locks;
    if (opts->flags & CXLKV_KV_INDEX_SERVICE) ko.index_mode = KvIndexMode::service;
    auto s = open_kv_session(*pool->region, *node.value(), ko);
    if (!s) return capi::set_error(s.error());
    auto kv = std::make_unique<cxlkv_kv>();
    kv->node = std::move(node.value());
    kv->session = std::move(s.value());
    *out = kv.release();
    capi::clear_error();
    return 0;
  });
}

void cxlkv_kv_close(struct cxlkv_kv* kv) {
  if (!kv) return;
  kv->session.reset();  // before the node it uses
  delete kv;
}

int cxlkv_kv_block_keys(const uint32_t* tokens, size_t ntokens, size_t block_tokens, const void* extras,
                        size_t nextras, struct cxlkv_kv_key* out, size_t max) {
  return capi::guarded(__func__, [&] {
    if ((!tokens && ntokens) || (!extras && nextras) || (!out && max)) return bad(__func__, "null buffer");
    if (block_tokens == 0) return bad(__func__, "block_tokens is 0");
    auto keys = block_keys({tokens, ntokens}, block_tokens, {static_cast<const std::byte*>(extras), nextras});
    size_t n = std::min(keys.size(), max);
    for (size_t i = 0; i < n; i++) out[i] = cxlkv_kv_key{keys[i].lo, keys[i].hi};
    return static_cast<int>(n);
  });
}

uint64_t cxlkv_checksum64(const void* data, size_t len) {
  // No error path: a null buffer of length 0 hashes as empty, like XXH3.
  return data ? XXH3_64bits(data, len) : XXH3_64bits("", 0);
}

int cxlkv_kv_engine_keys(const void* ns, size_t ns_len, const void* items, size_t items_len,
                         const uint32_t* item_lens, size_t n, struct cxlkv_kv_key* out) {
  return capi::guarded(__func__, [&] {
    if ((!ns && ns_len) || (!items && items_len) || (n && (!item_lens || !out))) return bad(__func__, "null buffer");
    if (n > INT_MAX) return bad(__func__, "more than INT_MAX keys");
    auto keys = engine_keys({static_cast<const std::byte*>(ns), ns_len},
                            {static_cast<const std::byte*>(items), items_len}, {item_lens, n});
    if (!keys) return capi::set_error(keys.error());
    for (size_t i = 0; i < n; i++) out[i] = cxlkv_kv_key{keys.value()[i].lo, keys.value()[i].hi};
    capi::clear_error();
    return static_cast<int>(n);
  });
}

int cxlkv_kv_lookup(struct cxlkv_kv* kv, const struct cxlkv_kv_key* chain, size_t n) {
  return capi::guarded(__func__, [&] {
    if (!kv || (!chain && n)) return bad(__func__, "kv and chain are required");
    std::vector<BlockKey> keys(n);
    for (size_t i = 0; i < n; i++) keys[i] = key_of(&chain[i]);
    return static_cast<int>(kv->session->store().lookup(keys));
  });
}

int cxlkv_kv_reserve(struct cxlkv_kv* kv, const struct cxlkv_kv_key* key, const struct cxlkv_kv_key* parent,
                     uint64_t bytes, struct cxlkv_kv_block* out) {
  return capi::guarded(__func__, [&] {
    if (!kv || !key || !out) return bad(__func__, "kv, key and out are required");
    BlockKey pk = parent ? key_of(parent) : BlockKey{};
    auto r = kv->session->store().reserve(key_of(key), parent ? &pk : nullptr, bytes);
    if (!r) return capi::set_error(r.error());
    to_c(r.value(), out);
    return static_cast<int>(r->status);
  });
}

int cxlkv_kv_write(struct cxlkv_kv* kv, const struct cxlkv_kv_block* res, const struct cxlkv_chunk* chunks,
                   size_t nchunks) {
  return capi::guarded(__func__, [&] {
    if (!kv || !res || (!chunks && nchunks)) return bad(__func__, "kv, reservation and chunks are required");
    auto r = kv->session->store().write(res_of(res), {chunks, nchunks});
    return r ? 0 : capi::set_error(r.error());
  });
}

int cxlkv_kv_publish(struct cxlkv_kv* kv, const struct cxlkv_kv_block* res) {
  return capi::guarded(__func__, [&] {
    if (!kv || !res) return bad(__func__, "kv and reservation are required");
    auto r = kv->session->store().publish(res_of(res));
    return r ? 0 : capi::set_error(r.error());
  });
}

int cxlkv_kv_abort(struct cxlkv_kv* kv, const struct cxlkv_kv_block* res) {
  return capi::guarded(__func__, [&] {
    if (!kv || !res) return bad(__func__, "kv and reservation are required");
    auto r = kv->session->store().abort(res_of(res));
    return r ? 0 : capi::set_error(r.error());
  });
}

int cxlkv_kv_pin(struct cxlkv_kv* kv, const struct cxlkv_kv_key* key, struct cxlkv_kv_block* out) {
  return capi::guarded(__func__, [&] {
    if (!kv || !key || !out) return bad(__func__, "kv, key and out are required");
    auto p = kv->session->store().pin(key_of(key));
    if (!p) return capi::set_error(p.error());
    to_c(p.value(), out);
    return 0;
  });
}

int cxlkv_kv_fetch(struct cxlkv_kv* kv, const struct cxlkv_kv_block* pin, const struct cxlkv_chunk* chunks,
                   size_t nchunks) {
  return capi::guarded(__func__, [&] {
    if (!kv || !pin || (!chunks && nchunks)) return bad(__func__, "kv, pin and chunks are required");
    auto r = kv->session->store().fetch(pin_of(pin), {chunks, nchunks});
    return r ? 0 : capi::set_error(r.error());
  });
}

int cxlkv_kv_unpin(struct cxlkv_kv* kv, const struct cxlkv_kv_block* pin) {
  return capi::guarded(__func__, [&] {
    if (!kv || !pin) return bad(__func__, "kv and pin are required");
    auto r = kv->session->store().unpin(pin_of(pin));
    return r ? 0 : capi::set_error(r.error());
  });
}

int cxlkv_kv_reserve_chain(struct cxlkv_kv* kv, const struct cxlkv_kv_key* parent, const struct cxlkv_kv_key* keys,
                           size_t n, uint64_t bytes, struct cxlkv_kv_block* out, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_reserve_chain", kv, keys, n, false, nullptr, nullptr)) return e;
    if (n && !out) return bad("cxlkv_kv_reserve_chain", "out is required");
    StatusOut st(status, n);
    auto k = keys_of(keys, n);
    std::vector<KvReservation> rs(n);
    BlockKey pk = parent ? key_of(parent) : BlockKey{};
    KvStore& s = kv->session->store();
    auto r = s.reserve_chain(parent ? &pk : nullptr, k, bytes, rs, st.span(n));
    if (r)
      for (size_t i = 0; i < n; i++) to_c(rs[i], &out[i]);
    return batch_result(r, s);
  });
}

int cxlkv_kv_write_many(struct cxlkv_kv* kv, const struct cxlkv_kv_block* blocks, size_t n,
                        const struct cxlkv_chunk* chunks, const uint32_t* nchunks, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_write_many", kv, blocks, n, true, chunks, nchunks)) return e;
    StatusOut st(status, n);
    std::vector<KvReservation> rs(n);
    for (size_t i = 0; i < n; i++) rs[i] = res_of(&blocks[i]);
    KvStore& s = kv->session->store();
    size_t nc = n ? total_chunks(nchunks, n) : 0;
    return batch_result(s.write_many(rs, {chunks, nc}, {nchunks, n}, st.span(n)), s);
  });
}


int cxlkv_kv_publish_many(struct cxlkv_kv* kv, const struct cxlkv_kv_block* blocks, size_t n, int32_t* status) {
  return capi::guarded(__func__, [&] {
    return handle_batch<KvReservation>("cxlkv_kv_publish_many", kv, blocks, n, status, res_of,
                                       [](KvStore& s, auto h, auto st) { return s.publish_many(h, st); });
  });
}

int cxlkv_kv_abort_many(struct cxlkv_kv* kv, const struct cxlkv_kv_block* blocks, size_t n, int32_t* status) {
  return capi::guarded(__func__, [&] {
    return handle_batch<KvReservation>("cxlkv_kv_abort_many", kv, blocks, n, status, res_of,
                                       [](KvStore& s, auto h, auto st) { return s.abort_many(h, st); });
  });
}

int cxlkv_kv_unpin_many(struct cxlkv_kv* kv, const struct cxlkv_kv_block* pins, size_t n, int32_t* status) {
  return capi::guarded(__func__, [&] {
    return handle_batch<KvPin>("cxlkv_kv_unpin_many", kv, pins, n, status, pin_of,
                               [](KvStore& s, auto h, auto st) { return s.unpin_many(h, st); });
  });
}

int cxlkv_kv_pin_many(struct cxlkv_kv* kv, const struct cxlkv_kv_key* keys, size_t n, struct cxlkv_kv_block* out,
                      int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_pin_many", kv, keys, n, false, nullptr, nullptr)) return e;
    if (n && !out) return bad("cxlkv_kv_pin_many", "out is required");
    StatusOut st(status, n);
    auto k = keys_of(keys, n);
    std::vector<KvPin> ps(n);
    KvStore& s = kv->session->store();
    auto r = s.pin_many(k, ps, st.span(n));
    if (r)
      for (size_t i = 0; i < n; i++) to_c(ps[i], &out[i]);
    return batch_result(r, s);
  });
}

int cxlkv_kv_fetch_many(struct cxlkv_kv* kv, const struct cxlkv_kv_block* pins, size_t n,
                        const struct cxlkv_chunk* chunks, const uint32_t* nchunks, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_fetch_many", kv, pins, n, true, chunks, nchunks)) return e;
    StatusOut st(status, n);
    std::vector<KvPin> ps(n);
    for (size_t i = 0; i < n; i++) ps[i] = pin_of(&pins[i]);
    KvStore& s = kv->session->store();
    size_t nc = n ? total_chunks(nchunks, n) : 0;
    return batch_result(s.fetch_many(ps, {chunks, nc}, {nchunks, n}, st.span(n)), s);
  });
}

int cxlkv_kv_put_chain(struct cxlkv_kv* kv, const struct cxlkv_kv_key* parent, const struct cxlkv_kv_key* keys,
                       size_t n, uint64_t bytes, const struct cxlkv_chunk* chunks, const uint32_t* nchunks,
                       int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_put_chain", kv, keys, n, true, chunks, nchunks)) return e;
    StatusOut st(status, n);
    auto k = keys_of(keys, n);
    BlockKey pk = parent ? key_of(parent) : BlockKey{};
    KvStore& s = kv->session->store();
    size_t nc = n ? total_chunks(nchunks, n) : 0;
    return batch_result(s.put_chain(parent ? &pk : nullptr, k, bytes, {chunks, nc}, {nchunks, n}, st.span(n)), s);
  });
}

int cxlkv_kv_put_chains(struct cxlkv_kv* kv, const struct cxlkv_kv_key* parents, const uint32_t* chain_lens,
                        size_t nchains, const struct cxlkv_kv_key* keys, size_t n, uint64_t bytes,
                        const struct cxlkv_chunk* chunks, const uint32_t* nchunks, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_put_chains", kv, keys, n, true, chunks, nchunks)) return e;
    if (nchains && !chain_lens) return bad("cxlkv_kv_put_chains", "chain_lens is required");
    if (nchains > INT_MAX) return bad("cxlkv_kv_put_chains", "more than INT_MAX chains");
    StatusOut st(status, n);
    auto k = keys_of(keys, n);
    std::vector<BlockKey> ps(nchains);
    if (parents)
      for (size_t j = 0; j < nchains; j++) ps[j] = key_of(&parents[j]);
    KvStore& s = kv->session->store();
    size_t nc = n ? total_chunks(nchunks, n) : 0;
    return batch_result(s.put_chains(ps, {chain_lens, nchains}, k, bytes, {chunks, nc}, {nchunks, n}, st.span(n)),
                        s);
  });
}

int cxlkv_kv_get_many(struct cxlkv_kv* kv, const struct cxlkv_kv_key* keys, size_t n, const struct cxlkv_chunk* chunks,
                      const uint32_t* nchunks, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch("cxlkv_kv_get_many", kv, keys, n, true, chunks, nchunks)) return e;
    StatusOut st(status, n);
    auto k = keys_of(keys, n);
    KvStore& s = kv->session->store();
    size_t nc = n ? total_chunks(nchunks, n) : 0;
    return batch_result(s.get_many(k, {chunks, nc}, {nchunks, n}, st.span(n)), s);
  });
}

int cxlkv_kv_engine_put_chains(struct cxlkv_kv* kv, const struct cxlkv_paged_chunks* paged, const void* ns,
                               size_t ns_len, const void* items, size_t items_len, const uint32_t* item_lens,
                               size_t n, const uint32_t* chain_lens, size_t nchains, const uint64_t* block_ids,
                               int32_t* status, struct cxlkv_kv_key* keys_out) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, block_ids, n, false, nullptr, nullptr)) return e;
    if (int e = check_chains(__func__, chain_lens, nchains, n, "hashes")) return e;
    EngineStep& step = ::step();
    if (int e = step.hash(__func__, ns, ns_len, items, items_len, item_lens, n + nchains)) return e;
    if (int e = step.chunks(__func__, paged, block_ids, n)) return e;
    // Parent item j is the key of its hash, or a root (the all-zero key) where
    // the item is empty: an encoded hash is never empty (its tag byte).
    std::vector<BlockKey> parents(nchains);
    for (size_t j = 0; j < nchains; j++)
      if (item_lens[n + j]) parents[j] = step.keys[n + j];
    std::span<const BlockKey> k(step.keys.data(), n);
    if (keys_out)
      for (size_t i = 0; i < n; i++) keys_out[i] = cxlkv_kv_key{k[i].lo, k[i].hi};
    StatusOut st(status, n);
    KvStore& s = kv->session->store();
    return batch_result(s.put_chains(parents, {chain_lens, nchains}, k, step.bytes, step.ch, step.counts, st.span(n)),
                        s);
  });
}

int cxlkv_kv_paged_put_chains(struct cxlkv_kv* kv, const struct cxlkv_paged_chunks* paged,
                              const struct cxlkv_kv_key* keys, size_t n, const struct cxlkv_kv_key* parents,
                              const uint32_t* chain_lens, size_t nchains, const uint64_t* block_ids,
                              int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, keys, n, false, nullptr, nullptr)) return e;
    if (n && !block_ids) return bad(__func__, "block_ids is required");
    if (nchains && !parents) return bad(__func__, "parents is required");
    if (int e = check_chains(__func__, chain_lens, nchains, n, "keys")) return e;
    EngineStep& step = ::step();
    if (int e = step.chunks(__func__, paged, block_ids, n)) return e;
    step.keys.resize(n + nchains);
    for (size_t i = 0; i < n; i++) step.keys[i] = key_of(&keys[i]);
    for (size_t j = 0; j < nchains; j++) step.keys[n + j] = key_of(&parents[j]);  // all-zero: a root
    StatusOut st(status, n);
    KvStore& s = kv->session->store();
    return batch_result(s.put_chains({step.keys.data() + n, nchains}, {chain_lens, nchains}, {step.keys.data(), n},
                                     step.bytes, step.ch, step.counts, st.span(n)),
                        s);
  });
}

int cxlkv_kv_engine_get_many(struct cxlkv_kv* kv, const struct cxlkv_paged_chunks* paged, const void* ns,
                             size_t ns_len, const void* items, size_t items_len, const uint32_t* item_lens,
                             size_t n, const uint64_t* block_ids, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, block_ids, n, false, nullptr, nullptr)) return e;
    EngineStep& step = ::step();
    if (int e = step.hash(__func__, ns, ns_len, items, items_len, item_lens, n)) return e;
    if (int e = step.chunks(__func__, paged, block_ids, n)) return e;
    StatusOut st(status, n);
    KvStore& s = kv->session->store();
    return batch_result(s.get_many(step.keys, step.ch, step.counts, st.span(n)), s);
  });
}

int cxlkv_kv_paged_get_many(struct cxlkv_kv* kv, const struct cxlkv_paged_chunks* paged,
                            const struct cxlkv_kv_key* keys, size_t n, const uint64_t* block_ids, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, keys, n, false, nullptr, nullptr)) return e;
    if (n && !block_ids) return bad(__func__, "block_ids is required");
    EngineStep& step = ::step();
    if (int e = step.chunks(__func__, paged, block_ids, n)) return e;
    step.keys.resize(n);
    for (size_t i = 0; i < n; i++) step.keys[i] = key_of(&keys[i]);
    StatusOut st(status, n);
    KvStore& s = kv->session->store();
    return batch_result(s.get_many(step.keys, step.ch, step.counts, st.span(n)), s);
  });
}

int cxlkv_kv_reserved_addrs(struct cxlkv_kv* kv, const struct cxlkv_kv_block* blocks, size_t n, void** addrs,
                            int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, blocks, n, false, nullptr, nullptr)) return e;
    if (n && !addrs) return bad(__func__, "addrs is required");
    StatusOut st(status, n);
    KvStore& s = kv->session->store();
    int done = 0;
    for (size_t i = 0; i < n; i++) {
      std::byte* at = nullptr;
      st.p[i] = s.reserved_extent(res_of(&blocks[i]), &at);
      addrs[i] = st.p[i] == 0 ? at : nullptr;
      done += st.p[i] == 0;
    }
    capi::clear_error();
    return done;
  });
}

int cxlkv_kv_flush_in_place(struct cxlkv_kv* kv, const struct cxlkv_kv_block* blocks, size_t n, int32_t* status) {
  return capi::guarded(__func__, [&] {
    if (int e = check_batch(__func__, kv, blocks, n, false, nullptr, nullptr)) return e;
    StatusOut st(status, n);
    std::vector<KvReservation> rs(n);
    for (size_t i = 0; i < n; i++) rs[i] = res_of(&blocks[i]);
    const size_t done = kv->session->store().flush_in_place(rs, st.span(n));
    capi::clear_error();
    return int(done);
  });
}

int cxlkv_kv_remote_count(struct cxlkv_kv* kv, const char* counter, uint64_t n) {
  return capi::guarded(__func__, [&] {
    if (!kv || !counter) return bad(__func__, "kv and counter are required");
    const int which = remote_counter_index(counter);
    if (which < 0) return bad(__func__, (std::string("no remote tier counter named '") + counter + "'").c_str());
    if (auto r = kv->session->store().count_remote(which, n); !r) return capi::set_error(r.error());
    capi::clear_error();
    return 0;
  });
}

int cxlkv_kv_stats(struct cxlkv_kv* kv, struct cxlkv_kv_stats* out) {
  return capi::guarded(__func__, [&] {
    if (!kv || !out || out->size < sizeof(size_t)) return bad(__func__, "kv and out (with size) are required");
    KvStats st = kv->session->store().stats();
    auto& ix = store_index(kv->session->store());
    struct cxlkv_kv_stats s{};
    s.size = sizeof s;
    s.lookups = st.counters[CXLKV_CTR_LOOKUPS];
    s.hit_blocks = st.counters[CXLKV_CTR_HIT_BLOCKS];
    s.miss_blocks = st.counters[CXLKV_CTR_MISS_BLOCKS];
    s.reserves = st.counters[CXLKV_CTR_RESERVES];
    s.publishes = st.counters[CXLKV_CTR_PUBLISHES];
    s.fetches = st.counters[CXLKV_CTR_FETCHES];
    s.evictions = ix.counters().evictions;
    s.reclaims = ix.counters().reclaims;
    s.bytes_in = st.counters[CXLKV_CTR_BYTES_IN];
    s.bytes_out = st.counters[CXLKV_CTR_BYTES_OUT];
    s.nospc = st.counters[CXLKV_CTR_NOSPC];
    s.errors = st.counters[CXLKV_CTR_ERRORS];
    s.lookup_us_p50 = st.latency_us(CXLKV_LAT_LOOKUP, 50);
    s.lookup_us_p99 = st.latency_us(CXLKV_LAT_LOOKUP, 99);
    s.publish_us_p50 = st.latency_us(CXLKV_LAT_PUBLISH, 50);
    s.publish_us_p99 = st.latency_us(CXLKV_LAT_PUBLISH, 99);
    s.fetch_us_p50 = st.latency_us(CXLKV_LAT_FETCH, 50);
    s.fetch_us_p99 = st.latency_us(CXLKV_LAT_FETCH, 99);
    s.reserve_us_p50 = st.latency_us(CXLKV_LAT_RESERVE, 50);
    s.reserve_us_p99 = st.latency_us(CXLKV_LAT_RESERVE, 99);
    s.write_us_p50 = st.latency_us(CXLKV_LAT_WRITE, 50);
    s.write_us_p99 = st.latency_us(CXLKV_LAT_WRITE, 99);
    s.pin_us_p50 = st.latency_us(CXLKV_LAT_PIN, 50);
    s.pin_us_p99 = st.latency_us(CXLKV_LAT_PIN, 99);
    s.unpin_us_p50 = st.latency_us(CXLKV_LAT_UNPIN, 50);
    s.unpin_us_p99 = st.latency_us(CXLKV_LAT_UNPIN, 99);
    s.put_us_p50 = st.latency_us(CXLKV_LAT_PUT, 50);
    s.put_us_p99 = st.latency_us(CXLKV_LAT_PUT, 99);
    s.get_us_p50 = st.latency_us(CXLKV_LAT_GET, 50);
    s.get_us_p99 = st.latency_us(CXLKV_LAT_GET, 99);
    const size_t given = std::min(out->size, sizeof s);
    std::memcpy(out, &s, given);
    out->size = given;
    return 0;
  });
}

}  // extern "C"

// Leases (lease_capi.cpp) reach the store of a handle through this.
namespace cxlkv::capi {
KvStore* kv_store_of(cxlkv_kv* kv) { return kv && kv->session ? &kv->session->store() : nullptr; }
}  // namespace cxlkv::capi
