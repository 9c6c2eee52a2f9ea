// SPDX-License-Identifier: MIT
// The standard pool format: carve layout, control header, initial contents.
#include <gtest/gtest.h>

#include "cxlkv/format/index_format.h"
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "cxlkv/cxlkv.h"
#include "pool/format.hpp"
#include <sys/stat.h>

using namespace cxlkv;

namespace {

constexpr uint64_t MiB = 1ull << 20;

struct TempFile {
  std::string path = "/tmp/cxlkv-pool-format-test-" + std::to_string(getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string uri() const { return "file:" + path; }
  TempFile() { std::remove(path.c_str()); }
  ~TempFile() { std::remove(path.c_str()); }
};

bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

}  // namespace

TEST(PoolFormat, StandardCarvesTileThePoolInOrder) {
  TempFile f;
  PoolFormatOptions o;
  o.size = 256 * MiB;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto cs = r.value()->carves();
  ASSERT_EQ(cs.size(), 4u);
  const char* names[] = {"control", "index", "alloc", "kv"};
  uint64_t end = CXLKV_FIRST_CARVE_OFF;
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(cs[i].name, names[i]);
    EXPECT_EQ(cs[i].offset, end) << names[i] << " leaves a gap";
    EXPECT_EQ(cs[i].flags, CXLKV_CARVE_F_SYSTEM);
    EXPECT_EQ(cs[i].memtype, MemType::wb);
    end = cs[i].offset + cs[i].size;
  }
  EXPECT_EQ(end, 256 * MiB) << "kv takes the rest";
}

TEST(PoolFormat, ControlHeaderDescribesTheTablesInsideTheCarve) {
  TempFile f;
  PoolFormatOptions o;
  o.size = 64 * MiB;
  o.max_nodes = 8;
  o.max_locks = 512;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto ctl = r.value()->carve("control");
  ASSERT_TRUE(ctl.ok());
  cxlkv_ctrl_header h;
  std::memcpy(&h, r.value()->at(ctl->offset), sizeof h);
  EXPECT_EQ(h.magic, CXLKV_CTRL_MAGIC);
  EXPECT_EQ(h.version, CXLKV_CTRL_VERSION);
  EXPECT_EQ(h.max_nodes, 8u);
  EXPECT_EQ(h.max_locks, 512u);
  EXPECT_EQ(h.lease_off, 64u);
  EXPECT_EQ(h.node_table_off, 128u);
  EXPECT_EQ(h.lock_table_off, 128u + 8 * 64);
  EXPECT_EQ(h.grant_table_off, h.lock_table_off + 512ull * 8 * 64);
  EXPECT_EQ(h.doorbell_off, h.grant_table_off + 512 * 64);
  EXPECT_LE(h.doorbell_off + 8 * 64, ctl->size);
  EXPECT_EQ(h.doorbell_off + 8 * 64, cxlkv_ctrl_carve_bytes(8, 512));
}

TEST(PoolFormat, LargestControlTablesStillFit) {
  uint64_t bytes = 0;
  plan_control(CXLKV_MAX_NODES, CXLKV_MAX_LOCKS, &bytes);
  PoolFormatOptions o;
  o.max_nodes = CXLKV_MAX_NODES;
  o.max_locks = CXLKV_MAX_LOCKS;
  auto L = plan_pool_layout("test", 1024 * MiB, o);
  ASSERT_TRUE(L.ok()) << L.error().message();
  EXPECT_GE(L->control_size, bytes);
  EXPECT_EQ(L->control_size % CXLKV_CARVE_ALIGN, 0u);
}

TEST(PoolFormat, IndexEntriesScaleWithThePoolAndArePowersOfTwo) {
  PoolFormatOptions o;
  auto small = plan_pool_layout("p", 64 * MiB, o);
  auto big = plan_pool_layout("p", 16384 * MiB, o);
  ASSERT_TRUE(small.ok() && big.ok());
  EXPECT_TRUE(is_pow2(small->index_entries));
  EXPECT_TRUE(is_pow2(big->index_entries));
  EXPECT_GE(big->index_entries, big->kv_size / kIndexBytesPerEntry);
  EXPECT_GE(big->index_size, 64 + big->index_entries * 64);
  o.index_entries = 5000;
  auto asked = plan_pool_layout("p", 64 * MiB, o);
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(asked->index_entries, 8192u);
}

TEST(PoolFormat, AllocCarveCoversTheAllocatorMetadata) {
  PoolFormatOptions o;
  auto L = plan_pool_layout("p", 16384 * MiB, o);
  ASSERT_TRUE(L.ok());
  // Remote-free bits are 1/512 of the kv space (cxlkv/format/alloc_format.h).
  EXPECT_GE(L->alloc_size, L->kv_size / 512 + kObjectStoreRoom);
}

