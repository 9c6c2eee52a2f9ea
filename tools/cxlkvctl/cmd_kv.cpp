// SPDX-License-Identifier: MIT
// cxlkvctl kv put | get | ls | rm: store and read single KV blocks from the
// command line, for debugging by hand and for scripted restart checks
// (docs/integrity.md "Checked metadata").  put / get / rm attach as a node of the pool (a lock manager
// must run, as for any node) and go through the KV store exactly as an
// engine would; ls and check read the index without a lock (a snapshot);
// check --repair rewrites children counts while no node is live.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "command.hpp"
#include "cxlkv/keys.hpp"
#include "cxlkv/kv.hpp"
#include "cxlkv/sync.hpp"
#include "cxlkv/tier.hpp"
#include "index/index_check.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "tier/ssd_payload_tier.hpp"
#include "cxlkv/format/index_format.h"

namespace cxlkvctl {
namespace {

using namespace cxlkv;

// KEY: 32 hex digits name a key as such; any other string names the root
// block key chain_key(0, no tokens, extras = the string's bytes), so the same
// string always names the same key on every host.
BlockKey key_of(const std::string& s) {
  BlockKey k;
  if (s.size() == 32 && parse_key(s, &k) && !k.is_zero()) return k;
  return chain_key(BlockKey{}, {}, std::as_bytes(std::span(s.data(), s.size())));
}

const char* tier_name(uint8_t t) { return t == CXLKV_TIER_SSD ? "ssd" : "mem"; }

// Entry states as kv ls and kv check --json name them (enum cxlkv_index_state).
const char* const kState[] = {"empty", "writing", "ready", "evicting", "tombstone"};

// SIGINT / SIGTERM while attached (e.g. waiting for a lock): remove the
// node-local file this command created, then end as the signal would.
char g_local_path[256];
char g_tmp_path[4096];  // kv get's temporary output file while it is written
void on_stop_signal(int sig) {
  if (g_local_path[0]) unlink(g_local_path);  // async-signal-safe
  if (g_tmp_path[0]) unlink(g_tmp_path);
  signal(sig, SIG_DFL);
  raise(sig);
}

// One node of the pool with a KV store, and everything it created removed
// on every exit path: the node detaches and, when this command created its
// node-local file, the file goes too.
class KvNode {
 public:
  // Opens the pool, picks a node (--node N, else the highest never-attached
  // one), checks that a lock manager answers, attaches the SSD tier and the
  // memory capacity from the options.  nullptr after printing the error.
  // `region`: the pool already opened by the caller (nullptr: open it).
  static std::unique_ptr<KvNode> open(Context& ctx, const Args& args, int* status,
                                      std::unique_ptr<Region> region = nullptr);
  ~KvNode() {
    session_.reset();
    ssd_tier_.reset();
    ssd_.reset();
    std::string local = node_ ? node_->local_shm_name() : "";
    node_.reset();
    if (created_local_ && !local.empty()) NodeContext::unlink_local(local);
    g_local_path[0] = 0;
  }
  KvStore& kv() { return session_->store(); }
  Region& region() { return *region_; }

