// SPDX-License-Identifier: MIT
#include "tier/bandwidth_probe.hpp"
#include "util/clock.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <vector>

namespace cxlkv::tier {

namespace {
constexpr uint64_t kProbeIo = 2ull << 20;  // the probe's I/O size, as the KV blocks'
constexpr uint64_t kMiB = 1ull << 20;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs the probe area as I/Os of kProbeIo over `buf`; returns seconds taken.
Result<double> probe_pass(SsdDevice& dev, const DeviceLayout& l, AlignedBuffer& buf, IoOp op) {
  std::vector<SsdIo> ios;
  for (uint64_t off = 0; off < l.probe_bytes; off += kProbeIo) {
    SsdIo io;
    io.op = op;
    io.offset = l.probe_offset + off;
    io.buf = buf.data() + off;
    io.length = static_cast<uint32_t>(std::min(kProbeIo, l.probe_bytes - off));
    ios.push_back(io);
  }
  double t0 = now_s();
  int r = dev.run(ios);
  double t = now_s() - t0;
  if (r) return Error(r, "SSD device " + dev.path() + ": bandwidth probe " +
                             (op == IoOp::kRead ? "read" : "write") + " failed: " + std::strerror(-r));
  return std::max(t, 1e-6);
}
}  // namespace

Result<DeviceLayout> plan_layout(const SsdDevice& dev, uint64_t probe_bytes) {
  DeviceLayout l;
  const uint64_t lbs = dev.logical_block();
  l.header_bytes = round_up(CXLKV_TIER_HEADER_SIZE, lbs);
  l.probe_offset = round_up(CXLKV_TIER_PROBE_OFF, lbs);
  // The probe takes at most an eighth of the device, in whole logical blocks.
  probe_bytes = std::min(probe_bytes, dev.capacity() / 8) / lbs * lbs;
  l.probe_bytes = std::max<uint64_t>(probe_bytes, lbs);
  l.data_offset = round_up(l.probe_offset + l.probe_bytes, std::max<uint64_t>(kMiB, lbs));
  if (dev.capacity() < l.data_offset + lbs)
    return Error(-ENOSPC, "SSD device " + dev.path() + ": " + std::to_string(dev.capacity()) +
                              " bytes is too small (the header and probe area need " +
                              std::to_string(l.data_offset) + ")");
  return l;
}

Result<ProbeResult> probe_bandwidth(SsdDevice& dev, const DeviceLayout& l) {
  AlignedBuffer buf(round_up(l.probe_bytes, 4096), std::max<size_t>(4096, dev.memory_align()));
  // Non-constant bytes, so no layer below can shortcut zeroes.
  for (size_t i = 0; i < buf.size(); i += 8) {
    uint64_t v = (i + 1) * 0x9e3779b97f4a7c15ull;
    std::memcpy(buf.data() + i, &v, std::min<size_t>(8, buf.size() - i));
  }
  auto tw = probe_pass(dev, l, buf, IoOp::kWrite);
  if (!tw) return tw.error();
  auto tr = probe_pass(dev, l, buf, IoOp::kRead);
  if (!tr) return tr.error();
  double bytes = static_cast<double>(l.probe_bytes);
  return ProbeResult{bytes / *tr / 1e9, bytes / *tw / 1e9};
}

bool read_header(SsdDevice& dev, const DeviceLayout& l, cxlkv_tier_dev_header* out) {
  AlignedBuffer buf(l.header_bytes, std::max<size_t>(4096, dev.memory_align()));
  SsdIo io;
  io.op = IoOp::kRead;
  io.offset = 0;
  io.buf = buf.data();
  io.length = static_cast<uint32_t>(l.header_bytes);
  if (dev.run({&io, 1}) != 0) return false;
  std::memcpy(out, buf.data(), sizeof(*out));
  return out->magic == CXLKV_TIER_DEV_MAGIC && out->version == CXLKV_TIER_DEV_VERSION &&
         out->checksum == cxlkv_tier_header_checksum(out) && out->logical_block == dev.logical_block() &&
         out->data_offset == l.data_offset && out->probe_bytes == l.probe_bytes;
}

Result<void> write_header(SsdDevice& dev, const DeviceLayout& l, const ProbeResult& probe) {
  AlignedBuffer buf(l.header_bytes, std::max<size_t>(4096, dev.memory_align()));
  std::memset(buf.data(), 0, buf.size());
  auto* h = reinterpret_cast<cxlkv_tier_dev_header*>(buf.data());
  h->magic = CXLKV_TIER_DEV_MAGIC;
  h->version = CXLKV_TIER_DEV_VERSION;
  h->logical_block = dev.logical_block();
  h->capacity = dev.capacity();
  h->data_offset = l.data_offset;
  h->probe_bytes = l.probe_bytes;
  h->probe_read_bps = static_cast<uint64_t>(probe.read_gbps * 1e9);
  h->probe_write_bps = static_cast<uint64_t>(probe.write_gbps * 1e9);
  h->probe_unix_ns = realtime_ns();
  h->checksum = cxlkv_tier_header_checksum(h);
  SsdIo io;
  io.op = IoOp::kWrite;
  io.offset = 0;
  io.buf = buf.data();
  io.length = static_cast<uint32_t>(l.header_bytes);
  int r = dev.run({&io, 1});
  if (r) return Error(r, "SSD device " + dev.path() + ": writing the header failed: " + std::strerror(-r));
  return {};
}

}  // namespace cxlkv::tier
