// SPDX-License-Identifier: MIT
// Handoff leases: a producer publishes blocks for a consumer; eviction skips
// them until the consumer releases them, the lease expires, or the consumer's
// node dies (NodeLiveness).  State: the lease fields of the entry's ext record
// (uapi cxlkv_index_ext), changed only under the stripe lock with NT stores
// (rule 1) and fenced before the lock is released (rule 3); the evictor reads
// them under the same lock after an invalidation (rule 4).
#include <string>

#include "index/index_internal.hpp"
#include "index/stripe_lock_set.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

Result<size_t> PrefixIndex::lease_many(std::span<const BlockKey> keys, uint64_t consumer, uint32_t consumer_node,
                                       uint32_t ttl_ms, std::span<int32_t> status) {
  begin_batch();
  if (status.size() < keys.size()) return Error(-EINVAL, "index: lease: fewer statuses than keys");
  if (ttl_ms == 0 || ttl_ms > (1u << 30))
    return Error(-EINVAL, "index: lease ttl " + std::to_string(ttl_ms) + " ms is not 1 .. 2^30");
  if (consumer_node != kLeaseNodeAny && consumer_node >= hdr_.max_nodes)
    return Error(-EINVAL, "index: lease consumer node " + std::to_string(consumer_node) + " >= max_nodes " +
                              std::to_string(hdr_.max_nodes));
  const uint8_t node8 = consumer_node == kLeaseNodeAny ? CXLKV_LEASE_NODE_ANY : static_cast<uint8_t>(consumer_node);
  std::vector<uint32_t> stripes;
  for (const BlockKey& k : keys) stripes.push_back(stripe_of(k));
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes));
  const uint32_t now = now_ms();
  size_t good = 0;
  bool wrote = false;
  for (size_t i = 0; i < keys.size(); i++) {
    cxlkv_index_entry e;
    const uint32_t slot = keys[i].is_zero() ? CXLKV_INDEX_NO_SLOT : probe(keys[i], &e, nullptr);
    if (slot == CXLKV_INDEX_NO_SLOT || e.state != CXLKV_ENTRY_READY) {
      status[i] = kBlockMiss;
      block_error(-ENOENT, "index: lease of block " + to_hex(keys[i]) + ": not cached");
      continue;
    }
    cxlkv_index_ext x = read_ext(slot);
    bool dead = false;
    if (x.lease_count && lease_live(x, now, &dead)) {
      if (x.lease_consumer != consumer) {
        if (x.lease_count < UINT16_MAX) x.lease_count++;
        if (x.lease_node != node8) x.lease_node = CXLKV_LEASE_NODE_ANY;
        x.linked &= static_cast<uint8_t>(~CXLKV_EXT_HANDOFF);  // another request reads it too: a reuse
        x.linked |= CXLKV_EXT_REUSED;                          // (index_evict.cpp: the hot list)
      }
      if (static_cast<int32_t>(now + ttl_ms - x.lease_expiry_ms) > 0) x.lease_expiry_ms = now + ttl_ms;
    } else {
      if (x.lease_count) {  // an ended lease is replaced: count its end
        cxlkv_index_stripe& st = ls.st(stripe_of(keys[i]));
        ls.mark(stripe_of(keys[i]));
        st.lease_expiries++;
        if (dead) st.lease_dead++;
        ctr_.lease_expiries++;
      }
      // Leased before (for its producer's consumer) and leased again: a
      // later request reads it, a reuse (index_evict.cpp: the hot list).
      if ((x.linked & CXLKV_EXT_LEASED) && x.lease_consumer != consumer) x.linked |= CXLKV_EXT_REUSED;
      x.linked |= CXLKV_EXT_LEASED;
      x.lease_count = 1;
      x.lease_consumer = consumer;
      x.lease_node = node8;
      x.lease_start_ms = now;
      x.lease_expiry_ms = now + ttl_ms;
      // A block unused since it was linked (just published for
      // this consumer) is handed off: the consumer's reads will not count
      // as a reuse.  Its link time moves to the lease's start, which its
      // lru_ms goes back to when the lease ends.
      const bool linked = x.linked & CXLKV_EXT_LINKED;
      if (linked ? static_cast<int32_t>(e.lru_ms - x.linked_ms) <= 0 : false) {
        x.linked |= CXLKV_EXT_HANDOFF;
        if (static_cast<int32_t>(now - x.linked_ms) > 0) x.linked_ms = now;
      } else {
        x.linked &= static_cast<uint8_t>(~CXLKV_EXT_HANDOFF);
      }
    }
    write_ext(slot, x);
    wrote = true;
    status[i] = kBlockReserved;
    good++;
  }
  if (wrote) d_->fence();  // rule 3: the lease is in memory before the lock is released
  return good;
}

