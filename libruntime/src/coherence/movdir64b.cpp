// SPDX-License-Identifier: MIT
// Single-line publish with movdir64b: the 64 bytes reach memory as one
// direct store (no partial line is ever visible), which is what rule 3 wants
// for a metadata line.  Only called when CPUID reports movdir64b.
#include <immintrin.h>

#include "coherence/cpu_paths.hpp"

namespace cxlkv::coherence {

__attribute__((target("movdir64b"))) void publish_movdir64b(void* dst64, const void* src64) {
  _movdir64b(dst64, src64);
}

}  // namespace cxlkv::coherence
