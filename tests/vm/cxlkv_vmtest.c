// SPDX-License-Identifier: MIT
/*
 * cxlkv_vmtest: the in-guest half of `make vm-test`.  Built statically by
 * tests/vm/run.sh and run inside a QEMU guest where cxlkv.ko is loaded.
 *
 *   cxlkv_vmtest abi DEV KIND         every ioctl, its error cases, mmap rules,
 *                                     lock slot release on close and on death, DDIO refusal
 *   cxlkv_vmtest fuzz DEV ITER SEED   random commands and argument buffers
 *   cxlkv_vmtest unpriv DEV           the permission model as uid 65534 (read-only and
 *                                     writable files, CAP_SYS_ADMIN / admin_gid, reserved
 *                                     lock ids, max_slots_per_file)
 *   cxlkv_vmtest fuzz-unpriv DEV ITER the fuzz as uid 65534
 *   cxlkv_vmtest twohost DEV NODE N [nolock]
 *                                     one side of the two-guest test (node 0 also runs
 *                                     the lock grant loop); nolock: increments without
 *                                     the lock, to show the check catches lost updates
 *
 * Output: "ok <check>" / "FAIL <check>: why" lines, then "RESULT PASS" or
 * "RESULT FAIL"; tests/vm/run.sh parses them from the serial console.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cxlkv_ioctl.h"

#define MiB (1ULL << 20)

static int failures;

static void check(int cond, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (cond) {
		printf("ok %s\n", name);
		return;
	}
	failures++;
	printf("FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* ioctl returning -errno like the C API does */
static int ioc(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

static void expect_err(int got, int want, const char *name)
{
	check(got == -want, name, "got %d (%s), want -%s", got, got ? strerror(-got) : "success",
	      strerror(want));
}

static void expect_ok(int got, const char *name)
{
	check(got == 0, name, "got %d (%s)", got, strerror(-got));
}

/* ---- coherence helpers (the contract of docs/coherence.md) ------------------------ */

static inline void clflush(const volatile void *p)
{
	asm volatile("clflush %0" : "+m" (*(volatile char *)p));
}

static inline void mfence(void)
{
	asm volatile("mfence" ::: "memory");
}

/* rule 1: lines with several writers are written with non-temporal stores */
static inline void nt_store64(volatile void *p, uint64_t v)
{
	asm volatile("movnti %1, %0" : "=m" (*(volatile uint64_t *)p) : "r" (v) : "memory");
}

/* rule 4: invalidate, fence, then load */
static uint64_t load_fresh(volatile void *p)
{
	clflush(p);
	mfence();
	return *(volatile uint64_t *)p;
}

/* rule 3: store, flush, fence */
static void store_publish(volatile void *p, uint64_t v)
{
	nt_store64(p, v);
	clflush(p);
	mfence();
}

static int open_dev(const char *dev)
{
	struct cxlkv_ioc_version v;
	int fd = open(dev, O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		printf("FAIL open %s: %s\n", dev, strerror(errno));
		printf("RESULT FAIL\n");
		exit(1);
	}
	if (ioc(fd, CXLKV_IOC_GET_VERSION, &v) || v.abi_version != CXLKV_IOCTL_ABI_VERSION) {
		printf("FAIL handshake with %s: abi %u, want %u\n", dev, v.abi_version,
		       CXLKV_IOCTL_ABI_VERSION);
		printf("RESULT FAIL\n");
		exit(1);
	}
	return fd;
}

static struct cxlkv_carve carve_req(const char *name, uint64_t size, uint32_t mt, uint32_t flags)
{
	struct cxlkv_carve c;

	memset(&c, 0, sizeof(c));
	strncpy(c.name, name, sizeof(c.name) - 1);
	c.size = size;
	c.memtype = mt;
	c.flags = flags;
	return c;
}

static struct cxlkv_ioc_memtype mt_req(const char *name, uint32_t mt)
{
	struct cxlkv_ioc_memtype m;

	memset(&m, 0, sizeof(m));
	strncpy(m.name, name, sizeof(m.name) - 1);
	m.memtype = mt;
	return m;
}

static struct cxlkv_ioc_carve_remove rm_req(const char *name, uint32_t flags)
{
	struct cxlkv_ioc_carve_remove r;

	memset(&r, 0, sizeof(r));
	strncpy(r.name, name, sizeof(r.name) - 1);
	r.flags = flags;
	return r;
}

static void *map(int fd, uint64_t off, uint64_t len, int prot, int flags)
{
	void *p = mmap(NULL, len, prot, flags, fd, (off_t)off);

	return p == MAP_FAILED ? NULL : p;
}

/* ---- abi ---------------------------------------------------------------- */

static void abi_handshake(int fd, uint32_t want_kind, struct cxlkv_ioc_info *info)
{
	struct cxlkv_ioc_version v;
	char small[8];

	expect_ok(ioc(fd, CXLKV_IOC_GET_VERSION, &v), "version");
	check(v.layout_version == CXLKV_LAYOUT_VERSION && !strcmp(v.module_version, "0.1.0"),
	      "version fields", "layout %u module '%s'", v.layout_version, v.module_version);
	expect_ok(ioc(fd, CXLKV_IOC_INFO, info), "info");
	check(info->backing == want_kind, "info backing kind", "kind %u (%s), want %u",
	      info->backing, info->backing_name, want_kind);
	check(info->flags & CXLKV_INFO_F_FORMATTED, "info formatted", "flags %#x", info->flags);
	check(info->ncarves == 1 && info->max_nodes == 16 && info->max_locks == 1024 &&
	      info->lock_slots_in_use == 0 && info->mtrr_state == CXLKV_MTRR_UNAVAILABLE,
	      "info after format", "ncarves %u max_nodes %u max_locks %u slots %u",
	      info->ncarves, info->max_nodes, info->max_locks, info->lock_slots_in_use);
	check(want_kind == CXLKV_BACKING_EMULATED || (info->flags & CXLKV_INFO_F_PAT),
	      "info PAT enforced", "flags %#x", info->flags);
	printf("info: %s size %llu MiB phys %#llx node %u\n", info->backing_name,
	       (unsigned long long)(info->size >> 20), (unsigned long long)info->phys_base,
	       info->node_id);

	expect_err(ioc(fd, _IO(CXLKV_IOC_MAGIC, 0x7f), NULL), ENOTTY, "unknown command");
	expect_err(ioc(fd, _IOR(CXLKV_IOC_MAGIC, 0x00, char[8]), small), ENOTTY,
		   "version with short struct");
	expect_err(ioc(fd, _IOR(CXLKV_IOC_MAGIC, 0x01, char[4096]), NULL), ENOTTY,
		   "info with oversized struct");
	expect_err(ioc(fd, _IOW(CXLKV_IOC_MAGIC, 0x01, struct cxlkv_ioc_info), info), ENOTTY,
		   "info with wrong direction");
	expect_err(ioc(fd, CXLKV_IOC_INFO, NULL), EFAULT, "info to NULL");
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, (void *)16), EFAULT, "create from bad pointer");
	expect_err(ioc(fd, CXLKV_IOC_CARVE_LIST, (void *)0xffff888000000000ULL), EFAULT,
		   "list to kernel address");
}

