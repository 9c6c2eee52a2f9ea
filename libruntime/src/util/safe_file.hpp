// SPDX-License-Identifier: MIT
// Opening cxlkv's files (pools, node-local files, SSD files) safely in
// shared directories such as /dev/shm and /tmp.
//
// An unprivileged user can plant a symbolic link or a pre-created file under
// the name a privileged process is about to use.  safe_open() therefore:
//   - never follows a symbolic link in the last path component (O_NOFOLLOW),
//   - creates missing files exclusively (O_CREAT | O_EXCL) with the
//     configured mode,
//   - refuses a file owned by another user (root's files are trusted: root
//     can change any file anyway), a file with several hard links, and a
//     file writable by group or others beyond the configured mode.
// The configured mode is CXLKV_FILE_MODE (octal, e.g. 0660 to share pools
// with a group; default 0600).  Errors name the file and the reason.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "cxlkv/result.hpp"

namespace cxlkv::util {

struct SafeOpenOptions {
  // Message prefix naming the object, e.g. "pool shm:a:64M" or "SSD device".
  std::string what = "file";
  bool create = false;       // create (exclusively) when missing
  int extra_flags = 0;       // e.g. O_DIRECT
  bool allow_block_device = false;  // SSD tier: a raw block device is fine
  // Permission bits for a created file and the most a found file may grant
  // to group/others; 0: configured_file_mode().
  mode_t mode = 0;
};

struct SafeFile {
  int fd = -1;
  bool created = false;  // this call created the file
  struct stat st {};
};

// The operator's mode for cxlkv files: CXLKV_FILE_MODE (octal, only
// 0600..0666 bits of rw are used), default 0600.  A bad value is ignored with
// a warning.
mode_t configured_file_mode();

// Open `path` read/write.  -ELOOP: a symbolic link; -EPERM: owned by another
// user, writable by group/others beyond the configured mode, or hard-linked;
// -EINVAL: not a regular file (or block device where allowed); -ENOENT:
// missing and !create; other -errno from open/fstat.
Result<SafeFile> safe_open(const std::string& path, const SafeOpenOptions& o);

// The checks safe_open applies to an already open file (tests, and callers
// that open by other means).
Result<void> check_open_file(const std::string& path, const struct stat& st, const SafeOpenOptions& o);

}  // namespace cxlkv::util
