// SPDX-License-Identifier: MIT
// Region: format, open with validation, carves, several pools at once.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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

TEST(RegionFormat, RefusalNeverResizesTheValidPool) {
  TempPool p("noresize");
  format_ok(p.uri(), 64 * MiB);
  FormatOptions fo;
  fo.size = 32 * MiB;
  auto again = Region::format(p.uri(), fo);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), -EEXIST);
  struct stat st {};
  ASSERT_EQ(stat(p.path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * MiB);
  EXPECT_TRUE(Region::open(p.uri()).ok());
}

// `format shm:p:128M` over a valid 64 MiB pool used to resize and
// reformat it (the shm: size check made the valid pool invisible to the
// refusal).  Whatever size the URI names, a valid pool needs force, and the
// error names both sizes.
TEST(RegionFormat, ShmUriNamingAnotherSizeNeverDestroysAValidPool) {
  std::string name = "cxlkv-region-test-resize-" + std::to_string(getpid());
  std::string path = "/dev/shm/" + name;
  {
    auto r = Region::format("shm:" + name + ":64M", FormatOptions{});
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_TRUE(r.value()->carve_create("keep", 2 * MiB, MemType::wb).ok());
  }
  for (auto [uri, as] : {std::pair<std::string, std::string>{"shm:" + name + ":128M", "as 128 MiB"},
                         {"shm:" + name + ":32M", "as 32 MiB"}}) {
    auto again = Region::format(uri, FormatOptions{});
    ASSERT_FALSE(again.ok()) << uri;
    EXPECT_EQ(again.error().code(), -EEXIST);
    const std::string& m = again.error().message();
    EXPECT_NE(m.find("valid cxlkv pool of 64 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find(as), std::string::npos) << m;
    EXPECT_NE(m.find("force"), std::string::npos) << m;
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * MiB) << "refusal resized the pool";
    auto still = Region::open("shm:" + name);
    ASSERT_TRUE(still.ok()) << still.error().message();
    EXPECT_TRUE(still.value()->carve("keep").ok()) << "refusal reformatted the pool";
  }
  // The same pool, named by its own size, is refused as already formatted.
  auto same = Region::format("shm:" + name + ":64M", FormatOptions{});
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.error().code(), -EEXIST);
  // With force the operator gets the new size.
  FormatOptions fo;
  fo.force = true;
  auto forced = Region::format("shm:" + name + ":128M", fo);
  ASSERT_TRUE(forced.ok()) << forced.error().message();
  EXPECT_EQ(forced.value()->size(), 128 * MiB);
  EXPECT_FALSE(forced.value()->carve("keep").ok());
  std::remove(path.c_str());
}

TEST(RegionFormat, SizeOptionNamingAnotherSizeNamesBothSizes) {
  TempPool p("othersize");
  format_ok(p.uri(), 64 * MiB);
  FormatOptions fo;
  fo.size = 128 * MiB;
  auto again = Region::format(p.uri(), fo);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), -EEXIST);
  EXPECT_NE(again.error().message().find("64 MiB (67108864 bytes"), std::string::npos) << again.error().message();
  EXPECT_NE(again.error().message().find("as 128 MiB (134217728 bytes)"), std::string::npos)
      << again.error().message();
  struct stat st {};
  ASSERT_EQ(stat(p.path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * MiB);
}

TEST(RegionFormat, DamagedPoolMayBeReformattedWithoutForce) {
  TempPool p("damaged-reformat");
  format_ok(p.uri());
  corrupt(p, [](cxlkv_superblock& sb) { sb.magic = 1; }, false);
  FormatOptions fo;
  auto r = Region::format(p.uri(), fo);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r.value()->size(), 64 * MiB);
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

TEST(RegionOpen, FileShorterThanASuperblockIsTruncated) {
  TempPool p("short");
  format_ok(p.uri());
  ASSERT_EQ(truncate(p.path().c_str(), 100), 0);
  std::string e = open_error(p);
  EXPECT_NE(e.find("truncated: only 100 bytes"), std::string::npos) << e;
}

