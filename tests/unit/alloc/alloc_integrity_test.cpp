// SPDX-License-Identifier: MIT
// The allocator never hands out space that is in use.
//  * A zeroed or damaged chunk bitmap is refused (bitmap checksum in the
//    alloc state line), so no published block is overwritten.
//  * Space taken from a node declared dead is quarantined, never handed out
//    until released (under NonCoherentSim with random evictions).
//  * A damaged or outdated alloc header is refused at open naming the field.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "carve/alloc_layout.hpp"
#include "cxlkv/alloc.hpp"
#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"
#include "support/lock_test_pool.hpp"
#include "pool/format.hpp"

namespace cxlkv {
namespace {

using namespace std::chrono_literals;
using testpool::TestPool;

struct ShmKv {
  ShmKv() {
    uri = "shm:cxlkv-allocint-" + std::to_string(getpid()) + ":64M";
    PoolFormatOptions fo;
    fo.force = true;
    region = std::move(format_pool(uri, fo).value());
    mgr = std::move(LockManager::create(*region).value());
    mgr->start();
    NodeOptions no;
    no.node = 1;
    node = std::move(NodeContext::attach(*region, no).value());
    auto s = open_kv_session(*region, *node);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message());
    session = std::move(s.value());
  }
  ~ShmKv() {
    session.reset();
    const std::string local = node->local_shm_name();
    node.reset();
    shm_unlink(("/" + local).c_str());  // this node's node-local file
    mgr->stop();
    mgr.reset();
    region.reset();
    shm_unlink(("/cxlkv-allocint-" + std::to_string(getpid())).c_str());
  }
  KvStore& kv() { return session->store(); }
  Result<void> put(const BlockKey& k, uint64_t bytes, std::byte fill) {
    std::vector<std::byte> buf(bytes, fill);
    Chunk ch{buf.data(), buf.size()};
    auto r = kv().reserve(k, nullptr, bytes);
    if (!r) return r.error();
    if (!r->reserved()) return Error(-EEXIST, "not reserved");
    CXLKV_TRY(kv().write(*r, {&ch, 1}));
    return kv().publish(*r);
  }
  size_t wrong_bytes(const BlockKey& k, uint64_t bytes, std::byte fill) {
    std::vector<std::byte> got(bytes);
    Chunk ch{got.data(), got.size()};
    std::vector<int32_t> st(1);
    std::vector<uint32_t> nch(1, 1);
    auto g = kv().get_many({&k, 1}, {&ch, 1}, nch, st);
    if (!g || g.value() != 1) return bytes;
    size_t wrong = 0;
    for (std::byte b : got) wrong += b != fill;
    return wrong;
  }
  std::string uri;
  std::unique_ptr<Region> region;
  std::unique_ptr<LockManager> mgr;
  std::unique_ptr<NodeContext> node;
  std::unique_ptr<KvSession> session;
};

BlockKey key_of(uint64_t id) {
  std::vector<uint64_t> ids = {id};
  return keys_from_ids(ids)[0];
}

// A forger with write access to the alloc carve: the chunk bitmap zeroed
// and the state line's bitmap checksum recomputed to match it, NT stores
// through `d` (rule 1), fenced (rule 3).
void zero_bitmap_with_its_checksum(ChunkAllocator& ca, MemoryDomain& d) {
  const cxlkv_alloc_header& h = ca.header();
  auto* words = reinterpret_cast<uint64_t*>(ca.carve_base() + h.bitmap_off);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < (h.nchunks + 63) / 64; i++) {
    const uint64_t zero = 0;
    d.store_nt(&words[i], &zero, sizeof zero);
    sum ^= cxlkv_bitmap_word_sum(i, 0);
  }
  auto* st = reinterpret_cast<cxlkv_alloc_state*>(ca.carve_base() + h.state_off);
  d.store_nt(&st->bitmap_sum, &sum, sizeof sum);
  d.fence();
}

