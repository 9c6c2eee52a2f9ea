// SPDX-License-Identifier: MIT
/* cxlkv_vmtest, "twohost": one side of the two-guest test (the program: cxlkv_vmtest.c). */
#include "vmtest.h"

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

int cmd_twohost(const char *dev, int node, long n, int use_lock)
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
