// Status and Result<T>: the error vocabulary of every cairn call.
//
// A Status is either OK or carries a code and a message that says what failed, where
// (rank, version, tensor, file) and, when it can, what the user can do. No exception
// leaves a cairn module; every fallible call returns Status or Result<T>.
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace cairn {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something wrong (shape, dtype, name, option)
  kNotFound,            // no such version, tensor or file
  kCorruption,          // bytes on a tier do not match their checksum or format
  kIOError,             // a filesystem or mapping call failed
  kNoSpace,             // ENOSPC / out of host-tier memory
  kUnavailable,         // no slot free (skip policy), peer down: retry later
  kFailedPrecondition,  // called in the wrong state (e.g. tier locked by another process)
  kInternal,            // a bug in cairn
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int error_number = 0)
      : code_(code), message_(std::move(message)), errno_(error_number) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  // Maps an errno value to a Status (ENOSPC/EDQUOT -> kNoSpace, ENOENT -> kNotFound, others
  // kIOError) that keeps it (error_number()); the message is "<what>: <strerror(err)>".
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The errno of the system call that failed (FromErrno), 0 when the error has none: for
  // callers that react to one cause (EINVAL from O_DIRECT, EEXIST) without reading text.
  int error_number() const { return errno_; }
  // "IOError: fsync /x/y: Input/output error" or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>" (OK stays OK).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int errno_ = 0;
};

// Called by Result<T>::value() on an error: prints the status and aborts. Reading the value
// of a failed call is a bug in the caller; it must not pass silently or as an exception
// that names nothing.
[[noreturn]] void DieOnBadResultAccess(const Status& status);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  // The value; on an error, aborts with the status on stderr (check ok() first).
  T& value() & {
    if (!ok()) DieOnBadResultAccess(std::get<Status>(v_));
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!ok()) DieOnBadResultAccess(std::get<Status>(v_));
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!ok()) DieOnBadResultAccess(std::get<Status>(v_));
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace cairn

#define CAIRN_CONCAT_INNER(a, b) a##b
#define CAIRN_CONCAT(a, b) CAIRN_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define CAIRN_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::cairn::Status _cairn_st = (expr);    \
    if (!_cairn_st.ok()) return _cairn_st; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define CAIRN_ASSIGN_OR_RETURN(lhs, expr) \
  CAIRN_ASSIGN_OR_RETURN_IMPL(CAIRN_CONCAT(_cairn_res_, __LINE__), lhs, expr)
#define CAIRN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
