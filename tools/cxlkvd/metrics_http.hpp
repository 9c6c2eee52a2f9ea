// SPDX-License-Identifier: MIT
// cxlkvd's metrics endpoint: Prometheus text exposition over HTTP/1.1
// (libmicrohttpd, one polling thread), on loopback by default.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace cxlkvd {

inline constexpr const char* kDefaultMetricsListen = "127.0.0.1:9731";

// Where to listen: "ADDR:PORT" ("127.0.0.1:9731", "[::1]:9731", port 0: any
// free port) or "none".
struct ListenSpec {
  bool enabled = true;
  std::string host;  // numeric address
  uint16_t port = 0;
};
// Parses --metrics-listen; false with *err naming the problem.
bool parse_listen(const std::string& s, ListenSpec* out, std::string* err);

class MetricsServer {
 public:
  // `exposition` returns the whole text of one scrape; it is called on the
  // server's thread, one scrape at a time.
  static std::unique_ptr<MetricsServer> start(const ListenSpec& where, std::function<std::string()> exposition,
                                              std::string* err);
  ~MetricsServer();
  uint16_t port() const { return port_; }  // the bound port (useful with port 0)
  std::string url() const;

  struct Impl;

 private:
  MetricsServer() = default;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::string host_;
};

}  // namespace cxlkvd