TEST(RegionOpen, PoolTruncatedAfterFormatIsRefused) {
  TempPool p("shrunk");
  format_ok(p.uri(), 64 * MiB);
  ASSERT_EQ(truncate(p.path().c_str(), 32 * MiB), 0);
  std::string e = open_error(p);
  EXPECT_NE(e.find("pool_size 67108864 does not match the mapping's 33554432 bytes"), std::string::npos) << e;
}

TEST(RegionOpen, OpenNeverFormats) {
  TempPool p("noformat");
  auto r = Region::open(p.uri());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOENT);
  EXPECT_NE(r.error().message().find("does not exist"), std::string::npos);
  EXPECT_NE(access(p.path().c_str(), F_OK), 0) << "open must not create the pool";
}

// ---- every corruption the validator names -----------------------------------

struct Corruption {
  const char* name;
  void (*mutate)(cxlkv_superblock&);
  const char* expected;  // substring of the error message
  bool fix_checksum = true;
};

cxlkv_carve make_carve(const char* name, uint64_t off, uint64_t size) {
  cxlkv_carve c{};
  std::strncpy(c.name, name, sizeof c.name - 1);
  c.offset = off;
  c.size = size;
  return c;
}

// Two valid carves a (2..4 MiB) and b (8..12 MiB) to damage.
void two_carves(cxlkv_superblock& sb) {
  sb.carves[0] = make_carve("a", 2 * MiB, 2 * MiB);
  sb.carves[1] = make_carve("b", 8 * MiB, 4 * MiB);
  sb.ncarves = 2;
}

const Corruption kCorruptions[] = {
    {"BadMagic", [](cxlkv_superblock& sb) { sb.magic = 0x1234; }, "bad magic 0x0000000000001234", false},
    {"UnknownLayoutVersion", [](cxlkv_superblock& sb) { sb.layout_version = 2; },
     "unknown layout version 2 (this build understands 1)"},
    {"WrongSuperblockSize", [](cxlkv_superblock& sb) { sb.sb_size = 512; }, "superblock size 512 is wrong"},
    {"PoolSizeMismatch", [](cxlkv_superblock& sb) { sb.pool_size = 128 * MiB; },
     "pool_size 134217728 does not match the mapping's 67108864 bytes"},
    {"ZeroMaxNodes", [](cxlkv_superblock& sb) { sb.max_nodes = 0; }, "max_nodes 0 out of range 1..64"},
    {"TooManyMaxNodes", [](cxlkv_superblock& sb) { sb.max_nodes = 65; }, "max_nodes 65 out of range 1..64"},
    {"TooManyCarves", [](cxlkv_superblock& sb) { sb.ncarves = 33; }, "ncarves 33 exceeds the table's 32 entries"},
    {"ReservedBytesSet", [](cxlkv_superblock& sb) { sb.reserved1[7] = 1; }, "reserved superblock bytes are not zero"},
    {"CarveNameInvalid",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].name[0] = 'B';
     },
     "carve 1 'B': invalid name"},
    {"CarveNameEmpty",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].name[0] = 0;
     },
     "carve 0 '': invalid name"},
    {"CarveNameNotTerminated",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       std::memset(sb.carves[0].name, 'x', sizeof sb.carves[0].name);
     },
     "name is not NUL-terminated"},
    {"CarveNameTrailingGarbage",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].name[20] = 'z';
     },
     "carve 0 'a': bytes after the name's NUL are not zero"},
    {"CarveMisaligned",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].offset += 4096;
     },
     "carve 1 'b': offset 0x0000000000801000 / size 0x0000000000400000 not aligned to 2 MiB"},
    {"CarveSizeZero",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].size = 0;
     },
     "carve 1 'b': size is zero"},
    {"CarveOverlapsSuperblock",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].offset = 0;
     },
     "carve 0 'a': offset 0x0000000000000000 overlaps the superblock area"},
    {"CarveOutsidePool",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].offset = 62 * MiB;
     },
     "carve 1 'b': range [0x0000000003e00000, +0x0000000000400000) lies outside the pool"},
    {"CarveOffsetOverflows",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].offset = ~uint64_t(0) - 2 * MiB + 1;
     },
     "carve 1 'b': range"},
    {"CarvesOverlap",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].offset = 2 * MiB;
       sb.carves[0].size = 4 * MiB;
     },
     "carve 1 'b': overlaps carve 'a'"},
    {"CarvesUnsorted",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       std::swap(sb.carves[0], sb.carves[1]);
     },
     "carve 1 'a': carve table not sorted by offset"},
    {"CarveNamesDuplicate",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[1].name[0] = 'a';
     },
     "carve 1 'a': duplicate carve name (also carve 0)"},
    {"CarveUnknownMemtype",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].memtype = 3;
     },
     "carve 0 'a': unknown memory type 3"},
    {"CarveUnknownFlags",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].flags = 0x80;
     },
     "carve 0 'a': unknown flags"},
    {"CarveReservedSet",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[0].reserved = 1;
     },
     "carve 0 'a': reserved field is not zero"},
    {"UnusedCarveEntryNotZero",
     [](cxlkv_superblock& sb) {
       two_carves(sb);
       sb.carves[5].size = 1;
     },
     "unused carve table entry 5 is not zero (ncarves 2)"},
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class RegionCorruption : public ::testing::TestWithParam<Corruption> {};