// Publishes 2 MiB blocks (fill 0xEE) from `kv` until one is placed over
// chunk `c`; its key, or nullopt.
std::optional<BlockKey> put_over_chunk(KvStore& kv, ChunkAllocator& ca, uint64_t c, uint64_t first_id) {
  constexpr uint64_t kBig = 2ull << 20;
  std::vector<std::byte> buf(kBig, std::byte{0xEE});
  for (uint64_t i = 0; i < 40; i++) {
    const BlockKey k = key_of(first_id + i);
    Chunk ch{buf.data(), buf.size()};
    std::vector<uint32_t> n1(1, 1);
    std::vector<int32_t> st(1, 99);
    auto n = kv.put_chain(nullptr, {&k, 1}, kBig, {&ch, 1}, n1, st);
    if (!n || n.value() != 1) return std::nullopt;
    const uint32_t slot = store_index(kv).find_ready(k);
    if (slot != CXLKV_INDEX_NO_SLOT && ca.chunk_of(store_index(kv).entry(slot).loc.offset) == c) return k;
  }
  return std::nullopt;
}

// Reads `k` (fill `fill`, `bytes` long) through `kv`: its status, and
// whether it returned any byte but `fill` with status 0.
int32_t read_back(KvStore& kv, const BlockKey& k, uint64_t bytes, std::byte fill, bool* wrong_with_0) {
  std::vector<std::byte> got(bytes, std::byte{0});
  Chunk ch{got.data(), got.size()};
  std::vector<int32_t> st(1, 99);
  std::vector<uint32_t> n1(1, 1);
  auto g = kv.get_many({&k, 1}, {&ch, 1}, n1, st);
  const int32_t code = g ? st[0] : g.error().code();
  *wrong_with_0 = false;
  if (code == 0)
    for (std::byte b : got) *wrong_with_0 |= b != fill;
  return code;
}

}  // namespace

// The case: a zeroed bitmap let new allocations overwrite every
// published block.  Now the allocation is refused with a message naming
// the pool and the bitmap, and every published block reads back exact.
TEST(AllocIntegrity, AZeroedBitmapIsRefusedAndNoPublishedBlockIsOverwritten) {
  ShmKv p;
  constexpr uint64_t kBig = 2ull << 20, kSmall = 4096;
  for (uint64_t i = 0; i < 8; i++) ASSERT_TRUE(p.put(key_of(100 + i), kBig, std::byte(0x10 + i)).ok());
  for (uint64_t i = 0; i < 8; i++) ASSERT_TRUE(p.put(key_of(200 + i), kSmall, std::byte(0x40 + i)).ok());
  auto chunks = ChunkAllocator::open(*p.node);
  ASSERT_TRUE(chunks.ok());
  ASSERT_TRUE(chunks->check_bitmap().ok());

  const auto& h = chunks->header();
  std::byte* bitmap = chunks->carve_base() + h.bitmap_off;
  std::memset(bitmap, 0, (h.nchunks + 63) / 64 * 8);
  p.region->domain().flush(bitmap, (h.nchunks + 63) / 64 * 8);
  p.region->domain().fence();

  auto chk = chunks->check_bitmap();
  ASSERT_FALSE(chk.ok());
  EXPECT_EQ(chk.error().code(), -EUCLEAN);
  EXPECT_NE(chk.error().message().find(p.uri), std::string::npos) << chk.error().message();
  EXPECT_NE(chk.error().message().find("bitmap"), std::string::npos) << chk.error().message();
  auto put = p.put(key_of(300), kBig, std::byte{0xEE});
  ASSERT_FALSE(put.ok()) << "a block was placed by a zeroed bitmap";
  EXPECT_NE(put.error().message().find("bitmap"), std::string::npos) << put.error().message();
  auto run = chunks->alloc_run(1, false, 0);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.error().code(), -EUCLEAN);
  for (uint64_t i = 0; i < 8; i++) EXPECT_EQ(p.wrong_bytes(key_of(100 + i), kBig, std::byte(0x10 + i)), 0u) << i;
  for (uint64_t i = 0; i < 8; i++) EXPECT_EQ(p.wrong_bytes(key_of(200 + i), kSmall, std::byte(0x40 + i)), 0u) << i;
}

