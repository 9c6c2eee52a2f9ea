// SPDX-License-Identifier: MIT
// cxlkvd's metrics endpoint over libmicrohttpd (Debian libmicrohttpd-dev):
// the HTTP parsing, limits and error replies are the library's; this file
// only routes GET /metrics to the exposition.  One internal polling thread
// serves every connection (concurrent scrapes interleave on it, one
// exposition is built at a time); requests are bounded by the per-connection
// memory limit, connections by count and idle timeout.  At the count, a new
// connection closes the one idle the longest (docs/operations.md "Metrics"): idle
// connections held open (64 of them refused every scrape until they timed
// out) cannot keep a scraper out.
#include "metrics_http.hpp"

#include <arpa/inet.h>
#ifdef CXLKV_HAVE_MHD
#include <microhttpd.h>
#endif
#include <netinet/in.h>
#include <sys/socket.h>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>

namespace cxlkvd {

bool parse_listen(const std::string& s, ListenSpec* out, std::string* err) {
  ListenSpec l;
  if (s == "none") {
    l.enabled = false;
    *out = l;
    return true;
  }
  std::string host, port;
  if (!s.empty() && s[0] == '[') {  // [v6]:port
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      *err = "'" + s + "': expected [IPv6]:PORT";
      return false;
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos || s.find(':') != colon) {
      *err = "'" + s + "': expected ADDR:PORT (e.g. 127.0.0.1:9731, [::1]:9731) or none";
      return false;
    }
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::strtoul(port.c_str(), nullptr, 10) > 65535) {
    *err = "'" + s + "': port must be a number 0..65535";
    return false;
  }
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, host.c_str(), &a4) != 1 && inet_pton(AF_INET6, host.c_str(), &a6) != 1) {
    *err = "'" + s + "': '" + host + "' is not a numeric IPv4 or IPv6 address";
    return false;
  }
  l.host = host;
  l.port = static_cast<uint16_t>(std::strtoul(port.c_str(), nullptr, 10));
  *out = l;
  return true;
}

#ifdef CXLKV_HAVE_MHD
// One open connection, as the notify callback and on_request see it.
struct OpenConnection {
  int fd = -1;
  std::chrono::steady_clock::time_point active;  // accepted, or its last request
  bool closing = false;                          // shut down to make room
};

struct MetricsServer::Impl {
  MHD_Daemon* daemon = nullptr;
  std::function<std::string()> exposition;
  // Touched by the library's one polling thread only (the notify and
  // request callbacks): no lock.
  std::list<OpenConnection> open;
  ~Impl() {
    if (daemon) MHD_stop_daemon(daemon);
  }
};

namespace {

constexpr size_t kConnectionMemory = 32 << 10;  // request line + headers of one request
constexpr unsigned kMaxConnections = 64;        // open at once; a new one closes the longest idle
constexpr unsigned kSpareConnections = 8;       // the library's limit is above ours by this much
constexpr unsigned kIdleTimeoutS = 10;

// A connection opened or closed.  Past kMaxConnections, the one without a
// request for the longest time is shut down (the library then sees the
// socket end and closes it): a scrape always gets in.
void on_connection(void* cls, MHD_Connection* c, void** socket_context, MHD_ConnectionNotificationCode code) {
  auto* impl = static_cast<MetricsServer::Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    if (*socket_context) {
      for (auto it = impl->open.begin(); it != impl->open.end(); ++it)
        if (&*it == *socket_context) {
          impl->open.erase(it);
          break;
        }
      *socket_context = nullptr;
    }
    return;
  }
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  impl->open.push_back(OpenConnection{info ? int(info->connect_fd) : -1, std::chrono::steady_clock::now(), false});
  *socket_context = &impl->open.back();
  unsigned live = 0;
  for (const auto& o : impl->open) live += !o.closing;
  while (live > kMaxConnections) {
    OpenConnection* oldest = nullptr;
    for (auto& o : impl->open)
      if (!o.closing && o.fd >= 0 && &o != &impl->open.back() && (!oldest || o.active < oldest->active)) oldest = &o;
    if (!oldest) break;
    ::shutdown(oldest->fd, SHUT_RDWR);
    oldest->closing = true;
    live--;
  }
}

