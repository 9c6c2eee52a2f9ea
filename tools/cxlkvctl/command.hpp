// SPDX-License-Identifier: MIT
// cxlkvctl subcommand registry.  Each area adds its commands in its own
// cmd_<area>.cpp with CXLKVCTL_COMMAND; main.cpp parses global options,
// finds the longest matching command path and runs it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"

namespace cxlkvctl {

struct Option {
  std::string name;  // long name without "--"
  bool takes_value = false;
  std::string help;
};

// Parsed arguments of one command.
class Args {
 public:
  bool flag(const std::string& name) const { return flags_.count(name) != 0; }
  std::optional<std::string> value(const std::string& name) const;
  // Value parsed as a size ("4096", "64K", "2M", "1G"); error text on failure.
  std::optional<uint64_t> size(const std::string& name, std::string* err) const;
  const std::vector<std::string>& positional() const { return pos_; }

  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_;
  std::vector<std::string> pos_;
};

struct Context {
  std::string pool_uri;  // --pool or CXLKV_POOL
  bool json = false;     // --json
  // Opens the pool named by --pool; prints the error and returns nullptr on failure.
  std::unique_ptr<cxlkv::Region> open_pool();
};

struct Command {
  std::string path;     // "carve create"
  std::string summary;  // one line for `cxlkvctl --help`
  std::string usage;    // full help text for `cxlkvctl <path> --help`
  std::vector<Option> options;
  int (*run)(Context&, const Args&) = nullptr;  // exit status
  // Most positional arguments the command takes (NAME, KEY FILE, ...):
  // main refuses more, for every command alike (docs/operations.md "Bad input,
  // damage and interruptions"); the command checks that enough came.
  size_t operands = 0;
};

void register_command(Command c);
const std::vector<Command>& commands();

// Print "cxlkvctl: <msg>" to stderr and return exit status 1.
int fail(const std::string& msg);

// The pool's node table (cxlkv::list_nodes); when the control carve cannot
// be read, prints why (ControlCarve::open: missing, unformatted, damaged)
// and returns nullopt.
std::optional<std::vector<cxlkv::NodeStatus>> node_table(cxlkv::Region& r);

// Parse "4096", "64K", "2M", "1G", "1T" (powers of 1024).
std::optional<uint64_t> parse_size(const std::string& s);

}  // namespace cxlkvctl

#define CXLKVCTL_CONCAT2(a, b) a##b
#define CXLKVCTL_CONCAT(a, b) CXLKVCTL_CONCAT2(a, b)
#define CXLKVCTL_COMMAND(...)                                                 \
  static const bool CXLKVCTL_CONCAT(cxlkvctl_registered_, __LINE__) =         \
      (::cxlkvctl::register_command(::cxlkvctl::Command __VA_ARGS__), true)
