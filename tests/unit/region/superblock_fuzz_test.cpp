// SPDX-License-Identifier: MIT
// Randomized superblock fuzzing: many thousands of mutated superblocks go
// through validate_superblock() (and a sample through Region::open on file:
// pools).  The validator must never crash, must name the pool in every
// refusal, and must only accept superblocks whose carve table really is
// sane (checked here independently of the validator).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "cxlkv/region.hpp"
#include "pool/format.hpp"
#include "region/superblock.hpp"
#include "util/log.hpp"

using namespace cxlkv;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t kPoolSize = 16 * MiB;
constexpr int kIterations = 50000;
constexpr int kOpenEvery = 40;  // every 40th case also goes through Region::open

// Independent statement of what a valid carve table is.
::testing::AssertionResult carve_table_is_sane(const cxlkv_superblock& sb, uint64_t pool_size) {
  if (sb.ncarves > CXLKV_MAX_CARVES) return ::testing::AssertionFailure() << "ncarves";
  uint64_t end = CXLKV_FIRST_CARVE_OFF;
  for (uint32_t i = 0; i < sb.ncarves; i++) {
    const cxlkv_carve& c = sb.carves[i];
    if (c.offset % CXLKV_CARVE_ALIGN || c.size % CXLKV_CARVE_ALIGN || c.size == 0)
      return ::testing::AssertionFailure() << "carve " << i << " misaligned/empty";
    if (c.offset < end) return ::testing::AssertionFailure() << "carve " << i << " overlaps or unsorted";
    if (c.offset + c.size > pool_size || c.offset + c.size < c.offset)
      return ::testing::AssertionFailure() << "carve " << i << " outside";
    if (!region::valid_carve_name(std::string_view(c.name, strnlen(c.name, sizeof c.name))))
      return ::testing::AssertionFailure() << "carve " << i << " name";
    end = c.offset + c.size;
  }
  return ::testing::AssertionSuccess();
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  uint64_t next() { return rng_(); }
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }

  // An interesting value for a field of `width` bytes.
  uint64_t value(int width) {
    uint64_t mask = width == 8 ? ~0ull : ((1ull << (8 * width)) - 1);
    switch (below(8)) {
      case 0: return 0;
      case 1: return 1;
      case 2: return mask;
      case 3: return next() & mask;
      case 4: return (below(2 * kPoolSize / CXLKV_CARVE_ALIGN + 2) * CXLKV_CARVE_ALIGN) & mask;
      case 5: return below(70) & mask;
      case 6: return (kPoolSize + (below(3) - 1)) & mask;
      default: return (next() & 0xffff) & mask;
    }
  }

  void mutate(cxlkv_superblock& sb) {
    auto* bytes = reinterpret_cast<unsigned char*>(&sb);
    int rounds = 1 + static_cast<int>(below(4));
    for (int r = 0; r < rounds; r++) {
      switch (below(6)) {
        case 0: {  // bit flips anywhere
          int n = 1 + static_cast<int>(below(8));
          for (int i = 0; i < n; i++) {
            size_t at = below(sizeof sb);
            bytes[at] ^= static_cast<unsigned char>(1u << below(8));
          }
          break;
        }
        case 1: {  // a header field
          static const std::pair<size_t, int> fields[] = {{0, 8},  {8, 4},  {12, 4}, {16, 8}, {24, 4},
                                                          {28, 4}, {48, 8}, {56, 8}, {72, 8}, {120, 8}};
          auto [off, w] = fields[below(std::size(fields))];
          uint64_t v = value(w);
          std::memcpy(bytes + off, &v, static_cast<size_t>(w));
          break;
        }
        case 2: {  // a carve field
          size_t base = offsetof(cxlkv_superblock, carves) + below(CXLKV_MAX_CARVES / 4) * sizeof(cxlkv_carve);
          static const std::pair<size_t, int> fields[] = {{32, 8}, {40, 8}, {48, 4}, {52, 4}, {56, 8}};
          auto [off, w] = fields[below(std::size(fields))];
          uint64_t v = value(w);
          std::memcpy(bytes + base + off, &v, static_cast<size_t>(w));
          break;
        }
        case 3: {  // a carve name byte
          size_t base = offsetof(cxlkv_superblock, carves) + below(6) * sizeof(cxlkv_carve);
          static const char alphabet[] = "abz09_.-A /\x01\xff";
          bytes[base + below(CXLKV_CARVE_NAME_MAX)] =
              static_cast<unsigned char>(below(4) ? alphabet[below(sizeof alphabet - 1)] : 0);
          break;
        }
        case 4: {  // swap or copy carve entries
          uint32_t a = static_cast<uint32_t>(below(6)), b = static_cast<uint32_t>(below(6));
          if (below(2)) std::swap(sb.carves[a], sb.carves[b]);
          else sb.carves[a] = sb.carves[b];
          break;
        }
        default: {  // a run of random bytes
          size_t at = below(sizeof sb), n = 1 + below(16);
          for (size_t i = 0; i < n && at + i < sizeof sb; i++) bytes[at + i] = static_cast<unsigned char>(next());
          break;
        }
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

TEST(SuperblockFuzz, MutatedSuperblocksAreRefusedCleanlyOrReallyValid) {
  log().set_level(spdlog::level::off);  // thousands of expected refusals
  const std::string path = "/tmp/cxlkv-sb-fuzz-" + std::to_string(getpid());
  const std::string uri = "file:" + path;
  std::remove(path.c_str());

  // Seed image: the standard layout plus two user carves, so that the
  // carve-table checks have real entries to damage.
  {
    PoolFormatOptions o;
    o.size = kPoolSize;
    o.max_locks = CXLKV_MIN_LOCKS;
    auto r = format_pool(uri, o);
    ASSERT_TRUE(r.ok()) << r.error().message();
  }
  cxlkv_superblock seed{};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(&seed), sizeof seed);
  }
  ASSERT_TRUE(validate_superblock(uri, &seed, sizeof seed, kPoolSize).ok());
  ASSERT_GE(seed.ncarves, 4u);

  Mutator m(20261122);
  int accepted = 0, rejected = 0, deep = 0, opened = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < kIterations; it++) {
    cxlkv_superblock sb = seed;
    m.mutate(sb);
    bool sealed = m.below(10) < 7;  // most cases get past the checksum
    if (sealed) region::seal_superblock(sb);
    size_t avail = m.below(20) == 0 ? m.below(sizeof sb) : sizeof sb;  // truncations

    auto v = validate_superblock(uri, &sb, avail, kPoolSize);
    if (v.ok()) {
      accepted++;
      ASSERT_EQ(avail, sizeof sb);
      ASSERT_TRUE(carve_table_is_sane(sb, kPoolSize)) << "iteration " << it;
    } else {
      rejected++;
      ASSERT_NE(v.error().message().find(uri), std::string::npos) << v.error().message();
      ASSERT_LT(v.error().code(), 0);
      if (v.error().message().find("checksum") == std::string::npos) deep++;
    }

    if (it % kOpenEvery == 0) {
      // Through the whole open path on a file: pool, including truncated files.
      {
        std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
        f.write(reinterpret_cast<const char*>(&sb), sizeof sb);
      }
      if (avail < sizeof sb) {
        ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(avail)), 0);
      }
      auto r = Region::open(uri);
      if (r.ok()) {
        opened++;
        ASSERT_TRUE(v.ok()) << "open accepted what validate refused: " << v.error().message();
      } else {
        ASSERT_NE(r.error().message().find(uri), std::string::npos) << r.error().message();
      }
      if (avail < sizeof sb) {
        ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(kPoolSize)), 0);
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::remove(path.c_str());
  log().set_level(spdlog::level::warn);
  std::printf("fuzz: %d cases in %.2f s: %d accepted, %d rejected (%d past the checksum), %d opened\n",
              kIterations, secs, accepted, rejected, deep, opened);
  // The mix must exercise both outcomes and the checks behind the checksum.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(deep, kIterations / 4);
}
