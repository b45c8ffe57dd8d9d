// Logger: leveled messages to stderr, prefixed with the rank they come from and the local
// wall time ("[cairn rank 3 14:02:07.512] warning: ...").
// Each Checkpointer owns one; there is no global logger.
// Thread-safety: Log() may be called from any thread (one write(2) per line).
#pragma once

#include <string>

namespace cairn {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

class Logger {
 public:
  Logger(std::string prefix, int level) : prefix_(std::move(prefix)), level_(level) {}
  bool enabled(LogLevel l) const { return static_cast<int>(l) <= level_; }
  void Log(LogLevel l, const std::string& message) const;
  void Error(const std::string& m) const { Log(LogLevel::kError, m); }
  void Warning(const std::string& m) const { Log(LogLevel::kWarning, m); }
  void Info(const std::string& m) const { Log(LogLevel::kInfo, m); }
  void Debug(const std::string& m) const { Log(LogLevel::kDebug, m); }

 private:
  std::string prefix_;
  int level_;
};

}  // namespace cairn
