// bench/capture: what lazy capture costs a training loop, against a blocking copy.
//
// A synthetic training loop whose "forward/backward" is real arithmetic on a cache-sized
// working set, calibrated to about 1.5x the time one memcpy of the state takes, and whose
// "optimizer step" writes into the state. Three loops, interleaved in rounds (A B C A B C)
// so machine noise hits them alike:
//   none      no checkpoint
//   blocking  memcpy of the whole state into pre-faulted host memory at save time
//   lazy      cairn: save() after the optimizer step, fence() before the next one
// Stall is the time the training thread spends inside save() and fence() (or the
// blocking copy) per iteration. The physical reference, memcpy of the state with the same
// number of threads, is measured in the same run.
//
//   capture [--sizes 256M,1G] [--rounds 6] [--iters 4] [--threads 1] [--host-root DIR]
//
// Prints a table per size and one JSON line per size; the last line is the largest size.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "core/clock.h"
#include "core/filesystem.h"

using namespace cairn;
using cairn::bench::Buffer;
using cairn::bench::CalibrateCompute;
using cairn::bench::Compute;
using cairn::bench::Mean;
using cairn::bench::Median;
using cairn::bench::TimedMemcpy;

namespace {

struct Args {
  std::vector<uint64_t> sizes = {256ull << 20, 1ull << 30};
  int rounds = 6;
  int iters = 4;
  int threads = 1;
  std::string host_root = DefaultHostRoot();
};

// The optimizer step: writes one float in every 64 KiB of the state.
void OptimizerStep(std::vector<Buffer*>& tensors, int64_t step) {
  for (Buffer* t : tensors)
    for (size_t off = static_cast<size_t>(step % 16) * 4; off < t->size; off += 64 << 10)
      reinterpret_cast<float*>(t->p + off)[0] += 1.0f;
}

struct Result1 {
  uint64_t state_bytes;
  double memcpy_gbps, iter_none, iter_blocking, iter_lazy, stall_blocking, stall_lazy, copy_gbps;
  double stall_save, stall_fence, max_stall_lazy;
  uint64_t skipped, saves;
};

Result1 RunSize(const Args& a, uint64_t state_bytes) {
  const int kTensors = 8;
  std::vector<std::unique_ptr<Buffer>> owned;
  std::vector<Buffer*> tensors;
  std::vector<ShardSpec> shards;
  for (int i = 0; i < kTensors; ++i) {
    owned.push_back(std::make_unique<Buffer>(state_bytes / kTensors));
    tensors.push_back(owned.back().get());
    TensorMeta m{"layers." + std::to_string(i) + ".weight",
                 DType::kF32,
                 {static_cast<int64_t>(state_bytes / kTensors / 4 / 1024), 1024}};
    shards.push_back(ShardSpec::Whole(m, tensors.back()->p));
  }
  Buffer blocking_dst(state_bytes);

  // Physical reference: memcpy of the state with the same thread count (median of 5).
  std::vector<double> mc;
  for (int i = 0; i < 5; ++i) {
    double s = 0;
    size_t off = 0;
    for (Buffer* t : tensors) {
      s += TimedMemcpy(blocking_dst.p + off, t->p, t->size, a.threads);
      off += t->size;
    }
    mc.push_back(s);
  }
  const double memcpy_s = Median(mc);
  const double memcpy_gbps = static_cast<double>(state_bytes) / memcpy_s / 1e9;

  // The compute takes 1.5x the copy time.
  std::vector<float> work(64 << 10, 1.0f);
  const int64_t reps = CalibrateCompute(work, 1.5 * memcpy_s);

  Options o;
  o.job_id = "bench-capture-" + std::to_string(::getpid());
  o.host_root = a.host_root;
  o.persist_every = 0;  // this benchmark measures capture alone
  o.copy_threads = a.threads;
  o.copy_engine = CopyEngineKind::kHost;
  o.slot_bytes = state_bytes + (4 << 20);  // pre-sized and pre-faulted at open
  o.full_policy = FullPolicy::kSkip;
  auto ck = Checkpointer::Open(o);
  if (!ck.ok()) {
    std::fprintf(stderr, "capture: %s\n", ck.status().ToString().c_str());
    std::exit(1);
  }
  Checkpointer& c = **ck;
  int64_t step = 0;

  std::vector<double> it_none, it_block, it_lazy, st_block, st_lazy, st_save, st_fence;
  auto none_iter = [&] {
    const int64_t t0 = NowNanos();
    Compute(work, reps);
    OptimizerStep(tensors, ++step);
    it_none.push_back(NanosToSeconds(NowNanos() - t0));
  };
  auto blocking_iter = [&] {
    const int64_t t0 = NowNanos();
    Compute(work, reps);
    OptimizerStep(tensors, ++step);
    const int64_t s0 = NowNanos();
    size_t off = 0;
    for (Buffer* t : tensors) {
      TimedMemcpy(blocking_dst.p + off, t->p, t->size, a.threads);
      off += t->size;
    }
    const int64_t s1 = NowNanos();
    st_block.push_back(NanosToSeconds(s1 - s0));
    it_block.push_back(NanosToSeconds(s1 - t0));
  };
  bool lazy_pending = false;
  auto lazy_iter = [&](bool record) {
    const int64_t t0 = NowNanos();
    Compute(work, reps);
    const int64_t f0 = NowNanos();
    Status fs = c.fence();
    const int64_t f1 = NowNanos();
    if (!fs.ok()) std::fprintf(stderr, "capture: fence: %s\n", fs.ToString().c_str());
    OptimizerStep(tensors, ++step);
    const int64_t s0 = NowNanos();
    auto out = c.save(step, shards);
    const int64_t s1 = NowNanos();
    if (!out.ok()) std::fprintf(stderr, "capture: save: %s\n", out.status().ToString().c_str());
    lazy_pending = true;
    if (record) {
      st_lazy.push_back(NanosToSeconds((f1 - f0) + (s1 - s0)));
      st_save.push_back(NanosToSeconds(s1 - s0));
      st_fence.push_back(NanosToSeconds(f1 - f0));
      it_lazy.push_back(NanosToSeconds(s1 - t0));
    }
  };
  // Warm-up: slots, caches, thread pools.
  for (int i = 0; i < 3; ++i) lazy_iter(false);
  (void)c.wait_captured();
  const Stats warm = c.stats();
  for (int r = 0; r < a.rounds; ++r) {
    for (int i = 0; i < a.iters; ++i) none_iter();
    for (int i = 0; i < a.iters; ++i) blocking_iter();
    // The lazy loop's first iteration starts with the fence of a save from the previous
    // round: drain it first, so every recorded iteration is a steady-state one.
    (void)c.wait_captured();
    lazy_iter(false);
    for (int i = 0; i < a.iters; ++i) lazy_iter(true);
  }
  (void)c.wait_captured();
  const Stats s = c.stats();
  const std::string job_dir = JoinPath(a.host_root, o.job_id);
  ck->reset();
  (void)DefaultFileSystem()->RemoveAll(job_dir);
  ::rmdir(a.host_root.c_str());  // the root too, when this run created it and it is empty

  Result1 res;
  res.state_bytes = state_bytes;
  res.memcpy_gbps = memcpy_gbps;
  res.iter_none = Median(it_none);
  res.iter_blocking = Median(it_block);
  res.iter_lazy = Median(it_lazy);
  res.stall_blocking = Mean(st_block);
  res.stall_lazy = Mean(st_lazy);
  res.stall_save = Mean(st_save);
  res.stall_fence = Mean(st_fence);
  res.max_stall_lazy = st_lazy.empty() ? 0 : *std::max_element(st_lazy.begin(), st_lazy.end());
  const double bytes = static_cast<double>(s.capture.bytes_copied - warm.capture.bytes_copied);
  const double secs = s.capture.copy_seconds - warm.capture.copy_seconds;
  res.copy_gbps = secs > 0 ? bytes / secs / 1e9 : 0;
  res.skipped = s.save.skipped;
  res.saves = s.save.saves;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "Training-thread stall of a lazy cairn capture against a blocking copy, with the memcpy "
      "of the same bytes as the physical reference (arms alternated per round). Prints one "
      "JSON line per state size last.",
      "bench_capture");
  std::string sizes = "256M,1G";
  app.add_option("--sizes", sizes, "state sizes (K/M/G suffix, comma-separated)")
      ->capture_default_str();
  app.add_option("--rounds", a.rounds, "rounds (each runs every arm)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--iters", a.iters, "iterations per arm and round")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--threads", a.threads, "host copy threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--host-root", a.host_root, "host-tier root")->capture_default_str();
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  a.sizes = cairn::bench::ParseSizes(sizes);
  std::vector<std::string> json;
  for (uint64_t size : a.sizes) {
    Result1 r = RunSize(a, size);
    const double reduction = r.stall_lazy > 0 ? r.stall_blocking / r.stall_lazy : INFINITY;
    std::printf(
        "state %.0f MiB, %d copy thread(s), compute calibrated to 1.5x memcpy of the state\n"
        "  memcpy reference          %8.2f GB/s\n"
        "  cairn capture copy        %8.2f GB/s  (%.2f of memcpy, checksums included)\n"
        "  iteration, no checkpoint  %8.2f ms\n"
        "  iteration, blocking copy  %8.2f ms  stall %8.3f ms\n"
        "  iteration, cairn lazy     %8.2f ms  stall %8.3f ms  (%+.1f%% vs none)\n"
        "    of which in save()      %8.3f ms, in fence() %.3f ms, worst iteration %.3f ms\n"
        "  stall reduction           %8.1fx   skipped versions %llu of %llu\n\n",
        static_cast<double>(r.state_bytes) / (1 << 20), a.threads, r.memcpy_gbps, r.copy_gbps,
        r.copy_gbps / r.memcpy_gbps, r.iter_none * 1e3, r.iter_blocking * 1e3,
        r.stall_blocking * 1e3, r.iter_lazy * 1e3, r.stall_lazy * 1e3,
        (r.iter_lazy / r.iter_none - 1) * 100, r.stall_save * 1e3, r.stall_fence * 1e3,
        r.max_stall_lazy * 1e3, reduction, static_cast<unsigned long long>(r.skipped),
        static_cast<unsigned long long>(r.saves));
    using cairn::bench::Round;
    nlohmann::ordered_json j = {{"bench", "capture"},
                                {"state_bytes", r.state_bytes},
                                {"copy_threads", a.threads},
                                {"iter_ms_no_ckpt", Round(r.iter_none * 1e3, 3)},
                                {"iter_ms_blocking", Round(r.iter_blocking * 1e3, 3)},
                                {"iter_ms_lazy", Round(r.iter_lazy * 1e3, 3)},
                                {"lazy_iter_overhead", Round(r.iter_lazy / r.iter_none - 1, 4)},
                                {"stall_ms_blocking", Round(r.stall_blocking * 1e3, 3)},
                                {"stall_ms_lazy", Round(r.stall_lazy * 1e3, 4)},
                                {"stall_ms_lazy_save", Round(r.stall_save * 1e3, 4)},
                                {"stall_ms_lazy_fence", Round(r.stall_fence * 1e3, 4)},
                                {"stall_reduction", Round(reduction, 1)},
                                {"copy_gbps", Round(r.copy_gbps, 3)},
                                {"memcpy_gbps", Round(r.memcpy_gbps, 3)},
                                {"copy_vs_memcpy", Round(r.copy_gbps / r.memcpy_gbps, 3)},
                                {"skipped", r.skipped}};
    json.push_back(j.dump());
  }
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  return 0;
}
