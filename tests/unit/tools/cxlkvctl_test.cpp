// SPDX-License-Identifier: MIT
// cxlkvctl pool commands, run as a program: exit codes, stdout, stderr.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cxlkv/keys.hpp"
#include "cxlkv/metrics.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "uapi/cxlkv_pool.h"
#include "cxlkv/format/index_format.h"

namespace {

struct Outcome {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Cxlkvctl : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tools = std::getenv("CXLKV_TEST_TOOLS");
    if (!tools) GTEST_SKIP() << "CXLKV_TEST_TOOLS not set (run through ctest)";
    tool_ = std::string(tools) + "/cxlkvctl";
    if (access(tool_.c_str(), X_OK) != 0) GTEST_SKIP() << tool_ << " not built";
    tag_ = std::to_string(getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = "/tmp/cxlkvctl-test-" + tag_;
    uri_ = "file:" + path_;
    std::remove(path_.c_str());
  }
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
    std::remove((path_ + ".out").c_str());
    std::remove((path_ + ".err").c_str());
  }

  // Outcome cxlkvctl with `args` (a shell word list) and no CXLKV_POOL.
  Outcome run(const std::string& args) {
    std::string cmd = "env -u CXLKV_POOL " + tool_ + " " + args + " >" + path_ + ".out 2>" + path_ + ".err";
    int st = std::system(cmd.c_str());
    Outcome r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(path_ + ".out");
    r.err = slurp(path_ + ".err");
    return r;
  }
  Outcome on_pool(const std::string& args) { return run("--pool " + uri_ + " " + args); }

  std::string tool_, tag_, path_, uri_;
};

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_F(Cxlkvctl, FormatCreatesTheStandardCarvesAndPrintsTheLayout) {
  Outcome r = on_pool("format --size 64M --max-nodes 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "formatted " + uri_));
  for (const char* carve : {"control", "index", "alloc", "kv"}) EXPECT_TRUE(has(r.out, carve)) << r.out;
  EXPECT_TRUE(has(r.out, "max nodes       8"));
  EXPECT_TRUE(has(r.out, "max locks       1024")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(Cxlkvctl, InfoJsonDescribesPoolAndCarves) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("info --json");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string& field :
       {"\"uri\":\"" + uri_ + "\"", std::string("\"backend\":\"file\""), std::string("\"size\":33554432"),
        std::string("\"layout_version\":1"), std::string("\"max_nodes\":16"), std::string("\"max_locks\":1024"), std::string("\"pool_id\":\""),
        std::string("\"generation\":"), std::string("{\"name\":\"control\",\"offset\":2097152,\"size\":2097152,"
                                                    "\"memtype\":\"wb\",\"flags\":[\"system\"]}")})
    EXPECT_TRUE(has(r.out, field)) << field << " missing in " << r.out;
  EXPECT_EQ(r.out.front(), '{');
}

TEST_F(Cxlkvctl, FormatRefusesAValidPoolWithoutForce) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("format --size 32M");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(has(r.err, "already holds a valid cxlkv superblock")) << r.err;
  EXPECT_TRUE(has(r.err, "--force"));
  EXPECT_EQ(on_pool("format --size 32M --force").status, 0);
}

TEST_F(Cxlkvctl, CorruptedPoolIsRefusedWithThePoolAndTheProblem) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(24);  // max_nodes, without fixing the checksum
    f.put('\x7f');
  }
  Outcome r = on_pool("info");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(has(r.err, "pool " + uri_ + ": superblock checksum mismatch")) << r.err;
}

namespace {
// Overwrites bytes at `off` of the pool's carve `name` (offset from info --json).
bool damage_carve(const std::string& path, const std::string& info_json, const std::string& name, uint64_t off,
                  const std::string& bytes) {
  const std::string at = "{\"name\":\"" + name + "\",\"offset\":";
  size_t p = info_json.find(at);
  if (p == std::string::npos) return false;
  uint64_t carve = std::strtoull(info_json.c_str() + p + at.size(), nullptr, 10);
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(carve + off));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bool(f);
}
}  // namespace

TEST_F(Cxlkvctl, ADamagedIndexHeaderIsAnErrorNamingTheFieldForEveryReaderNeverACrash) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  Outcome info = on_pool("info --json");
  // stats_off (offset 40) far outside the carve: `stats` followed it (SIGSEGV);
  // a bad stripe_slots crashed `index stats`; kv ls / index leases listed nothing.
  ASSERT_TRUE(damage_carve(path_, info.out, "index", 40, std::string("\xff\xff\xff\x7f\xff\xff\xff\x7f", 8)));
  for (const char* c : {"index stats", "index leases", "stats", "stats --json", "stats --prometheus", "kv ls", "kv check"}) {
    Outcome r = on_pool(c);
    EXPECT_EQ(r.status, 1) << c << ": " << r.err;
    EXPECT_TRUE(has(r.err, "pool " + uri_ + ": index carve: stats_off 9223372034707292159 does not place")) << c << ": " << r.err;
  }
  // The metrics endpoint (cxlkvd serves this very text) skips what it cannot read.
  {
    auto region = cxlkv::Region::open(uri_);
    ASSERT_TRUE(region.ok()) << region.error().message();
    std::string text = cxlkv::prometheus_region_exposition(*region.value());
    EXPECT_TRUE(has(text, "cxlkv_kv_lease_expiries_total")) << text.substr(0, 400);
  }
  // A damaged config line: index stats printed "50 device(s)" as a fact.
  ASSERT_EQ(on_pool("format --size 64M --force").status, 0);
  info = on_pool("info --json");
  ASSERT_TRUE(damage_carve(path_, info.out, "index", 64 + 28, std::string(1, '\x32')));  // config ndevices = 50
  Outcome st = on_pool("index stats");
  EXPECT_EQ(st.status, 1) << st.out;
  EXPECT_TRUE(has(st.err, "index carve: config line: ndevices 50 is not 1..8 (damaged)")) << st.err;
  // A zeroed index: kv check said "index locations sound" (exit 0).
  ASSERT_TRUE(damage_carve(path_, info.out, "index", 0, std::string(64, '\0')));
  Outcome check = on_pool("kv check");
  EXPECT_EQ(check.status, 1) << check.out;
  EXPECT_TRUE(has(check.err, "pool " + uri_ + ": index carve: not formatted")) << check.err;
}

TEST_F(Cxlkvctl, ADamagedControlCarveIsNamedAsSuchNotAsMissing) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  Outcome info = on_pool("info --json");
  ASSERT_TRUE(damage_carve(path_, info.out, "control", 0, std::string("garbage!", 8)));
  Outcome r = on_pool("node list");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "pool " + uri_ + ": control carve: not formatted (bad magic")) << r.err;
}

