// SPDX-License-Identifier: MIT
// Shared set-up for the SSD tier tests: scratch files on a file system that
// supports O_DIRECT, loop devices over them, and deterministic block bytes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace tier_test {

// A scratch directory that O_DIRECT works in.  The build tree (the test's
// working directory) is used, not /tmp, which may be a tmpfs without O_DIRECT.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("CXLKV_TIER_TEST_DIR");
    std::string tmpl = std::string(base ? base : ".") + "/tier-test-XXXXXX";
    std::vector<char> b(tmpl.begin(), tmpl.end());
    b.push_back('\0');
    if (mkdtemp(b.data())) path_ = std::filesystem::absolute(b.data()).string();
  }
  ~ScratchDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  bool ok() const { return !path_.empty(); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Whether O_DIRECT opens succeed here.
  bool direct_io_ok() const {
    std::string p = file(".probe");
    int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd < 0) return false;
    ::close(fd);
    ::unlink(p.c_str());
    return true;
  }

 private:
  std::string path_;
};

#define TIER_REQUIRE_DIRECT_IO(dir)                                                       \
  do {                                                                                     \
    if (!(dir).ok() || !(dir).direct_io_ok())                                              \
      GTEST_SKIP() << "O_DIRECT is not supported in the scratch directory (set "           \
                      "CXLKV_TIER_TEST_DIR to a directory on a disk file system)";         \
  } while (0)

inline std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  if (pclose(f) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A loop device over a new file of `bytes`; empty path() when loop devices
// cannot be made here (not root, no loop driver): the caller skips.
class LoopDevice {
 public:
  LoopDevice(const std::string& backing, uint64_t bytes, uint32_t sector_size = 0) : backing_(backing) {
    int fd = ::open(backing.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return;
    bool sized = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
    ::close(fd);
    if (!sized) return;
    std::string cmd = "losetup -f --show";
    if (sector_size) cmd += " --sector-size " + std::to_string(sector_size);
    dev_ = run_capture(cmd + " '" + backing + "' 2>/dev/null");
  }
  ~LoopDevice() {
    if (!dev_.empty()) run_capture("losetup -d " + dev_ + " 2>/dev/null; true");
  }
  const std::string& path() const { return dev_; }
  const std::string& backing() const { return backing_; }
  // Re-reads the backing file's size (after it was truncated underneath).
  bool refresh_capacity() const { return std::system(("losetup -c " + dev_ + " 2>/dev/null").c_str()) == 0; }

 private:
  std::string backing_;
  std::string dev_;
};

#define TIER_REQUIRE_LOOP(loop)                                                           \
  do {                                                                                     \
    if ((loop).path().empty())                                                             \
      GTEST_SKIP() << "cannot create a loop device here (needs root and the loop driver; " \
                      "`losetup -f --show FILE` failed)";                                  \
  } while (0)

// Deterministic bytes of block `id`: every byte depends on the id and position.
inline void fill_block(void* p, size_t n, uint64_t id) {
  auto* b = static_cast<unsigned char*>(p);
  uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b[i] = static_cast<unsigned char>(x);
  }
}

inline bool block_matches(const void* p, size_t n, uint64_t id) {
  std::vector<unsigned char> want(n);
  fill_block(want.data(), n, id);
  return std::memcmp(p, want.data(), n) == 0;
}

}  // namespace tier_test
