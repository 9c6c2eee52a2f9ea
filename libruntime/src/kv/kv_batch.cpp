// SPDX-License-Identifier: MIT
// KvStore batch calls: many blocks per call, a status per block
// (semantics in cxlkv/kv.hpp and cxlkv.h), and the single-block calls as
// thin wrappers over them.
//
// Handle checks (fencing, docs/integrity.md "Fencing: handles carry the entry version") cost one fresh read of the block's entry
// line, and a batch reads all of its blocks' lines in one invalidation sweep
// with one fence (PrefixIndex::entries_fresh): write and fetch check before
// the copy (a forged or stale handle is never written to or read from) and
// after it (a block reclaimed or evicted under the copy fails with -ESTALE,
// never 0); publish checks before the index call.  put_chain / get_many
// skip the pre-copy check of the handles their own reserve_chain / pin_many
// made a moment before.  put_chain on the lock-based path has no check of
// its own after the copy: its publish hands the reservations to the index,
// which compares key, state, owner, version and location in the fresh read
// of each entry it makes under the stripe lock anyway (rule 4) -- no fresh
// read per block on top of the index's own work.  Through the index
// service (no versions in its protocol) the post-copy check stays and is
// also the publish check.
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "index/prefix_index.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

// How long put_chain waits for a parent that another node is writing.
constexpr auto kParentWait = std::chrono::milliseconds(5000);

int32_t as_status(uint32_t handle_status) { return static_cast<int32_t>(handle_status); }
uint32_t as_handle(int32_t status) { return static_cast<uint32_t>(status); }

// The index's batch calls report a code per block and keep the first
// failure's message; this is that message (the backend's: the index service
// sends codes only), or one made from the code.
Error block_error(const IndexBatchOps& ops, const char* op, const BlockKey& k, int32_t code) {
  std::string m = ops.block_message(op, k, code);
  if (!m.empty()) return Error(code, m);
  return Error(code, std::string("kv: ") + op + " of block " + to_hex(k) + ": " + std::strerror(-code));
}

// Walks the concatenated chunk lists block by block.
class ChunkCursor {
 public:
  ChunkCursor(std::span<const Chunk> chunks, std::span<const uint32_t> nchunks) : chunks_(chunks), n_(nchunks) {}
  std::span<const Chunk> next() {
    auto s = chunks_.subspan(pos_, n_[i_]);
    pos_ += n_[i_++];
    return s;
  }

 private:
  std::span<const Chunk> chunks_;
  std::span<const uint32_t> n_;
  size_t pos_ = 0, i_ = 0;
};

}  // namespace

void KvStore::note_block_error(const Error& e) {
  if (block_error_.empty()) block_error_ = e.message();
}

Result<void> KvStore::check_batch(const char* what, size_t n, size_t nstatus, std::span<const Chunk> chunks,
                                  const std::span<const uint32_t>* nchunks) {
  block_error_.clear();
  if (nstatus < n)
    return Error(-EINVAL, std::string("kv: ") + what + ": " + std::to_string(n) + " blocks but " +
                              std::to_string(nstatus) + " status entries");
  if (nchunks) {
    if (nchunks->size() < n)
      return Error(-EINVAL, std::string("kv: ") + what + ": " + std::to_string(n) + " blocks but " +
                                std::to_string(nchunks->size()) + " chunk counts");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += (*nchunks)[i];
    if (total > chunks.size())
      return Error(-EINVAL, std::string("kv: ") + what + ": chunk counts add up to " + std::to_string(total) +
                                " chunks, " + std::to_string(chunks.size()) + " given");
  }
  return {};
}

Result<size_t> KvStore::reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                      std::span<KvReservation> out, std::span<int32_t> status, bool through_busy) {
  const size_t n = keys.size();
  if (out.size() < n)
    return Error(-EINVAL, "kv: reserve_chain: " + std::to_string(n) + " keys but room for " +
                              std::to_string(out.size()) + " reservations");
  CXLKV_TRY(check_batch("reserve_chain", n, status.size(), {}, nullptr));
  std::vector<Reservation> ix(n);
  auto t0 = std::chrono::steady_clock::now();
  auto good = ops_->reserve_chain(parent, keys, bytes, ix, status, through_busy);
  // A block a dead writer left WRITING with blocks below it: the index
  // unwinds that chain and says -EAGAIN; the chain goes on from there
  // (bounded), below the blocks this call already holds.
  for (int attempt = 0; good && good.value() < n && status[good.value()] == -EAGAIN && attempt < 4; attempt++) {
    const size_t f = good.value();
    auto more = ops_->reserve_chain(f ? &keys[f - 1] : parent, keys.subspan(f), bytes,
                                    std::span<Reservation>(ix).subspan(f), status.subspan(f, n - f), through_busy);
    if (!more) break;
    good = f + more.value();
  }
  record(CXLKV_LAT_RESERVE, t0, n);
  if (!good) return good.error();
  for (size_t i = 0; i < n; i++) {
    KvReservation& r = out[i];
    r = KvReservation{};
    r.key = keys[i];
    r.status = as_handle(status[i]);
    if (status[i] < 0) {
      if (status[i] != -ECANCELED) {
        count(status[i] == -ENOSPC ? CXLKV_CTR_NOSPC : CXLKV_CTR_ERRORS);
        note_block_error(block_error(*ops_, "reserve", keys[i], status[i]));
      }
      continue;
    }
    r.slot = ix[i].slot;
    r.length = ix[i].loc.length;
    r.loc_off = ix[i].loc.offset;
    r.loc_dev = ix[i].loc.device;
    r.loc_tier = ix[i].loc.tier;
    r.version = ix[i].version;
    if (status[i] == kKvReserved) count(CXLKV_CTR_RESERVES);
    else if (status[i] == kKvExists) count(CXLKV_CTR_RESERVE_EXISTS);
  }
  return good;
}