TEST(PoolFormat, TooSmallPoolsAndBadOptionsAreRefusedBeforeTouchingThePool) {
  TempFile f;
  PoolFormatOptions o;
  o.size = 8 * MiB;
  auto small = format_pool(f.uri(), o);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code(), -ENOSPC);
  EXPECT_NE(small.error().message().find("too small"), std::string::npos) << small.error().message();
  EXPECT_NE(access(f.path.c_str(), F_OK), 0) << "nothing was created";

  o.size = 64 * MiB;
  ASSERT_TRUE(format_pool(f.uri(), o).ok());
  o.force = true;
  o.max_locks = 3;
  auto bad = format_pool(f.uri(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("max_locks 3 out of range"), std::string::npos);
  auto still = Region::open(f.uri());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still.value()->carves().size(), 4u);
}

TEST(PoolFormat, ReformatZeroesTheMetadataCarves) {
  TempFile f;
  PoolFormatOptions o;
  o.size = 64 * MiB;
  uint64_t idx_off;
  {
    auto r = format_pool(f.uri(), o);
    ASSERT_TRUE(r.ok());
    idx_off = r.value()->carve("index")->offset;
    std::memset(r.value()->at(idx_off), 0x5a, 4096);
  }
  o.force = true;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok());
  // The index initializer writes its header and config lines (cxlkv/format/index_format.h);
  // everything after them is zero again.
  EXPECT_EQ(*r.value()->at<uint64_t>(idx_off), CXLKV_INDEX_MAGIC);
  for (int i = 128; i < 4096; i++) ASSERT_EQ(*r.value()->at<uint8_t>(idx_off + i), 0) << i;
}

TEST(PoolFormat, NoStandardFormatsTheSuperblockOnly) {
  TempFile f;
  PoolFormatOptions o;
  o.size = 16 * MiB;
  o.standard = false;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value()->carves().empty());
}

// format_pool and cxlkv_pool_format never destroy a valid standard
// pool without force, whatever size the URI names; published data (here: the
// carves and a byte in the kv carve) survives the refusal.
TEST(PoolFormat, ValidPoolOfAnotherSizeIsRefusedByFormatPoolAndTheCApi) {
  std::string name = "cxlkv-pool-format-test-" + std::to_string(getpid());
  std::string path = "/dev/shm/" + name;
  uint64_t kv_off = 0;
  {
    PoolFormatOptions o;
    auto r = format_pool("shm:" + name + ":64M", o);
    ASSERT_TRUE(r.ok()) << r.error().message();
    auto kv = r.value()->carve(CXLKV_CARVE_KV);
    ASSERT_TRUE(kv.ok());
    kv_off = kv->offset;
    *r.value()->at(kv_off) = std::byte{0x5a};
    r.value()->domain().flush(r.value()->at(kv_off), 1);
  }
  PoolFormatOptions o;
  auto again = format_pool("shm:" + name + ":128M", o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), -EEXIST);
  EXPECT_NE(again.error().message().find("64 MiB"), std::string::npos) << again.error().message();
  EXPECT_NE(again.error().message().find("128 MiB"), std::string::npos) << again.error().message();

  struct cxlkv_format_opts fo;
  std::memset(&fo, 0, sizeof fo);
  fo.size = sizeof fo;
  int rc = cxlkv_pool_format(("shm:" + name + ":128M").c_str(), &fo);
  EXPECT_EQ(rc, -EEXIST);
  EXPECT_NE(std::string(cxlkv_last_error()).find("valid cxlkv pool of 64 MiB"), std::string::npos)
      << cxlkv_last_error();
  fo.pool_size = 32 * MiB;
  rc = cxlkv_pool_format(("shm:" + name).c_str(), &fo);
  EXPECT_EQ(rc, -EEXIST) << cxlkv_last_error();

  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * MiB);
  auto still = Region::open("shm:" + name);
  ASSERT_TRUE(still.ok()) << still.error().message();
  EXPECT_EQ(still.value()->carves().size(), 4u);
  EXPECT_EQ(*still.value()->at(kv_off), std::byte{0x5a});

  fo.pool_size = 0;
  fo.flags = CXLKV_FORMAT_F_FORCE;
  rc = cxlkv_pool_format(("shm:" + name + ":128M").c_str(), &fo);
  EXPECT_EQ(rc, 0) << cxlkv_last_error();
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 128 * MiB);
  std::remove(path.c_str());
}
