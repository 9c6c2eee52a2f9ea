// SPDX-License-Identifier: MIT
// The "pnm" carve as a specification: a long context appended by one host
// is read by another -- page table, K/V rows and min/max digests -- exactly,
// under NonCoherentSim with random evictions; removing the writer's flush
// or the reader's invalidate is caught; handles of destroyed contexts go
// stale; one writer per partition; bad input is refused with a named cause;
// the writer lock file is opened safely; a refused open leaves no carve;
// damaged offsets and counts in the pool are refused naming the context and
// the field.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "pnm/pnm_internal.hpp"
#include "cxlkv/format/pnm_format.h"
#include "support/pnm_test_support.hpp"

using namespace cxlkv;
using namespace cxlkv::pnm;
using namespace cxlkv::pnm::test;

namespace {

constexpr uint64_t kPool = 16ull << 20;

StoreOptions small_store(uint32_t partition = 0, bool writer = true) {
  StoreOptions o;
  o.carve_bytes = 4ull << 20;
  o.partitions = 2;
  o.slots_per_partition = 8;
  o.partition = partition;
  o.writer = writer;
  return o;
}

Geometry geo(Dtype t, uint32_t page_tokens = 16, uint64_t max_tokens = 400) {
  Geometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 24;  // not a multiple of 16 or 32: the vector kernels' tails run too
  g.dtype = t;
  g.page_tokens = page_tokens;
  g.max_tokens = max_tokens;
  return g;
}

// What the writer appended, token by token: keys[l][h][t][d], values likewise.
struct History {
  explicit History(const Geometry& g) : g(g), k(size_t(g.layers) * g.kv_heads), v(k.size()) {}
  // Append a batch laid out [l][h][n][d] (as Context::append takes it).
  void add(const Tensor& kb, const Tensor& vb, uint32_t n) {
    for (uint32_t l = 0; l < g.layers; l++)
      for (uint32_t h = 0; h < g.kv_heads; h++)
        for (uint32_t i = 0; i < n * g.head_dim; i++) {
          const size_t src = (size_t(l) * g.kv_heads + h) * n * g.head_dim + i;
          k[l * g.kv_heads + h].push_back(kb.at(src));
          v[l * g.kv_heads + h].push_back(vb.at(src));
        }
  }
  uint64_t tokens() const { return k[0].size() / g.head_dim; }
  Geometry g;
  std::vector<std::vector<float>> k, v;
};

// Everything a reader can see of the context equals what was appended.
// Returns an empty string when it does, else the first difference.
std::string check_reader(Context& r, const History& hist) {
  const Geometry& g = hist.g;
  auto n = r.refresh();
  if (!n.ok()) return n.error().message();
  if (*n != hist.tokens()) return "count " + std::to_string(*n) + " != " + std::to_string(hist.tokens());
  const uint32_t np = r.pages_for(*n);
  std::vector<uint64_t> table(np);
  if (auto t = r.read_page_table(0, np, table.data()); !t.ok()) return t.error().message();
  const size_t es = dtype_size(g.dtype);
  std::vector<unsigned char> rows(g.page_tokens * g.head_dim * es), dig(np * 2 * g.head_dim * es);
  for (uint32_t l = 0; l < g.layers; l++)
    for (uint32_t h = 0; h < g.kv_heads; h++) {
      const auto& K = hist.k[l * g.kv_heads + h];
      const auto& V = hist.v[l * g.kv_heads + h];
      if (auto d = r.read_digests(l, h, 0, np, dig.data()); !d.ok()) return d.error().message();
      for (uint32_t p = 0; p < np; p++) {
        const uint32_t nt = uint32_t(std::min<uint64_t>(g.page_tokens, *n - uint64_t(p) * g.page_tokens));
        for (uint32_t kv = 0; kv < 2; kv++) {
          if (auto rr = r.read_rows(table[p], l, kv, h, nt, rows.data()); !rr.ok()) return rr.error().message();
          const auto& src = kv ? V : K;
          for (uint32_t i = 0; i < nt * g.head_dim; i++)
            if (detail::load_elem(g.dtype, rows.data(), i) != src[size_t(p) * g.page_tokens * g.head_dim + i])
              return std::string(kv ? "V" : "K") + " differs at layer " + std::to_string(l) + " head " +
                     std::to_string(h) + " page " + std::to_string(p) + " element " + std::to_string(i);
        }
        for (uint32_t d = 0; d < g.head_dim; d++) {
          float mn = INFINITY, mx = -INFINITY;
          for (uint32_t t = 0; t < nt; t++) {
            const float x = K[(size_t(p) * g.page_tokens + t) * g.head_dim + d];
            mn = std::min(mn, x);
            mx = std::max(mx, x);
          }
          const unsigned char* pd = dig.data() + size_t(p) * 2 * g.head_dim * es;
          if (detail::load_elem(g.dtype, pd, d) != mn || detail::load_elem(g.dtype, pd, g.head_dim + d) != mx)
            return "digest differs at layer " + std::to_string(l) + " head " + std::to_string(h) + " page " +
                   std::to_string(p) + " dim " + std::to_string(d);
        }
      }
    }
  return "";
}

// Appends random batches on host 0 and checks them from host 1 after each;
// returns the first failure ("" when every check passed).
std::string append_and_read(SharedPool& pool, Dtype t, uint32_t page_tokens, int batches, uint64_t seed,
                            uint64_t* appended = nullptr) {
  auto ws = ContextStore::open(pool.host(0), small_store(0));
  if (!ws.ok()) return ws.error().message();
  auto rs = ContextStore::open(pool.host(1), small_store(0, false));
  if (!rs.ok()) return rs.error().message();
  const Geometry g = geo(t, page_tokens);
  auto w = (*ws)->create(42, g);
  if (!w.ok()) return w.error().message();
  auto r = (*rs)->find(42);
  if (!r.ok()) return r.error().message();
  History hist(g);
  std::mt19937_64 rng(seed);
  for (int b = 0; b < batches; b++) {
    const uint32_t n = 1 + uint32_t(rng() % 23);
    if (hist.tokens() + n > g.max_tokens) break;
    Tensor kb = random_tensor(t, size_t(g.layers) * g.kv_heads * n * g.head_dim, rng);
    Tensor vb = random_tensor(t, kb.vals.size(), rng);
    if (auto a = (*w)->append(kb.data(), vb.data(), n); !a.ok()) return a.error().message();
    hist.add(kb, vb, n);
    if (appended) *appended = hist.tokens();
    if (auto c = check_reader(**r, hist); !c.empty()) return "after batch " + std::to_string(b) + ": " + c;
  }
  return "";
}

class PnmStoreDtype : public ::testing::TestWithParam<Dtype> {};

}  // namespace

