// SPDX-License-Identifier: MIT
// Block keys: the 128-bit names of KV blocks in the prefix index.
//
// A prompt is cut into blocks of B tokens; block i's key is chained to the
// key of block i-1, so a key names the whole prefix that ends with block i:
//
//     key_0 = XXH3_128bits_withSeed(zero16 || tokens_0 || extras, kKeySeed)
//     key_i = XXH3_128bits_withSeed(key_{i-1} || tokens_i || extras, kKeySeed)
//
// key bytes are (lo, hi) as two little-endian u64, tokens are little-endian
// u32, extras (model id, LoRA id, salt, ...) are caller bytes appended to every
// block.  The seed is fixed (kKeySeed below) and part of the on-pool format:
// every host, process and restart computes the same keys.  Changing it, or the
// byte order above, invalidates every cached block.
//
// Callers may bring their own keys instead (an engine's block hashes, a trace's
// hash ids): keys_from_ids() chains 64-bit ids the same way so the ids of one
// trace map to keys deterministically, and any caller-made key is accepted as
// long as it is not the reserved all-zero key.
//
// Collision budget.  Keys are 128 bits; with n distinct blocks in the index
// the chance that any two collide is about n^2 / 2^129 (birthday bound):
//     n = 2^20 (1 Mi blocks)  ->  2^-89
//     n = 2^32                ->  2^-65
//     n = 2^40                ->  2^-49
// A collision would serve one block's bytes for another prefix; the index
// does not store tokens to detect it, so the budget above is the guarantee.
// XXH3-128 is not cryptographic: a caller that lets untrusted users choose
// tokens to provoke collisions must put a secret salt into `extras`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cxlkv/result.hpp"

namespace cxlkv {

// Fixed seed of block-key hashing ("cxlkvkey" read as little-endian u64).
inline constexpr uint64_t kKeySeed = 0x79656b766b6c7863ULL;

struct BlockKey {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool is_zero() const { return lo == 0 && hi == 0; }
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

// "0123...ef" (32 hex digits, hi then lo) and back; parse returns false on bad text.
std::string to_hex(const BlockKey& k);
bool parse_key(const std::string& hex, BlockKey* out);

// One chaining step: the key of the block after `parent` holding `tokens`.
// The root block uses parent = BlockKey{} (all zero).
BlockKey chain_key(const BlockKey& parent, std::span<const uint32_t> tokens,
                   std::span<const std::byte> extras = {});

// Keys of every block of `tokens` cut into blocks of `block_tokens` tokens.
// A trailing partial block gets a key too when `include_partial` is true.
std::vector<BlockKey> block_keys(std::span<const uint32_t> tokens, size_t block_tokens,
                                 std::span<const std::byte> extras = {},
                                 bool include_partial = false);

// Keys for a chain of caller ids (e.g. Mooncake hash_ids): each id is hashed
// as 8 little-endian bytes in place of the block's tokens, chained as above.
std::vector<BlockKey> keys_from_ids(std::span<const uint64_t> ids,
                                    std::span<const std::byte> extras = {});

// Keys of an engine's own block hashes (vLLM's request.block_hashes, SGLang's
// page hashes), the definition of libruntime/python/cxlkv/keys.py:
//
//     key = BLAKE2b(digest 16 bytes, personal "cxlkv-ekey-v1",
//                   u32le(len(ns)) || ns || item)
//
// digest bytes 0..7 = lo, 8..15 = hi (little-endian); the all-zero key
// becomes lo = 1.  `items` holds the encoded hashes one after the other
// (item i is item_lens[i] bytes: a tag byte, then the hash; keys.py
// _encode_hash), so every engine hash maps on its own.  -EINVAL when the
// lengths do not add up to items.size().
Result<std::vector<BlockKey>> engine_keys(std::span<const std::byte> ns, std::span<const std::byte> items,
                                          std::span<const uint32_t> item_lens);

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL)); }
};

}  // namespace cxlkv