TEST_P(RegionCorruption, IsRefusedWithTheExactProblem) {
  const Corruption& c = GetParam();
  TempPool p(std::string("corrupt-") + c.name);
  format_ok(p.uri(), 64 * MiB);
  corrupt(p, c.mutate, c.fix_checksum);
  std::string e = open_error(p);
  EXPECT_NE(e.find(c.expected), std::string::npos) << "got: " << e;
  // The pool was not silently repaired or reformatted.
  EXPECT_NE(open_error(p).find(c.expected), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllCases, RegionCorruption, ::testing::ValuesIn(kCorruptions),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(RegionOpen, PoolSizeNotAMultipleOfTwoMiBIsRefused) {
  TempPool p("oddsize");
  format_ok(p.uri(), 64 * MiB);
  ASSERT_EQ(truncate(p.path().c_str(), 5 * MiB), 0);
  corrupt(p, [](cxlkv_superblock& sb) { sb.pool_size = 5 * MiB; });
  std::string e = open_error(p);
  EXPECT_NE(e.find("pool_size 5242880 is not a multiple of 2 MiB"), std::string::npos) << e;
}

TEST(RegionOpen, DamagedPoolRefusesCarveChangesOfAnOpenHandle) {
  TempPool p("live-damage");
  auto r = format_ok(p.uri());
  corrupt(p, [](cxlkv_superblock& sb) { sb.magic = 7; }, false);
  auto c = r->carve_create("late", 2 * MiB, MemType::wb);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("bad magic"), std::string::npos) << c.error().message();
  EXPECT_NE(c.error().message().find("not created"), std::string::npos);
}

// ---- carves -----------------------------------------------------------------

TEST(RegionCarves, RejectInvalidNames) {
  TempPool p("names");
  auto r = format_ok(p.uri());
  for (const char* bad : {"", "UPPER", "has space", "slash/", "0123456789012345678901234567890123"}) {
    auto c = r->carve_create(bad, 2 * MiB, MemType::wb);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), -EINVAL);
    EXPECT_NE(c.error().message().find("invalid name"), std::string::npos);
  }
  EXPECT_TRUE(r->carve_create("ok_name-1.x", 2 * MiB, MemType::wb).ok());
}

TEST(RegionCarves, DuplicateNameIsRefused) {
  TempPool p("dup");
  auto r = format_ok(p.uri());
  ASSERT_TRUE(r->carve_create("x", 2 * MiB, MemType::wb).ok());
  auto c = r->carve_create("x", 2 * MiB, MemType::wb);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), -EEXIST);
}

TEST(RegionCarves, TableHoldsThirtyTwoCarves) {
  TempPool p("full");
  auto r = format_ok(p.uri(), 128 * MiB);
  for (unsigned i = 0; i < CXLKV_MAX_CARVES; i++)
    ASSERT_TRUE(r->carve_create("c" + std::to_string(i), 2 * MiB, MemType::wb).ok()) << i;
  auto c = r->carve_create("one-more", 2 * MiB, MemType::wb);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), -ENOSPC);
  EXPECT_NE(c.error().message().find("carve table full"), std::string::npos);
}

