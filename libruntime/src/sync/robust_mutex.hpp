// SPDX-License-Identifier: MIT
// Process-shared, robust pthread mutexes for node-local shared memory: a
// process that dies holding one is detected by the next locker (EOWNERDEAD).
#pragma once

#include <pthread.h>

#include <chrono>

#include "cxlkv/result.hpp"

namespace cxlkv::sync {

// PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST.
void robust_mutex_init(pthread_mutex_t* m);

enum class LockOutcome { acquired, owner_died };

// Lock `m`; owner_died means the previous owner died holding it: the caller
// repairs the protected state, then calls robust_mutex_consistent().
// With a deadline: -ETIMEDOUT when it passes.  `what` names the mutex in errors.
Result<LockOutcome> robust_mutex_lock(pthread_mutex_t* m, const char* what);
Result<LockOutcome> robust_mutex_lock_until(pthread_mutex_t* m,
                                            std::chrono::steady_clock::time_point deadline,
                                            const char* what);
Result<LockOutcome> robust_mutex_trylock(pthread_mutex_t* m, const char* what);  // -EBUSY if held
void robust_mutex_consistent(pthread_mutex_t* m);
void robust_mutex_unlock(pthread_mutex_t* m);

// Scoped lock for short node-local critical sections whose state tolerates
// a dead previous owner (the repair, if any, is the caller's `on_owner_died`).
class RobustLock {
 public:
  explicit RobustLock(pthread_mutex_t* m, const char* what);
  ~RobustLock();
  bool owner_died() const { return died_; }
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;

 private:
  pthread_mutex_t* m_;
  bool died_ = false;
};

}  // namespace cxlkv::sync
