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
 *
 * One program, one file per concern: vmtest_abi.c, vmtest_fuzz.c,
 * vmtest_unpriv.c, vmtest_twohost.c; what they share (checks, requests,
 * mappings, coherence helpers) is vmtest.h and vmtest_common.c.
 */
#include "vmtest.h"

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