struct KvStore::HandleCheck {
  size_t at = 0;  // block index in the call
  uint32_t slot = 0;
  BlockKey key;
  BlockLocation loc;
  uint32_t version = 0;
  uint32_t state = 0;  // the entry state the handle expects
  bool owned = false;  // a reservation: this node's incarnation must own it
  bool optimistic = false;  // read without a pin: a change is a miss (docs/coherence.md "Optimistic reads")
  int32_t code = 0;    // the check's outcome: 0 or -errno
};

namespace {

template <class Handle>
BlockLocation loc_of(const Handle& h) {
  return BlockLocation{h.loc_off, static_cast<uint32_t>(h.length), h.loc_dev, h.loc_tier};
}

// Drops the checks that failed (their code is set).
template <class Checks>
void keep_passed(Checks& hs) {
  hs.erase(std::remove_if(hs.begin(), hs.end(), [](const auto& h) { return h.code != 0; }), hs.end());
}

}  // namespace

// Fencing (docs/integrity.md "Fencing: handles carry the entry version"): a handle is honoured only while the index entry it
// names is unchanged: same key, state and version at its slot, at the
// location the handle carries (a forged or stale location is never read or
// written), and for a reservation owned by this node's incarnation.  One
// fresh read of each entry line (rule 4), one sweep and one fence for all.
void KvStore::check_handles(const char* op, std::vector<HandleCheck>& hs, bool after_copy) {
  if (hs.empty()) return;
  std::vector<uint32_t> slots(hs.size());
  for (size_t k = 0; k < hs.size(); k++) slots[k] = hs[k].slot;
  std::vector<IndexEntryView> v(hs.size());
  index_->entries_fresh(slots, v);
  const uint32_t nslots = index_->header().nslots;
  uint32_t owner_node = 0, owner_inc = 0;  // this node, or the index service's (docs/rpc.md "The index service")
  ops_->reservation_owner(&owner_node, &owner_inc);
  for (size_t k = 0; k < hs.size(); k++) {
    HandleCheck& h = hs[k];
    const IndexEntryView& e = v[k];
    auto fail = [&](int32_t code, const std::string& why) {
      h.code = code;
      count(CXLKV_CTR_ERRORS);
      note_block_error(Error(code, std::string("kv: ") + op + " of block " + to_hex(h.key) + ": " + why));
    };
    h.code = 0;
    if (h.slot >= nslots) {
      fail(-EINVAL, "slot " + std::to_string(h.slot) + " is out of range (not a handle of this pool)");
      continue;
    }
    const char* why = nullptr;
    bool elsewhere = false;  // same block and version at another location
    if (e.key != h.key) why = "the slot now holds another block";
    else if (e.state != h.state) why = h.state == CXLKV_ENTRY_READY ? "it is no longer cached (evicted or aborted)"
                                                                     : "it is no longer reserved (published, aborted or reclaimed)";
    else if (e.version != h.version) why = "the entry changed since the handle was made (reclaimed and reused)";
    else if (e.loc.offset != h.loc.offset || e.loc.length != h.loc.length || e.loc.device != h.loc.device ||
             e.loc.tier != h.loc.tier)
      elsewhere = true;
    else if (h.owned && (e.owner_node != owner_node || e.owner_inc != owner_inc))
      why = "another node owns the reservation";
    if (h.optimistic) {
      // Found without a pin: evicted, moved or replaced since is a miss
      // (the bytes read are discarded), as if the lookup had come later.
      if (why || elsewhere) h.code = kKvMiss;
      continue;
    }
    if (elsewhere) {
      fail(-EINVAL, "the handle's location does not match the index entry (forged handle)");
      continue;
    }
    if (!why) continue;
    if (after_copy)
      why = h.owned ? "the reservation was reclaimed during the write"
                    : "the block changed while it was read (bytes discarded)";
    fail(-ESTALE, why);
  }
}

// docs/integrity.md "Space reuse seen at fetch": after a fetch's copy, the space of each memory block
// must still be allocated as that block (PayloadSpace::still_allocated: its
// chunk descriptors and owner record, one sweep, one fence).  Damaged
// allocator metadata (a zeroed bitmap with a matching checksum) can hand a
// published block's space to a new block, whose writer then overwrites it
// while the index entry stays as it was: the entry checks cannot see that,
// this does, so the fetch fails (-EIO) instead of returning the new bytes.
void KvStore::check_space(const char* op, std::vector<HandleCheck>& hs) {
  static thread_local std::vector<BlockLocation> locs;
  static thread_local std::vector<uint32_t> slots;
  static thread_local std::vector<size_t> at;
  static thread_local std::vector<PayloadSpace::Owner> out;
  locs.clear();
  slots.clear();
  at.clear();
  for (size_t k = 0; k < hs.size(); k++) {
    if (hs[k].code || hs[k].loc.tier != CXLKV_TIER_MEM) continue;
    locs.push_back(hs[k].loc);
    slots.push_back(hs[k].slot);
    at.push_back(k);
  }
  if (locs.empty()) return;
  out.resize(locs.size());
  PayloadSpace& space = interleaved_space_ ? *interleaved_space_ : *deps_.space;
  space.still_allocated(locs, slots, out);
  for (size_t j = 0; j < at.size(); j++) {
    if (out[j].ok) continue;
    HandleCheck& h = hs[at[j]];
    if (h.optimistic) {
      // Found without a pin: the block may have been evicted and its space
      // handed out since its entry passed; an entry changed now says so (a
      // miss), an unchanged one is damage as below.
      std::vector<HandleCheck> again{h};
      check_handles(op, again, true);
      if (again[0].code) {
        h.code = again[0].code;
        continue;
      }
    }
    h.code = out[j].code;
    count(CXLKV_CTR_ERRORS);
    note_block_error(Error(h.code, std::string("kv: ") + op + " of block " + to_hex(h.key) + " (slot " +
                                       std::to_string(h.slot) + ", offset " + std::to_string(h.loc.offset) + ", " +
                                       std::to_string(h.loc.length) + " bytes): " + out[j].why +
                                       " (damaged allocator metadata): the bytes read may be another block's, "
                                       "discarded"));
  }
}

