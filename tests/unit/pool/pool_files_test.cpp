// SPDX-License-Identifier: MIT
// Pool, node-local and SSD files in shared directories
// (docs/operations.md "Files in shared directories"), pools allocated up
// front and pre-faulted, optionally with huge pages (docs/operations.md
// "Memory up front").
//
// The cases with another user run as root: a forked child switches to uid
// 65534 (nobody) and squats the name; without root they are skipped.  The
// small-file-system cases mount a tmpfs of a few MiB (root; skipped when the
// mount is refused).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "pool/format.hpp"
#include "sync/node_local.hpp"
#include "tier/ssd_device.hpp"
#include "util/safe_file.hpp"

using namespace cxlkv;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uid_t kOtherUid = 65534;  // nobody

std::string unique(const std::string& tag) {
  return "cxlkv-pool-files-" + tag + "-" + std::to_string(getpid());
}

// A file holding bytes that must survive: what a symlink would point at.
struct Victim {
  std::string path = "/tmp/" + unique("victim");
  Victim() {
    std::ofstream(path) << "precious";
  }
  ~Victim() { std::remove(path.c_str()); }
  bool intact() const {
    std::ifstream in(path);
    std::string s;
    in >> s;
    struct stat st {};
    return s == "precious" && stat(path.c_str(), &st) == 0 && st.st_size == 8;
  }
};

struct Removed {
  std::string path;
  ~Removed() { std::remove(path.c_str()); }
};

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Run `fn` in a child process as uid/gid 65534; true when it exited 0.
template <class F>
bool as_other_user(F fn) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(kOtherUid) != 0 || setuid(kOtherUid) != 0) _exit(2);
    _exit(fn() ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// Field `key` (e.g. "Rss:") of the smaps entry of the mapping at `addr`, in bytes.
uint64_t smaps_field(const void* addr, const char* key) {
  char head[32];
  std::snprintf(head, sizeof head, "%" PRIxPTR "-", reinterpret_cast<uintptr_t>(addr));
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    bool is_head = line.find(':') > line.find(' ');
    if (is_head) {
      if (inside) break;
      inside = line.rfind(head, 0) == 0;
      continue;
    }
    unsigned long long kb = 0;
    if (inside && line.rfind(key, 0) == 0 && std::sscanf(line.c_str() + std::strlen(key), " %llu kB", &kb) == 1)
      return kb * 1024;
  }
  return 0;
}

// A tmpfs of `size` mounted for this test (root only).
struct SmallTmpfs {
  std::string dir = "/tmp/" + unique("mnt");
  bool ok = false;
  explicit SmallTmpfs(const std::string& opts) {
    mkdir(dir.c_str(), 0700);
    ok = mount("none", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (ok) umount2(dir.c_str(), MNT_DETACH);
    rmdir(dir.c_str());
  }
};

#define NEED_ROOT() \
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a second uid / a tmpfs mount)"

}  // namespace

// ---- symbolic links -------------------------------------------------------

// The red-team case: `ln -s /root-owned/file /dev/shm/NAME`, then root's
// format resized and overwrote the file.
TEST(PoolFiles, SymlinkAtAShmPoolNameIsNeverFollowed) {
  Victim v;
  std::string name = unique("link"), link = "/dev/shm/" + name;
  Removed rm{link};
  ASSERT_EQ(symlink(v.path.c_str(), link.c_str()), 0);
  for (bool force : {false, true}) {
    FormatOptions fo;
    fo.force = force;
    auto r = Region::format("shm:" + name + ":8M", fo);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), -ELOOP);
    EXPECT_TRUE(contains(r.error().message(), link + " is a symbolic link")) << r.error().message();
    auto p = format_pool("shm:" + name + ":16M", PoolFormatOptions{.force = force});
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error().code(), -ELOOP);
  }
  auto o = Region::open("shm:" + name);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().code(), -ELOOP);
  EXPECT_TRUE(v.intact()) << "the link's target was modified";
}