TEST_P(PnmStoreDtype, AppendedTokensAndDigestsReachAnotherHostUnderRandomEvictions) {
  SharedPool pool(kPool, 2, 0.05, true, 0.01);
  uint64_t appended = 0;
  EXPECT_EQ("", append_and_read(pool, GetParam(), 16, 14, 1, &appended));
  EXPECT_GT(appended, 100u) << "several pages, the last one partial at times";
  EXPECT_GT(pool.sim->total().evictions, 0u);
}

TEST_P(PnmStoreDtype, PagesOfFiveTokensAreAppendedAcrossPageBoundaries) {
  SharedPool pool(kPool, 2, 0.05);
  EXPECT_EQ("", append_and_read(pool, GetParam(), 5, 10, 2));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PnmStoreDtype, ::testing::Values(Dtype::bf16, Dtype::f16, Dtype::f32),
                         [](const auto& i) { return std::string(to_string(i.param)); });

TEST(PnmStore, RemovedWriterFlushIsCaught) {
  SharedPool pool(kPool, 2, 0.0);
  pnm::testing::faults().skip_writer_flush = true;
  const std::string r = append_and_read(pool, Dtype::bf16, 16, 6, 3);
  pnm::testing::faults().skip_writer_flush = false;
  std::printf("caught: %s\n", r.c_str());
  EXPECT_NE("", r) << "a writer without clflush of page table / digests / descriptor went unnoticed";
}

