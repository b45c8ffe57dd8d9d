#include "snapshot/worker_pool.h"

namespace cairn {

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : helpers_) t.join();
}

void WorkerPool::Drain() {
  for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*job_)(i);
}

void WorkerPool::HelperLoop() {
  uint64_t seen = 0;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (open_ && generation_ != seen); });
    if (stop_) return;
    seen = generation_;
    ++active_;
    lk.unlock();
    Drain();
    lk.lock();
    if (--active_ == 0) cv_.notify_all();
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (helpers_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  {
    std::lock_guard lk(mu_);
    job_ = &f;
    n_ = n;
    next_.store(0);
    ++generation_;
    open_ = true;
  }
  cv_.notify_all();
  Drain();
  std::unique_lock lk(mu_);
  open_ = false;  // late wakers must not touch `f` after we return
  cv_.wait(lk, [&] { return active_ == 0; });
  job_ = nullptr;
}

}  // namespace cairn