// A forger who zeroes the bitmap and recomputes its checksum gets past the
// bitmap check: the allocator hands out the chunk of published 8 KiB blocks
// as a run for a new 2 MiB block, whose writer overwrites them while their
// index entries and owner records stay as they were (re-reads returned the
// new bytes with status 0).  A fetch now checks after its copy that each
// block's space is still allocated as that block (chunk descriptor and owner
// record): every overwritten block fails with -EIO naming it, none returns
// another block's bytes with status 0.
TEST(AllocIntegrity, AZeroedBitmapWithAMatchingChecksumNeverServesOverwrittenBytes) {
  ShmKv p;
  constexpr uint64_t kSmall = 8192;
  for (uint64_t i = 0; i < 8; i++) ASSERT_TRUE(p.put(key_of(400 + i), kSmall, std::byte(0x60 + i)).ok());
  auto chunks = ChunkAllocator::open(*p.node);
  ASSERT_TRUE(chunks.ok());
  const uint32_t slot0 = store_index(p.kv()).find_ready(key_of(400));
  ASSERT_NE(slot0, CXLKV_INDEX_NO_SLOT);
  const uint64_t c = chunks->chunk_of(store_index(p.kv()).entry(slot0).loc.offset);
  zero_bitmap_with_its_checksum(*chunks, p.region->domain());
  ASSERT_TRUE(chunks->check_bitmap().ok()) << "the forged bitmap should add up to its checksum";

  auto over = put_over_chunk(p.kv(), *chunks, c, 900);
  ASSERT_TRUE(over.has_value()) << "no new block was placed over chunk " << c;
  int refused = 0;
  for (uint64_t i = 0; i < 8; i++) {
    bool wrong = false;
    const int32_t st = read_back(p.kv(), key_of(400 + i), kSmall, std::byte(0x60 + i), &wrong);
    EXPECT_FALSE(wrong) << "block " << i << " returned another block's bytes with status 0";
    if (st == 0) continue;
    EXPECT_EQ(st, -EIO) << i << ": " << p.kv().last_block_error();
    EXPECT_NE(p.kv().last_block_error().find(to_hex(key_of(400 + i))), std::string::npos)
        << p.kv().last_block_error();
    refused++;
  }
  EXPECT_EQ(refused, 8) << "every block under the new one is overwritten";
  EXPECT_NE(p.kv().last_block_error().find("handed out again"), std::string::npos) << p.kv().last_block_error();
  bool wrong = false;
  EXPECT_EQ(read_back(p.kv(), *over, 2ull << 20, std::byte{0xEE}, &wrong), 0) << p.kv().last_block_error();
  EXPECT_FALSE(wrong);
}

