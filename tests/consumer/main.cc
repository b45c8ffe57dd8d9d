// A user's program, built against the installed include/cairn/ and libcairn.so alone: the
// three-line use of the README, then a restore whose bytes must equal the saved ones.
// Usage: consumer <host_root> <pfs_root> <job_id>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cairn/cairn.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: consumer HOST_ROOT PFS_ROOT JOB\n");
    return 2;
  }
  cairn::Options o;
  o.host_root = argv[1];
  o.pfs_root = argv[2];
  o.job_id = argv[3];
  o.persist_every = 0;
  auto opened = cairn::Checkpointer::Open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  auto& ckpt = opened.value();
  std::vector<float> w(1000);
  std::iota(w.begin(), w.end(), 1.0f);
  const cairn::ShardSpec shard =
      cairn::ShardSpec::Whole({"w", cairn::DType::kF32, {10, 100}}, w.data());
  for (int64_t step = 1; step <= 3; ++step) {
    w[0] = static_cast<float>(step);
    if (auto s = ckpt->save(step, {&shard, 1}); !s.ok()) {
      std::fprintf(stderr, "save: %s\n", s.status().ToString().c_str());
      return 1;
    }
    if (auto st = ckpt->fence(); !st.ok()) {
      std::fprintf(stderr, "fence: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  if (auto st = ckpt->wait_captured(); !st.ok()) return 1;
  std::vector<float> back(1000, -1.0f);
  cairn::ShardSpec target = shard;
  target.data = back.data();
  auto rep = ckpt->restore({&target, 1});
  if (!rep.ok()) {
    std::fprintf(stderr, "restore: %s\n", rep.status().ToString().c_str());
    return 1;
  }
  if (rep->step != 3 || back != w) {
    std::fprintf(stderr, "restored step %lld differs from what was saved\n",
                 static_cast<long long>(rep->step));
    return 1;
  }
  const cairn::Stats s = ckpt->stats();
  std::printf("consumer: restored step %lld (%llu versions captured)\n",
              static_cast<long long>(rep->step),
              static_cast<unsigned long long>(s.capture.captured));
  return 0;
}
