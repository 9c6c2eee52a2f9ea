// SPDX-License-Identifier: MIT
#include "util/safe_file.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/log.hpp"

namespace cxlkv::util {

namespace {

std::string octal(mode_t m) {
  char b[16];
  std::snprintf(b, sizeof b, "0%03o", static_cast<unsigned>(m & 07777));
  return b;
}

std::string user_name(uid_t uid) {
  std::string s = "uid " + std::to_string(uid);
  struct passwd pw {}, *res = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res) s += " (" + std::string(res->pw_name) + ")";
  return s;
}

}  // namespace

mode_t configured_file_mode() {
  const char* e = std::getenv("CXLKV_FILE_MODE");
  if (!e || !*e) return 0600;
  char* end = nullptr;
  unsigned long v = std::strtoul(e, &end, 8);
  if (*end || v > 0777 || (v & 0600) != 0600) {
    static bool warned = false;
    if (!warned) log().warn("CXLKV_FILE_MODE='{}' is not an octal mode with owner rw (e.g. 0660); using 0600", e);
    warned = true;
    return 0600;
  }
  return static_cast<mode_t>(v) & 0666;  // never execute bits
}

Result<void> check_open_file(const std::string& path, const struct stat& st, const SafeOpenOptions& o) {
  const std::string P = o.what + ": " + path + " ";
  bool blk = S_ISBLK(st.st_mode);
  if (!S_ISREG(st.st_mode) && !(blk && o.allow_block_device))
    return Error(-EINVAL, P + (o.allow_block_device ? "is not a regular file or a block device"
                                                    : "is not a regular file"));
  if (blk) return {};  // device nodes live in /dev, owned by root; their group is the operator's choice
  uid_t me = geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    return Error(-EPERM, P + "is owned by " + user_name(st.st_uid) + ", not by this user (" + user_name(me) +
                             "); refusing a file another user controls (remove it, or chown it to this user)");
  mode_t allowed = o.mode ? o.mode : configured_file_mode();
  mode_t extra = st.st_mode & 0022 & ~allowed;
  if (extra)
    return Error(-EPERM, P + "is writable by " + ((extra & 0020) && (extra & 0002) ? "group and others"
                                                   : (extra & 0020)                 ? "group"
                                                                                    : "others") +
                             " (mode " + octal(st.st_mode) + ") beyond the configured mode " + octal(allowed) +
                             " (CXLKV_FILE_MODE); chmod it, or set CXLKV_FILE_MODE to allow it");
  if (st.st_nlink > 1)
    return Error(-EPERM, P + "has " + std::to_string(st.st_nlink) +
                             " hard links; refusing a file that may be linked to another file");
  return {};
}

Result<SafeFile> safe_open(const std::string& path, const SafeOpenOptions& o) {
  const std::string P = o.what + ": " + path;
  const mode_t mode = o.mode ? o.mode : configured_file_mode();
  const int base = O_RDWR | O_CLOEXEC | O_NOFOLLOW | o.extra_flags;
  SafeFile f;
  // Existing file first; when missing, create exclusively.  A file that
  // appears between the two opens (another process of ours creating it) is
  // opened on the next round; give up after a few rounds.
  for (int round = 0; round < 4; round++) {
    f.fd = ::open(path.c_str(), base);
    if (f.fd < 0 && errno == ENOENT && o.create) {
      f.fd = ::open(path.c_str(), base | O_CREAT | O_EXCL, mode);
      if (f.fd >= 0) {
        f.created = true;
        // The umask may have taken bits the operator asked for (group sharing).
        if (::fchmod(f.fd, mode) != 0) {
          int e = errno;
          ::close(f.fd);
          ::unlink(path.c_str());
          return Error(-e, P + ": chmod " + octal(mode) + ": " + std::strerror(e));
        }
      } else if (errno == EEXIST) {
        continue;
      }
    }
    break;
  }
  if (f.fd < 0) {
    int e = errno;
    if (e == ELOOP)
      return Error(-ELOOP, P + " is a symbolic link; cxlkv does not follow links for its files (a link in a "
                               "shared directory could point at any file); name the target itself");
    if (e == ENOENT) return Error(-ENOENT, P + " does not exist");
    if (e == EEXIST) return Error(-EEXIST, P + ": created and removed repeatedly by another process; try again");
    return Error(-e, P + ": open: " + std::strerror(e));
  }
  if (::fstat(f.fd, &f.st) != 0) {
    int e = errno;
    ::close(f.fd);
    return Error(-e, P + ": fstat: " + std::strerror(e));
  }
  auto ok = check_open_file(path, f.st, o);
  if (!ok) {
    ::close(f.fd);
    return ok.error();
  }
  return f;
}

}  // namespace cxlkv::util
