// SPDX-License-Identifier: MIT
// cxlkvctl gpu probe | gpu pin: is the GPU path usable here, and can this
// pool's mapping be registered for GPU DMA (and by which method)?
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
  auto lib = CudaLibrary::load();
  if (!lib) return cxlkvctl::fail(lib.error().message());
  if (auto d = lib.value()->probe(); !d) return cxlkvctl::fail(d.error().message());
  PinOptions po;
  std::string err;
  if (args.value("chunk")) {
    auto c = args.size("chunk", &err);
    if (!c) return cxlkvctl::fail(err);
    po.chunk_bytes = *c;
  }
  po.force_io_memory = args.flag("io-memory");
  auto pin = PoolPin::pin(lib.value(), region->base(), region->size(), po);
  if (!pin) return cxlkvctl::fail(pin.error().message());
  if (ctx.json)
    std::printf("{\"pool\":%s,\"bytes\":%llu,\"method\":%s,\"chunks\":%zu}\n", quoted(region->uri()).c_str(),
                static_cast<unsigned long long>(region->size()), quoted(to_string(pin.value()->method())).c_str(),
                pin.value()->chunk_count());
  else
    std::printf("pool %s: %llu bytes registered for GPU DMA by %s in %zu chunk(s); unregistered again\n",
                region->uri().c_str(), static_cast<unsigned long long>(region->size()),
                to_string(pin.value()->method()), pin.value()->chunk_count());
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

CXLKVCTL_COMMAND({"gpu pin", "register the pool mapping for GPU DMA and report the method",
                  "usage: cxlkvctl --pool URI gpu pin [--chunk SIZE] [--io-memory] [--json]\n\n"
                  "Registers the whole pool mapping with cudaHostRegister (portable, mapped), in\n"
                  "chunks of SIZE (default 1G), falling back to cudaHostRegisterIoMemory for PFN\n"
                  "mappings (dev:, dax:), prints which method worked, and unregisters it again.\n",
                  {{"chunk", true, "registration chunk size (default 1G)"},
                   {"io-memory", false, "use only cudaHostRegisterIoMemory"}},
                  gpu_pin});
