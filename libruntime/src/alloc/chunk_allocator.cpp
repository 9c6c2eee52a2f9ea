// SPDX-License-Identifier: MIT
// The global tier of the allocator: a bitmap of chunks in the alloc carve,
// read-modify-written only under the global lock CXLKV_LOCK_ALLOC (rule 7),
// every changed word written back with an 8-byte NT store (rule 1: any node
// may hold the lock next).

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "alloc/alloc_internal.hpp"
#include "util/clock.hpp"
#include "util/lock_timeout.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

std::atomic<int64_t> g_quarantine_ms{-1};

std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

// The chunk bitmap and the state line while CXLKV_LOCK_ALLOC is held (the
// guard invalidated the bitmap after acquiring, rule 4).  Every changed
// word is written with an 8-byte NT store (rule 1) and folded into the
// bitmap checksum, which commit() writes back to the state line.
class LockedBitmap {
 public:
  LockedBitmap(MemoryDomain& d, uint64_t* words, uint64_t nw, cxlkv_alloc_state* state)
      : d_(d), words_(words), nw_(nw), state_p_(state), st_(d.read_fresh(state)) {}  // rule 4
  // -EUCLEAN when the bitmap does not add up to the state line's checksum.
  Result<void> verify(const std::string& who) const {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < nw_; i++) sum ^= cxlkv_bitmap_word_sum(i, d_.read(&words_[i]));
    if (sum == st_.bitmap_sum) return {};
    return Error(-EUCLEAN, who + ": chunk bitmap checksum mismatch (state line " + hex64(st_.bitmap_sum) +
                               ", bitmap " + hex64(sum) +
                               "): the bitmap is damaged (zeroed?); refusing to hand out space from it");
  }
  bool test(uint64_t i) const { return (d_.read(&words_[i / 64]) >> (i % 64)) & 1; }
  void set(uint64_t i, bool on) {
    const uint64_t w = d_.read(&words_[i / 64]);
    const uint64_t n = on ? (w | (1ull << (i % 64))) : (w & ~(1ull << (i % 64)));
    if (n == w) return;
    st_.bitmap_sum ^= cxlkv_bitmap_word_sum(i / 64, w) ^ cxlkv_bitmap_word_sum(i / 64, n);
    d_.write_nt(&words_[i / 64], n);  // rule 1
  }
  cxlkv_alloc_state& state() { return st_; }
  void commit() {
    d_.fence();                        // rule 3: bitmap words before the sum that covers them
    d_.publish_line(state_p_, &st_);   // rule 1: whole line, NT
  }

 private:
  MemoryDomain& d_;
  uint64_t* words_;
  uint64_t nw_;
  cxlkv_alloc_state* state_p_;
  cxlkv_alloc_state st_;
};

}  // namespace

Result<LockGuard> alloc::take_lock(TwoTierLock& lock, std::chrono::nanoseconds timeout, const std::string& role,
                                   PoolRange protect) {
  auto g = lock_wait_unbounded(timeout) ? LockGuard::take(lock, protect) : LockGuard::take_for(lock, timeout, protect);
  if (!g) return Error(g.error().code(), role + ": " + g.error().message());
  return g;
}

namespace {

// This process's last quarantine sweep (the sweep reads every descriptor:
// at most every 100 ms unless an allocation would fail).
std::atomic<uint64_t> g_last_sweep_ns{0};

}  // namespace

void set_reclaim_quarantine(std::chrono::milliseconds period) { g_quarantine_ms.store(period.count()); }

std::chrono::milliseconds reclaim_quarantine() {
  int64_t ms = g_quarantine_ms.load();
  if (ms < 0) {
    const char* e = std::getenv("CXLKV_RECLAIM_QUARANTINE_MS");
    ms = e && *e ? std::strtoll(e, nullptr, 10) : 600000;
    if (ms < 0) ms = 600000;
    g_quarantine_ms.store(ms);
  }
  return std::chrono::milliseconds(ms);
}

Result<ChunkAllocator> ChunkAllocator::open(NodeContext& node) {
  auto carve = node.region().carve(CXLKV_CARVE_ALLOC);
  if (!carve) return carve.error();
  auto h = alloc::read_alloc_header(node.region(), node.domain());
  if (!h) return h.error();
  ChunkAllocator a(node);
  a.base_ = node.region().at(carve->offset);
  a.hdr_ = h.value();
  a.geo_ = {h->chunk_size, h->nchunks, h->arena_off};
  a.lock_timeout_ = cxlkv::lock_timeout();
  return a;
}

cxlkv_chunk_desc ChunkAllocator::desc(uint64_t chunk) const {
  auto* d = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off) + chunk;
  return node_->domain().read_fresh(d);  // rule 4
}

