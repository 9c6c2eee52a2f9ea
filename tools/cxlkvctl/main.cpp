// SPDX-License-Identifier: MIT
// cxlkvctl: operator and debug CLI for cxlkv pools.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "command.hpp"
#include "pool_fault.hpp"
#include "pool_open.hpp"
#include "cxlkv/version.h"

namespace cxlkvctl {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

void print_overview() {
  std::printf(
      "usage: cxlkvctl [--pool URI] [--json] <command> [options]\n\n"
      "Operator and debug tool for cxlkv pools.\n\n"
      "Global options:\n"
      "  --pool URI   pool to act on (default: $CXLKV_POOL)\n"
      "               shm:NAME:SIZE | file:PATH | dax:/dev/daxX.Y | dev:/dev/cxlkvN\n"
      "  --json       machine-readable output where supported\n"
      "  -h, --help   this text; `cxlkvctl <command> --help` for a command\n"
      "  --version    print the version\n\n"
      "Commands:\n");
  for (const auto& c : registry()) std::printf("  %-22s %s\n", c.path.c_str(), c.summary.c_str());
}

void print_command_help(const Command& c) {
  std::printf("usage: cxlkvctl [--pool URI] %s %s\n\n%s\n", c.path.c_str(),
              c.options.empty() ? "" : "[options]", c.usage.c_str());
  if (!c.options.empty()) {
    std::printf("\nOptions:\n");
    for (const auto& o : c.options) {
      std::string lhs = "--" + o.name + (o.takes_value ? " VALUE" : "");
      std::printf("  %-22s %s\n", lhs.c_str(), o.help.c_str());
    }
  }
}
}  // namespace

void register_command(Command c) { registry().push_back(std::move(c)); }
const std::vector<Command>& commands() { return registry(); }

int fail(const std::string& msg) {
  std::fprintf(stderr, "cxlkvctl: %s\n", msg.c_str());
  return 1;
}

std::optional<uint64_t> parse_size(const std::string& s) {
  // One size syntax for URIs and options (decimal digits + K/M/G/T suffix):
  // strtoull's base 0 read "010" as octal and accepted leading blanks.
  uint64_t v = 0;
  if (!cxlkv::region::parse_size(s, &v)) return std::nullopt;
  return v;
}

std::optional<std::string> Args::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> Args::size(const std::string& name, std::string* err) const {
  auto v = value(name);
  if (!v) return std::nullopt;
  auto s = parse_size(*v);
  if (!s && err) *err = "--" + name + ": not a size: '" + *v + "' (examples: 4096, 64K, 2M, 1G)";
  return s;
}

std::unique_ptr<cxlkv::Region> Context::open_pool() {
  if (pool_uri.empty()) {
    fail("no pool given: use --pool URI or set CXLKV_POOL");
    return nullptr;
  }
  // Operator commands read metadata and at most a block: faulting in the
  // whole pool (seconds for a large one) would only slow them down.
  cxlkv::OpenOptions oo;
  oo.prefault = false;
  auto r = cxlkv_tools::open_pool(pool_uri, oo);  // its failure printed once (below)
  if (!r) {
    fail(r.error().message());
    return nullptr;
  }
  cxlkv_tools::report_pool_faults("cxlkvctl", pool_uri, r.value()->base(), r.value()->size());
  return std::move(r).value();
}

}  // namespace cxlkvctl

int main(int argc, char** argv) {
  using namespace cxlkvctl;
  Context ctx;
  if (const char* p = std::getenv("CXLKV_POOL")) ctx.pool_uri = p;

  std::vector<std::string> words;
  int i = 1;
  // Global options come before the command.
  for (; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--pool" && i + 1 < argc) {
      ctx.pool_uri = argv[++i];
    } else if (a.rfind("--pool=", 0) == 0) {
      ctx.pool_uri = a.substr(7);
    } else if (a == "--json") {
      ctx.json = true;
    } else if (a == "-h" || a == "--help") {
      print_overview();
      return 0;
    } else if (a == "--version") {
      std::printf("cxlkvctl (cxlkv) %s\n", CXLKV_VERSION);
      return 0;
    } else if (a == "--pool") {
      return fail("--pool needs a URI");
    } else if (a.rfind("-", 0) == 0) {
      return fail("unknown global option '" + a + "' (see cxlkvctl --help)");
    } else {
      break;
    }
  }
  if (i >= argc) {
    print_overview();
    return 2;
  }

  // Longest command path matching the next words.
  const Command* cmd = nullptr;
  size_t cmd_words = 0;
  for (const auto& c : commands()) {
    std::vector<std::string> parts;
    size_t s = 0, e;
    while ((e = c.path.find(' ', s)) != std::string::npos) {
      parts.push_back(c.path.substr(s, e - s));
      s = e + 1;
    }
    parts.push_back(c.path.substr(s));
    if (static_cast<size_t>(argc - i) < parts.size()) continue;
    bool match = true;
    for (size_t k = 0; k < parts.size(); k++)
      if (parts[k] != argv[i + k]) match = false;
    if (match && parts.size() > cmd_words) {
      cmd = &c;
      cmd_words = parts.size();
    }
  }
  if (!cmd) {
    std::string prefix = argv[i];
    bool any = false;
    for (const auto& c : commands())
      if (c.path.rfind(prefix + " ", 0) == 0) {
        if (!any) std::fprintf(stderr, "cxlkvctl: '%s' needs a subcommand:\n", prefix.c_str());
        std::fprintf(stderr, "  %-22s %s\n", c.path.c_str(), c.summary.c_str());
        any = true;
      }
    if (any) return 2;
    return fail("unknown command '" + prefix + "' (see cxlkvctl --help)");
  }
  i += static_cast<int>(cmd_words);

  Args args;
  for (; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_command_help(*cmd);
      return 0;
    }
    if (a == "--json") {
      ctx.json = true;
      continue;
    }
    // Global --pool is also accepted after the command (`cxlkvctl info --pool X`).
    if (a == "--pool") {
      if (i + 1 >= argc) return fail("--pool needs a URI");
      ctx.pool_uri = argv[++i];
      continue;
    }
    if (a.rfind("--pool=", 0) == 0) {
      ctx.pool_uri = a.substr(7);
      continue;
    }
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2), val;
      bool has_eq = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        val = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_eq = true;
      }
      const Option* opt = nullptr;
      for (const auto& o : cmd->options)
        if (o.name == name) opt = &o;
      if (!opt) return fail(cmd->path + ": unknown option '--" + name + "' (see cxlkvctl " + cmd->path + " --help)");
      if (opt->takes_value) {
        if (!has_eq) {
          if (i + 1 >= argc) return fail(cmd->path + ": --" + name + " needs a value");
          val = argv[++i];
        }
        args.values_[name] = val;
      } else {
        if (has_eq) return fail(cmd->path + ": --" + name + " takes no value");
        args.flags_[name] = true;
      }
      continue;
    }
    args.pos_.push_back(a);
  }
  if (args.pos_.size() > cmd->operands)
    return fail(cmd->path + ": unexpected argument '" + args.pos_[cmd->operands] + "' (see cxlkvctl " + cmd->path +
                " --help)");
  return cmd->run(ctx, args);
}
