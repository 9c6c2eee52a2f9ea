// SPDX-License-Identifier: MIT
/* cxlkv_vmtest, "unpriv" and "fuzz-unpriv": the permission model as uid 65534 (the program: cxlkv_vmtest.c). */
#include "vmtest.h"

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
int cmd_unpriv(const char *dev)
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
int cmd_fuzz_unpriv(const char *dev, long iters)
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
