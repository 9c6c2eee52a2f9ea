// SPDX-License-Identifier: MIT
// ssd / tier: reading cold 2 MiB blocks from SSD pool devices.
//
//   ssd.uring_direct_read_gbps   SsdDevice: io_uring, O_DIRECT, registered
//                                buffers and file, queue depth 32, one worker
//   ssd.buffered_pread_gbps      the same file read with pread() through the
//                                file system and page cache (caches dropped;
//                                one thread, 2 MiB calls, kernel readahead)
//   ssd.fio_read_gbps            fio (Debian's /usr/bin/fio) on the same file:
//                                io_uring, direct, bs 2M, iodepth 32 -- the
//                                device's practical limit
//   tier.device{0,1}_read_gbps   SsdPool reads of the blocks on one device alone
//   tier.aggregate_read_gbps     SsdPool reads of the blocks on both devices at
//                                once (grouped per device, issued in parallel)
//   tier.device_sum_gbps         device0 + device1, the aggregate's target base
//
// Data is cold for every figure: caches are dropped before each pass
// (/proc/sys/vm/drop_caches as root, posix_fadvise(DONTNEED) otherwise);
// the direct-I/O paths never populate the page cache anyway.  Files live in
// CXLKV_BENCH_SSD_DIR (default $CXLKV_BUILD/bench/ssd, a disk file system;
// O_DIRECT does not work on every tmpfs); each is CXLKV_BENCH_SSD_MIB MiB
// (default 1024, times CXLKV_BENCH_SCALE) and is removed afterwards.
// Note: two files on one disk share that disk's bandwidth; the aggregate only
// adds up when the two devices are distinct SSDs.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench.hpp"
#include "cxlkv/tier.hpp"
#include "tier/ssd_device.hpp"