TEST_F(Cxlkvctl, AnUnknownCxlkvLogLevelKeepsTheWarningsAndSaysSo) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(24);  // max_nodes, without fixing the checksum: the runtime logs a warning
    f.put('\x7f');
  }
  // spdlog read an unknown name as "off": a typo silenced every warning.
  const std::string cmd = "env -u CXLKV_POOL CXLKV_LOG=verbose " + tool_ + " --pool " + uri_ + " info >/dev/null 2>" +
                          path_ + ".err";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(has(err, "CXLKV_LOG='verbose' is not a log level")) << err;
  EXPECT_TRUE(has(err, "[warning]") && has(err, "superblock checksum mismatch")) << err;
}

TEST_F(Cxlkvctl, ATypoInCxlkvPrefaultKeepsPrefaultingAndSaysSo) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  // Before: any value but 0/off/no silently meant "on", so CXLKV_PREFAULT=of
  // (meant: off) went unnoticed.
  const std::string cmd = "env -u CXLKV_POOL CXLKV_PREFAULT=of " + tool_ + " --pool " + uri_ + " info >/dev/null 2>" +
                          path_ + ".err";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(has(err, "CXLKV_PREFAULT='of' is not on or off")) << err;
  const std::string ok = "env -u CXLKV_POOL CXLKV_PREFAULT=off " + tool_ + " --pool " + uri_ + " info >/dev/null 2>" +
                         path_ + ".err";
  EXPECT_EQ(std::system(ok.c_str()), 0);
  EXPECT_FALSE(has(slurp(path_ + ".err"), "CXLKV_PREFAULT")) << slurp(path_ + ".err");
}

TEST_F(Cxlkvctl, APoolTruncatedUnderCxlkvdEndsItWithAMessageNotABusError) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  const std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = open((path_ + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    execl(d.c_str(), d.c_str(), "--pool", uri_.c_str(), "--foreground", "--metrics-listen", "none", "--lease-ms", "200",
          (char*)nullptr);
    _exit(127);
  }
  // Running once it says so; then its lease renewals touch the lost pages.
  for (int i = 0; i < 500 && !has(slurp(path_ + ".err"), "managing locks"); i++) usleep(10000);
  ASSERT_EQ(truncate(path_.c_str(), 1 << 20), 0);
  int st = 0;
  pid_t done = 0;
  for (int i = 0; i < 1000 && done == 0; i++) {
    done = waitpid(pid, &st, WNOHANG);
    if (done == 0) usleep(10000);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    FAIL() << "cxlkvd still running 10 s after its pool was truncated";
  }
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1)
      << (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st)) : "status " + std::to_string(st));
  EXPECT_TRUE(has(err, "cxlkvd: pool " + uri_ + ": bus error on the pool's memory: the pool file was truncated")) << err;
}

// A lease shorter than the lock manager takes is a usage error naming the
// option and its range (exit 2, as for any bad option), not the library's
// refusal at create (exit 1) after the pool was opened.
TEST_F(Cxlkvctl, CxlkvdLeaseMsOutOfRangeIsAUsageErrorNamingTheOption) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  const std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd --pool " + uri_ + " --foreground --metrics-listen none";
  for (const char* ms : {"0", "19", "3600001"}) {
    int st = std::system(("timeout 30 " + d + " --lease-ms " + ms + " 2>" + path_ + ".err").c_str());
    const std::string err = slurp(path_ + ".err");
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << ms << ": status " << st << " " << err;
    EXPECT_EQ(err, std::string("cxlkvd: --lease-ms: ") + ms + " is out of range (20..3600000)\n") << ms;
  }
}

TEST_F(Cxlkvctl, CxlkvdIndexServiceOnAPoolWithoutItsCarveNamesTheFormatFlag) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);  // no rpc.index carve, no free space for one
  const std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd";
  const std::string cmd = "timeout 30 " + d + " --pool " + uri_ + " --foreground --metrics-listen none --index-service 2>" +
                          path_ + ".err";
  int st = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(has(err, "rpc carve 'rpc.index'") && has(err, "cxlkvctl format --index-service")) << err;
}

TEST_F(Cxlkvctl, CxlkvdInTheBackgroundExitsWithItsSetupErrorAndItsLeaseNamesTheDaemon) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  const std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd --pool " + uri_ + " --metrics-listen none";
  // daemon(3) returned before the setup: exit 0, nothing printed, no daemon.
  int st = std::system(("timeout 30 " + d + " --index-service 2>" + path_ + ".err").c_str());
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_TRUE(has(slurp(path_ + ".err"), "cxlkvd: index service: ")) << slurp(path_ + ".err");
  // A daemon that serves: the command exits 0, and a second manager is
  // refused naming the daemon's pid (the lease named the parent's, gone).
  st = std::system(("timeout 30 " + d + " 2>" + path_ + ".err").c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << slurp(path_ + ".err");
  st = std::system(("timeout 30 " + d + " --foreground 2>" + path_ + ".err").c_str());
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << st << err;
  const size_t at = err.find("pid ");
  ASSERT_NE(at, std::string::npos) << err;
  const pid_t daemon_pid = pid_t(std::strtol(err.c_str() + at + 4, nullptr, 10));
  ASSERT_GT(daemon_pid, 1) << err;
  EXPECT_EQ(kill(daemon_pid, 0), 0) << "the lease names pid " << daemon_pid << ", which does not run: " << err;
  // Stop the daemon (it is not our child: poll until it is gone).
  for (int i = 0; i < 500 && kill(daemon_pid, 0) == 0; i++) {
    if (i == 0) kill(daemon_pid, SIGTERM);
    usleep(10000);
  }
  EXPECT_NE(kill(daemon_pid, 0), 0) << "daemon " << daemon_pid << " still runs";
}

namespace {
// Starts `argv` with stderr to `err`; the child's pid.
pid_t spawn_to(const std::vector<std::string>& argv, const std::string& err) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    execv(av[0], av.data());
    _exit(127);
  }
  return pid;
}
// Waits up to `ms` for `pid`: its wait status, or -1 (still running).
int wait_for(pid_t pid, int ms) {
  int st = 0;
  for (int i = 0; i < ms / 10; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    usleep(10000);
  }
  return -1;
}
}  // namespace

// DESIGN.md "Cross-host locking": a standby manager (--wait) stops on
// SIGTERM as a serving one does -- exit 0, nothing held -- instead of
// staying in its wait for the lease (it ignored SIGTERM).
TEST_F(Cxlkvctl, CxlkvdWaitingForTheLeaseStopsOnSigterm) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  const std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd";
  pid_t a = spawn_to({d, "--pool", uri_, "--foreground", "--metrics-listen", "none"}, path_ + ".a.err");
  for (int i = 0; i < 1000 && !has(slurp(path_ + ".a.err"), "managing locks"); i++) usleep(10000);
  pid_t b = spawn_to({d, "--pool", uri_, "--foreground", "--metrics-listen", "none", "--wait"}, path_ + ".err");
  usleep(1500 * 1000);  // b watches a's lease and waits
  EXPECT_EQ(wait_for(b, 10), -1) << "the standby did not wait: " << slurp(path_ + ".err");
  kill(b, SIGTERM);
  const int st = wait_for(b, 5000);
  if (st == -1) {
    kill(b, SIGKILL);
    waitpid(b, nullptr, 0);
  }
  kill(a, SIGTERM);
  const int sa = wait_for(a, 10000);
  if (sa == -1) {
    kill(a, SIGKILL);
    waitpid(a, nullptr, 0);
  }
  const std::string err = slurp(path_ + ".err");
  std::remove((path_ + ".a.err").c_str());
  ASSERT_NE(st, -1) << "the standby cxlkvd still runs 5 s after SIGTERM: " << err;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << " " << err;
  EXPECT_TRUE(has(err, "cxlkvd: stopped while waiting for the lock manager lease of " + uri_)) << err;
  EXPECT_TRUE(sa != -1 && WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "the serving manager: " << sa;
}

