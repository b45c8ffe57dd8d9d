// SetThreadPriority (core/pool.h), shared by both builds of the pool.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/pool.h"

namespace cairn {

bool SetThreadPriority(ThreadPriority p) {
  sched_param sp{};
  switch (p) {
    case ThreadPriority::kNormal:
      return true;
    case ThreadPriority::kBatch:
      return ::sched_setscheduler(0, SCHED_BATCH, &sp) == 0;  // 0: this thread (Linux)
    case ThreadPriority::kLow:
      return ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10) == 0;
    case ThreadPriority::kIdle:
      return ::sched_setscheduler(0, SCHED_IDLE, &sp) == 0;
  }
  return false;
}

ThreadPriority ToThreadPriority(BackgroundPriority p) {
  switch (p) {
    case BackgroundPriority::kLow:
      return ThreadPriority::kLow;
    case BackgroundPriority::kIdle:
      return ThreadPriority::kIdle;
    case BackgroundPriority::kNormal:
      break;
  }
  return ThreadPriority::kNormal;
}

}  // namespace cairn