TEST(PnmStore, RemovedReaderInvalidateIsCaught) {
  SharedPool pool(kPool, 2, 0.0);
  // The reader caches the count, page table and digests at the first check;
  // without invalidating it keeps seeing them after later appends.
  pnm::testing::faults().skip_reader_invalidate = true;
  const std::string r = append_and_read(pool, Dtype::bf16, 16, 6, 4);
  pnm::testing::faults().skip_reader_invalidate = false;
  std::printf("caught: %s\n", r.c_str());
  EXPECT_NE("", r) << "a reader without invalidate went unnoticed";
}

TEST(PnmStore, ExternalPagesWithGivenDigestsAreReadBack) {
  SharedPool pool(kPool, 2, 0.05);
  auto ws = ContextStore::open(pool.host(0), small_store(0));
  ASSERT_TRUE(ws.ok()) << ws.error().message();
  const Geometry g = geo(Dtype::bf16);
  auto w = (*ws)->create(7, g);
  ASSERT_TRUE(w.ok()) << w.error().message();
  // Pages written elsewhere (as a GPU would): raw offsets in the kv area of the pool.
  const uint64_t pb = (*w)->page_bytes();
  std::vector<uint64_t> offs = {8ull << 20, (8ull << 20) + 2 * ((pb + 63) / 64 * 64)};
  std::mt19937_64 rng(5);
  Tensor dg = random_tensor(Dtype::bf16, size_t(g.layers) * g.kv_heads * 2 * 2 * g.head_dim, rng);
  ASSERT_TRUE((*w)->append_pages(offs, dg.data(), 20).ok());
  auto rs = ContextStore::open(pool.host(1), small_store(0, false));
  ASSERT_TRUE(rs.ok());
  auto r = (*rs)->find(7);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(20u, (*r)->tokens());
  std::vector<uint64_t> table(2);
  ASSERT_TRUE((*r)->read_page_table(0, 2, table.data()).ok());
  EXPECT_EQ(offs, table);
  std::vector<unsigned char> got(2 * 2 * g.head_dim * 2);
  ASSERT_TRUE((*r)->read_digests(1, 1, 0, 2, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), dg.bytes.data() + 3 * got.size(), got.size()));
  // Not at a page boundary any more: whole pages only after full pages.
  auto again = (*w)->append_pages(offs, dg.data(), 32);
  EXPECT_EQ(-EINVAL, again.error().code());
  EXPECT_NE(std::string::npos, again.error().message().find("partial")) << again.error().message();
}

TEST(PnmStore, DestroyedContextHandlesGoStaleAndTheSlotIsReused) {
  SharedPool pool(kPool, 2, 0.05);
  auto ws = ContextStore::open(pool.host(0), small_store(0));
  auto rs = ContextStore::open(pool.host(1), small_store(0, false));
  ASSERT_TRUE(ws.ok() && rs.ok());
  auto w = (*ws)->create(1, geo(Dtype::bf16));
  ASSERT_TRUE(w.ok());
  auto r = (*rs)->find(1);
  ASSERT_TRUE(r.ok());
  const uint64_t before = (*ws)->heap_free();
  ASSERT_TRUE((*ws)->destroy(1).ok());
  EXPECT_EQ(-ESTALE, (*r)->refresh().error().code());
  EXPECT_EQ(-ENOENT, (*rs)->find(1).error().code());
  EXPECT_GT((*ws)->heap_free(), before) << "the heap of an empty partition is reset";
  auto w2 = (*ws)->create(2, geo(Dtype::bf16));
  ASSERT_TRUE(w2.ok());
  EXPECT_GT((*w2)->generation(), (*w)->generation());
  EXPECT_EQ(-ESTALE, (*r)->refresh().error().code()) << "a reused slot is another context";
}