TEST(PoolFiles, SymlinkAtAFilePoolPathIsNeverFollowed) {
  Victim v;
  std::string link = "/tmp/" + unique("filelink");
  Removed rm{link};
  ASSERT_EQ(symlink(v.path.c_str(), link.c_str()), 0);
  FormatOptions fo;
  fo.size = 8 * MiB;
  fo.force = true;
  auto r = Region::format("file:" + link, fo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ELOOP);
  EXPECT_TRUE(contains(r.error().message(), "pool file:" + link)) << r.error().message();
  EXPECT_TRUE(v.intact());
}

TEST(PoolFiles, SymlinkAtANodeLocalNameIsNeverFollowed) {
  Victim v;
  std::string name = unique("node-local"), link = "/dev/shm/" + name;
  Removed rm{link};
  ASSERT_EQ(symlink(v.path.c_str(), link.c_str()), 0);
  uint8_t id[16] = {1};
  auto nl = NodeLocal::open(name, 1, id, 64, 4, 1 << 20);
  ASSERT_FALSE(nl.ok());
  EXPECT_EQ(nl.error().code(), -ELOOP);
  EXPECT_TRUE(contains(nl.error().message(), "node-local memory: " + link + " is a symbolic link"))
      << nl.error().message();
  EXPECT_TRUE(v.intact());
}

TEST(PoolFiles, SymlinkAtAnSsdPathIsNeverFollowed) {
  Victim v;
  std::string link = "/tmp/" + unique("ssdlink");
  Removed rm{link};
  ASSERT_EQ(symlink(v.path.c_str(), link.c_str()), 0);
  tier::SsdDeviceOptions so;
  so.path = link;
  so.create_bytes = 8 * MiB;
  auto d = tier::SsdDevice::open(so);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), -ELOOP);
  EXPECT_TRUE(contains(d.error().message(), "SSD device: " + link + " is a symbolic link")) << d.error().message();
  EXPECT_TRUE(v.intact());
}

// ---- files of another user -----------------------------------------------

// An unprivileged user pre-creates the pool name 0666 (to read every KV block
// later, or crash cxlkvd with one write); root's format must refuse it.
TEST(PoolFiles, PoolPreCreatedByAnotherUserIsRefused) {
  NEED_ROOT();
  std::string name = unique("squat"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(as_other_user([&] {
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
    return fd >= 0 && fchmod(fd, 0666) == 0 && close(fd) == 0;
  }));
  for (bool force : {false, true}) {
    FormatOptions fo;
    fo.force = force;
    auto r = Region::format("shm:" + name + ":8M", fo);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), -EPERM);
    EXPECT_TRUE(contains(r.error().message(), path + " is owned by uid 65534")) << r.error().message();
  }
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the squatted file was written";
}

TEST(PoolFiles, NodeLocalFilePreCreatedByAnotherUserIsRefused) {
  NEED_ROOT();
  std::string name = unique("squat-node"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(as_other_user([&] {
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    return fd >= 0 && close(fd) == 0;
  }));
  uint8_t id[16] = {2};
  auto nl = NodeLocal::open(name, 1, id, 64, 4, 1 << 20);
  ASSERT_FALSE(nl.ok());
  EXPECT_EQ(nl.error().code(), -EPERM);
  EXPECT_TRUE(contains(nl.error().message(), "owned by uid 65534")) << nl.error().message();
}

// `cxlkv-replay --ssd /tmp/NAME` after another user created /tmp/NAME 0666:
// refused, and the file is not written.
TEST(PoolFiles, SsdFilePreCreatedByAnotherUserIsRefused) {
  NEED_ROOT();
  std::string path = "/tmp/" + unique("squat-ssd");
  Removed rm{path};
  ASSERT_TRUE(as_other_user([&] {
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
    return fd >= 0 && fchmod(fd, 0666) == 0 && close(fd) == 0;
  }));
  tier::SsdDeviceOptions so;
  so.path = path;
  so.create_bytes = 8 * MiB;
  auto d = tier::SsdDevice::open(so);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), -EPERM);
  EXPECT_TRUE(contains(d.error().message(), "SSD device: " + path + " is owned by uid 65534")) << d.error().message();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST(PoolFiles, ExistingPoolOfAnotherUserIsNotOpened) {
  NEED_ROOT();
  std::string name = unique("theirs"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(Region::format("shm:" + name + ":8M", FormatOptions{}).ok());
  ASSERT_EQ(chown(path.c_str(), kOtherUid, kOtherUid), 0);
  auto r = Region::open("shm:" + name);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EPERM);
}