// Extra positional arguments were ignored by most commands (`kv ls junk`
// listed the blocks): every command refuses what it does not take.
TEST_F(Cxlkvctl, EveryCommandRefusesArgumentsItDoesNotTake) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  for (const char* c : {"info junk", "carve list junk", "carve create a b --size 2M", "carve rm a b", "node list junk",
                        "node evict 1 2", "node gc junk", "index stats junk", "index leases junk", "stats junk",
                        "kv ls junk", "kv check junk", "kv rm k junk", "kv put k f junk", "kv get k f junk",
                        "lock list junk", "module info junk", "memtype get a b", "memtype set a wb c",
                        "ddio status junk --pci 0000:00:00.0", "gpu probe junk", "format junk"}) {
    Outcome r = on_pool(c);
    EXPECT_EQ(r.status, 1) << c << ": " << r.out;
    EXPECT_TRUE(has(r.err, ": unexpected argument '")) << c << ": " << r.err;
  }
  Outcome r = on_pool("kv ls junk");
  EXPECT_EQ(r.err, "cxlkvctl: kv ls: unexpected argument 'junk' (see cxlkvctl kv ls --help)\n");
}

TEST_F(Cxlkvctl, UnformattedPoolSaysHowToFormatIt) {
  { std::ofstream(path_).write(std::string(4 << 20, '\0').data(), 4 << 20); }
  Outcome r = on_pool("carve list");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "unformatted")) << r.err;
  EXPECT_TRUE(has(r.err, "format"));
}

TEST_F(Cxlkvctl, TheFormatCommandAnUnformattedShmPoolSuggestsWorks) {
  // The message suggests `cxlkvctl --pool shm:NAME format`; for an existing
  // shm: pool without a size in the URI that command itself was refused
  // ("formatting a shm: pool needs a size").  It now keeps the pool's size.
  const std::string name = "cxlkvctl-test-" + tag_;
  const std::string file = "/dev/shm/" + name;
  ASSERT_EQ(run("--pool shm:" + name + ":32M format").status, 0);
  {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.write(std::string(4096, '\0').data(), 4096);
  }
  Outcome info = run("--pool shm:" + name + " info");
  const std::string suggested = "cxlkvctl --pool shm:" + name + " format";
  EXPECT_TRUE(has(info.err, "unformatted") && has(info.err, "`" + suggested + "`")) << info.err;
  Outcome fmt = run("--pool shm:" + name + " format");
  EXPECT_EQ(fmt.status, 0) << fmt.err;
  EXPECT_TRUE(has(fmt.out, "size            32 MiB")) << fmt.out;
  EXPECT_EQ(run("--pool shm:" + name + " info").status, 0);
  std::remove(file.c_str());
}

TEST_F(Cxlkvctl, FormatWithSizeZeroSaysSoInsteadOfAskingForASize) {
  Outcome r = on_pool("format --size 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "format: --size 0: leave --size out to keep an existing pool's size")) << r.err;
  EXPECT_NE(access(path_.c_str(), F_OK), 0);
}

TEST_F(Cxlkvctl, FormattingANewPoolWithoutASizeSaysSoAndCreatesNothing) {
  for (const char* extra : {"", " --no-standard"}) {
    Outcome r = on_pool(std::string("format") + extra);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(has(r.err, "does not exist yet; formatting it needs a size (--size)")) << r.err;
    EXPECT_NE(access(path_.c_str(), F_OK), 0) << "format" << extra << " left a file behind";
  }
}

TEST_F(Cxlkvctl, CarveCreateListRemove) {
  ASSERT_EQ(on_pool("format --size 32M --no-standard").status, 0);
  Outcome c = on_pool("carve create scratch --size 3M --memtype wc");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(has(c.out, "scratch")) << c.out;
  EXPECT_TRUE(has(c.out, "4 MiB"));
  Outcome l = on_pool("carve list --json");
  ASSERT_EQ(l.status, 0);
  EXPECT_TRUE(has(l.out, "[{\"name\":\"scratch\",\"offset\":2097152,\"size\":4194304,\"memtype\":\"wc\",\"flags\":[]}]"))
      << l.out;
  Outcome rm = on_pool("carve rm scratch");
  EXPECT_EQ(rm.status, 0) << rm.err;
  EXPECT_EQ(on_pool("carve list --json").out, "[]\n");
  Outcome again = on_pool("carve rm scratch");
  EXPECT_EQ(again.status, 1);
  EXPECT_TRUE(has(again.err, "carve 'scratch': no such carve")) << again.err;
}

TEST_F(Cxlkvctl, SystemCarveRemovalNeedsForce) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  Outcome r = on_pool("carve rm kv");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "system carve")) << r.err;
  EXPECT_EQ(on_pool("carve rm kv --force").status, 0);
}