TEST(PnmStore, OnePartitionHasOneWriterProcess) {
  SharedPool pool(kPool, 1, 0.0, false);
  auto a = ContextStore::open(pool.host(0), small_store(1));
  ASSERT_TRUE(a.ok()) << a.error().message();
  auto b = ContextStore::open(pool.host(0), small_store(1));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(-EBUSY, b.error().code());
  EXPECT_NE(std::string::npos, b.error().message().find("already has a writer")) << b.error().message();
  EXPECT_TRUE(ContextStore::open(pool.host(0), small_store(0)).ok()) << "another partition is free";
  EXPECT_TRUE(ContextStore::open(pool.host(0), small_store(1, false)).ok()) << "readers take no lock";
}

TEST(PnmStore, BadInputIsRefusedWithItsCause) {
  SharedPool pool(kPool, 1, 0.0, false);
  auto s = ContextStore::open(pool.host(0), small_store(0));
  ASSERT_TRUE(s.ok());
  Geometry bad = geo(Dtype::bf16);
  bad.head_dim = 0;
  EXPECT_EQ(-EINVAL, (*s)->create(1, bad).error().code());
  auto w = (*s)->create(1, geo(Dtype::bf16, 16, 32));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(-EEXIST, (*s)->create(1, geo(Dtype::bf16)).error().code());
  std::vector<unsigned char> kv(2 * 2 * 40 * 24 * 2);
  auto over = (*w)->append(kv.data(), kv.data(), 40);
  EXPECT_EQ(-ENOSPC, over.error().code());
  EXPECT_NE(std::string::npos, over.error().message().find("capacity")) << over.error().message();
  EXPECT_EQ(-EINVAL, (*w)->append(nullptr, kv.data(), 1).error().code());
  EXPECT_EQ(-EINVAL, (*w)->read_digests(2, 0, 0, 1, kv.data()).error().code());
  EXPECT_EQ(-ENOENT, (*s)->find(99).error().code());
  Geometry huge = geo(Dtype::bf16, 16, 1ull << 30);
  EXPECT_EQ(-ENOSPC, (*s)->create(3, huge).error().code());
  for (uint64_t id = 10; id < 17; id++) ASSERT_TRUE((*s)->create(id, geo(Dtype::bf16, 16, 16)).ok());
  auto full = (*s)->create(20, geo(Dtype::bf16, 16, 16));
  EXPECT_EQ(-ENOSPC, full.error().code());
  EXPECT_NE(std::string::npos, full.error().message().find("no free slot")) << full.error().message();
}

TEST(PnmStore, ASecondProcessReadsTheCarveGeometryFromItsHeader) {
  SharedPool pool(kPool, 2, 0.05);
  ASSERT_TRUE(ContextStore::open(pool.host(0), small_store(0)).ok());
  StoreOptions other = small_store(1, false);
  other.partitions = 9;  // ignored: the carve exists
  auto s = ContextStore::open(pool.host(1), other);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(2u, (*s)->partitions());
  EXPECT_EQ(8u, (*s)->slots_per_partition());
}

// ---- the writer lock file (util/safe_file.hpp rules) -----------------------------

namespace {

// What context_store.cpp names the lock file of `part` (one definition
// there; this mirrors it to plant things at the path).
std::string lock_file_of(const Region& r, uint32_t part) {
  std::string name;
  for (char c : r.uri()) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return "/dev/shm/cxlkv-pnm-" + name + "-p" + std::to_string(part) + ".lock";
}

struct Unlinked {
  std::vector<std::string> paths;
  ~Unlinked() {
    for (auto& p : paths) ::unlink(p.c_str());
  }
};

}  // namespace

