// SPDX-License-Identifier: MIT
// RpcClient: one ring of an RPC carve (protocol in cxlkv/format/rpc_format.h).
//   submit  whole request lines, each with its flag (movdir64b), and the
//           doorbell, one fence; without movdir64b: request bytes but the
//           flag (NT) for every call, one fence, the flags and the
//           doorbell (NT), one fence; call() leaves that last fence to
//           its first poll's fence
//   poll    the first two lines of the oldest outstanding reply, then of
//           the ones after it: invalidate them all, one fence, load in
//           order until one is not answered
//   every millisecond of polling: the server line (a new epoch or a STOPPED
//   server resets the outstanding requests), deadlines; every 20 ms the
//   server's liveness (process on this host, node heartbeat elsewhere).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "rpc/rpc_internal.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

struct Slot {
  bool busy = false;      // the ring slot holds a request the server may still answer
  bool reported = false;  // a completion (timeout) was already handed out
  uint32_t seq = 0;
  uint64_t flag = 0;
  uint64_t ticket = 0;
  uint64_t deadline_ns = 0;
  void* reply = nullptr;
  uint32_t reply_cap = 0;
  void* tag = nullptr;
};

constexpr uint64_t kServerCheckNs = 1000000;    // server line every 1 ms of polling
constexpr uint64_t kServerLivenessNs = 20000000;  // server process / heartbeat every 20 ms
// call(): busy polls for 1 ms, then yields between polls.  Not shorter: a
// client that yields within tens of microseconds on a loaded 2-core machine
// lets the scheduler put the server on its CPU, and from then on every call
// waits for the spin to end and the server's turn (measured: 47 us per call
// with 20 us, 1.0-1.1 us with 1 ms, same load, bench rpc).
constexpr uint64_t kSpinNs = 1000000;

}  // namespace

struct RpcClient::State {
  State(NodeContext& n, RpcCarve c, RpcClientOptions o)
      : node(n), d(n.domain()), carve(std::move(c)), opts(std::move(o)) {}
  NodeContext& node;
  MemoryDomain& d;
  RpcCarve carve;
  RpcClientOptions opts;
  uint32_t ring = 0;
  uint32_t inc = 0;
  uint64_t token = 0;  // this claim's token in the client line and the ack
  uint32_t epoch = 0;
  bool connected = false;
  cxlkv_rpc_server_line server{};
  rpc::HeartbeatWatch server_watch;  // remote server: heartbeat progress
  uint32_t next = 0;    // next sequence number
  uint32_t oldest = 0;  // oldest busy sequence number (== next: none)
  uint32_t busy = 0, unreported = 0;
  uint64_t tickets = 0;
  std::vector<Slot> slots;
  std::deque<RpcCompletion> ready;
  // Why reset_all failed a request, by ticket, until call() or poll() hands
  // its completion out: the cause goes into call()'s error.
  std::unordered_map<uint64_t, std::string> reset_why;
  cxlkv_rpc_resp_hdr hdrs[64];
  uint32_t need[64], have[64];  // per reply of a harvest: lines to take, lines taken
  uint64_t last_check_ns = 0, last_live_ns = 0;
  RpcClientStats st;

  std::string what() const {
    return "pool " + node.region().uri() + ": rpc carve '" + carve.name() + "' ring " + std::to_string(ring) + ": ";
  }
  void fence() {
    d.fence();
    st.fences++;
  }

  // The server line, fresh (rule 4); alive and RUNNING?
  bool server_ok(cxlkv_rpc_server_line* out, std::string* why) {
    cxlkv_rpc_server_line s = d.read_fresh(carve.server_line());
    if (out) *out = s;
    if (s.state != CXLKV_RPC_SERVER_RUNNING) {
      if (why) *why = server_state_text(s.state);
      return false;
    }
    server_watch = {};  // a first look: a remote server is judged by heartbeat progress from now on
    return rpc::party_alive(node, s.pid, s.start_time, s.host_id, s.node, why, &server_watch);
  }

  // Why a server line that is not RUNNING serves nobody; a state no server
  // writes is named as damage, not as a server that went away.
  std::string server_state_text(uint32_t state) const {
    if (state == CXLKV_RPC_SERVER_STOPPED) return "the server stopped";
    if (state == CXLKV_RPC_SERVER_NONE) return "no server has started";
    return "the carve's server line is damaged: state " + std::to_string(state) + " is not a server state";
  }