TEST_F(Cxlkvctl, BadArgumentsFailOnStderr) {
  ASSERT_EQ(on_pool("format --size 32M --no-standard").status, 0);
  struct {
    std::string args, expected;
  } cases[] = {
      {"carve create x --size lots", "not a size: 'lots'"},
      {"carve create x", "--size is required"},
      {"carve create x --size 2M --memtype fast", "--memtype must be wb, wc or uc"},
      {"carve create BAD --size 2M", "invalid name"},
      {"carve create x --size 2M --colour red", "unknown option '--colour'"},
      {"format --size 3M --force", "not a multiple of 2 MiB"},
      {"format --max-locks 7 --force", "max_locks 7 out of range"},
      {"frobnicate", "unknown command 'frobnicate'"},
  };
  for (const auto& c : cases) {
    Outcome r = on_pool(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_TRUE(has(r.err, c.expected)) << c.args << " -> " << r.err;
  }
  Outcome no_pool = run("info");
  EXPECT_EQ(no_pool.status, 1);
  EXPECT_TRUE(has(no_pool.err, "no pool given")) << no_pool.err;
  Outcome bad_uri = run("--pool nowhere info");
  EXPECT_EQ(bad_uri.status, 1);
  EXPECT_TRUE(has(bad_uri.err, "pool URI 'nowhere'")) << bad_uri.err;
}

TEST_F(Cxlkvctl, PoolMayFollowTheCommandAndComeFromTheEnvironment) {
  ASSERT_EQ(on_pool("format --size 32M").status, 0);
  EXPECT_EQ(run("info --pool " + uri_).status, 0);
  EXPECT_EQ(run("info --pool=" + uri_).status, 0);
  // env -u removes CXLKV_POOL before our own assignment takes effect.
  EXPECT_EQ(run("--json info").status, 1);
  std::string cmd = "CXLKV_POOL=" + uri_ + " " + tool_ + " info >/dev/null 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
}

TEST_F(Cxlkvctl, EverySubcommandHasHelp) {
  for (const char* c : {"format", "info", "carve create", "carve list", "carve rm"}) {
    Outcome r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_TRUE(has(r.out, std::string("usage: cxlkvctl [--pool URI] ") + c)) << r.out;
  }
  Outcome top = run("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_TRUE(has(top.out, "carve create"));
}

// ---- cxlkvctl kv (docs/integrity.md "Checked metadata") --------------------------------------------------

namespace {

// A formatted pool with a running lock manager (cxlkvd), as any node needs.
class CxlkvctlKv : public Cxlkvctl {
 protected:
  void SetUp() override {
    Cxlkvctl::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(on_pool("format --size 64M").status, 0);
    std::string d = tool_.substr(0, tool_.rfind('/')) + "/cxlkvd";
    mgr_ = fork();
    ASSERT_GE(mgr_, 0);
    if (mgr_ == 0) {
      execl(d.c_str(), d.c_str(), "--pool", uri_.c_str(), "--foreground", (char*)nullptr);
      _exit(127);
    }
    for (const char* f : {".a", ".b", ".got"}) files_.push_back(path_ + f);
    ssd_ = "/var/tmp/cxlkvctl-kv-ssd-" + tag_;
  }
  void TearDown() override {
    if (mgr_ > 0) {
      kill(mgr_, SIGTERM);
      waitpid(mgr_, nullptr, 0);
    }
    for (auto& f : files_) std::remove(f.c_str());
    std::remove(ssd_.c_str());
    Cxlkvctl::TearDown();
  }
  void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }
  static std::string noise(size_t n, uint32_t seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; i++) s[i] = char((seed = seed * 1103515245u + 12345u) >> 16);
    return s;
  }
  pid_t mgr_ = -1;
  std::vector<std::string> files_;
  std::string ssd_;
};

// Sets the children count of the READY block `key` (32 hex digits) of the
// pool at `uri` to `children`: the whole line with its check recomputed,
// published NT, as a process that died with the count changed leaves it.
// Applies `forge` to the READY entry of `key` (32 hex digits) of the pool
// at `uri`: the whole line with its check recomputed, published NT, as a
// forger with write access to the index carve leaves it.  `slot`, if given,
// receives the entry's slot.
void forge_entry(const std::string& uri, const std::string& key, const std::function<void(cxlkv_index_entry&)>& forge,
                 uint32_t* slot = nullptr) {
  auto region = cxlkv::Region::open(uri);
  ASSERT_TRUE(region.ok()) << region.error().message();
  cxlkv::Region& r = *region.value();
  cxlkv::MemoryDomain& d = r.domain();
  std::byte* carve = r.at(r.carve(CXLKV_CARVE_INDEX).value().offset);
  const auto h = d.read_fresh(reinterpret_cast<const cxlkv_index_header*>(carve));
  auto* entries = reinterpret_cast<cxlkv_index_entry*>(carve + h.entry_off);
  for (uint64_t i = 0; i < h.nslots; i++) {
    cxlkv_index_entry e = d.read_fresh(entries + i);
    if (e.state != CXLKV_ENTRY_READY || cxlkv::to_hex(cxlkv::BlockKey{e.key_lo, e.key_hi}) != key) continue;
    forge(e);
    e.check = cxlkv_index_entry_check(&e);
    d.publish_line(entries + i, &e);  // rule 1: whole line, NT
    d.fence();                        // rule 3: in memory before the tool reads it
    if (slot) *slot = static_cast<uint32_t>(i);
    return;
  }
  FAIL() << "no READY entry for " << key;
}

void forge_children(const std::string& uri, const std::string& key, uint32_t children, uint32_t* slot) {
  forge_entry(uri, key, [&](cxlkv_index_entry& e) { e.children = children; }, slot);
}

}  // namespace

TEST_F(CxlkvctlKv, PutThenGetReturnsTheFileByteForByteAndLsListsTheBlock) {
  const std::string data = noise(100000, 1);
  write(files_[0], data);
  Outcome put = on_pool("kv put request-17/block-0 " + files_[0]);
  ASSERT_EQ(put.status, 0) << put.err;
  const std::string key = put.out.substr(0, 32);  // the string hashed to a key
  Outcome get = on_pool("kv get request-17/block-0 " + files_[2]);
  ASSERT_EQ(get.status, 0) << get.err;
  EXPECT_EQ(slurp(files_[2]), data);
  // The 32-hex-digit form names the same block.
  std::remove(files_[2].c_str());
  ASSERT_EQ(on_pool("kv get " + key + " " + files_[2]).status, 0);
  EXPECT_EQ(slurp(files_[2]), data);
  Outcome ls = on_pool("kv ls");
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_TRUE(has(ls.out, key)) << ls.out;
  EXPECT_TRUE(has(ls.out, "100000")) << ls.out;
  Outcome js = on_pool("kv ls --json");
  EXPECT_TRUE(has(js.out, "\"key\": \"" + key + "\", \"bytes\": 100000, \"tier\": \"mem\", \"state\": \"ready\""))
      << js.out;
}

TEST_F(CxlkvctlKv, GetOfABlockThatIsNotCachedExitsNonZeroWithAMessageAndWritesNothing) {
  Outcome r = on_pool("kv get 0123456789abcdef0123456789abcdef " + files_[2]);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "0123456789abcdef0123456789abcdef is not cached")) << r.err;
  EXPECT_NE(access(files_[2].c_str(), F_OK), 0) << "kv get created its output for a missing block";
}

