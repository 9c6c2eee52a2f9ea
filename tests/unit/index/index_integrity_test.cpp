// SPDX-License-Identifier: MIT
// Checked metadata of the index carve (docs/integrity.md "Checked metadata"):
//  * every header field is checked at open (a table flips each one and
//    expects an error naming the pool, the carve and the field), then the
//    header checksum; an older layout is a clear error;
//  * a damaged entry line is remembered as damaged after one bounded retry:
//    lookups stay fast (it once cost 1.9 s per read: 2^20 re-reads);
//  * an entry naming bytes outside the kv carve (the superblock) is never
//    served: fetch fails and hands back no bytes;
//  * the audit (cxlkvctl kv check) names entries outside the kv carve or
//    overlapping another, and children counts no child accounts for.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/sync.hpp"
#include "index/index_check.hpp"
#include "kv/store_index.hpp"
#include "pool/format.hpp"
#include "support/index_sim_pool.hpp"
#include "cxlkv/format/alloc_format.h"

namespace cxlkv {
namespace {

using test::chain;
using test::fetch_ok;
using test::put;
using test::SimPool;

struct ShmKv {
  ShmKv() {
    uri = "shm:cxlkv-ixint-" + std::to_string(getpid()) + ":64M";
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    mgr = std::move(LockManager::create(*region).value());
    mgr->start();
    NodeOptions no;
    no.node = 1;
    node = std::move(NodeContext::attach(*region, no).value());
  }
  ~ShmKv() {
    session.reset();
    if (node) {  // a test may have detached it
      const std::string local = node->local_shm_name();
      node.reset();
      shm_unlink(("/" + local).c_str());  // this node's node-local file
    }
    mgr->stop();
    mgr.reset();
    region.reset();
    shm_unlink(("/cxlkv-ixint-" + std::to_string(getpid())).c_str());
  }
  Result<void> open() {
    auto s = open_kv_session(*region, *node);
    if (!s) return s.error();
    session = std::move(s.value());
    return {};
  }
  std::byte* index_carve() { return region->at(region->carve(CXLKV_CARVE_INDEX)->offset); }
  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

}  // namespace

TEST(IndexIntegrity, EveryDamagedHeaderFieldIsRefusedNamingThePoolTheCarveAndTheField) {
  ShmKv p;
  auto* h = reinterpret_cast<cxlkv_index_header*>(p.index_carve());
  const cxlkv_index_header good = *h;
  ASSERT_TRUE(p.open().ok());
  p.session.reset();
  struct Case {
    const char* names;  // what the error must name
    size_t at, width;
    uint64_t value;
  };
#define F(f) offsetof(cxlkv_index_header, f), sizeof(good.f)
  const Case cases[] = {
      {"max_nodes", F(max_nodes), 0},
      {"max_nodes", F(max_nodes), 65},
      {"stripe_slots", F(stripe_slots), 0},
      {"stripe_slots", F(stripe_slots), good.stripe_slots + 1},
      {"nstripes", F(nstripes), 0},
      {"nslots", F(nstripes), good.nstripes + 1},  // nslots no longer nstripes x stripe_slots
      {"nslots", F(nslots), good.nslots * 2},
      {"nslots", F(nslots), 1ull << 40},
      {"stripe_off", F(stripe_off), 0},  // the header itself
      {"stripe_off", F(stripe_off), UINT64_MAX - 63},  // wraps
      {"stats_off", F(stats_off), good.stripe_off},  // overlaps the stripes
      {"stats_off", F(stats_off), 1ull << 62},
      {"entry_off", F(entry_off), good.stats_off},  // overlaps the stats
      {"entry_off", F(entry_off), UINT64_MAX - 63},
      {"entry_off", F(entry_off), good.entry_off + 1},  // not line aligned
      {"lock_base", F(lock_base), 0xfffffff0u},
      {"checksum", F(checksum), good.checksum ^ 0x100},
      {"checksum", F(lock_base), good.lock_base + 1},  // plausible, caught by the checksum
      {"checksum", F(entry_off), good.entry_off + 64},  // plausible too
  };
#undef F
  size_t refused = 0;
  for (const Case& c : cases) {
    *h = good;
    std::memcpy(reinterpret_cast<std::byte*>(h) + c.at, &c.value, c.width);
    p.region->domain().flush(h, sizeof *h);
    p.region->domain().fence();
    auto s = p.open();
    ASSERT_FALSE(s.ok()) << c.names << " = " << c.value << " was accepted";
    p.session.reset();
    const std::string& m = s.error().message();
    EXPECT_EQ(s.error().code(), -EUCLEAN) << m;
    EXPECT_NE(m.find(p.uri), std::string::npos) << m;
    EXPECT_NE(m.find("index carve"), std::string::npos) << m;
    EXPECT_NE(m.find(c.names), std::string::npos) << c.names << ": " << m;
    refused++;
  }
  EXPECT_EQ(refused, sizeof cases / sizeof cases[0]);
  // The layout before the header checksum, and the one before the node
  // stats' second remote line (its entries start a line earlier per node).
  for (uint32_t older : {3u, 5u}) {
    *h = good;
    h->version = older;
    p.region->domain().flush(h, sizeof *h);
    p.region->domain().fence();
    auto s = p.open();
    ASSERT_FALSE(s.ok()) << older;
    p.session.reset();
    EXPECT_EQ(s.error().code(), -EPROTO);
    EXPECT_NE(s.error().message().find("layout version " + std::to_string(older) + " is older"), std::string::npos)
        << s.error().message();
    EXPECT_NE(s.error().message().find("reformat"), std::string::npos) << s.error().message();
  }
  *h = good;
  p.region->domain().flush(h, sizeof *h);
  p.region->domain().fence();
  EXPECT_TRUE(p.open().ok()) << "the original header opens again";
}

// One damaged line: remembered after one bounded retry, so a thousand
// lookups through it take milliseconds, not 1.9 s each; when the line
// validates again it is trusted again.
TEST(IndexIntegrity, ADamagedLineIsRememberedAndNeverRetriedForEver) {
  SimPool p(1);
  auto a = p.store(0);
  auto c = chain(8, 4);
  for (size_t i = 0; i < 4; i++) ASSERT_TRUE(put(*a, c, i).ok());
  const uint32_t slot = store_index(*a).find_ready(c[1]);
  ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
  auto* e = reinterpret_cast<std::byte*>(p.pool.mem + store_index(*a).header().entry_off + slot * 64ull);
  std::byte saved[64];
  std::memcpy(saved, e, 64);
  uint8_t bad = static_cast<uint8_t>(saved[20]) ^ 0x5a;
  p.sim.node(0).store_nt(e + 20, &bad, 1);
  p.sim.node(0).fence();

  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; i++) ASSERT_EQ(a->lookup(c), 1u) << "the chain ends before the damaged block";
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(2)) << "a damaged line is re-read without bound";
  EXPECT_EQ(store_index(*a).damaged_lines(), 1u) << "remembered once, not reported on every read";
  EXPECT_FALSE(fetch_ok(*a, c[1])) << "never served";
  EXPECT_TRUE(fetch_ok(*a, c[0]));

