// SPDX-License-Identifier: MIT
// The KV store's write and read paths with GPU tensors on the engine side.
//
// Coherence: the payload reaches the pool by GPU DMA, which bypasses CPU
// caches (DDIO off, cuda/README.md), so no flush is needed for it; what
// matters is order.  Rule 5: publish() -- the index entry that makes a block
// visible -- runs only after wait_enqueued() has seen the gather complete.
// On the read side the pins are dropped only after the scatter completed,
// so eviction cannot reuse a block the GPU is still reading.
#include <cerrno>
#include <chrono>
#include <map>
#include <string>

#include "cxlkv/gpu.hpp"
#include "cxlkv/keys.hpp"
#include "cxlkv/kv.hpp"
#include "uapi/cxlkv_index.h"
#include "util/log.hpp"

namespace cxlkv::gpu {

namespace {
constexpr auto kParentWait = std::chrono::milliseconds(5000);

// Blocks of one batch that live on one pool device.
struct DeviceBatch {
  std::vector<uint64_t> ids, offs;
};
}  // namespace

Result<GpuPool*> KvGpu::device_for(uint8_t tier, uint8_t dev, const BlockKey& key) const {
  if (tier != CXLKV_TIER_MEM)
    return Error(-EOPNOTSUPP, "GPU path: block " + to_hex(key) + " is on tier " + std::to_string(tier) +
                                  "; only pool memory is reachable by GPU DMA");
  if (dev == CXLKV_LOC_DEV_INTERLEAVED)
    return Error(-EOPNOTSUPP, "GPU path: block " + to_hex(key) + " is interleaved over several devices "
                                                               "(not supported on the GPU path yet)");
  if (dev >= devices_.size() || !devices_[dev])
    return Error(-ENODEV, "GPU path: block " + to_hex(key) + " is on pool device " + std::to_string(dev) +
                              ", which has no pinned GpuPool");
  return devices_[dev];
}

Result<GpuPublishReport> KvGpu::publish(std::span<const BlockKey> chain, const BlockKey* parent,
                                        const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                        void* stream) {
  CXLKV_TRY(layout.validate());
  if (chain.size() != block_ids.size())
    return Error(-EINVAL, "GPU publish: " + std::to_string(chain.size()) + " keys but " +
                              std::to_string(block_ids.size()) + " GPU blocks");
  const uint64_t bytes = layout.block_bytes();
  GpuPublishReport rep;
  std::vector<KvReservation> mine;
  std::map<GpuPool*, DeviceBatch> batches;
  auto abort_all = [&](size_t from) {
    for (size_t i = from; i < mine.size(); i++) (void)store_.abort(mine[i]);
  };

  for (size_t i = 0; i < chain.size(); i++) {
    auto r = store_.reserve(chain[i], i ? &chain[i - 1] : parent, bytes);
    if (!r) {
      abort_all(0);
      return Error(r.error().code(), "GPU publish: " + r.error().message());
    }
    if (r->status == 1) {
      rep.already_cached++;
      continue;
    }
    if (r->status == 2) {
      rep.busy++;
      continue;
    }
    mine.push_back(r.value());
    auto dev = device_for(r->loc_tier, r->loc_dev, chain[i]);
    if (!dev) {
      abort_all(0);
      return dev.error();
    }
    if (r->length != bytes) {
      abort_all(0);
      return Error(-EINVAL, "GPU publish: block " + to_hex(chain[i]) + " reserved " + std::to_string(r->length) +
                                " bytes, the layout's blocks are " + std::to_string(bytes));
    }
    batches[dev.value()].ids.push_back(block_ids[i]);
    batches[dev.value()].offs.push_back(r->loc_off);
  }

  for (auto& [gp, b] : batches) {
    if (auto g = gp->gather(layout, b.ids, b.offs, stream); !g) {
      (void)gp->wait_enqueued(stream);  // let enqueued DMA finish before the space is reused
      abort_all(0);
      return Error(g.error().code(), "GPU publish: " + g.error().message());
    }
  }
  // rule 5: the index entries are written only after the DMA has completed.
  for (auto& [gp, b] : batches) {
    if (auto w = gp->wait_enqueued(stream); !w) {
      abort_all(0);
      return Error(w.error().code(), "GPU publish: " + w.error().message());
    }
  }

  // Publish parents before children (the index refuses a child of an
  // unpublished parent with -EAGAIN; a parent another node is writing is
  // waited for once).
  for (size_t i = 0; i < mine.size(); i++) {
    auto p = store_.publish(mine[i]);
    if (!p && p.error().code() == -EAGAIN) {
      // Find this block's parent key: the chain element before it, or `parent`.
      const BlockKey* pk = parent;
      for (size_t j = 1; j < chain.size(); j++)
        if (chain[j] == mine[i].key) pk = &chain[j - 1];
      if (pk && store_.wait_ready(*pk, kParentWait)) p = store_.publish(mine[i]);
    }
    if (!p) {
      abort_all(i);
      return Error(p.error().code(), "GPU publish of block " + to_hex(mine[i].key) + " (" + std::to_string(i) +
                                         " of " + std::to_string(mine.size()) + " published): " + p.error().message());
    }
    rep.written++;
  }
  return rep;
}

Result<void> KvGpu::fetch(std::span<const BlockKey> keys, const PagedLayout& layout,
                          std::span<const uint64_t> block_ids, void* stream) {
  CXLKV_TRY(layout.validate());
  if (keys.size() != block_ids.size())
    return Error(-EINVAL, "GPU fetch: " + std::to_string(keys.size()) + " keys but " +
                              std::to_string(block_ids.size()) + " GPU blocks");
  const uint64_t bytes = layout.block_bytes();
  std::vector<KvPin> pins;
  std::map<GpuPool*, DeviceBatch> batches;
  auto unpin_all = [&]() {
    Result<void> first;
    for (const auto& p : pins)
      if (auto u = store_.unpin(p); !u && first.ok()) first = u.error();
    return first;
  };

  for (size_t i = 0; i < keys.size(); i++) {
    auto p = store_.pin(keys[i]);
    if (!p) {
      (void)unpin_all();
      return Error(p.error().code(), "GPU fetch of block " + to_hex(keys[i]) + ": " + p.error().message());
    }
    pins.push_back(p.value());
    auto dev = device_for(p->loc_tier, p->loc_dev, keys[i]);
    if (!dev) {
      (void)unpin_all();
      return dev.error();
    }
    if (p->length != bytes) {
      (void)unpin_all();
      return Error(-EINVAL, "GPU fetch: block " + to_hex(keys[i]) + " holds " + std::to_string(p->length) +
                                " bytes, the layout's blocks are " + std::to_string(bytes));
    }
    batches[dev.value()].ids.push_back(block_ids[i]);
    batches[dev.value()].offs.push_back(p->loc_off);
  }

  Result<void> res;
  for (auto& [gp, b] : batches) {
    if (auto s = gp->scatter(layout, b.ids, b.offs, stream); !s) {
      res = Error(s.error().code(), "GPU fetch: " + s.error().message());
      break;
    }
  }
  // The pins must outlive the DMA reading the blocks, even after a failure.
  for (auto& [gp, b] : batches)
    if (auto w = gp->wait_enqueued(stream); !w && res.ok()) res = Error(w.error().code(), "GPU fetch: " + w.error().message());
  auto u = unpin_all();
  if (!res) return res;
  return u;
}

Result<size_t> KvGpu::put_chain(const BlockKey* parent, std::span<const BlockKey> keys, const PagedLayout& layout,
                                std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status) {
  CXLKV_TRY(layout.validate());
  const size_t n = keys.size();
  if (block_ids.size() != n || status.size() < n)
    return Error(-EINVAL, "GPU put_chain: " + std::to_string(n) + " keys, " + std::to_string(block_ids.size()) +
                              " GPU blocks, " + std::to_string(status.size()) + " status entries");
  const uint64_t bytes = layout.block_bytes();
  std::vector<KvReservation> rs(n);
  CXLKV_TRY(store_.reserve_chain(parent, keys, bytes, rs, status));
  std::vector<int32_t> written(n, kKvReserved);
  std::map<GpuPool*, DeviceBatch> batches;
  std::map<GpuPool*, std::vector<size_t>> members;
  for (size_t i = 0; i < n; i++) {
    if (!rs[i].reserved()) continue;
    auto dev = device_for(rs[i].loc_tier, rs[i].loc_dev, keys[i]);
    int32_t bad = !dev ? dev.error().code() : rs[i].length != bytes ? -EINVAL : 0;
    if (bad) {  // this block and everything after it stay unwritten
      for (size_t j = i; j < n; j++) written[j] = bad;
      log().warn("GPU put_chain: block {}: {}", to_hex(keys[i]),
                 !dev ? dev.error().message() : "reserved length differs from the layout's block");
      break;
    }
    batches[dev.value()].ids.push_back(block_ids[i]);
    batches[dev.value()].offs.push_back(rs[i].loc_off);
    members[dev.value()].push_back(i);
  }
  for (auto& [gp, b] : batches) {
    auto g = gp->gather(layout, b.ids, b.offs, stream);
    if (!g)
      for (size_t i : members[gp]) written[i] = g.error().code();
  }
  // rule 5: the index entries are written only after the DMA has completed
  // (a failed launch is waited for too, before its space can be reused).
  for (auto& [gp, b] : batches) {
    auto w = gp->wait_enqueued(stream);
    if (!w)
      for (size_t i : members[gp]) written[i] = w.error().code();
  }
  return store_.settle_chain(parent, keys, rs, written, status);
}

Result<size_t> KvGpu::get_many(std::span<const BlockKey> keys, const PagedLayout& layout,
                               std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status) {
  CXLKV_TRY(layout.validate());
  const size_t n = keys.size();
  if (block_ids.size() != n || status.size() < n)
    return Error(-EINVAL, "GPU get_many: " + std::to_string(n) + " keys, " + std::to_string(block_ids.size()) +
                              " GPU blocks, " + std::to_string(status.size()) + " status entries");
  const uint64_t bytes = layout.block_bytes();
  std::vector<KvPin> pins(n);
  CXLKV_TRY(store_.pin_many(keys, pins, status));
  std::map<GpuPool*, DeviceBatch> batches;
  std::map<GpuPool*, std::vector<size_t>> members;
  for (size_t i = 0; i < n; i++) {
    if (!pins[i].pinned()) continue;
    auto dev = device_for(pins[i].loc_tier, pins[i].loc_dev, keys[i]);
    if (!dev || pins[i].length != bytes) {
      status[i] = !dev ? dev.error().code() : -EINVAL;
      continue;
    }
    batches[dev.value()].ids.push_back(block_ids[i]);
    batches[dev.value()].offs.push_back(pins[i].loc_off);
    members[dev.value()].push_back(i);
  }
  for (auto& [gp, b] : batches)
    if (auto sc = gp->scatter(layout, b.ids, b.offs, stream); !sc)
      for (size_t i : members[gp]) status[i] = sc.error().code();
  // The pins outlive the DMA reading the blocks, even after a failure.
  for (auto& [gp, b] : batches)
    if (auto w = gp->wait_enqueued(stream); !w)
      for (size_t i : members[gp])
        if (status[i] == 0) status[i] = w.error().code();
  std::vector<int32_t> ust(n);
  CXLKV_TRY(store_.unpin_many(pins, ust));
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    if (status[i] == 0 && pins[i].pinned() && ust[i] != 0) status[i] = ust[i];
    if (status[i] == 0) ok++;
  }
  return ok;
}

}  // namespace cxlkv::gpu