Result<size_t> KvStore::write_many(std::span<const KvReservation> rs, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  return write_blocks(rs, chunks, nchunks, status, false);
}

Result<size_t> KvStore::write_blocks(std::span<const KvReservation> rs, std::span<const Chunk> chunks,
                                     std::span<const uint32_t> nchunks, std::span<int32_t> status, bool made_here,
                                     bool post_check) {
  CXLKV_TRY(check_batch("write_many", rs.size(), status.size(), chunks, &nchunks));
  const auto t0 = std::chrono::steady_clock::now();
  ChunkCursor cur(chunks, nchunks);
  std::vector<std::span<const Chunk>> spans(rs.size());
  std::vector<HandleCheck> hs;
  hs.reserve(rs.size());
  for (size_t i = 0; i < rs.size(); i++) {
    spans[i] = cur.next();
    if (!rs[i].reserved()) {
      status[i] = as_status(rs[i].status);
      continue;
    }
    hs.push_back(HandleCheck{i, rs[i].slot, rs[i].key, loc_of(rs[i]), rs[i].version, CXLKV_ENTRY_WRITING, true});
  }
  // Before the copy: a forged or stale handle is never written to.
  if (!made_here) {
    check_handles("write", hs, false);
    for (auto& h : hs)
      if (h.code) status[h.at] = h.code;
    keep_passed(hs);
  }
  for (auto& h : hs) {
    auto w = payload_io(h.loc, spans[h.at], true);  // flushed / NT + fenced (rule 3)
    if (w) continue;
    h.code = status[h.at] = w.error().code();
    count(CXLKV_CTR_ERRORS);
    note_block_error(Error(w.error().code(), w.error().message() + " (write of block " + to_hex(h.key) + ")"));
  }
  keep_passed(hs);
  // After the copy: a writer paused past its liveness (SIGSTOP, swap storm)
  // finds its reservation reclaimed here and must not publish.  put_chain
  // leaves this to its publish, which reads each entry fresh under the
  // stripe lock and checks key, state, owner and version there.
  if (post_check) check_handles("write", hs, true);
  size_t ok = 0;
  for (auto& h : hs) {
    status[h.at] = h.code ? h.code : kKvReserved;
    if (h.code) continue;
    ok++;
    count(CXLKV_CTR_BYTES_IN, h.loc.length);
  }
  record(CXLKV_LAT_WRITE, t0, ok);
  return ok;
}

// The reserved blocks of `rs` (in order) as the index's slot / key lists;
// the others get their handle's status.
struct Picked {
  std::vector<size_t> at;
  std::vector<uint32_t> slots;
  std::vector<BlockKey> keys;
  std::vector<int32_t> status;
};
template <class Handle, class Take>
static Picked pick(std::span<const Handle> hs, std::span<int32_t> status, Take take) {
  Picked p;
  for (size_t i = 0; i < hs.size(); i++) {
    int32_t refused = 0;
    if (!take(hs[i], &refused)) {
      status[i] = refused ? refused : as_status(hs[i].status);
      continue;
    }
    p.at.push_back(i);
    p.slots.push_back(hs[i].slot);
    p.keys.push_back(hs[i].key);
  }
  p.status.resize(p.at.size());
  return p;
}

Result<size_t> KvStore::publish_many(std::span<const KvReservation> rs, std::span<int32_t> status) {
  return publish_blocks(rs, status, PublishCheck::handles);
}

Result<size_t> KvStore::publish_blocks(std::span<const KvReservation> rs, std::span<int32_t> status,
                                       PublishCheck how) {
  CXLKV_TRY(check_batch("publish_many", rs.size(), status.size(), {}, nullptr));
  // Fencing: a reservation whose entry changed (reclaimed while this
  // process was paused, forged, settled) is refused before the index call.
  std::vector<HandleCheck> hs;
  hs.reserve(rs.size());
  for (size_t i = 0; i < rs.size(); i++) {
    if (!rs[i].reserved()) {
      status[i] = as_status(rs[i].status);
      continue;
    }
    hs.push_back(HandleCheck{i, rs[i].slot, rs[i].key, loc_of(rs[i]), rs[i].version, CXLKV_ENTRY_WRITING, true});
  }
  if (how == PublishCheck::handles) {
    check_handles("publish", hs, false);
    for (auto& h : hs)
      if (h.code) status[h.at] = h.code;
    keep_passed(hs);
  }
  Picked p;
  std::vector<Reservation> handles;
  p.at.reserve(hs.size());
  p.slots.reserve(hs.size());
  p.keys.reserve(hs.size());
  if (how == PublishCheck::in_index) handles.reserve(hs.size());
  for (auto& h : hs) {
    p.at.push_back(h.at);
    p.slots.push_back(h.slot);
    p.keys.push_back(h.key);
    if (how == PublishCheck::in_index) handles.push_back(Reservation{ReserveStatus::reserved, h.slot, h.loc, h.version});
  }
  p.status.resize(hs.size());
  auto t0 = std::chrono::steady_clock::now();
  // in_index: the handle check is the index's own fresh read under the
  // stripe lock (key, state, owner, and the reservation's version and location).
  auto good = how == PublishCheck::in_index ? ops_->publish_many(handles, p.keys, p.status)
                                            : ops_->publish_many(p.slots, p.keys, p.status);
  record(CXLKV_LAT_PUBLISH, t0, p.at.size());
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] == 0) count(CXLKV_CTR_PUBLISHES);
    else {
      if (p.status[j] != -EAGAIN) count(CXLKV_CTR_ERRORS);
      note_block_error(block_error(*ops_, "publish", p.keys[j], p.status[j]));
    }
  }
  return good;
}

