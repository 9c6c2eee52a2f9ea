// SPDX-License-Identifier: MIT
// Index service mode: wire format and the two sides (see index_service.hpp).
//
// Requests (little-endian, packed by memcpy):
//   RESERVE_CHAIN  u32 n, u32 flags (1 has_parent, 2 through_busy), u64 bytes, BlockKey parent, BlockKey keys[n]
//   PUBLISH / ABORT / UNPIN   u32 n, u32 0, u32 slots[n], BlockKey keys[n]
//   PIN            u32 n, u32 0, BlockKey keys[n]
// Replies: u64 result (the call's return value), u32 server node, u32 server
// incarnation (the owner of reservations made through it), i32 status[n], then for
// RESERVE_CHAIN WireBlock[n] (with the reservation status), for PIN WireBlock[n].
// The handler's status is 0, or the whole call's negative errno.
#include "kv/index_service.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxlkv/sync.hpp"
#include "kv/store_index.hpp"
#include "util/log.hpp"

namespace cxlkv {
namespace {

enum : uint32_t { kOpReserve = 1, kOpPublish = 2, kOpAbort = 3, kOpPin = 4, kOpUnpin = 5 };

struct WireBlock {
  uint64_t offset;
  uint32_t length;
  uint32_t slot;
  uint32_t version;
  uint8_t device, tier, rstatus, pad;
};
static_assert(sizeof(WireBlock) == 24);

constexpr size_t kHdr = 8;     // u32 n, u32 flags
constexpr size_t kRepHdr = 16;  // u64 result, u32 owner node, u32 owner incarnation
constexpr uint32_t kHasParent = 1, kThroughBusy = 2;
constexpr size_t kMaxReq = kHdr + 8 + 16 + size_t(kIndexServiceMaxBatch) * 20;  // the largest of reserve (24 + 16 n) and slots (20 n)
constexpr size_t kMaxRep = kRepHdr + size_t(kIndexServiceMaxBatch) * (4 + sizeof(WireBlock));

uint32_t lines_for(size_t bytes) { return cxlkv_rpc_msg_lines(static_cast<uint32_t>(bytes)); }

WireBlock to_wire(uint32_t slot, const BlockLocation& l, uint32_t version, uint8_t rstatus) {
  return WireBlock{l.offset, l.length, slot, version, l.device, l.tier, rstatus, 0};
}
BlockLocation loc_of(const WireBlock& w) { return BlockLocation{w.offset, w.length, w.device, w.tier}; }

template <class T>
const T* at(std::span<const std::byte> d, size_t off, size_t count) {
  if (off + count * sizeof(T) > d.size()) return nullptr;
  return reinterpret_cast<const T*>(d.data() + off);
}

// Copy helpers that tolerate unaligned wire buffers.
template <class T>
std::vector<T> read_array(std::span<const std::byte> d, size_t off, size_t n) {
  std::vector<T> v(n);
  if (n) std::memcpy(v.data(), d.data() + off, n * sizeof(T));
  return v;
}

}  // namespace

// What each client holds through the service, by the ring (claim) it came
// through.  Reservations and pins taken here belong to the serving node, so
// a client that detaches or dies would leave them for good (pins keep blocks
// unevictable, reservations hold space); they are undone when its claim of
// the ring closes (RpcServerOptions::on_ring_closed).  Handlers and the
// close run on the server's polling thread only; the counters are read by
// other threads.
struct IndexService::Held {
  struct Res {
    uint32_t ring = 0;
    BlockKey key;
    uint32_t version = 0;
    uint64_t order = 0;  // reservation order: a chain parent-first
  };
  struct Pin {
    BlockKey key;
    uint32_t count = 0;
  };
  std::unordered_map<uint32_t, Res> res;    // slot -> the claim that reserved it (one at a time)
  std::unordered_map<uint64_t, Pin> pins;   // (ring << 32 | slot) -> this claim's pins of the slot
  uint64_t next_order = 0;
  std::atomic<uint64_t> closed{0}, aborted{0}, dropped{0};