// ---- modes and links -----------------------------------------------------

TEST(PoolFiles, FileWritableByOthersIsRefusedUnlessTheOperatorAllowsIt) {
  std::string name = unique("mode"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(Region::format("shm:" + name + ":8M", FormatOptions{}).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "created with the default mode";

  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  auto r = Region::open("shm:" + name);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EPERM);
  EXPECT_TRUE(contains(r.error().message(), "writable by group and others (mode 0666) beyond the configured mode 0600"))
      << r.error().message();
  ASSERT_EQ(chmod(path.c_str(), 0620), 0);
  r = Region::open("shm:" + name);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.error().message(), "writable by group (mode 0620)")) << r.error().message();

  EnvVar env("CXLKV_FILE_MODE", "0660");
  r = Region::open("shm:" + name);
  EXPECT_TRUE(r.ok()) << r.error().message();  // 0620 is within 0660
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  EXPECT_FALSE(Region::open("shm:" + name).ok());  // others still may not write
}

TEST(PoolFiles, CreatedFilesTakeTheConfiguredModeWhateverTheUmask) {
  EnvVar env("CXLKV_FILE_MODE", "0660");
  mode_t old = umask(077);
  std::string name = unique("mkmode"), path = "/dev/shm/" + name;
  Removed rm{path};
  auto r = Region::format("shm:" + name + ":8M", FormatOptions{});
  umask(old);
  ASSERT_TRUE(r.ok()) << r.error().message();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST(PoolFiles, HardLinkedPoolIsRefused) {
  std::string name = unique("hard"), path = "/dev/shm/" + name, other = path + "-link";
  Removed rm{path}, rm2{other};
  ASSERT_TRUE(Region::format("shm:" + name + ":8M", FormatOptions{}).ok());
  ASSERT_EQ(link(path.c_str(), other.c_str()), 0);
  auto r = Region::open("shm:" + name);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EPERM);
  EXPECT_TRUE(contains(r.error().message(), "has 2 hard links")) << r.error().message();
}

// ---- allocation up front -------------------------------------------------

// "shm:x:1T on a 24 GiB tmpfs": an error at format, and nothing left behind.
TEST(PoolFiles, PoolLargerThanItsFileSystemFailsAtFormat) {
  std::string name = unique("huge-size"), path = "/dev/shm/" + name;
  Removed rm{path};
  auto t0 = std::chrono::steady_clock::now();
  auto r = format_pool("shm:" + name + ":1T", PoolFormatOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOSPC);
  EXPECT_TRUE(contains(r.error().message(), "cannot allocate 1 TiB for " + path)) << r.error().message();
  EXPECT_TRUE(contains(r.error().message(), "free")) << r.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the failed format left " << path;
}

TEST(PoolFiles, SmallFileSystemFailsAtFormatNotWithSigbusLater) {
  NEED_ROOT();
  SmallTmpfs fs("size=32m");
  if (!fs.ok) GTEST_SKIP() << "cannot mount a tmpfs here";
  std::string path = fs.dir + "/pool";
  // Fits the free-space check (the file system is empty) but not the tmpfs
  // once something else took space: fill half of it first.
  std::string filler = fs.dir + "/filler";
  {
    int fd = open(filler.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(posix_fallocate(fd, 0, 24 * MiB), 0);
    close(fd);
  }
  PoolFormatOptions o;
  o.size = 16 * MiB;
  auto r = format_pool("file:" + path, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOSPC);
  EXPECT_TRUE(contains(r.error().message(), "cannot allocate 16 MiB for " + path)) << r.error().message();
  EXPECT_TRUE(contains(r.error().message(), "32 MiB")) << r.error().message();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the failed format left its file";

  // With room, the whole pool is allocated at format: no hole for a SIGBUS.
  std::remove(filler.c_str());
  auto ok = format_pool("file:" + path, o);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 16 * MiB);
}

