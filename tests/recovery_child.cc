// A rank of the recovery tests, started by LocalLauncher (settings from CAIRN_*).
//
//   recovery_child train LAYOUT ROWS START [LAST]
//       saves START, START+1, ... in LAYOUT (tests/recovery_state.h) with a fence and a
//       barrier per step, printing "saved <step> replicated <newest replicated step>";
//       with LAST: after saving LAST waits until it is replicated (when the job
//       replicates), flushes, prints "committed <step> plan <templated|general>" (which
//       save planner the persister used) and "staging <bytes>" (Stats'
//       replication.staging_bytes), exits 0 when the flush committed LAST; without: runs
//       until killed
//   recovery_child matrix LAYOUT ROWS LAST EVERY
//       the crash matrix's training run (tests/crash_matrix.cc; also the node-loss test):
//       saves 1..LAST like train, printing "saved <step> captured <c> replicated <r>
//       persisted <p> agreed <a>" (the newest steps Stats reports) or "skipped <step>";
//       every EVERY steps (0: never) it waits for the version to be captured and replicated
//       and prints "complete <step>" when both succeeded; a failed barrier ends the run
//       (exit 1); after LAST, flushes and prints "committed <step> plan
//       <templated|general>" and "staging <bytes>"
//   recovery_child restore LAYOUT ROWS MIN_STEP
//       restores into LAYOUT, checks every byte and the blob, prints "restored <step> tier
//       <tier> received <bytes> pfs <job bytes read> needed <job bytes needed> resharded
//       <0|1> skipped <n>", exits 0 when all is exact and the step is at least MIN_STEP
//
// With CAIRN_TEST_DEVICE=1 (CUDA builds, a device present) the shards live in device
// memory: each step's values are written on the host and copied to the device on the
// legacy default stream before save(); a restore fills device memory, which is copied back
// to the host to be checked.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cairn/checkpointer.h"
#include "tests/child_util.h"
#include "tests/recovery_state.h"

#ifdef CAIRN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace cairn;

namespace {

// The shards' device copies (CAIRN_TEST_DEVICE=1), or nothing.
class DeviceMirror {
 public:
  bool Enable(testing::ModelState::Held& held, std::vector<ShardSpec>& shards) {
#ifdef CAIRN_HAVE_CUDA
    for (size_t k = 0; k < shards.size(); ++k) {
      void* p = nullptr;
      if (cudaMalloc(&p, std::max<size_t>(held.bytes[k].size(), 1)) != cudaSuccess) return false;
      dev_.push_back(p);
      shards[k].data = p;
      shards[k].memory = MemoryKind::kDevice;
    }
    held_ = &held;
    return true;
#else
    (void)held, (void)shards;
    return false;
#endif
  }
  // Host values -> device (ordered on the legacy default stream, which fence() orders).
  bool Upload() {
#ifdef CAIRN_HAVE_CUDA
    for (size_t k = 0; held_ && k < dev_.size(); ++k)
      if (cudaMemcpy(dev_[k], held_->bytes[k].data(), held_->bytes[k].size(),
                     cudaMemcpyHostToDevice) != cudaSuccess)
        return false;
#endif
    return true;
  }
  // Device values -> host, to be checked.
  bool Download() {
#ifdef CAIRN_HAVE_CUDA
    for (size_t k = 0; held_ && k < dev_.size(); ++k)
      if (cudaMemcpy(held_->bytes[k].data(), dev_[k], held_->bytes[k].size(),
                     cudaMemcpyDeviceToHost) != cudaSuccess)
        return false;
#endif
    return true;
  }