 private:
  std::unique_ptr<Region> region_;
  std::unique_ptr<NodeContext> node_;
  std::unique_ptr<SsdPool> ssd_;
  std::unique_ptr<SsdPayloadTier> ssd_tier_;
  std::unique_ptr<KvSession> session_;
  bool created_local_ = false;
};

std::unique_ptr<KvNode> KvNode::open(Context& ctx, const Args& args, int* status, std::unique_ptr<Region> region) {
  *status = 1;
  if (args.value("ssd-size") && !args.value("ssd"))
    return fail("--ssd-size sizes the SSD tier's file: it needs --ssd FILE"), nullptr;
  std::unique_ptr<KvNode> n(new KvNode());
  n->region_ = region ? std::move(region) : ctx.open_pool();
  if (!n->region_) return nullptr;
  Region& r = *n->region_;
  auto ic = r.carve(CXLKV_CARVE_INDEX);
  auto hr = read_index_header(r, r.domain());
  if (!hr) return fail(hr.error().message()), nullptr;
  const cxlkv_index_header h = hr.value();

  // The node: --node N, else the highest free one: never attached or
  // evicted first, then one whose process is gone (a node of this host whose
  // pid no longer runs, or a stale heartbeat).
  auto table = node_table(r);
  if (!table) return nullptr;
  const auto& nodes = *table;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto gone = [&](const NodeStatus& s) {
    if (s.state != CXLKV_NODE_ACTIVE) return true;
    if (!s.alive) return true;
    return s.host == host && s.pid != 0 && kill(pid_t(s.pid), 0) != 0 && errno == ESRCH;
  };
  NodeOptions no;
  no.heartbeat = true;
  if (auto v = args.value("node")) {
    char* end = nullptr;
    unsigned long x = std::strtoul(v->c_str(), &end, 10);
    if (v->empty() || *end || x >= nodes.size())
      return fail("--node: '" + *v + "' is not a node of pool " + r.uri() + " (0.." +
                  std::to_string(nodes.size() - 1) + ")"), nullptr;
    if (!gone(nodes[x])) return fail("node " + *v + " of pool " + r.uri() + " is alive (pid " +
                                     std::to_string(nodes[x].pid) + "): choose another --node"), nullptr;
    no.node = uint32_t(x);
  } else {
    size_t pick = 0;
    for (size_t i = nodes.size(); i-- > 1 && !pick;)
      if (nodes[i].state != CXLKV_NODE_ACTIVE) pick = i;
    for (size_t i = nodes.size(); i-- > 1 && !pick;)
      if (gone(nodes[i])) pick = i;
    if (!pick) return fail("pool " + r.uri() + ": every node is alive; choose one with --node N"), nullptr;
    no.node = uint32_t(pick);
  }
  const std::string local = NodeContext::default_local_name(r, no.node);
  n->created_local_ = access(("/dev/shm/" + local).c_str(), F_OK) != 0;
  if (n->created_local_) {
    std::snprintf(g_local_path, sizeof g_local_path, "/dev/shm/%s", local.c_str());
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
  }
  auto node = NodeContext::attach(r, no);
  if (!node) return fail(node.error().message()), nullptr;
  n->node_ = std::move(node.value());

  // A lock manager must run: take and release one stripe lock, bounded, so
  // that a missing manager is a message and not a hang inside the store.
  {
    TwoTierLock probe(*n->node_, h.lock_base);
    auto g = probe.try_lock_for(std::chrono::seconds(5));
    if (!g) {
      fail("pool " + r.uri() + ": no lock manager granted lock " + std::to_string(h.lock_base) +
           " within 5 s (" + g.error().message() + "): start cxlkvd for this pool");
      return nullptr;
    }
    (void)probe.unlock();
  }

  KvOpenOptions ko;
  if (auto cap = args.value("mem-capacity")) {
    char* end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(cap->c_str(), &end, 10);
    // Digits only; a number past 2^64 (ERANGE) read as 2^64-1, i.e. unbounded.
    if (cap->empty() || *end || cap->find_first_not_of("0123456789") != std::string::npos || errno == ERANGE)
      return fail("--mem-capacity: not a number of blocks: '" + *cap + "'"), nullptr;
    // The pool-wide memory-tier capacity, as the replay and the KV store's
    // owner set it (0: unbounded).
    auto cur = index_policy(r.domain(), r.at(ic->offset));
    if (!cur) return fail(cur.error().message()), nullptr;
    IndexPolicy p;
    p.max_blocks = x;
    p.max_bytes = cur->max_bytes;
    p.interleave_stripe = cur->interleave_stripe;
    p.ndevices = cur->ndevices;
    for (unsigned i = 0; i < CXLKV_INDEX_MAX_DEVICES; i++) p.weights[i] = cur->weights[i];
    auto s = index_set_policy(r.domain(), r.at(ic->offset), p);
    if (!s) return fail(s.error().message()), nullptr;
  }
  if (auto path = args.value("ssd")) {
    std::string err;
    SsdPoolOptions so;
    uint64_t create = 0;
    if (auto sz = args.size("ssd-size", &err)) create = *sz;
    else if (!err.empty()) return fail(err), nullptr;
    so.devices.push_back(SsdDeviceConfig{*path, create, 0, false});
    auto p = SsdPool::open(so);
    if (!p)
      return fail("SSD tier " + *path + ": " + p.error().message() +
                  (p.error().code() == -ENOENT && !create ? " (--ssd-size SIZE creates it)" : "")),
             nullptr;
    n->ssd_ = std::move(p.value());
    n->ssd_tier_ = std::make_unique<SsdPayloadTier>(*n->ssd_);
    ko.ssd_tier = n->ssd_tier_.get();
    ko.demote_on_evict = true;
    ko.promote_on_hit = true;
  }
  auto session = open_kv_session(r, *n->node_, ko);
  if (!session) return fail(session.error().message()), nullptr;
  n->session_ = std::move(session.value());
  *status = 0;
  return n;
}

// The whole of FILE ("-": stdin), at most `max` bytes: a longer file (or an
// endless one, /dev/zero) is refused with -EFBIG once `max` + 1 bytes came,
// naming `why` the bound.
Result<std::vector<std::byte>> read_file(const std::string& path, uint64_t max, const std::string& why) {
  int fd = path == "-" ? dup(0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error(-errno, path + ": " + std::strerror(errno));
  auto too_big = [&](const std::string& size) {
    ::close(fd);
    return Error(-EFBIG, path + ": " + size + ": " + why);
  };
  if (struct stat st {}; ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) > max)
    return too_big(std::to_string(st.st_size) + " bytes");
  std::vector<std::byte> data;
  std::byte buf[1 << 16];
  for (;;) {
    if (data.size() > max) return too_big("more than " + std::to_string(max) + " bytes");
    const size_t want = size_t(std::min<uint64_t>(sizeof buf, max + 1 - data.size()));
    ssize_t k = ::read(fd, buf, want);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      ::close(fd);
      return Error(-e, path + ": read: " + std::strerror(e));
    }
    if (k == 0) break;
    data.insert(data.end(), buf, buf + k);
  }
  ::close(fd);
  return data;
}

Result<void> write_all(int fd, const std::string& path, const std::byte* p, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t k = ::write(fd, p + off, n - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Error(k < 0 ? -errno : -EIO, path + ": write: " + std::strerror(k < 0 ? errno : EIO));
    off += size_t(k);
  }
  return {};
}

// Writes FILE whole or not at all: a regular file (or a new one) is written
// to a temporary file beside it and renamed over it, so a full disk or an
// I/O error leaves no truncated FILE behind (and an existing FILE as it
// was).  A symlink is refused; a device or FIFO (/dev/null), "-", and an
// existing file in a directory this process may not create files in are
// written in place.
Result<void> write_file(const std::string& path, const std::byte* p, size_t n) {
  struct stat st {};
  const bool exists = path != "-" && ::lstat(path.c_str(), &st) == 0;
  if (exists && S_ISLNK(st.st_mode)) return Error(-ELOOP, path + ": " + std::strerror(ELOOP));
  auto in_place = [&]() -> Result<void> {
    int fd = path == "-" ? dup(1) : ::open(path.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Error(-errno, path + ": " + std::strerror(errno));
    auto w = write_all(fd, path, p, n);
    if (::close(fd) != 0 && w) return Error(-errno, path + ": close: " + std::strerror(errno));
    return w;
  };
  if (path == "-" || (exists && !S_ISREG(st.st_mode))) return in_place();
  const size_t slash = path.rfind('/');
  const std::string tmp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "." +
                          path.substr(slash == std::string::npos ? 0 : slash + 1) + ".cxlkvctl-" +
                          std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  exists ? (st.st_mode & 07777) : 0644);
  if (fd < 0 && exists) return in_place();
  if (fd < 0) return Error(-errno, path + ": " + std::strerror(errno));
  if (tmp.size() < sizeof g_tmp_path) {  // interrupted: the handler removes it
    std::memcpy(g_tmp_path, tmp.c_str(), tmp.size() + 1);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
  }
  auto w = write_all(fd, path, p, n);
  if (w && ::fsync(fd) != 0) w = Error(-errno, path + ": fsync: " + std::strerror(errno));
  if (::close(fd) != 0 && w) w = Error(-errno, path + ": close: " + std::strerror(errno));
  if (w && ::rename(tmp.c_str(), path.c_str()) != 0) w = Error(-errno, path + ": rename: " + std::strerror(errno));
  if (!w) ::unlink(tmp.c_str());
  g_tmp_path[0] = 0;
  return w;
}

int kv_put(Context& ctx, const Args& args) {
  if (args.positional().size() != 2) return fail("kv put: expected KEY FILE (see --help)");
  const BlockKey key = key_of(args.positional()[0]);
  // The read is bounded by the largest block the pool can hold: its kv
  // carve, and the index's 4 GiB-1 bytes (docs/operations.md "Bad input,
  // damage and interruptions").
  auto region = ctx.open_pool();
  if (!region) return 1;
  auto kvc = region->carve(CXLKV_CARVE_KV);
  if (!kvc) return fail("pool " + region->uri() + ": no kv carve (format it with the standard carves)");
  const uint64_t max = std::min<uint64_t>(kvc->size, UINT32_MAX);
  auto data = read_file(args.positional()[1], max,
                        "larger than any block of pool " + region->uri() + " (at most " + std::to_string(max) +
                            " bytes: " + (max == UINT32_MAX ? "the index's limit" : "the whole kv carve") + ")");
  if (!data) return fail(data.error().message());
  if (data->empty()) return fail(args.positional()[1] + ": empty: a KV block holds at least one byte");
  int st;
  auto n = KvNode::open(ctx, args, &st, std::move(region));
  if (!n) return st;
  KvStore& kv = n->kv();
  auto res = kv.reserve(key, nullptr, data->size());
  if (!res) return fail("block " + to_hex(key) + ": reserve: " + res.error().message());
  if (!res->reserved())
    return fail("block " + to_hex(key) + (res->status == 1 ? " is already cached" : " is being written by another node") +
                ": nothing written (kv rm it first to replace it)");
  Chunk c{data->data(), data->size()};
  auto w = kv.write(*res, {&c, 1});
  auto p = w ? kv.publish(*res) : Result<void>(w.error());
  if (!p) {
    (void)kv.abort(*res);
    return fail("block " + to_hex(key) + ": " + (w ? "publish" : "write") + ": " + p.error().message());
  }
  if (ctx.json)
    std::printf("{\"key\": \"%s\", \"bytes\": %zu, \"tier\": \"%s\"}\n", to_hex(key).c_str(), data->size(),
                tier_name(res->loc_tier));
  else
    std::printf("%s  %zu bytes published\n", to_hex(key).c_str(), data->size());
  return 0;
}

int kv_get(Context& ctx, const Args& args) {
  if (args.positional().size() != 2) return fail("kv get: expected KEY FILE (see --help)");
  const BlockKey key = key_of(args.positional()[0]);
  int st;
  auto n = KvNode::open(ctx, args, &st);
  if (!n) return st;
  KvStore& kv = n->kv();
  auto pin = kv.pin(key);
  if (!pin) {
    if (pin.error().code() == -ENOENT) return fail("block " + to_hex(key) + " is not cached");
    return fail("block " + to_hex(key) + ": pin: " + pin.error().message());
  }
  std::vector<std::byte> buf(pin->length);
  Chunk c{buf.data(), buf.size()};
  auto f = kv.fetch(*pin, {&c, 1});  // fails (never 0) when the block changed under it or fails its checks
  auto u = kv.unpin(*pin);
  if (!f) return fail("block " + to_hex(key) + ": fetch: " + f.error().message());
  if (!u) return fail("block " + to_hex(key) + ": unpin: " + u.error().message());
  auto w = write_file(args.positional()[1], buf.data(), buf.size());
  if (!w) return fail(w.error().message());
  if (args.positional()[1] != "-") {
    if (ctx.json)
      std::printf("{\"key\": \"%s\", \"bytes\": %zu, \"tier\": \"%s\"}\n", to_hex(key).c_str(), buf.size(),
                  tier_name(pin->loc_tier));
    else
      std::printf("%s  %zu bytes read from the %s tier\n", to_hex(key).c_str(), buf.size(), tier_name(pin->loc_tier));
  }
  return 0;
}

int kv_rm(Context& ctx, const Args& args) {
  if (args.positional().size() != 1) return fail("kv rm: expected KEY (see --help)");
  const BlockKey key = key_of(args.positional()[0]);
  int st;
  auto n = KvNode::open(ctx, args, &st);
  if (!n) return st;
  auto r = store_index(n->kv()).remove(key);
  if (!r) return fail(r.error().message());
  if (ctx.json) std::printf("{\"key\": \"%s\", \"removed\": true}\n", to_hex(key).c_str());
  else std::printf("%s  removed\n", to_hex(key).c_str());
  return 0;
}

int kv_ls(Context& ctx, const Args& args) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  MemoryDomain& d = r->domain();
  auto hr = read_index_header(*r, d);  // entries inside the carve, checked
  if (!hr) return fail(hr.error().message());
  const cxlkv_index_header h = hr.value();
  auto* base = static_cast<const std::byte*>(r->at(r->carve(CXLKV_CARVE_INDEX)->offset));
  const bool all = args.flag("all");
  uint64_t listed = 0;
  if (ctx.json) std::printf("[");
  else std::printf("%-32s %10s %-4s %-9s %5s %8s\n", "KEY", "BYTES", "TIER", "STATE", "PINS", "CHILDREN");
  for (uint64_t i = 0; i < h.nslots; i++) {
    auto e = d.read_fresh(reinterpret_cast<const cxlkv_index_entry*>(base + h.entry_off + i * 64));
    if (e.check != cxlkv_index_entry_check(&e)) continue;  // empty, or torn by a writer right now
    if (e.state != CXLKV_ENTRY_READY && !(all && (e.state == CXLKV_ENTRY_WRITING || e.state == CXLKV_ENTRY_EVICTING)))
      continue;
    const std::string k = to_hex(BlockKey{e.key_lo, e.key_hi});
    const int pins = __builtin_popcountll(e.pin_mask);
    if (ctx.json)
      std::printf("%s\n  {\"key\": \"%s\", \"bytes\": %u, \"tier\": \"%s\", \"state\": \"%s\", \"pinning_nodes\": %d, "
                  "\"children\": %u}", listed ? "," : "", k.c_str(), e.loc_len, tier_name(e.loc_tier),
                  kState[e.state < 5 ? e.state : 0], pins, e.children);
    else
      std::printf("%-32s %10u %-4s %-9s %5d %8u\n", k.c_str(), e.loc_len, tier_name(e.loc_tier),
                  kState[e.state < 5 ? e.state : 0], pins, e.children);
    listed++;
  }
  if (ctx.json) std::printf("\n]\n");
  return 0;
}

