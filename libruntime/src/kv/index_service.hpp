// SPDX-License-Identifier: MIT
// Index service mode (docs/rpc.md "The index service"; Beluga's metadata server): one
// process owns the prefix index and serves its batched operations over the
// shared-memory RPC, in place of every process taking the index's stripe
// locks itself.  Both modes keep the same on-pool index (the server calls
// the same PrefixIndex batch calls on behalf of its clients), so the
// per-block statuses are the ones of the lock-based path.
//
// The service runs on its own RPC carve, CXLKV_CARVE_RPC ".index" (large
// slots: a batch of up to kIndexServiceMaxBatch keys per request); a pool is
// in service mode when that carve exists and a server is running on it.
// Batches larger than kIndexServiceMaxBatch are split by the client (a chain
// continues from the last key of the previous piece).
//
// Reservations and pins taken through the service belong to the server's
// node; the service keeps, per client claim of a ring, the reservations and
// pins made through it, and undoes them when that claim ends (the client
// detached, died, or its ring was claimed anew): its reservations are
// aborted, its pins dropped (its own count only: a block another client still
// pins stays pinned).  A client settles only its own: an unpin of a pin its
// claim does not hold is refused (-EINVAL), as is a publish / abort of a
// reservation another open claim made (-ESTALE).  A server that stops
// leaves its clients' holds in the index (they are its node's: the node's
// detach or death reclaims them, and a new server of the same node still
// takes the publish / abort of such a reservation); the server's own death
// releases everything by the liveness rule as for any node.
//
// It lives in kv/, above the generic RPC of rpc/: the server serves a
// KvSession of its own, and open_kv_session connects the client as the
// store's IndexBatchOps (docs/architecture.md "The include rule").
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "cxlkv/kv.hpp"
#include "cxlkv/rpc.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

class NodeContext;

inline constexpr const char* kIndexServiceCarve = CXLKV_CARVE_RPC ".index";
inline constexpr uint32_t kIndexServiceMaxBatch = 256;
// RPC geometry of the service carve: 16 rings of depth 8; requests hold a
// batch of keys, replies a batch of reservations / pins.
RpcGeometry index_service_geometry();
inline constexpr uint64_t kIndexServiceCarveBytes = 4ull << 20;

// Server side: serves `index` (the server process's own PrefixIndex, e.g.
// from its KvSession) on the service carve.
class IndexService {
 public:
  static Result<std::unique_ptr<IndexService>> create(NodeContext& node, PrefixIndex& index,
                                                      const RpcServerOptions& base = {});
  ~IndexService();
  RpcServer& server() { return *server_; }
  // Client claims that ended, and what their end undid.
  struct Released {
    uint64_t claims = 0, reservations = 0, pins = 0;
  };
  Released released() const;

 private:
  struct Held;
  std::shared_ptr<Held> held_;
  std::unique_ptr<RpcServer> server_;  // destroyed first: its end closes the open claims
};

// A process that hosts the service (cxlkvd --index-service): attaches as
// `node`, opens the node's KV session (stripe locks, heap, liveness) and
// serves its index on a polling thread until destroyed.
class IndexServiceHost {
 public:
  static Result<std::unique_ptr<IndexServiceHost>> start(Region& pool, uint32_t node);
  ~IndexServiceHost();
  IndexService& service() { return *service_; }

 private:
  IndexServiceHost() = default;
  std::unique_ptr<NodeContext> node_;
  std::unique_ptr<KvSession> session_;
  std::unique_ptr<IndexService> service_;
};

// Client side: the batch calls of PrefixIndex (docs/coherence.md
// "PrefixIndex batch interface"), answered by the service; a KvStore's
// index calls in service mode (KvOpenOptions::index_mode, open_kv_session).
// A service that is down is an error of the call, never a hang:
// -ECONNRESET (no live server, or it died / was replaced under the
// request) or -ETIMEDOUT (no answer within the RPC's timeout); the
// server's refusals come back as its codes.  `pool` (may be empty) names
// the pool in every error.
class IndexServiceClient final : public IndexBatchOps {
 public:
  static Result<std::unique_ptr<IndexServiceClient>> connect(NodeContext& node, const RpcClientOptions& base = {},
                                                             const std::string& pool = {});
  Result<size_t> reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                               std::span<Reservation> out, std::span<int32_t> status,
                               bool through_busy = false) override;
  using IndexBatchOps::publish_many;  // of reservations: not on the wire (publish_checks_versions false)
  Result<size_t> publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                              std::span<int32_t> status) override;
  Result<size_t> abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override;
  Result<size_t> pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                          std::span<int32_t> status) override;
  Result<size_t> unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                            std::span<int32_t> status) override;
  // The serving node and its incarnation, from the latest reply (the owner
  // of the reservations made through the service).
  void reservation_owner(uint32_t* node, uint32_t* inc) const override {
    *node = owner_node_;
    *inc = owner_inc_;
  }
  const char* mode() const override { return "service"; }
  std::string block_message(const char* op, const BlockKey& key, int32_t code) const override;

 private:
  Result<size_t> reserve_rpc(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                             std::span<Reservation> out, std::span<int32_t> status, bool through_busy);
  Result<size_t> pin_rpc(std::span<const BlockKey> keys, std::span<PinnedBlock> out, std::span<int32_t> status);
  Result<size_t> slots_op(uint32_t op, std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                          std::span<int32_t> status);
  Result<size_t> named(Result<size_t> r) const;
  std::unique_ptr<RpcClient> rpc_;
  std::vector<std::byte> req_, rep_;
  uint32_t owner_node_ = 0xffffffffu, owner_inc_ = 0;
  std::string pool_;
};

}  // namespace cxlkv