TEST(PnmStore, ASymlinkAtTheLockFilePathIsRefusedAndItsTargetUntouched) {
  SharedPool pool(kPool, 1, 0.0, false);
  const std::string lp = lock_file_of(pool.host(0), 0);
  const std::string target = "/tmp/pnm-lock-target-" + std::to_string(getpid());
  Unlinked rm{{lp, target}};
  ::unlink(target.c_str());
  ASSERT_EQ(0, ::symlink(target.c_str(), lp.c_str()));
  auto s = ContextStore::open(pool.host(0), small_store(0));
  ASSERT_FALSE(s.ok()) << "the writer followed a link planted at " << lp;
  EXPECT_EQ(-ELOOP, s.error().code()) << s.error().message();
  EXPECT_NE(std::string::npos, s.error().message().find(lp)) << s.error().message();
  EXPECT_NE(std::string::npos, s.error().message().find("symbolic link")) << s.error().message();
  struct stat st {};
  EXPECT_NE(0, ::lstat(target.c_str(), &st)) << "the link's target was created";
  EXPECT_TRUE(ContextStore::open(pool.host(0), small_store(0, false)).ok()) << "readers take no lock file";
}

TEST(PnmStore, ALockFileOwnedByAnotherUserIsRefusedNamingIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a file of another uid)";
  SharedPool pool(kPool, 1, 0.0, false);
  const std::string lp = lock_file_of(pool.host(0), 1);
  Unlinked rm{{lp}};
  const int fd = ::open(lp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ASSERT_EQ(0, ::chown(lp.c_str(), 65534, 65534));  // nobody
  auto s = ContextStore::open(pool.host(0), small_store(1));
  ASSERT_FALSE(s.ok()) << "the writer took a lock file another user controls";
  EXPECT_EQ(-EPERM, s.error().code()) << s.error().message();
  EXPECT_NE(std::string::npos, s.error().message().find(lp + " is owned by uid 65534")) << s.error().message();
  // Writable by others: refused as well; the file is left as it was.
  ASSERT_EQ(0, ::chown(lp.c_str(), 0, 0));
  ASSERT_EQ(0, ::chmod(lp.c_str(), 0666));
  auto w = ContextStore::open(pool.host(0), small_store(1));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(-EPERM, w.error().code()) << w.error().message();
  EXPECT_NE(std::string::npos, w.error().message().find("writable by")) << w.error().message();
  // Our own file, mode 0600: the lock works as before.
  ASSERT_EQ(0, ::chmod(lp.c_str(), 0600));
  auto ok = ContextStore::open(pool.host(0), small_store(1));
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(-EBUSY, ContextStore::open(pool.host(0), small_store(1)).error().code());
}

// ---- damaged offsets and counts (cxlkv/format/pnm_format.h: checked before use) ----------

namespace {

// A context of 40 tokens (3 pages of 16) written on a coherent pool, whose
// bytes a test damages directly, and a reader store over it.
struct Damaged {
  Damaged() : pool(kPool, 1, 0.0, false) {
    ws = std::move(ContextStore::open(pool.host(0), small_store(0))).value();
    rs = std::move(ContextStore::open(pool.host(0), small_store(0, false))).value();
    w = std::move(ws->create(5, g)).value();
    std::mt19937_64 rng(3);
    Tensor k = random_tensor(g.dtype, size_t(g.layers) * g.kv_heads * 40 * g.head_dim, rng);
    Tensor v = random_tensor(g.dtype, k.vals.size(), rng);
    EXPECT_TRUE(w->append(k.data(), v.data(), 40).ok());
    auto c = pool.host(0).carve(CXLKV_CARVE_PNM);
    EXPECT_TRUE(c.ok());
    carve_off = c->offset;
    carve_size = c->size;
    const auto* h = at<cxlkv_pnm_header>(carve_off);
    slot = at<cxlkv_pnm_slot>(carve_off + h->parts_off + 64);  // partition 0, slot 0
    EXPECT_EQ(5u, slot->ctx.request_id);
  }
  template <class T>
  T* at(uint64_t off) {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(pool.base()) + off);
  }
  uint64_t* page_entry(uint32_t p) { return at<uint64_t>(slot->ctx.page_table_off + 8ull * p); }
  // One decode step over everything published, as a near-memory engine runs it.
  StepResult step(Context& c) {
    std::vector<float> q(size_t(g.layers) * 4 * g.head_dim, 0.25f);
    Engine eng;
    StepRequest req;
    req.ctx = &c;
    req.queries = q;
    req.q_heads = 4;
    req.all_pages = true;
    return eng.step(req);
  }
  Geometry g = geo(Dtype::f32, 16, 64);
  SharedPool pool;
  std::unique_ptr<ContextStore> ws, rs;
  std::unique_ptr<Context> w;
  uint64_t carve_off = 0, carve_size = 0;
  cxlkv_pnm_slot* slot = nullptr;
};