  p.sim.node(0).store_nt(e, saved, 64);  // repaired
  p.sim.node(0).fence();
  EXPECT_EQ(a->lookup(c), 4u) << "a line that validates again is trusted again";
  EXPECT_TRUE(fetch_ok(*a, c[1]));
}

// An entry whose location names the superblock (a valid checksum, so only
// the location is wrong): pin may hand out the handle, but fetch refuses
// it and the caller's buffer is untouched; put elsewhere still works.
TEST(IndexIntegrity, AnEntryNamingBytesOutsideTheKvCarveIsNeverRead) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  std::vector<uint64_t> ids = {77};
  auto keys = keys_from_ids(ids);
  std::vector<std::byte> buf(4096, std::byte{0x31});
  Chunk ch{buf.data(), buf.size()};
  auto r = kv.reserve(keys[0], nullptr, buf.size());
  ASSERT_TRUE(r.ok() && r->reserved());
  ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
  ASSERT_TRUE(kv.publish(*r).ok());
  const uint32_t slot = store_index(kv).find_ready(keys[0]);
  ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
  auto* line =
      reinterpret_cast<cxlkv_index_entry*>(p.index_carve() + store_index(kv).header().entry_off + slot * 64ull);
  MemoryDomain& d = p.region->domain();
  for (uint64_t forged : {uint64_t{0}, p.region->carve(CXLKV_CARVE_INDEX)->offset, p.region->size() - 1024}) {
    cxlkv_index_entry e = d.read_fresh(line);
    e.loc_off = forged;
    e.check = cxlkv_index_entry_check(&e);
    d.publish_line(line, &e);
    d.fence();
    std::vector<std::byte> got(4096, std::byte{0x5A});
    Chunk out{got.data(), got.size()};
    auto pin = kv.pin(keys[0]);
    if (pin.ok()) {
      auto f = kv.fetch(*pin, {&out, 1});
      ASSERT_FALSE(f.ok()) << "bytes at " << forged << " were served as the block";
      EXPECT_TRUE(f.error().code() == -EUCLEAN || f.error().code() == -EFAULT) << f.error().message();
      EXPECT_NE(f.error().message().find("outside"), std::string::npos) << f.error().message();
      if (forged + 4096 <= p.region->size()) {  // inside the pool: refused for leaving the kv carve
        EXPECT_NE(f.error().message().find("kv carve"), std::string::npos) << f.error().message();
      }
      (void)kv.unpin(*pin);
    }
    for (std::byte b : got) ASSERT_EQ(b, std::byte{0x5A}) << "the caller's buffer was written";
    std::vector<int32_t> st(1);
    std::vector<uint32_t> n1(1, 1);
    auto g = kv.get_many({&keys[0], 1}, {&out, 1}, n1, st);
    EXPECT_TRUE(!g.ok() || st[0] != 0) << "get_many served a forged location";
    for (std::byte b : got) ASSERT_EQ(b, std::byte{0x5A}) << "the caller's buffer was written";
  }
}

}  // namespace cxlkv

