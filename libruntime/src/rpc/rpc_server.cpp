// SPDX-License-Identifier: MIT
// RpcServer: polls every attached ring of an RPC carve (protocol in
// cxlkv/format/rpc_format.h).  One round:
//   1. (every scan_every) client lines: new connections, detaches, deaths
//   2. the first two lines of each attached ring's next slot, and the
//      doorbells of the rings that were busy last round: invalidate all,
//      one fence, load (an idle ring costs one round of overlapped misses)
//   3. the further slots the doorbells announce: invalidate all, one
//      fence, load; a slot is taken only when its flag is the expected one
//   4. continuation lines not yet loaded or not trusted (one fence); a
//      request is taken only when every line carries its stamp
//   5. handlers
//   6. replies: whole lines (movdir64b), each with its flag, one fence; or
//      every byte but the flags (NT), one fence, the flags (NT), one fence
//      -- the flags and fences are shared by the whole batch; in run() the
//      last fence is the next round's first (step 2's).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "rpc/rpc_internal.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

struct RingState {
  bool active = false;
  uint32_t inc = 0;
  uint32_t next = 0;  // next expected sequence number
  cxlkv_rpc_client_line owner{};
  uint64_t last_live_ns = 0;
  rpc::HeartbeatWatch watch;  // remote client: heartbeat progress
  // The last round took requests from this ring: the next one reads its
  // doorbell too (how many more there are).  An idle ring is polled by its
  // next slot's lines alone: a lone request costs no doorbell miss, and its
  // load never waits for the doorbell store that follows the request's.
  bool hot = false;
};

struct Pending {
  uint32_t ring = 0, seq = 0, op = 0, len = 0;
  uint64_t flag = 0;
  int32_t status = 0;
  uint32_t reply_len = 0;
  uint32_t lines = 1;  // lines of the request
  uint32_t have = 1;   // lines [0, have) loaded and checked
  bool run = true;     // false: answered without running (stale epoch, bad length)
  bool skip = false;   // not complete yet (or after an incomplete one of its ring): a later round
};

}  // namespace

struct RpcServer::State {
  State(NodeContext& n, RpcCarve c, RpcServerOptions o)
      : node(n), d(n.domain()), carve(std::move(c)), opts(std::move(o)) {}
  NodeContext& node;
  MemoryDomain& d;
  RpcCarve carve;
  RpcServerOptions opts;
  uint32_t epoch = 0;
  uint64_t token = 0;
  std::vector<RpcHandler> small_handlers = std::vector<RpcHandler>(64);  // ops 0..63: no hashing per request
  std::unordered_map<uint32_t, RpcHandler> handlers;                     // the others
  std::vector<RingState> rings;
  std::vector<uint32_t> active;
  uint64_t last_scan_ns = 0;
  std::vector<Pending> batch;
  std::vector<std::byte> req_buf, reply_buf;  // max_batch slots each
  std::vector<std::pair<uint32_t, uint32_t>> want;  // (ring, count) this round
  mutable std::mutex stats_mu;
  RpcServerStats st;
  // Replies written whose last fence (rule 3) is left to this thread's next
  // fence: run() polls again at once, and that round's first fence (after
  // its invalidations) publishes them -- one mfence for rule 3 and rule 4.
  bool unfenced = false;

  MemoryDomain& dom() { return d; }
  void fence() {
    d.fence();  // every caller names its rule; it also publishes unfenced replies (rule 3)
    st.fences++;
    unfenced = false;
  }
  std::string what() const { return "pool " + node.region().uri() + ": rpc carve '" + carve.name() + "': "; }

  void write_server_line(uint32_t state) {
    cxlkv_rpc_server_line s{};
    s.state = state;
    s.epoch = epoch;
    s.pid = self_pid();
    s.host_id = this_host_id();
    s.start_time = self_start_time();
    s.node = node.node();
    s.token = token;
    // rule 1: the server line changes writer at every takeover: one whole
    // line, non-temporal; rule 3: fenced so clients see it now.
    d.publish_line(carve.server_line(), &s);
    d.fence();
  }

