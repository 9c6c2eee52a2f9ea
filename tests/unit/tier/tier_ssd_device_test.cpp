// SPDX-License-Identifier: MIT
// SsdDevice: the io_uring + O_DIRECT I/O layer of one SSD pool device.
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <vector>

#include "tier/ssd_device.hpp"
#include "support/tier_test_support.hpp"

using cxlkv::IoOp;
using cxlkv::tier::AlignedBuffer;
using cxlkv::tier::SsdDevice;
using cxlkv::tier::SsdDeviceOptions;
using cxlkv::tier::SsdIo;
using tier_test::fill_block;
using tier_test::block_matches;

namespace {

constexpr uint32_t kBlock = 64 * 1024;

std::vector<SsdIo> ios_over(IoOp op, AlignedBuffer& buf, uint32_t block, uint64_t base = 0) {
  std::vector<SsdIo> v;
  for (size_t off = 0; off < buf.size(); off += block) {
    SsdIo io;
    io.op = op;
    io.offset = base + off;
    io.buf = buf.data() + off;
    io.length = block;
    v.push_back(io);
  }
  return v;
}

SsdDeviceOptions dev_opts(const std::string& path, uint64_t create_bytes = 0) {
  SsdDeviceOptions o;
  o.path = path;
  o.create_bytes = create_bytes;
  return o;
}

std::unique_ptr<SsdDevice> open_or_die(const SsdDeviceOptions& o) {
  auto d = SsdDevice::open(o);
  EXPECT_TRUE(d) << (d ? "" : d.error().message());
  return d ? std::move(*d) : nullptr;
}

}  // namespace

TEST(TierSsdDevice, FileDeviceReportsPowerOfTwoAlignmentAndItsSize) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto d = open_or_die(dev_opts(dir.file("dev0"), 8 << 20));
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->block_device());
  EXPECT_EQ(d->capacity(), 8u << 20);
  EXPECT_GE(d->logical_block(), 512u);
  EXPECT_EQ(d->logical_block() & (d->logical_block() - 1), 0u);
  EXPECT_TRUE(d->fixed_file());
}

TEST(TierSsdDevice, RoundTripThroughRegisteredBuffersIsByteExact) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer wbuf(32 * kBlock), rbuf(32 * kBlock);
  auto d = open_or_die([&] {
    auto o = dev_opts(dir.file("dev0"), 8 << 20);
    o.queue_depth = 8;
    o.registered_memory = {wbuf.span(), rbuf.span()};
    return o;
  }());
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->fixed_buffers());
  fill_block(wbuf.data(), wbuf.size(), 42);
  auto w = ios_over(IoOp::kWrite, wbuf, kBlock);
  ASSERT_EQ(d->run(w), 0);
  auto r = ios_over(IoOp::kRead, rbuf, kBlock);
  ASSERT_EQ(d->run(r), 0);
  EXPECT_TRUE(block_matches(rbuf.data(), rbuf.size(), 42));
  EXPECT_EQ(d->counters().fixed_ios.load(), 64u);  // every I/O used a fixed buffer
  // 32 I/Os at queue depth 8 went out in batches, not one system call each.
  EXPECT_LT(d->counters().submits.load(), 64u);
}

TEST(TierSsdDevice, UnregisteredAlignedMemoryAlsoWorks) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer wbuf(4 * kBlock), rbuf(4 * kBlock);
  auto d = open_or_die(dev_opts(dir.file("dev0"), 4 << 20));
  ASSERT_TRUE(d);
  fill_block(wbuf.data(), wbuf.size(), 5);
  auto w = ios_over(IoOp::kWrite, wbuf, kBlock, 1 << 20);
  ASSERT_EQ(d->run(w), 0);
  auto r = ios_over(IoOp::kRead, rbuf, kBlock, 1 << 20);
  ASSERT_EQ(d->run(r), 0);
  EXPECT_TRUE(block_matches(rbuf.data(), rbuf.size(), 5));
  EXPECT_EQ(d->counters().fixed_ios.load(), 0u);
}