Result<size_t> KvStore::abort_many(std::span<const KvReservation> rs, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("abort_many", rs.size(), status.size(), {}, nullptr));
  Picked p = pick(rs, status, [](const KvReservation& r, int32_t*) { return r.reserved(); });
  auto good = ops_->abort_many(p.slots, p.keys, p.status);  // children before their parents
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] == 0) count(CXLKV_CTR_ABORTS);
    else note_block_error(block_error(*ops_, "abort", p.keys[j], p.status[j]));
  }
  return good;
}

Result<size_t> KvStore::pin_many(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status) {
  return pin_blocks(keys, out, status, true);
}

// Pin handles (docs/integrity.md "Pin handles"): every pin pin_many hands out gets a tag,
// and the store keeps (slot, tag) -> the handle's fields until that pin's
// unpin.  fetch and unpin honour a handle only while its pin is held here
// and every field matches, so a handle dies with its own unpin (a second
// unpin, or a fetch after it, is refused even while another pin of the same
// block is held), a handle read from the index or made up is never a pin,
// and a forged one never drops the real pin.  It is the cheapest sound
// place: the index's pin counts (and the node pin table behind them) count
// pins per process and slot, not per handle, and through the index service
// the pins are the server's; this table is per store, one hash lookup per
// handle, no pool line read.  get_many's pins never leave the call and skip
// it (held = false).
Result<size_t> KvStore::pin_blocks(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status,
                                   bool held, std::span<uint8_t> pinned) {
  const size_t n = keys.size();
  if (out.size() < n)
    return Error(-EINVAL, "kv: pin_many: " + std::to_string(n) + " keys but room for " + std::to_string(out.size()) +
                              " pins");
  CXLKV_TRY(check_batch("pin_many", n, status.size(), {}, nullptr));
  std::vector<PinnedBlock> ix(n);
  auto t0 = std::chrono::steady_clock::now();
  auto good = pinned.empty() ? ops_->pin_many(keys, ix, status)
                             : ops_->read_many(keys, ix, status, pinned, deps_.optimistic_reads);
  record(CXLKV_LAT_PIN, t0, n);
  if (!good) return good.error();
  for (size_t i = 0; i < n; i++) {
    KvPin& p = out[i];
    p = KvPin{};
    p.key = keys[i];
    p.status = as_handle(status[i]);
    if (status[i] != 0) {
      count(CXLKV_CTR_PIN_MISSES);
      if (status[i] != kKvMiss) note_block_error(block_error(*ops_, "pin", keys[i], status[i]));
      continue;
    }
    count(CXLKV_CTR_PINS);
    p.slot = ix[i].slot;
    p.length = ix[i].loc.length;
    p.loc_off = ix[i].loc.offset;
    p.loc_dev = ix[i].loc.device;
    p.loc_tier = ix[i].loc.tier;
    p.version = ix[i].version;
  }
  if (!held) return good;
  std::vector<size_t> full;  // pins given back: every tag of their slot is held (65,535 pins of one block)
  for (size_t i = 0; i < n; i++) {
    KvPin& p = out[i];
    if (!p.pinned()) continue;
    uint16_t tag = 0;
    for (uint32_t tries = 0; tries <= 0xffff && !tag; tries++) {
      const uint16_t t = ++last_pin_tag_;
      if (t && !held_pins_.contains(held_key(p.slot, t))) tag = t;
    }
    if (!tag) {
      full.push_back(i);
      continue;
    }
    p.tag = tag;
    held_pins_.emplace(held_key(p.slot, tag),
                       HeldPin{p.key, p.loc_off, static_cast<uint32_t>(p.length), p.version, p.loc_dev, p.loc_tier});
  }
  if (!full.empty()) {
    std::vector<uint32_t> slots;
    std::vector<BlockKey> ks;
    for (size_t i : full) slots.push_back(out[i].slot), ks.push_back(out[i].key);
    std::vector<int32_t> ust(full.size());
    (void)ops_->unpin_many(slots, ks, ust);
    for (size_t i : full) {
      status[i] = -ENOSPC;
      out[i].status = as_handle(-ENOSPC);
      count(CXLKV_CTR_ERRORS);
      note_block_error(Error(-ENOSPC, "kv: pin of block " + to_hex(keys[i]) + ": this store already holds 65535 "
                                      "pins of it (unpin some)"));
    }
  }
  return good.value() - full.size();
}

