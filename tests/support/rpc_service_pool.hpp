// SPDX-License-Identifier: MIT
// Test helper for the KV store's two index modes (rpc_kv_modes_test,
// rpc_node_pins_test): a pool with the index service's carve and a lock
// manager (node 0), an index service on node 0 when started (its own store
// takes the locks), and KV stores opened in either mode.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "kv/index_service.hpp"
#include "kv/store_index.hpp"
#include "support/rpc_test_pool.hpp"

namespace cxlkv::rpctest {

struct ModePool {
  explicit ModePool(const std::string& tag)
      : pool(tag, 64ull << 20, {{kIndexServiceCarve, kIndexServiceCarveBytes}}) {
    LockManagerOptions mo;
    mo.node = 0;
    auto m = LockManager::create(*pool.region, mo);
    if (!m) throw std::runtime_error(m.error().message());
    mgr = std::move(m.value());
    mgr->start();
  }
  ~ModePool() {
    stores.clear();
    stop_service();
    if (mgr) mgr->stop();
  }
  void start_service() {
    if (!server_node) server_node = &pool.attach(0, true);
    NodeContext& sn = *server_node;
    KvOpenOptions ko;
    ko.index_mode = KvIndexMode::locks;
    auto s = open_kv_session(*pool.region, sn, ko);
    if (!s) throw std::runtime_error(s.error().message());
    server_session = std::move(s.value());
    RpcServerOptions so;
    so.spin_rounds = 200;  // a loaded 2-core machine: yield soon
    auto svc = IndexService::create(sn, store_index(server_session->store()), so);
    if (!svc) throw std::runtime_error(svc.error().message());
    service = std::move(svc.value());
    service->server().start();
  }
  void stop_service() {
    service.reset();
    server_session.reset();
  }
  // A session of node `n` (already attached: e.g. the server's node, for a
  // second store of that node in this process).
  Result<std::unique_ptr<KvSession>> open(NodeContext& n, KvIndexMode mode) {
    KvOpenOptions ko;
    ko.index_mode = mode;
    return open_kv_session(*pool.region, n, ko);
  }
  // The same on a node attached now.
  Result<std::unique_ptr<KvSession>> open(uint32_t node, KvIndexMode mode) { return open(pool.attach(node, true), mode); }
  KvStore& store(NodeContext& n, KvIndexMode mode) { return keep(open(n, mode)); }
  KvStore& store(uint32_t node, KvIndexMode mode) { return keep(open(node, mode)); }

  RpcPool pool;
  NodeContext* server_node = nullptr;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<KvSession> server_session;
  std::unique_ptr<IndexService> service;
  std::vector<std::unique_ptr<KvSession>> stores;

 private:
  KvStore& keep(Result<std::unique_ptr<KvSession>> s) {
    if (!s) throw std::runtime_error(s.error().message());
    stores.push_back(std::move(s.value()));
    return stores.back()->store();
  }
};

}  // namespace cxlkv::rpctest
