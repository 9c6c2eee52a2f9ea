// SPDX-License-Identifier: MIT
// The dev: backend against a loaded cxlkv.ko.  Runs in the vm-test guests
// (tests/vm/run.sh) on /dev/cxlkv0 or $CXLKV_TEST_DEV; skips where no such
// device exists.  DESTROYS the pool on that device.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cxlkv/region.hpp"
#include "pool/format.hpp"
#include "region/dev_lock_slots.hpp"
#include "uapi/cxlkv_ioctl.h"

namespace {

std::string dev_path() {
  const char* e = std::getenv("CXLKV_TEST_DEV");
  return e ? e : "/dev/cxlkv0";
}

class DevBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(dev_path().c_str(), R_OK | W_OK) != 0)
      GTEST_SKIP() << dev_path() << " absent: cxlkv.ko not loaded (make vm-test runs this in QEMU)";
    uri_ = "dev:" + dev_path();
    cxlkv::PoolFormatOptions o;
    o.force = true;
    auto r = cxlkv::format_pool(uri_, o);
    ASSERT_TRUE(r.ok()) << r.error().message();
  }

  // The module's view of a carve's memory type and mapping count.
  cxlkv_ioc_memtype module_memtype(const std::string& name) {
    cxlkv_ioc_memtype m{};
    std::strncpy(m.name, name.c_str(), sizeof m.name - 1);
    int fd = open(dev_path().c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ioctl(fd, CXLKV_IOC_MEMTYPE_GET, &m), 0) << name << ": " << std::strerror(errno);
    close(fd);
    return m;
  }

  std::string uri_;
};

TEST_F(DevBackend, FormatThroughTheModuleCreatesTheStandardCarves) {
  auto r = cxlkv::Region::open(uri_);
  ASSERT_TRUE(r.ok()) << r.error().message();
  for (const char* name : {CXLKV_CARVE_CONTROL, CXLKV_CARVE_INDEX, CXLKV_CARVE_ALLOC, CXLKV_CARVE_KV}) {
    auto c = r.value()->carve(name);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(c->flags & CXLKV_CARVE_F_SYSTEM, CXLKV_CARVE_F_SYSTEM) << name;
  }
  auto ctrl = r.value()->carve(CXLKV_CARVE_CONTROL);
  auto* h = r.value()->at<cxlkv_ctrl_header>(ctrl->offset);
  EXPECT_EQ(h->magic, CXLKV_CTRL_MAGIC);
  EXPECT_EQ(r.value()->kind(), cxlkv::BackendKind::dev);
}

TEST_F(DevBackend, FormatRefusesAValidPoolWithoutForce) {
  cxlkv::FormatOptions fo;
  auto r = cxlkv::Region::format(uri_, fo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), -EEXIST) << r.error().message();
}

TEST_F(DevBackend, CarveCreateGoesThroughTheModuleAndIsMappedWithItsType) {
  auto r = cxlkv::Region::open(uri_);
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto c = r.value()->carve_remove(CXLKV_CARVE_KV, true);
  ASSERT_TRUE(c.ok()) << c.error().message();
  auto t = r.value()->carve_create("wcdata", 3 << 20, cxlkv::MemType::wc);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->size, 4u << 20);

  auto m = module_memtype("wcdata");
  EXPECT_EQ(m.memtype, static_cast<uint32_t>(CXLKV_MEM_WC));
  EXPECT_EQ(m.mappings, 1u) << "the Region maps every carve";
  auto* p = r.value()->at<volatile uint64_t>(t->offset + 4096);
  *p = 0x5eed;
  EXPECT_EQ(*p, 0x5eedu);
}

TEST_F(DevBackend, CarveMadeByOneRegionIsMappedByAnother) {
  {
    auto r = cxlkv::Region::open(uri_);
    ASSERT_TRUE(r.ok() && r.value()->carve_remove(CXLKV_CARVE_KV, true).ok());
  }
  auto a = cxlkv::Region::open(uri_);
  auto b = cxlkv::Region::open(uri_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = a.value()->carve_create("shared", 2 << 20, cxlkv::MemType::wb);
  ASSERT_TRUE(c.ok()) << c.error().message();
  auto* pa = a.value()->at<uint64_t>(c->offset);
  pa[0] = 0xabcdef;
  a.value()->domain().flush(pa, 64);  // rule 3
  a.value()->domain().fence();

  auto seen = b.value()->carve("shared");  // re-reads the table: maps the new carve
  ASSERT_TRUE(seen.ok()) << seen.error().message();
  auto* pb = b.value()->at<uint64_t>(seen->offset);
  b.value()->domain().invalidate(pb, 64);  // rule 4
  b.value()->domain().fence();
  EXPECT_EQ(pb[0], 0xabcdefu);
}

TEST_F(DevBackend, RemovingACarveMappedElsewhereOnThisHostIsRefused) {
  auto a = cxlkv::Region::open(uri_);
  auto b = cxlkv::Region::open(uri_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto rm = a.value()->carve_remove(CXLKV_CARVE_KV, true);
  ASSERT_FALSE(rm.ok()) << "b still maps kv";
  EXPECT_EQ(rm.error().code(), -EBUSY) << rm.error().message();
  EXPECT_TRUE(a.value()->carve(CXLKV_CARVE_KV).ok()) << "a keeps its mapping after the refusal";
}

TEST_F(DevBackend, SystemCarveNeedsForce) {
  auto r = cxlkv::Region::open(uri_);
  ASSERT_TRUE(r.ok());
  auto rm = r.value()->carve_remove(CXLKV_CARVE_CONTROL);
  ASSERT_FALSE(rm.ok());
  EXPECT_EQ(rm.error().code(), -EPERM) << rm.error().message();
}

TEST_F(DevBackend, TheSuperblockPageIsReadOnly) {
  auto r = cxlkv::Region::open(uri_);
  ASSERT_TRUE(r.ok());
  std::byte* base = r.value()->base();
  EXPECT_EQ(r.value()->superblock().magic, CXLKV_SB_MAGIC);
  EXPECT_DEATH({ *reinterpret_cast<volatile char*>(base) = 1; }, "");
}

TEST_F(DevBackend, LockSlotOwnershipIsExclusiveAndEndsWithTheProcess) {
  auto r = cxlkv::Region::open(uri_);
  ASSERT_TRUE(r.ok());
  const cxlkv::Region& pool = *r.value();
  ASSERT_TRUE(cxlkv::region::dev_own_lock_slot(pool, 200).ok());
  EXPECT_TRUE(cxlkv::region::dev_own_lock_slot(pool, 200).ok()) << "owning again from the same process";

  // A child owns lock 201 and dies without giving it back.
  pid_t child = fork();
  if (child == 0) {
    auto c = cxlkv::Region::open(uri_);
    _exit(c.ok() && cxlkv::region::dev_own_lock_slot(*c.value(), 201).ok() &&
                  !cxlkv::region::dev_own_lock_slot(*c.value(), 200).ok()
              ? 0
              : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "child could not own 201, or could own 200 which this process owns";
  EXPECT_TRUE(cxlkv::region::dev_own_lock_slot(pool, 201).ok()) << "the kernel released the dead child's slot";

  EXPECT_TRUE(cxlkv::region::dev_disown_lock_slot(pool, 200).ok());
  EXPECT_TRUE(cxlkv::region::dev_disown_lock_slot(pool, 201).ok());
  auto none = cxlkv::region::dev_disown_lock_slot(pool, 202);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), -ENOENT);
}

}  // namespace
