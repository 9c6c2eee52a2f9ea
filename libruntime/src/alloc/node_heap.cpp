// SPDX-License-Identifier: MIT
// The node tier of the allocator.  Chunks the node owns are cut into blocks
// of one size class; which blocks are free is node-local state (a bitmap
// per chunk in node-local shared memory, shared by the node's processes
// under heap_mu), so allocating and freeing locally touch no pool memory
// and no cross-host lock.
//
//   alloc(class): current chunk of the class -> bump pointer or a free bit;
//                 else a partial chunk; else drain remote frees; else a new
//                 chunk from the global ChunkAllocator.
//   free(off):    owned chunk -> set the free bit (a chunk whose blocks are
//                 all free again goes back to the global bitmap);
//                 another node's chunk -> remote free (cxlkv/format/alloc_format.h);
//                 a LARGE run -> back to the global bitmap.
//   drain:        remote frees -> free bits; a chunk whose blocks are all
//                 free again goes back to the global bitmap (after the
//                 REMOTE_FREE lock is released; the inbox count keeps its
//                 frees counted until then).  The node drains when it
//                 allocates and, while idle, from each kv session's drainer
//                 thread (drain_if_posted), so space that other nodes free
//                 by evicting this node's blocks becomes theirs to use.
// Lock order: heap_mu (node-local) -> ALLOC / REMOTE_FREE+self (global),
// never both global locks at once (drain returns chunks after releasing
// REMOTE_FREE+self).  A remote free takes REMOTE_FREE+owner without heap_mu.
// Every wait for a global lock is bounded by the allocator's lock_timeout()
// (CXLKV_LOCK_TIMEOUT_MS): an allocation past it fails with -ETIMEDOUT and
// changes nothing; a free that needs a global lock it cannot get is
// deferred (kept in this process, retried each drainer period, by
// retry_deferred_frees(), and when the heap closes), so an eviction neither
// hangs nor loses the space.
#include <algorithm>
#include <mutex>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "alloc/alloc_internal.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "util/log.hpp"

