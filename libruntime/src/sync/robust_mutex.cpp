// SPDX-License-Identifier: MIT
#include "sync/robust_mutex.hpp"

#include <time.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "util/log.hpp"

namespace cxlkv::sync {

void robust_mutex_init(pthread_mutex_t* m) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
}

namespace {
Result<LockOutcome> outcome(int rc, const char* what, const char* op) {
  if (rc == 0) return LockOutcome::acquired;
  if (rc == EOWNERDEAD) return LockOutcome::owner_died;
  if (rc == ETIMEDOUT) return Error(-ETIMEDOUT, std::string(what) + ": timed out waiting for the node-local lock");
  if (rc == EBUSY) return Error(-EBUSY, std::string(what) + ": held");
  return Error(-rc, std::string(what) + ": " + op + " failed: " + std::strerror(rc));
}
}  // namespace

Result<LockOutcome> robust_mutex_lock(pthread_mutex_t* m, const char* what) {
  return outcome(pthread_mutex_lock(m), what, "pthread_mutex_lock");
}

Result<LockOutcome> robust_mutex_lock_until(pthread_mutex_t* m,
                                            std::chrono::steady_clock::time_point deadline,
                                            const char* what) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  if (ns < 0) ns = 0;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // steady_clock is CLOCK_MONOTONIC on Linux/glibc.
  return outcome(pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts), what, "pthread_mutex_clocklock");
}

Result<LockOutcome> robust_mutex_trylock(pthread_mutex_t* m, const char* what) {
  return outcome(pthread_mutex_trylock(m), what, "pthread_mutex_trylock");
}

void robust_mutex_consistent(pthread_mutex_t* m) { pthread_mutex_consistent(m); }
void robust_mutex_unlock(pthread_mutex_t* m) { pthread_mutex_unlock(m); }

RobustLock::RobustLock(pthread_mutex_t* m, const char* what) : m_(m) {
  auto r = robust_mutex_lock(m, what);
  if (!r.ok()) {
    // Only EINVAL/ENOTRECOVERABLE reach here: node-local memory is corrupt.
    log().critical("{}", r.error().message());
    std::abort();
  }
  if (r.value() == LockOutcome::owner_died) {
    died_ = true;
    log().warn("{}: previous owner died holding it; continuing", what);
    pthread_mutex_consistent(m);
  }
}

RobustLock::~RobustLock() { pthread_mutex_unlock(m_); }

}  // namespace cxlkv::sync