  // Why the ring's client line no longer carries this client's claim: a
  // claim by another client at the same moment (another live process in the
  // line), or damage (a state no client writes; this very process in the
  // line with another incarnation or token).
  std::string client_line_change() {
    cxlkv_rpc_client_line now = d.read_fresh(carve.client_line(ring));  // rule 4
    const std::string line = "ring " + std::to_string(ring) + "'s client line is damaged: ";
    if (now.state != CXLKV_RPC_CLIENT_FREE && now.state != CXLKV_RPC_CLIENT_ATTACHED &&
        now.state != CXLKV_RPC_CLIENT_DETACHED)
      return line + "state " + std::to_string(now.state) + " is not a client state";
    const bool self = now.pid == self_pid() && now.start_time == self_start_time();
    if (now.state == CXLKV_RPC_CLIENT_ATTACHED && !self)
      return "the ring was claimed by another client (pid " + std::to_string(now.pid) + ", node " +
             std::to_string(now.node) + ") at the same time";
    if (now.state != CXLKV_RPC_CLIENT_ATTACHED)
      return line + "state " + std::to_string(now.state) + " while this client (pid " + std::to_string(self_pid()) +
             ") holds the ring";
    if (now.inc != inc) return line + "inc " + std::to_string(now.inc) + ", this client's claim is " + std::to_string(inc);
    if (now.token != token) return line + "token changed under this client's claim";
    return line + "pid " + std::to_string(now.pid) + " changed under this client's claim";
  }

  // Does the ring's client line still carry this client's claim?  (rule 4:
  // another client may have written it.)
  bool line_is_ours() {
    cxlkv_rpc_client_line now = d.read_fresh(carve.client_line(ring));
    return now.state == CXLKV_RPC_CLIENT_ATTACHED && now.inc == inc && now.token == token &&
           now.pid == self_pid();
  }

  // Claim ring r for a new incarnation and wait for the server's ack.
  Result<void> claim(uint32_t r, bool explicit_ring) {
    cxlkv_rpc_client_line old = d.read_fresh(carve.client_line(r));  // rule 4
    // Our own earlier incarnation of this ring (a reconnect) is ours to replace.
    const bool ours = r == ring && inc != 0 && old.inc == inc && old.token == token && old.pid == self_pid() &&
                      old.start_time == self_start_time();
    if (old.state == CXLKV_RPC_CLIENT_ATTACHED && !ours) {
      std::string why;
      if (rpc::party_alive(node, old.pid, old.start_time, old.host_id, old.node, &why))
        return Error(explicit_ring ? -EBUSY : -EAGAIN,
                     "pool " + node.region().uri() + ": rpc carve '" + carve.name() + "' ring " + std::to_string(r) +
                         " is taken by process " + std::to_string(old.pid) + " (node " + std::to_string(old.node) + ")");
    }
    ring = r;
    inc = old.inc % 0xffffu + 1;  // differs from the previous incarnation's
    epoch = server.epoch;
    next = oldest = static_cast<uint32_t>(rpc::random_u64());
    busy = unreported = 0;
    for (Slot& s : slots) s = Slot{};
    cxlkv_rpc_client_line cl{};
    cl.state = CXLKV_RPC_CLIENT_ATTACHED;
    cl.pid = self_pid();
    cl.start_time = self_start_time();
    cl.host_id = this_host_id();
    cl.node = node.node();
    cl.inc = inc;
    cl.epoch = epoch;
    cl.start_seq = next;
    cl.token = token = rpc::random_u64();
    // rule 1: the client line changes writer when a ring is claimed: whole
    // line, non-temporal; rule 3: fenced.
    d.publish_line(carve.client_line(r), &cl);
    fence();
    // The server acknowledges on its next scan of the client lines.
    const uint64_t t0 = monotonic_ns(), limit = uint64_t(opts.connect_timeout.count()) * 1000000ull;
    for (uint32_t i = 0;; i++) {
      cxlkv_rpc_ack a = d.read_fresh(carve.ack(r));  // rule 4
      if (a.inc == inc && a.epoch == epoch && a.token == token) break;
      if (i % 16 == 15 && !line_is_ours())
        return Error(-EAGAIN, what() + "claimed by another client at the same time");
      if (monotonic_ns() - t0 > limit)
        return Error(-ETIMEDOUT, what() + "the server (epoch " + std::to_string(epoch) + ") did not acknowledge within " +
                                     std::to_string(opts.connect_timeout.count()) + " ms");
      if (i % 64 == 63) {
        std::string why;
        if (!server_ok(nullptr, &why)) return Error(-ECONNREFUSED, what() + "no live server: " + why);
      }
      if (i > 100) usleep(50);
    }
    // Two clients may claim a free ring at once: the later line wins.
    if (!line_is_ours()) return Error(-EAGAIN, what() + "claimed by another client at the same time");
    connected = true;
    last_check_ns = last_live_ns = monotonic_ns();
    return {};
  }