int32_t KvStore::check_held(const KvPin& p, int32_t not_held, std::string* why) const {
  auto it = held_pins_.find(held_key(p.slot, p.tag));
  if (p.tag == 0 || it == held_pins_.end()) {
    *why = "this store holds no such pin: it was released by its unpin (a pin handle is valid only until then) "
           "or never taken by this store (a handle read from the index or made up is not a pin)";
    return not_held;
  }
  const HeldPin& h = it->second;
  if (h.key != p.key || h.loc_off != p.loc_off || h.length != p.length || h.loc_dev != p.loc_dev ||
      h.loc_tier != p.loc_tier || h.version != p.version) {
    *why = "the handle is not the pin this store handed out (forged: pinned at offset " + std::to_string(h.loc_off) +
           ", " + std::to_string(h.length) + " bytes, version " + std::to_string(h.version) + "; the handle says offset " +
           std::to_string(p.loc_off) + ", " + std::to_string(p.length) + " bytes, version " +
           std::to_string(p.version) + ")";
    return -EINVAL;
  }
  return 0;
}

Result<size_t> KvStore::fetch_many(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  return fetch_blocks(pins, chunks, nchunks, status, false);
}

Result<size_t> KvStore::fetch_blocks(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                                     std::span<const uint32_t> nchunks, std::span<int32_t> status, bool made_here,
                                     std::span<const uint8_t> pinned) {
  CXLKV_TRY(check_batch("fetch_many", pins.size(), status.size(), chunks, &nchunks));
  const auto t0 = std::chrono::steady_clock::now();
  ChunkCursor cur(chunks, nchunks);
  std::vector<std::span<const Chunk>> spans(pins.size());
  std::vector<HandleCheck> hs;
  hs.reserve(pins.size());
  for (size_t i = 0; i < pins.size(); i++) {
    spans[i] = cur.next();
    if (!pins[i].pinned()) {
      status[i] = as_status(pins[i].status);
      continue;
    }
    hs.push_back(HandleCheck{i, pins[i].slot, pins[i].key, loc_of(pins[i]), pins[i].version, CXLKV_ENTRY_READY, false});
    hs.back().optimistic = !pinned.empty() && !pinned[i];
  }
  // Before the copy: a forged or stale pin is never read from.
  if (!made_here) {
    check_handles("fetch", hs, false);
    // Only a pin this store holds is read from (see pin_blocks): not one
    // already unpinned, nor a handle that merely matches the index entry.
    std::string why;
    for (auto& h : hs) {
      if (h.code) {
        status[h.at] = h.code;
        continue;
      }
      h.code = status[h.at] = check_held(pins[h.at], -ESTALE, &why);
      if (!h.code) continue;
      count(CXLKV_CTR_ERRORS);
      note_block_error(Error(h.code, "kv: fetch of block " + to_hex(h.key) + ": " + why));
    }
    keep_passed(hs);
  }
  // docs/integrity.md "The SSD tier": the SSD-tier blocks are read together, several in flight.
  std::vector<HandleCheck> ssd;
  if (deps_.ssd_tier)
    for (auto& h : hs)
      if (h.loc.tier == CXLKV_TIER_SSD) ssd.push_back(h);
  fetch_ssd(pins, ssd, spans, status);
  for (auto& h : hs) {
    if (h.loc.tier == CXLKV_TIER_SSD && deps_.ssd_tier) {
      h.code = 1;  // settled by fetch_ssd; the ones it read come back below
      continue;
    }
    auto f = payload_io(h.loc, spans[h.at], false);  // invalidates first (rule 6)
    if (f) continue;
    h.code = status[h.at] = f.error().code();
    count(CXLKV_CTR_ERRORS);
    note_block_error(Error(f.error().code(), f.error().message() + " (fetch of block " + to_hex(h.key) + ")"));
  }
  keep_passed(hs);
  for (auto& h : ssd)
    if (h.code == 0) hs.push_back(h);
  // Validate after copying: a block evicted and reused under the copy (a
  // reader paused past its liveness lost its pin) fails, never returns 0.
  check_handles("fetch", hs, true);
  check_space("fetch", hs);
  size_t ok = 0;
  for (auto& h : hs) {
    status[h.at] = h.code;
    if (h.code) continue;
    ok++;
    count(CXLKV_CTR_FETCHES);
    count(CXLKV_CTR_BYTES_OUT, h.loc.length);
  }
  record(CXLKV_LAT_FETCH, t0, ok);
  if (deps_.promote_on_hit)
    for (auto& h : hs)
      if (h.code == 0 && h.loc.tier == CXLKV_TIER_SSD) promote(pins[h.at], h.loc, spans[h.at]);
  return ok;
}