  static uint64_t pin_id(uint32_t ring, uint32_t slot) { return uint64_t(ring) << 32 | slot; }

  void reserved(uint32_t ring, uint32_t slot, const BlockKey& k, uint32_t version) {
    res[slot] = Res{ring, k, version, next_order++};
  }
  // May `ring` publish / abort the reservation (slot, key)?  Not when another
  // open claim made it (a client cannot settle another's reservation; one
  // made through an earlier server of this node is no claim's: the index's
  // owner check decides).
  bool may_settle(uint32_t ring, uint32_t slot, const BlockKey& k) const {
    auto it = res.find(slot);
    return it == res.end() || it->second.ring == ring || !(it->second.key == k);
  }
  void settled(uint32_t ring, uint32_t slot) {
    auto it = res.find(slot);
    if (it != res.end() && it->second.ring == ring) res.erase(it);
  }
  void pinned(uint32_t ring, uint32_t slot, const BlockKey& k) {
    Pin& p = pins[pin_id(ring, slot)];
    p.key = k;
    p.count++;
  }
  // Does this claim hold a pin of (slot, key)?  Only those are unpinned:
  // another client's pin of the same block (the node's pin count is shared)
  // is never dropped by this one.
  bool holds_pin(uint32_t ring, uint32_t slot, const BlockKey& k) const {
    auto it = pins.find(pin_id(ring, slot));
    return it != pins.end() && it->second.count > 0 && it->second.key == k;
  }
  void unpinned(uint32_t ring, uint32_t slot) {
    auto it = pins.find(pin_id(ring, slot));
    if (it != pins.end() && --it->second.count == 0) pins.erase(it);
  }