// kv check --repair: rewrite every children count that differs from the
// live blocks naming the entry (index_repair_child_counts: refused while a
// node is live), print one line per block and a total, then audit again:
// exit 0 when the pool is sound after the repair.
int kv_repair(Context& ctx, Region& r) {
  auto rep = cxlkv::index_repair_child_counts(r, r.domain());
  if (!rep) return fail(rep.error().message());
  auto audit = cxlkv::index_audit(r, r.domain(), std::chrono::milliseconds(0));  // nothing writes: one snapshot
  if (!audit) return fail(audit.error().message());
  const bool sound = audit->problems() == 0 && rep->changed.empty() && rep->attached_meanwhile.empty();
  if (ctx.json) {
    std::printf("{\"repaired\": %zu, \"now_evictable\": %zu, \"changed_meanwhile\": %zu, \"problems\": %zu, "
                "\"location_problems\": %zu, \"children_mismatches\": %zu, \"blocks\": [",
                rep->repaired.size(), rep->now_evictable(), rep->changed.size(), audit->problems(),
                audit->locations.size(), audit->children_mismatches());
    const char* sep = "";
    for (const auto& b : rep->repaired) {
      std::printf("%s{\"slot\": %u, \"key\": \"%s\", \"state\": \"%s\", \"old\": %u, \"new\": %u, \"evictable\": %s}",
                  sep, b.was.slot, to_hex(b.was.key).c_str(), kState[b.was.state < 5 ? b.was.state : 0], b.was.stored,
                  b.was.found, b.listed ? "true" : "false");
      sep = ", ";
    }
    std::printf("]}\n");
  } else {
    const std::string who = "pool " + r.uri() + ": ";
    for (const auto& b : rep->repaired)
      std::printf("%sindex carve: repaired %s\n", who.c_str(), cxlkv::describe_child_count_repair(b).c_str());
    for (const auto& m : rep->changed)
      std::printf("%sindex carve: block %s (index slot %u) changed while the repair ran: not repaired\n", who.c_str(),
                  to_hex(m.key).c_str(), m.slot);
    std::printf("%s%zu children count%s repaired, %zu block%s now evictable\n", who.c_str(), rep->repaired.size(),
                rep->repaired.size() == 1 ? "" : "s", rep->now_evictable(), rep->now_evictable() == 1 ? "" : "s");
    for (const auto& f : audit->lines(r)) std::printf("%s\n", f.c_str());
    if (audit->problems() == 0) std::printf("%sindex locations and children counts sound\n", who.c_str());
  }
  if (!rep->attached_meanwhile.empty())
    std::fprintf(stderr, "cxlkvctl: pool %s: nodes attached while the repair ran: %s; stop them and run kv check "
                         "again\n", r.uri().c_str(), rep->attached_meanwhile.c_str());
  return sound ? 0 : 1;
}