// The same across nodes under NonCoherentSim with random evictions: node 0
// publishes, node 1 forges the bitmap and publishes over node 0's chunk,
// node 2 reads: its check after the copy reads the allocator's lines fresh
// (rule 4), so it sees node 1's descriptor and owner record, never serving
// node 1's bytes as node 0's blocks.
TEST(AllocIntegrity, AFetchSeesItsSpaceHandedOutAgainByAnotherNodeUnderNonCoherentSim) {
  setenv("CXLKV_DRAIN_PERIOD_MS", "0", 1);  // no drainer thread on the simulated nodes
  TestPool p("alloc-reuse", 64ull << 20);
  p.simulate(4, 0.05, 11);
  std::vector<NodeContext*> ctx;
  for (uint32_t n = 0; n < 3; n++) ctx.push_back(&p.attach(n));
  LockManagerOptions mo;
  mo.node = 3;
  auto m = LockManager::create(*p.region, p.domain(3), mo);
  ASSERT_TRUE(m.ok()) << m.error().message();
  m.value()->start();
  {
    std::vector<std::unique_ptr<KvSession>> s;
    for (uint32_t n = 0; n < 3; n++) {
      auto r = open_kv_session(*p.region, *ctx[n]);
      ASSERT_TRUE(r.ok()) << r.error().message();
      s.push_back(std::move(r.value()));
    }
    constexpr uint64_t kSmall = 8192;
    for (uint64_t i = 0; i < 8; i++) {
      const BlockKey k = key_of(500 + i);
      std::vector<std::byte> buf(kSmall, std::byte(0x30 + i));
      Chunk ch{buf.data(), buf.size()};
      std::vector<uint32_t> n1(1, 1);
      std::vector<int32_t> st(1, 99);
      auto n = s[0]->store().put_chain(nullptr, {&k, 1}, kSmall, {&ch, 1}, n1, st);
      ASSERT_TRUE(n && n.value() == 1) << s[0]->store().last_block_error();
    }
    for (uint64_t i = 0; i < 8; i++) {  // sound: node 2 reads every block
      bool wrong = false;
      ASSERT_EQ(read_back(s[2]->store(), key_of(500 + i), kSmall, std::byte(0x30 + i), &wrong), 0)
          << s[2]->store().last_block_error();
      ASSERT_FALSE(wrong);
    }
    auto chunks = ChunkAllocator::open(*ctx[1]);
    ASSERT_TRUE(chunks.ok());
    const uint32_t slot0 = store_index(s[1]->store()).find_ready(key_of(500));
    ASSERT_NE(slot0, CXLKV_INDEX_NO_SLOT);
    const uint64_t c = chunks->chunk_of(store_index(s[1]->store()).entry(slot0).loc.offset);
    zero_bitmap_with_its_checksum(*chunks, p.domain(1));
    auto over = put_over_chunk(s[1]->store(), *chunks, c, 950);
    ASSERT_TRUE(over.has_value()) << "no new block was placed over chunk " << c;
    int refused = 0;
    for (uint64_t i = 0; i < 8; i++) {
      bool wrong = false;
      const int32_t st = read_back(s[2]->store(), key_of(500 + i), kSmall, std::byte(0x30 + i), &wrong);
      EXPECT_FALSE(wrong) << "block " << i << " returned node 1's bytes with status 0";
      if (st != 0) refused++;
    }
    EXPECT_EQ(refused, 8);
  }
  m.value()->stop();
  unsetenv("CXLKV_DRAIN_PERIOD_MS");
}

// A single flipped bit is caught as well (not only a zeroed bitmap).
TEST(AllocIntegrity, AFlippedBitmapBitIsRefused) {
  ShmKv p;
  ASSERT_TRUE(p.put(key_of(1), 2ull << 20, std::byte{1}).ok());
  auto chunks = ChunkAllocator::open(*p.node);
  ASSERT_TRUE(chunks.ok());
  auto* w = reinterpret_cast<uint64_t*>(chunks->carve_base() + chunks->header().bitmap_off);
  *w ^= 1ull << 5;
  p.region->domain().flush(w, 8);
  p.region->domain().fence();
  auto run = chunks->alloc_run(1, false, 0);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.error().code(), -EUCLEAN);
  *w ^= 1ull << 5;
  p.region->domain().flush(w, 8);
  p.region->domain().fence();
  EXPECT_TRUE(chunks->check_bitmap().ok()) << "restored: accepted again";
}