  // The claim of `ring` ended: abort what it still reserved (leaf first:
  // abort_many walks its list from the end, and the list is in reservation
  // order), and drop its pins -- only its own count, so a block another
  // client still pins stays pinned.  A server that stops leaves the index
  // as it is and only forgets its records: its process may be shutting down
  // with the lock manager already gone (cxlkvd), and the holds are its
  // node's, reclaimed by the node's detach or death (a new server of the same
  // node still takes the publish / abort of such a reservation).
  void close(PrefixIndex& ix, uint32_t ring, RpcRingClose why) {
    if (why == RpcRingClose::server_stopped) {
      for (auto it = res.begin(); it != res.end();) it = it->second.ring == ring ? res.erase(it) : std::next(it);
      for (auto it = pins.begin(); it != pins.end();) it = uint32_t(it->first >> 32) == ring ? pins.erase(it) : std::next(it);
      closed++;
      return;
    }
    std::vector<std::pair<uint32_t, Res>> mine;  // (slot, reservation)
    for (auto it = res.begin(); it != res.end();) {
      if (it->second.ring != ring) {
        ++it;
        continue;
      }
      mine.emplace_back(it->first, it->second);
      it = res.erase(it);
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    std::vector<uint32_t> slots;
    std::vector<BlockKey> keys;
    for (const auto& [slot, r] : mine)
      if (ix.still_valid(slot, r.key, CXLKV_ENTRY_WRITING, r.version)) {  // still that reservation (rule 4)
        slots.push_back(slot);
        keys.push_back(r.key);
      }
    uint64_t n_aborted = 0, n_unpinned = 0;
    // A parent refused while a child of it is still reserved (-EBUSY) goes
    // again in the next pass; a pass that aborts nothing ends it.
    while (!slots.empty()) {
      std::vector<int32_t> st(slots.size());
      auto r = ix.abort_many(slots, keys, st);
      if (!r) {
        log().warn("index service: ring {} closed: abort of {} reservation(s): {}", ring, slots.size(),
                   r.error().message());
        break;
      }
      n_aborted += r.value();
      size_t w = 0;
      for (size_t i = 0; i < slots.size(); i++)
        if (st[i] == -EBUSY) {
          slots[w] = slots[i];
          keys[w++] = keys[i];
        }
      if (r.value() == 0 || w == 0) break;
      slots.resize(w);
      keys.resize(w);
    }
    slots.clear();
    keys.clear();
    for (auto it = pins.begin(); it != pins.end();) {
      if (uint32_t(it->first >> 32) != ring) {
        ++it;
        continue;
      }
      for (uint32_t c = 0; c < it->second.count; c++) {
        slots.push_back(uint32_t(it->first));
        keys.push_back(it->second.key);
      }
      it = pins.erase(it);
    }
    if (!slots.empty()) {
      std::vector<int32_t> st(slots.size());
      auto r = ix.unpin_many(slots, keys, st);
      if (r) n_unpinned = r.value();
      else log().warn("index service: ring {} closed: unpin of {} pin(s): {}", ring, slots.size(), r.error().message());
    }
    aborted += n_aborted;
    dropped += n_unpinned;
    closed++;  // last: a reader that sees the claim closed sees what its close undid (released())
    if (n_aborted || n_unpinned)
      log().info("index service: ring {}'s claim ended ({}): {} reservation(s) aborted, {} pin(s) dropped", ring,
                 why == RpcRingClose::detached ? "detached" : why == RpcRingClose::dead ? "client dead" : "claimed anew",
                 n_aborted, n_unpinned);
  }
};

RpcGeometry index_service_geometry() {
  RpcGeometry g;
  g.rings = 16;
  g.depth = 8;
  g.req_lines = lines_for(kMaxReq);
  g.resp_lines = lines_for(kMaxRep);
  return g;
}

Result<std::unique_ptr<IndexService>> IndexService::create(NodeContext& node, PrefixIndex& index,
                                                           const RpcServerOptions& base) {
  RpcServerOptions o = base;
  o.carve = kIndexServiceCarve;
  o.geometry = index_service_geometry();
  o.max_batch = 8;  // requests are batches already
  // What each client holds through the service is undone when its claim of
  // the ring ends (see Held).
  auto held = std::make_shared<Held>();
  PrefixIndex* ix = &index;
  o.on_ring_closed = [held, ix](uint32_t ring, RpcRingClose why) { held->close(*ix, ring, why); };
  auto s = RpcServer::create(node, o);
  if (!s) return s.error();
  auto svc = std::unique_ptr<IndexService>(new IndexService);
  svc->held_ = held;
  svc->server_ = std::move(s.value());
  // Reservations made here are owned by this node's incarnation (the
  // clients' handle checks compare against it).
  const uint32_t me = node.node();
  const uint32_t inc = static_cast<uint32_t>(node.domain().read_fresh(node.control().node_entry(me)).incarnation);  // rule 4

  auto parse_n = [](std::span<const std::byte> d, uint32_t* n) -> bool {
    if (d.size() < kHdr) return false;
    std::memcpy(n, d.data(), 4);
    return *n <= kIndexServiceMaxBatch;
  };
  auto put_result = [me, inc](std::span<std::byte> rep, uint64_t ret, const std::vector<int32_t>& st) -> uint32_t {
    std::memcpy(rep.data(), &ret, 8);
    std::memcpy(rep.data() + 8, &me, 4);
    std::memcpy(rep.data() + 12, &inc, 4);
    if (!st.empty()) std::memcpy(rep.data() + kRepHdr, st.data(), st.size() * 4);
    return uint32_t(kRepHdr + st.size() * 4);
  };

  svc->server_->handle(kOpReserve, [=](const RpcRequest& rq, std::span<std::byte> rep, uint32_t& len) -> int32_t {
    uint32_t n = 0, flags = 0;
    if (!parse_n(rq.data, &n) || rq.data.size() != kHdr + 8 + 16 + size_t(n) * 16) return -EINVAL;
    std::memcpy(&flags, rq.data.data() + 4, 4);
    uint64_t bytes;
    std::memcpy(&bytes, rq.data.data() + kHdr, 8);
    BlockKey parent;
    std::memcpy(&parent, rq.data.data() + kHdr + 8, 16);
    auto keys = read_array<BlockKey>(rq.data, kHdr + 24, n);
    std::vector<Reservation> out(n);
    std::vector<int32_t> st(n);
    auto r = ix->reserve_chain((flags & kHasParent) ? &parent : nullptr, keys, bytes, out, st, (flags & kThroughBusy) != 0);
    if (!r) return r.error().code();
    for (uint32_t i = 0; i < n; i++)
      if (st[i] == kBlockReserved && out[i].status == ReserveStatus::reserved)
        held->reserved(rq.ring, out[i].slot, keys[i], out[i].version);
    len = put_result(rep, r.value(), st);
    for (uint32_t i = 0; i < n; i++) {
      WireBlock w = to_wire(out[i].slot, out[i].loc, out[i].version, uint8_t(out[i].status));
      std::memcpy(rep.data() + len, &w, sizeof w);
      len += sizeof w;
    }
    return 0;
  });
  auto slots_handler = [ix, held, put_result, parse_n](uint32_t op) {
    return [=](const RpcRequest& rq, std::span<std::byte> rep, uint32_t& len) -> int32_t {
      uint32_t n = 0;
      if (!parse_n(rq.data, &n) || rq.data.size() != kHdr + size_t(n) * 20) return -EINVAL;
      auto slots = read_array<uint32_t>(rq.data, kHdr, n);
      auto keys = read_array<BlockKey>(rq.data, kHdr + size_t(n) * 4, n);
      std::vector<int32_t> st(n);
      // A client settles only its own holds: an unpin of a pin this claim
      // does not hold (a double unpin, or one after its earlier claim ended
      // and its pins were dropped) would take another client's pin of the
      // node; a publish / abort of a reservation another open claim made is
      // not this client's to settle.
      std::vector<uint32_t> at, s2;
      std::vector<BlockKey> k2;
      at.reserve(n);
      for (uint32_t i = 0; i < n; i++) {
        const bool ok = op == kOpUnpin ? held->holds_pin(rq.ring, slots[i], keys[i])
                                       : held->may_settle(rq.ring, slots[i], keys[i]);
        if (!ok) {
          st[i] = op == kOpUnpin ? -EINVAL : -ESTALE;  // as the index says for a block not pinned / reserved by us
          continue;
        }
        at.push_back(i);
        s2.push_back(slots[i]);
        k2.push_back(keys[i]);
      }
      std::vector<int32_t> st2(at.size());
      Result<size_t> r = op == kOpPublish ? ix->publish_many(s2, k2, st2)
                         : op == kOpAbort ? ix->abort_many(s2, k2, st2)
                                          : ix->unpin_many(s2, k2, st2);
      if (!r) return r.error().code();
      for (size_t j = 0; j < at.size(); j++) {
        st[at[j]] = st2[j];
        if (st2[j] != 0) continue;
        if (op == kOpUnpin) held->unpinned(rq.ring, s2[j]);
        else held->settled(rq.ring, s2[j]);
      }
      len = put_result(rep, r.value(), st);
      return 0;
    };
  };
  svc->server_->handle(kOpPublish, slots_handler(kOpPublish));
  svc->server_->handle(kOpAbort, slots_handler(kOpAbort));
  svc->server_->handle(kOpUnpin, slots_handler(kOpUnpin));
  svc->server_->handle(kOpPin, [=](const RpcRequest& rq, std::span<std::byte> rep, uint32_t& len) -> int32_t {
    uint32_t n = 0;
    if (!parse_n(rq.data, &n) || rq.data.size() != kHdr + size_t(n) * 16) return -EINVAL;
    auto keys = read_array<BlockKey>(rq.data, kHdr, n);
    std::vector<PinnedBlock> out(n);
    std::vector<int32_t> st(n);
    auto r = ix->pin_many(keys, out, st);
    if (!r) return r.error().code();
    for (uint32_t i = 0; i < n; i++)
      if (st[i] == 0) held->pinned(rq.ring, out[i].slot, keys[i]);
    len = put_result(rep, r.value(), st);
    for (uint32_t i = 0; i < n; i++) {
      WireBlock w = to_wire(out[i].slot, out[i].loc, out[i].version, 0);
      std::memcpy(rep.data() + len, &w, sizeof w);
      len += sizeof w;
    }
    return 0;
  });
  return svc;
}

IndexService::~IndexService() { server_.reset(); }  // the open claims close while held_ is there

IndexService::Released IndexService::released() const {
  // closed first (braced initialisers are evaluated in order): the counts
  // read after it include every claim it counts.
  return Released{held_->closed.load(), held_->aborted.load(), held_->dropped.load()};
}

Result<std::unique_ptr<IndexServiceHost>> IndexServiceHost::start(Region& pool, uint32_t node) {
  auto h = std::unique_ptr<IndexServiceHost>(new IndexServiceHost);
  NodeOptions no;
  no.node = node;
  no.heartbeat = true;  // clients on other hosts judge the server by its heartbeat
  auto n = NodeContext::attach(pool, no);
  if (!n) return n.error();
  h->node_ = std::move(n.value());
  KvOpenOptions ko;
  ko.index_mode = KvIndexMode::locks;  // the service's own store takes the stripe locks
  auto kv = open_kv_session(pool, *h->node_, ko);
  if (!kv) return kv.error();
  h->session_ = std::move(kv.value());
  auto svc = IndexService::create(*h->node_, store_index(h->session_->store()));
  if (!svc) return svc.error();
  h->service_ = std::move(svc.value());
  h->service_->server().start();
  return h;
}

IndexServiceHost::~IndexServiceHost() {
  service_.reset();  // stops the polling thread, marks the server STOPPED
  session_.reset();
  node_.reset();
}

Result<std::unique_ptr<IndexServiceClient>> IndexServiceClient::connect(NodeContext& node,
                                                                      const RpcClientOptions& base,
                                                                      const std::string& pool) {
  RpcClientOptions o = base;
  o.carve = kIndexServiceCarve;
  auto c = RpcClient::connect(node, o);
  if (!c && pool.empty()) return c.error();
  if (!c)
    return Error(c.error().code(), "kv: pool " + pool + " is in index-service mode (carve " + kIndexServiceCarve +
                                       ") but its index service cannot be reached: " + c.error().message() +
                                       " (start `cxlkvd --index-service` on the pool, or open with "
                                       "CXLKV_INDEX_MODE=locks)");
  auto cl = std::unique_ptr<IndexServiceClient>(new IndexServiceClient);
  cl->rpc_ = std::move(c.value());
  cl->req_.resize(kMaxReq);
  cl->rep_.resize(kMaxRep);
  cl->pool_ = pool;
  return cl;
}

namespace {
Result<uint64_t> finish(const Result<RpcReply>& r, const std::vector<std::byte>& rep, size_t n, const char* what,
                        uint32_t* owner_node, uint32_t* owner_inc) {
  if (!r) return Error(r.error().code(), std::string("index service: ") + what + ": " + r.error().message());
  if (r->status < 0)
    return Error(r->status, std::string("index service: ") + what + " failed on the server: " + std::strerror(-r->status));
  if (r->len < kRepHdr + n * 4) return Error(-EPROTO, std::string("index service: ") + what + ": short reply");
  uint64_t ret;
  std::memcpy(&ret, rep.data(), 8);
  std::memcpy(owner_node, rep.data() + 8, 4);
  std::memcpy(owner_inc, rep.data() + 12, 4);
  return ret;
}
}  // namespace

Result<size_t> IndexServiceClient::reserve_rpc(const BlockKey* parent, std::span<const BlockKey> keys,
                                               uint64_t bytes, std::span<Reservation> out, std::span<int32_t> status,
                                               bool through_busy) {
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index service: reserve_chain: output spans shorter than the keys");
  size_t leading = 0;
  BlockKey prev;
  const BlockKey* par = parent;
  for (size_t base = 0; base < keys.size(); base += kIndexServiceMaxBatch) {
    const uint32_t n = uint32_t(std::min<size_t>(kIndexServiceMaxBatch, keys.size() - base));
    uint32_t flags = (par ? kHasParent : 0) | (through_busy ? kThroughBusy : 0);
    std::memcpy(req_.data(), &n, 4);
    std::memcpy(req_.data() + 4, &flags, 4);
    std::memcpy(req_.data() + kHdr, &bytes, 8);
    BlockKey p = par ? *par : BlockKey{};
    std::memcpy(req_.data() + kHdr + 8, &p, 16);
    std::memcpy(req_.data() + kHdr + 24, keys.data() + base, size_t(n) * 16);
    auto r = rpc_->call(kOpReserve, {req_.data(), kHdr + 24 + size_t(n) * 16}, rep_.data(), uint32_t(rep_.size()));
    auto ret = finish(r, rep_, n, "reserve_chain", &owner_node_, &owner_inc_);
    if (!ret) return ret.error();
    if (r->len < kRepHdr + size_t(n) * (4 + sizeof(WireBlock)))
      return Error(-EPROTO, "index service: reserve_chain: short reply");
    std::memcpy(status.data() + base, rep_.data() + kRepHdr, size_t(n) * 4);
    for (uint32_t i = 0; i < n; i++) {
      WireBlock w;
      std::memcpy(&w, rep_.data() + kRepHdr + size_t(n) * 4 + size_t(i) * sizeof w, sizeof w);
      out[base + i] = Reservation{ReserveStatus(w.rstatus), w.slot, loc_of(w), w.version};
    }
    leading += ret.value();
    if (ret.value() < n) {  // the chain stopped inside this piece
      for (size_t i = base + n; i < keys.size(); i++) status[i] = -ECANCELED;
      break;
    }
    prev = keys[base + n - 1];
    par = &prev;
  }
  return leading;
}

Result<size_t> IndexServiceClient::slots_op(uint32_t op, std::span<const uint32_t> slots,
                                            std::span<const BlockKey> keys, std::span<int32_t> status) {
  if (slots.size() != keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index service: slots, keys and status differ in length");
  size_t ok = 0;
  for (size_t base = 0; base < keys.size(); base += kIndexServiceMaxBatch) {
    const uint32_t n = uint32_t(std::min<size_t>(kIndexServiceMaxBatch, keys.size() - base));
    uint32_t zero = 0;
    std::memcpy(req_.data(), &n, 4);
    std::memcpy(req_.data() + 4, &zero, 4);
    std::memcpy(req_.data() + kHdr, slots.data() + base, size_t(n) * 4);
    std::memcpy(req_.data() + kHdr + size_t(n) * 4, keys.data() + base, size_t(n) * 16);
    auto r = rpc_->call(op, {req_.data(), kHdr + size_t(n) * 20}, rep_.data(), uint32_t(rep_.size()));
    auto ret = finish(r, rep_, n, op == kOpPublish ? "publish_many" : op == kOpAbort ? "abort_many" : "unpin_many",
                      &owner_node_, &owner_inc_);
    if (!ret) return ret.error();
    std::memcpy(status.data() + base, rep_.data() + kRepHdr, size_t(n) * 4);
    ok += ret.value();
  }
  return ok;
}

Result<size_t> IndexServiceClient::pin_rpc(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                           std::span<int32_t> status) {
  if (out.size() < keys.size() || status.size() < keys.size())
    return Error(-EINVAL, "index service: pin_many: output spans shorter than the keys");
  size_t ok = 0;
  for (size_t base = 0; base < keys.size(); base += kIndexServiceMaxBatch) {
    const uint32_t n = uint32_t(std::min<size_t>(kIndexServiceMaxBatch, keys.size() - base));
    uint32_t zero = 0;
    std::memcpy(req_.data(), &n, 4);
    std::memcpy(req_.data() + 4, &zero, 4);
    std::memcpy(req_.data() + kHdr, keys.data() + base, size_t(n) * 16);
    auto r = rpc_->call(kOpPin, {req_.data(), kHdr + size_t(n) * 16}, rep_.data(), uint32_t(rep_.size()));
    auto ret = finish(r, rep_, n, "pin_many", &owner_node_, &owner_inc_);
    if (!ret) return ret.error();
    if (r->len < kRepHdr + size_t(n) * (4 + sizeof(WireBlock)))
      return Error(-EPROTO, "index service: pin_many: short reply");
    std::memcpy(status.data() + base, rep_.data() + kRepHdr, size_t(n) * 4);
    for (uint32_t i = 0; i < n; i++) {
      WireBlock w;
      std::memcpy(&w, rep_.data() + kRepHdr + size_t(n) * 4 + size_t(i) * sizeof w, sizeof w);
      out[base + i] = PinnedBlock{w.slot, loc_of(w), w.version};
    }
    ok += ret.value();
  }
  return ok;
}

// ---- the batch calls (IndexBatchOps), errors naming the pool ------------------

Result<size_t> IndexServiceClient::named(Result<size_t> r) const {
  if (r || pool_.empty()) return r;
  return Error(r.error().code(), "kv: pool " + pool_ + ": " + r.error().message());
}

// The service replies with a code per block; its message stays in the
// server's log.  The codes of the pin's entry checks and the allocator's
// checks mean one cause each (PrefixIndex::pin_many, ChunkAllocator;
// docs/integrity.md "Block owners: overlapping entries"), so the message says it here.
std::string IndexServiceClient::block_message(const char* op, const BlockKey& key, int32_t code) const {
  std::string m = "kv: pool " + pool_ + ": " + op + " of block " + to_hex(key) + " refused by the pool's index service (" +
                  std::strerror(-code) + ")";
  const char* audit = "; the service's log names the fields, `cxlkvctl kv check` audits the index";
  if (code == -EIO)
    return m + ": its entry's location is not the block the allocator records there (another block's space: a "
               "damaged or forged entry or allocator record), never served" + audit;
  if (code == -EBADMSG)
    return m + ": its entry's location is not where a block of its length starts (a damaged or forged entry), never "
               "served" + audit;
  if (code == -EUCLEAN)
    return m + ": the pool's allocator metadata (chunk bitmap or chunk table) fails its checks, so no space is "
               "handed out" + audit;
  if (code == -ENOSPC)
    return m + ": the pool's capacity (the index config's max_blocks / max_bytes, or the allocator's space) is "
               "reached and nothing could be evicted";
  return m;
}

Result<size_t> IndexServiceClient::reserve_chain(const BlockKey* parent, std::span<const BlockKey> keys,
                                                 uint64_t bytes, std::span<Reservation> out,
                                                 std::span<int32_t> status, bool through_busy) {
  return named(reserve_rpc(parent, keys, bytes, out, status, through_busy));
}
Result<size_t> IndexServiceClient::publish_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                                std::span<int32_t> status) {
  return named(slots_op(kOpPublish, slots, keys, status));
}
Result<size_t> IndexServiceClient::abort_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                              std::span<int32_t> status) {
  return named(slots_op(kOpAbort, slots, keys, status));
}
Result<size_t> IndexServiceClient::pin_many(std::span<const BlockKey> keys, std::span<PinnedBlock> out,
                                            std::span<int32_t> status) {
  return named(pin_rpc(keys, out, status));
}
Result<size_t> IndexServiceClient::unpin_many(std::span<const uint32_t> slots, std::span<const BlockKey> keys,
                                              std::span<int32_t> status) {
  return named(slots_op(kOpUnpin, slots, keys, status));
}

}  // namespace cxlkv
