/* SPDX-License-Identifier: MIT */
/* cxlkv/version.h: the version of cxlkv, defined once.
 *
 * CMakeLists.txt reads CXLKV_VERSION_MAJOR/MINOR/PATCH from this file for
 * project(cxlkv VERSION ...), so PROJECT_VERSION, the SONAME's full version,
 * cxlkv.pc, the CMake package and every tool's --version come from here;
 * tests/install checks that dkms.conf, pyproject.toml and debian/changelog
 * name the same version.  C and C++. */
#ifndef CXLKV_VERSION_H
#define CXLKV_VERSION_H

#define CXLKV_VERSION_MAJOR 0
#define CXLKV_VERSION_MINOR 1
#define CXLKV_VERSION_PATCH 0

#define CXLKV_VERSION_STR_(x) #x
#define CXLKV_VERSION_STR(x) CXLKV_VERSION_STR_(x)
/* "MAJOR.MINOR.PATCH" */
#define CXLKV_VERSION                                                               \
	CXLKV_VERSION_STR(CXLKV_VERSION_MAJOR) "." CXLKV_VERSION_STR(CXLKV_VERSION_MINOR) "." \
	CXLKV_VERSION_STR(CXLKV_VERSION_PATCH)
/* One number for #if comparisons: 0.1.0 -> 100, 1.2.3 -> 10203. */
#define CXLKV_VERSION_NUMBER (CXLKV_VERSION_MAJOR * 10000 + CXLKV_VERSION_MINOR * 100 + CXLKV_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the libcxlkv that is loaded (CXLKV_VERSION is the one the
 * caller was compiled against).  Never NULL. */
const char *cxlkv_version(void);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_VERSION_H */
