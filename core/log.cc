#include "core/log.h"

#include <unistd.h>

namespace cairn {

void Logger::Log(LogLevel l, const std::string& message) const {
  if (!enabled(l)) return;
  static const char* kNames[] = {"error", "warning", "info", "debug"};
  std::string line = "[" + prefix_ + "] " + kNames[static_cast<int>(l)] + ": " + message + "\n";
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

}  // namespace cairn