namespace cxlkv {

using alloc::HeapLocalHeader;
using alloc::kNoChunk;
using alloc::LocalChunk;

struct NodeHeap::Impl {
  NodeLocal* nl = nullptr;
  HeapLocalHeader* hdr = nullptr;
  LocalChunk* chunks = nullptr;
  std::byte* bits = nullptr;  // per chunk free bitmaps
  uint64_t bits_stride = 0;
  uint64_t* free_bits(uint64_t c) const { return reinterpret_cast<uint64_t*>(bits + c * bits_stride); }
  // Frees whose global lock did not come within the bound (see the top).
  // deferred_mu is taken after heap_mu, never before.
  mutable std::mutex deferred_mu;
  std::vector<PendingFree> deferred;
  std::string last_cause;  // why the last one was deferred
};

NodeHeap::NodeHeap(NodeContext& n, ChunkAllocator c) : node_(n), chunks_(c), impl_(std::make_unique<Impl>()) {}
NodeHeap::~NodeHeap() {
  if (!impl_ || deferred_frees() == 0) return;
  // Last chance for frees deferred while a global lock was out of reach.
  auto r = retry_deferred_frees(chunks_.lock_timeout());
  const size_t left = deferred_frees();
  if (left)
    log().error("pool {}: {} block free(s) deferred for a lock could not be done before the node heap closed ({}); "
                "their space stays allocated",
                node_.region().uri(), left, r ? impl_->last_cause : r.error().message());
}

Result<std::unique_ptr<NodeHeap>> NodeHeap::open(NodeContext& node) {
  auto ca = ChunkAllocator::open(node);
  if (!ca) return ca.error();
  NodeLocal& nl = node.local();
  const auto& geo = ca->geometry();
  auto layout = alloc::heap_local_layout(geo.nchunks, geo.chunk_size);
  if (nl.heap_bytes < layout.total)
    return Error(-EUCLEAN, "node-local memory /dev/shm/" + nl.name + ": heap area too small for this pool");
  std::unique_ptr<NodeHeap> h(new NodeHeap(node, ca.value()));
  Impl& I = *h->impl_;
  I.nl = &nl;
  I.hdr = reinterpret_cast<HeapLocalHeader*>(nl.heap);
  I.chunks = reinterpret_cast<LocalChunk*>(nl.heap + layout.chunks_off);
  I.bits = nl.heap + layout.bits_off;
  I.bits_stride = (geo.chunk_size / CXLKV_ALLOC_MIN_BLOCK + 511) / 512 * 64;
  sync::RobustLock g(&nl.hdr->heap_mu, "node heap");
  if (I.hdr->nchunks == 0) {  // first process of this node: empty heap
    I.hdr->nchunks = geo.nchunks;
    I.hdr->chunk_size = geo.chunk_size;
    I.hdr->bits_stride = I.bits_stride;
    for (uint32_t c = 0; c < kSizeClasses; c++) I.hdr->cur[c] = I.hdr->partial[c] = kNoChunk;
  }
  return h;
}

namespace {

uint32_t blocks_per_chunk(uint64_t chunk_size, uint32_t cls) {
  return static_cast<uint32_t>(chunk_size / size_class_bytes(cls));
}

void partial_push(NodeHeap::Impl& I, uint32_t c) {
  LocalChunk& lc = I.chunks[c];
  if (lc.in_partial) return;
  uint32_t& head = I.hdr->partial[lc.cls];
  lc.prev = kNoChunk;
  lc.next = head;
  if (head != kNoChunk) I.chunks[head].prev = c;
  head = c;
  lc.in_partial = 1;
}

void partial_remove(NodeHeap::Impl& I, uint32_t c) {
  LocalChunk& lc = I.chunks[c];
  if (!lc.in_partial) return;
  if (lc.prev != kNoChunk) I.chunks[lc.prev].next = lc.next;
  else I.hdr->partial[lc.cls] = lc.next;
  if (lc.next != kNoChunk) I.chunks[lc.next].prev = lc.prev;
  lc.in_partial = 0;
  lc.prev = lc.next = kNoChunk;
}

// Chunk c's free bitmap with its words [0, words) in use (LocalChunk::bits_words).
uint64_t* bits_upto(NodeHeap::Impl& I, uint32_t c, uint32_t words) {
  LocalChunk& lc = I.chunks[c];
  uint64_t* bits = I.free_bits(c);
  if (lc.bits_words < words) {
    std::memset(bits + lc.bits_words, 0, uint64_t(words - lc.bits_words) * 8);
    lc.bits_words = words;
  }
  return bits;
}

// Take one block from chunk c, or -1 if it has none.
int64_t take_block(NodeHeap::Impl& I, uint32_t c, uint32_t cap) {
  LocalChunk& lc = I.chunks[c];
  if (lc.free_count) {
    // Set bits lie in the words in use only (a free makes its word so first).
    uint64_t* bits = I.free_bits(c);
    const uint32_t nw = lc.bits_words;
    for (uint32_t k = 0; k < nw; k++) {
      uint32_t w = (lc.hint + k) % nw;
      if (bits[w]) {
        uint32_t b = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits[w]));
        bits[w] &= bits[w] - 1;
        lc.free_count--;
        lc.hint = w;
        return b;
      }
    }
  }
  if (lc.bump < cap) return lc.bump++;
  return -1;
}

// Return chunk c to the global bitmap once none of its blocks is in use.
void maybe_return_chunk(NodeHeap& heap, NodeHeap::Impl& I, uint32_t c) {
  LocalChunk& lc = I.chunks[c];
  if (!lc.owned || lc.free_count != lc.bump || I.hdr->cur[lc.cls] == c) return;
  // The global bitmap first: a chunk it does not take back (ALLOC out of
  // reach within the bound) stays this node's, all free, on its partial
  // list -- reused by the next allocation of its class, never lost.
  // While frees wait for their lock, one try (0) instead of a whole bound.
  auto r = heap.chunks().free_run(c, heap.deferred_frees() ? std::chrono::nanoseconds::zero()
                                                           : heap.chunks().lock_timeout());
  if (!r) {
    log().warn("{} (chunk {} stays with node {})", r.error().message(), c, heap.node().node());
    if (I.hdr->cur[lc.cls] != c) partial_push(I, c);
    return;
  }
  partial_remove(I, c);
  std::memset(I.free_bits(c), 0, uint64_t(lc.bits_words) * 8);  // a chunk not taken has no word in use
  lc = LocalChunk{};
  lc.prev = lc.next = kNoChunk;
  I.hdr->stats.chunks_owned--;
  I.hdr->stats.chunk_returns++;
}