bool has(const Error& e, const std::string& s) { return e.message().find(s) != std::string::npos; }

}  // namespace

TEST(PnmStore, APageTableEntryOutsideTheContextsHeapIsRefusedBeforeAnyRead) {
  Damaged d;
  auto r = d.rs->find(5);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_TRUE(d.step(**r).status.ok()) << "undamaged";
  const uint64_t good = *d.page_entry(1);
  const uint64_t bad[] = {
      0,                                   // the superblock
      d.carve_off,                         // the pnm carve's header
      d.slot->ctx.page_table_off,          // the context's own page table
      d.carve_off + d.carve_size - 64,     // runs past the carve
      good + 8,                            // not 64-aligned
      uint64_t(kPool) - 64,                // runs past the pool
  };
  for (uint64_t off : bad) {
    *d.page_entry(1) = off;
    auto st = d.step(**r);
    ASSERT_FALSE(st.status.ok()) << "page table entry 1 = " << off << " was read as K/V";
    EXPECT_EQ(-EBADMSG, st.status.error().code()) << st.status.error().message();
    EXPECT_TRUE(has(st.status.error(), "pnm context 5: page table entry 1")) << st.status.error().message();
    std::vector<uint64_t> t(3);
    EXPECT_EQ(-EBADMSG, (*r)->read_page_table(0, 3, t.data()).error().code());
  }
  *d.page_entry(1) = good;
  EXPECT_TRUE(d.step(**r).status.ok()) << "repaired";
  // A writer cannot put such a page there either.
  std::vector<uint64_t> offs = {0};
  std::vector<unsigned char> dg(size_t(d.g.layers) * d.g.kv_heads * 2 * d.g.head_dim * 4);
  auto w2 = d.ws->create(6, d.g);
  ASSERT_TRUE(w2.ok());
  auto a = (*w2)->append_pages(offs, dg.data(), 16);
  EXPECT_EQ(-EINVAL, a.error().code());
  EXPECT_TRUE(has(a.error(), "superblock")) << a.error().message();
}

TEST(PnmStore, ACountRaisedByOneIsRefused) {
  Damaged d;
  auto r = d.rs->find(5);
  ASSERT_TRUE(r.ok()) << r.error().message();
  d.slot->count.ntokens = 41;  // one token past what was published, check not redone
  auto n = (*r)->refresh();
  ASSERT_FALSE(n.ok()) << "count " << *n << " accepted";
  EXPECT_EQ(-EBADMSG, n.error().code());
  EXPECT_TRUE(has(n.error(), "pnm context 5: count line check mismatch")) << n.error().message();
  auto st = d.step(**r);
  ASSERT_FALSE(st.status.ok());
  EXPECT_EQ(-EBADMSG, st.status.error().code());
  EXPECT_EQ(-EBADMSG, d.rs->find(5).error().code());
  // Past the capacity, or below what this handle read before, with a valid check.
  for (uint64_t forged : {uint64_t(1) << 40, uint64_t(16)}) {
    d.slot->count.ntokens = forged;
    d.slot->count.check = cxlkv_pnm_count_check(&d.slot->count);
    auto f = (*r)->refresh();
    ASSERT_FALSE(f.ok()) << "count " << forged << " accepted";
    EXPECT_EQ(-EBADMSG, f.error().code());
    EXPECT_TRUE(has(f.error(), "ntokens")) << f.error().message();
  }
}

