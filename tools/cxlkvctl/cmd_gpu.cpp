// SPDX-License-Identifier: MIT
// cxlkvctl gpu probe | gpu pin: is the GPU path usable here, and can this
// pool's mapping be registered for GPU DMA (and by which method)?
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "command.hpp"
#include "cxlkv/gpu.hpp"

namespace {

using namespace cxlkv::gpu;

std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

int gpu_probe(cxlkvctl::Context& ctx, const cxlkvctl::Args& args) {
  Status s = probe();
  const bool ready = s.availability == Availability::ready;
  if (ctx.json) {
    std::printf("{\"availability\":%s,\"message\":%s,\"library\":%s,\"devices\":%d,\"name\":%s,\"cc\":\"%d.%d\"}\n",
                quoted(to_string(s.availability)).c_str(), quoted(s.message).c_str(), quoted(s.library).c_str(),
                s.device.device_count, quoted(s.device.name).c_str(), s.device.cc_major, s.device.cc_minor);
  } else {
    std::printf("gpu path: %s\n  %s\n", to_string(s.availability), s.message.c_str());
  }
  return (!ready && args.flag("require")) ? 1 : 0;
}

int gpu_pin(cxlkvctl::Context& ctx, const cxlkvctl::Args& args) {
  auto region = ctx.open_pool();
  if (!region) return 1;
  std::shared_ptr<CudaLibrary> lib;
  if (args.flag("cpu-reference")) {
    lib = CudaLibrary::cpu_reference();
  } else {
    auto l = CudaLibrary::load();
    if (!l) return cxlkvctl::fail(l.error().message());
    if (auto d = l.value()->probe(); !d) return cxlkvctl::fail(d.error().message());
    lib = l.value();
  }
  PinOptions po;
  std::string err;
  if (args.value("chunk")) {
    auto c = args.size("chunk", &err);
    if (!c) return cxlkvctl::fail(err);
    po.chunk_bytes = *c;
  }
  po.force_io_memory = args.flag("io-memory");
  // Open as a serving process does: nothing registered yet (docs/gpu.md "On-demand pinning").
  auto t0 = std::chrono::steady_clock::now();
  auto pin = PoolPin::pin(lib, region->base(), region->size(), po);
  if (!pin) return cxlkvctl::fail(pin.error().message());
  const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PoolPin& p = *pin.value();
  uint64_t want = p.chunk_count();
  if (auto c = args.value("chunks"); c && *c != "all") {
    auto n = cxlkvctl::parse_size(*c);
    if (!n) return cxlkvctl::fail("--chunks: not a number or 'all': " + *c);
    want = std::min<uint64_t>(*n, p.chunk_count());
  }
  if (want) {
    if (auto r = p.pin_range(0, std::min<uint64_t>(want * p.chunk_bytes(), p.size())); !r)
      return cxlkvctl::fail(r.error().message());
  }
  const PinStats st = p.stats();
  if (ctx.json)
    std::printf("{\"pool\":%s,\"bytes\":%llu,\"method\":%s,\"chunk_bytes\":%llu,\"chunks\":%llu,"
                "\"chunks_pinned\":%llu,\"bytes_pinned\":%llu,\"open_seconds\":%.6f,\"pin_seconds\":%.6f,"
                "\"max_chunk_seconds\":%.6f}\n",
                quoted(region->uri()).c_str(), static_cast<unsigned long long>(region->size()),
                quoted(to_string(p.method())).c_str(), static_cast<unsigned long long>(p.chunk_bytes()),
                static_cast<unsigned long long>(st.chunks_total), static_cast<unsigned long long>(st.chunks_pinned),
                static_cast<unsigned long long>(st.bytes_pinned), open_s, st.pin_seconds, st.max_chunk_seconds);
  else
    std::printf("pool %s: %llu bytes in %llu chunk(s) of %llu bytes; ready for transfers after %.3f s\n"
                "  chunks pinned: %llu (%llu bytes) by %s in %.3f s (slowest chunk %.3f s, %.3f s per GiB)\n"
                "  unregistered again on exit\n",
                region->uri().c_str(), static_cast<unsigned long long>(region->size()),
                static_cast<unsigned long long>(st.chunks_total), static_cast<unsigned long long>(p.chunk_bytes()),
                open_s, static_cast<unsigned long long>(st.chunks_pinned),
                static_cast<unsigned long long>(st.bytes_pinned), to_string(p.method()), st.pin_seconds,
                st.max_chunk_seconds, st.bytes_pinned ? st.pin_seconds / (double(st.bytes_pinned) / (1ull << 30)) : 0.0);
  return 0;
}

}  // namespace

CXLKVCTL_COMMAND({"gpu probe", "is the GPU path usable (library, driver, device)?",
                  "usage: cxlkvctl gpu probe [--require] [--json]\n\n"
                  "Loads libcxlkv-cuda (CXLKV_CUDA_LIB, beside libcxlkv, build tree, linker path)\n"
                  "and reports the device, or why the GPU path is unusable: library not found,\n"
                  "incompatible library, no CUDA driver, no GPU.  --require: exit 1 unless usable.\n",
                  {{"require", false, "exit 1 unless a GPU is usable"}},
                  gpu_probe});

CXLKVCTL_COMMAND({"gpu pin", "register the pool mapping for GPU DMA; report chunks pinned and time spent",
                  "usage: cxlkvctl --pool URI gpu pin [--chunk SIZE] [--chunks N|all] [--io-memory]\n"
                  "                                   [--cpu-reference] [--json]\n\n"
                  "Opens the pool for GPU DMA as a serving process does (chunks of SIZE, default\n"
                  "1G, registered on first touch, so the open is immediate), then registers the\n"
                  "first N chunks (default all) with cudaHostRegister (portable, mapped), falling\n"
                  "back to cudaHostRegisterIoMemory for PFN mappings (dev:, dax:).  Prints the\n"
                  "time until the pool was ready, the chunks pinned, the method and the time spent\n"
                  "(total, slowest chunk, per GiB), and unregisters everything again.\n",
                  {{"chunk", true, "registration chunk size (default 1G)"},
                   {"chunks", true, "how many chunks to register (default all; 0: open only)"},
                   {"io-memory", false, "use only cudaHostRegisterIoMemory"},
                   {"cpu-reference", false, "the CPU stand-in instead of a GPU (a dry run)"}},
                  gpu_pin});