namespace cxlkv {

// The audit (cxlkvctl kv check) names every entry whose location leaves the
// kv carve or overlaps another block's; a sound index has no finding.
TEST(IndexIntegrity, TheAuditNamesEntriesOutsideTheKvCarveOrOverlappingAnother) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  std::vector<uint64_t> ids = {901, 902, 903};
  auto keys = keys_from_ids(ids);
  for (const auto& k : keys) {
    std::vector<std::byte> buf(8192, std::byte{0x42});
    Chunk ch{buf.data(), buf.size()};
    auto r = kv.reserve(k, nullptr, buf.size());
    ASSERT_TRUE(r.ok() && r->reserved());
    ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
    ASSERT_TRUE(kv.publish(*r).ok());
  }
  auto sound = index_audit_locations(*p.region, p.region->domain());
  ASSERT_TRUE(sound.ok()) << sound.error().message();
  EXPECT_TRUE(sound->empty()) << sound->front();

  MemoryDomain& d = p.region->domain();
  auto line = [&](const BlockKey& k) {
    return reinterpret_cast<cxlkv_index_entry*>(p.index_carve() + store_index(kv).header().entry_off +
                                                store_index(kv).find_ready(k) * 64ull);
  };
  const cxlkv_index_entry a = d.read_fresh(line(keys[0]));
  cxlkv_index_entry b = d.read_fresh(line(keys[1]));
  b.loc_off = a.loc_off + 64;  // inside block A
  b.check = cxlkv_index_entry_check(&b);
  d.publish_line(line(keys[1]), &b);
  cxlkv_index_entry c = d.read_fresh(line(keys[2]));
  c.loc_off = 0;  // the superblock
  c.check = cxlkv_index_entry_check(&c);
  d.publish_line(line(keys[2]), &c);
  d.fence();
  auto found = index_audit_locations(*p.region, p.region->domain());
  ASSERT_TRUE(found.ok()) << found.error().message();
  ASSERT_EQ(found->size(), 2u);
  std::string all = (*found)[0] + "\n" + (*found)[1];
  EXPECT_NE(all.find("overlaps"), std::string::npos) << all;
  EXPECT_NE(all.find(to_hex(keys[1])), std::string::npos) << all;
  EXPECT_NE(all.find("outside the kv carve"), std::string::npos) << all;
  EXPECT_NE(all.find(to_hex(keys[2])), std::string::npos) << all;
  EXPECT_NE(all.find(p.uri), std::string::npos) << all;
}

}  // namespace cxlkv

