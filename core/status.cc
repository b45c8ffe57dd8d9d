#include "cairn/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cairn {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kNoSpace:
      return "NoSpace";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

Status Status::FromErrno(int err, const std::string& what) {
  std::string msg = what + ": " + std::strerror(err);
  StatusCode code = StatusCode::kIOError;
  if (err == ENOSPC || err == EDQUOT) code = StatusCode::kNoSpace;
  if (err == ENOENT) code = StatusCode::kNotFound;
  return Status(code, std::move(msg), err);
}

void DieOnBadResultAccess(const Status& status) {
  std::fprintf(stderr, "cairn: Result::value() called on an error: %s\n",
               status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_, errno_);
}

}  // namespace cairn