 private:
  std::vector<void*> dev_;
  testing::ModelState::Held* held_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  const std::string mode = argv[1], layout = argv[2];
  const int64_t rows = std::atoll(argv[3]);
  const int64_t arg = std::atoll(argv[4]);
  Options opts;
  auto ck = testing::OpenFromEnvironmentOrExit("recovery_child", &opts);
  Checkpointer& c = *ck;
  testing::ModelState model(rows);
  auto boxes = model.Layout(layout, opts.rank, opts.world_size);
  if (boxes.empty()) {
    std::fprintf(stderr, "recovery_child: unknown layout %s\n", layout.c_str());
    return 2;
  }
  auto held = model.Make(boxes);
  auto shards = model.Shards(held);
  DeviceMirror device;
  const char* on_device = std::getenv("CAIRN_TEST_DEVICE");
  if (on_device && std::string(on_device) == "1" && !device.Enable(held, shards)) {
    std::fprintf(stderr, "recovery_child: CAIRN_TEST_DEVICE=1 but no CUDA device memory\n");
    return 2;
  }
  if (mode == "train" || mode == "matrix") {
    const bool matrix = mode == "matrix";
    const int64_t first = matrix ? 1 : arg;
    const int64_t last = matrix ? arg : argc > 5 ? std::atoll(argv[5]) : -1;
    const int64_t every = matrix && argc > 5 ? std::atoll(argv[5]) : 0;
    for (int64_t t = first;; ++t) {
      if (matrix && t == last && t > first) {
        // The run's last version must not be skipped for want of a free slot (under a
        // loaded machine replication, persist and the step agreement can still hold every
        // older slot; the matrix restores the last step): wait for the pipeline and for a
        // free slot as a user ending a run would, then save it.
        Status cap = c.wait_captured();
        if (cap.ok() && opts.replicas > 0) (void)c.wait_replicated(30);
        // Drains and step-agreement rounds can still hold every slot after that (a CI run
        // under load skipped the last step with all 4 slots "pinned or a version the job
        // keeps").
        Status slot = c.wait_for_slot(60);
        if (!slot.ok()) std::fprintf(stderr, "recovery_child: %s\n", slot.ToString().c_str());
      }
      model.Visit(held, t, false);
      if (!device.Upload()) {
        std::fprintf(stderr, "recovery_child: copy to the device failed\n");
        return 1;
      }
      auto out = c.save(t, shards, {{"who", testing::ModelState::Blob(opts.rank, t)}});
      if (!out.ok()) {
        std::fprintf(stderr, "recovery_child: %s\n", out.status().ToString().c_str());
        return 1;
      }
      Status f = c.fence();
      if (!f.ok()) std::fprintf(stderr, "recovery_child: %s\n", f.ToString().c_str());
      if (c.group()) {
        // Ranks advance together, as in training; in the matrix a failed collective ends
        // the run, as a dead rank ends a real job's next allreduce.
        Status b = c.group()->Barrier();
        if (!b.ok() && matrix) {
          std::fprintf(stderr, "recovery_child: %s\n", b.ToString().c_str());
          return 1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the "compute"
      const Stats s = c.stats();
      if (!matrix) {
        std::printf("saved %lld replicated %lld\n", static_cast<long long>(t),
                    static_cast<long long>(s.replication.newest_replicated_step));
      } else if (*out == SaveOutcome::kSkipped) {
        std::printf("skipped %lld\n", static_cast<long long>(t));
      } else {
        std::printf("saved %lld captured %lld replicated %lld persisted %lld agreed %lld\n",
                    static_cast<long long>(t),
                    static_cast<long long>(s.capture.newest_captured_step),
                    static_cast<long long>(s.replication.newest_replicated_step),
                    static_cast<long long>(s.persist.newest_persisted_step),
                    static_cast<long long>(s.save.agreed_step));
      }
      std::fflush(stdout);
      if (every > 0 && t % every == 0 && *out == SaveOutcome::kQueued) {
        // What a user does to know a version is safe: it is captured here and held in the
        // other node's memory.
        Status cap = c.wait_captured();
        Status rep = cap.ok() ? c.wait_replicated(30) : cap;
        if (rep.ok() && c.stats().replication.newest_replicated_step >= t) {
          std::printf("complete %lld\n", static_cast<long long>(t));
          std::fflush(stdout);
        }
      }
      if (t == last) {
        // The last version is in a partner's memory before the run ends, so a node lost
        // afterwards finds it there exactly when the placement says a copy survives.
        if (opts.replicas > 0 && !matrix) {
          Status cap = c.wait_captured();
          Status rep = cap.ok() ? c.wait_replicated(60) : cap;
          if (!rep.ok() || c.stats().replication.newest_replicated_step < last) {
            std::fprintf(stderr, "recovery_child: step %lld not replicated: %s\n",
                         static_cast<long long>(last), rep.ToString().c_str());
            return 1;
          }
        }
        auto r = c.flush();
        if (!r.ok()) {
          std::fprintf(stderr, "recovery_child: %s\n", r.status().ToString().c_str());
          return 1;
        }
        std::printf("committed %lld plan %s\n", static_cast<long long>(*r),
                    c.stats().persist.plan.starts_with("templated") ? "templated" : "general");
        std::printf("staging %llu\n",
                    static_cast<unsigned long long>(c.stats().replication.staging_bytes));
        return *r == last ? 0 : 1;
      }
    }
  }
  if (mode == "restore") {
    auto r = c.restore(shards);
    if (!r.ok()) {
      std::fprintf(stderr, "recovery_child: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (!device.Download()) {
      std::fprintf(stderr, "recovery_child: copy from the device failed\n");
      return 1;
    }
    const std::string bad = model.Visit(held, r->step, true);
    if (!bad.empty()) {
      std::fprintf(stderr, "recovery_child: %s\n", bad.c_str());
      return 1;
    }
    // This rank's own blobs, or, where the saved job had no rank of this number, rank 0's.
    if ((r->blobs_rank != opts.rank && r->blobs_rank != 0) ||
        r->blobs["who"] != testing::ModelState::Blob(r->blobs_rank, r->step)) {
      std::fprintf(stderr, "recovery_child: blob '%s' of rank %d\n", r->blobs["who"].c_str(),
                   r->blobs_rank);
      return 1;
    }
    std::printf(
        "restored %lld tier %s received %llu pfs %llu needed %llu resharded %d skipped %zu plan "
        "%s blobs %d rebuilt %lld\n",
        static_cast<long long>(r->step), r->tier.c_str(),
        static_cast<unsigned long long>(r->bytes_received),
        static_cast<unsigned long long>(r->job_pfs_bytes_read),
        static_cast<unsigned long long>(r->job_unique_bytes_needed), r->resharded ? 1 : 0,
        r->skipped.size(), r->plan.starts_with("templated") ? "alone" : "job", r->blobs_rank,
        static_cast<long long>(r->rebuilt_step));
    std::fflush(stdout);
    return r->step >= arg ? 0 : 1;
  }
  return 2;
}