// Quarantine under NonCoherentSim with random evictions: node 1 takes a
// whole-chunk block of node 0 (declared dead) into quarantine; nodes 1 and
// 2 allocate the whole carve and never get it; after the period it is
// released and allocated again; the bitmap adds up throughout.
TEST(AllocIntegrity, AQuarantinedRunIsNeverHandedOutUntilReleasedUnderNonCoherentSim) {
  TestPool p("alloc-quarantine", 64ull << 20);
  p.simulate(4, 0.05, 3);
  std::vector<NodeContext*> ctx;
  for (uint32_t n = 0; n < 3; n++) ctx.push_back(&p.attach(n));
  LockManagerOptions mo;
  mo.node = 3;
  auto m = LockManager::create(*p.region, p.domain(3), mo);
  ASSERT_TRUE(m.ok()) << m.error().message();
  m.value()->start();
  set_reclaim_quarantine(400ms);
  {
    auto h0 = NodeHeap::open(*ctx[0]);
    auto h1 = NodeHeap::open(*ctx[1]);
    auto h2 = NodeHeap::open(*ctx[2]);
    ASSERT_TRUE(h0.ok() && h1.ok() && h2.ok());
    const uint64_t big = 2ull << 20;
    auto taken = h0.value()->alloc(big);
    ASSERT_TRUE(taken.ok());
    const uint32_t inc0 = static_cast<uint32_t>(p.domain(0).read_fresh(ctx[0]->control().node_entry(0)).incarnation);
    ASSERT_TRUE(h1.value()->free_taken(taken.value(), 0, inc0).ok());
    EXPECT_EQ(h1.value()->chunks().quarantined_chunks(), 1u);
    auto again = h1.value()->free(taken.value());
    ASSERT_FALSE(again.ok()) << "a quarantined block cannot be freed a second time";
    EXPECT_NE(again.error().message().find("quarantine"), std::string::npos) << again.error().message();

    std::set<uint64_t> got;
    for (int i = 0;; i++) {
      auto off = (i % 2 ? h1 : h2).value()->alloc(big);
      if (!off) {
        EXPECT_EQ(off.error().code(), -ENOSPC) << off.error().message();
        EXPECT_NE(off.error().message().find("quarantine"), std::string::npos) << off.error().message();
        break;
      }
      EXPECT_NE(off.value(), taken.value()) << "quarantined space handed out";
      got.insert(off.value());
      ASSERT_LT(i, 1000);
    }
    EXPECT_GT(got.size(), 10u);
    std::this_thread::sleep_for(450ms);
    auto off = h2.value()->alloc(big);
    ASSERT_TRUE(off.ok()) << off.error().message();
    EXPECT_EQ(off.value(), taken.value()) << "released after the period and reused";
    EXPECT_EQ(h2.value()->chunks().quarantined_chunks(), 0u);
    EXPECT_TRUE(h2.value()->chunks().check_bitmap().ok());
  }
  set_reclaim_quarantine(std::chrono::minutes(10));
  m.value()->stop();
}

// A node of this host whose process is gone cannot store anything: its
// space is freed at once, not quarantined.
TEST(AllocIntegrity, SpaceOfAGoneLocalProcessIsFreedAtOnce) {
  TestPool p("alloc-gone", 64ull << 20);
  std::vector<NodeContext*> ctx;
  for (uint32_t n = 0; n < 2; n++) ctx.push_back(&p.attach(n));
  LockManagerOptions mo;
  mo.node = 2;
  auto m = LockManager::create(*p.region, p.region->domain(), mo);
  ASSERT_TRUE(m.ok());
  m.value()->start();
  {
    auto h0 = NodeHeap::open(*ctx[0]);
    auto h1 = NodeHeap::open(*ctx[1]);
    ASSERT_TRUE(h0.ok() && h1.ok());
    auto taken = h0.value()->alloc(2ull << 20);
    ASSERT_TRUE(taken.ok());
    // Make node 0's entry name a process that is gone (a reaped child).
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, nullptr, 0);
    auto* e = ctx[0]->control().node_entry(0);
    cxlkv_node_entry v = p.region->domain().read_fresh(e);
    v.pid = static_cast<uint32_t>(child);
    v.start_time = 12345;
    p.region->domain().publish_line(e, &v);
    p.region->domain().fence();
    ASSERT_TRUE(h1.value()->free_taken(taken.value(), 0, static_cast<uint32_t>(v.incarnation)).ok());
    EXPECT_EQ(h1.value()->chunks().quarantined_chunks(), 0u);
    auto off = h1.value()->alloc(2ull << 20);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(off.value(), taken.value());
  }
  m.value()->stop();
}

