// SPDX-License-Identifier: MIT
// KvStore batch calls: many blocks per call, a status per block
// (semantics in cxlkv/kv.hpp and cxlkv.h).
#include <cerrno>
#include <chrono>
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
  size_t ok = 0;
  bool stopped = false;
  for (size_t i = 0; i < n; i++) {
    if (stopped) {
      out[i] = KvReservation{};
      out[i].key = keys[i];
      out[i].status = as_handle(-ECANCELED);
      status[i] = -ECANCELED;
      continue;
    }
    auto r = reserve(keys[i], i ? &keys[i - 1] : parent, bytes);
    if (!r) {
      note_block_error(r.error());
      out[i] = KvReservation{};
      out[i].key = keys[i];
      out[i].status = as_handle(r.error().code());
      status[i] = r.error().code();
      stopped = true;
      continue;
    }
    out[i] = r.value();
    status[i] = as_status(r->status);
    if (status[i] == kKvReserved || status[i] == kKvExists) ok++;
  }
  return ok;
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

Result<size_t> KvStore::publish_many(std::span<const KvReservation> rs, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("publish_many", rs.size(), status.size(), {}, nullptr));
  size_t ok = 0;
  for (size_t i = 0; i < rs.size(); i++) {
    if (!rs[i].reserved()) {
      status[i] = as_status(rs[i].status);
      continue;
    }
    auto p = publish(rs[i]);
    status[i] = p ? kKvReserved : p.error().code();
    if (p) ok++;
    else note_block_error(p.error());
  }
  return ok;
}

Result<size_t> KvStore::abort_many(std::span<const KvReservation> rs, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("abort_many", rs.size(), status.size(), {}, nullptr));
  size_t ok = 0;
  for (size_t i = rs.size(); i-- > 0;) {  // children before their parents
    if (!rs[i].reserved()) {
      status[i] = as_status(rs[i].status);
      continue;
    }
    auto a = abort(rs[i]);
    status[i] = a ? kKvReserved : a.error().code();
    if (a) ok++;
    else note_block_error(a.error());
  }
  return ok;
}

Result<size_t> KvStore::pin_many(std::span<const BlockKey> keys, std::span<KvPin> out, std::span<int32_t> status) {
  const size_t n = keys.size();
  if (out.size() < n)
    return Error(-EINVAL, "kv: pin_many: " + std::to_string(n) + " keys but room for " + std::to_string(out.size()) +
                              " pins");
  CXLKV_TRY(check_batch("pin_many", n, status.size(), {}, nullptr));
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    auto p = pin(keys[i]);
    if (p) {
      out[i] = p.value();
      status[i] = 0;
      ok++;
      continue;
    }
    out[i] = KvPin{};
    out[i].key = keys[i];
    status[i] = p.error().code() == -ENOENT ? kKvMiss : p.error().code();
    out[i].status = as_handle(status[i]);
    if (status[i] != kKvMiss) note_block_error(p.error());
  }
  return ok;
}

Result<size_t> KvStore::fetch_many(std::span<const KvPin> pins, std::span<const Chunk> chunks,
                                   std::span<const uint32_t> nchunks, std::span<int32_t> status) {
  CXLKV_TRY(check_batch("fetch_many", pins.size(), status.size(), chunks, &nchunks));
  ChunkCursor cur(chunks, nchunks);
  size_t ok = 0;
  for (size_t i = 0; i < pins.size(); i++) {
    auto c = cur.next();
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
  size_t ok = 0;
  for (size_t i = 0; i < pins.size(); i++) {
    if (!pins[i].pinned()) {
      status[i] = as_status(pins[i].status);
      continue;
    }
    auto u = unpin(pins[i]);
    status[i] = u ? 0 : u.error().code();
    if (u) ok++;
    else note_block_error(u.error());
  }
  return ok;
}

Result<size_t> KvStore::put_chain(const BlockKey* parent, std::span<const BlockKey> keys, uint64_t bytes,
                                  std::span<const Chunk> chunks, std::span<const uint32_t> nchunks,
                                  std::span<int32_t> status) {
  const size_t n = keys.size();
  CXLKV_TRY(check_batch("put_chain", n, status.size(), chunks, &nchunks));
  std::vector<KvReservation> rs(n);
  std::vector<int32_t> st(n);
  std::string first_error;
  auto keep_error = [&] {
    if (first_error.empty()) first_error = block_error_;
  };
  CXLKV_TRY(reserve_chain(parent, keys, bytes, rs, status));
  keep_error();
  CXLKV_TRY(write_many(rs, chunks, nchunks, st));
  keep_error();

  // From the first reserved block whose write failed on, nothing can be
  // published (its children would wait for it forever): those are aborted.
  size_t cut = n;
  for (size_t i = 0; i < n; i++) {
    if (rs[i].reserved() && st[i] != kKvReserved) {
      status[i] = st[i];
      cut = i;
      break;
    }
  }
  // Publish the rest, parents first; a parent another node is writing is
  // waited for (once per block, bounded), then the block is tried again.
  size_t i = 0;
  for (; i < cut; i++) {
    if (!rs[i].reserved()) continue;
    auto p = publish(rs[i]);
    if (!p && p.error().code() == -EAGAIN) {
      const BlockKey* pk = i ? &keys[i - 1] : parent;
      if (pk && wait_ready(*pk, kParentWait)) p = publish(rs[i]);
    }
    if (!p) {
      note_block_error(p.error());
      keep_error();
      status[i] = p.error().code();
      cut = i;
      break;
    }
  }
  // Abort what was reserved from the cut on, children first.
  for (size_t j = n; j-- > cut;) {
    if (!rs[j].reserved()) continue;
    if (j > cut) status[j] = -ECANCELED;
    if (auto a = abort(rs[j]); !a) {
      note_block_error(a.error());
      keep_error();
    }
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
  return ok;
}

}  // namespace cxlkv
