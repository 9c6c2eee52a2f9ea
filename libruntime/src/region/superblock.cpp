// SPDX-License-Identifier: MIT
// Superblock validation: every field of a superblock image is checked before
// a pool is used, and every refusal names the pool and the exact problem.
// The checks run in an order that gives the most useful message first:
// unformatted, bad magic, unknown version and size before the checksum (a
// newer layout may checksum differently), then the fields the checksum
// vouches for.
#include "region/superblock.hpp"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "cxlkv/region.hpp"

namespace cxlkv {

namespace region {

bool valid_carve_name(std::string_view name) {
  if (name.empty() || name.size() >= CXLKV_CARVE_NAME_MAX) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string carve_name_rule() {
  return "1.." + std::to_string(CXLKV_CARVE_NAME_MAX - 1) + " characters of [a-z0-9_.-]";
}

void seal_superblock(cxlkv_superblock& sb) {
  sb.checksum = 0;
  sb.checksum = cxlkv_sb_checksum(&sb);
}

std::string human_size(uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    u++;
  }
  return std::to_string(b) + " " + units[u];
}

}  // namespace region

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

bool all_zero(const void* p, size_t n) {
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

// Printable form of a possibly damaged carve name.
std::string shown_name(const char (&name)[CXLKV_CARVE_NAME_MAX]) {
  std::string s;
  for (size_t i = 0; i < CXLKV_CARVE_NAME_MAX && name[i]; i++) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      s += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    }
  }
  return s;
}

}  // namespace

