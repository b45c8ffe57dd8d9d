#include "snapshot/worker_pool.h"

#include <sched.h>

#include "core/mutex.h"

namespace cairn {

void RunAsBatchThread() {
  sched_param sp{};
  (void)::sched_setscheduler(0, SCHED_BATCH, &sp);  // 0: this thread (Linux)
}

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : helpers_) t.join();
}

void WorkerPool::Drain() {
  for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*job_)(i);
}

void WorkerPool::HelperLoop() {
  RunAsBatchThread();
  uint64_t seen = 0;
  MutexLock lk(mu_);
  for (;;) {
    cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stop_ || (open_ && generation_ != seen); });
    if (stop_) return;
    seen = generation_;
    ++active_;
    lk.Unlock();
    Drain();
    lk.Lock();
    if (--active_ == 0) cv_.NotifyAll();
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (helpers_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  {
    MutexLock lk(mu_);
    job_ = &f;
    n_ = n;
    next_.store(0);
    ++generation_;
    open_ = true;
  }
  cv_.NotifyAll();
  Drain();
  MutexLock lk(mu_);
  open_ = false;  // late wakers must not touch `f` after we return
  cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return active_ == 0; });
  job_ = nullptr;
}

}  // namespace cairn
