// SPDX-License-Identifier: MIT
// Shared-memory RPC through the pool (docs/rpc.md "The RPC"; layout and protocol in
// cxlkv/format/rpc_format.h).  Beluga's design: per-client rings of request and
// response slots in pool memory, flags polled with invalidate-before-read,
// fences batched over concurrent requests, no kernel on the data path.
//
//   RpcServer   owns the carve's server line (one server per carve; epoch
//               + 1 at every start), polls every attached ring, calls the
//               handler registered for each request's op, writes replies.
//   RpcClient   claims one ring; submit() many requests (up to the ring's
//               depth outstanding), poll() completions, or call() one.
//
// What a client sees (never a hang):
//   status >= 0 or the handler's negative errno: the reply, exactly once.
//   -ETIMEDOUT   no reply within the request's timeout; the request may
//                still run (its slot stays taken until the server answers
//                it or is gone).
//   -ECONNRESET  the server died or was replaced (new epoch) before it
//                replied: the request ran at most once, maybe not at all.
//                The next submit reconnects to a new server if there is one.
//   -EOPNOTSUPP  no handler for the op (from the server).
// A server never runs a request twice (per-ring sequence numbers, and a
// new server ignores requests made under an older epoch), and stops serving
// a ring whose client is dead by the liveness rule (uapi/cxlkv_ctrl.h):
// the ring can then be claimed by another client.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cxlkv/memory_domain.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/result.hpp"
#include "uapi/cxlkv_pool.h"
#include "cxlkv/format/rpc_format.h"

namespace cxlkv {

class NodeContext;

struct RpcGeometry {
  uint32_t rings = 64;       // clients (one ring each)
  uint32_t depth = 128;      // outstanding requests per ring (power of two)
  uint32_t req_lines = 1;    // request slot: 48 B inline + 56 B per extra line
  uint32_t resp_lines = 1;   // response slot, the same
};
// Bytes a carve of this geometry needs (before rounding to 2 MiB).
uint64_t rpc_carve_bytes(const RpcGeometry& g);
// The geometry with the most rings that fits `carve_size` (depth and lines as given).
RpcGeometry rpc_geometry_for(uint64_t carve_size, RpcGeometry g);

// Validated view of an RPC carve.
class RpcCarve {
 public:
  // Open the carve `name`; -ENOENT absent, -ENODATA header never written,
  // -EINVAL damaged header (checksum, geometry that does not fit).
  static Result<RpcCarve> open(const Region& region, MemoryDomain& domain,
                               std::string_view name = CXLKV_CARVE_RPC);
  // Open it, writing the header first if the carve is zero (fresh from
  // format, or created here when absent and the pool has room).  `g` is
  // used only when the header is written; rings shrink to fit the carve.
  static Result<RpcCarve> open_or_format(Region& region, MemoryDomain& domain, std::string_view name,
                                         const RpcGeometry& g);

  const std::string& name() const { return name_; }
  const cxlkv_rpc_header& header() const { return hdr_; }
  uint32_t rings() const { return hdr_.nrings; }
  uint32_t depth() const { return hdr_.depth; }
  uint32_t req_max() const { return cxlkv_rpc_payload_max(hdr_.req_lines); }
  uint32_t resp_max() const { return cxlkv_rpc_payload_max(hdr_.resp_lines); }
  cxlkv_rpc_server_line* server_line() const {
    return reinterpret_cast<cxlkv_rpc_server_line*>(base_ + hdr_.server_off);
  }
  std::byte* ring(uint32_t r) const { return base_ + hdr_.rings_off + uint64_t(r) * hdr_.ring_bytes; }
  cxlkv_rpc_client_line* client_line(uint32_t r) const { return reinterpret_cast<cxlkv_rpc_client_line*>(ring(r)); }
  cxlkv_rpc_doorbell* doorbell(uint32_t r) const { return reinterpret_cast<cxlkv_rpc_doorbell*>(ring(r) + 64); }
  cxlkv_rpc_ack* ack(uint32_t r) const { return reinterpret_cast<cxlkv_rpc_ack*>(ring(r) + 128); }
  cxlkv_rpc_req_hdr* req(uint32_t r, uint32_t slot) const {
    return reinterpret_cast<cxlkv_rpc_req_hdr*>(ring(r) + 64 * (CXLKV_RPC_RING_LINES + uint64_t(slot) * hdr_.req_lines));
  }
  cxlkv_rpc_resp_hdr* resp(uint32_t r, uint32_t slot) const {
    return reinterpret_cast<cxlkv_rpc_resp_hdr*>(
        ring(r) + 64 * (CXLKV_RPC_RING_LINES + uint64_t(hdr_.depth) * hdr_.req_lines + uint64_t(slot) * hdr_.resp_lines));
  }