static void abi_carves(int fd, const struct cxlkv_ioc_info *info)
{
	struct cxlkv_carve c = carve_req("data", 3 * MiB, CXLKV_MEM_WB, 0), d;
	struct cxlkv_ioc_carve_list *l = calloc(1, sizeof(*l));
	struct cxlkv_ioc_carve_remove r;
	uint32_t i;
	int n;

	expect_ok(ioc(fd, CXLKV_IOC_CARVE_CREATE, &c), "carve create");
	check(c.offset == 4 * MiB && c.size == 4 * MiB, "carve create rounds and places first fit",
	      "offset %#llx size %#llx", (unsigned long long)c.offset, (unsigned long long)c.size);
	d = carve_req("data", 2 * MiB, CXLKV_MEM_WB, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EEXIST, "carve create duplicate");
	{
		static const char *bad[] = { "", "Data", "a/b", "sp ace",
					     "0123456789abcdef0123456789abcdef" };
		for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			d = carve_req("x", 2 * MiB, 0, 0);
			memset(d.name, 0, sizeof(d.name));
			memcpy(d.name, bad[i], strlen(bad[i]) < 32 ? strlen(bad[i]) : 32);
			expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create bad name");
		}
	}
	d = carve_req("x", 0, 0, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create size 0");
	d = carve_req("x", 2 * MiB, 3, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create bad memtype");
	d = carve_req("x", 2 * MiB, 0, 0x80);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create bad flags");
	d = carve_req("x", 2 * MiB, 0, 0);
	d.offset = 8 * MiB;
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create offset given");
	d = carve_req("x", info->size, 0, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), ENOSPC, "carve create too large");
	d = carve_req("x", UINT64_MAX - 5, 0, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), EINVAL, "carve create size overflow");

	d = carve_req("data", 0, 0, 0);
	expect_ok(ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &d), "carve lookup");
	check(!memcmp(&c, &d, sizeof(c)), "carve lookup returns the entry", "differs");
	d = carve_req("nope", 0, 0, 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &d), ENOENT, "carve lookup missing");

	expect_ok(ioc(fd, CXLKV_IOC_CARVE_LIST, l), "carve list");
	check(l->count == 2 && !strcmp(l->carves[0].name, "control") &&
	      !strcmp(l->carves[1].name, "data"), "carve list sorted", "count %u", l->count);

	/* Fill the pool with 2 MiB carves: the table or the space runs out cleanly. */
	for (n = 0;; n++) {
		char name[16];

		snprintf(name, sizeof(name), "fill%d", n);
		d = carve_req(name, 2 * MiB, n % 3, 0);
		if (ioc(fd, CXLKV_IOC_CARVE_CREATE, &d))
			break;
	}
	expect_err(ioc(fd, CXLKV_IOC_CARVE_CREATE, &d), ENOSPC, "carve create until full");
	for (i = 0; i < (uint32_t)n; i++) {
		char name[16];

		snprintf(name, sizeof(name), "fill%u", i);
		r = rm_req(name, 0);
		if (ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r))
			break;
	}
	check(i == (uint32_t)n && n > 0, "carve remove all fills", "%u of %d", i, n);
	r = rm_req("nope", 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r), ENOENT, "carve remove missing");
	r = rm_req("control", 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r), EPERM, "carve remove system carve");
	r = rm_req("data", 0x10);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r), EINVAL, "carve remove bad flags");
	free(l);
}

/* Is [base, base+len) listed by PAT with this memory type? (debugfs) */
static int pat_has(uint64_t base, uint64_t len, const char *type)
{
	FILE *f = fopen("/sys/kernel/debug/x86/pat_memtype_list", "r");
	char line[256];
	int found = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s, e;
		char t[64];

		if (sscanf(line, "PAT: [mem 0x%llx-0x%llx] %63s", &s, &e, t) == 3 &&
		    s <= base && e >= base + len && !strncmp(t, type, strlen(type)))
			found = 1;
	}
	fclose(f);
	return found;
}

static void abi_mmap_memtype(int fd, const struct cxlkv_ioc_info *info)
{
	struct cxlkv_ioc_memtype m;
	struct cxlkv_ioc_carve_remove r;
	struct cxlkv_carve c = carve_req("data", 0, 0, 0);
	const struct cxlkv_superblock *sb;
	volatile uint64_t *p;
	int phys = info->backing != CXLKV_BACKING_EMULATED;
	uint64_t i;

	expect_ok(ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &c), "lookup for mmap");

	sb = map(fd, 0, 4096, PROT_READ, MAP_SHARED);
	check(sb && sb->magic == CXLKV_SB_MAGIC && sb->checksum == cxlkv_sb_checksum(sb) &&
	      sb->ncarves == 2, "mmap superblock read-only, checksum as userspace computes", "%p", sb);
	if (sb) {
		check(mprotect((void *)sb, 4096, PROT_READ | PROT_WRITE) != 0, "superblock cannot become writable",
		      "mprotect succeeded");
		munmap((void *)sb, 4096);
	}
	check(!map(fd, 0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED), "superblock writable mmap refused", "mapped");
	check(!map(fd, 0, 8192, PROT_READ, MAP_SHARED), "superblock mmap longer than a page refused", "mapped");
	check(!map(fd, 1 * MiB, 4096, PROT_READ, MAP_SHARED), "mmap outside carves refused", "mapped");
	check(!map(fd, c.offset + c.size - 4096, 8192, PROT_READ, MAP_SHARED),
	      "mmap across carve end refused", "mapped");
	check(!map(fd, info->size + 2 * MiB, 4096, PROT_READ, MAP_SHARED), "mmap past pool refused", "mapped");
	check(!map(fd, c.offset, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE), "private mmap refused", "mapped");

	p = map(fd, c.offset, c.size, PROT_READ | PROT_WRITE, MAP_SHARED);
	check(p != NULL, "mmap carve", "%s", strerror(errno));
	if (!p)
		return;
	for (i = 0; i < c.size / 8; i += 512)
		p[i] = i * 0x9e3779b97f4a7c15ULL;
	for (i = 0; i < c.size / 8 && p[i] == i * 0x9e3779b97f4a7c15ULL; i += 512)
		;
	check(i >= c.size / 8, "mmap carve read back", "mismatch at word %llu", (unsigned long long)i);

	m = mt_req("data", 0);
	expect_ok(ioc(fd, CXLKV_IOC_MEMTYPE_GET, &m), "memtype get");
	check(m.memtype == CXLKV_MEM_WB && m.mappings == 1, "memtype get counts mappings",
	      "memtype %u mappings %u", m.memtype, m.mappings);
	m = mt_req("data", CXLKV_MEM_WC);
	expect_err(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), EBUSY, "memtype set on mapped carve");
	r = rm_req("data", 0);
	expect_err(ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r), EBUSY, "carve remove while mapped");

	/* a pool mapping is unmapped whole (PAT reserves its type for the whole range) */
	check(munmap((void *)(p + 512), 4096) != 0 && errno == EINVAL, "partial munmap refused",
	      "%s", strerror(errno));
	/* a fork()ed child's copy is a mapping too */
	{
		int up[2], down[2];
		pid_t ch;
		char b = 0;

		if (pipe(up) == 0 && pipe(down) == 0) {
			ch = fork();
			if (ch == 0) {
				/* tell the parent we exist, wait until it has counted */
				if (write(up[1], "x", 1) != 1 || read(down[0], &b, 1) < 0)
					_exit(1);
				_exit(0);
			}
			if (read(up[0], &b, 1) == 1) {
				m = mt_req("data", 0);
				ioc(fd, CXLKV_IOC_MEMTYPE_GET, &m);
				check(m.mappings == 2, "fork counts the child's mapping", "mappings %u",
				      m.mappings);
			}
			if (write(down[1], "y", 1) != 1)
				b = 0;
			waitpid(ch, NULL, 0);
			close(up[0]);
			close(up[1]);
			close(down[0]);
			close(down[1]);
		}
	}
	munmap((void *)p, c.size);
	m = mt_req("data", 0);
	ioc(fd, CXLKV_IOC_MEMTYPE_GET, &m);
	check(m.mappings == 0, "unmap drops the count", "mappings %u", m.mappings);

	m = mt_req("data", CXLKV_MEM_WC);
	expect_ok(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), "memtype set WC");
	m = mt_req("data", 0);
	ioc(fd, CXLKV_IOC_MEMTYPE_GET, &m);
	check(m.memtype == CXLKV_MEM_WC, "memtype get after set", "memtype %u", m.memtype);
	p = map(fd, c.offset, c.size, PROT_READ | PROT_WRITE, MAP_SHARED);
	check(p != NULL, "mmap WC carve", "%s", strerror(errno));
	if (p) {
		p[7] = 0x1234;
		check(p[7] == 0x1234, "WC carve read back", "got %#llx", (unsigned long long)p[7]);
		if (phys) {
			int has = pat_has(info->phys_base + c.offset, c.size, "write-combining");

			check(has != 0, "PAT lists the carve as write-combining", "not in pat_memtype_list");
		}
		munmap((void *)p, c.size);
	}
	m = mt_req("data", CXLKV_MEM_UC);
	expect_ok(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), "memtype set UC");
	p = map(fd, c.offset, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED);
	check(p && p[7] == 0x1234, "UC carve keeps data", "%p", p);
	if (p && phys)
		check(pat_has(info->phys_base + c.offset, 2 * MiB, "uncached") != 0,
		      "PAT lists the carve as uncached", "not in pat_memtype_list");
	if (p)
		munmap((void *)p, 2 * MiB);
	m = mt_req("data", 3);
	expect_err(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), EINVAL, "memtype set invalid type");
	m = mt_req("nope", 0);
	expect_err(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), ENOENT, "memtype set unknown carve");
	m = mt_req("data", 0);
	m.reserved[1] = 1;
	expect_err(ioc(fd, CXLKV_IOC_MEMTYPE_GET, &m), EINVAL, "memtype get nonzero reserved");
	m = mt_req("data", CXLKV_MEM_WB);
	expect_ok(ioc(fd, CXLKV_IOC_MEMTYPE_SET, &m), "memtype set back to WB");
}