void ChunkAllocator::set_owner(uint64_t off, const cxlkv_block_owner& o) {
  if (!in_arena(off)) return;
  auto* rec = reinterpret_cast<cxlkv_block_owner*>(base_ + cxlkv_alloc_owner_off(&hdr_)) +
              (off - geo_.arena_off) / CXLKV_OWNER_GRANULE;
  node_->domain().write_nt(rec, o);  // rule 1: one 8-byte NT store, the line has other blocks' records
}

cxlkv_block_owner ChunkAllocator::owner(uint64_t off) const {
  if (!in_arena(off)) return cxlkv_block_owner{};
  auto* rec = reinterpret_cast<const cxlkv_block_owner*>(base_ + cxlkv_alloc_owner_off(&hdr_)) +
              (off - geo_.arena_off) / CXLKV_OWNER_GRANULE;
  return node_->domain().read_fresh(rec);  // rule 4
}

uint64_t ChunkAllocator::free_chunks() const {
  MemoryDomain& d = node_->domain();
  auto* words = reinterpret_cast<const uint64_t*>(base_ + hdr_.bitmap_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  d.invalidate(words, nw * 8);  // rule 4
  d.fence();
  uint64_t used = 0;
  for (uint64_t i = 0; i < nw; i++) used += __builtin_popcountll(d.read(&words[i]));
  return geo_.nchunks - used;
}

namespace {

// Release the quarantine runs that may be released (cxlkv/format/alloc_format.h):
// the node that lost them resumed (alive again, same incarnation, two
// heartbeats since), or its process on this host is gone, or until_ns
// passed.  Caller holds ALLOC.
uint64_t release_due(NodeContext& node, LockedBitmap& bm, cxlkv_chunk_desc* descs, cxlkv_quarantine* recs,
                     uint64_t nchunks, const std::string& who) {
  if (bm.state().quarantined == 0) return 0;
  MemoryDomain& d = node.domain();
  d.invalidate(descs, nchunks * sizeof(cxlkv_chunk_desc));  // rule 4: descriptors have many writers
  d.fence();
  const uint64_t now = realtime_ns();
  uint64_t released = 0;
  for (uint64_t c = 0; c < nchunks; c++) {
    const cxlkv_chunk_desc cd = d.read(&descs[c]);
    if (cd.kind != CXLKV_CHUNK_QUARANTINE) continue;
    const cxlkv_quarantine q = d.read_fresh(&recs[c]);  // rule 4
    const char* why = nullptr;
    if (now >= q.until_ns) {
      why = "the quarantine period ended";
    } else if (cd.owner < node.control().max_nodes()) {
      const cxlkv_node_entry e = d.read_fresh(node.control().node_entry(cd.owner));  // rule 4
      const NodeVerdict v = judge_node(e);
      if (static_cast<uint32_t>(e.incarnation) == q.owner_inc) {
        if (v.local && !v.alive) why = "its process is gone";
        else if (v.alive && e.heartbeat >= q.heartbeat + 2) why = "it resumed and beat twice since";
      }
    }
    if (!why) continue;
    const uint64_t n = cd.run;
    if (n == 0 || c + n > nchunks) {
      log().error("{}: quarantine run at chunk {} of {} chunks overruns the table; left alone", who, c, n);
      continue;
    }
    const cxlkv_chunk_desc none{CXLKV_CHUNK_NO_OWNER, CXLKV_CHUNK_FREE, 0, 0};
    for (uint64_t i = c; i < c + n; i++) {
      d.write_nt(&descs[i], none);  // rule 1
      bm.set(i, false);
    }
    bm.state().quarantined -= std::min<uint64_t>(bm.state().quarantined, n);
    bm.state().releases++;
    released += n;
    log().info("{}: {} chunk(s) at chunk {} taken from node {} released from quarantine: {}", who, n, c, cd.owner,
               why);
    c += n - 1;
  }
  return released;
}

}  // namespace

Result<uint64_t> ChunkAllocator::alloc_run(uint64_t n, bool small, uint32_t size_class) {
  MemoryDomain& d = node_->domain();
  const std::string who = "pool " + node_->region().uri() + ": alloc carve";
  if (n == 0 || n > geo_.nchunks)  // -EFBIG: no eviction can make room (NodeHeap::alloc)
    return Error(n ? -EFBIG : -EINVAL, "pool " + node_->region().uri() + ": allocation of " + std::to_string(n) +
                              " chunks exceeds the kv carve (" + std::to_string(geo_.nchunks) + " chunks of " +
                              std::to_string(geo_.chunk_size) + " bytes)");
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  // The guard invalidates the bitmap after acquiring (rule 4) and flushes
  // it before releasing (rule 3); we also write changed words NT (rule 1).
  auto g = alloc::take_lock(lock, lock_timeout_, "allocator lock (ALLOC), allocating " + std::to_string(n) + " chunk(s)", {words, nw * 8});
  if (!g) return g.error();
  LockedBitmap bm(d, words, nw, state());
  CXLKV_TRY(bm.verify(who));  // never allocate from a damaged bitmap

  auto find = [&] {
    uint64_t first = geo_.nchunks, run = 0;
    for (uint64_t i = 0; i < geo_.nchunks; i++) {
      if ((i % 64) == 0 && run == 0 && n == 1 && d.read(&words[i / 64]) == ~0ull && i + 64 <= geo_.nchunks) {
        i += 63;
        continue;
      }
      if (bm.test(i)) {
        run = 0;
        continue;
      }
      if (++run == n) {
        first = i + 1 - n;
        break;
      }
    }
    return first;
  };
  bool released = false;
  if (bm.state().quarantined) {
    const uint64_t now = realtime_ns(), last = g_last_sweep_ns.load();
    if (now - last > 100000000ull) {
      g_last_sweep_ns.store(now);
      released = release_due(*node_, bm, descs, quarantine(), geo_.nchunks, who) > 0;
    }
  }
  uint64_t first = find();
  if (first == geo_.nchunks && bm.state().quarantined && !released) {
    // Before failing: is quarantined space due back?
    g_last_sweep_ns.store(realtime_ns());
    if (release_due(*node_, bm, descs, quarantine(), geo_.nchunks, who)) first = find();
  }
  if (first == geo_.nchunks) {
    uint64_t free_now = 0;
    for (uint64_t i = 0; i < nw; i++) free_now += __builtin_popcountll(d.read(&words[i]));
    free_now = geo_.nchunks - free_now;
    bm.commit();  // releases above, if any
    return Error(-ENOSPC, "pool " + node_->region().uri() + ": kv carve exhausted: no free run of " +
                              std::to_string(n) + " chunk(s) of " + std::to_string(geo_.chunk_size) + " bytes (" +
                              std::to_string(free_now) + " of " + std::to_string(geo_.nchunks) + " chunks free" +
                              (bm.state().quarantined ? ", " + std::to_string(bm.state().quarantined) +
                                                            " in quarantine after a node was declared dead"
                                                      : std::string()) +
                              ")");
  }
  for (uint64_t i = first; i < first + n; i++) bm.set(i, true);
  for (uint64_t i = first; i < first + n; i++) {
    cxlkv_chunk_desc cd{};
    cd.owner = static_cast<uint16_t>(node_->node());
    if (small) {
      cd.kind = CXLKV_CHUNK_SMALL;
      cd.size_class = static_cast<uint8_t>(size_class);
      cd.run = 1;
    } else {
      cd.kind = i == first ? CXLKV_CHUNK_LARGE_HEAD : CXLKV_CHUNK_LARGE_TAIL;
      cd.run = static_cast<uint32_t>(i == first ? n : i - first);
    }
    d.write_nt(&descs[i], cd);  // rule 1: eight descriptors share a line
  }
  bm.commit();
  d.fence();  // rule 3: descriptors and state in memory before the lock is released
  return first;
}

Result<void> ChunkAllocator::free_run(uint64_t first, std::chrono::nanoseconds lock_timeout) {
  MemoryDomain& d = node_->domain();
  const std::string who = "pool " + node_->region().uri() + ": alloc carve";
  if (first >= geo_.nchunks)
    return Error(-EINVAL, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) + " out of range");
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  auto g = alloc::take_lock(lock, lock_timeout, "allocator lock (ALLOC), freeing the run at chunk " + std::to_string(first), {words, nw * 8});
  if (!g) return g.error();
  LockedBitmap bm(d, words, nw, state());
  CXLKV_TRY(bm.verify(who));
  cxlkv_chunk_desc cd = d.read_fresh(&descs[first]);  // rule 4
  uint64_t n;
  if (cd.kind == CXLKV_CHUNK_SMALL) n = 1;
  else if (cd.kind == CXLKV_CHUNK_LARGE_HEAD) n = cd.run;
  else
    return Error(-EINVAL, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) +
                              " is not the start of an allocation (" +
                              (cd.kind == CXLKV_CHUNK_FREE         ? "free"
                               : cd.kind == CXLKV_CHUNK_QUARANTINE ? "in quarantine"
                                                                   : "inside a larger run") +
                              ")");
  if (first + n > geo_.nchunks)
    return Error(-EUCLEAN, "pool " + node_->region().uri() + ": chunk " + std::to_string(first) + " run of " +
                               std::to_string(n) + " overruns the table");
  for (uint64_t i = first; i < first + n; i++)
    if (!bm.test(i))
      return Error(-EUCLEAN, who + ": chunk " + std::to_string(i) + " of the run at " + std::to_string(first) +
                                 " is not allocated in the bitmap (descriptor and bitmap disagree)");
  const cxlkv_chunk_desc none{CXLKV_CHUNK_NO_OWNER, CXLKV_CHUNK_FREE, 0, 0};
  for (uint64_t i = first; i < first + n; i++) {
    d.write_nt(&descs[i], none);  // rule 1
    bm.set(i, false);
  }
  bm.commit();
  d.fence();  // rule 3
  return {};
}

