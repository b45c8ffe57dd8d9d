// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with clang's
// thread-safety annotations, so that `-Wthread-safety` (the clang build in CI,
// scripts/thread_safety.sh) checks that every field marked CAIRN_GUARDED_BY(mu_) is only
// touched with mu_ held.
//
// A condition variable's predicate runs with the mutex held but the analysis cannot see
// that through std::condition_variable: write the predicate as a lambda marked
// CAIRN_REQUIRES(mu_), as in
//   cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return done_ >= seq; });
// Thread-safety: what the names say.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define CAIRN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CAIRN_THREAD_ANNOTATION(x)
#endif

#define CAIRN_CAPABILITY(x) CAIRN_THREAD_ANNOTATION(capability(x))
#define CAIRN_SCOPED_CAPABILITY CAIRN_THREAD_ANNOTATION(scoped_lockable)
#define CAIRN_GUARDED_BY(x) CAIRN_THREAD_ANNOTATION(guarded_by(x))
#define CAIRN_PT_GUARDED_BY(x) CAIRN_THREAD_ANNOTATION(pt_guarded_by(x))
#define CAIRN_REQUIRES(...) CAIRN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define CAIRN_ACQUIRE(...) CAIRN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define CAIRN_RELEASE(...) CAIRN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define CAIRN_TRY_ACQUIRE(...) CAIRN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define CAIRN_EXCLUDES(...) CAIRN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define CAIRN_NO_THREAD_SAFETY_ANALYSIS CAIRN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace cairn {

class CAIRN_CAPABILITY("mutex") Mutex {
 public:
  void lock() CAIRN_ACQUIRE() { mu_.lock(); }
  void unlock() CAIRN_RELEASE() { mu_.unlock(); }
  bool try_lock() CAIRN_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope (Unlock/Lock in between for waits outside it).
class CAIRN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) CAIRN_ACQUIRE(mu) : lk_(mu.mu_) {}
  ~MutexLock() CAIRN_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void Unlock() CAIRN_RELEASE() { lk_.unlock(); }
  void Lock() CAIRN_ACQUIRE() { lk_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lk_;
};

class CondVar {
 public:
  // Waits for a notification (or a spurious wake-up): re-check the condition after it.
  void Wait(MutexLock& lk) { cv_.wait(lk.lk_); }
  // As Wait(lk), at most `timeout`.
  template <typename Rep, typename Period>
  void WaitFor(MutexLock& lk, std::chrono::duration<Rep, Period> timeout) {
    cv_.wait_for(lk.lk_, timeout);
  }
  // Waits until pred() (called with the lock held) is true.
  template <typename Pred>
  void Wait(MutexLock& lk, Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(lk.lk_, pred);
  }
  // As Wait, at most `timeout`; returns pred().
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(MutexLock& lk, std::chrono::duration<Rep, Period> timeout,
               Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lk.lk_, timeout, pred);
  }
  template <typename Clock, typename Duration, typename Pred>
  bool WaitUntil(MutexLock& lk, std::chrono::time_point<Clock, Duration> deadline,
                 Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_until(lk.lk_, deadline, pred);
  }
  void NotifyAll() { cv_.notify_all(); }
  void NotifyOne() { cv_.notify_one(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cairn