// An index entry whose location is moved by 1..1023 bytes (checksum
// recomputed) stays inside its own block's 1 KiB owner granule: kv get
// served the moved bytes (up to 1023 of the next block) and exited 0.
// Now it exits 1 naming the block and the cause and writes no file; the
// entry moved back reads as before.
TEST_F(CxlkvctlKv, GetOfAnEntryMovedInsideItsGranuleFailsNamingTheBlockAndWritesNothing) {
  const std::string data = noise(100000, 4);
  write(files_[0], data);
  write(files_[1], noise(100000, 5));
  Outcome put = on_pool("kv put moved " + files_[0]);
  ASSERT_EQ(put.status, 0) << put.err;
  ASSERT_EQ(on_pool("kv put next " + files_[1]).status, 0);
  const std::string key = put.out.substr(0, 32);
  for (uint64_t shift : {1u, 512u, 1023u}) {
    SCOPED_TRACE("moved by " + std::to_string(shift));
    ASSERT_NO_FATAL_FAILURE(forge_entry(uri_, key, [&](cxlkv_index_entry& e) { e.loc_off += shift; }));
    Outcome get = on_pool("kv get moved " + files_[2]);
    EXPECT_EQ(get.status, 1) << "kv get served a moved entry";
    EXPECT_TRUE(has(get.err, key)) << get.err;
    EXPECT_TRUE(has(get.err, "moved inside its allocation granule")) << get.err;
    EXPECT_NE(access(files_[2].c_str(), F_OK), 0) << "kv get wrote its output for a moved entry";
    ASSERT_NO_FATAL_FAILURE(forge_entry(uri_, key, [&](cxlkv_index_entry& e) { e.loc_off -= shift; }));
  }
  ASSERT_EQ(on_pool("kv get moved " + files_[2]).status, 0);
  EXPECT_EQ(slurp(files_[2]), data);
}

TEST_F(CxlkvctlKv, PutOfACachedKeyIsRefusedAndKeepsTheOldBytesUntilRmRemovesIt) {
  write(files_[0], noise(5000, 2));
  write(files_[1], noise(7000, 3));
  ASSERT_EQ(on_pool("kv put k " + files_[0]).status, 0);
  Outcome again = on_pool("kv put k " + files_[1]);
  EXPECT_EQ(again.status, 1);
  EXPECT_TRUE(has(again.err, "already cached")) << again.err;
  ASSERT_EQ(on_pool("kv get k " + files_[2]).status, 0);
  EXPECT_EQ(slurp(files_[2]), slurp(files_[0]));
  Outcome rm = on_pool("kv rm k");
  ASSERT_EQ(rm.status, 0) << rm.err;
  EXPECT_EQ(on_pool("kv get k " + files_[2]).status, 1);
  Outcome rm2 = on_pool("kv rm k");
  EXPECT_EQ(rm2.status, 1);
  EXPECT_TRUE(has(rm2.err, "is not cached")) << rm2.err;
  ASSERT_EQ(on_pool("kv put k " + files_[1]).status, 0) << "put after rm";
  ASSERT_EQ(on_pool("kv get k " + files_[2]).status, 0);
  EXPECT_EQ(slurp(files_[2]), slurp(files_[1]));
}

TEST_F(CxlkvctlKv, BadKeysFilesAndOptionsAreRefusedWithMessages) {
  write(files_[0], "");
  Outcome empty = on_pool("kv put k " + files_[0]);
  EXPECT_EQ(empty.status, 1);
  EXPECT_TRUE(has(empty.err, "empty")) << empty.err;
  Outcome missing = on_pool("kv put k /nonexistent/file");
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(has(missing.err, "/nonexistent/file")) << missing.err;
  EXPECT_NE(on_pool("kv put k").status, 0);
  EXPECT_NE(on_pool("kv get").status, 0);
  write(files_[0], "x");
  Outcome node = on_pool("kv put k " + files_[0] + " --node 99");
  EXPECT_EQ(node.status, 1);
  EXPECT_TRUE(has(node.err, "--node")) << node.err;
  Outcome cap = on_pool("kv put k " + files_[0] + " --mem-capacity -3");
  EXPECT_EQ(cap.status, 1);
  EXPECT_TRUE(has(cap.err, "--mem-capacity")) << cap.err;
  for (const char* bad : {"99999999999999999999999", "+5", " 5"}) {
    Outcome big = on_pool("kv put k " + files_[0] + " --mem-capacity '" + bad + "'");
    EXPECT_EQ(big.status, 1) << bad;
    EXPECT_TRUE(has(big.err, "--mem-capacity: not a number of blocks")) << bad << ": " << big.err;
  }
  // A symlink as output is not followed.
  std::string link = path_ + ".link";
  ASSERT_EQ(on_pool("kv put k " + files_[0]).status, 0);
  ASSERT_EQ(symlink(files_[1].c_str(), link.c_str()), 0);
  Outcome sl = on_pool("kv get k " + link);
  std::remove(link.c_str());
  EXPECT_EQ(sl.status, 1);
  EXPECT_NE(access(files_[1].c_str(), F_OK), 0) << "kv get wrote through a symlink";
}

TEST_F(CxlkvctlKv, WithSsdTierAndMemoryCapacityEveryGetIsByteExactOrACleanFailureNeverWrongBytes) {
  // --mem-capacity sets the pool's memory-tier bound; with --ssd, blocks
  // evicted from memory are demoted to the file.  Each command is a new
  // process (a restart of the SSD tier): a block read back is byte-exact, or
  // the get fails with a message naming the block; never other bytes.
  std::vector<std::string> data;
  for (int i = 0; i < 12; i++) {
    data.push_back(noise(3000 + 1000 * i, 10 + i));
    write(files_[0], data.back());
    Outcome p = on_pool("kv put blk" + std::to_string(i) + " " + files_[0] + " --ssd " + ssd_ +
                        " --ssd-size 64M --mem-capacity 2");
    if (i == 0 && p.status != 0 && has(p.err, "SSD tier")) GTEST_SKIP() << "no SSD tier here: " << p.err;
    ASSERT_EQ(p.status, 0) << p.err;
  }
  Outcome st = on_pool("index stats --json");
  EXPECT_TRUE(has(st.out, "\"max_blocks\": 2,")) << st.out;
  int exact = 0, refused = 0;
  for (int i = 0; i < 12; i++) {
    std::remove(files_[2].c_str());
    Outcome g = on_pool("kv get blk" + std::to_string(i) + " " + files_[2] + " --ssd " + ssd_);
    if (g.status == 0) {
      EXPECT_EQ(slurp(files_[2]), data[i]) << "block " << i << " returned other bytes";
      exact++;
    } else {
      EXPECT_EQ(g.status, 1);
      EXPECT_TRUE(has(g.err, "cxlkvctl: block ")) << g.err;
      refused++;
    }
  }
  // The SSD tier's extents and headers survive the
  // process, so every block comes back (it once failed with "extent is not
  // allocated" in a new process).
  EXPECT_EQ(exact, 12);
  EXPECT_EQ(refused, 0);
  Outcome ls = on_pool("kv ls");
  EXPECT_TRUE(has(ls.out, " ssd ")) << "blocks were demoted to the SSD tier: " << ls.out;
  RecordProperty("ssd_blocks_refused_after_restart", refused);
}