  Result<size_t> submit(std::span<const RpcCall> calls, uint64_t* tickets, bool fence_now);

  Result<void> reconnect() {
    std::string why;
    if (!server_ok(&server, &why)) return Error(-ECONNRESET, what() + "no live server: " + why);
    const uint32_t first = ring;
    Result<void> r = claim(first, true);
    // A client that let the library pick its ring takes any free one when its
    // own was claimed by another client meanwhile.
    for (uint32_t k = 1; !r && opts.ring < 0 && r.error().code() == -EBUSY && k < carve.rings(); k++) {
      r = claim((first + k) % carve.rings(), false);
      if (!r && r.error().code() == -EAGAIN) r = Error(-EBUSY, r.error().message());
    }
    if (!r) return Error(r.error().code() == -ECONNREFUSED ? -ECONNRESET : r.error().code(), r.error().message());
    st.reconnects++;
    return {};
  }

  void complete(Slot& s, int32_t status, uint32_t len) {
    ready.push_back(RpcCompletion{s.ticket, status, len, s.tag});
    s.reported = true;
    unreported--;
    st.completed++;
  }

  // Every outstanding request fails with -ECONNRESET; the ring reconnects
  // on the next submit.
  void reset_all(const std::string& why) {
    for (uint32_t q = oldest; q != next; q++) {
      Slot& s = slots[q & (carve.depth() - 1)];
      if (s.busy && !s.reported) {
        reset_why[s.ticket] = why;
        complete(s, -ECONNRESET, 0);
        st.resets++;
      }
      s = Slot{};
    }
    if (busy) log().info("{}{}: {} outstanding request(s) reset", what(), why, busy);
    busy = 0;
    oldest = next;
    connected = false;
  }

