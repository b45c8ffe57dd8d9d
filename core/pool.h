// Pool and TaskGroup: the one way cairn runs work in parallel.
//
// Every parallel part of cairn runs on a Pool: the copy engine's copy and checksum
// workers (snapshot/), the persist writers (persist/writer.cc), the PFS readers of a
// restore (recovery/pfs_run_reader.cc) and the checksum verification of incoming replicas
// (transport/replicator.cc). A Pool is a named set of threads of one CPU priority, sized
// by the setting of its user (copy_threads, persist_threads, ...); it runs jobs in the
// order they were queued:
//   - ParallelFor(n, f): f(0) .. f(n-1) on the pool's threads and the calling thread,
//     handed out one at a time so uneven iterations balance; returns when all have run.
//   - TaskGroup::Run(task): one task on the pool's threads; TaskGroup::Wait() returns
//     when every task of the group has run.
// Several callers may use one pool at once (their jobs queue). A task may block (the
// replica verifier waits for nothing, but a PFS read does I/O): the pool's threads are its
// own, so blocking one delays only the pool's later jobs.
//
// Why not oneTBB, which the design first named (docs/architecture.md, "One pool"): its
// worker threads are shared by every arena of the process, so the drain's lower CPU
// priority (nice 10, applied per thread) would stay on a shared worker after it left the
// drain (an unprivileged thread cannot lower its nice value again), or the drain would
// lose its priority; and blocking reads and writes on its workers, whose number is the
// core count, hold back every other arena.
//
// Thread-safety: every member may be called from any thread; a Pool must outlive the jobs
// queued on it (TaskGroup and ParallelFor wait for theirs).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "cairn/options.h"

namespace cairn {

// A thread's CPU priority (Linux scheduling policy and nice value are per thread).
enum class ThreadPriority {
  kNormal,
  // SCHED_BATCH: keeps its share of the CPU but does not preempt the thread that wakes it.
  // The capture threads run so: save() wakes them, and on a machine with no idle core a
  // woken copy thread that preempted the training thread would hold save() for a
  // scheduler time slice (seen: 0.1 ms saves taking 0.5 to 5 ms, 2 ranks on 2 cores).
  kBatch,
  kLow,   // nice 10 (the PFS drain's default)
  kIdle,  // SCHED_IDLE: only CPU time no other thread wants
};

// Gives the calling thread `p` (best effort). False when the system refused (for example
// a container that forbids SCHED_IDLE); the thread then keeps its priority.
bool SetThreadPriority(ThreadPriority p);
// The thread priority of a background stage's setting (CAIRN_PERSIST_PRIORITY,
// CAIRN_REPLICATE_PRIORITY).
ThreadPriority ToThreadPriority(BackgroundPriority p);

class Pool {
 public:
  // Starts `threads` threads (0: every job runs on its caller), named `name` (at most 15
  // characters are kept) and running at `priority`.
  Pool(std::string name, int threads, ThreadPriority priority = ThreadPriority::kNormal);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Runs f(0) .. f(n-1), each once, on the pool's threads and the caller; returns when all
  // have returned.
  void ParallelFor(size_t n, const std::function<void(size_t)>& f);
  // The pool's threads (not counting a caller).
  int threads() const;

  struct Impl;  // core/pool.cc (core/pool_tbb.cc in the oneTBB comparison build)

 private:
  friend class TaskGroup;
  std::unique_ptr<Impl> impl_;
};

// Tasks run on a pool, waited for together. The destructor waits.
class TaskGroup {
 public:
  // With a null pool or one without threads, Run runs the task at once on the caller.
  explicit TaskGroup(Pool* pool);
  ~TaskGroup();
  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;

  void Run(std::function<void()> task);
  // Returns when every task run so far has returned.
  void Wait();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
