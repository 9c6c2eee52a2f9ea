// SPDX-License-Identifier: MIT
// C API of handoff leases (cxlkv.h, "handoff leases").
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "capi/capi.hpp"
#include "cxlkv/cxlkv.h"
#include "cxlkv/kv.hpp"

using namespace cxlkv;

namespace cxlkv::capi {
KvStore* kv_store_of(cxlkv_kv* kv);  // kv_capi.cpp
}

namespace {

int lease_call(const char* fn, cxlkv_kv* kv, const cxlkv_kv_key* keys, size_t n, int32_t* status,
               const std::function<Result<size_t>(KvStore&, std::span<const BlockKey>, std::span<int32_t>)>& op) {
  KvStore* s = capi::kv_store_of(kv);
  if (!s) return capi::set_error(-EINVAL, std::string(fn) + ": kv is required");
  if (n > INT_MAX) return capi::set_error(-EINVAL, std::string(fn) + ": " + std::to_string(n) + " blocks (at most INT_MAX)");
  if (n && !keys) return capi::set_error(-EINVAL, std::string(fn) + ": " + std::to_string(n) + " blocks but no keys");
  std::vector<BlockKey> k(n);
  for (size_t i = 0; i < n; i++) k[i] = BlockKey{keys[i].lo, keys[i].hi};
  std::vector<int32_t> scratch;
  if (!status) {
    scratch.resize(n);
    status = scratch.data();
  }
  auto r = op(*s, k, std::span<int32_t>(status, n));
  if (!r) return capi::set_error(r.error());
  if (!s->last_block_error().empty()) capi::set_error(0, s->last_block_error());
  else capi::clear_error();
  return static_cast<int>(r.value());
}

}  // namespace

extern "C" {

int cxlkv_kv_lease(struct cxlkv_kv* kv, const struct cxlkv_kv_key* keys, size_t n, uint64_t consumer_id,
                   uint32_t consumer_node, uint32_t ttl_ms, int32_t* status) {
  return capi::guarded(__func__, [&] {
    return lease_call(__func__, kv, keys, n, status, [&](KvStore& s, auto k, auto st) {
      return s.lease(k, consumer_id, consumer_node, ttl_ms, st);
    });
  });
}

int cxlkv_kv_lease_release(struct cxlkv_kv* kv, const struct cxlkv_kv_key* keys, size_t n, uint64_t consumer_id,
                           int32_t* status) {
  return capi::guarded(__func__, [&] {
    return lease_call(__func__, kv, keys, n, status,
                      [&](KvStore& s, auto k, auto st) { return s.lease_release(k, consumer_id, st); });
  });
}

}  // extern "C"