 private:
  std::string name_;
  std::byte* base_ = nullptr;
  cxlkv_rpc_header hdr_{};
};

// ---- server -------------------------------------------------------------------

struct RpcRequest {
  uint32_t op = 0;
  uint32_t ring = 0;   // the client's ring
  uint32_t seq = 0;    // per-ring sequence number
  std::span<const std::byte> data;
};
// A handler fills `reply` (capacity: the carve's response payload) and sets
// `reply_len`; its return value is the status the client sees (>= 0, or a
// negative errno).  Handlers run on the server's polling thread.
using RpcHandler = std::function<int32_t(const RpcRequest& req, std::span<std::byte> reply, uint32_t& reply_len)>;

// Why a ring's claim ended (RpcServerOptions::on_ring_closed).
enum class RpcRingClose : uint8_t {
  detached,        // the client wrote DETACHED
  dead,            // the client's process / node is dead (liveness rule)
  reclaimed,       // the ring carries a new claim (another token) while the old one was open
  server_stopped,  // the server was destroyed with the claim open
};

struct RpcServerOptions {
  std::string carve = CXLKV_CARVE_RPC;
  RpcGeometry geometry{};  // used when this server writes the carve header
  // Polling when idle: busy rounds, then sched_yield rounds, then sleeps
  // doubling up to max_sleep (the latency added to the first request after
  // an idle spell).
  uint32_t spin_rounds = 20000;
  uint32_t yield_rounds = 2000;
  std::chrono::microseconds max_sleep{200};
  // How often client lines are read (new clients, detaches) and how often
  // attached clients' liveness is judged.
  std::chrono::milliseconds scan_every{2};
  std::chrono::milliseconds liveness_every{20};
  uint32_t max_batch = 256;  // requests handled per round, over all rings
  // Called once per closed claim of a ring, on the polling thread between
  // rounds (so after the last request of that claim that ran was answered,
  // and before any request of a later claim of the ring runs): its client
  // detached, was judged dead, or the ring was claimed anew (another client,
  // or a new incarnation of the same one) before a scan saw it free; and for
  // every claim still open when the server is destroyed (after its thread
  // stopped).  Per-client state the handlers keep (the index service's
  // reservations and pins) is undone here.
  std::function<void(uint32_t ring, RpcRingClose why)> on_ring_closed;
};

struct RpcServerStats {
  uint64_t rounds = 0, requests = 0, batches = 0;  // batches: rounds that handled >= 1
  uint64_t fences = 0;                              // fences issued by the server
  uint64_t connects = 0, dead_clients = 0, detaches = 0;
  uint64_t reclaimed = 0;  // claims ended by a new claim of their ring
  uint64_t unknown_ops = 0, stale_epoch = 0;        // requests refused without running
  uint64_t sleeps = 0;
  uint32_t epoch = 0;
};

class RpcServer {
 public:
  // Takes the carve's server line: -EBUSY while a live server holds it.
  static Result<std::unique_ptr<RpcServer>> create(NodeContext& node, const RpcServerOptions& opts = {});
  ~RpcServer();  // stops the thread, marks the server line STOPPED
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Register before start() / the first poll.  Replaces an earlier handler.
  void handle(uint32_t op, RpcHandler h);
  // One round: rescans (when due), doorbells, requests, replies.  Returns the
  // number of requests answered.
  Result<size_t> poll_once();
  void start();  // a polling thread
  void stop();
  Result<void> run(const std::atomic<bool>& stop);  // poll on this thread until stop
  uint32_t epoch() const;
  const RpcCarve& carve() const;
  RpcServerStats stats() const;

  struct State;

 private:
  explicit RpcServer(std::unique_ptr<State> st);
  std::unique_ptr<State> st_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- client -------------------------------------------------------------------

struct RpcClientOptions {
  std::string carve = CXLKV_CARVE_RPC;
  int32_t ring = -1;  // -1: the first free ring (owner detached or dead)
  std::chrono::milliseconds timeout{2000};          // per request, from submit
  std::chrono::milliseconds connect_timeout{2000};  // until the server acknowledges the ring
};

struct RpcCall {
  uint32_t op = 0;
  std::span<const std::byte> request;
  void* reply = nullptr;       // reply payload copied here (up to reply_cap bytes)
  uint32_t reply_cap = 0;
  void* tag = nullptr;         // returned in the completion
};

struct RpcCompletion {
  uint64_t ticket = 0;  // from submit()
  int32_t status = 0;   // handler status, or -ETIMEDOUT / -ECONNRESET / -EOPNOTSUPP
  uint32_t len = 0;     // reply bytes the server sent (copied: min(len, reply_cap))
  void* tag = nullptr;
};

struct RpcReply {
  int32_t status = 0;
  uint32_t len = 0;
};

struct RpcClientStats {
  uint64_t submitted = 0, completed = 0, timeouts = 0, resets = 0, reconnects = 0, fences = 0;
};

class RpcClient {
 public:
  // Claims a ring and waits until the server acknowledges it.
  // -ECONNREFUSED no live server, -EBUSY the ring is taken by a live client,
  // -ENOSPC no free ring, -ETIMEDOUT the server did not acknowledge.
  static Result<std::unique_ptr<RpcClient>> connect(NodeContext& node, const RpcClientOptions& opts = {});
  ~RpcClient();  // detaches (ring line DETACHED)
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // Submit up to calls.size() requests with one pair of fences; tickets[i]
  // gets each one's ticket.  Returns how many were submitted (fewer when the
  // ring is full); -EAGAIN when none fit, -EMSGSIZE a request too large,
  // -ECONNRESET no live server to (re)connect to.
  Result<size_t> submit(std::span<const RpcCall> calls, uint64_t* tickets);
  // Completions that are ready (answers, timeouts, resets), oldest first.
  Result<size_t> poll(std::span<RpcCompletion> out);
  // One request, waiting up to `timeout` (0: the client's default).
  Result<RpcReply> call(uint32_t op, std::span<const std::byte> request, void* reply, uint32_t reply_cap,
                        std::chrono::nanoseconds timeout = {});

  uint32_t ring() const;
  uint32_t depth() const;
  uint32_t in_flight() const;  // submitted and not yet reported
  uint32_t request_max() const;
  uint32_t reply_max() const;
  RpcClientStats stats() const;

  struct State;

 private:
  explicit RpcClient(std::unique_ptr<State> st);
  std::unique_ptr<State> st_;
};

}  // namespace cxlkv