// A forced reformat to a size that does not fit leaves the old pool as it was.
TEST(PoolFiles, FailedGrowKeepsTheOldPool) {
  NEED_ROOT();
  SmallTmpfs fs("size=32m");
  if (!fs.ok) GTEST_SKIP() << "cannot mount a tmpfs here";
  std::string uri = "file:" + fs.dir + "/pool";
  PoolFormatOptions o;
  o.size = 16 * MiB;
  ASSERT_TRUE(format_pool(uri, o).ok());
  o.size = 64 * MiB;
  o.force = true;
  auto r = format_pool(uri, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -ENOSPC);
  auto still = Region::open(uri);
  ASSERT_TRUE(still.ok()) << still.error().message();
  EXPECT_EQ(still.value()->size(), 16 * MiB);
  EXPECT_EQ(still.value()->carves().size(), 4u);
}

// ---- pre-faulting and huge pages -------------------------------------------

TEST(PoolFiles, AttachFaultsTheWholePoolIn) {
  std::string name = unique("prefault"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(format_pool("shm:" + name + ":32M", PoolFormatOptions{}).ok());
  auto r = Region::open("shm:" + name);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(smaps_field(r.value()->base(), "Rss:"), 32 * MiB) << "every page mapped at attach";

  OpenOptions lazy;
  lazy.prefault = false;
  auto l = Region::open("shm:" + name, lazy);
  ASSERT_TRUE(l.ok());
  EXPECT_LT(smaps_field(l.value()->base(), "Rss:"), 4 * MiB) << "prefault off maps pages on touch";
  {
    EnvVar env("CXLKV_PREFAULT", "0");
    auto e = Region::open("shm:" + name);
    ASSERT_TRUE(e.ok());
    EXPECT_LT(smaps_field(e.value()->base(), "Rss:"), 4 * MiB) << "CXLKV_PREFAULT=0 turns it off";
  }
}

// OpenOptions::map_on_use: attach maps nothing; prepare() maps whole 2 MiB
// granules once, and only those a range touches.
TEST(PoolFiles, MapOnUseAttachMapsOnlyThePreparedGranules) {
  std::string name = unique("onuse"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(format_pool("shm:" + name + ":32M", PoolFormatOptions{}).ok());
  OpenOptions o;
  o.map_on_use = true;
  auto r = Region::open("shm:" + name, o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const Region& pool = *r.value();
  const uint64_t at_attach = smaps_field(pool.base(), "Rss:");
  EXPECT_LT(at_attach, 4 * MiB) << "nothing but what attach read is mapped";

  // Read fault-around may map up to a window (64 KiB) beside a range's ends.
  constexpr uint64_t kSlack = 256 * 1024;
  auto near = [&](uint64_t got, uint64_t want) { return got + 64 * 1024 >= want && got <= want + kSlack; };
  pool.prepare(16 * MiB + 100, 1);  // one byte: its whole granule [16, 18) MiB
  const uint64_t one = smaps_field(pool.base(), "Rss:");
  EXPECT_PRED2(near, one, at_attach + 2 * MiB) << "the granule of the byte is mapped";
  pool.prepare(16 * MiB, 2 * MiB);  // the same granule again: nothing new
  EXPECT_EQ(smaps_field(pool.base(), "Rss:"), one);
  pool.prepare(16 * MiB + 4096, 4 * MiB);  // granules 8 (mapped), 9 and 10 (new)
  const uint64_t three = smaps_field(pool.base(), "Rss:");
  EXPECT_PRED2(near, three, one + 4 * MiB);
  pool.prepare(31 * MiB, 64 * MiB);  // past the end: up to the end only (granule 15)
  const uint64_t four = smaps_field(pool.base(), "Rss:");
  EXPECT_PRED2(near, four, three + 2 * MiB);
  pool.prepare(64 * MiB, 2 * MiB);  // outside the pool: nothing
  EXPECT_EQ(smaps_field(pool.base(), "Rss:"), four);
  EXPECT_LT(four, 12 * MiB) << "4 granules of 16 and what attach read";

  // The bytes are the pool's: a write through one mapping is read through another.
  std::memset(pool.at(17 * MiB), 0x5a, 4096);
  auto whole = Region::open("shm:" + name);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(std::to_integer<int>(*whole.value()->at(17 * MiB + 4095)), 0x5a);
  // Without map_on_use prepare() has nothing to do (all mapped at attach).
  whole.value()->prepare(0, 32 * MiB);
  EXPECT_EQ(smaps_field(whole.value()->base(), "Rss:"), 32 * MiB);
}

// A KV store over a map_on_use pool maps each block's payload before its
// copy: a put and a get move the right bytes, and the pool stays mapped
// only around what was used.
TEST(PoolFiles, MapOnUseKvStoreMapsEachBlockBeforeItsCopy) {
  const std::string name = unique("onusekv"), uri = "shm:" + name + ":64M";
  Removed rm{"/dev/shm/" + name};
  PoolFormatOptions fo;
  ASSERT_TRUE(format_pool(uri, fo).ok());
  OpenOptions o;
  o.map_on_use = true;
  auto region = Region::open("shm:" + name, o);
  ASSERT_TRUE(region.ok()) << region.error().message();
  auto mgr = LockManager::create(*region.value());
  ASSERT_TRUE(mgr.ok()) << mgr.error().message();
  mgr.value()->start();
  NodeOptions no;
  no.node = 1;
  auto node = NodeContext::attach(*region.value(), no);
  ASSERT_TRUE(node.ok()) << node.error().message();
  const std::string local = node.value()->local_shm_name();
  {
    auto s = open_kv_session(*region.value(), *node.value());
    ASSERT_TRUE(s.ok()) << s.error().message();
    KvStore& kv = s.value()->store();
    const uint64_t before = smaps_field(region.value()->base(), "Rss:");
    const uint64_t bytes = 2 * MiB;
    std::vector<std::byte> src(bytes), got(bytes);
    for (size_t i = 0; i < bytes; i++) src[i] = std::byte(i * 7 + i / 4096);
    BlockKey k{0x1234, 0x5678};
    Chunk in{src.data(), bytes}, out{got.data(), bytes};
    uint32_t nch = 1;
    int32_t st = -1;
    auto put = kv.put_chain(nullptr, {&k, 1}, bytes, {&in, 1}, {&nch, 1}, {&st, 1});
    ASSERT_TRUE(put.ok()) << put.error().message();
    ASSERT_EQ(put.value(), 1u) << "status " << st;
    const uint64_t after_put = smaps_field(region.value()->base(), "Rss:");
    EXPECT_GE(after_put, before + bytes - 64 * 1024) << "the block's payload was mapped for the write";
    EXPECT_LT(after_put, 24 * MiB) << "not the whole 64 MiB pool";
    auto get = kv.get_many({&k, 1}, {&out, 1}, {&nch, 1}, {&st, 1});
    ASSERT_TRUE(get.ok()) << get.error().message();
    ASSERT_EQ(get.value(), 1u) << "status " << st;
    EXPECT_EQ(std::memcmp(src.data(), got.data(), bytes), 0) << "byte-exact";
  }
  node.value().reset();
  shm_unlink(("/" + local).c_str());
  mgr.value()->stop();
}

TEST(PoolFiles, HugePagesFallBackOnATmpfsWithoutThem) {
  std::string name = unique("nohuge"), path = "/dev/shm/" + name;
  Removed rm{path};
  ASSERT_TRUE(Region::format("shm:" + name + ":8M", FormatOptions{}).ok());
  if (smaps_field(Region::open("shm:" + name).value()->base(), "ShmemPmdMapped:") > 0)
    GTEST_SKIP() << "/dev/shm gives huge pages here";
  OpenOptions prefer;
  prefer.huge_pages = HugePages::prefer;
  auto p = Region::open("shm:" + name, prefer);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.value()->base()) % (2 * MiB), 0u) << "mapped 2 MiB aligned";
  OpenOptions require;
  require.huge_pages = HugePages::require;
  auto q = Region::open("shm:" + name, require);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().code(), -EOPNOTSUPP);
  EXPECT_TRUE(contains(q.error().message(), "huge pages required but the file system gave 4 KiB pages"))
      << q.error().message();
  // A format that requires them leaves nothing behind.
  std::string other = unique("nohuge-fmt");
  Removed rm2{"/dev/shm/" + other};
  auto f = Region::format("shm:" + other + ":8M", FormatOptions{}, require);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), -EOPNOTSUPP);
  EXPECT_NE(access(("/dev/shm/" + other).c_str(), F_OK), 0);
}

