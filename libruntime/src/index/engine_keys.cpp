// SPDX-License-Identifier: MIT
// Keys of engine block hashes (cxlkv/keys.hpp engine_key): BLAKE2b-128 with
// the personalisation "cxlkv-ekey-v1", the same keys as Python's
// hashlib.blake2b (keys.py), which defined them first.  BLAKE2b comes from
// libb2 (Debian's libb2-dev, the BLAKE2 authors' library); the namespace
// prefix is hashed once per call and its state copied for each key.
#include "cxlkv/keys.hpp"

#include <blake2.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

namespace cxlkv {
namespace {

// The state after BLAKE2b-128 with our personalisation has absorbed the
// namespace prefix (u32le length, then the bytes).
blake2b_state prefix_state(std::span<const std::byte> ns) {
  blake2b_param P;
  std::memset(&P, 0, sizeof P);
  P.digest_length = 16;
  P.fanout = 1;
  P.depth = 1;
  static constexpr char kPersonal[] = "cxlkv-ekey-v1";  // zero-padded to 16 bytes
  std::memcpy(P.personal, kPersonal, sizeof kPersonal - 1);
  blake2b_state S;
  blake2b_init_param(&S, &P);
  const uint32_t nl = static_cast<uint32_t>(ns.size());
  const uint8_t len_le[4] = {uint8_t(nl), uint8_t(nl >> 8), uint8_t(nl >> 16), uint8_t(nl >> 24)};
  blake2b_update(&S, len_le, 4);
  blake2b_update(&S, reinterpret_cast<const uint8_t*>(ns.data()), ns.size());
  return S;
}

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

}  // namespace

Result<std::vector<BlockKey>> engine_keys(std::span<const std::byte> ns, std::span<const std::byte> items,
                                          std::span<const uint32_t> item_lens) {
  uint64_t total = 0;
  for (uint32_t l : item_lens) total += l;
  if (total != items.size())
    return Error(-EINVAL, "engine_keys: item lengths add up to " + std::to_string(total) + " bytes, " +
                              std::to_string(items.size()) + " given");
  if (ns.size() > UINT32_MAX) return Error(-EINVAL, "engine_keys: namespace longer than 4 GiB");
  const blake2b_state prefix = prefix_state(ns);
  std::vector<BlockKey> out(item_lens.size());
  const auto* p = reinterpret_cast<const uint8_t*>(items.data());
  for (size_t i = 0; i < item_lens.size(); i++) {
    blake2b_state S = prefix;  // the namespace prefix, hashed once per call
    blake2b_update(&S, p, item_lens[i]);
    p += item_lens[i];
    uint8_t d[16];
    blake2b_final(&S, d, sizeof d);
    out[i] = BlockKey{le64(d), le64(d + 8)};  // digest bytes 0..7 and 8..15, little-endian
    if (out[i].is_zero()) out[i].lo = 1;  // the zero key is reserved (as keys.py does)
  }
  return out;
}

}  // namespace cxlkv