TEST(TierSsdDevice, DataPathLeavesNothingInThePageCache) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  std::string path = dir.file("dev0");
  AlignedBuffer buf(64 * kBlock);
  fill_block(buf.data(), buf.size(), 9);
  {
    auto d = open_or_die(dev_opts(path, buf.size()));
    ASSERT_TRUE(d);
    auto w = ios_over(IoOp::kWrite, buf, kBlock);
    ASSERT_EQ(d->run(w), 0);
    auto r = ios_over(IoOp::kRead, buf, kBlock);
    ASSERT_EQ(d->run(r), 0);
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* m = mmap(nullptr, buf.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::vector<unsigned char> vec(buf.size() / 4096);
  ASSERT_EQ(mincore(m, buf.size(), vec.data()), 0);  // looks, does not fault pages in
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  munmap(m, buf.size());
  ::close(fd);
  EXPECT_EQ(resident, 0u) << "pages of the device file entered the page cache";
}

TEST(TierSsdDevice, MoreIosThanTheQueueDepthAllComplete) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer buf(200 * 4096);
  auto d = open_or_die([&] {
    auto o = dev_opts(dir.file("dev0"), 4 << 20);
    o.queue_depth = 4;
    return o;
  }());
  ASSERT_TRUE(d);
  fill_block(buf.data(), buf.size(), 77);
  auto w = ios_over(IoOp::kWrite, buf, 4096);
  ASSERT_EQ(d->run(w), 0);
  std::memset(buf.data(), 0, buf.size());
  auto r = ios_over(IoOp::kRead, buf, 4096);
  ASSERT_EQ(d->run(r), 0);
  EXPECT_TRUE(block_matches(buf.data(), buf.size(), 77));
  EXPECT_EQ(d->counters().reads.load(), 200u);
}

TEST(TierSsdDevice, MisalignedIoIsRefusedNotIssued) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer buf(8192);
  auto d = open_or_die(dev_opts(dir.file("dev0"), 1 << 20));
  ASSERT_TRUE(d);
  SsdIo io;
  io.op = IoOp::kRead;
  io.offset = 100;  // not a multiple of the logical block
  io.buf = buf.data();
  io.length = 4096;
  EXPECT_EQ(d->run({&io, 1}), -EINVAL);
  io.offset = 0;
  io.buf = buf.data() + 1;  // buffer not aligned
  EXPECT_EQ(d->run({&io, 1}), -EINVAL);
}

TEST(TierSsdDevice, ReadPastTheEndIsAShortTransferAndAnError) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer buf(64 * 1024);
  auto d = open_or_die(dev_opts(dir.file("dev0"), 1 << 20));
  ASSERT_TRUE(d);
  SsdIo io;
  io.op = IoOp::kRead;
  io.offset = (1 << 20) - 16384;  // the last 16 KiB exist, the rest does not
  io.buf = buf.data();
  io.length = 65536;
  EXPECT_EQ(d->run({&io, 1}), -EIO);
  EXPECT_TRUE(io.short_transfer);
  EXPECT_EQ(io.transferred, 16384u);
  EXPECT_EQ(d->counters().short_reads.load(), 1u);
}

TEST(TierSsdDevice, SqpollRingRoundTrips) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  AlignedBuffer wbuf(8 * kBlock), rbuf(8 * kBlock);
  auto d = open_or_die([&] {
    auto o = dev_opts(dir.file("dev0"), 4 << 20);
    o.sqpoll = true;
    o.registered_memory = {wbuf.span(), rbuf.span()};
    return o;
  }());
  ASSERT_TRUE(d);
  fill_block(wbuf.data(), wbuf.size(), 3);
  auto w = ios_over(IoOp::kWrite, wbuf, kBlock);
  ASSERT_EQ(d->run(w), 0);
  auto r = ios_over(IoOp::kRead, rbuf, kBlock);
  ASSERT_EQ(d->run(r), 0);
  EXPECT_TRUE(block_matches(rbuf.data(), rbuf.size(), 3));
  if (!d->sqpoll()) GTEST_SKIP() << "kernel refused IORING_SETUP_SQPOLL; the plain ring was used";
}

