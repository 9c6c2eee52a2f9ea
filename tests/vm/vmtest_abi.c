// SPDX-License-Identifier: MIT
/* cxlkv_vmtest, "abi": every ioctl, its error cases, mmap rules, lock slots, DDIO (the program: cxlkv_vmtest.c). */
#include "vmtest.h"

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

int cmd_abi(const char *dev, const char *kind)
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