TEST(PoolFiles, HugePagesBackThePoolOnAHugeTmpfs) {
  NEED_ROOT();
  SmallTmpfs fs("size=64m,huge=always");
  if (!fs.ok) GTEST_SKIP() << "cannot mount a tmpfs here";
  std::string uri = "file:" + fs.dir + "/pool";
  PoolFormatOptions o;
  o.size = 16 * MiB;
  OpenOptions huge;
  huge.huge_pages = HugePages::require;
  auto r = format_pool(uri, o, huge);
  if (!r.ok() && r.error().code() == -EOPNOTSUPP) GTEST_SKIP() << "no THP for tmpfs: " << r.error().message();
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto a = Region::open(uri, huge);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_GE(smaps_field(a.value()->base(), "FilePmdMapped:") + smaps_field(a.value()->base(), "ShmemPmdMapped:"),
            8 * MiB);
}

// ---- the helper itself -----------------------------------------------------

TEST(SafeOpen, CreatesExclusivelyAndReportsIt) {
  std::string path = "/tmp/" + unique("safe");
  Removed rm{path};
  util::SafeOpenOptions o;
  o.what = "test file";
  auto m = util::safe_open(path, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), -ENOENT);
  o.create = true;
  auto c = util::safe_open(path, o);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_TRUE(c->created);
  close(c->fd);
  auto again = util::safe_open(path, o);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  close(again->fd);
}

