// SPDX-License-Identifier: MIT
// cxlkvd: the lock manager daemon of one pool (DESIGN.md "Cross-host
// locking").  Exactly one runs per pool: the manager lease in the control
// carve makes a second one refuse while the first is alive and take over
// once its lease has expired (--wait keeps trying instead of exiting).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cxlkv/metrics.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "metrics_http.hpp"
#include "pool_fault.hpp"
#include "pool_open.hpp"
#include "kv/index_service.hpp"
#include "cxlkv/version.h"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true); }

// Strict unsigned parse: decimal digits only, no wrap-around; exits 2 with
// a message naming the option otherwise.
uint64_t number(const char* opt, const char* v, uint64_t max, uint64_t min = 0) {
  const std::string s = v;
  errno = 0;
  unsigned long long n = 0;
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) n = std::strtoull(v, nullptr, 10);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
    std::fprintf(stderr, "cxlkvd: %s: '%s' is not a number\n", opt, v);
    std::exit(2);
  }
  if (errno == ERANGE || n > max || n < min) {
    if (min)
      std::fprintf(stderr, "cxlkvd: %s: %s is out of range (%llu..%llu)\n", opt, v,
                   static_cast<unsigned long long>(min), static_cast<unsigned long long>(max));
    else
      std::fprintf(stderr, "cxlkvd: %s: %s is out of range (at most %llu)\n", opt, v,
                   static_cast<unsigned long long>(max));
    std::exit(2);
  }
  return n;
}

void usage() {
  std::printf(
      "usage: cxlkvd --pool URI [--node N] [--lease-ms MS] [--max-sleep-us US] [--wait] [--foreground]\n"
      "              [--metrics-listen ADDR:PORT|none] [--index-service]\n\n"
      "Runs the lock manager of a cxlkv pool: grants the global tier of every\n"
      "cross-host lock, round-robin among waiting nodes.  One manager per pool:\n"
      "a second cxlkvd refuses (exit 3) while the first renews its lease, and\n"
      "takes over once the lease has not been renewed for --lease-ms.\n\n"
      "  --pool URI          shm:NAME:SIZE | file:PATH | dax:/dev/daxX.Y | dev:/dev/cxlkvN\n"
      "                      (default: $CXLKV_POOL)\n"
      "  --node N            this host's node id, recorded in the lease (default 0)\n"
      "  --lease-ms MS       lease duration (20..3600000, default 2000)\n"
      "  --max-sleep-us US   idle polling sleeps at most this long (default 200)\n"
      "  --wait              wait for the lease instead of exiting when it is held\n"
      "  --foreground        stay in the foreground (default: daemonize)\n"
      "  --metrics-listen ADDR:PORT|none\n"
      "                      serve the pool's Prometheus metrics at http://ADDR:PORT/metrics\n"
      "                      (default %s; port 0: any free port; none: no endpoint)\n"
      "  --index-service     also own the prefix index and serve its batched calls over the\n"
      "                      shared-memory RPC (the pool needs an 'rpc.index' carve)\n"
      "  -h, --help          this text\n"
      "  --version           print the version\n\n"
      "SIGTERM / SIGINT: stop granting, free the lease, exit 0.\n",
      cxlkvd::kDefaultMetricsListen);
}

// Daemon mode.  The command forks the daemon before it takes the lease (the
// lease names the daemon's pid) and waits until the daemon serves: exit 0
// then, or the daemon's own exit status, its messages on this same stderr.
// (daemon(3) returned at once: a setup error after it -- an index service
// without its carve, a metrics port in use -- left exit status 0, nothing
// printed and no daemon.)  Returns the daemon's end of the ready pipe, in
// the daemon; -1 with errno when the fork failed.
int start_daemon() {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    close(p[1]);
    char c;
    ssize_t n;
    do n = read(p[0], &c, 1);
    while (n < 0 && errno == EINTR);
    if (n == 1) _exit(0);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
  }
  close(p[0]);
  setsid();
  if (chdir("/") != 0) {
  }
  if (int null = open("/dev/null", O_RDWR); null >= 0) {
    dup2(null, 0);
    close(null);
  }
  return p[1];
}

