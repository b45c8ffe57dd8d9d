// bench/compare: the training loop's stall per iteration with a checkpoint every iteration,
// three ways, in one run on the same state and the same compute:
//   sync      write the state to the filesystem and fsync it, then go on (what torch.save
//             and DeepSpeed's default checkpointing do)
//   snapshot  copy the state to host memory (blocking), then write that copy in a
//             background thread; the next checkpoint first waits for the previous write
//             (CheckFreq, torch async_save, NVIDIA's async checkpointing)
//   cairn     save() after the optimizer step, fence() before the next one; the copy runs
//             while compute runs, every 10th version is drained to the filesystem in the
//             background (CAIRN_PERSIST_EVERY=10)
// One rank (replication needs a second node: not measured here). The compute per iteration
// is real arithmetic calibrated to 1.5x the memcpy time of the state; the physical
// references (memcpy of the state, raw write + fsync of it) are measured in the same run.
//
//   compare [--bytes 1G] [--iters 8] [--dir /var/tmp] [--out .]
//
// Writes <out>/compare.json, <out>/compare.md (a table) and <out>/compare.svg (stall per
// iteration, log scale). Last line: one JSON object with stall_ms_sync, stall_ms_snapshot,
// stall_ms_cairn, cairn_vs_sync and cairn_vs_snapshot (stall reductions).
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/checkpointer.h"
#include "bench/bench_util.h"
#include "core/filesystem.h"

using namespace cairn;
using cairn::bench::Buffer;
using cairn::bench::Median;
using cairn::bench::RawWrite;