namespace cxlkv {

// An entry whose location overlaps another entry's block (a
// damaged or forged line with a valid checksum) is refused at pin, with one
// record read instead of a scan: the allocator records which index slot
// holds each block (cxlkv/format/alloc_format.h "Block owners").  The refusal is
// -EIO, names the slot and both extents, is counted, and hands back no
// bytes; the block it overlaps still reads back as itself, and removing the
// forged entry does not free the other block's space.
TEST(IndexIntegrity, AnEntryOverlappingAnotherBlockIsRefusedAtPinAndNeverServed) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  std::vector<uint64_t> ids = {1201, 1202, 1203};
  auto keys = keys_from_ids(ids);
  constexpr size_t kBytes = 8192;
  auto pattern = [](size_t i) { return std::byte(0x41 + i); };
  for (size_t i = 0; i < keys.size(); i++) {
    std::vector<std::byte> buf(kBytes, pattern(i));
    Chunk ch{buf.data(), buf.size()};
    auto r = kv.reserve(keys[i], nullptr, buf.size());
    ASSERT_TRUE(r.ok() && r->reserved());
    ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
    ASSERT_TRUE(kv.publish(*r).ok());
  }
  auto reads_as = [&](const BlockKey& k, std::byte want) {
    std::vector<std::byte> got(kBytes, std::byte{0});
    Chunk out{got.data(), got.size()};
    std::vector<int32_t> st(1);
    std::vector<uint32_t> n1(1, 1);
    auto g = kv.get_many({&k, 1}, {&out, 1}, n1, st);
    if (!g.ok() || st[0] != 0) return false;
    for (std::byte b : got)
      if (b != want) return false;
    return true;
  };
  MemoryDomain& d = p.region->domain();
  const uint32_t slot_a = store_index(kv).find_ready(keys[0]), slot_b = store_index(kv).find_ready(keys[1]);
  ASSERT_NE(slot_a, CXLKV_INDEX_NO_SLOT);
  ASSERT_NE(slot_b, CXLKV_INDEX_NO_SLOT);
  auto line = [&](uint32_t slot) {
    return reinterpret_cast<cxlkv_index_entry*>(p.index_carve() + store_index(kv).header().entry_off +
                                                 slot * 64ull);
  };
  const cxlkv_index_entry a = d.read_fresh(line(slot_a));
  const cxlkv_index_entry b_good = d.read_fresh(line(slot_b));
  ASSERT_TRUE(reads_as(keys[1], pattern(1)));  // sound: every block is served

  const uint64_t refusals0 = store_index(kv).counters().overlap_refusals;
  struct Forge {
    const char* what;
    uint64_t off;
    uint32_t len;
  } forged[] = {
      {"the same bytes as block A", a.loc_off, a.loc_len},
      {"bytes starting inside block A", a.loc_off + 512, a.loc_len},
      {"a few bytes inside block A", a.loc_off + 64, 100},
      {"bytes straddling the end of block A", a.loc_off + a.loc_len - 64, a.loc_len},
  };
  int refused = 0;
  for (const Forge& f : forged) {
    SCOPED_TRACE(f.what);
    cxlkv_index_entry b = b_good;
    b.loc_off = f.off;
    b.loc_len = f.len;
    b.check = cxlkv_index_entry_check(&b);
    d.publish_line(line(slot_b), &b);
    d.fence();
    auto pin = kv.pin(keys[1]);
    ASSERT_FALSE(pin.ok()) << "an entry naming " << f.what << " was pinned";
    EXPECT_EQ(pin.error().code(), -EIO) << pin.error().message();
    const std::string m = pin.error().message();
    EXPECT_NE(m.find(to_hex(keys[1])), std::string::npos) << m;
    EXPECT_NE(m.find("slot " + std::to_string(slot_b)), std::string::npos) << m;
    EXPECT_NE(m.find("[" + std::to_string(f.off) + ", " + std::to_string(f.off + f.len) + ")"), std::string::npos) << m;
    if (f.off == a.loc_off && f.len == a.loc_len) {  // the recorded holder is named with its extent
      EXPECT_NE(m.find("overlaps block " + to_hex(keys[0])), std::string::npos) << m;
      EXPECT_NE(m.find("slot " + std::to_string(slot_a)), std::string::npos) << m;
      EXPECT_NE(m.find("[" + std::to_string(a.loc_off) + ", " + std::to_string(a.loc_off + a.loc_len) + ")"),
                std::string::npos)
          << m;
    }
    refused++;
    // The batch path refuses it too and writes nothing into the caller's buffer.
    std::vector<std::byte> got(f.len, std::byte{0x5A});
    Chunk out{got.data(), got.size()};
    std::vector<int32_t> st(1);
    std::vector<uint32_t> n1(1, 1);
    auto g = kv.get_many({&keys[1], 1}, {&out, 1}, n1, st);
    EXPECT_TRUE(!g.ok() || st[0] == -EIO) << "get_many status " << st[0];
    for (std::byte x : got) ASSERT_EQ(x, std::byte{0x5A}) << "the caller's buffer was written";
    refused++;
    // The block whose space the forged entry names is still served, as itself.
    EXPECT_TRUE(reads_as(keys[0], pattern(0)));
    EXPECT_TRUE(reads_as(keys[2], pattern(2)));
  }
  EXPECT_EQ(store_index(kv).counters().overlap_refusals - refusals0, uint64_t(refused));