struct slot_view {
	volatile struct cxlkv_lock_slot *slot;
	void *base;
	uint64_t len;
};

/* Map the page of the control carve holding a slot (control carve is WB). */
static struct slot_view map_slot(int fd, uint64_t slot_off)
{
	struct slot_view v = { 0 };
	uint64_t page = slot_off & ~4095ULL;

	v.len = 4096;
	v.base = map(fd, page, v.len, PROT_READ | PROT_WRITE, MAP_SHARED);
	if (v.base)
		v.slot = (void *)((char *)v.base + (slot_off - page));
	return v;
}

static void abi_locks(int fd, const char *dev)
{
	struct cxlkv_ioc_lock a = { 0 }, b = { 0 };
	struct cxlkv_ioc_lock_list *l = calloc(1, sizeof(*l));
	struct cxlkv_ioc_info info;
	struct slot_view v;
	int fd2 = open_dev(dev), pipefd[2];
	pid_t child;
	char ch;

	a.lock_id = CXLKV_LOCK_ANY;
	expect_ok(ioc(fd2, CXLKV_IOC_LOCK_ALLOC, &a), "lock alloc any");
	check(a.lock_id == CXLKV_LOCK_FIRST_USER && a.node == 0 && a.slot_off && a.grant_off,
	      "lock alloc any gives the first user id, never a reserved one",
	      "id %u node %u", a.lock_id, a.node);
	b.lock_id = CXLKV_LOCK_FIRST_USER;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), EBUSY, "lock alloc owned by another file");
	b.lock_id = 5;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), EPERM, "lock alloc of a reserved id without the runtime flag");
	b.flags = 2;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), EINVAL, "lock alloc unknown flag");
	b.flags = CXLKV_LOCK_F_RUNTIME;
	expect_ok(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), "lock alloc reserved id 5 as the runtime");
	b.flags = 0;
	b.lock_id = 1024;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), EINVAL, "lock alloc id beyond max_locks");
	memset(&b, 0, sizeof(b));
	b.lock_id = 5;
	expect_err(ioc(fd2, CXLKV_IOC_LOCK_FREE, &b), EPERM, "lock free of another file's slot");
	b.lock_id = 7;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_FREE, &b), ENOENT, "lock free of unowned slot");
	b.lock_id = CXLKV_LOCK_ANY;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_FREE, &b), EINVAL, "lock free of 'any'");
	b.lock_id = 5;
	b.reserved[0] = 9;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), EINVAL, "lock alloc nonzero reserved");
	memset(&b, 0, sizeof(b));
	b.lock_id = 5;
	b.flags = CXLKV_LOCK_F_RUNTIME;
	expect_err(ioc(fd, CXLKV_IOC_LOCK_FREE, &b), EINVAL, "lock free with flags");

	expect_ok(ioc(fd, CXLKV_IOC_LOCK_LIST, l), "lock list");
	check(l->total == 2 && l->count == 2 && l->entries[0].lock_id == 5 && l->entries[0].mine &&
	      l->entries[0].owner_pid == (uint32_t)getpid() &&
	      l->entries[1].lock_id == CXLKV_LOCK_FIRST_USER && !l->entries[1].mine &&
	      l->next == CXLKV_LOCK_ANY,
	      "lock list shows owners", "total %u count %u", l->total, l->count);
	memset(&b, 0, sizeof(b));
	b.lock_id = 5;
	expect_ok(ioc(fd, CXLKV_IOC_LOCK_FREE, &b), "lock free");

	/* Close releases: the slot of lock 128 is WAITING with ticket 3, as a holder leaves it. */
	v = map_slot(fd, a.slot_off);
	check(v.slot != NULL, "map lock slot", "%s", strerror(errno));
	if (!v.slot)
		return;
	store_publish(&v.slot->request, (3ULL << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_WAITING);
	check(load_fresh((volatile uint64_t *)&v.slot->owner_pid) == (uint32_t)getpid(),
	      "lock alloc records owner_pid", "owner_pid %u", v.slot->owner_pid);
	close(fd2);
	check(load_fresh(&v.slot->request) == ((3ULL << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_IDLE) &&
	      v.slot->owner_pid == 0, "close sets owned slot idle keeping the ticket",
	      "request %#llx owner %u", (unsigned long long)v.slot->request, v.slot->owner_pid);
	munmap(v.base, v.len);

	/* Death releases: a child takes lock 200, waits with ticket 5 and is killed. */
	if (pipe(pipefd))
		return;
	child = fork();
	if (child == 0) {
		int cfd = open_dev(dev);
		struct cxlkv_ioc_lock c = { .lock_id = 200 };
		struct slot_view cv;

		if (ioc(cfd, CXLKV_IOC_LOCK_ALLOC, &c))
			_exit(1);
		cv = map_slot(cfd, c.slot_off);
		store_publish(&cv.slot->request, (5ULL << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_WAITING);
		if (write(pipefd[1], "r", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	if (read(pipefd[0], &ch, 1) != 1)
		ch = 0;
	memset(&info, 0, sizeof(info));
	ioc(fd, CXLKV_IOC_INFO, &info);
	check(ch == 'r' && info.lock_slots_in_use == 1, "child owns a slot", "in use %u",
	      info.lock_slots_in_use);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	memset(&info, 0, sizeof(info));
	ioc(fd, CXLKV_IOC_INFO, &info);
	check(info.lock_slots_in_use == 0, "process death frees its slots", "in use %u",
	      info.lock_slots_in_use);
	memset(&b, 0, sizeof(b));
	b.lock_id = 200;
	expect_ok(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &b), "slot of dead process is free again");
	v = map_slot(fd, b.slot_off);
	if (v.slot) {
		check(load_fresh(&v.slot->request) ==
		      ((5ULL << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_IDLE),
		      "process death sets the slot idle", "request %#llx",
		      (unsigned long long)v.slot->request);
		munmap(v.base, v.len);
	}
	ioc(fd, CXLKV_IOC_LOCK_FREE, &b);
	close(pipefd[0]);
	close(pipefd[1]);
	free(l);
}

/* First PCI function in sysfs with this vendor:device, as domain/bus/devfn. */
static int find_pci(uint32_t vendor, uint32_t device, struct cxlkv_ioc_ddio *a)
{
	DIR *dir = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	int found = 0;

	if (!dir)
		return 0;
	while (!found && (e = readdir(dir))) {
		char path[300];
		unsigned int v = 0, d = 0, dom, bus, slot, fn;
		FILE *f;

		if (sscanf(e->d_name, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4)
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", e->d_name);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%x", &v) != 1)
				v = 0;
			fclose(f);
		}
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", e->d_name);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%x", &d) != 1)
				d = 0;
			fclose(f);
		}
		if (v == vendor && d == device) {
			memset(a, 0, sizeof(*a));
			a->domain = dom;
			a->bus = bus;
			a->devfn = (slot << 3) | fn;
			found = 1;
		}
	}
	closedir(dir);
	return found;
}

