// SPDX-License-Identifier: MIT
// C API of the shared-memory RPC (cxlkv/cxlkv_rpc.h) over RpcServer / RpcClient.
#include <cstddef>
#include <memory>
#include <type_traits>

#include "capi/capi.hpp"
#include "cxlkv/cxlkv_rpc.h"
#include "cxlkv/rpc.hpp"
#include "kv/index_service.hpp"

struct cxlkv_rpc_server {
  std::unique_ptr<cxlkv::RpcServer> srv;
};
struct cxlkv_rpc_client {
  std::unique_ptr<cxlkv::RpcClient> cli;
};
struct cxlkv_index_service {
  std::unique_ptr<cxlkv::IndexServiceHost> host;
};

using cxlkv::capi::guarded;
using cxlkv::capi::set_error;

namespace {
int null_arg(const char* fn) { return set_error(-EINVAL, std::string(fn) + ": NULL argument"); }
}  // namespace

extern "C" {

int cxlkv_rpc_server_create(struct cxlkv_node* node, const struct cxlkv_rpc_server_opts* opts,
                            struct cxlkv_rpc_server** out) {
  return guarded(__func__, [&]() -> int {
    if (!node || !out) return null_arg(__func__);
    *out = nullptr;
    cxlkv::RpcServerOptions o;
    if (CXLKV_OPT_HAS(opts, carve) && opts->carve) o.carve = opts->carve;
    if (CXLKV_OPT_HAS(opts, rings) && opts->rings) o.geometry.rings = opts->rings;
    if (CXLKV_OPT_HAS(opts, depth) && opts->depth) o.geometry.depth = opts->depth;
    if (CXLKV_OPT_HAS(opts, req_lines) && opts->req_lines) o.geometry.req_lines = opts->req_lines;
    if (CXLKV_OPT_HAS(opts, resp_lines) && opts->resp_lines) o.geometry.resp_lines = opts->resp_lines;
    if (CXLKV_OPT_HAS(opts, spin_rounds) && opts->spin_rounds) o.spin_rounds = opts->spin_rounds;
    auto s = cxlkv::RpcServer::create(cxlkv::capi::node_context(node), o);
    if (!s) return set_error(s.error());
    *out = new cxlkv_rpc_server{std::move(s.value())};
    cxlkv::capi::clear_error();
    return 0;
  });
}

int cxlkv_rpc_server_handle(struct cxlkv_rpc_server* srv, uint32_t op, cxlkv_rpc_handler_fn fn, void* ctx) {
  return guarded(__func__, [&]() -> int {
    if (!srv || !fn) return null_arg(__func__);
    srv->srv->handle(op, [fn, ctx](const cxlkv::RpcRequest& rq, std::span<std::byte> reply, uint32_t& len) {
      uint32_t l = 0;
      int32_t st = fn(ctx, rq.op, rq.data.data(), static_cast<uint32_t>(rq.data.size()), reply.data(),
                      static_cast<uint32_t>(reply.size()), &l);
      len = std::min<uint32_t>(l, static_cast<uint32_t>(reply.size()));
      return st;
    });
    return 0;
  });
}

int cxlkv_rpc_server_poll(struct cxlkv_rpc_server* srv) {
  return guarded(__func__, [&]() -> int {
    if (!srv) return null_arg(__func__);
    auto n = srv->srv->poll_once();
    if (!n) return set_error(n.error());
    return static_cast<int>(n.value());
  });
}

int cxlkv_rpc_server_start(struct cxlkv_rpc_server* srv) {
  return guarded(__func__, [&]() -> int {
    if (!srv) return null_arg(__func__);
    srv->srv->start();
    return 0;
  });
}

uint32_t cxlkv_rpc_server_epoch(struct cxlkv_rpc_server* srv) { return srv ? srv->srv->epoch() : 0; }

void cxlkv_rpc_server_destroy(struct cxlkv_rpc_server* srv) {
  (void)guarded(__func__, [&]() -> int {
    delete srv;
    return 0;
  });
}

int cxlkv_rpc_client_connect(struct cxlkv_node* node, const struct cxlkv_rpc_client_opts* opts,
                             struct cxlkv_rpc_client** out) {
  return guarded(__func__, [&]() -> int {
    if (!node || !out) return null_arg(__func__);
    *out = nullptr;
    cxlkv::RpcClientOptions o;
    if (CXLKV_OPT_HAS(opts, carve) && opts->carve) o.carve = opts->carve;
    if (CXLKV_OPT_HAS(opts, ring)) o.ring = opts->ring;
    if (CXLKV_OPT_HAS(opts, timeout_ms) && opts->timeout_ms) o.timeout = std::chrono::milliseconds(opts->timeout_ms);
    if (CXLKV_OPT_HAS(opts, connect_timeout_ms) && opts->connect_timeout_ms)
      o.connect_timeout = std::chrono::milliseconds(opts->connect_timeout_ms);
    auto c = cxlkv::RpcClient::connect(cxlkv::capi::node_context(node), o);
    if (!c) return set_error(c.error());
    *out = new cxlkv_rpc_client{std::move(c.value())};
    cxlkv::capi::clear_error();
    return 0;
  });
}

void cxlkv_rpc_client_close(struct cxlkv_rpc_client* cli) {
  (void)guarded(__func__, [&]() -> int {
    delete cli;
    return 0;
  });
}

int cxlkv_rpc_submit(struct cxlkv_rpc_client* cli, const struct cxlkv_rpc_call* calls, size_t n, uint64_t* tickets) {
  return guarded(__func__, [&]() -> int {
    if (!cli || (n && !calls)) return null_arg(__func__);
    std::vector<cxlkv::RpcCall> v(n);
    for (size_t i = 0; i < n; i++) {
      if (calls[i].req_len && !calls[i].req) return set_error(-EINVAL, std::string(__func__) + ": call " + std::to_string(i) + " has req_len but no req");
      v[i] = cxlkv::RpcCall{calls[i].op,
                            {static_cast<const std::byte*>(calls[i].req), calls[i].req_len},
                            calls[i].reply,
                            calls[i].reply ? calls[i].reply_cap : 0,
                            calls[i].tag};
    }
    auto r = cli->cli->submit(v, tickets);
    if (!r) return set_error(r.error());
    return static_cast<int>(r.value());
  });
}

int cxlkv_rpc_poll(struct cxlkv_rpc_client* cli, struct cxlkv_rpc_completion* out, size_t max) {
  return guarded(__func__, [&]() -> int {
    if (!cli || (max && !out)) return null_arg(__func__);
    std::vector<cxlkv::RpcCompletion> v(max);
    auto r = cli->cli->poll(v);
    if (!r) return set_error(r.error());
    for (size_t i = 0; i < r.value(); i++) out[i] = cxlkv_rpc_completion{v[i].ticket, v[i].status, v[i].len, v[i].tag};
    return static_cast<int>(r.value());
  });
}

int cxlkv_rpc_call(struct cxlkv_rpc_client* cli, uint32_t op, const void* req, uint32_t req_len, void* reply,
                   uint32_t reply_cap, uint32_t* reply_len, uint64_t timeout_ns) {
  return guarded(__func__, [&]() -> int {
    if (!cli || (req_len && !req)) return null_arg(__func__);
    auto r = cli->cli->call(op, {static_cast<const std::byte*>(req), req_len}, reply, reply ? reply_cap : 0,
                            std::chrono::nanoseconds(timeout_ns));
    if (!r) return set_error(r.error());
    if (reply_len) *reply_len = r->len;
    cxlkv::capi::clear_error();
    return r->status;
  });
}

uint32_t cxlkv_rpc_client_ring(struct cxlkv_rpc_client* cli) { return cli ? cli->cli->ring() : 0; }
uint32_t cxlkv_rpc_client_depth(struct cxlkv_rpc_client* cli) { return cli ? cli->cli->depth() : 0; }
uint32_t cxlkv_rpc_client_request_max(struct cxlkv_rpc_client* cli) { return cli ? cli->cli->request_max() : 0; }

int cxlkv_index_service_start(struct cxlkv_pool* pool, uint32_t node, struct cxlkv_index_service** out) {
  return guarded(__func__, [&]() -> int {
    if (!pool || !pool->region || !out) return null_arg(__func__);
    *out = nullptr;
    auto h = cxlkv::IndexServiceHost::start(*pool->region, node);
    if (!h) return set_error(h.error());
    *out = new cxlkv_index_service{std::move(h.value())};
    cxlkv::capi::clear_error();
    return 0;
  });
}

void cxlkv_index_service_stop(struct cxlkv_index_service* svc) { delete svc; }

}  // extern "C"