  // Removing the forged entry leaks its named space rather than freeing block A's.
  {
    cxlkv_index_entry b = b_good;
    b.loc_off = a.loc_off;
    b.check = cxlkv_index_entry_check(&b);
    d.publish_line(line(slot_b), &b);
    d.fence();
  }
  ASSERT_TRUE(store_index(kv).remove(keys[1]).ok());
  std::vector<uint64_t> more_ids;
  for (uint64_t i = 0; i < 64; i++) more_ids.push_back(5000 + i);
  auto more = keys_from_ids(more_ids);
  for (const auto& k : more) {
    std::vector<std::byte> buf(kBytes, std::byte{0x77});
    Chunk ch{buf.data(), buf.size()};
    auto r = kv.reserve(k, nullptr, buf.size());
    ASSERT_TRUE(r.ok() && r->reserved());
    ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
    ASSERT_TRUE(kv.publish(*r).ok());
  }
  EXPECT_TRUE(reads_as(keys[0], pattern(0))) << "block A's space was handed out again";
  for (const auto& k : more) EXPECT_TRUE(reads_as(k, std::byte{0x77}));
  // A sound pool: every block passes its owner check.
  auto audit = index_audit_locations(*p.region, d);
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->empty()) << audit->front();
}

}  // namespace cxlkv

namespace cxlkv {

// One owner record covers a 1 KiB granule, so an entry whose location is
// moved by 1..1023 bytes inside its own block's granule (a forged or
// damaged line, checksum recomputed) found its own record and was served:
// the bytes from the moved start on, up to 1023 bytes of the next block.
// The start must be exact -- where the allocator starts blocks of that
// length in their chunk -- so such an entry is refused at pin with
// -EBADMSG naming the block, get_many hands back no byte, and the entry
// put back reads as itself.  Blocks of a size class that is a multiple of
// the granule (8 KiB), one that is not (1,200 bytes: class 1,280) and a
// run of whole chunks (1.5 MiB).
TEST(IndexIntegrity, AnEntryMovedInsideItsOwnGranuleIsRefusedAtPinNamingTheBlock) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  MemoryDomain& d = p.region->domain();
  const std::vector<uint64_t> sizes = {8192, 8192, 1200, 1200, 1536 * 1024};
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < sizes.size(); i++) ids.push_back(1301 + i);
  auto keys = keys_from_ids(ids);
  auto pattern = [](size_t i, size_t at) { return std::byte(0x21 + i * 13 + at % 7); };
  for (size_t i = 0; i < keys.size(); i++) {
    std::vector<std::byte> buf(sizes[i]);
    for (size_t j = 0; j < buf.size(); j++) buf[j] = pattern(i, j);
    Chunk ch{buf.data(), buf.size()};
    auto r = kv.reserve(keys[i], nullptr, buf.size());
    ASSERT_TRUE(r.ok() && r->reserved());
    ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
    ASSERT_TRUE(kv.publish(*r).ok());
  }
  auto line = [&](uint32_t slot) {
    return reinterpret_cast<cxlkv_index_entry*>(p.index_carve() + store_index(kv).header().entry_off +
                                                 slot * 64ull);
  };
  auto get = [&](size_t i, std::vector<std::byte>& got) {
    got.assign(sizes[i], std::byte{0x5A});
    Chunk out{got.data(), got.size()};
    std::vector<int32_t> st(1, 99);
    std::vector<uint32_t> n1(1, 1);
    auto g = kv.get_many({&keys[i], 1}, {&out, 1}, n1, st);
    return g.ok() ? st[0] : g.error().code();
  };
  int refused = 0;
  const uint64_t refusals0 = store_index(kv).counters().overlap_refusals;
  for (size_t i : {size_t{0}, size_t{3}, size_t{4}}) {
    const uint32_t slot = store_index(kv).find_ready(keys[i]);
    ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
    const cxlkv_index_entry good = d.read_fresh(line(slot));
    const uint64_t room = 1023 - good.loc_off % CXLKV_OWNER_GRANULE;  // shifts that stay in the granule
    ASSERT_GT(room, 0u) << "block " << i << " starts at the granule's last byte";
    for (uint64_t shift : {uint64_t{1}, (room + 1) / 2, room}) {
      SCOPED_TRACE("block " + std::to_string(i) + " moved by " + std::to_string(shift) + " bytes");
      cxlkv_index_entry e = good;
      e.loc_off += shift;
      e.check = cxlkv_index_entry_check(&e);
      d.publish_line(line(slot), &e);  // rule 1: whole line, NT
      d.fence();
      auto pin = kv.pin(keys[i]);
      ASSERT_FALSE(pin.ok()) << "an entry moved inside its granule was pinned";
      EXPECT_EQ(pin.error().code(), -EBADMSG) << pin.error().message();
      const std::string m = pin.error().message();
      EXPECT_NE(m.find(to_hex(keys[i])), std::string::npos) << m;
      EXPECT_NE(m.find("moved inside its allocation granule"), std::string::npos) << m;
      std::vector<std::byte> got;
      EXPECT_EQ(get(i, got), -EBADMSG);
      for (std::byte x : got) ASSERT_EQ(x, std::byte{0x5A}) << "the caller's buffer was written";
      refused += 2;
    }
    d.publish_line(line(slot), &good);
    d.fence();
    std::vector<std::byte> got;
    ASSERT_EQ(get(i, got), 0) << kv.last_block_error();
    for (size_t j = 0; j < got.size(); j++) ASSERT_EQ(got[j], pattern(i, j)) << "block " << i << " byte " << j;
  }
  EXPECT_EQ(store_index(kv).counters().overlap_refusals - refusals0, uint64_t(refused));
}

}  // namespace cxlkv

