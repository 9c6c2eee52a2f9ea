// SPDX-License-Identifier: MIT
// C API of the KV store (cxlkv.h, "KV store" section) over KvSession.
#include <cstring>

#include "capi/capi.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"

using namespace cxlkv;

struct cxlkv_kv {
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

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
  return p;
}

int bad(const char* fn, const char* what) { return capi::set_error(-EINVAL, std::string(fn) + ": " + what); }

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
    auto s = open_kv_session(*pool->region, *node.value());
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
    std::memset(out, 0, sizeof *out);
    out->key = *key;
    out->slot = r->slot;
    out->status = r->status;
    out->length = r->length;
    out->loc_off = r->loc_off;
    out->loc_dev = r->loc_dev;
    out->loc_tier = r->loc_tier;
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
    std::memset(out, 0, sizeof *out);
    out->key = *key;
    out->slot = p->slot;
    out->length = p->length;
    out->loc_off = p->loc_off;
    out->loc_dev = p->loc_dev;
    out->loc_tier = p->loc_tier;
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

int cxlkv_kv_stats(struct cxlkv_kv* kv, struct cxlkv_kv_stats* out) {
  return capi::guarded(__func__, [&] {
    if (!kv || !out || out->size < sizeof(size_t)) return bad(__func__, "kv and out (with size) are required");
    KvStats st = kv->session->store().stats();
    auto& ix = kv->session->store().index();
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
    std::memcpy(out, &s, std::min(out->size, sizeof s));
    out->size = std::min(out->size, sizeof s);
    return 0;
  });
}

}  // extern "C"
