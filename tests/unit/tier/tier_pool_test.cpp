// SPDX-License-Identifier: MIT
// SsdPool: placement across devices, round trips, and failures.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "cxlkv/tier.hpp"
#include "tier/fault_injector.hpp"
#include "tier/ssd_device.hpp"
#include "support/tier_test_support.hpp"

using cxlkv::FaultInjector;
using cxlkv::IoOp;
using cxlkv::SsdPool;
using cxlkv::SsdPoolOptions;
using cxlkv::SsdRead;
using cxlkv::SsdWrite;
using cxlkv::TierKind;
using cxlkv::TierLocation;
using cxlkv::tier::AlignedBuffer;
using tier_test::block_matches;
using tier_test::fill_block;

namespace {

constexpr uint32_t kBlock = 64 * 1024;

cxlkv::SsdDeviceConfig dev(const std::string& path, uint64_t bytes, double gbps = 0) {
  cxlkv::SsdDeviceConfig c;
  c.path = path;
  c.create_bytes = bytes;
  c.bandwidth_gbps = gbps;
  return c;
}

SsdPoolOptions small_pool() {
  SsdPoolOptions o;
  o.probe_bytes = 1 << 20;  // keep the probe short in tests
  return o;
}

std::unique_ptr<SsdPool> open_pool(const SsdPoolOptions& o) {
  auto p = SsdPool::open(o);
  EXPECT_TRUE(p) << (p ? "" : p.error().message());
  return p ? std::move(*p) : nullptr;
}

// Blocks with deterministic bytes; ids start at `first`.
struct Blocks {
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<SsdWrite> writes;
  std::vector<TierLocation> loc;
  std::vector<int> status;
  Blocks(size_t n, uint32_t len, uint64_t first = 0) {
    for (size_t i = 0; i < n; i++) {
      bytes.emplace_back(len);
      fill_block(bytes.back().data(), len, first + i);
    }
    for (auto& b : bytes) writes.push_back({b.data(), static_cast<uint32_t>(b.size())});
    loc.resize(n);
    status.assign(n, 1);
  }
};

// Reads every block back into fresh buffers; returns per-block status.
std::vector<int> read_back(SsdPool& pool, const std::vector<TierLocation>& loc,
                           std::vector<std::vector<unsigned char>>* out) {
  out->clear();
  std::vector<SsdRead> reads;
  for (auto& l : loc) out->emplace_back(l.length, 0xEE);
  for (size_t i = 0; i < loc.size(); i++) reads.push_back({loc[i], (*out)[i].data()});
  std::vector<int> st(loc.size(), 1);
  pool.read_blocks(reads, st);
  return st;
}

}  // namespace

TEST(TierPool, BandwidthIsProbedOnceThenReadFromTheDeviceHeader) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20)};
  {
    auto p = open_pool(o);
    ASSERT_TRUE(p);
    EXPECT_STREQ(p->device_info(0).bandwidth_source, "probe");
    EXPECT_GT(p->device_info(0).bandwidth_gbps, 0.0);
  }
  double probed;
  {
    auto p = open_pool(o);
    ASSERT_TRUE(p);
    EXPECT_STREQ(p->device_info(0).bandwidth_source, "cached");
    probed = p->device_info(0).bandwidth_gbps;
    EXPECT_GT(probed, 0.0);
  }
  o.devices[0].bandwidth_gbps = 7.5;  // configuration overrides the probe
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  EXPECT_STREQ(p->device_info(0).bandwidth_source, "config");
  EXPECT_DOUBLE_EQ(p->device_info(0).bandwidth_gbps, 7.5);
}

TEST(TierPool, TooSmallDeviceIsRefusedWithAClearError) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("tiny"), 64 * 1024)};
  auto p = SsdPool::open(o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("too small"), std::string::npos) << p.error().message();
}

