#include "core/pool.h"

#include <pthread.h>

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace cairn {

namespace {

struct Group {
  size_t pending = 0;  // tasks queued or running (under the pool's mutex)
};

// n iterations of one function: a ParallelFor, or one task of a group.
struct Job {
  std::function<void(size_t)> fn;
  size_t n = 0;
  size_t next = 0;  // the next iteration to hand out (under the pool's mutex)
  size_t done = 0;  // iterations that returned (under the pool's mutex)
  Group* group = nullptr;
};

}  // namespace

// The pool's threads take the oldest job's next iteration; a ParallelFor's caller takes
// its own job's. One mutex guards the queue and the counts (an iteration is a chunk of
// megabytes, a read or a write: the lock is not what limits them).
struct Pool::Impl {
  explicit Impl(std::string n) : name(std::move(n)) {}

  void Loop(ThreadPriority priority) {
    (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    (void)SetThreadPriority(priority);
    MutexLock lk(mu);
    for (;;) {
      work.Wait(lk, [&]() CAIRN_REQUIRES(mu) { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopped, and nothing is left
      std::shared_ptr<Job> job = queue.front();
      const size_t i = job->next++;
      if (job->next == job->n) queue.pop_front();  // every iteration is handed out
      lk.Unlock();
      job->fn(i);
      // A task's captures die here, not under mu: their destructors may use the pool.
      if (job->n == 1) job->fn = nullptr;
      lk.Lock();
      Done(*job);
    }
  }

  // Counts an iteration of `job` that returned.
  void Done(Job& job) CAIRN_REQUIRES(mu) {
    if (++job.done < job.n) return;
    if (job.group != nullptr) --job.group->pending;
    done.NotifyAll();
  }

  void Push(const std::shared_ptr<Job>& job) {
    {
      MutexLock lk(mu);
      queue.push_back(job);
      if (job->group != nullptr) ++job->group->pending;
    }
    if (job->n == 1)
      work.NotifyOne();
    else
      work.NotifyAll();
  }

  const std::string name;
  Mutex mu;
  CondVar work;  // a job was queued, or the pool stops
  CondVar done;  // a job finished
  std::deque<std::shared_ptr<Job>> queue CAIRN_GUARDED_BY(mu);
  bool stop CAIRN_GUARDED_BY(mu) = false;
  std::vector<std::thread> threads;
};

Pool::Pool(std::string name, int threads, ThreadPriority priority)
    : impl_(std::make_unique<Impl>(std::move(name))) {
  for (int i = 0; i < threads; ++i)
    impl_->threads.emplace_back([this, priority] { impl_->Loop(priority); });
}

Pool::~Pool() {
  {
    MutexLock lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->work.NotifyAll();
  for (auto& t : impl_->threads) t.join();
}

int Pool::threads() const {
  return static_cast<int>(impl_->threads.size());
}

void Pool::ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (impl_->threads.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  Impl& p = *impl_;
  auto job = std::make_shared<Job>();
  job->fn = [&f](size_t i) { f(i); };  // f outlives the job's iterations: we wait below
  job->n = n;
  p.Push(job);
  MutexLock lk(p.mu);
  // Help with this job only: another caller's may take longer than ours.
  while (job->next < job->n) {
    const size_t i = job->next++;
    if (job->next == job->n) std::erase(p.queue, job);
    lk.Unlock();
    job->fn(i);
    lk.Lock();
    p.Done(*job);
  }
  p.done.Wait(lk, [&]() CAIRN_REQUIRES(p.mu) { return job->done == job->n; });
}

struct TaskGroup::Impl {
  Pool::Impl* pool = nullptr;  // null: tasks run on the caller
  Group group;
};

TaskGroup::TaskGroup(Pool* pool) : impl_(std::make_unique<Impl>()) {
  if (pool != nullptr && pool->threads() > 0) impl_->pool = pool->impl_.get();
}

TaskGroup::~TaskGroup() {
  Wait();
}

void TaskGroup::Run(std::function<void()> task) {
  if (impl_->pool == nullptr) {
    task();
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = [t = std::move(task)](size_t) { t(); };
  job->n = 1;
  job->group = &impl_->group;
  impl_->pool->Push(job);
}

void TaskGroup::Wait() {
  Pool::Impl* p = impl_->pool;
  if (p == nullptr) return;
  MutexLock lk(p->mu);
  p->done.Wait(lk, [&]() CAIRN_REQUIRES(p->mu) { return impl_->group.pending == 0; });
}

}  // namespace cairn
