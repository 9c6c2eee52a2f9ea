// SPDX-License-Identifier: MIT
// KvStore batch calls: many blocks per call, a status per block
// (semantics in cxlkv/kv.hpp and cxlkv.h).
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {
namespace {

// How long put_chain waits for a parent that another node is writing.
constexpr auto kParentWait = std::chrono::milliseconds(5000);

int32_t as_status(uint32_t handle_status) { return static_cast<int32_t>(handle_status); }
uint32_t as_handle(int32_t status) { return static_cast<uint32_t>(status); }

// The index's batch calls report a code per block and keep the first
// failure's message; this is that message, or one made from the code.
Error block_error(const char* op, const BlockKey& k, int32_t code) {
  std::string m = PrefixIndex::last_block_message();
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
                                      std::span<KvReservation> out, std::span<int32_t> status) {
  const size_t n = keys.size();
  if (out.size() < n)
    return Error(-EINVAL, "kv: reserve_chain: " + std::to_string(n) + " keys but room for " +
                              std::to_string(out.size()) + " reservations");
  CXLKV_TRY(check_batch("reserve_chain", n, status.size(), {}, nullptr));
  std::vector<Reservation> ix(n);
  auto t0 = std::chrono::steady_clock::now();
  auto good = index_->reserve_chain(parent, keys, bytes, ix, status);
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
        note_block_error(block_error("reserve", keys[i], status[i]));
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

Result<size_t> KvStore::write_many(std::span<const KvReservation> rs, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("write_many", rs.size(), status.size(), chunks, &nchunks));
  ChunkCursor cur(chunks, nchunks);
  size_t ok = 0;
  for (size_t i = 0; i < rs.size(); i++) {
    auto c = cur.next();
    if (!rs[i].reserved()) {
      status[i] = as_status(rs[i].status);
      continue;
    }
    auto w = write(rs[i], c);
    status[i] = w ? kKvReserved : w.error().code();
    if (w) ok++;
    else note_block_error(w.error());
  }
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
  CXLKV_TRY(check_batch("publish_many", rs.size(), status.size(), {}, nullptr));
  // Fencing: a reservation whose entry changed (reclaimed while this
  // process was paused, forged, settled) is refused before the index call.
  Picked p = pick(rs, status, [&](const KvReservation& r, int32_t* refused) {
    if (!r.reserved()) return false;
    BlockLocation loc{r.loc_off, static_cast<uint32_t>(r.length), r.loc_dev, r.loc_tier};
    auto c = check_handle("publish", r.slot, r.key, CXLKV_ENTRY_WRITING, r.version, loc, true);
    if (c) return true;
    count(CXLKV_CTR_ERRORS);
    note_block_error(c.error());
    *refused = c.error().code();
    return false;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto good = index_->publish_many(p.slots, p.keys, p.status);
  record(CXLKV_LAT_PUBLISH, t0, p.at.size());
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] == 0) count(CXLKV_CTR_PUBLISHES);
    else {
      if (p.status[j] != -EAGAIN) count(CXLKV_CTR_ERRORS);
      note_block_error(block_error("publish", p.keys[j], p.status[j]));
    }
  }
  return good;
}

Result<size_t> KvStore::abort_many(std::span<const KvReservation> rs, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("abort_many", rs.size(), status.size(), {}, nullptr));
  Picked p = pick(rs, status, [](const KvReservation& r, int32_t*) { return r.reserved(); });
  auto good = index_->abort_many(p.slots, p.keys, p.status);  // children before their parents
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] == 0) count(CXLKV_CTR_ABORTS);
    else note_block_error(block_error("abort", p.keys[j], p.status[j]));
  }
  return good;
}

Result<size_t> KvStore::pin_many(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status) {
  const size_t n = keys.size();
  if (out.size() < n)
    return Error(-EINVAL, "kv: pin_many: " + std::to_string(n) + " keys but room for " + std::to_string(out.size()) +
                              " pins");
  CXLKV_TRY(check_batch("pin_many", n, status.size(), {}, nullptr));
  std::vector<PinnedBlock> ix(n);
  auto t0 = std::chrono::steady_clock::now();
  auto good = index_->pin_many(keys, ix, status);
  record(CXLKV_LAT_PIN, t0, n);
  if (!good) return good.error();
  for (size_t i = 0; i < n; i++) {
    KvPin& p = out[i];
    p = KvPin{};
    p.key = keys[i];
    p.status = as_handle(status[i]);
    if (status[i] != 0) {
      count(CXLKV_CTR_PIN_MISSES);
      if (status[i] != kKvMiss) note_block_error(block_error("pin", keys[i], status[i]));
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
  return good;
}

Result<size_t> KvStore::fetch_many(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("fetch_many", pins.size(), status.size(), chunks, &nchunks));
  ChunkCursor cur(chunks, nchunks);
  std::vector<std::span<const Chunk>> spans(pins.size());
  for (auto& c : spans) c = cur.next();
  // Issue 12 item 6: the SSD-tier blocks are read together, several in flight.
  std::vector<bool> done;
  size_t ok = fetch_ssd_batch(pins, spans, status, &done);
  for (size_t i = 0; i < pins.size(); i++) {
    if (done[i]) continue;
    auto c = spans[i];
    if (!pins[i].pinned()) {
      status[i] = as_status(pins[i].status);
      continue;
    }
    auto f = fetch(pins[i], c);
    status[i] = f ? 0 : f.error().code();
    if (f) ok++;
    else note_block_error(f.error());
  }
  return ok;
}

Result<size_t> KvStore::unpin_many(std::span<const KvPin> pins, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("unpin_many", pins.size(), status.size(), {}, nullptr));
  // A pin consumed by dropping its damaged SSD block (issue 12) unpins as 0.
  Picked p = pick(pins, status, [this](const KvPin& k, int32_t*) { return k.pinned() && !consume_dropped_pin(k); });
  auto t0 = std::chrono::steady_clock::now();
  auto good = index_->unpin_many(p.slots, p.keys, p.status);
  record(CXLKV_LAT_UNPIN, t0, p.at.size());
  if (!good) return good.error();
  for (size_t j = 0; j < p.at.size(); j++) {
    status[p.at[j]] = p.status[j];
    if (p.status[j] != 0) note_block_error(block_error("unpin", p.keys[j], p.status[j]));
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
  CXLKV_TRY(write_many(rs, chunks, nchunks, written));
  if (first_error.empty()) first_error = block_error_;
  auto ok = settle_chain(parent, keys, rs, written, status);
  if (!first_error.empty()) block_error_ = first_error;
  if (n) record(CXLKV_LAT_PUT, t0);  // the whole publish of this request
  return ok;
}

Result<size_t> KvStore::settle_chain(const BlockKey* parent, std::span<const BlockKey> keys,
                                     std::span<const KvReservation> rs, std::span<const int32_t> written,
                                     std::span<int32_t> status) {
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
    CXLKV_TRY(publish_many(part, std::span<int32_t>(st.data() + from, cut - from)));
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
  CXLKV_TRY(pin_many(keys, pins, status));
  keep_error();
  CXLKV_TRY(fetch_many(pins, chunks, nchunks, status));
  keep_error();
  // Pins are dropped after the copies (never before: the block could be
  // evicted and reused under the copy).
  CXLKV_TRY(unpin_many(pins, st));
  keep_error();
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    if (status[i] == 0 && pins[i].pinned() && st[i] != 0) status[i] = st[i];
    if (status[i] == 0) ok++;
  }
  block_error_ = first_error;
  if (n) record(CXLKV_LAT_GET, t0);  // the whole fetch of this request
  return ok;
}

}  // namespace cxlkv
