/* SPDX-License-Identifier: MIT */
/*
 * Checks for the C test programs (tests/unit/NAME_test.c): a failed check is
 * printed with the library's last error and counted in `failures`; main()
 * returns non-zero when it is not 0.
 */
#ifndef CXLKV_TESTS_C_CHECK_H
#define CXLKV_TESTS_C_CHECK_H

#include <stdio.h>

#include "cxlkv/cxlkv.h"

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", \
				__FILE__, __LINE__, #cond, cxlkv_last_error());  \
			failures++;                                              \
		}                                                                \
	} while (0)

/* A call failed with a negative errno and said why. */
#define CHECK_ERR(expr, err)                                                     \
	do {                                                                     \
		int rc_ = (expr);                                                \
		if (rc_ != (err) || cxlkv_last_error()[0] == '\0') {             \
			fprintf(stderr, "%s:%d: %s = %d, expected %d with a message (\"%s\")\n", \
				__FILE__, __LINE__, #expr, rc_, (err), cxlkv_last_error()); \
			failures++;                                              \
		}                                                                \
	} while (0)

#endif /* CXLKV_TESTS_C_CHECK_H */