// The SSD restart check (docs/integrity.md "The SSD tier") across processes: A is published and
// demoted to the SSD file, the tier restarts (each command is a new
// process), B is published and demoted after it; A reads back as A (or a
// clean miss), never as B's bytes.
TEST_F(CxlkvctlKv, AfterAnSsdRestartABlockNeverReadsBackAsALaterOne) {
  const std::string a = noise(20000, 71), b = noise(20000, 72), x = noise(20000, 73);
  const std::string opts = " --ssd " + ssd_ + " --ssd-size 64M --mem-capacity 1";
  write(files_[0], a);
  Outcome p = on_pool("kv put A " + files_[0] + opts);
  if (p.status != 0 && has(p.err, "SSD tier")) GTEST_SKIP() << "no SSD tier here: " << p.err;
  ASSERT_EQ(p.status, 0) << p.err;
  write(files_[0], x);
  ASSERT_EQ(on_pool("kv put X " + files_[0] + opts).status, 0);  // demotes A
  Outcome ls = on_pool("kv ls");
  ASSERT_TRUE(has(ls.out, " ssd ")) << "A was demoted: " << ls.out;
  write(files_[0], b);
  ASSERT_EQ(on_pool("kv put B " + files_[0] + opts).status, 0);  // a restarted tier; demotes X
  ASSERT_EQ(on_pool("kv put Y " + files_[0] + opts).status, 0);  // demotes B
  for (const char* k : {"A", "B", "X"}) {
    std::remove(files_[2].c_str());
    Outcome g = on_pool(std::string("kv get ") + k + " " + files_[2] + " --ssd " + ssd_);
    const std::string& want = *k == 'A' ? a : *k == 'B' ? b : x;
    if (g.status == 0) {
      EXPECT_EQ(slurp(files_[2]), want) << k << " returned other bytes";
    } else {
      ADD_FAILURE() << k << " was a miss after the restart: " << g.err;
    }
  }
}

TEST_F(CxlkvctlKv, NodeCommandsLeaveNoNodeLocalFileAndTheNodeDetaches) {
  write(files_[0], noise(4096, 5));
  Outcome info = on_pool("info --json");
  size_t p = info.out.find("\"pool_id\":\"");
  ASSERT_NE(p, std::string::npos) << info.out;
  const std::string prefix = "cxlkv-node-" + info.out.substr(p + 11, 32) + "-";
  ASSERT_EQ(on_pool("kv put k " + files_[0]).status, 0);
  ASSERT_EQ(on_pool("kv get k " + files_[2]).status, 0);
  ASSERT_EQ(on_pool("kv rm k").status, 0);
  std::string left;
  for (int n = 0; n < 16; n++)
    if (access(("/dev/shm/" + prefix + std::to_string(n)).c_str(), F_OK) == 0) left += " " + std::to_string(n);
  EXPECT_TRUE(left.empty()) << "node-local files left for nodes" << left;
  // The commands' processes are gone: any node still marked active names a
  // pid that no longer runs (its heartbeat only goes stale later).
  Outcome nodes = on_pool("node list --json");
  for (size_t at = 0; (at = nodes.out.find("\"pid\": ", at)) != std::string::npos; at++) {
    long pid = std::strtol(nodes.out.c_str() + at + 7, nullptr, 10);
    if (pid > 0) {
      EXPECT_NE(kill(pid_t(pid), 0), 0) << "pid " << pid << " still runs: " << nodes.out;
    }
  }
}

// DESIGN.md "The pool": --force overwrites a valid pool, never a live one.
// A store attached and cxlkvd running went on using the reformatted pool.
TEST_F(CxlkvctlKv, FormatForceOfAPoolInUseIsRefusedNamingItsUsersAndKeepsThePool) {
  write(files_[0], noise(4096, 3));
  ASSERT_EQ(on_pool("kv put kept " + files_[0]).status, 0);
  // A store's process: node 5, attached until it is killed.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t store = fork();
  ASSERT_GE(store, 0);
  if (store == 0) {
    auto region = cxlkv::Region::open(uri_);
    cxlkv::NodeOptions no;
    no.node = 5;
    std::unique_ptr<cxlkv::NodeContext> node;
    if (region.ok())
      if (auto n = cxlkv::NodeContext::attach(*region.value(), no); n.ok()) node = std::move(n.value());
    const char c = node ? 1 : 0;
    if (::write(ready[1], &c, 1) != 1 || !c) _exit(1);
    for (;;) pause();
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1) << "node 5 did not attach";
  Outcome r = on_pool("format --size 64M --force");
  kill(store, SIGKILL);
  waitpid(store, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.err, "pool " + uri_ + ": in use by node 5 (pid " + std::to_string(store) + " on this host)"))
      << r.err;
  EXPECT_TRUE(has(r.err, "a lock manager (cxlkvd, node 0 pid " + std::to_string(mgr_) + ") renewing its lease"))
      << r.err;
  EXPECT_TRUE(has(r.err, "stop them first")) << r.err;
  Outcome get = on_pool("kv get kept " + files_[2]);
  ASSERT_EQ(get.status, 0) << "the pool was reformatted under its users: " << get.err;
  EXPECT_EQ(slurp(files_[2]), slurp(files_[0]));
  // Once they are gone (the store killed, cxlkvd stopped), --force formats.
  {
    auto region = cxlkv::Region::open(uri_);
    ASSERT_TRUE(region.ok()) << region.error().message();
    cxlkv::NodeContext::unlink_local(cxlkv::NodeContext::default_local_name(*region.value(), 5));
  }
  kill(mgr_, SIGTERM);
  waitpid(mgr_, nullptr, 0);
  mgr_ = -1;
  Outcome again = on_pool("format --size 64M --force");
  EXPECT_EQ(again.status, 0) << again.err;
}

// docs/operations.md "Bad input, damage and interruptions": a stream that never ends
// (/dev/zero) was read for ever; it is read up to the largest block the
// pool can hold and refused naming the bound.  --ssd-size without --ssd
// was silently ignored.
TEST_F(CxlkvctlKv, PutOfAnEndlessStreamIsRefusedAtThePoolsBoundAndSsdSizeNeedsSsd) {
  const std::string cmd = "timeout 60 env -u CXLKV_POOL " + tool_ + " --pool " + uri_ +
                          " kv put endless /dev/zero >/dev/null 2>" + path_ + ".err";
  const int st = std::system(cmd.c_str());
  const std::string err = slurp(path_ + ".err");
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 124) << "kv put read /dev/zero for 60 s";
  EXPECT_EQ(WEXITSTATUS(st), 1) << err;
  EXPECT_TRUE(has(err, "/dev/zero: more than ") && has(err, " bytes: larger than any block of pool " + uri_) &&
              has(err, "the whole kv carve"))
      << err;
  EXPECT_NE(on_pool("kv get endless " + files_[2]).status, 0) << "a block was published";
  write(files_[0], "x");
  Outcome ssd = on_pool("kv put k " + files_[0] + " --ssd-size 64M");
  EXPECT_EQ(ssd.status, 1);
  EXPECT_TRUE(has(ssd.err, "--ssd-size sizes the SSD tier's file: it needs --ssd FILE")) << ssd.err;
  EXPECT_NE(on_pool("kv get k " + files_[2]).status, 0) << "the put went ahead without its SSD tier";
}