static void abi_ddio(int fd)
{
	struct cxlkv_ioc_ddio a, b, c;
	int r;

	/* QEMU's generic PCIe root port (1b36:000c): not Intel. */
	if (find_pci(0x1b36, 0x000c, &a)) {
		b = a;
		expect_ok(ioc(fd, CXLKV_IOC_DDIO_GET, &b), "ddio get on QEMU root port");
		check(!b.known && b.port_vendor == 0x1b36 && b.port_bus == a.bus &&
		      b.port_devfn == a.devfn, "ddio get reports an unknown port", "known %u vendor %#x",
		      b.known, b.port_vendor);
		b = a;
		b.enable = 0;
		expect_err(ioc(fd, CXLKV_IOC_DDIO_SET, &b), EOPNOTSUPP, "ddio off refused on non-Intel port");
		b = a;
		b.flags = CXLKV_DDIO_F_FORCE;
		b.enable = 1;
		r = ioc(fd, CXLKV_IOC_DDIO_SET, &b);
		printf("ddio: forced on on %02x:%02x.%d: %s, perfctrlsts %#x\n", a.bus,
		       a.devfn >> 3, a.devfn & 7, r ? strerror(-r) : "latched", b.perfctrlsts);
		check(r == -EIO || (r == 0 && b.enable && (b.perfctrlsts & CXLKV_DDIO_ALLOC_FLOW)),
		      "ddio forced write is read back", "got %d", r);
		if (r == 0) {
			c = a;
			ioc(fd, CXLKV_IOC_DDIO_GET, &c);
			check(c.perfctrlsts & CXLKV_DDIO_ALLOC_FLOW, "ddio get sees the forced value",
			      "perfctrlsts %#x", c.perfctrlsts);
		}
	} else {
		check(0, "QEMU pcie-root-port present", "none in /sys/bus/pci/devices");
	}
	/* QEMU's ioh3420 is an Intel root port, but not an IIO one. */
	if (find_pci(0x8086, 0x3420, &a)) {
		b = a;
		expect_err(ioc(fd, CXLKV_IOC_DDIO_SET, &b), EOPNOTSUPP, "ddio refused on unknown Intel port");
	}
	/* the host bridge has no PCIe root port above it */
	memset(&a, 0, sizeof(a));
	expect_err(ioc(fd, CXLKV_IOC_DDIO_GET, &a), ENODEV, "ddio get without a root port");
	a.bus = 0xfe;
	a.devfn = 0xff;
	expect_err(ioc(fd, CXLKV_IOC_DDIO_GET, &a), ENODEV, "ddio get of absent device");
	memset(&a, 0, sizeof(a));
	a.flags = 0x100;
	expect_err(ioc(fd, CXLKV_IOC_DDIO_SET, &a), EINVAL, "ddio set bad flags");
	memset(&a, 0, sizeof(a));
	a.enable = 2;
	expect_err(ioc(fd, CXLKV_IOC_DDIO_SET, &a), EINVAL, "ddio set bad enable");
}

static void abi_format(int fd)
{
	struct cxlkv_ioc_format f = { .max_nodes = 0 };
	struct cxlkv_carve c = carve_req("control", 0, 0, 0);
	struct cxlkv_ioc_info info;
	void *p;

	expect_err(ioc(fd, CXLKV_IOC_FORMAT, &f), EINVAL, "format with max_nodes 0");
	f.max_nodes = 65;
	expect_err(ioc(fd, CXLKV_IOC_FORMAT, &f), EINVAL, "format with max_nodes 65");
	f.max_nodes = 8;
	expect_err(ioc(fd, CXLKV_IOC_FORMAT, &f), EEXIST, "format of a valid pool without force");
	f.flags = CXLKV_FORMAT_F_FORCE;
	ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &c);
	p = map(fd, c.offset, c.size, PROT_READ, MAP_SHARED);
	expect_err(ioc(fd, CXLKV_IOC_FORMAT, &f), EBUSY, "format while a carve is mapped");
	if (p)
		munmap(p, c.size);
	expect_ok(ioc(fd, CXLKV_IOC_FORMAT, &f), "format with force");
	memset(&info, 0, sizeof(info));
	ioc(fd, CXLKV_IOC_INFO, &info);
	check((info.flags & CXLKV_INFO_F_FORMATTED) && info.ncarves == 0 && info.max_nodes == 8,
	      "format leaves an empty valid pool", "flags %#x ncarves %u max_nodes %u", info.flags,
	      info.ncarves, info.max_nodes);
}