namespace cxlkv {

namespace {
// Publishes keys as one chain (each block the child of the one before).
void publish_chain(KvStore& kv, const std::vector<BlockKey>& keys) {
  for (size_t i = 0; i < keys.size(); i++) {
    std::vector<std::byte> buf(4096, std::byte(0x30 + i));
    Chunk ch{buf.data(), buf.size()};
    auto r = kv.reserve(keys[i], i ? &keys[i - 1] : nullptr, buf.size());
    ASSERT_TRUE(r.ok() && r->reserved()) << "block " << i;
    ASSERT_TRUE(kv.write(*r, {&ch, 1}).ok());
    ASSERT_TRUE(kv.publish(*r).ok());
  }
}

// Sets the children field of `key`'s entry to `children`, as a writer that
// died between raising a count and adding the child leaves it: the whole
// line with its check recomputed, published through the pool's domain.
cxlkv_index_entry* forge_children(ShmKv& p, KvStore& kv, const BlockKey& key, uint32_t children) {
  MemoryDomain& d = p.region->domain();
  auto* line = reinterpret_cast<cxlkv_index_entry*>(p.index_carve() + store_index(kv).header().entry_off +
                                                    store_index(kv).find_ready(key) * 64ull);
  cxlkv_index_entry e = d.read_fresh(line);
  e.children = children;
  e.check = cxlkv_index_entry_check(&e);
  d.publish_line(line, &e);  // rule 1: whole line, NT
  d.fence();
  return line;
}
}  // namespace

// cxlkvctl kv check: a READY block whose children count is one above the
// cached blocks naming it (it can never be evicted) is reported with its
// key, slot, state and both counts; a sound chain reports nothing.
TEST(IndexIntegrity, TheChildCountAuditNamesABlockWhoseCountNoChildAccountsFor) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  auto keys = keys_from_ids(std::vector<uint64_t>{1301, 1302, 1303});
  publish_chain(kv, keys);
  auto sound = index_audit(*p.region, p.region->domain(), std::chrono::milliseconds(0));
  ASSERT_TRUE(sound.ok()) << sound.error().message();
  EXPECT_EQ(sound->children_mismatches(), 0u) << describe_child_count_mismatch(sound->child_counts.front());
  EXPECT_EQ(sound->problems(), 0u);