Result<void> validate_superblock(std::string_view pool, const void* image, size_t avail,
                                 uint64_t pool_size) {
  const std::string P = "pool " + std::string(pool) + ": ";
  auto corrupt = [&](const std::string& what) { return Error(-EUCLEAN, P + what); };

  if (avail < sizeof(cxlkv_superblock)) {
    if (avail == 0 || all_zero(image, avail))
      return Error(-ENODATA, P + "unformatted and truncated: only " + std::to_string(avail) +
                                 " bytes, a superblock needs " + std::to_string(CXLKV_SB_SIZE));
    return corrupt("truncated: only " + std::to_string(avail) + " bytes, the superblock needs " +
                   std::to_string(CXLKV_SB_SIZE));
  }
  cxlkv_superblock sb;
  std::memcpy(&sb, image, sizeof sb);

  if (sb.magic != CXLKV_SB_MAGIC) {
    if (all_zero(&sb, sizeof sb))
      return Error(-ENODATA, P + "unformatted (the superblock area is all zero); "
                                 "format it with `cxlkvctl --pool " + std::string(pool) + " format`");
    return corrupt("bad magic " + hex(sb.magic) + " (expected " + hex(CXLKV_SB_MAGIC) +
                   "): not a cxlkv pool, or its superblock is damaged");
  }
  if (sb.layout_version != CXLKV_LAYOUT_VERSION)
    return Error(-EPROTONOSUPPORT, P + "unknown layout version " + std::to_string(sb.layout_version) +
                                       " (this build understands " +
                                       std::to_string(CXLKV_LAYOUT_VERSION) + ")");
  if (sb.sb_size != CXLKV_SB_SIZE)
    return corrupt("superblock size " + std::to_string(sb.sb_size) + " is wrong (expected " +
                   std::to_string(CXLKV_SB_SIZE) + ")");
  uint64_t computed = cxlkv_sb_checksum(&sb);
  if (computed != sb.checksum)
    return corrupt("superblock checksum mismatch (stored " + hex(sb.checksum) + ", computed " +
                   hex(computed) + ")");

  // From here on the checksum vouches for the bytes: a failure means a
  // writer produced a bad superblock, not that the media flipped bits.
  if (sb.pool_size != pool_size)
    return corrupt("superblock pool_size " + std::to_string(sb.pool_size) +
                   " does not match the mapping's " + std::to_string(pool_size) +
                   " bytes (truncated or resized device?)");
  if (sb.pool_size % CXLKV_CARVE_ALIGN != 0 || sb.pool_size < CXLKV_MIN_POOL_SIZE)
    return corrupt("pool_size " + std::to_string(sb.pool_size) + " is not a multiple of 2 MiB of at least " +
                   region::human_size(CXLKV_MIN_POOL_SIZE));
  if (sb.max_nodes < 1 || sb.max_nodes > CXLKV_MAX_NODES)
    return corrupt("max_nodes " + std::to_string(sb.max_nodes) + " out of range 1.." +
                   std::to_string(CXLKV_MAX_NODES));
  if (sb.ncarves > CXLKV_MAX_CARVES)
    return corrupt("ncarves " + std::to_string(sb.ncarves) + " exceeds the table's " +
                   std::to_string(CXLKV_MAX_CARVES) + " entries");
  if (!all_zero(sb.reserved0, sizeof sb.reserved0) || !all_zero(sb.reserved1, sizeof sb.reserved1))
    return corrupt("reserved superblock bytes are not zero");

  uint64_t prev_end = CXLKV_FIRST_CARVE_OFF;
  std::string prev_name;
  for (uint32_t i = 0; i < sb.ncarves; i++) {
    const cxlkv_carve& c = sb.carves[i];
    const std::string C = "carve " + std::to_string(i) + " '" + shown_name(c.name) + "': ";
    size_t len = strnlen(c.name, CXLKV_CARVE_NAME_MAX);
    if (len == CXLKV_CARVE_NAME_MAX)
      return corrupt(C + "name is not NUL-terminated");
    if (!region::valid_carve_name(std::string_view(c.name, len)))
      return corrupt(C + "invalid name (names are " + region::carve_name_rule() + ")");
    if (!all_zero(c.name + len, CXLKV_CARVE_NAME_MAX - len))
      return corrupt(C + "bytes after the name's NUL are not zero");
    if (c.offset % CXLKV_CARVE_ALIGN != 0 || c.size % CXLKV_CARVE_ALIGN != 0)
      return corrupt(C + "offset " + hex(c.offset) + " / size " + hex(c.size) +
                     " not aligned to 2 MiB");
    if (c.size == 0) return corrupt(C + "size is zero");
    if (c.offset < CXLKV_FIRST_CARVE_OFF)
      return corrupt(C + "offset " + hex(c.offset) + " overlaps the superblock area [0, " +
                     hex(CXLKV_FIRST_CARVE_OFF) + ")");
    if (c.offset > sb.pool_size || c.size > sb.pool_size - c.offset)
      return corrupt(C + "range [" + hex(c.offset) + ", +" + hex(c.size) + ") lies outside the pool (" +
                     std::to_string(sb.pool_size) + " bytes)");
    if (c.memtype > CXLKV_MEM_MAX) return corrupt(C + "unknown memory type " + std::to_string(c.memtype));
    if (c.flags & ~CXLKV_CARVE_F_ALL) return corrupt(C + "unknown flags " + hex(c.flags));
    if (c.reserved != 0) return corrupt(C + "reserved field is not zero");
    if (i > 0) {
      const cxlkv_carve& p = sb.carves[i - 1];
      if (c.offset < p.offset)
        return corrupt(C + "carve table not sorted by offset (" + hex(c.offset) + " after " +
                       hex(p.offset) + ")");
      if (c.offset < prev_end)
        return corrupt(C + "overlaps carve '" + prev_name + "' (starts " + hex(c.offset) +
                       ", previous ends " + hex(prev_end) + ")");
    }
    for (uint32_t j = 0; j < i; j++)
      if (std::strncmp(sb.carves[j].name, c.name, CXLKV_CARVE_NAME_MAX) == 0)
        return corrupt(C + "duplicate carve name (also carve " + std::to_string(j) + ")");
    prev_end = c.offset + c.size;
    prev_name = std::string(c.name, len);
  }
  for (uint32_t i = sb.ncarves; i < CXLKV_MAX_CARVES; i++)
    if (!all_zero(&sb.carves[i], sizeof sb.carves[i]))
      return corrupt("unused carve table entry " + std::to_string(i) + " is not zero (ncarves " +
                     std::to_string(sb.ncarves) + ")");
  return {};
}

}  // namespace cxlkv