// A damaged location (device or tier field) was reported as "block names
// device 7, this store has 1" or "no payload tier 5 in this store": now
// the entry is named as damaged, with the field, the block and its bounds.
TEST_F(CxlkvctlKv, GetOfAnEntryWithADamagedDeviceOrTierSaysTheEntryIsDamaged) {
  write(files_[0], noise(8192, 6));
  Outcome put = on_pool("kv put damaged " + files_[0]);
  ASSERT_EQ(put.status, 0) << put.err;
  const std::string key = put.out.substr(0, 32);
  forge_entry(uri_, key, [](cxlkv_index_entry& e) { e.loc_tier = 5; });
  Outcome tier = on_pool("kv get damaged " + files_[2]);
  EXPECT_EQ(tier.status, 1);
  EXPECT_TRUE(has(tier.err, "index entry names tier 5, which is not a tier (0: memory, 1: SSD): damaged entry")) << tier.err;
  EXPECT_TRUE(has(tier.err, "block " + key)) << tier.err;
  EXPECT_FALSE(has(tier.err, "no payload tier")) << tier.err;
  forge_entry(uri_, key, [](cxlkv_index_entry& e) { e.loc_tier = CXLKV_TIER_SSD; });
  Outcome ssd = on_pool("kv get damaged " + files_[2]);
  EXPECT_EQ(ssd.status, 1);
  EXPECT_TRUE(has(ssd.err, "index entry names the SSD tier, which this store was opened without")) << ssd.err;
  forge_entry(uri_, key, [](cxlkv_index_entry& e) {
    e.loc_tier = CXLKV_TIER_MEM;
    e.loc_dev = 7;
  });
  Outcome dev = on_pool("kv get damaged " + files_[2]);
  EXPECT_EQ(dev.status, 1);
  EXPECT_TRUE(has(dev.err, "index entry names device 7, but this store has 1 pool device(s) (0..0): a damaged entry"))
      << dev.err;
  EXPECT_NE(access(files_[2].c_str(), F_OK), 0) << "kv get wrote a file for a damaged entry";
}

TEST_F(CxlkvctlKv, PutOfABlockLargerThanThePoolFailsAtOnceNamingTheSizeAndEvictsNothing) {
  // The pool is 64 MiB: no eviction can make room for 80 MiB.  It used to
  // evict every cached block first and then blame pinned blocks.
  write(files_[0], noise(4096, 7));
  ASSERT_EQ(on_pool("kv put small " + files_[0]).status, 0);
  write(files_[1], std::string(80 << 20, 'x'));
  Outcome big = on_pool("kv put big " + files_[1]);
  EXPECT_EQ(big.status, 1);
  // Refused before it is read (docs/operations.md "Bad input, damage and interruptions").
  EXPECT_TRUE(has(big.err, files_[1] + ": 83886080 bytes: larger than any block of pool " + uri_)) << big.err;
  Outcome get = on_pool("kv get small " + files_[2]);
  ASSERT_EQ(get.status, 0) << "the cached block was evicted for a block that can never fit: " << get.err;
  EXPECT_EQ(slurp(files_[2]), slurp(files_[0]));
}

TEST_F(CxlkvctlKv, GetThatCannotWriteTheWholeFileLeavesTheFileAsItWasAndSaysWhy) {
  // A file size limit stands in for a full disk: writes past 1-2 MiB fail
  // (SIGXFSZ ignored: write returns EFBIG, as ENOSPC on a full disk).  The
  // get used to truncate FILE first and leave the part it had written.
  const std::string data = noise(3 << 20, 9);
  write(files_[0], data);
  ASSERT_EQ(on_pool("kv put k " + files_[0]).status, 0);
  write(files_[2], "previous contents");
  Outcome r = run("--pool " + uri_ + " kv get k " + files_[2]);  // the unlimited run works
  ASSERT_EQ(r.status, 0) << r.err;
  write(files_[2], "previous contents");
  std::string cmd = "sh -c \"trap '' XFSZ; ulimit -f 2048; exec " + tool_ + " --pool " + uri_ + " kv get k " +
                    files_[2] + "\" >" + path_ + ".out 2>" + path_ + ".err";
  int st = std::system(cmd.c_str());
  std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st << ": " << err;
  EXPECT_TRUE(has(err, files_[2] + ": write: File too large")) << err;
  const std::string now = slurp(files_[2]);
  EXPECT_TRUE(now == "previous contents") << "a failed get changed FILE: now " << now.size() << " bytes";
  // Nothing else is left beside it (the temporary file is removed).
  std::string dir = files_[2].substr(0, files_[2].rfind('/'));
  std::string base = files_[2].substr(dir.size() + 1);
  std::string left;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).find(base + ".cxlkvctl-") != std::string::npos) left += e->d_name;
    closedir(d);
  }
  EXPECT_TRUE(left.empty()) << "left behind: " << left;
}

TEST_F(CxlkvctlKv, AnSsdFileThatDoesNotExistSaysHowToCreateItAndATooSmallOneIsNotLeftBehind) {
  write(files_[0], "x");
  Outcome missing = on_pool("kv put k " + files_[0] + " --ssd " + ssd_);
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(has(missing.err, ssd_ + " does not exist (--ssd-size SIZE creates it)")) << missing.err;
  Outcome tiny = on_pool("kv put k " + files_[0] + " --ssd " + ssd_ + " --ssd-size 1M");
  EXPECT_EQ(tiny.status, 1);
  EXPECT_TRUE(has(tiny.err, "too small")) << tiny.err;
  EXPECT_NE(access(ssd_.c_str(), F_OK), 0) << "the too-small SSD file stayed";
}

TEST_F(CxlkvctlKv, ATypoInCxlkvLockTimeoutMsKeepsTheBoundAndSaysSo) {
  // strtoull read "30s" as 30 and "abc" as 0, and 0 means "wait forever":
  // a typo removed the bound on every stripe lock wait.
  write(files_[0], "x");
  const std::string cmd = "env -u CXLKV_POOL CXLKV_LOCK_TIMEOUT_MS=abc " + tool_ + " --pool " + uri_ + " kv put k " +
                          files_[0] + " >/dev/null 2>" + path_ + ".err";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  const std::string err = slurp(path_ + ".err");
  EXPECT_TRUE(has(err, "CXLKV_LOCK_TIMEOUT_MS='abc' is not a number of milliseconds (0: wait forever); using 30000"))
      << err;
}