TEST(TierPool, AFailedOpenRemovesTheFileItCreatedAndKeepsOneThatWasThere) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("tiny"), 64 * 1024)};
  auto p = SsdPool::open(o);
  ASSERT_FALSE(p);
  // A 64 KiB file stayed behind: the next open without a size took it for
  // the device and failed for another reason than the missing file.
  EXPECT_NE(access(dir.file("tiny").c_str(), F_OK), 0) << "the file the failed open created is still there";
  o.devices = {dev(dir.file("tiny"), 0)};
  auto again = SsdPool::open(o);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find("does not exist"), std::string::npos) << again.error().message();
  // A file that was there before is never removed.
  { std::FILE* f = std::fopen(dir.file("theirs").c_str(), "w"); ASSERT_TRUE(f); std::fputs("x", f); std::fclose(f); }
  o.devices = {dev(dir.file("theirs"), 64 * 1024)};
  ASSERT_FALSE(SsdPool::open(o));
  EXPECT_EQ(access(dir.file("theirs").c_str(), F_OK), 0);
}

TEST(TierPool, BatchIsPlacedWithinOneBlockOfTheBandwidthShares) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0), dev(dir.file("d1"), 32 << 20, 2.0),
               dev(dir.file("d2"), 32 << 20, 3.0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  for (size_t n : {6u, 7u, 60u, 61u}) {
    Blocks b(n, kBlock);
    p->write_blocks(b.writes, b.loc, b.status);
    std::map<uint16_t, int> per_dev;
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(b.status[i], 0);
      per_dev[b.loc[i].device]++;
    }
    const double share[] = {1.0 / 6, 2.0 / 6, 3.0 / 6};
    for (uint16_t d = 0; d < 3; d++)
      EXPECT_LT(std::fabs(per_dev[d] - share[d] * static_cast<double>(n)), 1.0) << "device " << d << " n " << n;
    for (auto& l : b.loc) p->release(l);
  }
  EXPECT_NEAR(p->device_info(2).placement_ratio, 0.5, 1e-12);
}

TEST(TierPool, ConsecutiveBlocksOfABatchShareOneContiguousExtentPerDevice) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0), dev(dir.file("d1"), 32 << 20, 1.0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks b(8, kBlock);  // layer-wise order: blocks 0-3 to device 0, 4-7 to device 1
  p->write_blocks(b.writes, b.loc, b.status);
  for (size_t i = 0; i < 8; i++) {
    ASSERT_EQ(b.status[i], 0);
    EXPECT_EQ(b.loc[i].device, i < 4 ? 0 : 1);
    EXPECT_EQ(b.loc[i].tier, TierKind::kSsd);
    if (i % 4) {
      EXPECT_EQ(b.loc[i].offset, b.loc[i - 1].offset + p->extent_bytes(0, kBlock));  // header block + payload
    }
  }
}

TEST(TierPool, RoundTripIsByteExactForAnySizeAndBufferAlignment) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer registered(8 * kBlock);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20), dev(dir.file("d1"), 32 << 20)};
  o.registered_memory = {registered.span()};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  // Odd lengths and byte-aligned heap buffers go through the staging path;
  // aligned whole-block buffers inside registered memory go direct.
  std::vector<std::vector<unsigned char>> odd;
  std::vector<SsdWrite> w;
  for (uint32_t len : {1u, 100u, 4095u, 4097u, 65536u + 7u, 2u * 1024u * 1024u}) {
    odd.emplace_back(len + 1);
    fill_block(odd.back().data() + 1, len, len);
    w.push_back({odd.back().data() + 1, len});
  }
  for (int i = 0; i < 8; i++) {
    fill_block(registered.data() + i * kBlock, kBlock, 1000 + i);
    w.push_back({registered.data() + i * kBlock, kBlock});
  }
  std::vector<TierLocation> loc(w.size());
  std::vector<int> st(w.size(), 1);
  p->write_blocks(w, loc, st);
  for (size_t i = 0; i < w.size(); i++) ASSERT_EQ(st[i], 0) << "block " << i;

  std::memset(registered.data(), 0, registered.size());
  std::vector<SsdRead> r;
  std::vector<std::vector<unsigned char>> back;
  for (size_t i = 0; i < odd.size(); i++) {
    back.emplace_back(loc[i].length);
    r.push_back({loc[i], back.back().data()});
  }
  for (int i = 0; i < 8; i++) r.push_back({loc[odd.size() + i], registered.data() + i * kBlock});
  std::vector<int> rs(r.size(), 1);
  p->read_blocks(r, rs);
  for (size_t i = 0; i < odd.size(); i++) {
    ASSERT_EQ(rs[i], 0);
    EXPECT_TRUE(block_matches(back[i].data(), back[i].size(), back[i].size())) << "length " << back[i].size();
  }
  for (int i = 0; i < 8; i++) {
    ASSERT_EQ(rs[odd.size() + i], 0);
    EXPECT_TRUE(block_matches(registered.data() + i * kBlock, kBlock, 1000 + i)) << "registered block " << i;
  }
}