Result<void> ChunkAllocator::quarantine_run(uint64_t first, uint32_t node, uint32_t incarnation_lo,
                                            std::chrono::nanoseconds lock_timeout) {
  MemoryDomain& d = node_->domain();
  const std::string who = "pool " + node_->region().uri() + ": alloc carve";
  const auto period = reclaim_quarantine();
  if (period.count() == 0) return free_run(first, lock_timeout);  // quarantine off (tests)
  if (first >= geo_.nchunks || node >= node_->control().max_nodes())
    return Error(-EINVAL, who + ": quarantine of chunk " + std::to_string(first) + " for node " +
                              std::to_string(node) + ": out of range");
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  auto g = alloc::take_lock(lock, lock_timeout, "allocator lock (ALLOC), quarantining the run at chunk " + std::to_string(first), {words, nw * 8});
  if (!g) return g.error();
  LockedBitmap bm(d, words, nw, state());
  CXLKV_TRY(bm.verify(who));
  cxlkv_chunk_desc cd = d.read_fresh(&descs[first]);  // rule 4
  if (cd.kind != CXLKV_CHUNK_LARGE_HEAD || cd.run == 0 || first + cd.run > geo_.nchunks)
    return Error(-EINVAL, who + ": chunk " + std::to_string(first) + " is not the start of a whole-chunk run");
  const cxlkv_node_entry e = d.read_fresh(node_->control().node_entry(node));  // rule 4
  cxlkv_quarantine q{};
  q.until_ns = realtime_ns() + uint64_t(period.count()) * 1000000ull;
  q.heartbeat = e.heartbeat;
  q.owner_inc = incarnation_lo;
  d.store_nt(&quarantine()[first], &q, sizeof q);  // rule 1: two records share a line
  d.fence();  // rule 3: the record before the descriptor that points at it
  cd.owner = static_cast<uint16_t>(node);
  cd.kind = CXLKV_CHUNK_QUARANTINE;
  d.write_nt(&descs[first], cd);  // rule 1
  bm.state().quarantined += cd.run;
  bm.commit();
  d.fence();  // rule 3
  log().warn("{}: {} chunk(s) at chunk {} taken from node {} (declared dead) quarantined for up to {} ms", who, cd.run,
             first, node, period.count());
  return {};
}

