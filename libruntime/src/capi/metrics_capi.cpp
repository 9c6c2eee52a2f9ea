// SPDX-License-Identifier: MIT
// cxlkv_stats_prometheus: the pool's KV metrics as Prometheus text, the same
// text as `cxlkvctl stats --prometheus` (one definition: cxlkv/metrics.hpp).
#include <cerrno>
#include <cstring>

#include "capi/capi.hpp"
#include "cxlkv/cxlkv.h"
#include "cxlkv/metrics.hpp"
#include "cxlkv/region.hpp"
#include "uapi/cxlkv_pool.h"

using namespace cxlkv;

extern "C" int cxlkv_stats_prometheus(struct cxlkv_pool* pool, char* buf, size_t len) {
  return capi::guarded(__func__, [&] {
    if (!pool || !pool->region || (!buf && len)) return capi::set_error(-EINVAL, "cxlkv_stats_prometheus: pool is required (and buf when len > 0)");
    auto c = pool->region->carve(CXLKV_CARVE_INDEX);
    if (!c && !pool->region->carve(CXLKV_CARVE_PNM))  // a near-memory-only pool has its pnm family
      return capi::set_error(-ENOENT, "cxlkv_stats_prometheus: pool " + pool->region->uri() + " has no index carve");
    std::string text = prometheus_region_exposition(*pool->region);
    if (text.size() > size_t(INT32_MAX)) return capi::set_error(-EOVERFLOW, "cxlkv_stats_prometheus: text too long");
    if (len) {
      size_t n = std::min(len - 1, text.size());
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
    capi::clear_error();
    return int(text.size());
  });
}
