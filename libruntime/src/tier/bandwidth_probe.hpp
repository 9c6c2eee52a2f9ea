// SPDX-License-Identifier: MIT
// The bandwidth probe and its cache in the SSD device header.  At open the
// pool reads each device's header; a valid header with a measured bandwidth
// is reused, otherwise a short probe writes and then reads back a scratch
// area (queue-depth deep, 2 MiB I/Os, O_DIRECT, so the figure is the
// device's, not the page cache's) and records the result in the header.
#pragma once

#include <cstdint>

#include "cxlkv/result.hpp"
#include "tier/ssd_device.hpp"
#include "cxlkv/format/tier_format.h"

namespace cxlkv::tier {

struct DeviceLayout {
  uint64_t header_bytes = 0;   // header I/O size: 4 KiB rounded up to the logical block
  uint64_t probe_offset = 0;
  uint64_t probe_bytes = 0;
  uint64_t data_offset = 0;
};

// Where the header, probe area and data area of `dev` go, given the probe
// size asked for; fails when the device is too small to hold any data.
Result<DeviceLayout> plan_layout(const SsdDevice& dev, uint64_t probe_bytes);

struct ProbeResult {
  double read_gbps = 0;
  double write_gbps = 0;
};

// Writes then reads the probe area; returns the measured bandwidths.
Result<ProbeResult> probe_bandwidth(SsdDevice& dev, const DeviceLayout& layout);

// Reads the header; false when it is absent, damaged or describes another geometry.
bool read_header(SsdDevice& dev, const DeviceLayout& layout, cxlkv_tier_dev_header* out);
Result<void> write_header(SsdDevice& dev, const DeviceLayout& layout, const ProbeResult& probe);

}  // namespace cxlkv::tier
