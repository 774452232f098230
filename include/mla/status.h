// Status and StatusOr: every library call that can fail on user input returns one of these.
// The library never exits or aborts on user input.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace mla {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kUnsupported,
  kOutOfMemory,
  kOutOfWorkspace,
  kCudaError,
  kInternal,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  // A failed MLA_CHECK_ARG / MLA_CHECK_CODE: the message is the sentence users read; the
  // condition's source text is kept apart for developers (failed_check()).
  Status(StatusCode code, std::string message, std::string failed_check)
      : code_(code), message_(std::move(message)), failed_check_(std::move(failed_check)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The source text of the check that failed ("seq >= prefix"); empty when not from a check.
  const std::string& failed_check() const { return failed_check_; }
  // "InvalidArgument: seq_lens[2] = 3 is below extend_prefix_lens[2] = 5"
  std::string to_string() const;
  // Explicitly discard (for paths where an error cannot be acted on, e.g. destructors).
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string failed_check_;
};

template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::kInvalidArgument, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status unsupported(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::kUnsupported, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::kInternal, f, std::forward<Args>(args)...);
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from an OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace mla

#define MLA_STATUS_CONCAT_INNER(a, b) a##b
#define MLA_STATUS_CONCAT(a, b) MLA_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define MLA_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::mla::Status mla_status_ = (expr);        \
    if (!mla_status_.ok()) return mla_status_; \
  } while (0)

// MLA_ASSIGN_OR_RETURN(auto x, make_x()) : unwraps a StatusOr or returns its status.
#define MLA_ASSIGN_OR_RETURN(lhs, expr) \
  MLA_ASSIGN_OR_RETURN_IMPL(MLA_STATUS_CONCAT(mla_statusor_, __LINE__), lhs, expr)
#define MLA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

namespace mla::detail {
// The failure path of the check macros, out of line and marked cold so that a passing check
// costs one compare and branch at its call site (planning validates every request per batch).
template <typename... Args>
[[gnu::cold, gnu::noinline]] Status check_failed(StatusCode code, const char* cond,
                                                 fmt::format_string<Args...> format,
                                                 Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...), cond);
}
}  // namespace mla::detail

// Argument check: the message is the caller's sentence with its formatted values; the
// condition's text travels with the Status (Status::failed_check()) for developers.
//   MLA_CHECK_ARG(seq >= prefix, "seq_lens[{}] = {} < extend_prefix_lens[{}] = {}", i, seq, i, p);
#define MLA_CHECK_ARG(cond, ...)                                                                   \
  do {                                                                                             \
    if (!(cond)) [[unlikely]] {                                                                    \
      return ::mla::detail::check_failed(::mla::StatusCode::kInvalidArgument, #cond, __VA_ARGS__); \
    }                                                                                              \
  } while (0)

#define MLA_CHECK_CODE(code, cond, ...)                               \
  do {                                                                \
    if (!(cond)) [[unlikely]] {                                       \
      return ::mla::detail::check_failed((code), #cond, __VA_ARGS__); \
    }                                                                 \
  } while (0)