// A damaged field that still looks plausible is caught by the header
// checksum; an older layout is a clear error saying to reformat.
TEST(AllocIntegrity, HeaderChecksumAndLayoutVersionAreChecked) {
  std::string path = "/tmp/cxlkv-allocint-hdr-" + std::to_string(getpid());
  std::remove(path.c_str());
  PoolFormatOptions o;
  o.size = 64ull << 20;
  auto r = format_pool("file:" + path, o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  Region& region = *r.value();
  auto carve = region.carve(CXLKV_CARVE_ALLOC);
  auto* h = reinterpret_cast<cxlkv_alloc_header*>(region.at(carve->offset));
  const cxlkv_alloc_header good = *h;
  ASSERT_TRUE(alloc::read_alloc_header(region, region.domain()).ok());
  struct Case {
    const char* what;
    size_t at;
    uint64_t value;
    const char* names;
  };
  const Case cases[] = {
      {"checksum flipped", offsetof(cxlkv_alloc_header, checksum), good.checksum ^ 1, "checksum"},
      {"objstore_bytes off by one", offsetof(cxlkv_alloc_header, objstore_bytes), good.objstore_bytes + 1,
       "checksum"},
      {"state_off", offsetof(cxlkv_alloc_header, state_off), good.state_off + 64, "state_off"},
      {"bitmap_off", offsetof(cxlkv_alloc_header, bitmap_off), good.bitmap_off + 64, "bitmap_off"},
      {"chunk_table_off", offsetof(cxlkv_alloc_header, chunk_table_off), 1ull << 62, "chunk_table_off"},
      {"inbox_off", offsetof(cxlkv_alloc_header, inbox_off), UINT64_MAX - 63, "inbox_off"},
      {"pending_off", offsetof(cxlkv_alloc_header, pending_off), 0, "pending_off"},
      {"pending_stride", offsetof(cxlkv_alloc_header, pending_stride), 1ull << 40, "pending_stride"},
      {"remote_bits_off", offsetof(cxlkv_alloc_header, remote_bits_off), 64, "remote_bits_off"},
      {"remote_bits_stride", offsetof(cxlkv_alloc_header, remote_bits_stride), 0, "remote_bits_stride"},
      {"objstore_off", offsetof(cxlkv_alloc_header, objstore_off), 1ull << 63, "objstore_off"},
  };
  for (const Case& c : cases) {
    *h = good;
    std::memcpy(reinterpret_cast<std::byte*>(h) + c.at, &c.value, sizeof c.value);
    auto open = alloc::read_alloc_header(region, region.domain());
    ASSERT_FALSE(open.ok()) << c.what << " was accepted";
    EXPECT_EQ(open.error().code(), -EUCLEAN) << c.what;
    EXPECT_NE(open.error().message().find("alloc carve"), std::string::npos) << open.error().message();
    EXPECT_NE(open.error().message().find(c.names), std::string::npos) << c.what << ": " << open.error().message();
  }
  *h = good;
  h->max_nodes = good.max_nodes + 1;
  auto open = alloc::read_alloc_header(region, region.domain());
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.error().message().find("max_nodes"), std::string::npos) << open.error().message();
  *h = good;
  h->version = 1;
  open = alloc::read_alloc_header(region, region.domain());
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.error().code(), -EPROTO);
  EXPECT_NE(open.error().message().find("older"), std::string::npos) << open.error().message();
  EXPECT_NE(open.error().message().find("reformat"), std::string::npos) << open.error().message();
  *h = good;
  EXPECT_TRUE(alloc::read_alloc_header(region, region.domain()).ok());
  std::remove(path.c_str());
}

}  // namespace cxlkv
