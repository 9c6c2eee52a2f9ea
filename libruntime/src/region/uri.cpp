// SPDX-License-Identifier: MIT
// Pool URI parsing and backend dispatch.
#include <cerrno>
#include <cstdlib>

#include "region/backend.hpp"

namespace cxlkv::region {

bool parse_size(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 32) return false;
  size_t i = 0;
  uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; i++) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (i == 0) return false;
  std::string_view suf = text.substr(i);
  unsigned shift;
  if (suf.empty() || suf == "B") shift = 0;
  else if (suf == "K" || suf == "k" || suf == "KiB") shift = 10;
  else if (suf == "M" || suf == "m" || suf == "MiB") shift = 20;
  else if (suf == "G" || suf == "g" || suf == "GiB") shift = 30;
  else if (suf == "T" || suf == "t" || suf == "TiB") shift = 40;
  else return false;
  if (shift && v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

namespace {

Error bad_uri(std::string_view uri, const std::string& why) {
  return Error(-EINVAL, "pool URI '" + std::string(uri) + "': " + why +
                            " (expected shm:NAME:SIZE, file:PATH, dax:/dev/daxX.Y or dev:/dev/cxlkvN)");
}

bool valid_shm_name(std::string_view n) {
  if (n.empty() || n.size() > 200 || n == "." || n == "..") return false;
  for (char c : n) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<PoolUri> parse_pool_uri(std::string_view uri) {
  auto colon = uri.find(':');
  if (uri.empty()) return bad_uri(uri, "empty");
  if (colon == std::string_view::npos) return bad_uri(uri, "no scheme");
  std::string_view scheme = uri.substr(0, colon), rest = uri.substr(colon + 1);
  PoolUri u;
  u.uri = std::string(uri);
  if (scheme == "shm") {
    u.kind = BackendKind::shm;
    std::string_view name = rest, size;
    if (auto c = rest.find(':'); c != std::string_view::npos) {
      name = rest.substr(0, c);
      size = rest.substr(c + 1);
      if (!parse_size(size, &u.size) || u.size == 0)
        return bad_uri(uri, "bad size '" + std::string(size) + "' (examples: 256M, 4G)");
    }
    if (!valid_shm_name(name))
      return bad_uri(uri, "bad shm name '" + std::string(name) + "' (letters, digits, _ . -)");
    u.path = "/dev/shm/" + std::string(name);
  } else if (scheme == "file") {
    u.kind = BackendKind::file;
    if (rest.empty()) return bad_uri(uri, "empty file path");
    u.path = std::string(rest);
  } else if (scheme == "dax" || scheme == "dev") {
    u.kind = scheme == "dax" ? BackendKind::dax : BackendKind::dev;
    if (rest.empty() || rest[0] != '/')
      return bad_uri(uri, "needs an absolute device path, e.g. " +
                              std::string(scheme == "dax" ? "dax:/dev/dax0.0" : "dev:/dev/cxlkv0"));
    u.path = std::string(rest);
  } else {
    return bad_uri(uri, "unknown scheme '" + std::string(scheme) + "'");
  }
  return u;
}

Error needs_size_error(const PoolUri& uri) {
  return Error(-EINVAL, "pool " + uri.uri + ": " + uri.path +
                            " does not exist yet; formatting it needs a size (" +
                            (uri.kind == BackendKind::shm ? "shm:NAME:SIZE or " : "") + "--size)");
}

Result<std::unique_ptr<Backend>> open_backend(const PoolUri& uri, const BackendOpenOptions& o) {
  switch (uri.kind) {
    case BackendKind::shm: return open_shm_backend(uri, o);
    case BackendKind::file: return open_file_backend(uri, o);
    case BackendKind::dax: return open_dax_backend(uri, o);
    case BackendKind::dev: return open_dev_backend(uri, o);
    case BackendKind::mem: break;  // not reachable by URI
  }
  return Error(-EINVAL, "pool " + uri.uri + ": unknown backend");
}

}  // namespace cxlkv::region
