// SPDX-License-Identifier: MIT
// cxlkvctl pool commands: format, info, carve create|list|rm.
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>

#include "command.hpp"
#include "kv/index_service.hpp"
#include "pool/format.hpp"
#include "region/superblock.hpp"

namespace cxlkvctl {
namespace {

using cxlkv::CarveInfo;
using cxlkv::MemType;
using cxlkv::Region;
using cxlkv::region::human_size;

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string pool_id_hex(const cxlkv_superblock& sb) {
  std::string s;
  char b[4];
  for (unsigned char c : sb.pool_id) {
    std::snprintf(b, sizeof b, "%02x", c);
    s += b;
  }
  return s;
}

std::string flags_text(uint32_t f) { return (f & CXLKV_CARVE_F_SYSTEM) ? "system" : "-"; }

std::string carve_json(const CarveInfo& c) {
  std::string flags = "[";
  if (c.flags & CXLKV_CARVE_F_SYSTEM) flags += "\"system\"";
  flags += "]";
  return "{\"name\":" + json_str(c.name) + ",\"offset\":" + std::to_string(c.offset) +
         ",\"size\":" + std::to_string(c.size) + ",\"memtype\":\"" + cxlkv::to_string(c.memtype) +
         "\",\"flags\":" + flags + "}";
}

void print_carve_table(const std::vector<CarveInfo>& cs) {
  std::printf("  %-16s %18s %18s %-10s %-7s %s\n", "carve", "offset", "end", "size", "memtype", "flags");
  for (const auto& c : cs)
    std::printf("  %-16s 0x%016" PRIx64 " 0x%016" PRIx64 " %-10s %-7s %s\n", c.name.c_str(), c.offset,
                c.offset + c.size, human_size(c.size).c_str(), cxlkv::to_string(c.memtype),
                flags_text(c.flags).c_str());
}

// The control carve's header, when the pool has a valid one (standard format).
std::optional<cxlkv_ctrl_header> control_header(const Region& r) {
  auto c = r.carve(CXLKV_CARVE_CONTROL);
  if (!c || c->size < sizeof(cxlkv_ctrl_header)) return std::nullopt;
  auto h = r.domain().read_fresh(r.at<cxlkv_ctrl_header>(c->offset));  // rule 4
  if (h.magic != CXLKV_CTRL_MAGIC) return std::nullopt;
  return h;
}

int print_info(const Context& ctx, const Region& r) {
  auto sbr = r.read_superblock();
  if (!sbr) return fail(sbr.error().message());
  const cxlkv_superblock& sb = sbr.value();
  auto cs = r.carves();
  auto ctrl = control_header(r);
  if (ctx.json) {
    std::string out = "{\"uri\":" + json_str(r.uri()) + ",\"backend\":\"" + cxlkv::to_string(r.kind()) +
                      "\",\"size\":" + std::to_string(r.size()) + ",\"pool_id\":\"" + pool_id_hex(sb) +
                      "\",\"layout_version\":" + std::to_string(sb.layout_version) +
                      ",\"generation\":" + std::to_string(sb.generation) +
                      ",\"max_nodes\":" + std::to_string(sb.max_nodes) +
                      (ctrl ? ",\"max_locks\":" + std::to_string(ctrl->max_locks) : std::string()) +
                      ",\"format_time_ns\":" + std::to_string(sb.format_time_ns) + ",\"carves\":[";
    for (size_t i = 0; i < cs.size(); i++) {
      if (i) out += ',';
      out += carve_json(cs[i]);
    }
    out += "]}";
    std::printf("%s\n", out.c_str());
    return 0;
  }
  std::printf("pool %s\n", r.uri().c_str());
  std::printf("  backend         %s\n", cxlkv::to_string(r.kind()));
  std::printf("  size            %s (%" PRIu64 " bytes)\n", human_size(r.size()).c_str(), r.size());
  std::printf("  pool id         %s\n", pool_id_hex(sb).c_str());
  std::printf("  layout version  %u\n", sb.layout_version);
  std::printf("  generation      %llu\n", static_cast<unsigned long long>(sb.generation));
  std::printf("  max nodes       %u\n", sb.max_nodes);
  if (ctrl) std::printf("  max locks       %u\n", ctrl->max_locks);
  std::printf("  carves          %u of %u\n", sb.ncarves, CXLKV_MAX_CARVES);
  if (!cs.empty()) print_carve_table(cs);
  return 0;
}

bool parse_u32(const Args& a, const std::string& name, uint32_t* out, std::string* err) {
  auto v = a.value(name);
  if (!v) return true;
  auto n = parse_size(*v);
  if (!n || *n > UINT32_MAX) {
    *err = "--" + name + ": not a number: '" + *v + "'";
    return false;
  }
  *out = static_cast<uint32_t>(*n);
  return true;
}

int cmd_format(Context& ctx, const Args& a) {
  if (ctx.pool_uri.empty()) return fail("format: no pool given: use --pool URI or set CXLKV_POOL");
  cxlkv::PoolFormatOptions o;
  std::string err;
  if (auto s = a.size("size", &err)) o.size = *s;
  else if (!err.empty()) return fail("format: " + err);
  // 0 is "no size" to the library: a new pool was told it "needs a size (--size)".
  if (a.value("size") && o.size == 0) return fail("format: --size 0: leave --size out to keep an existing pool's size");
  if (!parse_u32(a, "max-nodes", &o.max_nodes, &err) || !parse_u32(a, "max-locks", &o.max_locks, &err))
    return fail("format: " + err);
  if (auto s = a.size("index-entries", &err)) o.index_entries = *s;
  else if (!err.empty()) return fail("format: " + err);
  o.force = a.flag("force");
  o.standard = !a.flag("no-standard");
  if (a.flag("index-service"))  // the pool's index mode
    o.extra_carves.emplace_back(cxlkv::kIndexServiceCarve, cxlkv::kIndexServiceCarveBytes);
  cxlkv::OpenOptions oo;
  oo.prefault = !a.flag("no-prefault");
  if (auto h = a.value("huge-pages")) {
    if (*h == "prefer") oo.huge_pages = cxlkv::HugePages::prefer;
    else if (*h == "require") oo.huge_pages = cxlkv::HugePages::require;
    else if (*h != "off") return fail("format: --huge-pages must be off, prefer or require, not '" + *h + "'");
  }
  auto r = cxlkv::format_pool(ctx.pool_uri, o, oo);
  if (!r) return fail(r.error().message());
  if (!ctx.json) std::printf("formatted %s\n", ctx.pool_uri.c_str());
  return print_info(ctx, *r.value());
}

int cmd_info(Context& ctx, const Args&) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  return print_info(ctx, *r);
}

int cmd_carve_create(Context& ctx, const Args& a) {
  if (a.positional().size() != 1) return fail("carve create: needs exactly one NAME (see --help)");
  std::string err;
  auto size = a.size("size", &err);
  if (!size) return fail("carve create: " + (err.empty() ? std::string("--size is required") : err));
  MemType mt = MemType::wb;
  if (auto m = a.value("memtype")) {
    if (*m == "wb") mt = MemType::wb;
    else if (*m == "wc") mt = MemType::wc;
    else if (*m == "uc") mt = MemType::uc;
    else return fail("carve create: --memtype must be wb, wc or uc, not '" + *m + "'");
  }
  auto r = ctx.open_pool();
  if (!r) return 1;
  auto c = r->carve_create(a.positional()[0], *size, mt);
  if (!c) return fail(c.error().message());
  if (ctx.json) std::printf("%s\n", carve_json(c.value()).c_str());
  else print_carve_table({c.value()});
  return 0;
}

int cmd_carve_list(Context& ctx, const Args&) {
  auto r = ctx.open_pool();
  if (!r) return 1;
  auto cs = r->carves();
  if (ctx.json) {
    std::string out = "[";
    for (size_t i = 0; i < cs.size(); i++) {
      if (i) out += ',';
      out += carve_json(cs[i]);
    }
    std::printf("%s]\n", out.c_str());
  } else {
    print_carve_table(cs);
  }
  return 0;
}

int cmd_carve_rm(Context& ctx, const Args& a) {
  if (a.positional().size() != 1) return fail("carve rm: needs exactly one NAME (see --help)");
  auto r = ctx.open_pool();
  if (!r) return 1;
  auto res = r->carve_remove(a.positional()[0], a.flag("force"));
  if (!res) return fail(res.error().message());
  if (!ctx.json) std::printf("removed carve '%s'\n", a.positional()[0].c_str());
  return 0;
}

}  // namespace