// Audit the index's payload locations (outside the kv carve,
// overlapping another block) and its children counts (a count no child
// accounts for keeps a block from ever being evicted); exit 1 listing each
// finding.  Counts are compared over two snapshots --settle MS apart.
int kv_check(Context& ctx, const Args& args) {
  if (args.flag("repair")) {
    if (args.value("settle"))
      return fail("--settle: no use with --repair (no node is live: one snapshot is exact)");
    auto r = ctx.open_pool();
    if (!r) return 1;
    return kv_repair(ctx, *r);
  }
  long settle_ms = 200;
  if (auto v = args.value("settle")) {
    char* end = nullptr;
    errno = 0;
    settle_ms = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end || v->find_first_not_of("0123456789") != std::string::npos || errno == ERANGE ||
        settle_ms > 60000)
      return fail("--settle: not a number of milliseconds in 0..60000: '" + *v + "'");
  }
  auto r = ctx.open_pool();
  if (!r) return 1;
  auto audit = cxlkv::index_audit(*r, r->domain(), std::chrono::milliseconds(settle_ms));
  if (!audit) return fail(audit.error().message());
  if (ctx.json) {
    std::printf("{\"problems\": %zu, \"location_problems\": %zu, \"children_mismatches\": %zu, \"settle_ms\": %ld, "
                "\"child_counts\": [",
                audit->problems(), audit->locations.size(), audit->children_mismatches(), settle_ms);
    const char* sep = "";
    for (const auto& m : audit->child_counts) {
      std::printf("%s{\"slot\": %u, \"key\": \"%s\", \"state\": \"%s\", \"stored\": %u, \"found\": %u}", sep,
                  m.slot, to_hex(m.key).c_str(), kState[m.state < 5 ? m.state : 0], m.stored, m.found);
      sep = ", ";
    }
    std::printf("]}\n");
  } else {
    for (const auto& f : audit->lines(*r)) std::printf("%s\n", f.c_str());
    if (audit->problems() == 0) std::printf("pool %s: index locations and children counts sound\n", r->uri().c_str());
  }
  return audit->problems() == 0 ? 0 : 1;
}