static int cmd_abi(const char *dev, const char *kind)
{
	struct cxlkv_ioc_info info;
	uint32_t want = !strcmp(kind, "phys") ? CXLKV_BACKING_PHYS :
			!strcmp(kind, "ivshmem") ? CXLKV_BACKING_IVSHMEM : CXLKV_BACKING_EMULATED;
	struct cxlkv_carve c;
	struct cxlkv_ioc_carve_remove r;
	int fd = open_dev(dev), rofd;

	memset(&info, 0, sizeof(info));
	abi_handshake(fd, want, &info);
	abi_carves(fd, &info);
	abi_mmap_memtype(fd, &info);
	abi_locks(fd, dev);
	abi_ddio(fd);

	rofd = open(dev, O_RDONLY);
	c = carve_req("ro", 2 * MiB, 0, 0);
	check(rofd >= 0 && ioc(rofd, CXLKV_IOC_CARVE_CREATE, &c) == -EBADF,
	      "read-only file cannot change carves", "fd %d", rofd);
	close(rofd);

	r = rm_req("data", 0);
	expect_ok(ioc(fd, CXLKV_IOC_CARVE_REMOVE, &r), "carve remove");
	abi_format(fd);
	close(fd);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

/* ---- fuzz ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static const unsigned long fuzz_cmds[] = {
	CXLKV_IOC_GET_VERSION, CXLKV_IOC_INFO, CXLKV_IOC_CARVE_CREATE, CXLKV_IOC_CARVE_LOOKUP,
	CXLKV_IOC_CARVE_LIST, CXLKV_IOC_CARVE_REMOVE, CXLKV_IOC_MEMTYPE_GET, CXLKV_IOC_MEMTYPE_SET,
	CXLKV_IOC_DDIO_GET, CXLKV_IOC_DDIO_SET, CXLKV_IOC_LOCK_ALLOC, CXLKV_IOC_LOCK_FREE,
	CXLKV_IOC_LOCK_LIST, CXLKV_IOC_FORMAT,
};

static const char *fuzz_names[] = { "control", "data", "kv", "a", "b.c", "zz-9", "x_y" };

static void fuzz_fill(unsigned char *buf, size_t n, unsigned long cmd)
{
	size_t i;

	for (i = 0; i < n; i++)
		buf[i] = rnd() & 0xff;
	/* Half the time, make the buffer plausible so deeper paths run. */
	if (rnd() & 1) {
		const char *nm = fuzz_names[rnd() % (sizeof(fuzz_names) / sizeof(fuzz_names[0]))];

		memset(buf, 0, n);
		if (cmd != CXLKV_IOC_LOCK_ALLOC && cmd != CXLKV_IOC_LOCK_FREE &&
		    cmd != CXLKV_IOC_DDIO_GET && cmd != CXLKV_IOC_DDIO_SET)
			strcpy((char *)buf, nm);
		if (cmd == CXLKV_IOC_CARVE_CREATE) {
			struct cxlkv_carve *c = (void *)buf;

			c->size = (rnd() % 8) * MiB + (rnd() & 1 ? 0 : rnd() % 4096);
			c->memtype = rnd() % 4;
			c->flags = rnd() % 3;
		} else if (cmd == CXLKV_IOC_FORMAT) {
			memset(buf, 0, n);
			((struct cxlkv_ioc_format *)buf)->max_nodes = rnd() % 70;
			((struct cxlkv_ioc_format *)buf)->flags = rnd() % 3;
		} else if (cmd == CXLKV_IOC_MEMTYPE_SET || cmd == CXLKV_IOC_MEMTYPE_GET) {
			((struct cxlkv_ioc_memtype *)buf)->memtype = rnd() % 4;
		} else if (cmd == CXLKV_IOC_LOCK_ALLOC || cmd == CXLKV_IOC_LOCK_FREE) {
			((struct cxlkv_ioc_lock *)buf)->lock_id = rnd() & 1 ? rnd() % 2048 : CXLKV_LOCK_ANY;
		} else if (cmd == CXLKV_IOC_DDIO_GET || cmd == CXLKV_IOC_DDIO_SET) {
			struct cxlkv_ioc_ddio *a = (void *)buf;

			a->bus = rnd() % 4;
			a->devfn = rnd() % 64;
			a->enable = rnd() % 2;
			a->flags = rnd() % 2;
		}
	}
	/* Never force a DDIO write onto a random device's config space. */
	if (cmd == CXLKV_IOC_DDIO_SET)
		((struct cxlkv_ioc_ddio *)buf)->flags &= ~CXLKV_DDIO_F_FORCE;
}

static int cmd_fuzz(const char *dev, long iters, uint64_t seed)
{
	/* the argument buffer sits right before a PROT_NONE page */
	unsigned char *pages = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *guard = pages + 2 * 4096;
	long i, errs[8] = { 0 };
	int fds[4], k, alive = 1;
	struct cxlkv_ioc_info info;

	rng_state = seed ? seed : 88172645463325252ULL;
	mprotect(guard, 4096, PROT_NONE);
	for (k = 0; k < 4; k++)
		fds[k] = open_dev(dev);
	for (i = 0; i < iters; i++) {
		unsigned long cmd;
		unsigned char *arg;
		size_t sz;
		int fd = fds[rnd() % 4], r;
		unsigned int pick = rnd() % 100;

		if (pick < 70) {
			cmd = fuzz_cmds[rnd() % (sizeof(fuzz_cmds) / sizeof(fuzz_cmds[0]))];
		} else if (pick < 85) {
			/* right number, wrong size or direction */
			cmd = _IOC(rnd() % 4, CXLKV_IOC_MAGIC, rnd() % 0x50, rnd() % 4096);
		} else {
			cmd = (unsigned int)rnd();
		}
		sz = _IOC_SIZE(cmd);
		if (sz > 8192)
			sz = 8192;
		switch (rnd() % 10) {
		case 0:
			arg = NULL;
			break;
		case 1:
			arg = (unsigned char *)(uintptr_t)rnd();
			break;
		case 2:
			/* straddles into the guard page */
			arg = guard - (rnd() % (sz + 1));
			break;
		default:
			arg = guard - sz;
			fuzz_fill(arg, sz, cmd);
			break;
		}
		r = ioctl(fd, cmd, arg);
		errs[r == 0 ? 0 : errno == ENOTTY ? 1 : errno == EINVAL ? 2 : errno == EFAULT ? 3 : 4]++;

		if (rnd() % 50 == 0) {
			/* reopen: releases whatever slots that file owned */
			k = rnd() % 4;
			close(fds[k]);
			fds[k] = open_dev(dev);
		}
		if (rnd() % 100 == 0) {
			uint64_t off = (rnd() % 64) * MiB + (rnd() & 1 ? 0 : (rnd() % 512) * 4096);
			size_t len = (rnd() % 4 + 1) * 4096 * (rnd() & 1 ? 1 : 256);
			void *p = mmap(NULL, len, PROT_READ | (rnd() & 1 ? PROT_WRITE : 0),
				       rnd() % 8 ? MAP_SHARED : MAP_PRIVATE, fd, (off_t)off);

			if (p != MAP_FAILED) {
				((volatile char *)p)[0];
				munmap(p, len);
			}
		}
		if (rnd() % 500 == 0) {
			/* a process that dies owning slots */
			pid_t c = fork();

			if (c == 0) {
				int cfd = open_dev(dev);
				struct cxlkv_ioc_lock l = { .lock_id = CXLKV_LOCK_ANY };

				ioctl(cfd, CXLKV_IOC_LOCK_ALLOC, &l);
				_exit(0);
			}
			waitpid(c, NULL, 0);
		}
	}
	for (k = 0; k < 4; k++)
		close(fds[k]);
	printf("fuzz: %ld calls: %ld ok, %ld ENOTTY, %ld EINVAL, %ld EFAULT, %ld other\n", iters,
	       errs[0], errs[1], errs[2], errs[3], errs[4]);
	k = open_dev(dev);
	memset(&info, 0, sizeof(info));
	alive = ioc(k, CXLKV_IOC_INFO, &info) == 0;
	check(alive && info.lock_slots_in_use == 0, "module answers after fuzz with no slots owned",
	      "alive %d slots %u", alive, info.lock_slots_in_use);
	close(k);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

/* ---- unprivileged callers (kmod/README.md, permission model) ------------- */

#define NOBODY 65534

static const char *param_path(const char *name)
{
	static char p[128];

	snprintf(p, sizeof(p), "/sys/module/cxlkv/parameters/%s", name);
	return p;
}

static long param_get(const char *name)
{
	FILE *f = fopen(param_path(name), "r");
	long v = -2;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -2;
		fclose(f);
	}
	return v;
}

