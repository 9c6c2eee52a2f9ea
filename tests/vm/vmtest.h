// SPDX-License-Identifier: MIT
/*
 * cxlkv_vmtest: what its parts share (the program is described in
 * cxlkv_vmtest.c).  Checks print "ok <check>" or "FAIL <check>: why" and
 * count the failures; the coherence helpers follow docs/coherence.md.
 */
#ifndef CXLKV_VMTEST_H
#define CXLKV_VMTEST_H

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

extern int failures;

void check(int cond, const char *name, const char *fmt, ...);
int ioc(int fd, unsigned long cmd, void *arg);
void expect_err(int got, int want, const char *name);
void expect_ok(int got, const char *name);
uint64_t load_fresh(volatile void *p);
void store_publish(volatile void *p, uint64_t v);
int open_dev(const char *dev);
struct cxlkv_carve carve_req(const char *name, uint64_t size, uint32_t mt, uint32_t flags);
struct cxlkv_ioc_memtype mt_req(const char *name, uint32_t mt);
struct cxlkv_ioc_carve_remove rm_req(const char *name, uint32_t flags);
void *map(int fd, uint64_t off, uint64_t len, int prot, int flags);

/* The commands of main(), one file each. */
int cmd_abi(const char *dev, const char *kind);
int cmd_fuzz(const char *dev, long iters, uint64_t seed);
int cmd_unpriv(const char *dev);
int cmd_fuzz_unpriv(const char *dev, long iters);
int cmd_twohost(const char *dev, int node, long n, int use_lock);

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

#endif /* CXLKV_VMTEST_H */