// The daemon serves: the command exits 0; stdout and stderr go to /dev/null.
void daemon_ready(int fd) {
  if (int null = open("/dev/null", O_RDWR); null >= 0) {
    dup2(null, 1);
    dup2(null, 2);
    close(null);
  }
  const char ok = 0;
  ssize_t w = write(fd, &ok, 1);
  (void)w;
  close(fd);
}

// The metrics endpoint: the pool's whole exposition (cxlkv/metrics.hpp)
// plus this lock manager's counters.  A busy default port is a warning
// (several pools' daemons on one host); a port given explicitly must work.
std::unique_ptr<cxlkvd::MetricsServer> start_metrics(const cxlkvd::ListenSpec& at, bool explicit_,
                                                     cxlkv::Region& region, cxlkv::LockManager& mgr) {
  if (!at.enabled) return nullptr;
  std::string err;
  auto srv = cxlkvd::MetricsServer::start(
      at,
      [&region, &mgr] {
        return cxlkv::prometheus_region_exposition(region) + cxlkv::prometheus_manager_exposition(mgr.stats());
      },
      &err);
  if (!srv) {
    std::fprintf(stderr, "cxlkvd: %s%s\n", err.c_str(),
                 explicit_ ? "" : " (running without a metrics endpoint; --metrics-listen ADDR:PORT picks another)");
    return nullptr;
  }
  std::fprintf(stderr, "cxlkvd: metrics at %s\n", srv->url().c_str());
  return srv;
}

}  // namespace