const std::vector<Option> kNodeOptions = {
    {"node", true, "attach as node N (default: the highest free node)"},
    {"ssd", true, "attach the SSD tier on this file, as the KV store would (blocks evicted from memory go there)"},
    {"ssd-size", true, "create / grow the SSD file to this size (e.g. 256M)"},
    {"mem-capacity", true, "bound the memory tier to BLOCKS blocks (the pool-wide policy; 0: unbounded)"},
};

const char* kKeyHelp =
    "KEY is 32 hex digits (a block key as `kv ls` prints it) or any other\n"
    "string, which names the root block key chain_key(0, no tokens, extras =\n"
    "the string's bytes): the same on every host.  put / get / rm attach as a\n"
    "node of the pool; a lock manager (cxlkvd) must run, as for any node.";

CXLKVCTL_COMMAND({"kv put", "store FILE as the KV block KEY (reserve, write, publish)",
                  std::string("cxlkvctl kv put KEY FILE\n\n"
                              "Stores the bytes of FILE (- for stdin) as one block, a root of the\n"
                              "prefix index.  Fails if KEY is already cached (kv rm it first).\n\n") + kKeyHelp,
                  kNodeOptions, kv_put, 2});

CXLKVCTL_COMMAND({"kv get", "read the KV block KEY into FILE (pin, fetch, unpin)",
                  std::string("cxlkvctl kv get KEY FILE\n\n"
                              "Writes the block's bytes to FILE (- for stdout; a symlink is refused),\n"
                              "whole or not at all: on a full disk FILE is left as it was.\n"
                              "Exits 1 with a message when the block is not cached or fails its checks\n"
                              "(changed while read, SSD checksum, I/O error).\n\n") + kKeyHelp,
                  kNodeOptions, kv_get, 2});