// The SSD blocks of a fetch: one PlacingTier::read_many.  A block that fails
// its checks (it holds another key, or a bad checksum) is a clean miss: the
// entry goes when it is an unshared leaf, and the pin with it.
void KvStore::fetch_ssd(std::span<const KvPin> pins, std::vector<HandleCheck>& ssd,
                        std::span<const std::span<const Chunk>> chunks, std::span<int32_t> status) {
  if (ssd.empty()) return;
  std::vector<PlacingTier::BlockRead> rd;
  rd.reserve(ssd.size());
  for (auto& h : ssd) rd.push_back({h.key, &h.loc, chunks[h.at]});
  std::vector<int32_t> st(ssd.size(), -EIO);
  deps_.ssd_tier->read_many(rd, st);
  for (size_t k = 0; k < ssd.size(); k++) {
    HandleCheck& h = ssd[k];
    h.code = st[k];
    if (st[k] == 0) continue;
    const KvPin& p = pins[h.at];
    count(CXLKV_CTR_ERRORS);
    if (st[k] == -ESTALE || st[k] == -EBADMSG) {
      auto d = index_->drop_damaged(p.slot, p.key, h.loc);
      if (d && d.value()) dropped_pins_.emplace_back(p.slot, p.key);
      log().warn("kv: SSD block {} at device {} LBA {} fails its checks ({}): a miss{}", to_hex(p.key), h.loc.device,
                 h.loc.offset, std::strerror(-st[k]), d && d.value() ? "; dropped from the index" : "");
      status[h.at] = kKvMiss;
      continue;
    }
    status[h.at] = st[k];
    // read_many reports a code only ("lost: Input/output error" named
    // neither the location nor what failed): both from what is known here.
    const std::string at = " at device " + std::to_string(h.loc.device) + " LBA " + std::to_string(h.loc.offset) +
                           " (" + std::to_string(h.loc.length) + " bytes)";
    note_block_error(Error(st[k], "kv: fetch of SSD block " + to_hex(p.key) + at + ": " +
                                      (deps_.ssd_tier->readable(h.loc)
                                           ? std::string("the SSD read failed: ") + std::strerror(-st[k])
                                           : std::string("that device is not attached to this process"))));
  }
}

Result<size_t> KvStore::unpin_many(std::span<const KvPin> pins, std::span<int32_t> status) {
  return unpin_blocks(pins, status, true);
}

Result<size_t> KvStore::unpin_blocks(std::span<const KvPin> pins, std::span<int32_t> status, bool held) {
  CXLKV_TRY(check_batch("unpin_many", pins.size(), status.size(), {}, nullptr));
  // A pin is dropped only through its own handle, checked field for field
  // against the pin this store holds (pin_blocks): a forged, repeated or
  // made-up handle is refused and the real pin stays.  A pin consumed by
  // dropping its damaged SSD block unpins as 0.
  std::string why;
  Picked p = pick(pins, status, [&](const KvPin& k, int32_t* refused) {
    if (!k.pinned()) return false;
    if (held) {
      if ((*refused = check_held(k, -EINVAL, &why))) {
        count(CXLKV_CTR_ERRORS);
        note_block_error(Error(*refused, "kv: unpin of block " + to_hex(k.key) + ": " + why));
        return false;
      }
      held_pins_.erase(held_key(k.slot, k.tag));
    }
    return !consume_dropped_pin(k);
  });
  auto t0 = std::chrono::steady_clock::now();
  auto good = ops_->unpin_many(p.slots, p.keys, p.status);
  record(CXLKV_LAT_UNPIN, t0, p.at.size());
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] != 0) note_block_error(block_error(*ops_, "unpin", p.keys[j], p.status[j]));
  }
  return good;
}

Result<size_t> KvStore::put_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                  std::span<const Chunk> chunks, std::span<const uint32_t> nchunks,
                                  std::span<int32_t> status) {
  const size_t n = keys.size();
  CXLKV_TRY(check_batch("put_chain", n, status.size(), chunks, &nchunks));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<KvReservation> rs(n);
  std::vector<int32_t> written(n);
  CXLKV_TRY(reserve_chain(parent, keys, bytes, rs, status));
  std::string first_error = block_error_;
  // The handles are this call's own: no check before the copy.  After it,
  // one fresh read per block: the publish's own under the stripe lock where
  // the index checks versions there (the lock-based path), else the write's
  // post-copy check, which is then also the publish check.
  const bool in_index = ops_->publish_checks_versions();
  CXLKV_TRY(write_blocks(rs, chunks, nchunks, written, true, !in_index));
  if (first_error.empty()) first_error = block_error_;
  auto ok = settle_blocks(parent, keys, rs, written, status, in_index ? PublishCheck::in_index : PublishCheck::done);
  if (!first_error.empty()) block_error_ = first_error;
  if (n) record(CXLKV_LAT_PUT, t0);  // the whole publish of this request
  return ok;
}

Result<size_t> KvStore::put_chains(std::span<const BlockKey> parents, std::span<const uint32_t> chain_lens,
                                   std::span<const BlockKey> keys, uint64_t bytes, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  const size_t n = keys.size();
  CXLKV_TRY(check_batch("put_chains", n, status.size(), chunks, &nchunks));
  if (parents.size() != chain_lens.size())
    return Error(-EINVAL, "kv: put_chains: " + std::to_string(chain_lens.size()) + " chains but " +
                              std::to_string(parents.size()) + " parents");
  uint64_t total = 0;
  for (uint32_t l : chain_lens) total += l;
  if (total != n)
    return Error(-EINVAL, "kv: put_chains: chain lengths add up to " + std::to_string(total) + " blocks, " +
                              std::to_string(n) + " keys given");
  // The stripe locks of every chain's blocks and parents once, up front:
  // each put_chain below then finds the node's grants kept (sticky) instead
  // of asking the lock manager for its chain's new stripes, one round trip
  // per chain (several milliseconds each while the host is busy).
  if (chain_lens.size() > 1) {
    std::vector<BlockKey> all(keys.begin(), keys.end());
    for (const BlockKey& p : parents)
      if (!p.is_zero()) all.push_back(p);
    ops_->lock_ahead(all);
  }
  // One chain after the other: a later chain may hang below a block an
  // earlier one publishes (requests of one step sharing a prefix), which
  // put_chain then finds READY (EXISTS) instead of BUSY.
  size_t ok = 0, at = 0, chunk_at = 0;
  std::string first_error;
  for (size_t j = 0; j < chain_lens.size(); j++) {
    const size_t m = chain_lens[j];
    size_t nc = 0;
    for (size_t i = at; i < at + m; i++) nc += nchunks[i];
    const BlockKey* parent = parents[j].is_zero() ? nullptr : &parents[j];
    auto r = put_chain(parent, keys.subspan(at, m), bytes, chunks.subspan(chunk_at, nc), nchunks.subspan(at, m),
                       status.subspan(at, m));
    if (!r) {
      // Refused as a whole (bad arguments): this chain did nothing; say so
      // per block and go on with the others.
      for (size_t i = at; i < at + m; i++) status[i] = r.error().code();
      if (first_error.empty()) first_error = r.error().message();
    } else {
      ok += r.value();
      if (first_error.empty()) first_error = block_error_;
    }
    at += m;
    chunk_at += nc;
  }
  block_error_ = first_error;
  return ok;
}