CXLKVCTL_COMMAND({"format", "format a pool (superblock + standard carves)",
                  "Writes a fresh superblock and, unless --no-standard, the standard carves\n"
                  "control, index, alloc and kv.  Refuses to overwrite a valid pool unless --force.\n"
                  "shm:NAME:SIZE pools take their size from the URI; file: pools need --size\n"
                  "when the file does not exist yet.  A valid pool is never overwritten without\n"
                  "--force, whatever size the URI names.  shm:/file: pools are allocated in full\n"
                  "(a file system too small fails here) and faulted in; the files are created\n"
                  "exclusively with mode CXLKV_FILE_MODE (default 0600), never through a\n"
                  "symbolic link.",
                  {{"size", true, "pool size (e.g. 256M, 4G); multiple of 2 MiB"},
                   {"max-nodes", true, "hosts that may attach (1..64, default 16)"},
                   {"max-locks", true, "global lock ids (default 1024)"},
                   {"index-entries", true, "prefix index entries (default: one per 64 KiB of kv)"},
                   {"force", false, "overwrite a pool that holds a valid superblock"},
                   {"no-standard", false, "superblock only, no standard carves"},
                   {"index-service", false,
                    "index-service mode: stores reach the prefix index through `cxlkvd --index-service`"},
                   {"huge-pages", true, "off (default), prefer or require 2 MiB pages (tmpfs huge=, hugetlbfs)"},
                   {"no-prefault", false, "do not fault the pool's pages in now"}},
                  cmd_format});

CXLKVCTL_COMMAND({"info", "show the superblock and carves",
                  "Validates and prints the pool's superblock and carve table\n"
                  "(--json: one JSON object).",
                  {},
                  cmd_info});

CXLKVCTL_COMMAND({"carve create", "create a carve: carve create NAME --size S",
                  "carve create NAME --size S [--memtype wb|wc|uc]\n\n"
                  "Creates a 2 MiB-aligned carve (size rounded up to 2 MiB) in the first free\n"
                  "range.  Names are 1..31 characters of [a-z0-9_.-].",
                  {{"size", true, "carve size (e.g. 64M)"},
                   {"memtype", true, "memory type of user mappings: wb (default), wc, uc"}},
                  cmd_carve_create, 1});

CXLKVCTL_COMMAND({"carve list", "list the carves", "Prints the carve table (--json: a JSON array).", {},
                  cmd_carve_list});

CXLKVCTL_COMMAND({"carve rm", "remove a carve: carve rm NAME",
                  "carve rm NAME [--force]\n\n"
                  "Removes a carve from the table (its bytes are left as they are).  System\n"
                  "carves made by format need --force.",
                  {{"force", false, "also remove a system carve"}},
                  cmd_carve_rm, 1});

}  // namespace cxlkvctl
