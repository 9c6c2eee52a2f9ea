// SPDX-License-Identifier: MIT
/* cxlkv_vmtest, checks, ioctl and request helpers, the device and its mappings (the program: cxlkv_vmtest.c). */
#include "vmtest.h"

int failures;

void check(int cond, const char *name, const char *fmt, ...)
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
int ioc(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

void expect_err(int got, int want, const char *name)
{
	check(got == -want, name, "got %d (%s), want -%s", got, got ? strerror(-got) : "success",
	      strerror(want));
}

void expect_ok(int got, const char *name)
{
	check(got == 0, name, "got %d (%s)", got, strerror(-got));
}

/* ---- coherence helpers (the contract of docs/coherence.md) ------------------------ */




/* rule 4: invalidate, fence, then load */
uint64_t load_fresh(volatile void *p)
{
	clflush(p);
	mfence();
	return *(volatile uint64_t *)p;
}

/* rule 3: store, flush, fence */
void store_publish(volatile void *p, uint64_t v)
{
	nt_store64(p, v);
	clflush(p);
	mfence();
}

int open_dev(const char *dev)
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

struct cxlkv_carve carve_req(const char *name, uint64_t size, uint32_t mt, uint32_t flags)
{
	struct cxlkv_carve c;

	memset(&c, 0, sizeof(c));
	strncpy(c.name, name, sizeof(c.name) - 1);
	c.size = size;
	c.memtype = mt;
	c.flags = flags;
	return c;
}

struct cxlkv_ioc_memtype mt_req(const char *name, uint32_t mt)
{
	struct cxlkv_ioc_memtype m;

	memset(&m, 0, sizeof(m));
	strncpy(m.name, name, sizeof(m.name) - 1);
	m.memtype = mt;
	return m;
}

struct cxlkv_ioc_carve_remove rm_req(const char *name, uint32_t flags)
{
	struct cxlkv_ioc_carve_remove r;

	memset(&r, 0, sizeof(r));
	strncpy(r.name, name, sizeof(r.name) - 1);
	r.flags = flags;
	return r;
}

void *map(int fd, uint64_t off, uint64_t len, int prot, int flags)
{
	void *p = mmap(NULL, len, prot, flags, fd, (off_t)off);

	return p == MAP_FAILED ? NULL : p;
}