namespace {

constexpr int kTensors = 8;

struct State : cairn::bench::TensorState {
  explicit State(uint64_t bytes) : TensorState(bytes, kTensors) {}
  void Touch(int64_t step) { TensorState::Touch(step, 4096); }  // every page changes
};

void Write(const std::string& path, const std::string& text) {
  if (!WriteFileAtomic(DefaultFileSystem(), path, text).ok()) {
    std::fprintf(stderr, "compare: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 1ull << 30;
  int iters = 8;
  std::string dir = "/var/tmp", out = ".";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (k == "--bytes" && v) {
      auto b = ParseByteCount(argv[++i], "--bytes");
      if (!b.ok()) {
        std::fprintf(stderr, "%s\n", b.status().message().c_str());
        return 2;
      }
      bytes = *b;
    } else if (k == "--iters" && v) {
      iters = std::atoi(argv[++i]);
    } else if (k == "--dir" && v) {
      dir = argv[++i];
    } else if (k == "--out" && v) {
      out = argv[++i];
    } else {
      std::printf(
          "usage: compare [--bytes 1G] [--iters 8] [--dir /var/tmp] [--out .]\n"
          "Stall per iteration of a training loop that checkpoints every iteration: sync\n"
          "write+fsync to --dir, snapshot-then-background-write, and cairn. Writes\n"
          "compare.json, compare.md and compare.svg to --out. Prints one JSON line last.\n");
      return k == "--help" || k == "-h" ? 0 : 2;
    }
  }
  if (iters < 2 || bytes < (kTensors << 12)) {
    std::fprintf(stderr, "compare: --iters must be >= 2 and --bytes >= 32K\n");
    return 2;
  }
  bytes = bytes / (kTensors * 4096) * (kTensors * 4096);
  char tmpl[] = "/dev/shm/cairn-bench-compare-XXXXXX";
  std::string pfs_t = dir + "/cairn-bench-compare-XXXXXX";
  if (!::mkdtemp(tmpl) || !::mkdtemp(pfs_t.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string host_root = tmpl, pfs = pfs_t;
  State s(bytes);
  Buffer snap(bytes);
  // Physical references and the compute.
  std::vector<double> mc, raw;
  for (int i = 0; i < 3; ++i) {
    double t = 0;
    uint64_t off = 0;
    for (auto& b : s.bufs) {
      t += cairn::bench::TimedMemcpy(snap.p + off, b->p, b->size, 1);
      off += b->size;
    }
    mc.push_back(t);
  }
  raw.push_back(RawWrite(pfs + "/raw.bin", s.Parts(), false));
  std::vector<float> work(64 << 10, 1.0f);
  const int64_t reps = cairn::bench::CalibrateCompute(work, 1.5 * Median(mc));

  // sync
  std::vector<double> sync_ms;
  for (int it = 0; it <= iters; ++it) {
    cairn::bench::Compute(work, reps);
    s.Touch(it);
    const double t = RawWrite(pfs + "/sync.bin", s.Parts(), false);
    if (it > 0) sync_ms.push_back(t * 1e3);
  }
  raw.push_back(RawWrite(pfs + "/raw.bin", s.Parts(), false));
  // snapshot-then-persist
  std::vector<double> snap_ms;
  std::thread writer;
  for (int it = 0; it <= iters; ++it) {
    cairn::bench::Compute(work, reps);
    s.Touch(it);
    const int64_t t0 = NowNanos();
    if (writer.joinable()) writer.join();  // the previous write still holds the copy
    uint64_t off = 0;
    for (auto& b : s.bufs) {
      std::memcpy(snap.p + off, b->p, b->size);
      off += b->size;
    }
    const double t = NanosToSeconds(NowNanos() - t0);
    writer = std::thread([&] { RawWrite(pfs + "/snapshot.bin", {{snap.p, bytes}}, false); });
    if (it > 0) snap_ms.push_back(t * 1e3);
  }
  if (writer.joinable()) writer.join();
  // cairn
  std::vector<double> cairn_ms;
  uint64_t skipped = 0, persisted = 0;
  {
    Options o;
    o.job_id = "compare-" + std::to_string(::getpid());
    o.host_root = host_root;
    o.pfs_root = pfs;
    o.copy_engine = CopyEngineKind::kHost;
    o.slots = 3;
    o.slot_bytes = bytes + (4 << 20);
    o.persist_every = 10;
    auto c = Checkpointer::Open(o);
    if (!c.ok()) {
      std::fprintf(stderr, "compare: %s\n", c.status().ToString().c_str());
      return 1;
    }
    for (int it = 0; it <= iters + 2; ++it) {  // 2 more: the first sizes the slots
      cairn::bench::Compute(work, reps);
      int64_t t0 = NowNanos();
      Status f = (*c)->fence();
      double t = NanosToSeconds(NowNanos() - t0);
      if (!f.ok()) std::fprintf(stderr, "compare: %s\n", f.ToString().c_str());
      s.Touch(it);
      t0 = NowNanos();
      auto q = (*c)->save(it + 1, s.shards);
      t += NanosToSeconds(NowNanos() - t0);
      if (!q.ok()) std::fprintf(stderr, "compare: %s\n", q.status().ToString().c_str());
      if (it > 2) cairn_ms.push_back(t * 1e3);
    }
    (void)(*c)->wait_captured();
    Stats st = (*c)->stats();
    skipped = st.skipped;
    persisted = st.persisted;
  }
  (void)DefaultFileSystem()->RemoveAll(host_root);
  (void)DefaultFileSystem()->RemoveAll(pfs);

  const double gb = static_cast<double>(bytes) / 1e9;
  const double m_sync = Median(sync_ms), m_snap = Median(snap_ms), m_cairn = Median(cairn_ms);
  const double compute_ms = 1.5 * Median(mc) * 1e3;
  char json[1024];
  std::snprintf(json, sizeof json,
                "{\"bench\":\"compare\",\"state_bytes\":%llu,\"iters\":%d,\"compute_ms\":%.1f,"
                "\"memcpy_gbps\":%.3f,\"raw_write_fsync_gbps\":%.3f,\"stall_ms_sync\":%.2f,"
                "\"stall_ms_snapshot\":%.2f,\"stall_ms_cairn\":%.4f,\"cairn_vs_sync\":%.0f,"
                "\"cairn_vs_snapshot\":%.0f,\"cairn_skipped\":%llu,\"cairn_persisted\":%llu}",
                static_cast<unsigned long long>(bytes), iters, compute_ms, gb / Median(mc),
                gb / Median(raw), m_sync, m_snap, m_cairn, m_sync / m_cairn, m_snap / m_cairn,
                static_cast<unsigned long long>(skipped),
                static_cast<unsigned long long>(persisted));
  char md[2048];
  std::snprintf(md, sizeof md,
                "| strategy | stall per iteration (median of %d) | vs cairn |\n"
                "|---|---|---|\n"
                "| sync write + fsync every iteration | %.1f ms | %.0fx |\n"
                "| snapshot to host, then background write | %.1f ms | %.0fx |\n"
                "| cairn (lazy capture, every 10th persisted) | %.3f ms | 1x |\n\n"
                "State %.2f GB, compute %.0f ms per iteration, memcpy %.2f GB/s, raw write + "
                "fsync %.2f GB/s.\n",
                iters, m_sync, m_sync / m_cairn, m_snap, m_snap / m_cairn, m_cairn, gb, compute_ms,
                gb / Median(mc), gb / Median(raw));
  // The chart: horizontal bars on a log scale from 0.01 ms.
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"200\" "
      "font-family=\"sans-serif\" font-size=\"13\">\n"
      "<text x=\"10\" y=\"20\">stall per iteration, checkpoint every iteration (log scale)"
      "</text>\n";
  const char* names[] = {"sync", "snapshot", "cairn"};
  const double vals[] = {m_sync, m_snap, m_cairn};
  for (int i = 0; i < 3; ++i) {
    const double w = std::max(2.0, 90.0 * (std::log10(std::max(vals[i], 0.01)) + 2.0));
    char bar[512];
    std::snprintf(bar, sizeof bar,
                  "<text x=\"10\" y=\"%d\">%s</text><rect x=\"90\" y=\"%d\" width=\"%.0f\" "
                  "height=\"24\" fill=\"%s\"/><text x=\"%.0f\" y=\"%d\">%.3g ms</text>\n",
                  60 + 45 * i, names[i], 44 + 45 * i, w, i == 2 ? "#2a9d8f" : "#e76f51", 96 + w,
                  60 + 45 * i, vals[i]);
    svg += bar;
  }
  svg += "</svg>\n";
  Write(JoinPath(out, "compare.json"), std::string(json) + "\n");
  Write(JoinPath(out, "compare.md"), md);
  Write(JoinPath(out, "compare.svg"), svg);
  std::printf("%s", md);
  std::printf("%s\n", json);
  return 0;
}