  forge_children(p, kv, keys[1], 2);  // one child cached (keys[2])
  auto found = index_audit(*p.region, p.region->domain(), std::chrono::milliseconds(20));
  ASSERT_TRUE(found.ok()) << found.error().message();
  ASSERT_EQ(found->children_mismatches(), 1u);
  EXPECT_EQ(found->problems(), 1u);
  const ChildCountMismatch& m = found->child_counts[0];
  EXPECT_EQ(m.slot, store_index(kv).find_ready(keys[1]));
  EXPECT_EQ(m.key, keys[1]);
  EXPECT_EQ(m.state, uint32_t{CXLKV_ENTRY_READY});
  EXPECT_EQ(m.stored, 2u);
  EXPECT_EQ(m.found, 1u);
  const auto lines = found->lines(*p.region);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("pool " + p.uri + ": index carve: block " + to_hex(keys[1]) + " (index slot " +
                          std::to_string(m.slot) + ", READY): children count 2, but 1 live block names it as parent"),
            std::string::npos)
      << lines[0];
}

// A count below its children (the block could be evicted under them) is
// a finding too: the leaf's count dropped to 0 by a forged line.
TEST(IndexIntegrity, TheChildCountAuditNamesABlockCountingFewerChildrenThanNameIt) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  auto keys = keys_from_ids(std::vector<uint64_t>{1401, 1402});
  publish_chain(kv, keys);
  forge_children(p, kv, keys[0], 0);
  auto found = index_audit_child_counts(*p.region, p.region->domain(), std::chrono::milliseconds(0));
  ASSERT_TRUE(found.ok()) << found.error().message();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].key, keys[0]);
  EXPECT_EQ((*found)[0].stored, 0u);
  EXPECT_EQ((*found)[0].found, 1u);
}

// The snapshots are lock-free, so a count a live writer is changing can
// read as a mismatch once: only a mismatch seen identically in both
// snapshots, `settle` apart, is reported.  Here the count is right again
// (written back) during the pause.
TEST(IndexIntegrity, TheChildCountAuditDoesNotReportACountThatChangesWhileItSettles) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  KvStore& kv = p.session->store();
  auto keys = keys_from_ids(std::vector<uint64_t>{1501, 1502});
  publish_chain(kv, keys);
  forge_children(p, kv, keys[0], 2);
  auto once = index_audit_child_counts(*p.region, p.region->domain(), std::chrono::milliseconds(0));
  ASSERT_TRUE(once.ok() && once->size() == 1u) << "a single snapshot sees the raised count";
  std::thread fixer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    forge_children(p, kv, keys[0], 1);  // the writer's change lands
  });
  auto settled = index_audit_child_counts(*p.region, p.region->domain(), std::chrono::milliseconds(1500));
  fixer.join();
  ASSERT_TRUE(settled.ok()) << settled.error().message();
  EXPECT_TRUE(settled->empty()) << describe_child_count_mismatch(settled->front());
}

namespace {
// A READY block whose count stays one above its children, as a process that
// died between removing a child and dropping its parent's count leaves it:
// the count raised by a forged line while its child is cached (a block with
// a child is on no eviction list), then the child removed as kv rm does
// (the count drops by one, to 1, with no child left).  Returns its slot.
uint32_t leave_stale_count(ShmKv& p, KvStore& kv, const std::vector<BlockKey>& keys) {
  publish_chain(kv, keys);
  forge_children(p, kv, keys[0], 2);
  EXPECT_TRUE(store_index(kv).remove(keys[1]).ok());
  return store_index(kv).find_ready(keys[0]);
}

// The node's processes stop: its session closes, it detaches, and (this
// test's process living on, so its node would count as live) the operator
// marks it evicted.
void stop_the_node(ShmKv& p) {
  p.session.reset();
  const std::string local = p.node->local_shm_name();
  p.node.reset();
  shm_unlink(("/" + local).c_str());
  ASSERT_TRUE(evict_node(*p.region, p.region->domain(), 1, /*force=*/true).ok());
}

void attach_again(ShmKv& p) {
  NodeOptions no;
  no.node = 1;
  auto n = NodeContext::attach(*p.region, no);
  ASSERT_TRUE(n.ok()) << n.error().message();
  p.node = std::move(n.value());
  ASSERT_TRUE(p.open().ok());
}
}  // namespace