TEST(TierPool, RoundTripOnTwoLoopDevicesIsByteExact) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  tier_test::LoopDevice l0(dir.file("l0.img"), 32 << 20), l1(dir.file("l1.img"), 32 << 20, 4096);
  TIER_REQUIRE_LOOP(l0);
  TIER_REQUIRE_LOOP(l1);
  auto o = small_pool();
  o.devices = {dev(l0.path(), 0), dev(l1.path(), 0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->device_info(0).block_device);
  EXPECT_EQ(p->device_info(1).logical_block, 4096u);
  Blocks b(24, kBlock + 512);  // not a multiple of 4096: padded on device 1
  p->write_blocks(b.writes, b.loc, b.status);
  for (int s : b.status) ASSERT_EQ(s, 0);
  for (auto& l : b.loc) EXPECT_EQ(l.offset % p->device_info(l.device).logical_block, 0u);
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, b.loc, &back);
  for (size_t i = 0; i < back.size(); i++) {
    ASSERT_EQ(st[i], 0);
    EXPECT_TRUE(block_matches(back[i].data(), back[i].size(), i)) << "block " << i;
  }
}

TEST(TierPool, TruncatedFileLosesItsTailBlocksAndTheTierKeepsServing) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks b(8, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  for (int s : b.status) ASSERT_EQ(s, 0);
  // Someone truncates the file under the pool: blocks 2.. are gone.
  ASSERT_EQ(truncate(dir.file("d0").c_str(), static_cast<off_t>(b.loc[2].offset)), 0);
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, b.loc, &back);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  EXPECT_TRUE(block_matches(back[1].data(), kBlock, 1));
  for (size_t i = 2; i < 8; i++) EXPECT_EQ(st[i], -EBADMSG) << "block " << i << " must be reported lost";
  EXPECT_EQ(p->lost_blocks(), 6u);
  EXPECT_EQ(p->device_info(0).short_reads, 6u);
  EXPECT_TRUE(p->device_info(0).online);  // the device itself answered
  // It keeps serving: new blocks are written and read back.
  for (size_t i = 2; i < 8; i++) p->release(b.loc[i]);
  Blocks c(4, kBlock, 500);
  p->write_blocks(c.writes, c.loc, c.status);
  for (int s : c.status) ASSERT_EQ(s, 0);
  st = read_back(*p, c.loc, &back);
  for (size_t i = 0; i < 4; i++) {
    ASSERT_EQ(st[i], 0);
    EXPECT_TRUE(block_matches(back[i].data(), kBlock, 500 + i));
  }
}

