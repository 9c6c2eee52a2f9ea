// SPDX-License-Identifier: MIT
// KvStore handoff leases (docs/coherence.md "Leases") over the index's lease calls.
#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

Result<size_t> KvStore::lease(std::span<const BlockKey> keys, uint64_t consumer, uint32_t consumer_node,
                              uint32_t ttl_ms, std::span<int32_t> status) {
  block_error_.clear();
  if (status.size() < keys.size()) return Error(-EINVAL, "kv: lease: fewer statuses than keys");
  auto r = index_->lease_many(keys, consumer, consumer_node, ttl_ms, status);
  if (r && r.value() < keys.size()) block_error_ = PrefixIndex::last_block_message();
  return r;
}

Result<size_t> KvStore::lease_release(std::span<const BlockKey> keys, uint64_t consumer, std::span<int32_t> status) {
  block_error_.clear();
  if (status.size() < keys.size()) return Error(-EINVAL, "kv: lease release: fewer statuses than keys");
  auto r = index_->release_many(keys, consumer, status);
  if (r && r.value() < keys.size()) block_error_ = PrefixIndex::last_block_message();
  return r;
}

}  // namespace cxlkv