TEST(SafeOpen, DirectoriesAndFifosAreNotFiles) {
  util::SafeOpenOptions o;
  o.what = "test file";
  auto d = util::safe_open("/tmp", o);
  ASSERT_FALSE(d.ok());
  std::string fifo = "/tmp/" + unique("fifo");
  Removed rm{fifo};
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  o.extra_flags = O_NONBLOCK;
  auto f = util::safe_open(fifo, o);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), -EINVAL);
  EXPECT_TRUE(contains(f.error().message(), "is not a regular file")) << f.error().message();
}

// A node-local file that cannot be sized (a file size limit stands in for a
// full /dev/shm; SIGXFSZ ignored, so ftruncate returns EFBIG): the attach
// fails naming the file and the cause.  The half-built node context used to
// crash in its destructor (it released grants from node-local memory it never
// mapped).  Run in a child: the limit is per process, and a crash is seen.
TEST(PoolFiles, NodeLocalFileThatCannotBeSizedFailsTheAttachAndSaysWhy) {
  std::string name = unique("fsize"), local = unique("fsize-local");
  Removed rm{"/dev/shm/" + name}, rml{"/dev/shm/" + local};
  ASSERT_TRUE(format_pool("shm:" + name + ":16M", PoolFormatOptions{}).ok());
  auto r = Region::open("shm:" + name);
  ASSERT_TRUE(r.ok()) << r.error().message();
  int fd[2];
  ASSERT_EQ(pipe(fd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fd[0]);
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(4);
    NodeOptions no;
    no.node = 1;
    no.local_shm_name = local;
    int code = 0;
    std::string msg = "attached";
    {
      auto n = NodeContext::attach(*r.value(), no);  // the failed context is destroyed here
      if (!n) code = n.error().code(), msg = n.error().message();
    }
    if (write(fd[1], msg.data(), msg.size()) < 0) _exit(5);
    _exit(code == -EFBIG ? 0 : 3);
  }
  close(fd[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  close(fd[0]);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(st)) << "the failed attach crashed with signal " << WTERMSIG(st);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << ": " << msg;
  EXPECT_TRUE(contains(msg, "node-local memory /dev/shm/" + local + ": ftruncate: File too large")) << msg;
}

// ---- node-local files are never seen half-made -----------------------------

namespace {
// Runs `body` in a forked child; "" when it exited 0, else what went wrong
// (a crash -- SIGBUS from a short mapping -- included).
std::string in_child(const std::function<bool()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + strsignal(WTERMSIG(st));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return "exit status " + std::to_string(WEXITSTATUS(st));
  return "";
}
}  // namespace

// The lock manager maps page 0 of every local node's file while that node's
// processes may be making or replacing it.  Files are made whole before they
// get their name and are never truncated, so a reader racing with creators
// and replacers (a pool id that changes makes every open a replacement) never
// sees a short file (SIGBUS, as cxlkvd died at start) or one without magic.
TEST(PoolFiles, NodeLocalFileIsNeverSeenHalfMadeWhileReplaced) {
  const std::string name = unique("half-made");
  Removed rm{"/dev/shm/" + name};
  std::string why = in_child([&] {
    std::atomic<bool> stop{false};
    std::atomic<long> opens{0}, torn{0};
    std::thread maker([&] {
      for (int i = 0; i < 300; i++) {
        uint8_t id[16] = {static_cast<uint8_t>(1 + i % 2)};
        auto nl = NodeLocal::open(name, 3, id, 64, 4, 1 << 20);
        if (!nl) {
          std::fprintf(stderr, "%s\n", nl.error().message().c_str());
          torn++;
          continue;
        }
        delete nl.value();
        if (i % 3 == 0) ::unlink(("/dev/shm/" + name).c_str());  // and made anew
      }
      stop = true;
    });
    while (!stop) {
      if (NodeLocalHeader* h = map_node_local_header(name, 3)) {
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kNodeLocalMagic || h->node != 3) torn++;
        munmap(h, 4096);
        opens++;
      }
    }
    maker.join();
    std::fprintf(stderr, "reader mapped the header %ld times\n", opens.load());
    return torn == 0 && opens > 0;
  });
  EXPECT_EQ(why, "");
}

