// Clock helpers: monotonic time for measuring, wall time for headers.
#pragma once

#include <chrono>
#include <cstdint>

namespace cairn {

// Monotonic nanoseconds (steady_clock).
inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// Wall-clock nanoseconds since the Unix epoch (for ages shown to users).
inline int64_t WallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
inline double NanosToSeconds(int64_t ns) {
  return static_cast<double>(ns) * 1e-9;
}

}  // namespace cairn