static int param_set(const char *name, long v)
{
	FILE *f = fopen(param_path(name), "w");
	int ok;

	if (!f)
		return 0;
	ok = fprintf(f, "%ld\n", v) > 0;
	return fclose(f) == 0 && ok;
}

/* Drop to uid/gid 65534 with no supplementary groups and no capabilities. */
static int become_nobody(void)
{
	if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
		return -1;
	return getuid() == NOBODY && geteuid() == NOBODY ? 0 : -1;
}

/* Run fn(dev, arg) in a child as uid 65534; its exit status (0: all checks passed). */
static int run_as_nobody(int (*fn)(const char *, long), const char *dev, long arg)
{
	pid_t c = fork();
	int st = 0;

	if (c == 0) {
		if (become_nobody()) {
			printf("FAIL become uid %d: %s\n", NOBODY, strerror(errno));
			_exit(1);
		}
		_exit(fn(dev, arg));
	}
	if (c < 0 || waitpid(c, &st, 0) != c)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/*
 * As uid 65534 on a device file mode 0666.  admin: the module's admin_gid
 * names our group.  max_slots: the module's max_slots_per_file.
 */
static int unpriv_checks(const char *dev, long arg)
{
	int admin = arg < 0, max_slots = (int)(arg < 0 ? -arg : arg);
	int ro = open(dev, O_RDONLY | O_CLOEXEC), rw = open(dev, O_RDWR | O_CLOEXEC), rw2, n, r;
	struct cxlkv_ioc_lock l;
	struct cxlkv_ioc_info info;
	struct cxlkv_ioc_carve_list *cl = calloc(1, sizeof(*cl));
	struct cxlkv_ioc_lock_list *ll = calloc(1, sizeof(*ll));
	struct cxlkv_carve c;
	struct cxlkv_ioc_carve_remove rm;
	struct cxlkv_ioc_memtype mt;
	struct cxlkv_ioc_format f = { .max_nodes = 8, .flags = CXLKV_FORMAT_F_FORCE };

	check(ro >= 0 && rw >= 0, "unprivileged user opens the device read-only and read-write",
	      "ro %d rw %d: %s", ro, rw, strerror(errno));
	if (ro < 0 || rw < 0)
		return 1;

	/* A read-only file reads, but owns no lock slot and changes no carve. */
	memset(&l, 0, sizeof(l));
	l.lock_id = CXLKV_LOCK_ANY;
	expect_err(ioc(ro, CXLKV_IOC_LOCK_ALLOC, &l), EBADF, "read-only file: lock alloc any refused");
	memset(&l, 0, sizeof(l));
	l.lock_id = 0;
	l.flags = CXLKV_LOCK_F_RUNTIME;
	expect_err(ioc(ro, CXLKV_IOC_LOCK_ALLOC, &l), EBADF, "read-only file: lock alloc of id 0 refused");
	memset(&l, 0, sizeof(l));
	l.lock_id = 300;
	expect_err(ioc(ro, CXLKV_IOC_LOCK_FREE, &l), EBADF, "read-only file: lock free refused");
	c = carve_req("ro", 2 * MiB, 0, 0);
	expect_err(ioc(ro, CXLKV_IOC_CARVE_CREATE, &c), EBADF, "read-only file: carve create refused");
	rm = rm_req("control", CXLKV_CARVE_RM_FORCE);
	expect_err(ioc(ro, CXLKV_IOC_CARVE_REMOVE, &rm), EBADF, "read-only file: carve remove refused");
	mt = mt_req("control", CXLKV_MEM_WC);
	expect_err(ioc(ro, CXLKV_IOC_MEMTYPE_SET, &mt), EBADF, "read-only file: memtype set refused");
	expect_err(ioc(ro, CXLKV_IOC_FORMAT, &f), EBADF, "read-only file: format refused");
	memset(&info, 0, sizeof(info));
	expect_ok(ioc(ro, CXLKV_IOC_INFO, &info), "read-only file: info");
	expect_ok(ioc(ro, CXLKV_IOC_CARVE_LIST, cl), "read-only file: carve list");
	expect_ok(ioc(ro, CXLKV_IOC_LOCK_LIST, ll), "read-only file: lock list");
	mt = mt_req("control", 0);
	expect_ok(ioc(ro, CXLKV_IOC_MEMTYPE_GET, &mt), "read-only file: memtype get");

	/* A writable file without CAP_SYS_ADMIN changes no carve (unless admin_gid). */
	if (!admin) {
		c = carve_req("mine", 2 * MiB, 0, 0);
		expect_err(ioc(rw, CXLKV_IOC_CARVE_CREATE, &c), EPERM, "carve create needs CAP_SYS_ADMIN");
		rm = rm_req("control", CXLKV_CARVE_RM_FORCE);
		expect_err(ioc(rw, CXLKV_IOC_CARVE_REMOVE, &rm), EPERM,
			   "carve remove of the control carve (force) needs CAP_SYS_ADMIN");
		mt = mt_req("control", CXLKV_MEM_UC);
		expect_err(ioc(rw, CXLKV_IOC_MEMTYPE_SET, &mt), EPERM, "memtype set needs CAP_SYS_ADMIN");
		expect_err(ioc(rw, CXLKV_IOC_FORMAT, &f), EPERM, "format needs CAP_SYS_ADMIN");
	} else {
		c = carve_req("grp", 2 * MiB, 0, 0);
		expect_ok(ioc(rw, CXLKV_IOC_CARVE_CREATE, &c), "admin_gid member creates a carve");
		mt = mt_req("grp", CXLKV_MEM_WC);
		expect_ok(ioc(rw, CXLKV_IOC_MEMTYPE_SET, &mt), "admin_gid member sets its memtype");
		rm = rm_req("grp", 0);
		expect_ok(ioc(rw, CXLKV_IOC_CARVE_REMOVE, &rm), "admin_gid member removes it");
	}

	/* Reserved ids: only the runtime (flag) gets them; 'any' never picks one. */
	memset(&l, 0, sizeof(l));
	l.lock_id = 0;
	expect_err(ioc(rw, CXLKV_IOC_LOCK_ALLOC, &l), EPERM, "reserved lock id 0 refused");
	l.lock_id = CXLKV_LOCK_FIRST_USER - 1;
	expect_err(ioc(rw, CXLKV_IOC_LOCK_ALLOC, &l), EPERM, "reserved lock id 127 refused");

	/* Each open file owns at most max_slots_per_file slots. */
	for (n = 0;; n++) {
		memset(&l, 0, sizeof(l));
		l.lock_id = CXLKV_LOCK_ANY;
		r = ioc(rw, CXLKV_IOC_LOCK_ALLOC, &l);
		if (r)
			break;
		if (l.lock_id < CXLKV_LOCK_FIRST_USER) {
			check(0, "lock alloc any never gives a reserved id", "got %u", l.lock_id);
			break;
		}
	}
	check(r == -EDQUOT && n == max_slots, "one file owns at most max_slots_per_file slots",
	      "owned %d, then %d (%s); max_slots_per_file %d", n, r, strerror(-r), max_slots);
	rw2 = open(dev, O_RDWR | O_CLOEXEC);
	memset(&l, 0, sizeof(l));
	l.lock_id = CXLKV_LOCK_ANY;
	expect_ok(ioc(rw2, CXLKV_IOC_LOCK_ALLOC, &l), "another file still gets a slot");
	close(rw2);
	close(rw);
	memset(&info, 0, sizeof(info));
	ioc(ro, CXLKV_IOC_INFO, &info);
	check(info.lock_slots_in_use == 0, "closing the files releases every slot", "in use %u",
	      info.lock_slots_in_use);
	close(ro);
	free(cl);
	free(ll);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

static int fuzz_child(const char *dev, long iters)
{
	return cmd_fuzz(dev, iters, 7);
}

/*
 * cxlkv_vmtest unpriv DEV: the permission model as uid 65534 (device file
 * made 0666 for the test), once plainly and once as a member of admin_gid.
 */
static int cmd_unpriv(const char *dev)
{
	long max_slots = param_get("max_slots_per_file");
	struct cxlkv_carve c;
	int fd = open_dev(dev), rc1, rc2;

	check(max_slots > 0 && param_get("admin_gid") == -1, "module parameters readable with defaults",
	      "max_slots_per_file %ld admin_gid %ld", max_slots, param_get("admin_gid"));
	check(chmod(dev, 0666) == 0, "device file opened to everyone for the test", "%s", strerror(errno));
	rc1 = run_as_nobody(unpriv_checks, dev, max_slots);
	check(rc1 == 0, "unprivileged checks", "child exit %d", rc1);
	check(param_set("admin_gid", NOBODY), "set admin_gid", "%s", strerror(errno));
	rc2 = run_as_nobody(unpriv_checks, dev, -max_slots);
	check(rc2 == 0, "admin_gid member checks", "child exit %d", rc2);
	param_set("admin_gid", -1);
	c = carve_req("control", 0, 0, 0);
	expect_ok(ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &c), "control carve survived the unprivileged user");
	chmod(dev, 0600);
	close(fd);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

/* cxlkv_vmtest fuzz-unpriv DEV ITER: the ioctl fuzz as uid 65534. */
static int cmd_fuzz_unpriv(const char *dev, long iters)
{
	struct cxlkv_carve c;
	int fd = open_dev(dev), rc;

	check(chmod(dev, 0666) == 0, "device file opened to everyone for the fuzz", "%s", strerror(errno));
	rc = run_as_nobody(fuzz_child, dev, iters);
	check(rc == 0, "fuzz as uid 65534", "child exit %d", rc);
	c = carve_req("control", 0, 0, 0);
	expect_ok(ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &c), "control carve survived the unprivileged fuzz");
	chmod(dev, 0600);
	close(fd);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

/* ---- two hosts ------------------------------------------------------------ */

/* Lines of the "twohost" carve; each has one writer (rule 2) except the counter. */
struct twohost_lines {
	volatile uint64_t hello[8];	/* node 0: magic when its pattern is written */
	volatile uint64_t seen[2][8];	/* node i: 1 once it verified the other's pattern */
	volatile uint64_t counter[8];	/* written only under lock 1 */
	volatile uint64_t phase[2][8];	/* node i: last phase finished */
	volatile uint64_t stop[8];	/* node 0: granter may stop */
};

#define TWOHOST_MAGIC 0x74736f686f7774ULL
#define PATTERN_OFF   (64 * 1024)
#define PATTERN_LEN   (64 * 1024)
#define LOCK_ID       (CXLKV_LOCK_FIRST_USER + 1)

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ULL + ts.tv_nsec / 1000000;
}

static int wait_for(volatile void *p, uint64_t want, int timeout_s, const char *what)
{
	uint64_t end = now_ms() + timeout_s * 1000ULL;

	while (load_fresh(p) != want) {	/* rule 4: invalidate on every poll */
		if (now_ms() > end) {
			printf("FAIL twohost: timed out waiting for %s\n", what);
			return -1;
		}
		sched_yield();
	}
	return 0;
}

static void pattern(volatile uint64_t *p, int node, int write, int *bad)
{
	size_t i;

	for (i = 0; i < PATTERN_LEN / 8; i++) {
		uint64_t want = (i + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)node << 60;

		if (write) {
			p[i] = want;
		} else {
			if (i % 8 == 0)
				clflush(&p[i]);	/* rule 4 */
			if (i % 8 == 0)
				mfence();
			if (p[i] != want)
				(*bad)++;
		}
	}
	if (write) {
		for (i = 0; i < PATTERN_LEN / 8; i += 8)
			clflush(&p[i]);	/* rule 3: data reaches memory before the flag */
		mfence();
	}
}

/* The lock manager, reduced to one lock: grant waiting nodes round-robin. */
static void grant_loop(volatile char *ctrl, const struct cxlkv_ctrl_header *h,
		       volatile struct twohost_lines *t)
{
	volatile struct cxlkv_lock_grant *g =
		(void *)(ctrl + h->grant_table_off + LOCK_ID * sizeof(struct cxlkv_lock_grant));
	uint64_t end = now_ms() + 300 * 1000;
	uint32_t cur = g->node, n, k;

	while (!load_fresh(&t->stop[0]) && now_ms() < end) {
		if (cur != CXLKV_GRANT_NONE) {
			volatile struct cxlkv_lock_slot *s =
				(void *)(ctrl + cxlkv_lock_slot_off(h, LOCK_ID, cur));
			uint64_t req = load_fresh(&s->request);

			if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_WAITING &&
			    req >> CXLKV_SLOT_TICKET_SHIFT == g->ticket) {
				sched_yield();
				continue;	/* still held (or about to be taken) */
			}
		}
		for (k = 1; k <= h->max_nodes; k++) {
			volatile struct cxlkv_lock_slot *s;
			uint64_t req;

			n = (cur == CXLKV_GRANT_NONE ? k - 1 : cur + k) % h->max_nodes;
			s = (void *)(ctrl + cxlkv_lock_slot_off(h, LOCK_ID, n));
			req = load_fresh(&s->request);
			if ((req & CXLKV_SLOT_STATE_MASK) == CXLKV_SLOT_WAITING) {
				/* ticket before node: the holder checks both (rule 3) */
				nt_store64(&g->ticket, req >> CXLKV_SLOT_TICKET_SHIFT);
				/* node and the zero reserved0 beside it */
				nt_store64(&g->node, (uint64_t)n);
				nt_store64(&g->grants, g->grants + 1);
				clflush(g);
				mfence();
				cur = n;
				break;
			}
		}
		sched_yield();
	}
}