// cxlkvctl kv check --repair, offline: refused while a node is live (the
// message names it and writes nothing); with none, the stale count is set
// to the children found, the block joins its eviction list, the audit then
// reports nothing, and once a node attaches again the lists are sound and
// an eviction takes the block.
TEST(IndexIntegrity, TheOfflineRepairSetsAStaleCountToTheChildrenFoundAndTheBlockIsEvictedAfter) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  auto keys = keys_from_ids(std::vector<uint64_t>{1601, 1602});
  const uint32_t slot = leave_stale_count(p, p.session->store(), keys);
  PrefixIndex& ix = store_index(p.session->store());
  ASSERT_NE(slot, CXLKV_INDEX_NO_SLOT);
  ASSERT_EQ(ix.entry(slot).children, 1u);
  ASSERT_FALSE(ix.entry(slot).linked);
  auto stuck = ix.remove(keys[0]);
  ASSERT_FALSE(stuck.ok());
  EXPECT_EQ(stuck.error().code(), -ENOTEMPTY) << "the stale count keeps the block";
  MemoryDomain& d = p.region->domain();

  auto refused = index_repair_child_counts(*p.region, d);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), -EBUSY);
  EXPECT_NE(refused.error().message().find("pool " + p.uri + ": refusing to repair children counts while nodes "
                                           "are live: node 1 (pid " + std::to_string(getpid()) + " on "),
            std::string::npos)
      << refused.error().message();
  EXPECT_EQ(ix.entry(slot).children, 1u) << "nothing written while a node is live";

  ASSERT_NO_FATAL_FAILURE(stop_the_node(p));
  auto rep = index_repair_child_counts(*p.region, d);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  ASSERT_EQ(rep->repaired.size(), 1u);
  const ChildCountRepair& r = rep->repaired[0];
  EXPECT_EQ(r.was.slot, slot);
  EXPECT_EQ(r.was.key, keys[0]);
  EXPECT_EQ(r.was.stored, 1u);
  EXPECT_EQ(r.was.found, 0u);
  EXPECT_TRUE(r.listed);
  EXPECT_TRUE(rep->changed.empty());
  EXPECT_EQ(rep->attached_meanwhile, "");
  EXPECT_EQ(describe_child_count_repair(r), "block " + to_hex(keys[0]) + " (index slot " + std::to_string(slot) +
                                                ", READY): children 1 -> 0, a leaf on its stripe's eviction list "
                                                "(evictable)");
  auto after = index_audit(*p.region, d, std::chrono::milliseconds(0));
  ASSERT_TRUE(after.ok()) << after.error().message();
  EXPECT_EQ(after->problems(), 0u);
  auto again = index_repair_child_counts(*p.region, d);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_TRUE(again->repaired.empty()) << "a sound pool has nothing to repair";

  ASSERT_NO_FATAL_FAILURE(attach_again(p));
  PrefixIndex& back = store_index(p.session->store());
  std::string first;
  EXPECT_EQ(back.audit_lists(&first), 0u) << first;
  EXPECT_EQ(back.entry(slot).children, 0u);
  EXPECT_TRUE(back.entry(slot).linked);
  auto ev = back.evict_any();
  ASSERT_TRUE(ev.ok()) << ev.error().message();
  EXPECT_TRUE(ev.value());
  EXPECT_EQ(back.find_ready(keys[0]), CXLKV_INDEX_NO_SLOT) << "the block was evicted";
}

// A count below the children naming the block (it could be evicted under
// them) is raised to the children found; the block stays off the lists.
TEST(IndexIntegrity, TheOfflineRepairRaisesACountBelowItsChildren) {
  ShmKv p;
  ASSERT_TRUE(p.open().ok());
  auto keys = keys_from_ids(std::vector<uint64_t>{1701, 1702});
  publish_chain(p.session->store(), keys);
  forge_children(p, p.session->store(), keys[0], 0);
  const uint32_t slot = store_index(p.session->store()).find_ready(keys[0]);
  ASSERT_NO_FATAL_FAILURE(stop_the_node(p));
  auto rep = index_repair_child_counts(*p.region, p.region->domain());
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  ASSERT_EQ(rep->repaired.size(), 1u);
  EXPECT_EQ(rep->repaired[0].was.stored, 0u);
  EXPECT_EQ(rep->repaired[0].was.found, 1u);
  EXPECT_FALSE(rep->repaired[0].listed);
  ASSERT_NO_FATAL_FAILURE(attach_again(p));
  PrefixIndex& ix = store_index(p.session->store());
  EXPECT_EQ(ix.entry(slot).children, 1u);
  std::string first;
  EXPECT_EQ(ix.audit_lists(&first), 0u) << first;
  auto rm = ix.remove(keys[0]);
  ASSERT_FALSE(rm.ok());
  EXPECT_EQ(rm.error().code(), -ENOTEMPTY) << "prefix closure holds again";
}

}  // namespace cxlkv