Result<uint64_t> ChunkAllocator::release_quarantine() {
  MemoryDomain& d = node_->domain();
  const std::string who = "pool " + node_->region().uri() + ": alloc carve";
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  auto* descs = reinterpret_cast<cxlkv_chunk_desc*>(base_ + hdr_.chunk_table_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  auto g = alloc::take_lock(lock, lock_timeout_, "allocator lock (ALLOC), releasing quarantined chunks", {words, nw * 8});
  if (!g) return g.error();
  LockedBitmap bm(d, words, nw, state());
  CXLKV_TRY(bm.verify(who));
  uint64_t n = release_due(*node_, bm, descs, quarantine(), geo_.nchunks, who);
  bm.commit();
  d.fence();  // rule 3
  return n;
}

uint64_t ChunkAllocator::quarantined_chunks() const { return node_->domain().read_fresh(state()).quarantined; }

Result<void> ChunkAllocator::check_bitmap() {
  MemoryDomain& d = node_->domain();
  auto* words = reinterpret_cast<uint64_t*>(base_ + hdr_.bitmap_off);
  const uint64_t nw = (geo_.nchunks + 63) / 64;
  TwoTierLock lock(*node_, CXLKV_LOCK_ALLOC);
  auto g = alloc::take_lock(lock, lock_timeout_, "allocator lock (ALLOC), checking the chunk bitmap", {words, nw * 8});
  if (!g) return g.error();
  LockedBitmap bm(d, words, nw, state());
  return bm.verify("pool " + node_->region().uri() + ": alloc carve");
}

}  // namespace cxlkv