int32_t KvStore::reserved_extent(const KvReservation& r, std::byte** at) const {
  if (r.status != 0) return int32_t(r.status);
  if (r.loc_tier != CXLKV_TIER_MEM || r.loc_dev == CXLKV_LOC_DEV_INTERLEAVED) return -EXDEV;
  if (r.loc_dev >= deps_.devices.size()) return -ENODEV;
  const PoolDevice& d = deps_.devices[r.loc_dev];
  // docs/integrity.md "Checked metadata": only bytes of the device's kv carve are handed out.
  const uint64_t lo = d.payload_hi ? d.payload_lo : 0, hi = d.payload_hi ? d.payload_hi : d.size;
  if (r.loc_off < lo || r.loc_off > hi || r.length > hi - r.loc_off) return -EUCLEAN;
  if (d.region) d.region->prepare(r.loc_off, r.length);  // map_on_use: before anyone writes it
  *at = d.base + r.loc_off;
  return 0;
}

size_t KvStore::flush_in_place(std::span<const KvReservation> rs, std::span<int32_t> status) {
  std::vector<MemoryDomain*> fenced;
  size_t done = 0;
  for (size_t i = 0; i < rs.size() && i < status.size(); i++) {
    std::byte* at = nullptr;
    status[i] = reserved_extent(rs[i], &at);
    if (status[i]) continue;
    MemoryDomain* d = deps_.devices[rs[i].loc_dev].domain;
    // rule 3: the payload, written with ordinary stores, is written back
    // (the bulk flush, ordered by the fence below) before its entry is
    // published.
    d->flush_bulk(at, rs[i].length);
    if (std::find(fenced.begin(), fenced.end(), d) == fenced.end()) fenced.push_back(d);
    done++;
  }
  for (MemoryDomain* d : fenced) d->fence();  // rule 3: before publish_many stores the entries
  return done;
}

Result<size_t> KvStore::settle_chain(const BlockKey* parent, std::span<const BlockKey> keys,
                                     std::span<const KvReservation> rs, std::span<const int32_t> written,
                                     std::span<int32_t> status) {
  return settle_blocks(parent, keys, rs, written, status, PublishCheck::handles);
}

Result<size_t> KvStore::settle_blocks(const BlockKey* parent, std::span<const BlockKey> keys,
                                      std::span<const KvReservation> rs, std::span<const int32_t> written,
                                      std::span<int32_t> status, PublishCheck how) {
  const size_t n = keys.size();
  if (rs.size() < n || written.size() < n || status.size() < n)
    return Error(-EINVAL, "kv: settle_chain: " + std::to_string(n) + " keys with fewer handles or statuses");
  std::vector<int32_t> st(n);
  std::string first_error;
  auto keep_error = [&] {
    if (first_error.empty()) first_error = block_error_;
  };
  // From the first reserved block whose write failed on, nothing can be
  // published (its children would wait for it forever): those are aborted.
  size_t cut = n;
  for (size_t i = 0; i < n; i++) {
    if (rs[i].reserved() && written[i] != kKvReserved) {
      status[i] = written[i];
      cut = i;
      break;
    }
  }
  // Publish [0, cut) in one call, parents first.  Only the chain's first
  // block can find its parent unpublished (another node writing `parent`):
  // that parent is waited for (bounded) and the call repeated once.
  auto publish_from = [&](size_t from) -> Result<size_t> {
    std::span<const KvReservation> part(rs.data() + from, cut - from);
    CXLKV_TRY(publish_blocks(part, std::span<int32_t>(st.data() + from, cut - from), how));
    keep_error();
    for (size_t i = from; i < cut; i++)
      if (rs[i].reserved() && st[i] != kKvReserved) return i;
    return cut;
  };
  const std::string before_publish = first_error;
  auto failed = publish_from(0);
  if (!failed) return failed.error();
  if (failed.value() < cut && st[failed.value()] == -EAGAIN && failed.value() == 0 && parent &&
      wait_ready(*parent, kParentWait)) {
    first_error = before_publish;
    if (how == PublishCheck::done) how = PublishCheck::handles;  // after the wait: the handles are checked again
    failed = publish_from(0);
    if (!failed) return failed.error();
  }
  if (failed.value() < cut) {
    status[failed.value()] = st[failed.value()];
    cut = failed.value();
  }
  // Abort what was reserved from the cut on, children first.
  std::vector<KvReservation> undo;
  for (size_t j = cut; j < n; j++) {
    if (!rs[j].reserved()) continue;
    if (j > cut) status[j] = -ECANCELED;
    undo.push_back(rs[j]);
  }
  if (!undo.empty()) {
    std::vector<int32_t> ust(undo.size());
    CXLKV_TRY(abort_many(undo, ust));
    keep_error();
  }
  // Blocks after the cut that were not ours: another node's (BUSY) or
  // EXISTS blocks stay as reported; failed ones keep their error.
  size_t ok = 0;
  for (size_t j = 0; j < n; j++)
    if (status[j] == kKvReserved || status[j] == kKvExists) ok++;
  block_error_ = first_error;
  return ok;
}