TEST(TierPool, LoopDeviceShrunkUnderneathReportsLostBlocks) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  tier_test::LoopDevice l0(dir.file("l0.img"), 32 << 20);
  TIER_REQUIRE_LOOP(l0);
  auto o = small_pool();
  o.devices = {dev(l0.path(), 0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks b(4, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  for (int s : b.status) ASSERT_EQ(s, 0);
  ASSERT_EQ(truncate(l0.backing().c_str(), static_cast<off_t>(b.loc[2].offset)), 0);
  ASSERT_TRUE(l0.refresh_capacity());
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, b.loc, &back);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  EXPECT_NE(st[2], 0);
  EXPECT_NE(st[3], 0);
  EXPECT_EQ(p->lost_blocks(), 2u);
}

TEST(TierPool, InjectedEioMarksOnlyThatBlockLostAndIsCounted) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto faults = std::make_shared<FaultInjector>();
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0), dev(dir.file("d1"), 32 << 20, 1.0)};
  o.faults = {faults};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks b(8, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  for (int s : b.status) ASSERT_EQ(s, 0);
  ASSERT_EQ(b.loc[1].device, 0);
  faults->fail(IoOp::kRead, b.loc[1].offset, kBlock, -EIO);
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, b.loc, &back);
  for (size_t i = 0; i < 8; i++) {
    if (i == 1) {
      EXPECT_EQ(st[i], -EIO);
    } else {
      EXPECT_EQ(st[i], 0);
      EXPECT_TRUE(block_matches(back[i].data(), kBlock, i));
    }
  }
  EXPECT_EQ(p->lost_blocks(), 1u);
  EXPECT_EQ(p->device_info(0).io_errors, 1u);
  EXPECT_TRUE(p->device_info(0).online);  // one error does not take a device out
}

TEST(TierPool, DeviceThatDisappearsLeavesPlacementAndItsWritesMoveElsewhere) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto gone = std::make_shared<FaultInjector>();
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0), dev(dir.file("d1"), 32 << 20, 1.0)};
  o.faults = {nullptr, gone};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks before(4, kBlock);
  p->write_blocks(before.writes, before.loc, before.status);
  for (int s : before.status) ASSERT_EQ(s, 0);

  gone->set_gone(true);  // device 1 vanishes: every I/O now fails with ENODEV
  Blocks b(8, kBlock, 100);
  p->write_blocks(b.writes, b.loc, b.status);
  for (size_t i = 0; i < 8; i++) {
    EXPECT_EQ(b.status[i], 0) << "block " << i << " should have been rewritten on device 0";
    EXPECT_EQ(b.loc[i].device, 0);
  }
  EXPECT_FALSE(p->device_info(1).online);
  EXPECT_EQ(p->device_info(1).placement_ratio, 0.0);
  EXPECT_EQ(p->placement(10), (std::vector<uint32_t>{10, 0}));
  // Blocks that lived on device 1 are lost, never returned; device 0's are intact.
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, before.loc, &back);
  for (size_t i = 0; i < 4; i++) {
    if (before.loc[i].device == 1) {
      EXPECT_EQ(st[i], -ENODEV);
    } else {
      EXPECT_EQ(st[i], 0);
      EXPECT_TRUE(block_matches(back[i].data(), kBlock, i));
    }
  }
}