TEST(RegionCarves, NoRoomNamesTheLargestFreeRange) {
  TempPool p("room");
  auto r = format_ok(p.uri(), 16 * MiB);
  ASSERT_TRUE(r->carve_create("a", 6 * MiB, MemType::wb).ok());
  auto c = r->carve_create("b", 10 * MiB, MemType::wb);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), -ENOSPC);
  EXPECT_NE(c.error().message().find("largest free range: 8 MiB"), std::string::npos) << c.error().message();
}

TEST(RegionCarves, RandomCreateRemoveKeepsCarvesAlignedAndDisjoint) {
  TempPool p("random");
  auto r = format_ok(p.uri(), 256 * MiB);
  uint64_t seed = 12345;
  auto rnd = [&] { return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int step = 0; step < 400; step++) {
    auto cs = r->carves();
    if (!cs.empty() && rnd() % 3 == 0) {
      ASSERT_TRUE(r->carve_remove(cs[rnd() % cs.size()].name).ok());
    } else {
      (void)r->carve_create("c" + std::to_string(step), (rnd() % (24 * MiB)) + 1, MemType::wb);
    }
    cs = r->carves();
    uint64_t end = CXLKV_FIRST_CARVE_OFF;
    for (const auto& c : cs) {
      ASSERT_EQ(c.offset % CXLKV_CARVE_ALIGN, 0u);
      ASSERT_EQ(c.size % CXLKV_CARVE_ALIGN, 0u);
      ASSERT_GE(c.offset, end) << "carves overlap or are unsorted at step " << step;
      end = c.offset + c.size;
    }
    ASSERT_LE(end, r->size());
  }
  cxlkv_superblock sb = r->superblock();
  EXPECT_TRUE(validate_superblock(p.uri(), &sb, sizeof sb, r->size()).ok());
}

TEST(RegionCarves, SystemCarvesNeedForce) {
  TempPool p("system");
  auto r = format_ok(p.uri());
  ASSERT_TRUE(r->carve_create("sys", 2 * MiB, MemType::uc, CXLKV_CARVE_F_SYSTEM).ok());
  auto rm = r->carve_remove("sys");
  ASSERT_FALSE(rm.ok());
  EXPECT_EQ(rm.error().code(), -EPERM);
  EXPECT_TRUE(r->carve_remove("sys", /*force=*/true).ok());
  EXPECT_EQ(r->carve_remove("sys").error().code(), -ENOENT);
}

TEST(RegionCarves, EveryChangeBumpsTheGeneration) {
  TempPool p("gen");
  auto r = format_ok(p.uri());
  uint64_t g0 = r->superblock().generation;
  ASSERT_TRUE(r->carve_create("x", 2 * MiB, MemType::wb).ok());
  ASSERT_TRUE(r->carve_remove("x").ok());
  EXPECT_EQ(r->superblock().generation, g0 + 2);
}

// ---- several pools, several handles ------------------------------------------

TEST(RegionPools, TwoPoolsOpenAtOnceAreIndependent) {
  TempPool p1("two-a"), p2("two-b");
  auto a = format_ok(p1.uri(), 32 * MiB);
  auto b = format_ok(p2.uri(), 64 * MiB);
  ASSERT_TRUE(a->carve_create("only-in-a", 2 * MiB, MemType::wb).ok());
  ASSERT_TRUE(b->carve_create("only-in-b", 4 * MiB, MemType::wc).ok());
  EXPECT_EQ(a->carves().size(), 1u);
  EXPECT_EQ(b->carves().size(), 1u);
  EXPECT_FALSE(a->carve("only-in-b").ok());
  EXPECT_EQ(b->carve("only-in-b")->size, 4 * MiB);
  EXPECT_NE(std::memcmp(a->superblock().pool_id, b->superblock().pool_id, 16), 0);
  // Data written through one pool's offsets does not appear in the other.
  uint64_t off = a->carve("only-in-a")->offset;
  std::memset(a->at(off), 0xab, 64);
  EXPECT_NE(*b->at<uint8_t>(off), 0xab);
}

