// SPDX-License-Identifier: MIT
#include "tier/fault_injector.hpp"

#include <cerrno>

namespace cxlkv {

void FaultInjector::fail(IoOp op, uint64_t offset, uint64_t length, int neg_errno) {
  std::lock_guard lk(mu_);
  rules_.push_back({op, offset, length, neg_errno < 0 ? neg_errno : -neg_errno});
}

void FaultInjector::shorten_reads(uint64_t offset, uint64_t length) {
  std::lock_guard lk(mu_);
  rules_.push_back({IoOp::kRead, offset, length, 0});
}

void FaultInjector::set_gone(bool gone) {
  std::lock_guard lk(mu_);
  gone_ = gone;
}

void FaultInjector::clear() {
  std::lock_guard lk(mu_);
  rules_.clear();
  gone_ = false;
}

FaultInjector::Verdict FaultInjector::check(IoOp op, uint64_t offset, uint64_t length) const {
  std::lock_guard lk(mu_);
  if (gone_) {
    injected_++;
    return {-ENODEV, -1};
  }
  for (const Rule& r : rules_) {
    if (r.op != op) continue;
    if (offset + length <= r.offset || r.offset + r.length <= offset) continue;
    injected_++;
    if (r.error) return {r.error, -1};
    return {0, r.offset > offset ? static_cast<int64_t>(r.offset - offset) : 0};
  }
  return {};
}

uint64_t FaultInjector::injected() const {
  std::lock_guard lk(mu_);
  return injected_;
}

}  // namespace cxlkv