  // Collects the answered replies, oldest first.  clock: also look at the
  // clock for deadlines and the server line when due (call() skips that on
  // most turns of its spin: a clock read costs about a tenth of a poll).
  void harvest(bool clock = true) {
    const uint32_t mask = carve.depth() - 1;
    if (busy) {
      const uint32_t n = std::min<uint32_t>(busy, 64);
      const bool break_inv = rpc::testing::break_reply_invalidate();
      const bool check_stamps = !rpc::testing::break_stamp_check();
      // Lines of a reply looked at before its flag is known: line 0 and the
      // first continuation line (a 64 B payload is two lines).
      const uint32_t peek = std::min<uint32_t>(carve.header().resp_lines, 2);
      // rule 4: the oldest reply's first lines first (replies come in order:
      // while it is unanswered no later one is looked at, so an idle poll
      // costs one round of misses, not a sweep of the ring); once it is
      // answered, the ones after it, invalidated as a batch with one fence.
      // Response lines are only ever written by the server (never dirty
      // here): the bulk invalidation is as strong as clflush.
      if (!break_inv) d.invalidate_clean(carve.resp(ring, oldest & mask), 64ull * peek);
      // rule 4: the invalidations before the loads; rule 3: also the fence of
      // the requests call() just wrote (RpcClient::State::submit).
      fence();
      // The first continuation line now, so its miss overlaps line 0's
      // (taken below only from a whole-lines writer, by its stamp).
      if (peek > 1) __builtin_prefetch(reinterpret_cast<const std::byte*>(carve.resp(ring, oldest & mask)) + 64);
      d.load(&hdrs[0], carve.resp(ring, oldest & mask), sizeof hdrs[0]);
      if (hdrs[0].flag == slots[oldest & mask].flag && n > 1) {
        if (!break_inv)
          for (uint32_t k = 1; k < n; k++) d.invalidate_clean(carve.resp(ring, (oldest + k) & mask), 64ull * peek);
        fence();  // rule 4: the later replies' invalidations before their loads
        for (uint32_t k = 1; k < n; k++)
          for (uint32_t l = 0; l < peek; l++)
            __builtin_prefetch(reinterpret_cast<const std::byte*>(carve.resp(ring, (oldest + k) & mask)) + 64 * l);
      }
      // Line 0 of each in order until one is not answered.
      uint32_t ready_n = 0;
      bool long_ones = false;
      for (; ready_n < n; ready_n++) {
        Slot& s = slots[(oldest + ready_n) & mask];
        const auto* slot = carve.resp(ring, (oldest + ready_n) & mask);
        cxlkv_rpc_resp_hdr& h = hdrs[ready_n];
        if (ready_n) d.load(&h, slot, sizeof h);
        if (h.flag != s.flag) break;
        const uint32_t take = s.reported ? 0 : std::min(h.len & CXLKV_RPC_LEN_MASK, s.reply_cap);
        if (take) std::memcpy(s.reply, h.data, std::min<uint32_t>(take, CXLKV_RPC_INLINE));
        need[ready_n] = cxlkv_rpc_msg_lines(take);
        have[ready_n] = 1;
        // The first continuation line came with line 0, before the flag was
        // seen: it counts only from a whole-lines writer (its stamp proves
        // the line); otherwise it is invalidated again below (rule 4).
        if (need[ready_n] > 1 && peek > 1 && (h.len & CXLKV_RPC_LEN_WHOLE) &&
            rpc::load_cont(d, slot, s.flag, 1, 2, static_cast<std::byte*>(s.reply), take, check_stamps))
          have[ready_n] = 2;
        if (have[ready_n] < need[ready_n]) long_ones = true;
      }
      // The remaining continuation lines of the answered ones, now that
      // their flags were seen (rule 4: one sweep, one fence); a reply with
      // a line that does not carry its stamp yet waits for a later poll,
      // and so do the ones after it.
      if (long_ones) {
        for (uint32_t k = 0; k < ready_n; k++)
          if (have[k] < need[k] && !break_inv)
            d.invalidate_clean(reinterpret_cast<const std::byte*>(carve.resp(ring, (oldest + k) & mask)) + 64ull * have[k],
                               64ull * (need[k] - have[k]));
        fence();  // rule 4: the invalidations before the loads
        for (uint32_t k = 0; k < ready_n; k++) {
          Slot& s = slots[(oldest + k) & mask];
          if (have[k] < need[k] &&
              !rpc::load_cont(d, carve.resp(ring, (oldest + k) & mask), s.flag, have[k], need[k],
                              static_cast<std::byte*>(s.reply), std::min(hdrs[k].len & CXLKV_RPC_LEN_MASK, s.reply_cap),
                              check_stamps)) {
            ready_n = k;
            break;
          }
        }
      }
      for (uint32_t k = 0; k < ready_n; k++) {
        Slot& s = slots[oldest & mask];
        if (!s.reported) complete(s, hdrs[k].status, hdrs[k].len & CXLKV_RPC_LEN_MASK);
        s = Slot{};
        busy--;
        oldest++;
      }
    }
    if (!clock) return;
    const uint64_t now = monotonic_ns();
    if (now - last_check_ns < kServerCheckNs) return;
    last_check_ns = now;
    for (uint32_t q = oldest; q != next; q++) {
      Slot& s = slots[q & mask];
      if (s.busy && !s.reported && now > s.deadline_ns) {
        complete(s, -ETIMEDOUT, 0);
        st.timeouts++;
      }
    }
    if (!connected) return;
    cxlkv_rpc_server_line sv = d.read_fresh(carve.server_line());  // rule 4
    std::string why;
    bool ok = sv.state == CXLKV_RPC_SERVER_RUNNING && sv.epoch == epoch && sv.token == server.token;
    if (ok && !line_is_ours()) {
      // Another client claimed this ring at the same moment and its line
      // came last (the server now serves that claim), or the line is damaged.
      reset_all(client_line_change());
      return;
    }
    if (!ok) {
      why = sv.state != CXLKV_RPC_SERVER_RUNNING ? server_state_text(sv.state)
            : sv.epoch != epoch ? "the server was replaced (epoch " + std::to_string(epoch) + " -> " +
                                      std::to_string(sv.epoch) + ")"
                                : "the carve's server line is damaged: token changed without a new epoch";
    } else if (now - last_live_ns >= kServerLivenessNs) {
      last_live_ns = now;
      ok = rpc::party_alive(node, sv.pid, sv.start_time, sv.host_id, sv.node, &why, &server_watch);
      if (!ok) why = "the server died: " + why;
    }
    if (!ok) reset_all(why);
  }
};

