// SPDX-License-Identifier: MIT
// Control cost of the KV store's calls per block: everything but the copy,
// through a real KvSession (two-tier stripe locks with a running lock
// manager thread, the node heap, the node table's liveness), one node.
//
//   kv.batch64_publish_us_per_block   put_chain of a 64-block chain, per block
//   kv.batch64_fetch_us_per_block     get_many of those 64 blocks, per block
//   kv.single_publish_us_per_block    reserve + write + publish, one block per call
//   kv.single_fetch_us_per_block      pin + fetch + unpin, one block per call
//
// Payloads are 4 KiB (one chunk) and the same-run time of the raw copy of
// the same 64 payloads (gather_write / scatter_read of the same chunks into
// / out of the same pool, no index work) is subtracted, so what remains is
// the control path: index probes and entry writes, stripe locks, handle
// checks, allocation, statistics.  The cache is not full (no eviction: that
// is index.reserve_evict_us).  Each figure is the median over rounds.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "pool/format.hpp"
#include "transfer/cpu_copy.hpp"

namespace {

using clk = std::chrono::steady_clock;
constexpr size_t kBatch = 64;
constexpr uint64_t kBytes = 4096;

double us_since(clk::time_point t0) { return std::chrono::duration<double, std::micro>(clk::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// A chain of 64 keys (block i a child of block i-1, as a request's prompt).
std::vector<cxlkv::BlockKey> chain_keys(uint64_t tag) {
  std::vector<uint64_t> ids(kBatch);
  for (size_t i = 0; i < kBatch; i++) ids[i] = tag + i;
  return cxlkv::keys_from_ids(ids);
}

void bench_kv_batch(bench::Results& res) {
  const std::string name = bench::shm_name("kvbatch");
  cxlkv::PoolFormatOptions fo;
  fo.force = true;
  fo.max_nodes = 4;
  fo.index_entries = 1u << 16;
  auto rr = cxlkv::format_pool("shm:" + name + ":512M", fo);
  if (!rr) {
    std::fprintf(stderr, "bench kv batch: %s\n", rr.error().message().c_str());
    return;
  }
  cxlkv::Region& r = *rr.value();
  cxlkv::LockManagerOptions mo;
  mo.node = 3;
  auto mgr = cxlkv::LockManager::create(r, mo);
  if (!mgr) {
    std::fprintf(stderr, "bench kv batch: %s\n", mgr.error().message().c_str());
    return;
  }
  mgr.value()->start();
  cxlkv::NodeOptions no;
  no.node = 0;
  no.heartbeat = true;
  auto node = cxlkv::NodeContext::attach(r, no);
  if (!node) {
    std::fprintf(stderr, "bench kv batch: %s\n", node.error().message().c_str());
    return;
  }
  {
    auto sess = cxlkv::open_kv_session(r, *node.value());
    if (!sess) {
      std::fprintf(stderr, "bench kv batch: %s\n", sess.error().message().c_str());
      mgr.value()->stop();
      return;
    }
    cxlkv::KvStore& kv = sess.value()->store();

    // The engine side: 64 payloads of 4 KiB, one chunk each.
    std::vector<std::byte> src(kBatch * kBytes), dst(kBatch * kBytes);
    for (size_t i = 0; i < src.size(); i += 64) src[i] = std::byte(i >> 6);
    std::vector<cxlkv::Chunk> in(kBatch), out(kBatch);
    for (size_t i = 0; i < kBatch; i++) {
      in[i] = cxlkv::Chunk{src.data() + i * kBytes, kBytes};
      out[i] = cxlkv::Chunk{dst.data() + i * kBytes, kBytes};
    }
    const std::vector<uint32_t> nchunks(kBatch, 1);
    std::vector<int32_t> st(kBatch);

    // Copy baselines: the same 64 chunks into / out of 64 pool blocks.
    auto kc = r.carve(CXLKV_CARVE_KV).value();
    std::byte* pool = r.at(kc.offset + kc.size - kBatch * kBytes);
    cxlkv::MemoryDomain& dom = r.domain();
    auto copy_in = [&] {
      for (size_t i = 0; i < kBatch; i++) (void)cxlkv::gather_write(dom, pool + i * kBytes, {&in[i], 1});
    };
    auto copy_out = [&] {
      for (size_t i = 0; i < kBatch; i++) (void)cxlkv::scatter_read(dom, pool + i * kBytes, {&out[i], 1});
    };

    const int rounds = std::max(8, int(30 * bench::scale()));
    std::vector<double> wcopy, rcopy, bpub, bget, spub, sget;
    uint64_t tag = 0x9000000;
    for (int round = -2; round < rounds; round++) {  // two warm-up rounds
      auto t0 = clk::now();
      copy_in();
      const double wc = us_since(t0);
      t0 = clk::now();
      copy_out();
      const double rc = us_since(t0);

      // Batches: one put_chain, one get_many.
      auto keys = chain_keys(tag += 0x1000);
      t0 = clk::now();
      auto n = kv.put_chain(nullptr, keys, kBytes, in, nchunks, st);
      const double bp = us_since(t0);
      if (!n || n.value() != kBatch) {
        std::fprintf(stderr, "bench kv batch: put_chain: %s\n",
                     n ? kv.last_block_error().c_str() : n.error().message().c_str());
        break;
      }
      t0 = clk::now();
      n = kv.get_many(keys, out, nchunks, st);
      const double bg = us_since(t0);
      if (!n || n.value() != kBatch) {
        std::fprintf(stderr, "bench kv batch: get_many: %s\n",
                     n ? kv.last_block_error().c_str() : n.error().message().c_str());
        break;
      }

      // The same one block per call.
      keys = chain_keys(tag += 0x1000);
      bool ok = true;
      t0 = clk::now();
      for (size_t i = 0; i < kBatch && ok; i++) {
        auto rv = kv.reserve(keys[i], i ? &keys[i - 1] : nullptr, kBytes);
        ok = rv && rv->reserved() && kv.write(*rv, {&in[i], 1}) && kv.publish(*rv);
      }
      const double sp = us_since(t0);
      t0 = clk::now();
      for (size_t i = 0; i < kBatch && ok; i++) {
        auto p = kv.pin(keys[i]);
        ok = p && kv.fetch(*p, {&out[i], 1}) && kv.unpin(*p);
      }
      const double sg = us_since(t0);
      if (!ok) {
        std::fprintf(stderr, "bench kv batch: single-block calls failed\n");
        break;
      }
      if (round < 0) continue;
      wcopy.push_back(wc);
      rcopy.push_back(rc);
      bpub.push_back(bp - wc);
      bget.push_back(bg - rc);
      spub.push_back(sp - wc);
      sget.push_back(sg - rc);
    }
    if (!bpub.empty()) {
      res.set("kv.batch64_publish_us_per_block", median(bpub) / kBatch);
      res.set("kv.batch64_fetch_us_per_block", median(bget) / kBatch);
      res.set("kv.single_publish_us_per_block", median(spub) / kBatch);
      res.set("kv.single_fetch_us_per_block", median(sget) / kBatch);
      res.set("kv.batch64_copy_in_us_per_block", median(wcopy) / kBatch);
      res.set("kv.batch64_copy_out_us_per_block", median(rcopy) / kBatch);
    }
  }
  node.value().reset();
  mgr.value()->stop();
  cxlkv::NodeContext::unlink_local(cxlkv::NodeContext::default_local_name(r, 0));
}

}  // namespace

CXLKV_BENCH({"kv", "KV control cost per block: 64-block put_chain / get_many vs single calls (real locks)",
             bench_kv_batch});