TEST(TierPool, FullTierReportsNoSpaceUntilBlocksAreReleased) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.probe_bytes = 64 * 1024;
  o.devices = {dev(dir.file("d0"), 4 << 20, 1.0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  uint64_t fits = p->device_info(0).data_bytes / p->extent_bytes(0, kBlock);
  ASSERT_GT(fits, 2u);
  Blocks b(fits + 3, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  size_t ok = 0, nospace = 0;
  for (int s : b.status) (s == 0 ? ok : nospace) += (s == 0 || s == -ENOSPC);
  EXPECT_EQ(ok, fits);
  EXPECT_EQ(nospace, 3u);
  p->release(b.loc[0]);
  Blocks c(1, kBlock, 900);
  p->write_blocks(c.writes, c.loc, c.status);
  EXPECT_EQ(c.status[0], 0);
  EXPECT_EQ(c.loc[0].offset, b.loc[0].offset);
}

TEST(TierPool, FullDeviceSpillsItsShareToTheOthers) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.probe_bytes = 64 * 1024;
  o.devices = {dev(dir.file("small"), 4 << 20, 10.0), dev(dir.file("big"), 64 << 20, 1.0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  uint64_t small_fits = p->device_info(0).data_bytes / p->extent_bytes(0, kBlock);
  Blocks b(small_fits * 2, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  size_t on_small = 0;
  for (size_t i = 0; i < b.status.size(); i++) {
    ASSERT_EQ(b.status[i], 0);
    on_small += b.loc[i].device == 0;
  }
  EXPECT_EQ(on_small, small_fits);
}

TEST(TierPool, ReleasedOrForeignLocationIsNeverReadAsData) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  Blocks b(1, kBlock);
  p->write_blocks(b.writes, b.loc, b.status);
  ASSERT_EQ(b.status[0], 0);
  p->release(b.loc[0]);
  TierLocation mem{0, TierKind::kMem, 0, kBlock}, nodev{5, TierKind::kSsd, 0, kBlock};
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*p, {b.loc[0], mem, nodev}, &back);
  EXPECT_EQ(st[0], -ESTALE);
  EXPECT_EQ(st[1], -EINVAL);
  EXPECT_EQ(st[2], -EINVAL);
}

TEST(TierPool, PartitionsShareADeviceWithoutOverlapAndReadEachOthersBlocks) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("shared"), 64 << 20, 1.0)};
  o.partitions = 2;
  auto a_opts = o, b_opts = o;
  a_opts.partition = 0;
  b_opts.partition = 1;
  auto a = open_pool(a_opts);
  auto b = open_pool(b_opts);  // another process opening the same device
  ASSERT_TRUE(a && b);
  Blocks wa(8, kBlock, 0), wb(8, kBlock, 100);
  a->write_blocks(wa.writes, wa.loc, wa.status);
  b->write_blocks(wb.writes, wb.loc, wb.status);
  const uint64_t ext = a->extent_bytes(0, kBlock);
  for (size_t i = 0; i < 8; i++) {
    ASSERT_EQ(wa.status[i], 0);
    ASSERT_EQ(wb.status[i], 0);
    for (size_t j = 0; j < 8; j++)  // no extent handed out twice
      EXPECT_TRUE(wa.loc[i].offset + ext <= wb.loc[j].offset || wb.loc[j].offset + ext <= wa.loc[i].offset);
  }
  std::vector<std::vector<unsigned char>> back;
  auto st = read_back(*b, wa.loc, &back);  // b reads what a wrote
  for (size_t i = 0; i < 8; i++) {
    ASSERT_EQ(st[i], 0);
    EXPECT_TRUE(block_matches(back[i].data(), kBlock, i));
  }
  b->release(wa.loc[0]);  // not b's to reuse: counted, not freed
  EXPECT_EQ(b->device_info(0).foreign_releases, 1u);
  EXPECT_EQ(a->device_info(0).used_bytes, 8u * ext);
  o.partition = 2;
  EXPECT_FALSE(SsdPool::open(o));  // partition out of range
}

// ---- every SSD block carries its key, length and checksums (docs/integrity.md "The SSD tier") ----

namespace {
// One block of `key` (bytes of id `id`), written alone.
TierLocation put_one(SsdPool& p, uint64_t key, uint64_t id, std::vector<unsigned char>* bytes) {
  bytes->assign(kBlock, 0);
  fill_block(bytes->data(), kBlock, id);
  SsdWrite w{bytes->data(), kBlock, key, ~key};
  TierLocation loc;
  int st = 1;
  p.write_blocks({&w, 1}, {&loc, 1}, {&st, 1});
  EXPECT_EQ(st, 0);
  return loc;
}
int get_one(SsdPool& p, const TierLocation& loc, uint64_t key, std::vector<unsigned char>* out) {
  out->assign(loc.length, 0xEE);
  SsdRead r{loc, out->data(), key, ~key};
  int st = 1;
  p.read_blocks({&r, 1}, {&st, 1});
  return st;
}
bool untouched(const std::vector<unsigned char>& b) {
  for (unsigned char c : b)
    if (c != 0xEE) return false;
  return true;
}
}  // namespace