void log_mhd(void*, const char* fmt, va_list ap) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = std::strlen(buf);
  while (n && buf[n - 1] == '\n') buf[--n] = '\0';
  std::fprintf(stderr, "cxlkvd: metrics http: %s\n", buf);
}

MHD_Result reply(MHD_Connection* c, unsigned status, const std::string& body, const char* type,
                 const char* allow = nullptr) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method, const char*,
                      const char*, size_t* upload_size, void** state) {
  auto* impl = static_cast<MetricsServer::Impl*>(cls);
  if (const MHD_ConnectionInfo* ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
      ci && ci->socket_context)
    static_cast<OpenConnection*>(ci->socket_context)->active = std::chrono::steady_clock::now();
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0;
  const bool head = std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!get && !head) {
    // Answered at once, before any body: the library then closes the
    // connection instead of reading an upload nobody wants.
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "cxlkvd: only GET and HEAD\n", "text/plain; charset=utf-8",
                 "GET, HEAD");
  }
  if (*state == nullptr) {  // first call: headers only; answer on the next
    static int seen;
    *state = &seen;
    return MHD_YES;
  }
  if (*upload_size) {  // a GET with a body: not ours to read
    *upload_size = 0;
    return MHD_YES;
  }
  if (std::strcmp(url, "/metrics") == 0)
    return reply(c, MHD_HTTP_OK, impl->exposition(), "text/plain; version=0.0.4; charset=utf-8");
  if (std::strcmp(url, "/") == 0)
    return reply(c, MHD_HTTP_OK,
                 "<html><head><title>cxlkvd</title></head><body><h1>cxlkvd</h1>"
                 "<p><a href=\"/metrics\">/metrics</a>: Prometheus text exposition of this pool.</p></body></html>\n",
                 "text/html; charset=utf-8");
  return reply(c, MHD_HTTP_NOT_FOUND, "cxlkvd: no such page (the metrics are at /metrics)\n",
               "text/plain; charset=utf-8");
}

}  // namespace

std::unique_ptr<MetricsServer> MetricsServer::start(const ListenSpec& where, std::function<std::string()> exposition,
                                                    std::string* err) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->exposition = std::move(exposition);
  s->host_ = where.host;
  sockaddr_storage ss{};
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
  if (inet_pton(AF_INET6, where.host.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(where.port);
    flags |= MHD_USE_IPv6;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(where.port);
    if (inet_pton(AF_INET, where.host.c_str(), &a->sin_addr) != 1) {
      *err = "metrics endpoint: '" + where.host + "' is not a numeric address";
      return nullptr;
    }
  }
  errno = 0;
  s->impl_->daemon = MHD_start_daemon(
      flags, where.port, nullptr, nullptr, &on_request, s->impl_.get(), MHD_OPTION_EXTERNAL_LOGGER, &log_mhd,
      nullptr, MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&ss), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      kConnectionMemory, MHD_OPTION_CONNECTION_LIMIT, kMaxConnections + kSpareConnections,
      MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeoutS, MHD_OPTION_NOTIFY_CONNECTION, &on_connection, s->impl_.get(),
      MHD_OPTION_END);
  if (!s->impl_->daemon) {
    const int e = errno;
    *err = "metrics endpoint: cannot listen on " + where.host + ":" + std::to_string(where.port) +
           (e ? std::string(": ") + std::strerror(e) : std::string());
    return nullptr;
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(s->impl_->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port_ = info ? info->port : where.port;
  return s;
}

#else  // no libmicrohttpd at build time

struct MetricsServer::Impl {};

std::unique_ptr<MetricsServer> MetricsServer::start(const ListenSpec&, std::function<std::string()>,
                                                    std::string* err) {
  *err = "metrics endpoint: this cxlkvd was built without libmicrohttpd (apt-get install libmicrohttpd-dev, rebuild)";
  return nullptr;
}

#endif

MetricsServer::~MetricsServer() = default;

std::string MetricsServer::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_) + "/metrics";
}

}  // namespace cxlkvd