  void scan(uint64_t now) {
    last_scan_ns = now;
    const uint32_t n = carve.rings();
    // rule 4: client lines are written by the clients; invalidate, fence, load.
    for (uint32_t r = 0; r < n; r++) d.invalidate(carve.client_line(r), 64);
    fence();
    bool wrote = false;
    for (uint32_t r = 0; r < n; r++) {
      cxlkv_rpc_client_line cl = d.read(carve.client_line(r));
      RingState& rs = rings[r];
      bool wanted = cl.state == CXLKV_RPC_CLIENT_ATTACHED && cl.epoch == epoch && cl.inc != 0;
      if (wanted && (!rs.active || rs.inc != cl.inc || rs.owner.pid != cl.pid || rs.owner.token != cl.token)) {
        // A new claim while an older one was open (the old client detached
        // or died and another -- or its own new incarnation -- claimed the
        // ring before this scan saw it free): the old claim ends here, before
        // any request of the new one can run (its requests carry its inc and
        // start_seq, served only once registered below).
        if (rs.active) {
          st.reclaimed++;
          deactivate(r, RpcRingClose::reclaimed);
        }
        std::string why;
        rpc::HeartbeatWatch watch;  // a first look; a remote client's heartbeat progress is followed from now on
        if (!rpc::party_alive(node, cl.pid, cl.start_time, cl.host_id, cl.node, &why, &watch))
          continue;  // a dead client's claim: nothing to serve
        rs.watch = watch;
        rs.active = true;
        rs.inc = cl.inc;
        rs.next = cl.start_seq;
        rs.owner = cl;
        rs.last_live_ns = now;
        cxlkv_rpc_ack a{};
        a.inc = cl.inc;
        a.epoch = epoch;
        a.token = cl.token;
        // rule 1/2: the ack line is the server's; whole line, NT.
        d.publish_line(carve.ack(r), &a);
        wrote = true;
        st.connects++;
        log().debug("{}ring {} connected: pid {} node {} inc {}", what(), r, cl.pid, cl.node, cl.inc);
      } else if (!wanted && rs.active) {
        st.detaches++;
        deactivate(r, RpcRingClose::detached);
      } else if (rs.active && now - rs.last_live_ns >= uint64_t(opts.liveness_every.count()) * 1000000ull) {
        rs.last_live_ns = now;
        std::string why;
        if (!rpc::party_alive(node, rs.owner.pid, rs.owner.start_time, rs.owner.host_id, rs.owner.node, &why,
                              &rs.watch)) {
          st.dead_clients++;
          log().info("{}ring {}: client {} is dead ({}); ring freed", what(), r, rs.owner.pid, why);
          deactivate(r, RpcRingClose::dead);
        }
      }
    }
    if (wrote) fence();  // rule 3: acks out now
    active.clear();
    for (uint32_t r = 0; r < n; r++)
      if (rings[r].active) active.push_back(r);
  }

  // The claim of ring r ends: called between rounds only (scan, or the
  // destructor after the thread stopped), so every request of the claim that
  // was taken has been answered; on_ring_closed runs once per claim (the
  // ring is inactive afterwards until a new claim is registered).
  void deactivate(uint32_t r, RpcRingClose why) {
    if (!rings[r].active) return;
    rings[r] = RingState{};
    if (!opts.on_ring_closed) return;
    try {
      opts.on_ring_closed(r, why);
    } catch (const std::exception& e) {
      log().warn("{}ring {}: closing its claim threw: {}", what(), r, e.what());
    }
  }

  RpcHandler* handler(uint32_t op) {
    if (op < small_handlers.size()) return small_handlers[op] ? &small_handlers[op] : nullptr;
    auto it = handlers.find(op);
    return it == handlers.end() ? nullptr : &it->second;
  }