namespace {

using namespace cxlkv;
using tier::AlignedBuffer;
using tier::SsdDevice;
using tier::SsdIo;

constexpr uint32_t kBlock = 2u << 20;  // 2 MiB, one Llama-3.1-8B 16-token KV block
constexpr uint32_t kQueueDepth = 32;
constexpr uint32_t kBuffers = 64;      // reused round robin: what is read is not looked at

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string bench_dir() {
  if (const char* d = std::getenv("CXLKV_BENCH_SSD_DIR")) return d;
  const char* b = std::getenv("CXLKV_BUILD");
  return std::string(b ? b : "build") + "/bench/ssd";
}

uint64_t file_bytes() {
  const char* m = std::getenv("CXLKV_BENCH_SSD_MIB");
  double mib = m ? std::atof(m) : 1024.0;
  uint64_t bytes = static_cast<uint64_t>(mib * bench::scale()) << 20;
  return std::max<uint64_t>(bytes / kBlock * kBlock, 128ull << 20);
}

// Cold data: the page cache is emptied (root) or this file's pages are dropped.
void drop_caches(const std::vector<std::string>& files) {
  sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    bool ok = std::fputs("3\n", f) >= 0;
    if (std::fclose(f) == 0 && ok) return;
  }
  for (const auto& p : files) {
    int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Fills `path` with `bytes` of data through O_DIRECT writes (so it is not
// cached and no block is a hole).
bool write_file(SsdDevice& dev, AlignedBuffer& bufs, uint64_t bytes) {
  std::vector<SsdIo> ios;
  for (uint64_t off = 0; off < bytes; off += kBlock) {
    SsdIo io;
    io.op = IoOp::kWrite;
    io.offset = off;
    io.buf = bufs.data() + (off / kBlock % kBuffers) * kBlock;
    io.length = kBlock;
    ios.push_back(io);
  }
  return dev.run(ios) == 0;
}

double uring_read_gbps(SsdDevice& dev, AlignedBuffer& bufs, uint64_t bytes) {
  std::vector<SsdIo> ios;
  for (uint64_t off = 0; off < bytes; off += kBlock) {
    SsdIo io;
    io.op = IoOp::kRead;
    io.offset = off;
    io.buf = bufs.data() + (off / kBlock % kBuffers) * kBlock;
    io.length = kBlock;
    ios.push_back(io);
  }
  double t0 = now_s();
  int r = dev.run(ios);  // the worker keeps kQueueDepth in flight
  double t = now_s() - t0;
  if (r) {
    std::fprintf(stderr, "bench ssd: uring read failed: %s\n", std::strerror(-r));
    return 0;
  }
  return static_cast<double>(bytes) / t / 1e9;
}

double buffered_pread_gbps(const std::string& path, uint64_t bytes) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  std::vector<char> buf(kBlock);
  double t0 = now_s();
  uint64_t got = 0;
  while (got < bytes) {
    ssize_t n = pread(fd, buf.data(), kBlock, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<uint64_t>(n);
  }
  double t = now_s() - t0;
  ::close(fd);
  return static_cast<double>(got) / t / 1e9;
}

// fio's read bandwidth from its JSON output (jobs[0].read.bw_bytes), or 0.
double fio_read_gbps(const std::string& path, uint64_t bytes) {
  if (access("/usr/bin/fio", X_OK) != 0) {
    std::fprintf(stderr, "bench ssd: /usr/bin/fio not found; ssd.fio_read_gbps not measured\n");
    return 0;
  }
  std::string cmd = "/usr/bin/fio --name=cxlkv-ssd --filename='" + path +
                    "' --rw=read --bs=2M --iodepth=32 --direct=1 --ioengine=io_uring --size=" +
                    std::to_string(bytes) + " --output-format=json 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return 0;
  std::string out;
  char b[4096];
  size_t n;
  while ((n = std::fread(b, 1, sizeof b, f)) > 0) out.append(b, n);
  if (pclose(f) != 0) {
    std::fprintf(stderr, "bench ssd: fio failed\n");
    return 0;
  }
  size_t rd = out.find("\"read\"");
  size_t bw = rd == std::string::npos ? rd : out.find("\"bw_bytes\"", rd);
  if (bw == std::string::npos) return 0;
  size_t colon = out.find(':', bw);
  return colon == std::string::npos ? 0 : std::strtod(out.c_str() + colon + 1, nullptr) / 1e9;
}

// Reads `which` blocks through the pool in one batch; GB/s.
double pool_read_gbps(SsdPool& pool, const std::vector<TierLocation>& loc, AlignedBuffer& bufs,
                      const std::vector<size_t>& which) {
  std::vector<SsdRead> reads;
  for (size_t k = 0; k < which.size(); k++)
    reads.push_back({loc[which[k]], bufs.data() + (k % kBuffers) * kBlock});
  std::vector<int> st(reads.size());
  double t0 = now_s();
  pool.read_blocks(reads, st);
  double t = now_s() - t0;
  for (int s : st)
    if (s) {
      std::fprintf(stderr, "bench tier: read failed: %s\n", std::strerror(-s));
      return 0;
    }
  return static_cast<double>(which.size()) * kBlock / t / 1e9;
}

void run_ssd(bench::Results& res) {
  std::string dir = bench_dir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const uint64_t bytes = file_bytes();
  const std::string f0 = dir + "/ssd0.img";
  std::fprintf(stderr, "bench ssd: %s, %llu MiB per file, 2 MiB blocks, queue depth %u\n", dir.c_str(),
               static_cast<unsigned long long>(bytes >> 20), kQueueDepth);

  AlignedBuffer bufs(uint64_t(kBuffers) * kBlock);
  for (size_t i = 0; i < bufs.size(); i += 8) std::memcpy(bufs.data() + i, &i, 8);

  // --- one device: uring vs buffered vs fio, all on f0 ---
  {
    tier::SsdDeviceOptions o;
    o.path = f0;
    o.create_bytes = bytes;
    o.queue_depth = kQueueDepth;
    o.registered_memory = {bufs.span()};
    auto dev = SsdDevice::open(o);
    if (!dev) {
      std::fprintf(stderr, "bench ssd: %s; skipped\n", dev.error().message().c_str());
      return;
    }
    if (!write_file(**dev, bufs, bytes)) {
      std::fprintf(stderr, "bench ssd: cannot write %s; skipped\n", f0.c_str());
      return;
    }
    // uring and fio alternate over three passes (the disk below may cache
    // what was read last); each figure is its median pass.
    std::vector<double> u, fo;
    for (int pass = 0; pass < 3; pass++) {
      drop_caches({f0});
      u.push_back(uring_read_gbps(**dev, bufs, bytes));
      drop_caches({f0});
      fo.push_back(fio_read_gbps(f0, bytes));
    }
    std::sort(u.begin(), u.end());
    std::sort(fo.begin(), fo.end());
    double uring = u[1], fio = fo[1];
    std::fprintf(stderr, "bench ssd: passes uring %.2f %.2f %.2f, fio %.2f %.2f %.2f GB/s\n", u[0], u[1], u[2], fo[0],
                 fo[1], fo[2]);
    drop_caches({f0});
    double buffered = buffered_pread_gbps(f0, bytes);
    res.set("ssd.uring_direct_read_gbps", uring);
    res.set("ssd.buffered_pread_gbps", buffered);
    if (fio > 0) {
      res.set("ssd.fio_read_gbps", fio);
      res.set("ssd.uring_vs_fio", uring / fio);
    }
    std::fprintf(stderr, "bench ssd: uring %.2f GB/s, buffered pread %.2f GB/s, fio %.2f GB/s; uring/fio %.2f (target >= 0.9)\n",
                 uring, buffered, fio, fio > 0 ? uring / fio : 0.0);
  }
  std::filesystem::remove(f0, ec);
}

// Two devices through the pool.
void run_tier(bench::Results& res) {
  std::string dir = bench_dir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const uint64_t bytes = file_bytes();
  const std::string t0 = dir + "/tier0.img", t1 = dir + "/tier1.img";
  AlignedBuffer bufs(uint64_t(kBuffers) * kBlock);
  for (size_t i = 0; i < bufs.size(); i += 8) std::memcpy(bufs.data() + i, &i, 8);
  {
    SsdPoolOptions o;
    o.queue_depth = kQueueDepth;
    o.registered_memory = {bufs.span()};
    o.devices.resize(2);
    o.devices[0].path = t0;
    o.devices[1].path = t1;
    o.devices[0].create_bytes = o.devices[1].create_bytes = bytes;
    auto pool = SsdPool::open(o);
    if (!pool) {
      std::fprintf(stderr, "bench tier: %s; skipped\n", pool.error().message().c_str());
      return;
    }
    SsdPool& p = **pool;
    uint64_t per_dev = std::min(p.device_info(0).data_bytes, p.device_info(1).data_bytes) / kBlock;
    size_t n = static_cast<size_t>(per_dev * 2 * 9 / 10);
    // Write in batches of kBuffers blocks (layer-wise batches, as an offload would).
    std::vector<TierLocation> loc(n);
    std::vector<int> st(n);
    for (size_t first = 0; first < n; first += kBuffers) {
      size_t cnt = std::min<size_t>(kBuffers, n - first);
      std::vector<SsdWrite> w;
      for (size_t k = 0; k < cnt; k++) w.push_back({bufs.data() + k * kBlock, kBlock});
      p.write_blocks(w, std::span(loc).subspan(first, cnt), std::span(st).subspan(first, cnt));
    }
    std::vector<size_t> on0, on1, all;
    for (size_t i = 0; i < n; i++) {
      if (st[i]) continue;
      (loc[i].device == 0 ? on0 : on1).push_back(i);
      all.push_back(i);
    }
    std::fprintf(stderr, "bench tier: probe %.2f / %.2f GB/s -> p = %.2f / %.2f; %zu + %zu blocks\n",
                 p.device_info(0).bandwidth_gbps, p.device_info(1).bandwidth_gbps, p.device_info(0).placement_ratio,
                 p.device_info(1).placement_ratio, on0.size(), on1.size());
    drop_caches({t0, t1});
    double d0 = pool_read_gbps(p, loc, bufs, on0);
    drop_caches({t0, t1});
    double d1 = pool_read_gbps(p, loc, bufs, on1);
    drop_caches({t0, t1});
    double agg = pool_read_gbps(p, loc, bufs, all);
    res.set("tier.device0_read_gbps", d0);
    res.set("tier.device1_read_gbps", d1);
    res.set("tier.device_sum_gbps", d0 + d1);
    res.set("tier.aggregate_read_gbps", agg);
    if (d0 + d1 > 0) res.set("tier.aggregate_vs_sum", agg / (d0 + d1));
    std::fprintf(stderr,
                 "bench tier: device0 %.2f + device1 %.2f = %.2f GB/s; both at once %.2f GB/s (%.2f of the sum, "
                 "target >= 0.85; both files are on %s's file system)\n",
                 d0, d1, d0 + d1, agg, d0 + d1 > 0 ? agg / (d0 + d1) : 0.0, dir.c_str());
  }
  std::filesystem::remove(t0, ec);
  std::filesystem::remove(t1, ec);
}

}  // namespace

CXLKV_BENCH({"ssd", "cold 2 MiB reads at queue depth 32 from one file: io_uring+O_DIRECT vs buffered pread vs fio",
             run_ssd});
CXLKV_BENCH({"tier", "cold 2 MiB reads through SsdPool: two devices at once vs each alone", run_tier});
