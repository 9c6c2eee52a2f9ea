// SPDX-License-Identifier: MIT
// The test's side of the multi-process lock tests (lock_multiproc_test,
// lock_set_multiproc_test): a fresh pool (testpool::TestPool) whose nodes
// are helper processes, so the node-local files of nodes 0..7 are removed
// by name at the end, and the counters the helpers add to under their locks.
#pragma once

#include <cstdint>
#include <string>

#include "support/lock_test_pool.hpp"

namespace cxlkv::testpool {

struct HelperPool : TestPool {
  explicit HelperPool(const std::string& tag) : TestPool("mp-" + tag) {}
  ~HelperPool() {
    for (uint32_t n = 0; n < 8; n++) NodeContext::unlink_local(NodeContext::default_local_name(*region, n));
  }
  // The counter a helper adds to under lock k: word k of the kv carve.
  uint64_t counter(uint32_t k = 0) {
    auto kv = region->carve(CXLKV_CARVE_KV).value();
    return region->domain().read_fresh(region->at<uint64_t>(kv.offset) + 8 * k);
  }
};

}  // namespace cxlkv::testpool
