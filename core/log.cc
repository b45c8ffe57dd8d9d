#include "core/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace cairn {

void Logger::Log(LogLevel l, const std::string& message) const {
  if (!enabled(l)) return;
  static const char* kNames[] = {"error", "warning", "info", "debug"};
  // Local wall time to the millisecond: lines of different ranks and nodes line up.
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  tm local{};
  ::localtime_r(&tv.tv_sec, &local);
  char when[32];
  std::snprintf(when, sizeof when, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<int>(tv.tv_usec / 1000));
  std::string line =
      "[" + prefix_ + " " + when + "] " + kNames[static_cast<int>(l)] + ": " + message + "\n";
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

}  // namespace cairn