int main(int argc, char** argv) {
  std::string pool = std::getenv("CXLKV_POOL") ? std::getenv("CXLKV_POOL") : "";
  cxlkv::LockManagerOptions mo;
  bool foreground = false;
  bool index_service = false;
  std::string metrics_listen = cxlkvd::kDefaultMetricsListen;
  bool metrics_explicit = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cxlkvd: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else if (a == "--version") {
      std::printf("cxlkvd (cxlkv) %s\n", CXLKV_VERSION);
      return 0;
    } else if (a == "--pool") {
      pool = next("--pool");
    } else if (a == "--node") {
      mo.node = static_cast<uint32_t>(number("--node", next("--node"), CXLKV_MAX_NODES - 1));
    } else if (a == "--lease-ms") {
      // A usage error naming the option, as for any other number (not the
      // library's refusal of the lease at create, exit 1).
      mo.lease_ms = static_cast<uint32_t>(
          number("--lease-ms", next("--lease-ms"), 3600000, cxlkv::LockManagerOptions::kMinLeaseMs));
    } else if (a == "--max-sleep-us") {
      mo.poll.max_sleep = std::chrono::microseconds(number("--max-sleep-us", next("--max-sleep-us"), 1000000));
    } else if (a == "--wait") {
      mo.wait_for_lease = true;
    } else if (a == "--metrics-listen") {
      metrics_listen = next("--metrics-listen");
      metrics_explicit = true;
    } else if (a == "--index-service") {
      index_service = true;
    } else if (a == "--foreground" || a == "-f") {
      foreground = true;
    } else {
      std::fprintf(stderr, "cxlkvd: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (pool.empty()) {
    std::fprintf(stderr, "cxlkvd: no pool: pass --pool URI or set CXLKV_POOL\n");
    return 2;
  }
  cxlkvd::ListenSpec metrics_at;
  if (std::string err; !cxlkvd::parse_listen(metrics_listen, &metrics_at, &err)) {
    std::fprintf(stderr, "cxlkvd: --metrics-listen %s\n", err.c_str());
    return 2;
  }
  // The lock manager touches the control carve only: no need to fault the
  // whole pool in (OpenOptions::prefault).
  cxlkv::OpenOptions oo;
  oo.prefault = false;
  auto region = cxlkv_tools::open_pool(pool, oo);  // its failure printed once (below)
  if (!region) {
    std::fprintf(stderr, "cxlkvd: %s\n", region.error().message().c_str());
    return 1;
  }
  cxlkv_tools::report_pool_faults("cxlkvd", pool, region.value()->base(), region.value()->size());
  if (mo.node >= region.value()->max_nodes()) {
    std::fprintf(stderr, "cxlkvd: --node %u: pool %s has nodes 0..%u only\n", mo.node, pool.c_str(),
                 region.value()->max_nodes() - 1);
    return 2;
  }
  // Node-local files of pools that no longer exist (docs/operations.md "Clean-up"; leaks).
  {
    std::array<uint8_t, 16> id{};
    std::memcpy(id.data(), region.value()->superblock().pool_id, 16);
    for (const auto& g : cxlkv::gc_node_local({id}, false))
      if (g.removed) std::fprintf(stderr, "cxlkvd: removed stale node-local file /dev/shm/%s\n", g.name.c_str());
  }
  int ready_fd = -1;
  if (!foreground && (ready_fd = start_daemon()) < 0) {
    std::fprintf(stderr, "cxlkvd: daemon: %s\n", std::strerror(errno));
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // --wait: the library's own wait (LockManagerOptions::wait_for_lease)
  // cannot be interrupted, so a standby manager ignored SIGTERM.  Instead
  // each try watches the lease once (it returns -EBUSY after seeing the
  // holder renew, at most --lease-ms) and the stop flag is checked between
  // tries: a standby exits 0 within one try (docs/operations.md "Bad
  // input, damage and interruptions").
  const bool wait = mo.wait_for_lease;
  mo.wait_for_lease = false;
  auto mgr = cxlkv::LockManager::create(*region.value(), mo);
  while (wait && !mgr && mgr.error().code() == -EBUSY && !g_stop.load())
    mgr = cxlkv::LockManager::create(*region.value(), mo);
  if (!mgr && wait && g_stop.load()) {
    std::fprintf(stderr, "cxlkvd: stopped while waiting for the lock manager lease of %s\n", pool.c_str());
    return 0;
  }
  if (!mgr) {
    std::fprintf(stderr, "cxlkvd: %s\n", mgr.error().message().c_str());
    return mgr.error().code() == -EBUSY ? 3 : 1;
  }
  // In the daemon: the endpoint's thread must live in the final process.
  auto metrics = start_metrics(metrics_at, metrics_explicit, *region.value(), *mgr.value());
  if (metrics_explicit && metrics_at.enabled && !metrics) {
    mgr.value()->release_lease();
    return 1;
  }
  // The index service runs beside the lock manager (its stripe
  // locks are granted by the manager of this very process).
  std::unique_ptr<cxlkv::IndexServiceHost> index_svc;
  if (index_service) {
    mgr.value()->start();
    auto h = cxlkv::IndexServiceHost::start(*region.value(), mo.node);
    mgr.value()->stop();
    if (!h) {
      std::fprintf(stderr, "cxlkvd: index service: %s\n", h.error().message().c_str());
      mgr.value()->release_lease();
      return 1;
    }
    index_svc = std::move(h.value());
    std::fprintf(stderr, "cxlkvd: serving the prefix index of %s (rpc epoch %u)\n", pool.c_str(),
                 index_svc->service().server().epoch());
  }
  std::fprintf(stderr, "cxlkvd: managing locks of %s (epoch %lu)\n", pool.c_str(),
               static_cast<unsigned long>(mgr.value()->stats().epoch));
  if (ready_fd >= 0) daemon_ready(ready_fd);
  auto r = mgr.value()->run(g_stop);
  mgr.value()->release_lease();
  if (!r) {
    std::fprintf(stderr, "cxlkvd: %s\n", r.error().message().c_str());
    return 1;
  }
  auto st = mgr.value()->stats();
  std::fprintf(stderr, "cxlkvd: stopped (%lu grants, %lu rounds)\n", static_cast<unsigned long>(st.grants),
               static_cast<unsigned long>(st.rounds));
  return 0;
}