// A node-local file left short (size 0: what a crashed creator of an older
// version, or another tool, leaves) under the name of an ACTIVE node: the
// lock manager's node scan skips it instead of dying of SIGBUS, and the
// node's next attach replaces it with a whole one.
TEST(PoolFiles, ShortNodeLocalFileOfAnActiveNodeIsSkippedByTheManagerAndReplacedAtAttach) {
  std::string name = unique("short-local");
  Removed rm{"/dev/shm/" + name};
  ASSERT_TRUE(format_pool("shm:" + name + ":16M", PoolFormatOptions{}).ok());
  auto r = Region::open("shm:" + name);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const std::string local = "/dev/shm/" + NodeContext::default_local_name(*r.value(), 0);
  Removed rml{local};
  const std::string own = unique("short-local-own");
  Removed rmo{"/dev/shm/" + own};
  std::string why = in_child([&] {
    // Node 0 ACTIVE in the node table; its own memory under another name,
    // so only the manager meets the short file under the default one.
    NodeOptions no;
    no.node = 0;
    no.heartbeat = false;
    no.local_shm_name = own;
    auto n = NodeContext::attach(*r.value(), no);
    if (!n) return false;
    int fd = ::open(local.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    ::close(fd);
    auto m = LockManager::create(*r.value());
    if (!m) return false;
    for (int i = 0; i < 3; i++)
      if (!m.value()->run_once()) return false;  // the node scan maps page 0 of node 0's file
    return true;
  });
  EXPECT_EQ(why, "") << "the lock manager died on a short node-local file";
  NodeOptions no;
  no.node = 0;
  no.heartbeat = false;
  auto n = NodeContext::attach(*r.value(), no);
  ASSERT_TRUE(n.ok()) << n.error().message();
  struct stat st {};
  ASSERT_EQ(stat(local.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 4096) << "the short file was not replaced";
}
