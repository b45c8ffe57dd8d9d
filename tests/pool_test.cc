// core/pool.h: every iteration and task runs exactly once, ParallelFor and TaskGroup::Wait
// return only after theirs have, callers share a pool without waiting for each other's
// jobs, and the pool's threads run at the priority asked for.
#include "core/pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace cairn {
namespace {

TEST(Pool, ParallelForRunsEveryIterationOnceAndReturnsAfterTheLast) {
  for (int threads : {0, 1, 3}) {
    Pool pool("test", threads);
    for (int round = 0; round < 300; ++round) {
      const size_t n = static_cast<size_t>(round % 37);
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](size_t i) {
        if (i == 0 && round % 50 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << round;
    }
  }
}

TEST(Pool, CallersShareAPoolAndEachWaitsForItsOwnIterationsOnly) {
  Pool pool("test", 2);
  std::atomic<bool> release{false};
  std::atomic<int> slow_done{0};
  // A caller whose job holds a pool thread until released ...
  std::thread slow([&] {
    pool.ParallelFor(2, [&](size_t) {
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++slow_done;
    });
  });
  // ... does not keep another caller's job from finishing (its caller runs it).
  std::vector<std::atomic<int>> hits(100);
  for (int round = 0; round < 20; ++round)
    pool.ParallelFor(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
  for (auto& h : hits) EXPECT_EQ(h.load(), 20);
  EXPECT_EQ(slow_done.load(), 0);
  release = true;
  slow.join();
  EXPECT_EQ(slow_done.load(), 2);
}

TEST(TaskGroup, WaitReturnsOnceEveryTaskRanAndGroupsAreIndependent) {
  for (int threads : {0, 1, 4}) {
    Pool pool("test", threads);
    std::atomic<int> a{0}, b{0};
    TaskGroup ga(&pool);
    {
      TaskGroup gb(&pool);
      for (int i = 0; i < 500; ++i) {
        ga.Run([&] { ++a; });
        gb.Run([&] {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
          ++b;
        });
      }
      gb.Wait();
      EXPECT_EQ(b.load(), 500) << threads;
      for (int i = 0; i < 100; ++i) gb.Run([&] { ++b; });
    }  // the destructor waits
    EXPECT_EQ(b.load(), 600) << threads;
    ga.Wait();
    EXPECT_EQ(a.load(), 500) << threads;
  }
}

// A task's captures are destroyed before Wait() returns and outside the pool's lock: a
// capture whose destructor uses the same pool (the last reference to an object that
// queues work on it) must not deadlock.
TEST(TaskGroup, ATaskCaptureWhoseDestructorUsesThePoolDoesNotDeadlock) {
  Pool pool("test", 2);
  struct UsesPoolWhenDestroyed {
    Pool* pool;
    std::atomic<int>* ran;
    ~UsesPoolWhenDestroyed() {
      pool->ParallelFor(2, [&](size_t) { ran->fetch_add(1); });
    }
  };
  std::atomic<int> ran{0};
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread watchdog([finished] {  // a deadlock cannot be unwound: report it and end
    for (int i = 0; i < 300 && !finished->load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!finished->load()) {
      std::fprintf(stderr, "deadlock: a task's capture destroyed under the pool's lock\n");
      std::_Exit(1);
    }
  });
  {
    TaskGroup g(&pool);
    for (int i = 0; i < 50; ++i) {
      auto obj = std::make_shared<UsesPoolWhenDestroyed>(&pool, &ran);
      g.Run([obj = std::move(obj)] {});
    }
    g.Wait();
    EXPECT_EQ(ran.load(), 100);  // every destructor ran before Wait() returned
  }
  finished->store(true);
  watchdog.join();
}

TEST(TaskGroup, ANullPoolRunsTasksOnTheCaller) {
  TaskGroup g(nullptr);
  const auto me = std::this_thread::get_id();
  bool ran = false;
  g.Run([&] { ran = std::this_thread::get_id() == me; });
  g.Wait();
  EXPECT_TRUE(ran);
}

TEST(Pool, ThreadsRunAtTheirPriorityAndTheCallerKeepsItsOwn) {
  const int mine = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  Pool low("test-low", 2, ThreadPriority::kLow);
  std::atomic<int> seen{-100};
  TaskGroup g(&low);
  g.Run([&] { seen = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())); });
  g.Wait();
  // kLow is nice 10 (as the drain always was); a caller already above it may not lower it.
  if (mine <= 10) {
    EXPECT_EQ(seen.load(), 10);
  }
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())), mine);
}

}  // namespace
}  // namespace cairn