TEST(TierPool, AReopenedPoolThatClaimsNothingReusesExtentsButTheOldKeyReadsACleanMiss) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0)};
  std::vector<unsigned char> a, b, back;
  TierLocation la;
  {
    auto p = open_pool(o);
    ASSERT_TRUE(p);
    la = put_one(*p, 11, 1, &a);
  }
  auto p = open_pool(o);  // restart, without claiming what the index names
  ASSERT_TRUE(p);
  TierLocation lb = put_one(*p, 22, 2, &b);
  ASSERT_EQ(lb.offset, la.offset);  // first fit: A's extent handed out again
  EXPECT_EQ(get_one(*p, la, 11, &back), -ESTALE);  // A: a miss, never B's bytes
  EXPECT_TRUE(untouched(back));
  ASSERT_EQ(get_one(*p, lb, 22, &back), 0);
  EXPECT_EQ(back, b);
  EXPECT_EQ(p->device_info(0).bad_blocks, 1u);
}

TEST(TierPool, AClaimedExtentIsNeverHandedOutAgainAndBadClaimsAreRefused) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0)};
  std::vector<unsigned char> a, b, back;
  TierLocation la;
  {
    auto p = open_pool(o);
    ASSERT_TRUE(p);
    la = put_one(*p, 11, 1, &a);
  }
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->claim(la));
  EXPECT_FALSE(p->claim(la));  // named twice
  TierLocation lb = put_one(*p, 22, 2, &b);
  EXPECT_NE(lb.offset, la.offset);
  ASSERT_EQ(get_one(*p, la, 11, &back), 0);
  EXPECT_EQ(back, a);
  // Locations a damaged index entry could hold: refused, nothing changes.
  const uint64_t used = p->device_info(0).used_bytes;
  for (TierLocation bad : {TierLocation{9, TierKind::kSsd, la.offset, kBlock},
                           TierLocation{0, TierKind::kMem, la.offset, kBlock},
                           TierLocation{0, TierKind::kSsd, la.offset + 512, kBlock},
                           TierLocation{0, TierKind::kSsd, UINT64_MAX - 4095, kBlock},
                           TierLocation{0, TierKind::kSsd, 1ull << 62, UINT32_MAX},
                           TierLocation{0, TierKind::kSsd, 0, kBlock},  // the device header
                           TierLocation{0, TierKind::kSsd, la.offset, 0}}) {
    EXPECT_FALSE(p->claim(bad)) << bad.device << " " << bad.offset << " " << bad.length;
    EXPECT_NE(get_one(*p, bad, 11, &back), 0) << bad.offset;
    EXPECT_TRUE(untouched(back));
  }
  EXPECT_EQ(p->device_info(0).used_bytes, used);
}

TEST(TierPool, AReadNamingAnotherKeyOrLengthIsRefused) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto o = small_pool();
  o.devices = {dev(dir.file("d0"), 32 << 20, 1.0)};
  auto p = open_pool(o);
  ASSERT_TRUE(p);
  std::vector<unsigned char> a, back;
  TierLocation la = put_one(*p, 11, 1, &a);
  EXPECT_EQ(get_one(*p, la, 12, &back), -ESTALE);
  EXPECT_TRUE(untouched(back));
  TierLocation shorter = la;
  shorter.length = kBlock - 512;
  EXPECT_EQ(get_one(*p, shorter, 11, &back), -ESTALE);
  EXPECT_TRUE(untouched(back));
  ASSERT_EQ(get_one(*p, la, 11, &back), 0);
  EXPECT_EQ(back, a);
}
