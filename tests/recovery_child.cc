// A rank of the recovery tests, started by LocalLauncher (settings from CAIRN_*).
//
//   recovery_child train LAYOUT ROWS START [LAST]
//       saves START, START+1, ... in LAYOUT (tests/recovery_state.h) with a fence and a
//       barrier per step, printing "saved <step> replicated <newest replicated step>";
//       with LAST: flushes after saving LAST, prints "committed <step>", exits 0 when the
//       flush committed LAST; without: runs until killed
//   recovery_child restore LAYOUT ROWS MIN_STEP
//       restores into LAYOUT, checks every byte and the blob, prints "restored <step> tier
//       <tier> received <bytes> pfs <job bytes read> needed <job bytes needed> resharded
//       <0|1> skipped <n>", exits 0 when all is exact and the step is at least MIN_STEP
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "api/checkpointer.h"
#include "tests/child_util.h"
#include "tests/recovery_state.h"

using namespace cairn;

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
  if (mode == "train") {
    const int64_t last = argc > 5 ? std::atoll(argv[5]) : -1;
    for (int64_t t = arg;; ++t) {
      model.Visit(held, t, false);
      auto out = c.save(t, shards, {{"who", testing::ModelState::Blob(opts.rank, t)}});
      if (!out.ok()) {
        std::fprintf(stderr, "recovery_child: %s\n", out.status().ToString().c_str());
        return 1;
      }
      Status f = c.fence();
      if (!f.ok()) std::fprintf(stderr, "recovery_child: %s\n", f.ToString().c_str());
      if (c.group()) (void)c.group()->Barrier();  // ranks advance together, as in training
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the "compute"
      std::printf("saved %lld replicated %lld\n", static_cast<long long>(t),
                  static_cast<long long>(c.stats().newest_replicated_step));
      std::fflush(stdout);
      if (t == last) {
        auto r = c.flush();
        if (!r.ok()) {
          std::fprintf(stderr, "recovery_child: %s\n", r.status().ToString().c_str());
          return 1;
        }
        std::printf("committed %lld\n", static_cast<long long>(*r));
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
    const std::string bad = model.Visit(held, r->step, true);
    if (!bad.empty()) {
      std::fprintf(stderr, "recovery_child: %s\n", bad.c_str());
      return 1;
    }
    if (r->blobs["who"] != testing::ModelState::Blob(opts.rank, r->step)) {
      std::fprintf(stderr, "recovery_child: blob '%s'\n", r->blobs["who"].c_str());
      return 1;
    }
    std::printf(
        "restored %lld tier %s received %llu pfs %llu needed %llu resharded %d skipped %zu\n",
        static_cast<long long>(r->step), r->tier.c_str(),
        static_cast<unsigned long long>(r->bytes_received),
        static_cast<unsigned long long>(r->job_pfs_bytes_read),
        static_cast<unsigned long long>(r->job_unique_bytes_needed), r->resharded ? 1 : 0,
        r->skipped.size());
    std::fflush(stdout);
    return r->step >= arg ? 0 : 1;
  }
  return 2;
}
