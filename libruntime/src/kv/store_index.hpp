// SPDX-License-Identifier: MIT
// The PrefixIndex under a KvStore, for the code that works on the index
// itself: the library's own layers above kv/, its tests, and the tools of
// the tools-internal set (docs/architecture.md "The include rule").
// The public cxlkv/kv.hpp hands out no PrefixIndex: the type is private to
// the library, so only code that includes this internal header reaches it.
#pragma once

#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"

namespace cxlkv {

// KvStore's one friend: kv.hpp declares it, only this header defines it.
class KvStoreInternals {
 public:
  static PrefixIndex& index(KvStore& s) { return *s.index_; }
};

// The store's own PrefixIndex: the lock-based path's index, there in
// service mode too (lock-free reads, the index service's server side,
// counters, checks).
inline PrefixIndex& store_index(KvStore& s) { return KvStoreInternals::index(s); }

}  // namespace cxlkv