RpcClient::RpcClient(std::unique_ptr<State> st) : st_(std::move(st)) {}

Result<std::unique_ptr<RpcClient>> RpcClient::connect(NodeContext& node, const RpcClientOptions& opts) {
  auto c = RpcCarve::open(node.region(), node.domain(), opts.carve);
  if (!c) {
    if (c.error().code() == -ENODATA || c.error().code() == -ENOENT)
      return Error(-ECONNREFUSED, c.error().message());
    return c.error();
  }
  auto st = std::make_unique<State>(node, std::move(c.value()), opts);
  st->slots.resize(st->carve.depth());
  std::string why;
  if (!st->server_ok(&st->server, &why))
    return Error(-ECONNREFUSED, "pool " + node.region().uri() + ": rpc carve '" + opts.carve + "': no live server: " + why);
  if (opts.ring >= 0) {
    if (uint32_t(opts.ring) >= st->carve.rings())
      return Error(-EINVAL, "pool " + node.region().uri() + ": rpc carve '" + opts.carve + "' has " +
                                std::to_string(st->carve.rings()) + " rings, not ring " + std::to_string(opts.ring));
    CXLKV_TRY(st->claim(uint32_t(opts.ring), true));
  } else {
    bool got = false;
    for (uint32_t r = 0; r < st->carve.rings() && !got; r++) {
      auto cr = st->claim(r, false);
      if (cr) got = true;
      else if (cr.error().code() != -EAGAIN) return cr.error();
    }
    if (!got)
      return Error(-ENOSPC, "pool " + node.region().uri() + ": rpc carve '" + opts.carve + "': all " +
                                std::to_string(st->carve.rings()) + " rings are taken by live clients");
  }
  return std::unique_ptr<RpcClient>(new RpcClient(std::move(st)));
}

RpcClient::~RpcClient() {
  if (!st_ || !st_->connected) return;
  cxlkv_rpc_client_line cl = st_->d.read_fresh(st_->carve.client_line(st_->ring));
  if (cl.pid != self_pid() || cl.inc != st_->inc || cl.token != st_->token) return;  // someone else's now
  cl.state = CXLKV_RPC_CLIENT_DETACHED;
  // rule 1: whole line, NT; rule 3: fenced.
  st_->d.publish_line(st_->carve.client_line(st_->ring), &cl);
  st_->d.fence();
}

Result<size_t> RpcClient::submit(std::span<const RpcCall> calls, uint64_t* tickets) {
  return st_->submit(calls, tickets, true);
}

// fence_now false (call()): the requests' last fence is left to the caller's
// very next fence -- the first poll's, which invalidates the reply lines and
// fences before it loads them -- so one mfence serves rule 3 (the request
// lines and the doorbell leave the write-combining buffers before anything
// after it) and rule 4 (the invalidations before the loads), instead of two
// back to back.
Result<size_t> RpcClient::State::submit(std::span<const RpcCall> calls, uint64_t* tickets, bool fence_now) {
  State& s = *this;
  if (calls.empty()) return size_t(0);
  if (!s.connected) CXLKV_TRY(s.reconnect());
  MemoryDomain& d = s.d;
  const uint32_t depth = s.carve.depth(), mask = depth - 1, req_max = s.carve.req_max();
  const uint64_t now = monotonic_ns();
  // Whole lines where publish_line lands in one piece (movdir64b): every
  // line carries its flag, one fence; else data, fence, flags, fence.
  const bool whole = d.publish_line_whole() && !rpc::testing::force_two_phase();
  size_t n = 0;
  for (const RpcCall& c : calls) {
    if (c.request.size() > req_max) {
      if (n == 0)
        return Error(-EMSGSIZE, s.what() + "request of " + std::to_string(c.request.size()) + " B, slots hold " +
                                    std::to_string(req_max) + " B");
      break;
    }
    Slot& sl = s.slots[s.next & mask];
    if (sl.busy) break;  // ring full (the oldest request is still out)
    auto* rq = s.carve.req(s.ring, s.next & mask);
    sl.busy = true;
    sl.reported = false;
    sl.seq = s.next;
    sl.flag = cxlkv_rpc_flag(s.epoch, s.inc, s.next);
    // rule 2: request lines are this client's alone; whole lines, NT.
    rpc::put_message(d, rq, sl.flag, c.op, c.request.data(), static_cast<uint32_t>(c.request.size()), whole);
    sl.ticket = ++s.tickets;
    sl.deadline_ns = now + uint64_t(s.opts.timeout.count()) * 1000000ull;
    sl.reply = c.reply;
    sl.reply_cap = c.reply ? c.reply_cap : 0;
    sl.tag = c.tag;
    if (tickets) tickets[n] = sl.ticket;
    s.next++;
    s.busy++;
    s.unreported++;
    n++;
  }
  if (n == 0) return Error(-EAGAIN, s.what() + "all " + std::to_string(depth) + " slots are in flight");
  if (!whole) {
    s.fence();  // rule 3: request bytes before their flags
    for (uint32_t q = s.next - static_cast<uint32_t>(n); q != s.next; q++)
      d.write_nt<__u64>(&s.carve.req(s.ring, q & mask)->flag, s.slots[q & mask].flag);
  }
  alignas(64) cxlkv_rpc_doorbell db{};
  db.tail = s.slots[(s.next - 1) & mask].flag;
  d.publish_line(s.carve.doorbell(s.ring), &db);  // rule 1/2: the client's line, whole, NT
  // rule 3: the lines (whole: each with its flag), flags and doorbell leave
  // the write-combining buffers now -- or at the caller's next fence (see above).
  if (fence_now) s.fence();
  s.st.submitted += n;
  return n;
}