TEST(TierSsdDevice, InjectedErrorCompletesTheIoWithoutTouchingTheDevice) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  auto faults = std::make_shared<cxlkv::FaultInjector>();
  faults->fail(IoOp::kRead, 8192, 4096, -EIO);
  AlignedBuffer buf(4 * 4096);
  auto d = open_or_die([&] {
    auto o = dev_opts(dir.file("dev0"), 1 << 20);
    o.faults = faults;
    return o;
  }());
  ASSERT_TRUE(d);
  auto r = ios_over(IoOp::kRead, buf, 4096);
  EXPECT_EQ(d->run(r), -EIO);
  EXPECT_EQ(r[0].status, 0);
  EXPECT_EQ(r[1].status, 0);
  EXPECT_EQ(r[2].status, -EIO);
  EXPECT_EQ(r[3].status, 0);
  EXPECT_EQ(faults->injected(), 1u);
}

TEST(TierSsdDevice, LoopDeviceReportsItsLogicalBlockSize) {
  tier_test::ScratchDir dir;
  TIER_REQUIRE_DIRECT_IO(dir);
  tier_test::LoopDevice loop(dir.file("loop.img"), 16 << 20, 4096);
  TIER_REQUIRE_LOOP(loop);
  auto d = open_or_die(dev_opts(loop.path()));
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->block_device());
  EXPECT_EQ(d->logical_block(), 4096u);  // BLKSSZGET
  EXPECT_EQ(d->capacity(), 16u << 20);   // BLKGETSIZE64
  AlignedBuffer buf(4 * kBlock);
  fill_block(buf.data(), buf.size(), 8);
  auto w = ios_over(IoOp::kWrite, buf, kBlock);
  ASSERT_EQ(d->run(w), 0);
  std::memset(buf.data(), 0, buf.size());
  auto r = ios_over(IoOp::kRead, buf, kBlock);
  ASSERT_EQ(d->run(r), 0);
  EXPECT_TRUE(block_matches(buf.data(), buf.size(), 8));
}

// The file is pre-allocated at open, so a file system without room
// is reported there (by name and size), not found later as failed writes.
TEST(TierSsdDevice, AFullFileSystemIsReportedAtOpen) {
  tier_test::ScratchDir dir;
  if (!dir.ok()) GTEST_SKIP() << "no scratch directory";
  const std::string mnt = dir.file("small-fs");
  std::filesystem::create_directory(mnt);
  if (std::system(("mount -t tmpfs -o size=4m cxlkv-tier-test '" + mnt + "' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  struct Unmount {
    std::string m;
    // Lazy: io_uring may drop its file reference a moment after close.
    ~Unmount() { (void)std::system(("umount -l '" + m + "' 2>/dev/null").c_str()); }
  } unmount{mnt};
  SsdDeviceOptions o;
  o.path = mnt + "/dev0";
  o.create_bytes = 64ull << 20;  // 64 MiB on a 4 MiB file system
  auto d = SsdDevice::open(o);
  if (!d && d.error().code() == -EINVAL) GTEST_SKIP() << "no O_DIRECT on tmpfs here: " << d.error().message();
  ASSERT_FALSE(d) << "a 64 MiB device opened on a 4 MiB file system";
  EXPECT_EQ(d.error().code(), -ENOSPC) << d.error().message();
  EXPECT_NE(d.error().message().find(o.path), std::string::npos) << d.error().message();
  EXPECT_NE(d.error().message().find("67108864"), std::string::npos) << d.error().message();
  // An existing sparse file of that size is refused the same way.
  const std::string sparse = mnt + "/sparse";
  int fd = ::open(sparse.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64 << 20), 0);
  ::close(fd);
  o.path = sparse;
  o.create_bytes = 0;
  d = SsdDevice::open(o);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code(), -ENOSPC) << d.error().message();
  // A size that fits opens.
  o.path = mnt + "/fits";
  o.create_bytes = 1 << 20;
  d = SsdDevice::open(o);
  ASSERT_TRUE(d) << d.error().message();
}
