// SPDX-License-Identifier: MIT
// Region: format, open with validation, carves, several pools at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "cxlkv/region.hpp"
#include "region/backend.hpp"
#include "region/superblock.hpp"

using namespace cxlkv;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// A file: pool path unique to this test process, removed at the end.
class TempPool {
 public:
  explicit TempPool(const std::string& tag)
      : path_("/tmp/cxlkv-region-test-" + tag + "-" + std::to_string(getpid())) {
    std::remove(path_.c_str());
  }
  ~TempPool() { std::remove(path_.c_str()); }
  std::string uri() const { return "file:" + path_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::unique_ptr<Region> format_ok(const std::string& uri, uint64_t size = 64 * MiB) {
  FormatOptions fo;
  fo.size = size;
  auto r = Region::format(uri, fo);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Rewrite the superblock on disk through `mutate`, optionally re-sealing the checksum.
template <class F>
void corrupt(const TempPool& p, F mutate, bool fix_checksum = true) {
  cxlkv_superblock sb{};
  {
    std::ifstream in(p.path(), std::ios::binary);
    in.read(reinterpret_cast<char*>(&sb), sizeof sb);
  }
  mutate(sb);
  if (fix_checksum) region::seal_superblock(sb);
  std::fstream out(p.path(), std::ios::binary | std::ios::in | std::ios::out);
  out.write(reinterpret_cast<const char*>(&sb), sizeof sb);
}

std::string open_error(const TempPool& p) {
  auto r = Region::open(p.uri());
  if (r.ok()) return "(opened)";
  EXPECT_NE(r.error().message().find(p.uri()), std::string::npos) << r.error().message();
  return r.error().message();
}

}  // namespace

TEST(RegionFormat, FormattedPoolOpensWithItsGeometry) {
  TempPool p("geom");
  FormatOptions fo;
  fo.size = 32 * MiB;
  fo.max_nodes = 8;
  ASSERT_TRUE(Region::format(p.uri(), fo).ok());
  auto r = Region::open(p.uri());
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r.value()->size(), 32 * MiB);
  EXPECT_EQ(r.value()->max_nodes(), 8u);
  EXPECT_EQ(r.value()->kind(), BackendKind::file);
  EXPECT_EQ(r.value()->superblock().generation, 1u);
  EXPECT_TRUE(r.value()->carves().empty());
}

TEST(RegionFormat, RefusesToOverwriteAValidPoolWithoutForce) {
  TempPool p("clobber");
  auto r = format_ok(p.uri());
  ASSERT_TRUE(r->carve_create("mine", 2 * MiB, MemType::wb).ok());
  r.reset();
  FormatOptions fo;
  fo.size = 64 * MiB;
  auto again = Region::format(p.uri(), fo);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), -EEXIST);
  EXPECT_NE(again.error().message().find("force"), std::string::npos);
  auto still = Region::open(p.uri());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still.value()->carves().size(), 1u);

  fo.force = true;
  auto forced = Region::format(p.uri(), fo);
  ASSERT_TRUE(forced.ok()) << forced.error().message();
  EXPECT_TRUE(forced.value()->carves().empty());
}

TEST(RegionFormat, RejectsSizesThatAreNotWholeCarves) {
  TempPool p("badsize");
  FormatOptions fo;
  fo.size = 3 * MiB;
  auto r = Region::format(p.uri(), fo);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("multiple of 2 MiB"), std::string::npos);
}

TEST(RegionCarves, CreateListLookupRemove) {
  TempPool p("carves");
  auto r = format_ok(p.uri());
  auto a = r->carve_create("alpha", 1, MemType::wb);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->offset, CXLKV_FIRST_CARVE_OFF);
  EXPECT_EQ(a->size, 2 * MiB);
  auto b = r->carve_create("beta", 5 * MiB, MemType::wc);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->offset, 4 * MiB);
  EXPECT_EQ(b->size, 6 * MiB);
  auto found = r->carve("beta");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->memtype, MemType::wc);
  ASSERT_TRUE(r->carve_remove("alpha").ok());
  EXPECT_EQ(r->carve("alpha").error().code(), -ENOENT);
  // First fit reuses the hole alpha left; the table stays sorted.
  auto c = r->carve_create("gamma", 2 * MiB, MemType::uc);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->offset, CXLKV_FIRST_CARVE_OFF);
  auto list = r->carves();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "gamma");
  EXPECT_EQ(list[1].name, "beta");
}

TEST(RegionOpen, UnformattedFileIsRefusedNamingThePool) {
  TempPool p("unformatted");
  { std::ofstream(p.path()).write(std::string(8 * MiB, '\0').data(), 8 * MiB); }
  std::string e = open_error(p);
  EXPECT_NE(e.find("unformatted"), std::string::npos) << e;
}

TEST(RegionOpen, BadChecksumIsRefused) {
  TempPool p("cksum");
  format_ok(p.uri());
  corrupt(p, [](cxlkv_superblock& sb) { sb.max_nodes ^= 1; }, /*fix_checksum=*/false);
  std::string e = open_error(p);
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
}
