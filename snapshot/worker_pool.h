// WorkerPool: a fixed set of threads that run the iterations of one loop at a time.
//
// The copy engine's threads. ParallelFor runs f(0) .. f(n-1) on the pool's helper threads
// and on the calling thread, and returns when all have finished; iterations are handed out
// one at a time from a shared counter, so uneven chunks balance themselves.
// Thread-safety: one ParallelFor at a time (the capture thread); destruction joins. The
// helpers are batch threads (RunAsBatchThread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace cairn {

// Makes the calling thread a batch thread (Linux SCHED_BATCH; best effort): it keeps its
// share of the CPU but does not preempt the thread that wakes it. The capture threads run
// so: save() wakes them, and on a machine with no idle core a woken copy thread that
// preempted the training thread would hold save() for a scheduler time slice (seen: 0.1 ms
// saves taking 0.5 to 5 ms with two ranks on two cores).
void RunAsBatchThread();

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