Result<size_t> PrefixIndex::release_many(std::span<const BlockKey> keys, uint64_t consumer,
                                         std::span<int32_t> status) {
  begin_batch();
  if (status.size() < keys.size()) return Error(-EINVAL, "index: lease release: fewer statuses than keys");
  std::vector<uint32_t> stripes;
  for (const BlockKey& k : keys) stripes.push_back(stripe_of(k));
  StripeLockSet ls(*this);
  CXLKV_TRY(ls.acquire(stripes));
  const uint32_t now = now_ms();
  size_t good = 0;
  bool wrote = false;
  for (size_t i = 0; i < keys.size(); i++) {
    cxlkv_index_entry e;
    const uint32_t slot = keys[i].is_zero() ? CXLKV_INDEX_NO_SLOT : probe(keys[i], &e, nullptr);
    if (slot == CXLKV_INDEX_NO_SLOT || e.state != CXLKV_ENTRY_READY) {
      status[i] = kBlockMiss;
      block_error(-ENOENT, "index: lease release of block " + to_hex(keys[i]) + ": not cached");
      continue;
    }
    cxlkv_index_ext x = read_ext(slot);
    // lease_consumer 0: the record was shared and its first consumer left,
    // so the remaining consumer is not known by id.
    if (x.lease_count == 0 || (x.lease_count == 1 && x.lease_consumer && x.lease_consumer != consumer)) {
      status[i] = -ENOENT;
      block_error(-ENOENT, "index: block " + to_hex(keys[i]) + " is not leased to consumer " + std::to_string(consumer));
      continue;
    }
    bool dead = false;
    const bool live = lease_live(x, now, &dead);
    if (!live) {  // ended before the consumer came: say so, and count it
      const uint32_t s = stripe_of(keys[i]);
      ls.mark(s);
      ls.st(s).lease_expiries++;
      if (dead) ls.st(s).lease_dead++;
      ctr_.lease_expiries++;
      x.lease_count = 1;
    }
    if (x.lease_count > 1 && x.lease_consumer == consumer) x.lease_consumer = 0;
    if (--x.lease_count == 0) {
      if ((x.linked & CXLKV_EXT_HANDOFF) && static_cast<int32_t>(e.lru_ms - x.lease_start_ms) > 0) {
        // The consumer's reads were the handoff, not a reuse.
        e.lru_ms = x.lease_start_ms;
        write_entry(slot, e, false);
      }
      x.linked &= static_cast<uint8_t>(~CXLKV_EXT_HANDOFF);
      x.lease_consumer = 0;
      x.lease_node = CXLKV_LEASE_NODE_ANY;
      x.lease_start_ms = x.lease_expiry_ms = 0;
    }
    write_ext(slot, x);
    wrote = true;
    if (live) {
      status[i] = kBlockReserved;
      good++;
    } else {
      status[i] = -ETIMEDOUT;
      block_error(-ETIMEDOUT, "index: lease of block " + to_hex(keys[i]) + " for consumer " +
                                  std::to_string(consumer) + (dead ? " ended: its node died" : " had expired"));
    }
  }
  if (wrote) d_->fence();  // rule 3: released before the lock is
  return good;
}

std::vector<PrefixIndex::LeaseView> PrefixIndex::leases() const {
  std::vector<LeaseView> out;
  const uint32_t now = now_ms();
  for (uint32_t slot = 0; slot < hdr_.nslots; slot++) {
    cxlkv_index_ext x = read_ext(slot);  // rule 4 (lock-free: a display snapshot)
    if (x.lease_count == 0) continue;
    cxlkv_index_entry e = read_entry(slot);
    if (e.state != CXLKV_ENTRY_READY) continue;
    LeaseView v;
    v.key = BlockKey{e.key_lo, e.key_hi};
    v.slot = slot;
    v.count = x.lease_count;
    v.node = x.lease_node == CXLKV_LEASE_NODE_ANY ? kLeaseNodeAny : x.lease_node;
    v.consumer = x.lease_consumer;
    v.age_ms = now - x.lease_start_ms;
    v.expires_in_ms = static_cast<int32_t>(x.lease_expiry_ms - now);
    v.live = v.expires_in_ms > 0 && (x.lease_node == CXLKV_LEASE_NODE_ANY || live_->node_alive(x.lease_node));
    out.push_back(v);
  }
  return out;
}

}  // namespace cxlkv
