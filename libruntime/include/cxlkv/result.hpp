// SPDX-License-Identifier: MIT
// Error and Result<T>: the C++ API's error channel.  An Error carries a
// negative errno (what the C API returns) and a message that names the
// object and the cause ("pool shm:a: superblock checksum mismatch ...").
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace cxlkv {

class Error {
 public:
  Error(int neg_errno, std::string message)
      : code_(neg_errno < 0 ? neg_errno : -neg_errno), message_(std::move(message)) {}
  int code() const { return code_; }  // negative errno
  const std::string& message() const { return message_; }

 private:
  int code_;
  std::string message_;
};

// Holds a T or an Error.  Deliberately small: value(), error(), operator bool.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  Result(Error e) : v_(std::move(e)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error e) : e_(std::move(e)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return e_; }

 private:
  Error e_{0, {}};
  bool ok_ = true;
};

}  // namespace cxlkv

// Propagate an error from an expression returning Result<...>.
#define CXLKV_TRY(expr)                                  \
  do {                                                   \
    auto cxlkv_try_r_ = (expr);                          \
    if (!cxlkv_try_r_.ok()) return cxlkv_try_r_.error(); \
  } while (0)