Result<uint64_t> drain_locked(NodeHeap& heap, NodeHeap::Impl& I, std::chrono::nanoseconds lock_timeout);

}  // namespace

Result<uint64_t> NodeHeap::alloc(uint64_t bytes) {
  Impl& I = *impl_;
  // A block of no bytes has no offset of its own: it would share one with
  // the next allocation (DESIGN.md "Conventions": bad input is an error).
  if (bytes == 0)
    return Error(-EINVAL, "pool " + node_.region().uri() + ": node heap: an allocation of 0 bytes (at least 1)");
  const auto& geo = chunks_.geometry();
  const uint32_t cls = size_class_for(bytes, geo.chunk_size);
  if (cls == kSizeClasses) {
    // Large: a run of whole chunks from the global bitmap.
    if (bytes > geo.nchunks * geo.chunk_size) {
      sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
      I.hdr->stats.enospc++;
      // -EFBIG, not -ENOSPC: no eviction can make room, so callers that
      // evict on -ENOSPC (the index's reserve) must not empty the cache for it.
      return Error(-EFBIG, "pool " + node_.region().uri() + ": a block of " + std::to_string(bytes) +
                               " bytes is larger than the whole kv carve (" +
                               std::to_string(geo.nchunks * geo.chunk_size) + " bytes of payload space)");
    }
    uint64_t n = (bytes + geo.chunk_size - 1) / geo.chunk_size;
    auto first = chunks_.alloc_run(n, false, 0);
    sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
    if (!first) {
      I.hdr->stats.enospc++;
      return first.error();
    }
    I.hdr->stats.allocs++;
    I.hdr->stats.chunks_owned += n;
    return chunks_.chunk_off(first.value());
  }
  const uint32_t cap = blocks_per_chunk(geo.chunk_size, cls);
  sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
  bool drained = false;
  for (;;) {
    uint32_t c = I.hdr->cur[cls];
    if (c != kNoChunk) {
      int64_t b = take_block(I, c, cap);
      if (b >= 0) {
        I.hdr->stats.allocs++;
        I.hdr->stats.bytes_in_use += size_class_bytes(cls);
        return chunks_.chunk_off(c) + uint64_t(b) * size_class_bytes(cls);
      }
      I.hdr->cur[cls] = kNoChunk;  // full: it re-enters the partial list when a block is freed
    }
    if (I.hdr->partial[cls] != kNoChunk) {
      uint32_t p = I.hdr->partial[cls];
      partial_remove(I, p);
      I.hdr->cur[cls] = p;
      continue;
    }
    if (!drained) {
      drained = true;
      auto d = drain_locked(*this, I, chunks_.lock_timeout());
      if (d && d.value()) continue;
      // No manager grants REMOTE_FREE+self: ALLOC would not come either.
      if (!d && d.error().code() == -ETIMEDOUT) return d.error();
    }
    auto first = chunks_.alloc_run(1, true, cls);
    if (!first) {
      I.hdr->stats.enospc++;
      return first.error();
    }
    uint32_t nc = static_cast<uint32_t>(first.value());
    LocalChunk& lc = I.chunks[nc];
    lc = LocalChunk{};
    lc.owned = 1;
    lc.cls = cls;
    lc.prev = lc.next = kNoChunk;  // and no bitmap word in use: none is touched here
    I.hdr->cur[cls] = nc;
    I.hdr->stats.chunks_owned++;
    I.hdr->stats.chunk_refills++;
  }
}

Result<void> NodeHeap::free(uint64_t off) { return release_or_defer(PendingFree{off, 0, 0, false}); }