  // defer_fence: leave the replies' last fence to the next round (run()).
  size_t round(bool defer_fence = false) {
    const uint64_t now = monotonic_ns();
    if (now - last_scan_ns >= uint64_t(opts.scan_every.count()) * 1000000ull) scan(now);
    st.rounds++;
    if (active.empty()) {
      if (unfenced) fence();  // rule 3: the last round's replies out now (no poll fence follows)
      return 0;
    }
    const uint32_t depth = carve.depth(), mask = depth - 1;
    const bool break_inv = rpc::testing::break_request_invalidate();
    const bool check_stamps = !rpc::testing::break_stamp_check();
    // Lines of a request slot looked at before its flag is known: line 0
    // and the first continuation line (a 64 B payload is two lines), so a
    // lone request costs one round of overlapped misses.
    const uint32_t peek = std::min<uint32_t>(carve.header().req_lines, 2);
    constexpr uint64_t kNoEpoch = 0xffffffffffffull;  // flag bits but the epoch's

    // 2. every ring's next slot, and the doorbells of the rings that were
    // busy last round (RingState::hot).  rule 4: the client writes them:
    // invalidate all, one fence, load.  This host never writes these lines
    // (never dirty here), so the bulk invalidation is as strong as clflush
    // (MemoryDomain::invalidate_clean).
    for (uint32_t r : active) {
      if (rings[r].hot) d.invalidate_clean(carve.doorbell(r), 64);
      if (!break_inv) d.invalidate_clean(carve.req(r, rings[r].next & mask), 64ull * peek);
    }
    fence();  // rule 4: the invalidations before the loads (rule 3: and the last round's replies out)
    // The first continuation line of each next slot is touched now, so its
    // miss overlaps line 0's instead of following it once the flag is seen
    // (step 3 trusts it only from a whole-lines writer, by its stamp).
    if (peek > 1)
      for (uint32_t r : active)
        __builtin_prefetch(reinterpret_cast<const std::byte*>(carve.req(r, rings[r].next & mask)) + 64);
    want.clear();
    uint32_t budget = opts.max_batch;
    for (uint32_t r : active) {
      if (!budget) break;
      RingState& rs = rings[r];
      uint32_t cnt = 0;
      const bool hot = rs.hot;
      rs.hot = false;  // until a request of this round is taken from it
      const uint64_t tail = hot ? d.read(&carve.doorbell(r)->tail) : 0;  // 0: never a live inc
      if (hot && ((tail >> 32) & 0xffff) == rs.inc) {
        uint32_t ahead = static_cast<uint32_t>(tail) - rs.next;
        if (ahead < 0x80000000u) cnt = ahead + 1;  // else tail behind next: nothing new
      }
      // A request whose lines landed before the doorbell (or of a ring
      // polled without it) is served now; the ones after it, next round.
      uint64_t f = d.read(&carve.req(r, rs.next & mask)->flag);
      if (cnt == 0 && (f & kNoEpoch) == (cxlkv_rpc_flag(epoch, rs.inc, rs.next) & kNoEpoch)) cnt = 1;
      cnt = std::min({cnt, depth, budget});
      if (!cnt) continue;
      want.emplace_back(r, cnt);
      budget -= cnt;
    }
    if (want.empty()) return 0;

    // 3. the further slots the doorbells announce (rule 4: one sweep of
    // invalidations, one fence), then line 0 of every wanted slot in ring
    // order; a slot whose flag is not the expected one ends its ring's run
    // (not visible yet: retried on a later round).
    bool more = false;
    for (auto [r, cnt] : want)
      for (uint32_t k = 1; k < cnt; k++) {
        if (!break_inv) d.invalidate_clean(carve.req(r, (rings[r].next + k) & mask), 64ull * peek);
        more = true;
      }
    if (more) {
      fence();  // rule 4: the invalidations before the loads
      // The loads below miss; touch the lines first so the misses overlap.
      for (auto [r, cnt] : want)
        for (uint32_t k = 1; k < cnt; k++)
          for (uint32_t l = 0; l < peek; l++)
            __builtin_prefetch(reinterpret_cast<const std::byte*>(carve.req(r, (rings[r].next + k) & mask)) + 64 * l);
    }
    batch.clear();
    const uint32_t req_max = carve.req_max();
    bool long_ones = false;
    for (auto [r, cnt] : want) {
      RingState& rs = rings[r];
      for (uint32_t k = 0; k < cnt; k++) {
        const uint32_t seq = rs.next + k;
        const auto* slot = carve.req(r, seq & mask);
        cxlkv_rpc_req_hdr h;
        d.load(&h, slot, sizeof h);
        const uint64_t expect = cxlkv_rpc_flag(epoch, rs.inc, seq);
        Pending p;
        p.ring = r;
        p.seq = seq;
        p.flag = h.flag;
        p.op = h.op;
        p.len = h.len & CXLKV_RPC_LEN_MASK;
        if (h.flag != expect) {
          // Same incarnation and seq under another epoch: submitted to a
          // server that is gone; answer without running it.
          if ((h.flag & kNoEpoch) != (expect & kNoEpoch)) break;  // not visible yet
          p.run = false;
          p.status = -ECONNRESET;
          p.len = 0;
          st.stale_epoch++;
        } else if (p.len > req_max) {
          p.run = false;
          p.status = -EMSGSIZE;
          p.len = 0;
        }
        if (p.run) {
          std::byte* dst = req_buf.data() + batch.size() * req_max;
          std::memcpy(dst, h.data, std::min<uint32_t>(p.len, CXLKV_RPC_INLINE));
          p.lines = cxlkv_rpc_msg_lines(p.len);
          // The first continuation line was loaded with line 0, before the
          // flag was seen: it counts only from a whole-lines writer (its
          // stamp then proves the whole line); otherwise it is invalidated
          // again below, now that the flag was seen (rule 4).
          if (p.lines > 1 && peek > 1 && (h.len & CXLKV_RPC_LEN_WHOLE) &&
              rpc::load_cont(d, slot, p.flag, 1, 2, dst, p.len, check_stamps))
            p.have = 2;
          if (p.have < p.lines) long_ones = true;
        }
        batch.push_back(p);
      }
    }
    if (batch.empty()) return 0;

    // 4. the remaining continuation lines, now that the flags were seen
    // (rule 4: one sweep, one fence).  A request with a line that does not
    // carry its stamp yet waits, with the later requests of its ring, for a
    // later round.
    if (long_ones) {
      for (const Pending& p : batch)
        if (p.run && p.have < p.lines && !break_inv)
          d.invalidate_clean(reinterpret_cast<const std::byte*>(carve.req(p.ring, p.seq & mask)) + 64ull * p.have,
                             64ull * (p.lines - p.have));
      fence();  // rule 4: the invalidations before the loads
      for (const Pending& p : batch)
        if (p.run && p.have < p.lines)
          for (uint32_t l = p.have; l < p.lines; l++)
            __builtin_prefetch(reinterpret_cast<const std::byte*>(carve.req(p.ring, p.seq & mask)) + 64 * l);
      uint32_t cut = UINT32_MAX;  // the ring whose run ended at an incomplete request
      for (size_t i = 0; i < batch.size(); i++) {
        Pending& p = batch[i];
        if (p.ring == cut) {
          p.skip = true;
          continue;
        }
        if (p.run && p.have < p.lines &&
            !rpc::load_cont(d, carve.req(p.ring, p.seq & mask), p.flag, p.have, p.lines,
                            req_buf.data() + i * req_max, p.len, check_stamps)) {
          p.skip = true;
          cut = p.ring;
        }
      }
    }

    // 5. handlers.
    const uint32_t resp_max = carve.resp_max();
    for (size_t i = 0; i < batch.size(); i++) {
      Pending& p = batch[i];
      if (!p.run || p.skip) continue;
      RpcHandler* h = handler(p.op);
      if (!h) {
        p.status = -EOPNOTSUPP;
        st.unknown_ops++;
        continue;
      }
      std::span<std::byte> reply(reply_buf.data() + i * resp_max, resp_max);
      RpcRequest req{p.op, p.ring, p.seq, {req_buf.data() + i * req_max, p.len}};
      uint32_t rl = 0;
      try {
        p.status = (*h)(req, reply, rl);
      } catch (const std::exception& e) {
        log().warn("{}handler for op {} threw: {}", what(), p.op, e.what());
        p.status = -EIO;
        rl = 0;
      }
      p.reply_len = std::min(rl, resp_max);
    }

    // 6. replies (rule 2: response lines are the server's alone).  Whole
    // lines: every line carries the flag, one fence for the batch (rule 3);
    // otherwise every byte but the flag words, one fence, the flags, one
    // fence (rule 3, batched).
    const bool whole = d.publish_line_whole() && !rpc::testing::force_two_phase();
    const bool break_flush = rpc::testing::break_reply_flush();
    size_t answered = 0;
    for (size_t i = 0; i < batch.size(); i++) {
      const Pending& p = batch[i];
      if (p.skip) continue;
      rpc::put_message(d, carve.resp(p.ring, p.seq & mask), p.flag, static_cast<uint32_t>(p.status),
                       reply_buf.data() + i * resp_max, p.reply_len, whole, break_flush);
      answered++;
    }
    if (!answered) return 0;
    if (!whole) {
      fence();  // rule 3: the bytes before their flags
      for (const Pending& p : batch)
        if (!p.skip) d.write_nt<__u64>(&carve.resp(p.ring, p.seq & mask)->flag, p.flag);
    }
    // rule 3: the whole lines / the flags leave the write-combining buffers
    // now, or (defer_fence) at the next round's first fence.
    if (defer_fence)
      unfenced = true;
    else
      fence();
    for (const Pending& p : batch)
      if (!p.skip) {
        rings[p.ring].next = p.seq + 1;
        rings[p.ring].hot = true;
      }
    st.requests += answered;
    st.batches++;
    return answered;
  }
};

