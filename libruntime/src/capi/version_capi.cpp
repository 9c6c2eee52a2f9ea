// SPDX-License-Identifier: MIT
// cxlkv_version(): the version of the loaded library (cxlkv/version.h).
#include "cxlkv/version.h"

extern "C" const char* cxlkv_version(void) { return CXLKV_VERSION; }