Result<void> NodeHeap::free_taken(uint64_t off, uint32_t node, uint32_t incarnation_lo) {
  return release_or_defer(PendingFree{off, node, incarnation_lo, true});
}

Result<void> NodeHeap::release_or_defer(const PendingFree& f) {
  Impl& I = *impl_;
  // While earlier frees wait for their lock, one try (0) instead of a whole
  // bound each: an eviction of many blocks waits at most one bound.
  const auto t = deferred_frees() ? std::chrono::nanoseconds::zero() : chunks_.lock_timeout();
  auto r = release(f, t);
  if (r || r.error().code() != -ETIMEDOUT) return r;
  std::lock_guard<std::mutex> g(I.deferred_mu);
  if (I.deferred.empty())
    log().warn("pool {}: free of offset {} deferred until its lock comes: {}", node_.region().uri(), f.off,
               r.error().message());
  I.deferred.push_back(f);
  I.last_cause = r.error().message();
  return {};
}

Result<void> NodeHeap::release(const PendingFree& f, std::chrono::nanoseconds lock_timeout) {
  if (!f.taken) return free_within(f.off, lock_timeout);
  const uint64_t off = f.off;
  const uint32_t node = f.node, incarnation_lo = f.inc;
  if (!chunks_.in_arena(off) || node >= node_.control().max_nodes())
    return free_within(off, lock_timeout);  // free() names the error
  const uint64_t c = chunks_.chunk_of(off);
  const cxlkv_chunk_desc cd = chunks_.desc(c);  // rule 4
  if (cd.kind != CXLKV_CHUNK_LARGE_HEAD || off != chunks_.chunk_off(c)) return free_within(off, lock_timeout);
  // A process of this host that is gone cannot store anything any more.
  const cxlkv_node_entry e = node_.domain().read_fresh(node_.control().node_entry(node));  // rule 4
  const NodeVerdict v = judge_node(e);
  if (static_cast<uint32_t>(e.incarnation) == incarnation_lo && v.local && !v.alive)
    return free_within(off, lock_timeout);
  CXLKV_TRY(chunks_.quarantine_run(c, node, incarnation_lo, lock_timeout));
  sync::RobustLock g(&impl_->nl->hdr->heap_mu, "node heap");
  impl_->hdr->stats.frees++;
  return {};
}

size_t NodeHeap::deferred_frees() const {
  std::lock_guard<std::mutex> g(impl_->deferred_mu);
  return impl_->deferred.size();
}

Result<uint64_t> NodeHeap::retry_deferred_frees(std::chrono::nanoseconds lock_timeout) {
  Impl& I = *impl_;
  std::vector<PendingFree> todo;
  {
    std::lock_guard<std::mutex> g(I.deferred_mu);
    todo.swap(I.deferred);
  }
  uint64_t done = 0;
  size_t i = 0;
  std::string cause;
  for (; i < todo.size(); i++) {
    auto r = release(todo[i], lock_timeout);
    if (r) {
      done++;
      continue;
    }
    if (r.error().code() == -ETIMEDOUT) {  // still out of reach: keep it and the rest
      cause = r.error().message();
      break;
    }
    log().error("pool {}: deferred free of offset {}: {}", node_.region().uri(), todo[i].off, r.error().message());
  }
  if (i < todo.size()) {
    std::lock_guard<std::mutex> g(I.deferred_mu);
    I.deferred.insert(I.deferred.begin(), todo.begin() + static_cast<ptrdiff_t>(i), todo.end());
    I.last_cause = cause;
    return Error(-ETIMEDOUT, cause);
  }
  if (done) log().info("pool {}: {} deferred free(s) done", node_.region().uri(), done);
  return done;
}