struct lock_handle {
	volatile struct cxlkv_lock_slot *slot;
	volatile struct cxlkv_lock_grant *grant;
	uint64_t ticket;
	uint32_t node;
};

static int lock_acquire(struct lock_handle *l)
{
	uint64_t end = now_ms() + 120 * 1000;

	l->ticket++;
	store_publish(&l->slot->request, (l->ticket << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_WAITING);
	for (;;) {
		/* rule 4: invalidate the grant line on every poll */
		clflush(l->grant);
		mfence();
		if (l->grant->node == l->node && l->grant->ticket == l->ticket)
			return 0;
		if (now_ms() > end)
			return -1;
		sched_yield();
	}
}

static void lock_release(struct lock_handle *l)
{
	store_publish(&l->slot->request, (l->ticket << CXLKV_SLOT_TICKET_SHIFT) | CXLKV_SLOT_IDLE);
}

/* Read-modify-write of the shared counter; only correct under the lock. */
static void bump(volatile uint64_t *counter)
{
	uint64_t v = load_fresh(counter);

	*counter = v + 1;
	clflush(counter);	/* rule 3 */
	mfence();
}

static int phase_barrier(volatile struct twohost_lines *t, int node, uint64_t phase)
{
	store_publish(&t->phase[node][0], phase);
	return wait_for(&t->phase[!node][0], phase, 180, "the other node's phase");
}

static int cmd_twohost(const char *dev, int node, long n, int use_lock)
{
	struct cxlkv_ioc_info info;
	struct cxlkv_carve c = carve_req("twohost", 2 * MiB, CXLKV_MEM_WB, 0), ctl;
	struct cxlkv_ioc_lock la = { .lock_id = LOCK_ID };
	struct cxlkv_ctrl_header h;
	volatile struct twohost_lines *t;
	volatile char *ctrl;
	struct lock_handle lk;
	uint64_t end = now_ms() + 120 * 1000, t0;
	pid_t granter = -1;
	int fd = open_dev(dev), bad = 0;
	long i;

	/* Node 1's pool is formatted by node 0's module; wait for it. */
	for (;;) {
		memset(&info, 0, sizeof(info));
		if (!ioc(fd, CXLKV_IOC_INFO, &info) && (info.flags & CXLKV_INFO_F_FORMATTED))
			break;
		if (now_ms() > end) {
			printf("FAIL twohost: pool never formatted\nRESULT FAIL\n");
			return 1;
		}
		usleep(100000);
	}
	check(info.node_id == (uint32_t)node, "twohost node id", "node %u", info.node_id);
	if (node == 0) {
		expect_ok(ioc(fd, CXLKV_IOC_CARVE_CREATE, &c), "twohost carve create");
	} else {
		while (ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &c)) {
			if (now_ms() > end) {
				printf("FAIL twohost: carve never created\nRESULT FAIL\n");
				return 1;
			}
			usleep(50000);
		}
	}
	t = map(fd, c.offset, c.size, PROT_READ | PROT_WRITE, MAP_SHARED);
	ctl = carve_req("control", 0, 0, 0);
	if (!t || ioc(fd, CXLKV_IOC_CARVE_LOOKUP, &ctl) ||
	    !(ctrl = map(fd, ctl.offset, ctl.size, PROT_READ | PROT_WRITE, MAP_SHARED))) {
		printf("FAIL twohost: mapping carves: %s\nRESULT FAIL\n", strerror(errno));
		return 1;
	}
	clflush(ctrl);
	mfence();
	memcpy(&h, (const void *)ctrl, sizeof(h));

	/* 1. data written on one host is read on the other, both ways */
	if (node == 0) {
		pattern((volatile uint64_t *)((volatile char *)t + PATTERN_OFF), 0, 1, &bad);
		store_publish(&t->hello[0], TWOHOST_MAGIC);
		if (wait_for(&t->seen[1][0], 1, 120, "node 1 to read node 0's data"))
			goto out;
		pattern((volatile uint64_t *)((volatile char *)t + 2 * PATTERN_OFF), 1, 0, &bad);
		check(!bad, "node 0 reads node 1's data", "%d words differ", bad);
		store_publish(&t->seen[0][0], 1);
	} else {
		if (wait_for(&t->hello[0], TWOHOST_MAGIC, 120, "node 0's data"))
			goto out;
		pattern((volatile uint64_t *)((volatile char *)t + PATTERN_OFF), 0, 0, &bad);
		check(!bad, "node 1 reads node 0's data", "%d words differ", bad);
		pattern((volatile uint64_t *)((volatile char *)t + 2 * PATTERN_OFF), 1, 1, &bad);
		store_publish(&t->seen[1][0], 1);
		if (wait_for(&t->seen[0][0], 1, 120, "node 0 to read node 1's data"))
			goto out;
	}

	/* 2. mutual exclusion across hosts through the global lock slots */
	expect_ok(ioc(fd, CXLKV_IOC_LOCK_ALLOC, &la), "twohost lock slot alloc");
	lk.slot = (void *)((volatile char *)ctrl + (la.slot_off - ctl.offset));
	lk.grant = (void *)((volatile char *)ctrl + (la.grant_off - ctl.offset));
	lk.node = node;
	lk.ticket = load_fresh(&lk.slot->request) >> CXLKV_SLOT_TICKET_SHIFT;
	if (node == 0) {
		store_publish(&t->counter[0], 0);
		granter = fork();
		if (granter == 0) {
			grant_loop(ctrl, &h, t);
			_exit(0);
		}
	}
	if (phase_barrier(t, node, 1))
		goto out;
	t0 = now_ms();
	for (i = 0; i < n; i++) {
		/* use_lock == 0 shows that the check below catches lost updates */
		if (use_lock && lock_acquire(&lk)) {
			check(0, "twohost lock acquire", "timed out at increment %ld", i);
			goto out;
		}
		bump(&t->counter[0]);
		if (use_lock)
			lock_release(&lk);
	}
	printf("twohost: node %d did %ld increments (%s) in %llu ms\n", node, n,
	       use_lock ? "under the cross-host lock" : "WITHOUT the lock",
	       (unsigned long long)(now_ms() - t0));
	if (phase_barrier(t, node, 2))
		goto out;
	{
		uint64_t v = load_fresh(&t->counter[0]);

		check(v == 2 * (uint64_t)n, "counter under cross-host lock is exactly 2N",
		      "counter %llu, want %llu", (unsigned long long)v, 2ULL * n);
	}
	if (phase_barrier(t, node, 3))
		goto out;
out:
	if (node == 0) {
		store_publish(&t->stop[0], 1);
		if (granter > 0)
			waitpid(granter, NULL, 0);
	}
	close(fd);
	printf("RESULT %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "abi"))
		return cmd_abi(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "fuzz"))
		return cmd_fuzz(argv[2], atol(argv[3]), strtoull(argv[4], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "unpriv"))
		return cmd_unpriv(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "fuzz-unpriv"))
		return cmd_fuzz_unpriv(argv[2], atol(argv[3]));
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "twohost"))
		return cmd_twohost(argv[2], atoi(argv[3]), atol(argv[4]),
				   !(argc == 6 && !strcmp(argv[5], "nolock")));
	fprintf(stderr, "usage: cxlkv_vmtest abi DEV phys|ivshmem|emulated\n"
			"       cxlkv_vmtest fuzz DEV ITERATIONS SEED\n"
			"       cxlkv_vmtest unpriv DEV\n"
			"       cxlkv_vmtest fuzz-unpriv DEV ITERATIONS\n"
			"       cxlkv_vmtest twohost DEV NODE N [nolock]\n");
	return 2;
}
