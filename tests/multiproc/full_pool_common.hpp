// SPDX-License-Identifier: MIT
// What kv_full_pool_test and its helper (kv_full_pool_helper) agree on: the
// chains the writers put, the bytes of each block (a function of its key, so
// any reader can check every byte), and the consumer the writers lease their
// acknowledged blocks to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "cxlkv/keys.hpp"

namespace cxlkv::fullpool {

constexpr uint64_t kConsumer = 0x5eedf00dull;  // base of the request ids the acknowledged blocks are leased to
constexpr uint32_t kConsumerNode = 1;          // the test's node
// An acknowledged block stays until consumed (within milliseconds); a
// writer killed between its lease and its acknowledgement leaves a lease
// no one releases, which protects the block this long.
constexpr uint32_t kLeaseMs = 10000;
constexpr size_t kMaxChain = 8;

// Chain `family` of `len` blocks: families share their prefixes, so
// writers reserve below each other's blocks.
inline std::vector<BlockKey> family_chain(uint64_t family, size_t len) {
  std::vector<uint64_t> ids(len);
  for (size_t i = 0; i < len; i++) ids[i] = family * 64 + i + 1;
  return keys_from_ids(ids);
}

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The bytes of block `k`: 8-byte words derived from the key and their offset.
inline void fill(const BlockKey& k, std::byte* p, size_t n) {
  for (size_t o = 0; o < n; o += 8) {
    const uint64_t w = mix(k.lo ^ mix(k.hi + o));
    std::memcpy(p + o, &w, std::min<size_t>(8, n - o));
  }
}

inline bool verify(const BlockKey& k, const std::byte* p, size_t n) {
  for (size_t o = 0; o < n; o += 8) {
    const uint64_t w = mix(k.lo ^ mix(k.hi + o));
    if (std::memcmp(p + o, &w, std::min<size_t>(8, n - o)) != 0) return false;
  }
  return true;
}

}  // namespace cxlkv::fullpool