TEST(RegionPools, SecondHandleSeesCarveChangesOfTheFirst) {
  TempPool p("handles");
  auto w = format_ok(p.uri());
  auto rr = Region::open(p.uri());
  ASSERT_TRUE(rr.ok());
  ASSERT_TRUE(w->carve_create("shared", 2 * MiB, MemType::wb).ok());
  EXPECT_TRUE(rr.value()->carve("shared").ok());
}

TEST(RegionPools, ReadWaitsOutAnUpdateInFlight) {
  TempPool p("inflight");
  auto r = format_ok(p.uri());
  // The reader is patient enough that a loaded machine cannot deschedule
  // the finisher past its window (the default 5 ms made this test flaky).
  OpenOptions patient;
  patient.torn_read_patience_us = 10'000'000;
  auto reader = Region::open(p.uri(), patient);
  ASSERT_TRUE(reader.ok()) << reader.error().message();
  // Another writer is midway through storing the image: checksum stale.
  auto* sb = r->at<cxlkv_superblock>(0);
  cxlkv_superblock good = *sb;
  sb->generation += 1;
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    cxlkv_superblock done = good;
    done.generation += 1;
    region::seal_superblock(done);
    std::memcpy(static_cast<void*>(sb), &done, sizeof done);
  });
  auto read = reader.value()->read_superblock();
  finisher.join();
  ASSERT_TRUE(read.ok()) << read.error().message();
  EXPECT_EQ(read->generation, good.generation + 1);
}

TEST(RegionPools, ConcurrentCarveChangesFromTwoHandlesAllLand) {
  TempPool p("concurrent");
  auto a = format_ok(p.uri(), 128 * MiB);
  auto b = Region::open(p.uri());
  ASSERT_TRUE(b.ok());
  auto make = [](Region* r, const char* prefix) {
    for (int i = 0; i < 12; i++) ASSERT_TRUE(r->carve_create(prefix + std::to_string(i), 2 * MiB, MemType::wb).ok());
  };
  std::thread ta(make, a.get(), "a"), tb(make, b.value().get(), "b");
  ta.join();
  tb.join();
  auto cs = a->carves();
  EXPECT_EQ(cs.size(), 24u) << "a carve created by one handle was lost by the other";
  cxlkv_superblock sb = a->superblock();
  EXPECT_TRUE(validate_superblock(p.uri(), &sb, sizeof sb, a->size()).ok());
}

TEST(RegionPools, ShmPoolRoundTrip) {
  std::string name = "cxlkv-region-test-" + std::to_string(getpid());
  std::string uri = "shm:" + name + ":8M";
  {
    auto r = Region::format(uri, FormatOptions{});
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r.value()->size(), 8 * MiB);
    EXPECT_EQ(r.value()->kind(), BackendKind::shm);
  }
  EXPECT_TRUE(Region::open("shm:" + name).ok());
  auto wrong = Region::open("shm:" + name + ":16M");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message().find("URI says 16777216"), std::string::npos) << wrong.error().message();
  std::remove(("/dev/shm/" + name).c_str());
}

TEST(RegionPools, PoolPtrIsAnOffset) {
  TempPool p("ptr");
  auto r = format_ok(p.uri());
  auto c = r->carve_create("data", 2 * MiB, MemType::wb);
  ASSERT_TRUE(c.ok());
  auto* x = r->at<uint64_t>(c->offset + 64);
  PoolPtr<uint64_t> pp = PoolPtr<uint64_t>::of(*r, x);
  EXPECT_EQ(pp.off, c->offset + 64);
  EXPECT_EQ(pp.get(*r), x);
  EXPECT_FALSE(PoolPtr<uint64_t>{});
  EXPECT_EQ(PoolPtr<uint64_t>{}.get(*r), nullptr);
}

// ---- URIs ---------------------------------------------------------------------