Result<void> NodeHeap::free_within(uint64_t off, std::chrono::nanoseconds lock_timeout) {
  Impl& I = *impl_;
  const std::string who = "pool " + node_.region().uri() + ": free of offset " + std::to_string(off);
  if (!chunks_.in_arena(off)) return Error(-EINVAL, who + ": not in the kv carve");
  const uint32_t c = static_cast<uint32_t>(chunks_.chunk_of(off));
  const uint64_t in_chunk = off - chunks_.chunk_off(c);
  {
    sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
    LocalChunk& lc = I.chunks[c];
    if (lc.owned) {
      const uint32_t sz = size_class_bytes(lc.cls);
      const uint32_t b = static_cast<uint32_t>(in_chunk / sz);
      if (in_chunk % sz || b >= lc.bump) return Error(-EINVAL, who + ": not the start of an allocated block");
      uint64_t* bits = bits_upto(I, c, b / 64 + 1);
      if (bits[b / 64] & (1ull << (b % 64))) return Error(-EINVAL, who + ": double free");
      bits[b / 64] |= 1ull << (b % 64);
      lc.free_count++;
      I.hdr->stats.frees++;
      I.hdr->stats.bytes_in_use -= sz;
      if (I.hdr->cur[lc.cls] != c) partial_push(I, c);
      maybe_return_chunk(*this, I, c);
      return {};
    }
  }
  cxlkv_chunk_desc cd = chunks_.desc(c);  // rule 4 (read fresh)
  if (cd.kind == CXLKV_CHUNK_LARGE_HEAD) {
    if (in_chunk) return Error(-EINVAL, who + ": not the start of a large allocation");
    CXLKV_TRY(chunks_.free_run(c, lock_timeout));
    sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
    I.hdr->stats.frees++;
    if (cd.owner == node_.node()) I.hdr->stats.chunks_owned -= cd.run;
    return {};
  }
  if (cd.kind == CXLKV_CHUNK_QUARANTINE) return Error(-EINVAL, who + ": the block's chunks are in quarantine");
  if (cd.kind != CXLKV_CHUNK_SMALL || cd.owner >= node_.control().max_nodes() || cd.size_class >= kSizeClasses)
    return Error(-EINVAL, who + ": not an allocated block");
  if (cd.owner == node_.node())
    return Error(-EUCLEAN, who + ": chunk " + std::to_string(c) +
                               " is recorded as this node's, but node-local memory does not know it "
                               "(node-local memory recreated?); block leaked");
  // Remote free: mark the block in the owner's remote bitmap for this chunk.
  const uint32_t sz = size_class_bytes(cd.size_class);
  if (in_chunk % sz) return Error(-EINVAL, who + ": not the start of an allocated block");
  const uint64_t b = in_chunk / sz;
  const auto& h = chunks_.header();
  std::byte* base = chunks_.carve_base();
  auto* rbits = reinterpret_cast<uint64_t*>(base + h.remote_bits_off + uint64_t(c) * h.remote_bits_stride);
  auto* pend = reinterpret_cast<uint64_t*>(base + h.pending_off + uint64_t(cd.owner) * h.pending_stride);
  auto* inbox = reinterpret_cast<cxlkv_remote_inbox*>(base + h.inbox_off) + cd.owner;
  MemoryDomain& d = node_.domain();
  TwoTierLock lock(node_, CXLKV_LOCK_REMOTE_FREE_BASE + cd.owner);
  {
    auto g = alloc::take_lock(lock, lock_timeout,
                              "remote-free lock of node " + std::to_string(cd.owner) + " (REMOTE_FREE+" +
                                  std::to_string(cd.owner) + "), " + who);
    if (!g) return g.error();
    // rule 7: read-modify-write under the owner's REMOTE_FREE lock; rule 4
    // fresh reads; rule 1: NT writes (any node writes these words).
    uint64_t w = d.read_fresh(&rbits[b / 64]);
    if (w & (1ull << (b % 64))) return Error(-EINVAL, who + ": double free (already freed remotely)");
    d.write_nt(&rbits[b / 64], uint64_t(w | (uint64_t{1} << (b % 64))));
    uint64_t pw = d.read_fresh(&pend[c / 64]);
    d.write_nt(&pend[c / 64], uint64_t(pw | (uint64_t{1} << (c % 64))));
    cxlkv_remote_inbox in = d.read_fresh(inbox);
    in.pending++;
    in.posted++;
    d.fence();  // rule 3: bits before the count that announces them
    d.publish_line(inbox, &in);
    d.fence();
  }
  sync::RobustLock g(&I.nl->hdr->heap_mu, "node heap");
  I.hdr->stats.frees++;
  I.hdr->stats.remote_frees_sent++;
  return {};
}