Result<size_t> RpcClient::poll(std::span<RpcCompletion> out) {
  State& s = *st_;
  if (s.ready.size() < out.size()) s.harvest();
  size_t n = 0;
  while (n < out.size() && !s.ready.empty()) {
    out[n++] = s.ready.front();
    s.ready.pop_front();
    s.reset_why.erase(out[n - 1].ticket);
  }
  return n;
}

Result<RpcReply> RpcClient::call(uint32_t op, std::span<const std::byte> request, void* reply, uint32_t reply_cap,
                                 std::chrono::nanoseconds timeout) {
  State& s = *st_;
  auto saved = s.opts.timeout;
  if (timeout.count() > 0)
    s.opts.timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  RpcCall c{op, request, reply, reply_cap, nullptr};
  uint64_t ticket = 0;
  // The request's fence is the first harvest's below (it polls at once).
  auto sub = s.submit({&c, 1}, &ticket, false);
  s.opts.timeout = saved;
  if (!sub) return sub.error();
  const uint64_t t0 = monotonic_ns();
  bool yielding = false;
  for (uint32_t spins = 0;; spins++) {
    for (auto it = s.ready.begin(); it != s.ready.end(); ++it) {
      if (it->ticket != ticket) continue;
      RpcCompletion done = *it;
      s.ready.erase(it);
      if (done.status == -ETIMEDOUT)
        return Error(-ETIMEDOUT, s.what() + "no reply to op " + std::to_string(op) + " within the timeout");
      if (done.status == -ECONNRESET && done.len == 0) {
        auto why = s.reset_why.find(ticket);
        if (why != s.reset_why.end()) {
          const std::string text = why->second;
          s.reset_why.erase(why);
          return Error(-ECONNRESET, s.what() + "no reply to op " + std::to_string(op) + ": " + text);
        }
        // Answered by the server without running it: the request line's
        // flag named another server epoch (cxlkv/format/rpc_format.h).
        return Error(-ECONNRESET, s.what() + "the server answered op " + std::to_string(op) +
                                      " without running it: the request's flag names another server epoch (a "
                                      "request from before a server restart, or a damaged request line)");
      }
      return RpcReply{done.status, done.len};
    }
    // The clock every 16th turn: deadlines, the server line, and when to
    // stop spinning -- a reply normally comes within microseconds; after
    // kSpinNs the loop yields the CPU between polls (a server sharing this
    // CPU needs it).
    const bool clock = spins % 16 == 0;
    s.harvest(clock);
    if (clock && !yielding) yielding = monotonic_ns() - t0 > kSpinNs;
    if (yielding) sched_yield();
  }
}

uint32_t RpcClient::ring() const { return st_->ring; }
uint32_t RpcClient::depth() const { return st_->carve.depth(); }
uint32_t RpcClient::in_flight() const { return st_->unreported; }
uint32_t RpcClient::request_max() const { return st_->carve.req_max(); }
uint32_t RpcClient::reply_max() const { return st_->carve.resp_max(); }
RpcClientStats RpcClient::stats() const { return st_->st; }

}  // namespace cxlkv