Result<size_t> KvStore::get_many(std::span<const BlockKey> keys, std::span<const Chunk> chunks,
                                 std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  const size_t n = keys.size();
  CXLKV_TRY(check_batch("get_many", n, status.size(), chunks, &nchunks));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<KvPin> pins(n);
  std::vector<int32_t> st(n);
  std::string first_error;
  auto keep_error = [&] {
    if (first_error.empty()) first_error = block_error_;
  };
  // pinned[i] = 0: found without a pin (docs/coherence.md "Optimistic
  // reads"), checked after the copy like every block of the call.
  std::vector<uint8_t> pinned(n, 1);
  CXLKV_TRY(pin_blocks(keys, pins, status, false, pinned));
  keep_error();
  // The pins are this call's own: no check before the copy, one after it.
  CXLKV_TRY(fetch_blocks(pins, chunks, nchunks, status, true, pinned));
  keep_error();
  // Pins are dropped after the copies (never before: the block could be
  // evicted and reused under the copy).
  std::vector<KvPin> held;
  std::vector<size_t> held_at;
  held.reserve(n);
  held_at.reserve(n);
  for (size_t i = 0; i < n; i++)
    if (pinned[i] && pins[i].pinned()) {
      held.push_back(pins[i]);
      held_at.push_back(i);
    }
  std::vector<int32_t> hst(held.size());
  CXLKV_TRY(unpin_blocks(held, hst, false));
  keep_error();
  for (size_t j = 0; j < held.size(); j++) st[held_at[j]] = hst[j];
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    if (status[i] == 0 && pins[i].pinned() && st[i] != 0) status[i] = st[i];
    if (status[i] == 0) ok++;
  }
  block_error_ = first_error;
  if (n) record(CXLKV_LAT_GET, t0);  // the whole fetch of this request
  return ok;
}

// ---- single blocks: thin wrappers over the batch calls -------------------

Result<KvReservation> KvStore::reserve(const BlockKey& key, const BlockKey* parent, uint64_t bytes) {
  KvReservation r;
  int32_t st = 0;
  CXLKV_TRY(reserve_chain(parent, {&key, 1}, bytes, {&r, 1}, {&st, 1}));
  if (st < 0) return Error(st, block_error_);
  return r;
}

Result<void> KvStore::write(const KvReservation& r, std::span<const Chunk> chunks) {
  if (!r.reserved()) return Error(-EINVAL, "kv: block " + to_hex(r.key) + " is not reserved by this call");
  const uint32_t n = static_cast<uint32_t>(chunks.size());
  int32_t st = 0;
  CXLKV_TRY(write_blocks({&r, 1}, chunks, {&n, 1}, {&st, 1}, false));
  if (st != kKvReserved) return Error(st, block_error_);
  return {};
}

Result<void> KvStore::publish(const KvReservation& r) {
  if (!r.reserved()) return Error(-EINVAL, "kv: block " + to_hex(r.key) + " is not reserved by this call");
  int32_t st = 0;
  CXLKV_TRY(publish_blocks({&r, 1}, {&st, 1}, PublishCheck::handles));
  if (st != kKvReserved) return Error(st, block_error_);
  return {};
}

Result<void> KvStore::abort(const KvReservation& r) {
  if (!r.reserved()) return {};
  int32_t st = 0;
  CXLKV_TRY(abort_many({&r, 1}, {&st, 1}));
  if (st != kKvReserved) return Error(st, block_error_);
  return {};
}

Result<KvPin> KvStore::pin(const BlockKey& key) {
  KvPin p;
  int32_t st = 0;
  CXLKV_TRY(pin_many({&key, 1}, {&p, 1}, {&st, 1}));
  if (st == kKvMiss) return Error(-ENOENT, "kv: block " + to_hex(key) + " is not cached");
  if (st != 0) return Error(st, block_error_);
  return p;
}

Result<void> KvStore::fetch(const KvPin& p, std::span<const Chunk> chunks) {
  if (!p.pinned()) return Error(-EINVAL, "kv: fetch of block " + to_hex(p.key) + ": not pinned by this call");
  const uint32_t n = static_cast<uint32_t>(chunks.size());
  int32_t st = 0;
  CXLKV_TRY(fetch_blocks({&p, 1}, chunks, {&n, 1}, {&st, 1}, false));
  if (st == kKvMiss)  // an SSD block that failed its checks (docs/integrity.md "The SSD tier")
    return Error(-ENOENT, "kv: fetch of block " + to_hex(p.key) + ": its SSD copy fails its checks (a miss)");
  if (st != 0) return Error(st, block_error_);
  return {};
}

Result<void> KvStore::unpin(const KvPin& p) {
  if (!p.pinned()) return Error(-EINVAL, "kv: unpin of block " + to_hex(p.key) + ": not pinned by this call");
  int32_t st = 0;
  CXLKV_TRY(unpin_many({&p, 1}, {&st, 1}));
  if (st != 0) return Error(st, block_error_);
  return {};
}

}  // namespace cxlkv