RpcServer::RpcServer(std::unique_ptr<State> st) : st_(std::move(st)) {}

Result<std::unique_ptr<RpcServer>> RpcServer::create(NodeContext& node, const RpcServerOptions& opts) {
  MemoryDomain& d = node.domain();
  auto c = RpcCarve::open_or_format(node.region(), d, opts.carve, opts.geometry);
  if (!c) return c.error();
  auto st = std::make_unique<State>(node, std::move(c.value()), opts);
  if (st->opts.max_batch == 0) st->opts.max_batch = 1;
  // rule 4: the server line may have been written by a server on another host.
  cxlkv_rpc_server_line old = d.read_fresh(st->carve.server_line());
  if (old.state == CXLKV_RPC_SERVER_RUNNING) {
    std::string why;
    if (rpc::party_alive(node, old.pid, old.start_time, old.host_id, old.node, &why))
      return Error(-EBUSY, st->what() + "a server is running (pid " + std::to_string(old.pid) + ", node " +
                               std::to_string(old.node) + ", epoch " + std::to_string(old.epoch) + ")");
    log().info("{}previous server (pid {}, epoch {}) is dead ({}); taking over", st->what(), old.pid, old.epoch, why);
  }
  st->epoch = old.epoch + 1;
  if ((st->epoch & 0xffff) == 0) st->epoch++;  // epoch 0 (low bits) is never used
  st->token = rpc::random_u64();
  st->rings.resize(st->carve.rings());
  st->req_buf.resize(size_t(st->opts.max_batch) * st->carve.req_max());
  st->reply_buf.resize(size_t(st->opts.max_batch) * st->carve.resp_max());
  st->st.epoch = st->epoch;
  st->write_server_line(CXLKV_RPC_SERVER_RUNNING);
  st->scan(monotonic_ns());
  return std::unique_ptr<RpcServer>(new RpcServer(std::move(st)));
}

