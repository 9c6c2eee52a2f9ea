// SPDX-License-Identifier: MIT
// NodePins (node_pins.hpp): the node's pins by index, in node-local shared
// memory.  Everything runs under the section's robust mutex; no pool line
// is read or written here (the index writes the pool entries, under the
// stripe locks its callers hold).
#include "index/node_pins.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cxlkv/sync.hpp"
#include "sync/node_local.hpp"
#include "sync/robust_mutex.hpp"
#include "util/log.hpp"

namespace cxlkv {

namespace {

constexpr uint64_t kMagic = 0x31534e4950564b43ull;  // "CKVPINS1"
constexpr uint32_t kTomb = 0xffffffffu;             // a bucket whose slot was removed

enum : uint32_t { kFree = 0, kLive = 1, kClosed = 2 };

struct PinHeader {  // at +64, after NodePinSectionHead
  uint64_t magic;
  uint32_t cur;    // which of the two tables is live
  uint32_t used;   // buckets of the live table holding a slot
  uint32_t tombs;  // buckets of the live table holding kTomb
  uint32_t pad;
  uint64_t next_token;
};

struct PinRecord {  // kRecords of them at +128
  uint32_t state;
  uint32_t pid;
  uint64_t start_time;
  uint64_t token;  // which claim of the record (a gone record's reclaim names it)
  uint64_t pad;
};

struct Bucket {
  uint32_t slot1;  // slot + 1; 0 empty; kTomb removed
  uint32_t procs;  // records that pin the slot (bit r: record r)
};
static_assert(sizeof(Bucket) == 8);

constexpr uint64_t kHeaderOff = 64, kRecordsOff = 128, kTablesOff = 4096;
static_assert(sizeof(NodePinSectionHead) <= kHeaderOff);
static_assert(kHeaderOff + sizeof(PinHeader) <= kRecordsOff);
static_assert(kRecordsOff + NodePins::kRecords * sizeof(PinRecord) <= kTablesOff);
static_assert(kTablesOff + 2ull * NodePins::kBuckets * sizeof(Bucket) <= kNodePinSectionBytes,
              "the pin section of sync/node_local.hpp holds the two tables");
static_assert(NodePins::kRecords <= 32, "a slot's set is one 32-bit word");

struct View {
  std::byte* sec;
  pthread_mutex_t* mu() const { return &reinterpret_cast<NodePinSectionHead*>(sec)->mu; }
  PinHeader& h() const { return *reinterpret_cast<PinHeader*>(sec + kHeaderOff); }
  PinRecord& rec(uint32_t r) const { return reinterpret_cast<PinRecord*>(sec + kRecordsOff)[r]; }
  Bucket* table(uint32_t which) const {
    return reinterpret_cast<Bucket*>(sec + kTablesOff) + uint64_t(which & 1) * NodePins::kBuckets;
  }
  Bucket* live() const { return table(h().cur); }
};

uint32_t home(uint32_t slot) {
  return static_cast<uint32_t>((uint64_t(slot) * 0x9e3779b97f4a7c15ull) >> 40) & (NodePins::kBuckets - 1);
}

// Bucket holding `slot` in `t`, or nullptr; `free_at`: the first empty or
// removed bucket on its probe path (where an insert goes).
Bucket* find(Bucket* t, uint32_t slot, Bucket** free_at) {
  if (free_at) *free_at = nullptr;
  for (uint32_t i = 0, b = home(slot); i < NodePins::kBuckets; i++, b = (b + 1) & (NodePins::kBuckets - 1)) {
    Bucket& k = t[b];
    if (k.slot1 == slot + 1) return &k;
    if (k.slot1 == 0 || k.slot1 == kTomb) {
      if (free_at && !*free_at) *free_at = &k;
      if (k.slot1 == 0) return nullptr;
    }
  }
  return nullptr;
}

// The section's mutex, with the table's counters recounted when a process
// died holding it (each step it takes leaves the table valid).
class Locked {
 public:
  explicit Locked(const View& v) : v_(v), lk_(v.mu(), "node-local pin table") {
    PinHeader& h = v_.h();
    if (h.magic != kMagic) {  // first use of the section: the file was zeroed at creation
      h.cur = 0;
      h.used = h.tombs = 0;
      h.next_token = 1;
      h.magic = kMagic;
    } else if (lk_.owner_died()) {
      recount();
    }
  }
  void recount() {
    PinHeader& h = v_.h();
    h.cur &= 1;
    h.used = h.tombs = 0;
    const Bucket* t = v_.live();
    for (uint32_t b = 0; b < NodePins::kBuckets; b++) {
      if (t[b].slot1 == kTomb) h.tombs++;
      else if (t[b].slot1 != 0) h.used++;
    }
  }