Result<uint64_t> NodeHeap::drain_remote_frees() {
  sync::RobustLock g(&impl_->nl->hdr->heap_mu, "node heap");
  return drain_locked(*this, *impl_, chunks_.lock_timeout());
}

uint64_t NodeHeap::remote_frees_posted(uint32_t n) const {
  const auto& h = chunks_.header();
  if (n >= node_.control().max_nodes()) return 0;
  auto* inbox = reinterpret_cast<cxlkv_remote_inbox*>(chunks_.carve_base() + h.inbox_off) + n;
  return node_.domain().read_fresh(&inbox->pending);  // rule 4: one fresh read of the inbox line
}

Result<uint64_t> NodeHeap::drain_if_posted(std::chrono::nanoseconds lock_timeout) {
  // The check costs one fresh read and no lock: an idle node calls it each period.
  if (remote_frees_posted(node_.node()) == 0) return uint64_t{0};
  sync::RobustLock g(&impl_->nl->hdr->heap_mu, "node heap");
  return drain_locked(*this, *impl_, lock_timeout);
}

namespace {
// Caller holds heap_mu.  lock_timeout bounds the wait for REMOTE_FREE+self
// (nanoseconds::max(): as long as it takes; 0: one try).
Result<uint64_t> drain_locked(NodeHeap& heap, NodeHeap::Impl& I, std::chrono::nanoseconds lock_timeout) {
  NodeContext& node = heap.node();
  MemoryDomain& d = node.domain();
  const auto& h = heap.chunks().header();
  std::byte* base = heap.chunks().carve_base();
  const uint32_t me = node.node();
  auto* inbox = reinterpret_cast<cxlkv_remote_inbox*>(base + h.inbox_off) + me;
  if (d.read_fresh(&inbox->pending) == 0) return uint64_t{0};  // rule 4; a hint, checked again under the lock
  auto* pend = reinterpret_cast<uint64_t*>(base + h.pending_off + uint64_t(me) * h.pending_stride);
  std::vector<uint32_t> touched;  // chunks that got blocks back: returned once the lock is released
  uint64_t drained = 0;
  // Frees taken into chunks whose blocks are now all free: those chunks go
  // back to the pool only after REMOTE_FREE+self is released (ALLOC is taken
  // alone), so the inbox keeps counting them until they are there.
  uint64_t returning = 0;
  {
    TwoTierLock lock(node, CXLKV_LOCK_REMOTE_FREE_BASE + me);
    auto g = alloc::take_lock(lock, lock_timeout,
                              "remote-free lock of node " + std::to_string(me) + " (REMOTE_FREE+" +
                                  std::to_string(me) + "), draining its remote frees");
    if (!g) return g.error();
    const uint64_t nw = (h.nchunks + 63) / 64;
    d.invalidate(pend, nw * 8);  // rule 4
    d.fence();
    for (uint64_t wi = 0; wi < nw; wi++) {
      uint64_t pw = d.read(&pend[wi]);
      if (!pw) continue;
      for (uint64_t m = pw; m; m &= m - 1) {
        const uint32_t c = static_cast<uint32_t>(wi * 64 + __builtin_ctzll(m));
        LocalChunk& lc = I.chunks[c];
        auto* rbits = reinterpret_cast<uint64_t*>(base + h.remote_bits_off + uint64_t(c) * h.remote_bits_stride);
        const uint32_t cap = blocks_per_chunk(h.chunk_size, lc.cls);
        const uint32_t rw = (cap + 63) / 64;
        d.invalidate(rbits, rw * 8);  // rule 4
        d.fence();
        uint64_t into_c = 0;
        for (uint32_t k = 0; k < rw; k++) {
          uint64_t w = d.read(&rbits[k]);
          if (!w) continue;
          d.write_nt(&rbits[k], uint64_t{0});  // rule 1
          if (!lc.owned) continue;             // not ours any more (node-local memory recreated): leak
          uint64_t* fb = bits_upto(I, c, k + 1);
          w &= ~fb[k];                         // never count a block twice
          fb[k] |= w;
          uint32_t cnt = static_cast<uint32_t>(__builtin_popcountll(w));
          lc.free_count += cnt;
          drained += cnt;
          into_c += cnt;
          I.hdr->stats.bytes_in_use -= uint64_t(cnt) * size_class_bytes(lc.cls);
        }
        if (lc.owned && I.hdr->cur[lc.cls] != c && lc.free_count) partial_push(I, c);
        if (lc.owned && lc.free_count) touched.push_back(c);
        if (lc.owned && lc.free_count == lc.bump) returning += into_c;
      }
      d.write_nt(&pend[wi], uint64_t{0});  // rule 1
    }
    // docs/eviction.md "Remote frees": what is left counted is the frees
    // whose chunks are still on their way back to the pool.  The node that
    // evicted them waits while the count is up; a count of 0 here, before
    // the chunks are back, would let it find the pool still full and give up
    // (evicting one more block for nothing).
    cxlkv_remote_inbox in = d.read_fresh(inbox);
    in.pending = returning;
    d.fence();  // rule 3: bitmaps cleared before the count says so
    d.publish_line(inbox, &in);
    d.fence();
    I.hdr->stats.remote_frees_drained += drained;
  }  // REMOTE_FREE+self released: returning chunks takes ALLOC (lock order above)
  for (uint32_t c : touched) {
    LocalChunk& lc = I.chunks[c];
    // A current chunk whose blocks all came back goes too: the node that
    // evicted them needs whole chunks; this node takes a fresh one when it
    // allocates again.
    if (lc.owned && lc.free_count == lc.bump && I.hdr->cur[lc.cls] == c) I.hdr->cur[lc.cls] = kNoChunk;
    maybe_return_chunk(heap, I, c);
  }
  if (returning) {
    // The chunks are back (or stay this node's, all free, where ALLOC did
    // not come): the count drops by what they held.  Frees posted since
    // stay counted.  Without the lock within the bound the count stays up
    // until the next drain, which sets it again (a waiter waits at most its
    // bound).
    TwoTierLock lock(node, CXLKV_LOCK_REMOTE_FREE_BASE + me);
    auto g = alloc::take_lock(lock, lock_timeout,
                              "remote-free lock of node " + std::to_string(me) + " (REMOTE_FREE+" +
                                  std::to_string(me) + "), counting returned chunks");
    if (!g) return drained;
    // rule 7: read-modify-write of the count under REMOTE_FREE+self; rule 4: read fresh.
    cxlkv_remote_inbox in = d.read_fresh(inbox);
    in.pending -= std::min<uint64_t>(in.pending, returning);
    d.fence();  // rule 3: the chunks' bitmap words (written under ALLOC) before the count that announces them
    d.publish_line(inbox, &in);  // rule 1: the whole line, as every writer of the inbox
    d.fence();  // rule 3: the count is in memory before the lock is released
  }
  return drained;
}
}  // namespace

Result<uint64_t> NodeHeap::usable_size(uint64_t off) const {
  if (!chunks_.in_arena(off)) return Error(-EINVAL, "offset " + std::to_string(off) + " is not in the kv carve");
  cxlkv_chunk_desc cd = chunks_.desc(chunks_.chunk_of(off));
  if (cd.kind == CXLKV_CHUNK_SMALL && cd.size_class < kSizeClasses) return uint64_t{size_class_bytes(cd.size_class)};
  if (cd.kind == CXLKV_CHUNK_LARGE_HEAD) return uint64_t{cd.run} * chunks_.geometry().chunk_size;
  return Error(-EINVAL, "offset " + std::to_string(off) + " is not an allocated block");
}

HeapStats NodeHeap::stats() const {
  sync::RobustLock g(&impl_->nl->hdr->heap_mu, "node heap");
  return impl_->hdr->stats;
}

}  // namespace cxlkv