RpcServer::~RpcServer() {
  stop();
  if (!st_) return;
  // The claims still open end with the server (its thread has stopped: no
  // request is being handled), then clients see it STOPPED.
  for (uint32_t r = 0; r < st_->rings.size(); r++) st_->deactivate(r, RpcRingClose::server_stopped);
  st_->write_server_line(CXLKV_RPC_SERVER_STOPPED);
}

void RpcServer::handle(uint32_t op, RpcHandler h) {
  if (op < st_->small_handlers.size())
    st_->small_handlers[op] = std::move(h);
  else
    st_->handlers[op] = std::move(h);
}

Result<size_t> RpcServer::poll_once() {
  std::lock_guard<std::mutex> g(st_->stats_mu);
  return st_->round();
}

Result<void> RpcServer::run(const std::atomic<bool>& stop) {
  uint32_t idle = 0;
  uint64_t sleep_us = 1;
  while (!stop.load(std::memory_order_relaxed)) {
    // The replies' last fence is the next round's first one: this loop polls
    // again at once after a round that answered, and a round that answers
    // nothing has fenced (State::round), before any yield or sleep below.
    Result<size_t> n = [&] {
      std::lock_guard<std::mutex> g(st_->stats_mu);
      return Result<size_t>(st_->round(true));
    }();
    if (!n) return n.error();
    if (n.value()) {
      idle = 0;
      sleep_us = 1;
      continue;
    }
    idle++;
    if (idle < st_->opts.spin_rounds) continue;
    if (idle < st_->opts.spin_rounds + st_->opts.yield_rounds) {
      sched_yield();
      continue;
    }
    usleep(static_cast<useconds_t>(sleep_us));
    {
      std::lock_guard<std::mutex> g(st_->stats_mu);
      st_->st.sleeps++;
    }
    sleep_us = std::min<uint64_t>(sleep_us * 2, st_->opts.max_sleep.count());
  }
  std::lock_guard<std::mutex> g(st_->stats_mu);
  if (st_->unfenced) st_->fence();  // rule 3: the last round's replies out before this thread stops
  return {};
}

void RpcServer::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    auto r = run(stop_);
    if (!r) log().error("{}server stopped: {}", st_->what(), r.error().message());
  });
}

void RpcServer::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

uint32_t RpcServer::epoch() const { return st_->epoch; }
const RpcCarve& RpcServer::carve() const { return st_->carve; }

RpcServerStats RpcServer::stats() const {
  std::lock_guard<std::mutex> g(st_->stats_mu);
  return st_->st;
}

}  // namespace cxlkv
