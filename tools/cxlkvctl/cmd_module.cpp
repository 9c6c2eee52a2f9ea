// SPDX-License-Identifier: MIT
// cxlkvctl commands for the kernel module (kmod/, ABI uapi/cxlkv_ioctl.h):
//   module info, memtype get|set, ddio status|on|off, lock list.
// They talk to /dev/cxlkvN directly (--pool dev:/dev/cxlkvN, default
// /dev/cxlkv0) and do not map the pool, so that a memory type can be changed
// while no carve is mapped.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "command.hpp"
#include "uapi/cxlkv_ioctl.h"

namespace cxlkvctl {
namespace {

std::string device_path(const Context& ctx) {
  if (ctx.pool_uri.empty()) return "/dev/cxlkv0";
  if (ctx.pool_uri.rfind("dev:", 0) == 0) return ctx.pool_uri.substr(4);
  return "";
}

// Opens the device and checks the ABI handshake; -1 after printing why.
int open_device(const Context& ctx, bool write) {
  std::string path = device_path(ctx);
  if (path.empty()) {
    fail("module commands act on the kernel module: use --pool dev:/dev/cxlkvN (got '" + ctx.pool_uri + "')");
    return -1;
  }
  int fd = ::open(path.c_str(), (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    fail(path + ": " + std::strerror(e) + (e == ENOENT ? " (is cxlkv.ko loaded?)" : ""));
    return -1;
  }
  cxlkv_ioc_version v{};
  if (::ioctl(fd, CXLKV_IOC_GET_VERSION, &v) != 0) {
    fail(path + ": not a cxlkv device: " + std::strerror(errno));
    ::close(fd);
    return -1;
  }
  if (v.abi_version != CXLKV_IOCTL_ABI_VERSION) {
    fail(path + ": module ioctl ABI " + std::to_string(v.abi_version) + ", cxlkvctl speaks " +
         std::to_string(CXLKV_IOCTL_ABI_VERSION));
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

const char* memtype_name(uint32_t m) {
  switch (m) {
    case CXLKV_MEM_WB: return "wb";
    case CXLKV_MEM_WC: return "wc";
    case CXLKV_MEM_UC: return "uc";
  }
  return "?";
}

const char* backing_kind(uint32_t k) {
  switch (k) {
    case CXLKV_BACKING_PHYS: return "phys";
    case CXLKV_BACKING_IVSHMEM: return "ivshmem";
    case CXLKV_BACKING_EMULATED: return "emulated";
  }
  return "?";
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// "0000:00:03.0" or "00:03.0"
bool parse_bdf(const std::string& s, cxlkv_ioc_ddio* a) {
  unsigned dom = 0, bus, dev, fn;
  char tail;
  if (std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) {
    dom = 0;
    if (std::sscanf(s.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail) != 3) return false;
  }
  if (bus > 0xff || dev > 0x1f || fn > 7 || dom > 0xffff) return false;
  a->domain = dom;
  a->bus = static_cast<uint8_t>(bus);
  a->devfn = static_cast<uint8_t>(dev << 3 | fn);
  return true;
}

std::string bdf(uint32_t dom, uint8_t bus, uint8_t devfn) {
  char b[32];
  std::snprintf(b, sizeof b, "%04x:%02x:%02x.%u", dom, bus, devfn >> 3, devfn & 7u);
  return b;
}

int cmd_info(Context& ctx, const Args&) {
  Fd d{open_device(ctx, false)};
  if (d.fd < 0) return 1;
  cxlkv_ioc_version v{};
  cxlkv_ioc_info in{};
  if (::ioctl(d.fd, CXLKV_IOC_GET_VERSION, &v) || ::ioctl(d.fd, CXLKV_IOC_INFO, &in))
    return fail(device_path(ctx) + ": INFO: " + std::strerror(errno));
  bool formatted = in.flags & CXLKV_INFO_F_FORMATTED, pat = in.flags & CXLKV_INFO_F_PAT;
  const char* mtrr = "unavailable (the kernel exports no MTRR lookup; see /proc/mtrr)";
  if (ctx.json) {
    std::printf(
        "{\"device\":\"%s\",\"module_version\":\"%s\",\"abi_version\":%u,\"layout_version\":%u,"
        "\"backing\":\"%s\",\"backing_name\":\"%s\",\"size\":%llu,\"phys_base\":%llu,\"node_id\":%u,"
        "\"formatted\":%s,\"ncarves\":%u,\"max_nodes\":%u,\"max_locks\":%u,\"lock_slots_in_use\":%u,"
        "\"pat\":%s,\"mtrr\":\"unavailable\"}\n",
        device_path(ctx).c_str(), v.module_version, v.abi_version, v.layout_version, backing_kind(in.backing),
        in.backing_name, static_cast<unsigned long long>(in.size), static_cast<unsigned long long>(in.phys_base),
        in.node_id, formatted ? "true" : "false", in.ncarves, in.max_nodes, in.max_locks, in.lock_slots_in_use,
        pat ? "true" : "false");
    return 0;
  }
  std::printf("device           %s\n", device_path(ctx).c_str());
  std::printf("module           cxlkv %s (ioctl ABI %u, layout %u)\n", v.module_version, v.abi_version,
              v.layout_version);
  std::printf("backing          %s\n", in.backing_name);
  std::printf("size             %llu MiB\n", static_cast<unsigned long long>(in.size >> 20));
  std::printf("phys base        %#llx\n", static_cast<unsigned long long>(in.phys_base));
  std::printf("node id          %u\n", in.node_id);
  std::printf("formatted        %s\n", formatted ? "yes" : "no (cxlkvctl format, or load with format=1)");
  if (formatted)
    std::printf("carves           %u (max_nodes %u, max_locks %u)\n", in.ncarves, in.max_nodes, in.max_locks);
  std::printf("lock slots used  %u on this host\n", in.lock_slots_in_use);
  std::printf("memory types     %s\n", pat ? "enforced by PAT" : "not enforced (emulated RAM or PAT off): write-back");
  std::printf("MTRR             %s\n", mtrr);
  static const char* params[] = {"node_id", "format", "phys_base", "phys_size", "emulated_size", "ivshmem"};
  std::string ps;
  for (const char* p : params) {
    std::string val = read_line(std::string("/sys/module/cxlkv/parameters/") + p);
    if (!val.empty()) ps += std::string(ps.empty() ? "" : " ") + p + "=" + val;
  }
  if (!ps.empty()) std::printf("module params    %s\n", ps.c_str());
  return 0;
}

int cmd_memtype_get(Context& ctx, const Args& a) {
  if (a.positional().size() != 1) return fail("memtype get: needs one carve name");
  Fd d{open_device(ctx, false)};
  if (d.fd < 0) return 1;
  cxlkv_ioc_memtype m{};
  std::strncpy(m.name, a.positional()[0].c_str(), sizeof m.name - 1);
  if (::ioctl(d.fd, CXLKV_IOC_MEMTYPE_GET, &m))
    return fail("carve '" + a.positional()[0] + "': " + std::strerror(errno));
  if (ctx.json)
    std::printf("{\"carve\":\"%s\",\"memtype\":\"%s\",\"mappings\":%u}\n", m.name, memtype_name(m.memtype), m.mappings);
  else
    std::printf("%s %s\n", m.name, memtype_name(m.memtype));
  return 0;
}

int cmd_memtype_set(Context& ctx, const Args& a) {
  if (a.positional().size() != 2) return fail("memtype set: needs a carve name and wb|wc|uc");
  const std::string& t = a.positional()[1];
  uint32_t mt = t == "wb" ? CXLKV_MEM_WB : t == "wc" ? CXLKV_MEM_WC : t == "uc" ? CXLKV_MEM_UC : 99;
  if (mt == 99) return fail("memtype set: '" + t + "' is not one of wb, wc, uc");
  Fd d{open_device(ctx, true)};
  if (d.fd < 0) return 1;
  cxlkv_ioc_memtype m{};
  std::strncpy(m.name, a.positional()[0].c_str(), sizeof m.name - 1);
  m.memtype = mt;
  if (::ioctl(d.fd, CXLKV_IOC_MEMTYPE_SET, &m)) {
    int e = errno;
    if (e == EBUSY) return fail("carve '" + a.positional()[0] + "' is mapped on this host; unmap it (stop its users) first");
    return fail("carve '" + a.positional()[0] + "': " + std::strerror(e));
  }
  return 0;
}

int ddio(Context& ctx, const Args& a, int set) {
  auto pci = a.value("pci");
  if (!pci) return fail("ddio: --pci BDF is required (the device, e.g. a GPU, below the root port)");
  cxlkv_ioc_ddio r{};
  if (!parse_bdf(*pci, &r)) return fail("ddio: --pci '" + *pci + "' is not a PCI address like 0000:3b:00.0");
  if (a.flag("force")) r.flags |= CXLKV_DDIO_F_FORCE;
  Fd d{open_device(ctx, false)};
  if (d.fd < 0) return 1;
  if (set >= 0) r.enable = static_cast<uint32_t>(set);
  if (set < 0) r.flags = 0;
  if (::ioctl(d.fd, set >= 0 ? CXLKV_IOC_DDIO_SET : CXLKV_IOC_DDIO_GET, &r)) {
    int e = errno;
    switch (e) {
      case ENODEV: return fail("ddio: " + *pci + ": no such PCI device, or no PCIe root port above it");
      case EOPNOTSUPP:
        return fail("ddio: the root port above " + *pci +
                    " is not a known Intel IIO root port (or lacks extended config space); "
                    "--force writes bit 7 of config offset 0x180 anyway");
      case EIO: return fail("ddio: the root port above " + *pci + " did not latch the new setting; restored the old value");
      case EPERM: return fail("ddio: needs CAP_SYS_ADMIN");
      default: return fail("ddio: " + std::string(std::strerror(e)));
    }
  }
  std::string port = bdf(r.port_domain, r.port_bus, r.port_devfn);
  if (ctx.json) {
    std::printf("{\"device\":\"%s\",\"root_port\":\"%s\",\"vendor\":\"%04x\",\"device_id\":\"%04x\","
                "\"known_iio_port\":%s,\"perfctrlsts\":%u,\"ddio\":%s}\n",
                pci->c_str(), port.c_str(), r.port_vendor, r.port_device, r.known ? "true" : "false",
                r.perfctrlsts, r.known ? (r.enable ? "\"on\"" : "\"off\"") : "\"unknown\"");
    return 0;
  }
  std::printf("root port %s (%04x:%04x) above %s: perfctrlsts_0 %#010x, ", port.c_str(), r.port_vendor,
              r.port_device, pci->c_str(), r.perfctrlsts);
  if (r.known || set >= 0)
    std::printf("DDIO (Use_Allocating_Flow_Wr) %s\n", r.enable ? "on" : "off");
  else
    std::printf("not a known Intel IIO root port: DDIO state unknown\n");
  return 0;
}

int cmd_ddio_status(Context& ctx, const Args& a) { return ddio(ctx, a, -1); }
int cmd_ddio_on(Context& ctx, const Args& a) { return ddio(ctx, a, 1); }
int cmd_ddio_off(Context& ctx, const Args& a) { return ddio(ctx, a, 0); }

int cmd_lock_list(Context& ctx, const Args&) {
  Fd d{open_device(ctx, false)};
  if (d.fd < 0) return 1;
  auto* l = new cxlkv_ioc_lock_list{};
  uint32_t start = 0, shown = 0;
  if (ctx.json) std::printf("[");
  else std::printf("%-8s %-8s %-10s %s\n", "lock", "pid", "state", "ticket");
  for (;;) {
    std::memset(l, 0, sizeof *l);
    l->start = start;
    if (::ioctl(d.fd, CXLKV_IOC_LOCK_LIST, l)) {
      delete l;
      return fail("lock list: " + std::string(std::strerror(errno)));
    }
    for (uint32_t i = 0; i < l->count; i++) {
      const auto& e = l->entries[i];
      uint64_t st = e.request & CXLKV_SLOT_STATE_MASK;
      const char* state = st == CXLKV_SLOT_IDLE ? "idle" : st == CXLKV_SLOT_WAITING ? "waiting" : "?";
      unsigned long long ticket = e.request >> CXLKV_SLOT_TICKET_SHIFT;
      if (ctx.json)
        std::printf("%s{\"lock\":%u,\"pid\":%u,\"state\":\"%s\",\"ticket\":%llu}", shown ? "," : "", e.lock_id,
                    e.owner_pid, state, ticket);
      else
        std::printf("%-8u %-8u %-10s %llu\n", e.lock_id, e.owner_pid, state, ticket);
      shown++;
    }
    if (l->next == CXLKV_LOCK_ANY) break;
    start = l->next;
  }
  if (ctx.json) std::printf("]\n");
  else std::printf("%u slot(s) owned on this host\n", shown);
  delete l;
  return 0;
}

const std::vector<Option> kDdioOpts = {
    {"pci", true, "PCI address of a device below the root port (e.g. the GPU), or of the port"},
    {"force", false, "act on a root port that is not a known Intel IIO port"}};

}  // namespace

CXLKVCTL_COMMAND({"module info", "show the kernel module's view of the device",
                  "Prints the module version and ABI, the backing (phys / ivshmem / emulated),\n"
                  "size, physical base, node id, carve and lock slot counts, whether memory\n"
                  "types are enforced (PAT) and the MTRR state.",
                  {}, cmd_info});
CXLKVCTL_COMMAND({"memtype get", "memory type of a carve (wb, wc, uc)",
                  "memtype get CARVE: the memory type user mappings of CARVE get.", {}, cmd_memtype_get, 1});
CXLKVCTL_COMMAND({"memtype set", "set the memory type of a carve",
                  "memtype set CARVE wb|wc|uc: new mappings of CARVE get this type (enforced with\n"
                  "PAT).  Refused while the carve is mapped on this host.",
                  {}, cmd_memtype_set, 2});
CXLKVCTL_COMMAND({"ddio status", "DDIO state of the root port above a PCI device",
                  "Reads perfctrlsts_0 (config 0x180) of the PCIe root port above --pci.", kDdioOpts,
                  cmd_ddio_status});
CXLKVCTL_COMMAND({"ddio on", "enable DDIO (allocating writes) on a root port",
                  "Sets Use_Allocating_Flow_Wr on the root port above --pci; read back; the module\n"
                  "restores the original value when unloaded.",
                  kDdioOpts, cmd_ddio_on});
CXLKVCTL_COMMAND({"ddio off", "disable DDIO on the root port above a GPU",
                  "Clears Use_Allocating_Flow_Wr on the root port above --pci, so device writes to\n"
                  "the pool do not allocate in the CPU cache (Beluga).  Read back; restored on unload.",
                  kDdioOpts, cmd_ddio_off});
CXLKVCTL_COMMAND({"lock list", "global lock slots owned on this host",
                  "Lists this node's lock slots owned by open files (lock id, owner pid, slot state).", {},
                  cmd_lock_list});

}  // namespace cxlkvctl
