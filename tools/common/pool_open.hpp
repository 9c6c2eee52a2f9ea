// SPDX-License-Identifier: MIT
// Opening a pool in a tool, its failure told once.  The runtime logs why it
// cannot open a pool (a warning: unformatted, bad magic, checksum, ...) and
// returns the same text as the error, which the tool prints as its own
// error line ("cxlkvctl: pool ...: ..."): the operator read the cause
// twice.  open_pool() holds the runtime's messages back while the pool
// opens, then logs each one as it would have been, except those that the
// returned error already says (the tool prints that, once).  Tools call it
// before they start threads (the logger's sinks are swapped meanwhile).
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cxlkv/region.hpp"
#include "util/log.hpp"

namespace cxlkv_tools {

class HeldLogMessages final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  struct Message {
    spdlog::level::level_enum level;
    std::string text;
  };
  std::vector<Message> messages;

 protected:
  void sink_it_(const spdlog::details::log_msg& m) override {
    messages.push_back({m.level, std::string(m.payload.data(), m.payload.size())});
  }
  void flush_() override {}
};

inline cxlkv::Result<std::unique_ptr<cxlkv::Region>> open_pool(const std::string& uri,
                                                               const cxlkv::OpenOptions& oo = {}) {
  spdlog::logger& lg = cxlkv::log();
  auto held = std::make_shared<HeldLogMessages>();
  const std::vector<spdlog::sink_ptr> sinks = lg.sinks();
  lg.sinks() = {held};
  auto r = cxlkv::Region::open(uri, oo);
  lg.sinks() = sinks;
  for (const auto& m : held->messages) {
    if (!r && r.error().message().find(m.text) != std::string::npos) continue;  // the tool's error line says it
    lg.log(m.level, "{}", m.text);
  }
  return r;
}

}  // namespace cxlkv_tools
