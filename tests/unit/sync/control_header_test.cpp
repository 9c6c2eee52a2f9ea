// SPDX-License-Identifier: MIT
// A damaged control-carve header is refused at open with an
// error naming the pool and the field, never followed into another carve.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "carve/alloc_layout.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"
#include "cxlkv/format/alloc_format.h"
#include "uapi/cxlkv_ctrl.h"

using namespace cxlkv;

namespace {
struct TempPool {
  std::string path = "/tmp/cxlkv-control-header-test-" + std::to_string(getpid());
  std::string uri() const { return "file:" + path; }
  TempPool() { std::remove(path.c_str()); }
  ~TempPool() { std::remove(path.c_str()); }
};
}  // namespace

TEST(ControlHeader, EveryDamagedOffsetIsRefusedNamingThePoolAndTheField) {
  TempPool f;
  PoolFormatOptions o;
  o.size = 64ull << 20;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  Region& region = *r.value();
  auto carve = region.carve(CXLKV_CARVE_CONTROL);
  ASSERT_TRUE(carve);
  auto* h = reinterpret_cast<cxlkv_ctrl_header*>(region.at(carve->offset));
  const cxlkv_ctrl_header good = *h;
  ASSERT_TRUE(ControlCarve::open(region, region.domain()).ok());
  struct Case {
    const char* field;
    size_t at;
    uint64_t value;
  };
  const uint64_t huge = 1ull << 62, wraps = UINT64_MAX - 63;
  const Case cases[] = {
      {"lease_off", offsetof(cxlkv_ctrl_header, lease_off), huge},
      {"lease_off", offsetof(cxlkv_ctrl_header, lease_off), wraps},
      {"lease_off", offsetof(cxlkv_ctrl_header, lease_off), 0},  // the header itself
      {"node_table_off", offsetof(cxlkv_ctrl_header, node_table_off), huge},
      {"node_table_off", offsetof(cxlkv_ctrl_header, node_table_off), wraps},
      {"node_table_off", offsetof(cxlkv_ctrl_header, node_table_off), 65},
      {"lock_table_off", offsetof(cxlkv_ctrl_header, lock_table_off), huge},
      {"lock_table_off", offsetof(cxlkv_ctrl_header, lock_table_off), wraps},
      {"grant_table_off", offsetof(cxlkv_ctrl_header, grant_table_off), huge},
      {"grant_table_off", offsetof(cxlkv_ctrl_header, grant_table_off), good.lock_table_off},  // overlap
      {"doorbell_off", offsetof(cxlkv_ctrl_header, doorbell_off), huge},
      {"doorbell_off", offsetof(cxlkv_ctrl_header, doorbell_off), wraps},
      {"doorbell_off", offsetof(cxlkv_ctrl_header, doorbell_off), carve->size},
  };
  size_t refused = 0;
  for (const Case& c : cases) {
    *h = good;
    std::memcpy(reinterpret_cast<std::byte*>(h) + c.at, &c.value, sizeof c.value);
    auto open = ControlCarve::open(region, region.domain());
    ASSERT_FALSE(open.ok()) << c.field << " = " << c.value << " was accepted";
    EXPECT_EQ(open.error().code(), -EUCLEAN);
    EXPECT_NE(open.error().message().find(region.uri()), std::string::npos) << open.error().message();
    EXPECT_NE(open.error().message().find(c.field), std::string::npos) << open.error().message();
    refused++;
  }
  EXPECT_EQ(refused, sizeof cases / sizeof cases[0]);
  // max_nodes / max_locks / magic / version: refused by name too.
  *h = good;
  h->max_locks = 0;
  auto open = ControlCarve::open(region, region.domain());
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.error().message().find("max_locks"), std::string::npos);
  *h = good;
  h->max_locks = CXLKV_MAX_LOCKS;  // in range, but its tables no longer fit where they are
  open = ControlCarve::open(region, region.domain());
  ASSERT_FALSE(open.ok());
  // A damaged field that still looks plausible is caught by the
  // header checksum; an older layout says to reformat.
  *h = good;
  h->checksum ^= 1;
  open = ControlCarve::open(region, region.domain());
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.error().code(), -EUCLEAN);
  EXPECT_NE(open.error().message().find("checksum"), std::string::npos) << open.error().message();
  EXPECT_NE(open.error().message().find(region.uri()), std::string::npos) << open.error().message();
  *h = good;
  h->doorbell_off += 64;  // still inside the carve, overlapping nothing
  open = ControlCarve::open(region, region.domain());
  ASSERT_FALSE(open.ok()) << "a moved doorbell table was accepted";
  EXPECT_NE(open.error().message().find("checksum"), std::string::npos) << open.error().message();
  *h = good;
  h->version = 1;
  open = ControlCarve::open(region, region.domain());
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.error().code(), -EPROTO);
  EXPECT_NE(open.error().message().find("reformat"), std::string::npos) << open.error().message();
  *h = good;
  ASSERT_TRUE(ControlCarve::open(region, region.domain()).ok());  // the original opens again
}

// The allocator's header: its arena is the kv carve, its sizes cannot wrap.
TEST(AllocHeader, EveryDamagedSizeOrArenaFieldIsRefusedNamingThePoolAndTheField) {
  TempPool f;
  f.path += "-alloc";
  PoolFormatOptions o;
  o.size = 64ull << 20;
  auto r = format_pool(f.uri(), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  Region& region = *r.value();
  auto carve = region.carve(CXLKV_CARVE_ALLOC);
  ASSERT_TRUE(carve);
  auto* h = reinterpret_cast<cxlkv_alloc_header*>(region.at(carve->offset));
  const cxlkv_alloc_header good = *h;
  ASSERT_TRUE(alloc::read_alloc_header(region, region.domain()).ok());
  struct Case {
    const char* field;
    size_t at;
    uint64_t value;
  };
  const Case cases[] = {
      {"arena_off", offsetof(cxlkv_alloc_header, arena_off), 0},  // the superblock
      {"arena_off", offsetof(cxlkv_alloc_header, arena_off), carve->offset},  // another carve
      {"arena_off", offsetof(cxlkv_alloc_header, arena_off), UINT64_MAX - 4095},
      {"nchunks", offsetof(cxlkv_alloc_header, nchunks), 0},
      {"nchunks", offsetof(cxlkv_alloc_header, nchunks), good.nchunks + 1},
      {"nchunks", offsetof(cxlkv_alloc_header, nchunks), 1ull << 60},  // nchunks * chunk_size wraps
      {"chunk_size", offsetof(cxlkv_alloc_header, chunk_size), 0},
      {"chunk_size", offsetof(cxlkv_alloc_header, chunk_size), 3ull << 20},
      {"chunk_size", offsetof(cxlkv_alloc_header, chunk_size), 1ull << 63},
  };
  for (const Case& c : cases) {
    *h = good;
    std::memcpy(reinterpret_cast<std::byte*>(h) + c.at, &c.value, sizeof c.value);
    auto open = alloc::read_alloc_header(region, region.domain());
    ASSERT_FALSE(open.ok()) << c.field << " = " << c.value << " was accepted";
    EXPECT_EQ(open.error().code(), -EUCLEAN);
    EXPECT_NE(open.error().message().find(region.uri()), std::string::npos) << open.error().message();
    EXPECT_NE(open.error().message().find(c.field), std::string::npos) << open.error().message();
  }
  *h = good;
  ASSERT_TRUE(alloc::read_alloc_header(region, region.domain()).ok());
}
