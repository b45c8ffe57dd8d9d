// The process the crash test kills: checkpoints a deterministic state every iteration and
// reports on stdout the newest step it knows is CAPTURED.
//
//   crash_child HOST_ROOT JOB STATE_BYTES
//
// Every byte of step t's state is a function of t (FillPattern seeds), so the parent can
// check any restored version bit for bit.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cairn/checkpointer.h"
#include "tests/crash_state.h"

using namespace cairn;

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  Options o;
  o.host_root = argv[1];
  o.job_id = argv[2];
  o.chunk_bytes = 64 << 10;  // many chunks: kills land mid-copy often
  o.persist_every = 0;       // this child tests the host tier alone
  o.log_level = LogLevel::kError;
  o.copy_engine = CopyEngineKind::kHost;
  auto ckpt = Checkpointer::Open(o);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "crash_child: %s\n", ckpt.status().ToString().c_str());
    return 1;
  }
  Checkpointer& c = **ckpt;
  testing::CrashState s(std::strtoull(argv[3], nullptr, 10));
  int64_t reported = -1;
  // Resume after the newest version a previous child left, as a training job would.
  auto v = c.versions();
  int64_t t = v.empty() ? 1 : v.front().step + 1;
  for (;; ++t) {
    if (!c.fence().ok()) return 1;
    s.Fill(t);
    auto out = c.save(t, s.Shards(), {{"step", std::to_string(t)}});
    if (!out.ok()) return 1;
    const int64_t captured = c.stats().capture.newest_captured_step;
    if (captured > reported) {
      reported = captured;
      std::printf("captured %lld\n", static_cast<long long>(captured));
      std::fflush(stdout);
    }
  }
}
