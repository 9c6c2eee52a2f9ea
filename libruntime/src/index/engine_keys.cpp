// SPDX-License-Identifier: MIT
// Keys of engine block hashes (cxlkv/keys.hpp engine_key): BLAKE2b-128 with
// the personalisation "cxlkv-ekey-v1", written here from RFC 7693 so that the
// C library makes the same keys as Python's hashlib.blake2b (keys.py), which
// defined them first.  One compression per 128 bytes of namespace + hash;
// the namespace prefix is compressed once per call, not once per key.
#include "cxlkv/keys.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

namespace cxlkv {
namespace {

constexpr std::array<uint64_t, 8> kIv = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                                         0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                         0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

constexpr uint8_t kSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

inline uint64_t load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

// The streaming state of one BLAKE2b hash (no key; 16-byte digest).
struct Blake2b {
  uint64_t h[8];
  uint64_t t = 0;  // bytes compressed so far (inputs here stay far below 2^64)
  uint8_t buf[128];
  size_t n = 0;  // bytes in buf

  explicit Blake2b(const uint8_t personal[16]) {
    for (int i = 0; i < 8; i++) h[i] = kIv[i];
    h[0] ^= 0x01010000ULL ^ 16;  // fanout 1, depth 1, no key, digest length 16
    h[6] ^= load64(personal);     // parameter block bytes 48..63: the personalisation
    h[7] ^= load64(personal + 8);
  }

  void compress(const uint8_t* block, bool last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) v[i] = h[i], v[i + 8] = kIv[i];
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    auto g = [&](int a, int b, int c, int d, uint64_t x, uint64_t y) {
      v[a] = v[a] + v[b] + x;
      v[d] = rotr(v[d] ^ v[a], 32);
      v[c] = v[c] + v[d];
      v[b] = rotr(v[b] ^ v[c], 24);
      v[a] = v[a] + v[b] + y;
      v[d] = rotr(v[d] ^ v[a], 16);
      v[c] = v[c] + v[d];
      v[b] = rotr(v[b] ^ v[c], 63);
    };
    for (const auto& s : kSigma) {
      g(0, 4, 8, 12, m[s[0]], m[s[1]]);
      g(1, 5, 9, 13, m[s[2]], m[s[3]]);
      g(2, 6, 10, 14, m[s[4]], m[s[5]]);
      g(3, 7, 11, 15, m[s[6]], m[s[7]]);
      g(0, 5, 10, 15, m[s[8]], m[s[9]]);
      g(1, 6, 11, 12, m[s[10]], m[s[11]]);
      g(2, 7, 8, 13, m[s[12]], m[s[13]]);
      g(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
  }

  void update(const uint8_t* p, size_t len) {
    while (len) {
      // The last block is compressed at final() (with its flag), so a full
      // buffer is compressed only when more bytes follow.
      if (n == sizeof buf) {
        t += sizeof buf;
        compress(buf, false);
        n = 0;
      }
      const size_t take = std::min(len, sizeof buf - n);
      std::memcpy(buf + n, p, take);
      n += take, p += take, len -= take;
    }
  }

  BlockKey final() {
    t += n;
    std::memset(buf + n, 0, sizeof buf - n);
    compress(buf, true);
    return BlockKey{h[0], h[1]};  // digest bytes 0..7 and 8..15, little-endian
  }
};

}  // namespace

Result<std::vector<BlockKey>> engine_keys(std::span<const std::byte> ns, std::span<const std::byte> items,
                                          std::span<const uint32_t> item_lens) {
  uint64_t total = 0;
  for (uint32_t l : item_lens) total += l;
  if (total != items.size())
    return Error(-EINVAL, "engine_keys: item lengths add up to " + std::to_string(total) + " bytes, " +
                              std::to_string(items.size()) + " given");
  if (ns.size() > UINT32_MAX) return Error(-EINVAL, "engine_keys: namespace longer than 4 GiB");
  static constexpr uint8_t kPersonal[16] = {'c', 'x', 'l', 'k', 'v', '-', 'e', 'k', 'e', 'y', '-', 'v', '1', 0, 0, 0};
  Blake2b prefix(kPersonal);
  const uint32_t nl = static_cast<uint32_t>(ns.size());
  const uint8_t len_le[4] = {uint8_t(nl), uint8_t(nl >> 8), uint8_t(nl >> 16), uint8_t(nl >> 24)};
  prefix.update(len_le, 4);
  prefix.update(reinterpret_cast<const uint8_t*>(ns.data()), ns.size());
  std::vector<BlockKey> out(item_lens.size());
  const auto* p = reinterpret_cast<const uint8_t*>(items.data());
  for (size_t i = 0; i < item_lens.size(); i++) {
    Blake2b b = prefix;  // the namespace prefix, hashed once per call
    b.update(p, item_lens[i]);
    p += item_lens[i];
    out[i] = b.final();
    if (out[i].is_zero()) out[i].lo = 1;  // the zero key is reserved (as keys.py does)
  }
  return out;
}

}  // namespace cxlkv