// kv check audits children counts beside locations: a cached block whose
// count is one above the blocks naming it as parent (it can never be
// evicted) is one line naming the block and both counts, and exit 1; the
// JSON counts it among the problems.
TEST_F(CxlkvctlKv, KvCheckReportsABlockWhoseChildrenCountNoChildAccountsFor) {
  write(files_[0], noise(4096, 11));
  Outcome put = on_pool("kv put root " + files_[0]);
  ASSERT_EQ(put.status, 0) << put.err;
  const std::string key = put.out.substr(0, 32);
  Outcome sound = on_pool("kv check --settle 0");
  EXPECT_EQ(sound.status, 0) << sound.out << sound.err;
  EXPECT_TRUE(has(sound.out, "pool " + uri_ + ": index locations and children counts sound")) << sound.out;
  // The block's line with children = 1 and its check recomputed, as a
  // writer that died between raising the count and adding the child leaves it.
  uint32_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(forge_children(uri_, key, 1, &slot));
  Outcome check = on_pool("kv check --settle 50");
  EXPECT_EQ(check.status, 1) << check.out << check.err;
  EXPECT_EQ(check.out, "pool " + uri_ + ": index carve: block " + key + " (index slot " + std::to_string(slot) +
                           ", READY): children count 1, but 0 live blocks name it as parent (a stale count: the "
                           "block can never be evicted)\n");
  Outcome js = on_pool("kv check --json");
  EXPECT_EQ(js.status, 1);
  EXPECT_TRUE(has(js.out, "{\"problems\": 1, \"location_problems\": 0, \"children_mismatches\": 1,")) << js.out;
  EXPECT_TRUE(has(js.out, "{\"slot\": " + std::to_string(slot) + ", \"key\": \"" + key +
                              "\", \"state\": \"ready\", \"stored\": 1, \"found\": 0}"))
      << js.out;
  Outcome bad = on_pool("kv check --settle 2s");
  EXPECT_EQ(bad.status, 1);
  EXPECT_TRUE(has(bad.err, "--settle: not a number of milliseconds in 0..60000: '2s'")) << bad.err;
}

// kv check --repair is offline: refused while a process is attached as a
// node (the message names node 5 and how to stop it), done beside a lock
// manager alone (the fixture's cxlkvd): the stale count goes back to the
// children found (one line, old -> new, and a total), the pool is then
// sound, and kv rm, refused before (the block had "children"), removes it.
TEST_F(CxlkvctlKv, KvCheckRepairSetsAStaleChildrenCountBackOnlyWhileNoNodeIsLive) {
  write(files_[0], noise(4096, 12));
  Outcome put = on_pool("kv put root " + files_[0]);
  ASSERT_EQ(put.status, 0) << put.err;
  const std::string key = put.out.substr(0, 32);
  uint32_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(forge_children(uri_, key, 1, &slot));
  Outcome stuck = on_pool("kv rm " + key);
  EXPECT_EQ(stuck.status, 1);
  EXPECT_TRUE(has(stuck.err, "has 1 cached child block(s)")) << stuck.err;

  // A serving process: attached as node 5, alive until killed.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t node = fork();
  ASSERT_GE(node, 0);
  if (node == 0) {
    close(ready[0]);
    auto region = cxlkv::Region::open(uri_);
    if (!region) _exit(1);
    cxlkv::NodeOptions no;
    no.node = 5;
    auto n = cxlkv::NodeContext::attach(*region.value(), no);
    if (!n) _exit(1);
    char c = 'R';
    if (::write(ready[1], &c, 1) != 1) _exit(1);
    for (;;) pause();
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "the node process did not attach";
  close(ready[0]);
  Outcome refused = on_pool("kv check --repair");
  kill(node, SIGKILL);
  waitpid(node, nullptr, 0);
  {
    auto region = cxlkv::Region::open(uri_);
    ASSERT_TRUE(region.ok());
    cxlkv::NodeContext::unlink_local(cxlkv::NodeContext::default_local_name(*region.value(), 5));
  }
  EXPECT_EQ(refused.status, 1);
  EXPECT_EQ(refused.out, "");
  EXPECT_TRUE(has(refused.err, "refusing to repair children counts while nodes are live: node 5 (pid " +
                                   std::to_string(node) + " on "))
      << refused.err;
  EXPECT_TRUE(has(refused.err, "stop every process attached as a node of the pool")) << refused.err;
  EXPECT_TRUE(has(refused.err, "a lock manager alone (cxlkvd) may keep running")) << refused.err;

  // The node's process is gone: only the lock manager runs.
  Outcome rep = on_pool("kv check --repair");
  EXPECT_EQ(rep.status, 0) << rep.out << rep.err;
  const std::string who = "pool " + uri_ + ": ";
  EXPECT_EQ(rep.out, who + "index carve: repaired block " + key + " (index slot " + std::to_string(slot) +
                         ", READY): children 1 -> 0, a leaf on its stripe's eviction list (evictable)\n" + who +
                         "1 children count repaired, 1 block now evictable\n" + who +
                         "index locations and children counts sound\n");
  Outcome check = on_pool("kv check --settle 0");
  EXPECT_EQ(check.status, 0) << check.out;
  Outcome again = on_pool("kv check --repair --json");
  EXPECT_EQ(again.status, 0) << again.out << again.err;
  EXPECT_EQ(again.out, "{\"repaired\": 0, \"now_evictable\": 0, \"changed_meanwhile\": 0, \"problems\": 0, "
                       "\"location_problems\": 0, \"children_mismatches\": 0, \"blocks\": []}\n");
  Outcome both = on_pool("kv check --repair --settle 10");
  EXPECT_EQ(both.status, 1);
  EXPECT_TRUE(has(both.err, "--settle: no use with --repair")) << both.err;
  Outcome rm = on_pool("kv rm " + key);
  EXPECT_EQ(rm.status, 0) << rm.err;
  EXPECT_EQ(rm.out, key + "  removed\n");
}

TEST_F(Cxlkvctl, KvCommandsWithoutALockManagerFailWithAMessageInsteadOfHanging) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  std::ofstream(path_ + ".a") << "x";
  Outcome r = on_pool("kv put k " + path_ + ".a");
  std::remove((path_ + ".a").c_str());
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "lock manager")) << r.err;
}

TEST_F(Cxlkvctl, KvInterruptedWhileWaitingForALockRemovesItsNodeLocalFile) {
  ASSERT_EQ(on_pool("format --size 64M").status, 0);
  Outcome info = on_pool("info --json");
  size_t p = info.out.find("\"pool_id\":\"");
  ASSERT_NE(p, std::string::npos) << info.out;
  const std::string prefix = "/dev/shm/cxlkv-node-" + info.out.substr(p + 11, 32) + "-";
  std::ofstream(path_ + ".a") << "x";
  // No lock manager: the command waits (up to 5 s) for its lock probe.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    execl(tool_.c_str(), tool_.c_str(), "--pool", uri_.c_str(), "kv", "put", "k", (path_ + ".a").c_str(), (char*)nullptr);
    _exit(127);
  }
  // Wait (bounded) until it has attached: its node-local file exists.
  std::string local;
  for (int i = 0; i < 100 && local.empty(); i++) {
    usleep(20000);
    for (int n = 0; n < 16; n++)
      if (access((prefix + std::to_string(n)).c_str(), F_OK) == 0) local = prefix + std::to_string(n);
  }
  ASSERT_FALSE(local.empty()) << "kv put never attached";
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  std::remove((path_ + ".a").c_str());
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
  EXPECT_NE(access(local.c_str(), F_OK), 0) << local << " left behind";
}
