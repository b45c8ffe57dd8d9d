// Logger: leveled messages to stderr, prefixed with the rank they come from and the local
// wall time ("[cairn rank 3 14:02:07.512] warning: ...").
// Each Checkpointer owns one; there is no global logger.
// Thread-safety: Log() may be called from any thread (one write(2) per line).
#pragma once

#include <string>

#include "cairn/options.h"  // LogLevel

namespace cairn {

class Logger {
 public:
  Logger(std::string prefix, LogLevel level) : prefix_(std::move(prefix)), level_(level) {}
  bool enabled(LogLevel l) const { return l <= level_; }
  void Log(LogLevel l, const std::string& message) const;
  void Error(const std::string& m) const { Log(LogLevel::kError, m); }
  void Warning(const std::string& m) const { Log(LogLevel::kWarning, m); }
  void Info(const std::string& m) const { Log(LogLevel::kInfo, m); }
  void Debug(const std::string& m) const { Log(LogLevel::kDebug, m); }

 private:
  std::string prefix_;
  LogLevel level_;
};

}  // namespace cairn
