// Tracing: Chrome trace-event spans (open in Perfetto or chrome://tracing).
//
// Off unless CAIRN_TRACE names a file: then every span (save, fence wait, capture copy,
// replicate push, persist round, restore and its phases) is recorded in memory and the
// Checkpointer writes them when it is destroyed, to that file (one rank) or to
// "<file>.rank-<r>.json" (several ranks); `cairn trace-merge OUT FILES...` joins the ranks'
// files into one. A span costs one relaxed atomic load while tracing is off.
// Thread-safety: spans may be recorded from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.h"

namespace cairn {

class Trace {
 public:
  // Starts recording for this process; `pid` is the rank shown in the viewer.
  static void Enable(int pid);
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  // Records a complete span [start_ns, end_ns) on the monotonic clock.
  static void Record(const char* name, const char* category, int64_t start_ns, int64_t end_ns);
  // Writes every span recorded so far as {"traceEvents": [...]} to `path` (atomically).
  static Status Write(const std::string& path);
  // The file a rank writes for CAIRN_TRACE=`path`.
  static std::string RankPath(const std::string& path, int rank, int world_size);
  // Joins trace files (each {"traceEvents": [...]}) into one at `out`.
  static Status Merge(const std::string& out, const std::vector<std::string>& inputs);

 private:
  static std::atomic<bool> enabled_;
};

// Records the span from its construction to its destruction.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_ = 0;
};

}  // namespace cairn