TEST(PnmStore, AForgedCountGenerationIsRefusedNotReadAsEmpty) {
  Damaged d;
  auto r = d.rs->find(5);
  ASSERT_TRUE(r.ok()) << r.error().message();
  d.slot->count.generation += 7;
  d.slot->count.check = cxlkv_pnm_count_check(&d.slot->count);
  auto n = (*r)->refresh();
  ASSERT_FALSE(n.ok()) << "the context read as " << *n << " tokens";
  EXPECT_EQ(-EBADMSG, n.error().code());
  EXPECT_TRUE(has(n.error(), "pnm context 5: count line names generation")) << n.error().message();
  auto st = d.step(**r);
  ASSERT_FALSE(st.status.ok()) << "attend succeeded over a forged empty context";
  EXPECT_EQ(-EBADMSG, st.status.error().code());
  // A context really destroyed is still -ESTALE, not damage.
  d.slot->count.generation -= 7;
  d.slot->count.check = cxlkv_pnm_count_check(&d.slot->count);
  ASSERT_TRUE((*r)->refresh().ok());
  ASSERT_TRUE(d.ws->destroy(5).ok());
  EXPECT_EQ(-ESTALE, (*r)->refresh().error().code());
}

TEST(PnmStore, DescriptorOffsetsOutsideTheirPartitionHeapAreRefusedAtFind) {
  Damaged d;
  const cxlkv_pnm_ctx good = d.slot->ctx;
  struct Forgery {
    const char* field;
    void (*apply)(cxlkv_pnm_ctx&, uint64_t carve_off);
  };
  const Forgery forged[] = {
      {"page_table_off", [](cxlkv_pnm_ctx& c, uint64_t) { c.page_table_off = 0; }},
      {"page_table_off", [](cxlkv_pnm_ctx& c, uint64_t off) { c.page_table_off = off; }},
      {"digest_off", [](cxlkv_pnm_ctx& c, uint64_t) { c.digest_off = 64; }},
      {"page_table_off", [](cxlkv_pnm_ctx& c, uint64_t) { c.max_pages = 1u << 30; }},  // tables past the heap
      {"geometry has a zero field", [](cxlkv_pnm_ctx& c, uint64_t) { c.kv_heads = 0; c.page_bytes = 0; }},
  };
  for (const auto& f : forged) {
    cxlkv_pnm_ctx c = good;
    f.apply(c, d.carve_off);
    c.check = cxlkv_pnm_ctx_check(&c);
    d.slot->ctx = c;
    auto r = d.rs->find(5);
    ASSERT_FALSE(r.ok()) << f.field << " forged and accepted";
    EXPECT_EQ(-EBADMSG, r.error().code()) << r.error().message();
    EXPECT_TRUE(has(r.error(), "pnm context 5")) << r.error().message();
    EXPECT_TRUE(has(r.error(), f.field)) << r.error().message();
  }
  d.slot->ctx = good;
  EXPECT_TRUE(d.rs->find(5).ok());
}

TEST(PnmStore, ARefusedOpenLeavesNoCarveBehind) {
  SharedPool pool(kPool, 1, 0.0, false);
  StoreOptions o = small_store(0);
  o.slots_per_partition = 0xffffffffu;
  auto s = ContextStore::open(pool.host(0), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(-EINVAL, s.error().code());
  EXPECT_NE(std::string::npos, s.error().message().find("too small")) << s.error().message();
  EXPECT_EQ(-ENOENT, pool.host(0).carve(CXLKV_CARVE_PNM).error().code()) << "a carve without a header was left";
  o = small_store(0);
  o.partitions = 1u << 20;  // its statistics alone fill the carve
  EXPECT_EQ(-EINVAL, ContextStore::open(pool.host(0), o).error().code());
  EXPECT_EQ(-ENOENT, pool.host(0).carve(CXLKV_CARVE_PNM).error().code());
  const auto t0 = std::chrono::steady_clock::now();
  auto ok = ContextStore::open(pool.host(0), small_store(0));
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "waited for a header";
}