 private:
  const View& v_;
  sync::RobustLock lk_;
};

// Copy the live slots into the spare table, then switch to it: removed
// buckets no longer lengthen the probes.
void rebuild(const View& v) {
  PinHeader& h = v.h();
  Bucket* from = v.live();
  Bucket* to = v.table(h.cur ^ 1);
  std::memset(static_cast<void*>(to), 0, sizeof(Bucket) * NodePins::kBuckets);
  uint32_t used = 0;
  for (uint32_t b = 0; b < NodePins::kBuckets; b++) {
    if (from[b].slot1 == 0 || from[b].slot1 == kTomb || from[b].procs == 0) continue;
    Bucket* at = nullptr;
    find(to, from[b].slot1 - 1, &at);
    at->procs = from[b].procs;
    at->slot1 = from[b].slot1;
    used++;
  }
  h.cur ^= 1;  // the switch: a death before it leaves the old table live
  h.used = used;
  h.tombs = 0;
}

void clear_bit(const View& v, Bucket* k, uint32_t bit, uint8_t* node_free) {
  *node_free = 0;
  if (!k) {
    *node_free = 1;  // nobody pins it (defensive: the caller's bit was not recorded)
    return;
  }
  k->procs &= ~bit;
  if (k->procs == 0) {
    k->slot1 = kTomb;
    v.h().used--;
    v.h().tombs++;
    *node_free = 1;
  }
}

}  // namespace

namespace {
// Does any slot name record r?  (A scan of the live table.)
bool names(const View& v, uint32_t r) {
  const Bucket* t = v.live();
  for (uint32_t b = 0; b < NodePins::kBuckets; b++)
    if (t[b].slot1 && t[b].slot1 != kTomb && (t[b].procs >> r & 1)) return true;
  return false;
}
}  // namespace

Result<std::unique_ptr<NodePins>> NodePins::open(std::byte* section, std::string what) {
  if (!section) return Error(-EINVAL, what + ": no node-local pin section");
  View v{section};
  Locked lk(v);
  // Every record taken: those of gone processes that pin nothing can go at
  // once (those that pin something wait for a live index's reclaim, which
  // clears the node's bits first).
  bool any_free = false;
  for (uint32_t r = 0; r < kRecords && !any_free; r++) any_free = v.rec(r).state == kFree;
  for (uint32_t r = 0; r < kRecords && !any_free; r++) {
    PinRecord& pr = v.rec(r);
    if ((pr.state == kClosed || !process_alive(pr.pid, pr.start_time)) && !names(v, r)) {
      pr.state = kFree;
      any_free = true;
    }
  }
  for (uint32_t r = 0; r < kRecords; r++) {
    PinRecord& pr = v.rec(r);
    if (pr.state != kFree) continue;
    pr.pid = self_pid();
    pr.start_time = self_start_time();
    pr.token = v.h().next_token++;
    pr.state = kLive;  // last: a death before it leaves the record free
    std::unique_ptr<NodePins> p(new NodePins);
    p->sec_ = section;
    p->rec_ = r;
    p->what_ = std::move(what);
    return p;
  }
  return Error(-EUSERS, what + ": all " + std::to_string(kRecords) +
                            " pin records are in use (indexes of live processes of this node, or of gone ones "
                            "whose pins are not reclaimed yet)");
}

NodePins::~NodePins() {
  View v{sec_};
  Locked lk(v);
  // A forked child that inherited the index is not the record's owner: the
  // record stays its parent's.
  if (v.rec(rec_).pid != self_pid() || v.rec(rec_).state != kLive) return;
  const bool holds = names(v, rec_);
  // Pins left (a store closed while it pinned blocks): the node's other
  // indexes reclaim them as a dead process's.
  v.rec(rec_).state = holds ? kClosed : kFree;
}

void NodePins::add(std::span<const uint32_t> slots, uint8_t* ok) {
  View v{sec_};
  Locked lk(v);
  const uint32_t bit = 1u << rec_;
  for (size_t i = 0; i < slots.size(); i++) {
    PinHeader& h = v.h();
    Bucket* at = nullptr;
    Bucket* k = find(v.live(), slots[i], &at);
    ok[i] = 1;
    if (k) {
      k->procs |= bit;
      continue;
    }
    if (h.used >= kMaxSlots) {
      ok[i] = 0;
      continue;
    }
    if (h.used + h.tombs + 1 > kBuckets / 4 * 3) {
      rebuild(v);
      find(v.live(), slots[i], &at);
    }
    const bool was_tomb = at->slot1 == kTomb;
    at->procs = bit;             // the set first ...
    at->slot1 = slots[i] + 1;    // ... then the key that makes it found
    h.used++;
    if (was_tomb) h.tombs--;
  }
}

void NodePins::remove(std::span<const uint32_t> slots, uint8_t* node_free) {
  View v{sec_};
  Locked lk(v);
  for (size_t i = 0; i < slots.size(); i++) clear_bit(v, find(v.live(), slots[i], nullptr), 1u << rec_, &node_free[i]);
}

bool NodePins::pinned_by_others(uint32_t slot) {
  View v{sec_};
  Locked lk(v);
  const Bucket* k = find(v.live(), slot, nullptr);
  return k && (k->procs & ~(1u << rec_)) != 0;
}

std::vector<NodePins::Gone> NodePins::gone() {
  View v{sec_};
  struct Seen {
    uint32_t r, state, pid;
    uint64_t start, token;
  };
  std::vector<Seen> seen;
  {
    Locked lk(v);
    for (uint32_t r = 0; r < kRecords; r++) {
      const PinRecord& pr = v.rec(r);
      if (r != rec_ && pr.state != kFree) seen.push_back({r, pr.state, pr.pid, pr.start_time, pr.token});
    }
  }
  // Liveness outside the mutex (each is a /proc read).
  uint32_t mask = 0;
  for (const Seen& s : seen)
    if (s.state == kClosed || !process_alive(s.pid, s.start)) mask |= 1u << s.r;
  std::vector<Gone> out;
  if (!mask) return out;
  Locked lk(v);
  for (const Seen& s : seen) {
    const PinRecord& pr = v.rec(s.r);
    if (!(mask >> s.r & 1)) continue;
    if (pr.token != s.token || pr.state == kFree) {  // freed (and maybe claimed again) meanwhile
      mask &= ~(1u << s.r);
      continue;
    }
    out.push_back(Gone{s.r, s.pid, s.token, {}});
  }
  const Bucket* t = v.live();
  for (uint32_t b = 0; b < kBuckets; b++) {
    if (!t[b].slot1 || t[b].slot1 == kTomb || !(t[b].procs & mask)) continue;
    for (Gone& g : out)
      if (t[b].procs >> g.record & 1) g.slots.push_back(t[b].slot1 - 1);
  }
  return out;
}

namespace {
bool same_claim(const View& v, const NodePins::Gone& g, uint32_t self) {
  return g.record < NodePins::kRecords && g.record != self && v.rec(g.record).state != kFree &&
         v.rec(g.record).token == g.token;
}
}  // namespace

void NodePins::drop(const Gone& g, std::span<const uint32_t> slots, uint8_t* node_free) {
  View v{sec_};
  Locked lk(v);
  const uint32_t record = g.record;
  const bool ours = same_claim(v, g, rec_);
  for (size_t i = 0; i < slots.size(); i++) {
    node_free[i] = 0;
    if (!ours) continue;
    Bucket* k = find(v.live(), slots[i], nullptr);
    if (!k || !(k->procs >> record & 1)) continue;  // dropped already (another reclaimer)
    clear_bit(v, k, 1u << record, &node_free[i]);
  }
}

bool NodePins::forget(const Gone& g) {
  View v{sec_};
  Locked lk(v);
  if (!same_claim(v, g, rec_)) return false;
  const Bucket* t = v.live();
  for (uint32_t b = 0; b < kBuckets; b++)
    if (t[b].slot1 && t[b].slot1 != kTomb && (t[b].procs >> g.record & 1)) return false;
  v.rec(g.record).state = kFree;
  return true;
}

bool NodePins::any_live_record(const std::string& shm_name) {
  const int fd = ::open(("/dev/shm/" + shm_name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  NodeLocalHeader h{};
  PinHeader ph{};
  PinRecord recs[kRecords] = {};
  bool ok = ::pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) && h.magic == kNodeLocalMagic;
  const uint64_t pins_off = ok ? (h.heap_off + h.heap_bytes + 4095) / 4096 * 4096 : 0;
  ok = ok && h.total_size >= pins_off + kNodePinSectionBytes &&
       ::pread(fd, &ph, sizeof ph, static_cast<off_t>(pins_off + kHeaderOff)) == static_cast<ssize_t>(sizeof ph) &&
       ph.magic == kMagic &&
       ::pread(fd, recs, sizeof recs, static_cast<off_t>(pins_off + kRecordsOff)) == static_cast<ssize_t>(sizeof recs);
  ::close(fd);
  if (!ok) return false;
  for (const PinRecord& r : recs)
    if (r.state == kLive && process_alive(r.pid, r.start_time)) return true;
  return false;
}

uint32_t NodePins::slots_pinned() {
  View v{sec_};
  Locked lk(v);
  return v.h().used;
}

uint32_t NodePins::records_in_use() {
  View v{sec_};
  Locked lk(v);
  uint32_t n = 0;
  for (uint32_t r = 0; r < kRecords; r++) n += v.rec(r).state != kFree;
  return n;
}

}  // namespace cxlkv