TEST(RegionUri, BadUrisSayWhatIsWrong) {
  struct {
    const char* uri;
    const char* expected;
  } cases[] = {
      {"", "empty"},
      {"pool", "no scheme"},
      {"nfs:/x", "unknown scheme 'nfs'"},
      {"shm::1G", "bad shm name ''"},
      {"shm:a/b:1G", "bad shm name 'a/b'"},
      {"shm:x:12Q", "bad size '12Q'"},
      {"shm:x:0", "bad size '0'"},
      {"file:", "empty file path"},
      {"dax:dax0.0", "needs an absolute device path"},
  };
  for (const auto& c : cases) {
    auto r = Region::open(c.uri);
    ASSERT_FALSE(r.ok()) << c.uri;
    EXPECT_EQ(r.error().code(), -EINVAL) << c.uri;
    EXPECT_NE(r.error().message().find(c.expected), std::string::npos) << r.error().message();
  }
}

TEST(RegionUri, SizesParse) {
  uint64_t v = 0;
  EXPECT_TRUE(region::parse_size("256M", &v) && v == 256 * MiB);
  EXPECT_TRUE(region::parse_size("4G", &v) && v == 4096 * MiB);
  EXPECT_TRUE(region::parse_size("4096", &v) && v == 4096);
  EXPECT_FALSE(region::parse_size("010x", &v));
  EXPECT_FALSE(region::parse_size("-1", &v));
  EXPECT_FALSE(region::parse_size("99999999999T", &v));
}

TEST(RegionBackends, DevWithoutTheModuleIsENODEV) {
  auto r = Region::open("dev:/dev/cxlkv0");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENODEV);
  EXPECT_NE(r.error().message().find("dev:/dev/cxlkv0"), std::string::npos);
}

// A fake device-dax: /dev/zero (a character device that maps as shared
// memory) described by a sysfs tree of our own through CXLKV_SYSFS.
class FakeDax : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/zero", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/zero not usable";
    root_ = "/tmp/cxlkv-fake-sysfs-" + std::to_string(getpid());
    ASSERT_EQ(std::system(("mkdir -p " + root_ + "/bus/dax/devices/zero").c_str()), 0);
    setenv("CXLKV_SYSFS", root_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("CXLKV_SYSFS");
    if (!root_.empty()) (void)std::system(("rm -rf " + root_).c_str());
  }
  void attr(const std::string& name, const std::string& value) {
    std::ofstream(root_ + "/bus/dax/devices/zero/" + name) << value << "\n";
  }
  std::string root_;
};

TEST_F(FakeDax, MapsAtTheDeviceAlignmentAndFormats) {
  attr("size", "33554432");
  attr("align", "2097152");
  FormatOptions fo;
  auto r = Region::format("dax:/dev/zero", fo);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r.value()->size(), 32 * MiB);
  EXPECT_EQ(r.value()->kind(), BackendKind::dax);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.value()->base()) % (2 * MiB), 0u);
  EXPECT_TRUE(r.value()->carve_create("x", 2 * MiB, MemType::wb).ok());
}

TEST_F(FakeDax, GivingASizeToADaxPoolIsRefused) {
  attr("size", "33554432");
  FormatOptions fo;
  fo.size = 64 * MiB;
  auto r = Region::format("dax:/dev/zero", fo);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("has the device's size"), std::string::npos) << r.error().message();
}

TEST_F(FakeDax, BadSysfsAttributesAreClearErrors) {
  attr("size", "0");
  auto r = Region::open("dax:/dev/zero");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("size is 0"), std::string::npos) << r.error().message();
  attr("size", "33554432");
  attr("align", "3000");
  r = Region::open("dax:/dev/zero");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("alignment 3000 is not a power of two"), std::string::npos)
      << r.error().message();
}

TEST(RegionBackends, DaxPathThatIsNotACharacterDeviceIsRefused) {
  auto r = Region::open("dax:/tmp");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("not a character device"), std::string::npos) << r.error().message();
}

TEST(RegionBackends, MissingDaxDeviceSaysSo) {
  auto r = Region::open("dax:/dev/dax99.9");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("dax:/dev/dax99.9"), std::string::npos);
  EXPECT_NE(r.error().message().find("No such file"), std::string::npos) << r.error().message();
}
