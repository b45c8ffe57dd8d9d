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

#include "api/checkpointer.h"
#include "tests/test_util.h"

using namespace cairn;

namespace {

struct ChildState {
  explicit ChildState(size_t bytes) : a(bytes / 2), b(bytes / 8), c(bytes / 16 + 13) {}
  std::vector<uint8_t> a;
  std::vector<float> b;
  std::vector<double> c;

  void Fill(int64_t t) {
    testing::FillPattern(a.data(), a.size(), static_cast<uint64_t>(t) * 3 + 1);
    testing::FillPattern(b.data(), b.size() * 4, static_cast<uint64_t>(t) * 3 + 2);
    testing::FillPattern(c.data(), c.size() * 8, static_cast<uint64_t>(t) * 3 + 3);
  }
  std::vector<ShardSpec> Shards() {
    std::vector<ShardSpec> s;
    s.push_back(ShardSpec::Whole({"a", DType::kU8, {static_cast<int64_t>(a.size())}}, a.data()));
    // b as rows [4, 4 + n/64) of a (n/64 + 8) x 64 matrix.
    ShardSpec bs;
    bs.meta = {"b", DType::kF32, {static_cast<int64_t>(b.size() / 64 + 8), 64}};
    bs.box = Box{{4, 0}, {static_cast<int64_t>(b.size() / 64), 64}};
    bs.data = b.data();
    s.push_back(bs);
    // c as a flat range of a larger 3-d tensor.
    const int64_t n = static_cast<int64_t>(c.size());
    auto f = ShardSpec::FromFlatRange({"c", DType::kF64, {3, 7, n / 7 + 1}}, 5, 5 + n, c.data());
    for (auto& x : *f) s.push_back(x);
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  Options o;
  o.host_root = argv[1];
  o.job_id = argv[2];
  o.chunk_bytes = 64 << 10;  // many chunks: kills land mid-copy often
  o.log_level = 0;
  o.copy_engine = CopyEngineKind::kHost;
  auto ckpt = Checkpointer::Open(o);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "crash_child: %s\n", ckpt.status().ToString().c_str());
    return 1;
  }
  Checkpointer& c = **ckpt;
  ChildState s(std::strtoull(argv[3], nullptr, 10));
  int64_t reported = -1;
  // Resume after the newest version a previous child left, as a training job would.
  auto v = c.versions();
  int64_t t = v.empty() ? 1 : v.front().step + 1;
  for (;; ++t) {
    if (!c.fence().ok()) return 1;
    s.Fill(t);
    auto out = c.save(t, s.Shards(), {{"step", std::to_string(t)}});
    if (!out.ok()) return 1;
    const int64_t captured = c.stats().newest_captured_step;
    if (captured > reported) {
      reported = captured;
      std::printf("captured %lld\n", static_cast<long long>(captured));
      std::fflush(stdout);
    }
  }
}
