// SPDX-License-Identifier: MIT
// Where a KvStore's locking index calls go (docs/rpc.md "The index service": an index
// service mode selectable per pool).  The lock-based path calls the store's
// own PrefixIndex (this process takes the stripe locks); the index service
// path sends the same batch calls over the shared-memory RPC to the process
// that owns the index (kv/index_service.hpp).  Both act on the same
// on-pool index, so statuses, locations and chain semantics are the same;
// everything lock-free (lookup, handle checks, wait_ready) reads the index
// directly in both modes.
#pragma once

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>

#include "index/prefix_index.hpp"

namespace cxlkv {

class KvIndexBackend {
 public:
  virtual ~KvIndexBackend() = default;
  virtual Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                       std::span<Reservation> out, std::span<int32_t> status, bool through_busy) = 0;
  virtual Result<size_t> publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                      std::span<int32_t> status) = 0;
  virtual Result<size_t> abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                    std::span<int32_t> status) = 0;
  // publish_many that also checks each entry's version and location under
  // the stripe lock (PrefixIndex::publish_many of reservations); false where
  // the backend cannot (the index service's protocol carries no versions):
  // the store then checks the handles itself before publishing.
  virtual bool publish_checks_versions() const { return false; }
  virtual Result<size_t> publish_many_versioned(std::span<const Reservation>, std::span<const BlockKey>,
                                                std::span<int32_t>) {
    return Error(-ENOTSUP, std::string("kv: the ") + mode() + " index path cannot check versions at publish");
  }
  virtual Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                  std::span<int32_t> status) = 0;
  virtual Result<size_t> unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                    std::span<int32_t> status) = 0;
  // Take and drop the locks of `keys` ahead of several calls on them
  // (PrefixIndex::lock_ahead); nothing where the locks are not this
  // process's to take (the index service takes its own).
  virtual void lock_ahead(std::span<const BlockKey> /*keys*/) {}
  // The node and incarnation (low 32 bits) that own reservations made
  // through this backend (the handle check of docs/integrity.md "Fencing: handles carry the entry version"): this node for the
  // lock-based path, the serving node for the service.
  virtual void reservation_owner(uint32_t* node, uint32_t* incarnation) const = 0;
  // "locks" or "service" (metrics, messages).
  virtual const char* mode() const = 0;
  // The message for a block that the last batch call refused with `code`
  // (empty: none better than the code's name).  On the lock-based path the
  // index keeps the first failure's message in this thread; the index
  // service's refusals come back as codes only, so that backend names the
  // pool, the service and the cause the code stands for (docs/integrity.md "Checked metadata").
  virtual std::string block_message(const char* /*op*/, const BlockKey& /*key*/, int32_t /*code*/) const {
    return PrefixIndex::last_block_message();
  }
};

// The lock-based path: the store's own PrefixIndex.
class LocalIndexBackend final : public KvIndexBackend {
 public:
  LocalIndexBackend(PrefixIndex& ix, uint32_t node, uint32_t inc) : ix_(ix), node_(node), inc_(inc) {}
  Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                               std::span<Reservation> out, std::span<int32_t> status, bool through_busy) override {
    return ix_.reserve_chain(parent, keys, bytes, out, status, through_busy);
  }
  Result<size_t> publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                              std::span<int32_t> status) override {
    return ix_.publish_many(slots, keys, status);
  }
  bool publish_checks_versions() const override { return true; }
  Result<size_t> publish_many_versioned(std::span<const Reservation> handles, std::span<const BlockKey> keys,
                                        std::span<int32_t> status) override {
    return ix_.publish_many(handles, keys, status);
  }
  Result<size_t> abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override {
    return ix_.abort_many(slots, keys, status);
  }
  Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                          std::span<int32_t> status) override {
    return ix_.pin_many(keys, out, status);
  }
  Result<size_t> unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override {
    return ix_.unpin_many(slots, keys, status);
  }
  void lock_ahead(std::span<const BlockKey> keys) override { ix_.lock_ahead(keys); }
  void reservation_owner(uint32_t* node, uint32_t* inc) const override {
    *node = node_;
    *inc = inc_;
  }
  const char* mode() const override { return "locks"; }

 private:
  PrefixIndex& ix_;
  uint32_t node_, inc_;
};

}  // namespace cxlkv