CXLKVCTL_COMMAND({"kv rm", "remove the KV block KEY from the cache",
                  std::string("cxlkvctl kv rm KEY\n\n"
                              "Removes one cached block as an eviction would.  Refused while a live node\n"
                              "pins it, or while it has cached children (the cache is prefix-closed:\n"
                              "remove those first).\n\n") + kKeyHelp,
                  kNodeOptions, kv_rm, 1});

CXLKVCTL_COMMAND({"kv ls", "list the cached KV blocks: key, bytes, tier, pins, children",
                  "cxlkvctl kv ls\n\n"
                  "Lists the READY blocks of the prefix index (a lock-free snapshot; no node\n"
                  "attaches, no lock manager needed).",
                  {{"all", false, "also list blocks being written or evicted"}},
                  kv_ls});

CXLKVCTL_COMMAND({"kv check", "audit the index: blocks outside the kv carve or overlapping another, children counts (--repair)",
                  "cxlkvctl kv check [--settle MS | --repair]\n\n"
                  "Reads every entry of the prefix index (a lock-free snapshot) and reports,\n"
                  "one line each, memory-tier blocks whose location lies outside the kv\n"
                  "carve or overlaps another block's, and blocks whose children count differs\n"
                  "from the cached blocks naming them as parent (a count too high keeps the\n"
                  "block from ever being evicted); exits 1 when it finds any.  Writers change\n"
                  "counts while the snapshot is read, so the counts are read twice, MS apart\n"
                  "(default 200), and only a mismatch seen identically both times is\n"
                  "reported; --settle 0 reads once (a pool no process writes).  Header\n"
                  "damage is an error naming the field.\n\n"
                  "--repair (offline, like fsck on an unmounted file system): refused while\n"
                  "any node of the pool is live (`node list`; a lock manager alone may run);\n"
                  "sets each differing count to the children found, puts a block left\n"
                  "without children on its eviction list, prints one line per block\n"
                  "(old -> new) and a total, then audits again: exit 0 when sound.",
                  {{"settle", true, "milliseconds between the two snapshots of the children counts (default 200)"},
                   {"repair", false, "rewrite differing children counts (no node may be live)"}},
                  kv_check});

}  // namespace
}  // namespace cxlkvctl
