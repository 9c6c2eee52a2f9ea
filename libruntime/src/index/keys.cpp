// SPDX-License-Identifier: MIT
// Chained block keys (see cxlkv/keys.hpp for the definition and the seed).
#include "cxlkv/keys.hpp"

#include <xxhash.h>

#include <cstring>

namespace cxlkv {
namespace {

void put_le64(std::vector<std::byte>& b, uint64_t v) {
  for (int i = 0; i < 8; i++) b.push_back(static_cast<std::byte>(v >> (8 * i)));
}

BlockKey hash_bytes(const std::vector<std::byte>& buf) {
  XXH128_hash_t h = XXH3_128bits_withSeed(buf.data(), buf.size(), kKeySeed);
  return BlockKey{h.low64, h.high64};
}

}  // namespace

std::string to_hex(const BlockKey& k) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                static_cast<unsigned long long>(k.lo));
  return buf;
}

bool parse_key(const std::string& hex, BlockKey* out) {
  if (hex.size() != 32) return false;
  uint64_t part[2] = {0, 0};
  for (size_t i = 0; i < 32; i++) {
    char c = hex[i];
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return false;
    part[i / 16] = (part[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  *out = BlockKey{part[1], part[0]};
  return true;
}

BlockKey chain_key(const BlockKey& parent, std::span<const uint32_t> tokens,
                   std::span<const std::byte> extras) {
  std::vector<std::byte> buf;
  buf.reserve(16 + tokens.size() * 4 + extras.size());
  put_le64(buf, parent.lo);
  put_le64(buf, parent.hi);
  for (uint32_t t : tokens)
    for (int i = 0; i < 4; i++) buf.push_back(static_cast<std::byte>(t >> (8 * i)));
  buf.insert(buf.end(), extras.begin(), extras.end());
  BlockKey k = hash_bytes(buf);
  if (k.is_zero()) k.lo = 1;  // the zero key is reserved (empty index line); 2^-128 event
  return k;
}

std::vector<BlockKey> block_keys(std::span<const uint32_t> tokens, size_t block_tokens,
                                 std::span<const std::byte> extras, bool include_partial) {
  std::vector<BlockKey> out;
  if (block_tokens == 0) return out;
  BlockKey parent{};
  for (size_t pos = 0; pos < tokens.size(); pos += block_tokens) {
    size_t n = std::min(block_tokens, tokens.size() - pos);
    if (n < block_tokens && !include_partial) break;
    parent = chain_key(parent, tokens.subspan(pos, n), extras);
    out.push_back(parent);
  }
  return out;
}

std::vector<BlockKey> keys_from_ids(std::span<const uint64_t> ids, std::span<const std::byte> extras) {
  std::vector<BlockKey> out;
  out.reserve(ids.size());
  BlockKey parent{};
  for (uint64_t id : ids) {
    std::vector<std::byte> buf;
    buf.reserve(24 + extras.size());
    put_le64(buf, parent.lo);
    put_le64(buf, parent.hi);
    put_le64(buf, id);
    buf.insert(buf.end(), extras.begin(), extras.end());
    parent = hash_bytes(buf);
    if (parent.is_zero()) parent.lo = 1;
    out.push_back(parent);
  }
  return out;
}

}  // namespace cxlkv
