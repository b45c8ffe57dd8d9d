// core/pool.h on oneTBB: the comparison build only (cmake -DCAIRN_POOL=tbb; scripts/pool_ab.sh
// measures it against core/pool.cc). A Pool is a task arena of threads + 1 slots, one kept
// for the calling thread, at low arena priority for a low or idle pool; TBB's worker
// threads are shared by every arena, so a pool's CPU priority is not applied to them (see
// core/pool.h for why that rules oneTBB out for the drain). The process's worker count is
// raised so the arenas together can have as many threads as the pools they stand for.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include <utility>

#include "core/pool.h"

namespace cairn {

namespace {
tbb::global_control& Workers() {
  static tbb::global_control c(tbb::global_control::max_allowed_parallelism, 64);
  return c;
}
}  // namespace

struct Pool::Impl {
  Impl(int threads, ThreadPriority priority)
      : n(threads),
        arena(threads + 1, 1,
              priority == ThreadPriority::kLow || priority == ThreadPriority::kIdle
                  ? tbb::task_arena::priority::low
                  : tbb::task_arena::priority::normal) {}
  int n;
  tbb::task_arena arena;
};

Pool::Pool(std::string name, int threads, ThreadPriority priority)
    : impl_(std::make_unique<Impl>(threads, priority)) {
  (void)name;
  (void)Workers();
}

Pool::~Pool() = default;

int Pool::threads() const {
  return impl_->n;
}

void Pool::ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (impl_->n == 0 || n <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  impl_->arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, n, 1),
        [&](const tbb::blocked_range<size_t>& r) {
          for (size_t i = r.begin(); i != r.end(); ++i) f(i);
        },
        tbb::simple_partitioner());
  });
}

struct TaskGroup::Impl {
  Pool::Impl* pool = nullptr;
  tbb::task_group group;
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
  impl_->pool->arena.execute([&] { impl_->group.run(std::move(task)); });
}

void TaskGroup::Wait() {
  if (impl_->pool == nullptr) return;
  impl_->pool->arena.execute([&] { impl_->group.wait(); });
}

}  // namespace cairn
