// WorkerPool: a fixed set of threads that run the iterations of one loop at a time.
//
// The copy engine's threads. ParallelFor runs f(0) .. f(n-1) on the pool's helper threads
// and on the calling thread, and returns when all have finished; iterations are handed out
// one at a time from a shared counter, so uneven chunks balance themselves.
// Thread-safety: one ParallelFor at a time (the capture thread); destruction joins.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace cairn {

class WorkerPool {
 public:
  // `threads` counts the caller: 1 means no helper thread.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void ParallelFor(size_t n, const std::function<void(size_t)>& f);
  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

 private:
  void HelperLoop();
  void Drain();

  Mutex mu_;
  CondVar cv_;
  std::vector<std::thread> helpers_;
  // Set under mu_ before a job opens, read by Drain() without it: no helper is inside a
  // job (active_ == 0) while they change, and opening the job publishes them.
  const std::function<void(size_t)>* job_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  uint64_t generation_ CAIRN_GUARDED_BY(mu_) = 0;
  bool open_ CAIRN_GUARDED_BY(mu_) = false;  // helpers may join the current job
  int active_ CAIRN_GUARDED_BY(mu_) = 0;     // helpers inside the current job
  bool stop_ CAIRN_GUARDED_BY(mu_) = false;
};

}  // namespace cairn
