// SPDX-License-Identifier: MIT
// A simulated pool for index protocol tests: every node on its own
// NonCoherentSim domain, index carve at 0, payload after it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "coherence/noncoherent_sim.hpp"
#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"
#include "support/kv_test_support.hpp"

namespace cxlkv::test {

constexpr uint64_t kPoolBytes = 8 << 20;
constexpr uint64_t kIndexBytes = 2 << 20;

// A simulated pool shared by `nodes` nodes: index carve at 0, payload after.
struct SimPool {
  explicit SimPool(uint32_t nodes, double evict_p = 0.0, IndexFormatOptions fo = small_index())
      : pool(kPoolBytes), sim(pool.mem, pool.bytes, NonCoherentSimOptions{nodes, evict_p, 7}),
        space(kIndexBytes, kPoolBytes - kIndexBytes) {
    auto r = index_format(sim.node(0), pool.mem, kIndexBytes, fo);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    for (uint32_t n = 0; n < nodes; n++) live.set_incarnation(n, 100 + n);
  }
  static IndexFormatOptions small_index() {
    IndexFormatOptions o;
    o.stripe_slots = 64;
    o.max_stripes = 8;
    return o;
  }
  // What node `node`'s store is built from: index reads through `index`,
  // payloads through `payload` (both default to the node's simulator view),
  // the pool's stripe locks, liveness table and space.
  KvDeps deps(uint32_t node, MemoryDomain* index = nullptr, MemoryDomain* payload = nullptr, uint32_t inc = 0) {
    KvDeps d;
    d.index_domain = index ? index : &sim.node(node);
    d.index_carve = pool.mem;
    d.index_bytes = kIndexBytes;
    d.node = node;
    d.incarnation = inc ? inc : 100 + node;
    d.locks = &locks;
    d.liveness = &live;
    d.space = &space;
    d.devices.push_back(PoolDevice{payload ? payload : index ? index : &sim.node(node), pool.mem, pool.bytes});
    return d;
  }
  static std::unique_ptr<KvStore> make(KvDeps d) {
    auto kv = KvStore::create(std::move(d));
    EXPECT_TRUE(kv.ok()) << (kv.ok() ? "" : kv.error().message());
    return kv.ok() ? std::move(kv.value()) : nullptr;
  }
  std::unique_ptr<KvStore> store(uint32_t node, uint32_t inc = 0) { return make(deps(node, nullptr, nullptr, inc)); }
  AlignedPool pool;
  NonCoherentSim sim;
  MutexStripeLocks locks;
  TableLiveness live;
  RangeSpace space;
};

inline std::vector<BlockKey> chain(uint64_t id, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = id * 1000003 + i;
  return keys_from_ids(ids);
}

// reserve -> write -> publish one block whose bytes derive from its key.
inline Result<KvReservation> put(KvStore& kv, std::span<const BlockKey> c, size_t i, size_t bytes = 4096) {
  auto r = kv.reserve(c[i], i ? &c[i - 1] : nullptr, bytes);
  if (!r || !r->reserved()) return r;
  std::vector<std::byte> buf(bytes);
  fill_block(c[i], buf.data(), bytes);
  Chunk ch{buf.data(), bytes};
  CXLKV_TRY(kv.write(*r, {&ch, 1}));
  CXLKV_TRY(kv.publish(*r));
  return r;
}

inline bool fetch_ok(KvStore& kv, const BlockKey& k, size_t bytes = 4096) {
  auto p = kv.pin(k);
  if (!p) return false;
  std::vector<std::byte> got(bytes), want(bytes);
  Chunk ch{got.data(), bytes};
  bool ok = kv.fetch(*p, {&ch, 1}).ok();
  fill_block(k, want.data(), bytes);
  EXPECT_TRUE(kv.unpin(*p).ok());
  return ok && got == want;
}


struct Died {};  // a writer's death at a lock call: its process state is abandoned

// Stripe locks of a writer that dies at its die_at-th lock() call once
// armed (0: never): the call throws Died and the thread unwinds; from then
// on its unlocks (destructors while its stack unwinds) do nothing and its
// locks fail.  recover() then releases what it held, as the lock manager
// does for a dead holder.
class DyingLocks final : public StripeLocks {
 public:
  explicit DyingLocks(StripeLocks& inner) : inner_(inner) {}
  Result<void> lock(uint32_t s) override {
    if (dead) return Error(-EOWNERDEAD, "dead");
    if (die_at && ++calls == die_at) {
      dead = true;
      throw Died{};
    }
    auto r = inner_.lock(s);
    if (r) held.push_back(s);
    return r;
  }
  void unlock(uint32_t s) override {
    if (dead) return;
    held.erase(std::find(held.begin(), held.end(), s));
    inner_.unlock(s);
  }
  void recover() {
    for (uint32_t s : held) inner_.unlock(s);
    held.clear();
  }
  uint32_t die_at = 0, calls = 0;
  bool dead = false;
  std::vector<uint32_t> held;

 private:
  StripeLocks& inner_;
};

// A node's domain with a broken rule 1/3 for the "a removed flush is
// caught" tests: non-temporal stores (`plain_nt`) and/or whole-line
// publications (`plain_publish`) become plain stores, and invalidate keeps
// the node's own dirty lines, so nothing of them reaches memory unless
// evicted: another node reads what memory held before.
class BrokenStores final : public MemoryDomain {
 public:
  BrokenStores(MemoryDomain& d, bool plain_nt, bool plain_publish) : d_(d), nt_(plain_nt), pub_(plain_publish) {}
  DomainMode mode() const override { return d_.mode(); }
  std::string describe() const override {
    return std::string("broken:") + (nt_ ? " store_nt = plain store" : "") + (pub_ ? " publish_line = plain store" : "");
  }
  void load(void* a, const void* b, size_t n) override { d_.load(a, b, n); }
  void store(void* a, const void* b, size_t n) override { d_.store(a, b, n); }
  void store_nt(void* a, const void* b, size_t n) override { nt_ ? d_.store(a, b, n) : d_.store_nt(a, b, n); }
  void flush(const void* p, size_t n) override { d_.flush(p, n); }
  void flush_bulk(const void* p, size_t n) override { d_.flush_bulk(p, n); }
  void invalidate(const void* p, size_t n) override {
    (void)p;  // keeps its own dirty lines: models the missing NT store or flush
    (void)n;
  }
  void fence() override { d_.fence(); }
  void copy_to_pool(void* a, const void* b, size_t n) override { d_.copy_to_pool(a, b, n); }
  void copy_from_pool(void* a, const void* b, size_t n) override { d_.copy_from_pool(a, b, n); }
  void publish_line(void* dst, const void* src) override { pub_ ? d_.store(dst, src, 64) : d_.publish_line(dst, src); }

 private:
  MemoryDomain& d_;
  bool nt_, pub_;
};

}  // namespace cxlkv::test
