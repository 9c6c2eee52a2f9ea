// SPDX-License-Identifier: MIT
// Index service mode and the node's pins (index/node_pins.hpp): pins taken
// through the service are the serving node's, counted per client ring by
// the service and per index by the node's pin table.  Another store of the
// serving node (here a second KV session of node 0, as another process of
// that node would have) that pins and unpins the same block must not drop
// the pin a service client still holds: node 2 must not evict the block
// until the client unpins it too.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"
#include "kv/index_service.hpp"
#include "kv/store_index.hpp"
#include "support/rpc_service_pool.hpp"

namespace cxlkv {
namespace {

bool cached(KvStore& kv, const BlockKey& k) { return store_index(kv).find_ready(k) != CXLKV_INDEX_NO_SLOT; }

void evict_all(KvStore& kv) {
  for (int i = 0; i < 64; i++) {
    auto r = store_index(kv).evict_any();
    ASSERT_TRUE(r.ok()) << r.error().message();
    if (!r.value()) return;
  }
}

}  // namespace

TEST(RpcNodePins, AServiceClientsPinSurvivesTheUnpinOfAnotherStoreOfTheServingNode) {
  rpctest::ModePool sp("nodepins-svc");
  sp.start_service();
  KvStore& client = sp.store(sp.pool.attach(1, true), KvIndexMode::service);  // pins as node 0 (the server's)
  KvStore& same_node = sp.store(*sp.server_node, KvIndexMode::locks);         // node 0's other store
  KvStore& other = sp.store(sp.pool.attach(2, true), KvIndexMode::locks);     // node 2, evicting
  ASSERT_STREQ(client.index_mode(), "service");
  const BlockKey k{0x5e55a11ce0000001ull, 0x77};
  std::vector<std::byte> buf(4096, std::byte{0x5a});
  Chunk ch{buf.data(), buf.size()};
  auto r = other.reserve(k, nullptr, buf.size());
  ASSERT_TRUE(r.ok() && r->reserved());
  ASSERT_TRUE(other.write(*r, {&ch, 1}).ok());
  ASSERT_TRUE(other.publish(*r).ok());

  auto pc = client.pin(k);
  ASSERT_TRUE(pc.ok()) << pc.error().message();
  auto ps = same_node.pin(k);
  ASSERT_TRUE(ps.ok()) << ps.error().message();
  ASSERT_TRUE(same_node.unpin(*ps).ok());
  evict_all(other);
  EXPECT_TRUE(cached(other, k)) << "node 2 evicted a block a service client of node 0 still pins";
  std::vector<std::byte> got(buf.size());
  Chunk gc{got.data(), got.size()};
  ASSERT_TRUE(client.fetch(*pc, {&gc, 1}).ok());
  EXPECT_EQ(got, buf);
  ASSERT_TRUE(client.unpin(*pc).ok());
  evict_all(other);
  EXPECT_FALSE(cached(other, k)) << "no store of node 0 pins it any more";
}

}  // namespace cxlkv
