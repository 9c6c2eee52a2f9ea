// SPDX-License-Identifier: MIT
/* cxlkv_vmtest, "fuzz": random commands and argument buffers (the program: cxlkv_vmtest.c). */
#include "vmtest.h"

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

int cmd_fuzz(const char *dev, long iters, uint64_t seed)
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
