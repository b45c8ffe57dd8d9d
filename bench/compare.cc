// bench/compare: the training loop's stall per iteration with a checkpoint every iteration,
// three ways, in one run on the same state and the same compute:
//   sync      write the state to the filesystem and fsync it, then go on (what torch.save
//             and DeepSpeed's default checkpointing do)
//   snapshot  copy the state to host memory (blocking), then write that copy in a
//             background thread; the next checkpoint first waits for the previous write
//             (CheckFreq, torch async_save, NVIDIA's async checkpointing)
//   cairn     save() after the optimizer step, fence() before the next one; the copy runs
//             while compute runs, every version is replicated over UCX into the memory of
//             a second process (node 1 of the job, started by the bench), every 10th is
//             drained to the filesystem in the background (CAIRN_PERSIST_EVERY=10)
// The measured rank is rank 0; rank 1 (node 1) holds its replicas and saves a small state of
// its own at the same steps (persistence rounds are job-wide); the ranks meet at a barrier
// after each compute, as a gradient all-reduce would make them. The compute per iteration
// is real arithmetic calibrated to 1.5x the memcpy time of the state; the physical
// references (memcpy of the state, raw write + fsync of it) are measured in the same run.
// Both processes share this machine's cores: the replication's sending and receiving run
// beside the compute.
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

#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "cli/launcher.h"
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

// Rank 1 of the cairn arm (started with --partner, settings from CAIRN_*): holds rank 0's
// replicas and saves a 4 KiB state at the same steps.
int Partner(int iters) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) {
    std::fprintf(stderr, "compare partner: %s\n", o.status().ToString().c_str());
    return 1;
  }
  o->copy_engine = CopyEngineKind::kHost;
  auto c = Checkpointer::Open(*o);
  if (!c.ok()) {
    std::fprintf(stderr, "compare partner: %s\n", c.status().ToString().c_str());
    return 1;
  }
  std::vector<float> w(1024);
  const std::vector<ShardSpec> shards = {
      ShardSpec::Whole({"partner.weight", DType::kF32, {1024}}, w.data())};
  for (int it = 0; it <= iters + 2; ++it) {
    if (!(*c)->group()->Barrier().ok()) return 1;
    (void)(*c)->fence();
    w[static_cast<size_t>(it) % w.size()] += 1.0f;
    if (!(*c)->save(it + 1, shards).ok()) return 1;
  }
  auto f = (*c)->flush();
  if (!f.ok()) std::fprintf(stderr, "compare partner: %s\n", f.status().ToString().c_str());
  return f.ok() ? 0 : 1;
}

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
  bool partner = false;
  CLI::App app(
      "Stall per iteration of a training loop that checkpoints every iteration: sync "
      "write+fsync to --dir, snapshot-then-background-write, and cairn. Writes compare.json, "
      "compare.md and compare.svg to --out. Prints one JSON line last.",
      "bench_compare");
  cairn::cli::AddByteCount(app, "--bytes", &bytes, "state size (default 1G)");
  app.add_option("--iters", iters, "iterations per arm")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--dir", dir, "directory the writes go to")->capture_default_str();
  app.add_option("--out", out, "where the report files go")->capture_default_str();
  app.add_flag("--partner", partner, "internal: the replica partner process")->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  if (partner) return Partner(iters);
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
  // cairn: rank 0 here, rank 1 (node 1, holding rank 0's replicas) in a second process.
  std::vector<double> cairn_ms;
  uint64_t saves = 0, skipped = 0, persisted = 0, replicated = 0, replicate_failed = 0;
  double replicate_gbps = 0;
  {
    const std::string job = "compare-" + std::to_string(::getpid());
    const std::string self = cairn::bench::SelfPath();
    if (self.empty()) return 1;
    LaunchSpec spec;
    spec.argv = {self, "--partner", "--iters", std::to_string(iters)};
    spec.output_dir = pfs;
    spec.env = {{"RANK", "1"},           {"WORLD_SIZE", "2"},   {"GROUP_RANK", "1"},
                {"CAIRN_NODE", "1"},     {"CAIRN_JOB_ID", job}, {"CAIRN_HOST_ROOT", host_root},
                {"CAIRN_PFS_ROOT", pfs}, {"CAIRN_SLOTS", "4"},  {"CAIRN_PERSIST_EVERY", "10"},
                {"CAIRN_REPLICAS", "1"}};
    auto partner_rank = LocalLauncher::Start(spec);
    if (!partner_rank.ok()) {
      std::fprintf(stderr, "compare: %s\n", partner_rank.status().ToString().c_str());
      return 1;
    }
    Options o;
    o.job_id = job;
    o.host_root = host_root;
    o.pfs_root = pfs;
    o.rank = 0;
    o.world_size = 2;
    o.node = 0;
    o.copy_engine = CopyEngineKind::kHost;
    o.slots = 4;  // newest, being replicated, being drained, being captured
    o.slot_bytes = bytes + (4 << 20);
    o.persist_every = 10;
    o.replicas = 1;
    auto c = Checkpointer::Open(o);
    if (!c.ok()) {
      std::fprintf(stderr, "compare: %s\n", c.status().ToString().c_str());
      return 1;
    }
    for (int it = 0; it <= iters + 2; ++it) {  // 2 more: the first sizes the slots
      cairn::bench::Compute(work, reps);
      if (Status b = (*c)->group()->Barrier(); !b.ok()) {
        std::fprintf(stderr, "compare: %s\n", b.ToString().c_str());
        return 1;
      }
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
    // The end of a run: the last version committed to the filesystem (job-wide).
    auto fl = (*c)->flush();
    if (!fl.ok()) std::fprintf(stderr, "compare: flush: %s\n", fl.status().ToString().c_str());
    Stats st = (*c)->stats();
    saves = st.save.saves;
    replicate_gbps = st.replication.gbps;
    skipped = st.save.skipped;
    persisted = st.persist.persisted;
    replicated = st.replication.replicated;
    replicate_failed = st.replication.failed;
    c->reset();
    if (!(*partner_rank)->WaitAll(120)) std::fprintf(stderr, "compare: the partner rank failed\n");
  }
  (void)DefaultFileSystem()->RemoveAll(host_root);
  (void)DefaultFileSystem()->RemoveAll(pfs);

  const double gb = static_cast<double>(bytes) / 1e9;
  const double m_sync = Median(sync_ms), m_snap = Median(snap_ms), m_cairn = Median(cairn_ms);
  const double compute_ms = 1.5 * Median(mc) * 1e3;
  using cairn::bench::Round;
  const std::string json = nlohmann::ordered_json{
      {"bench", "compare"},
      {"state_bytes", bytes},
      {"iters", iters},
      {"compute_ms", Round(compute_ms, 1)},
      {"memcpy_gbps", Round(gb / Median(mc), 3)},
      {"raw_write_fsync_gbps", Round(gb / Median(raw), 3)},
      {"stall_ms_sync", Round(m_sync, 2)},
      {"stall_ms_snapshot", Round(m_snap, 2)},
      {"stall_ms_cairn", Round(m_cairn, 4)},
      {"cairn_vs_sync", Round(m_sync / m_cairn, 0)},
      {"cairn_vs_snapshot", Round(m_snap / m_cairn, 0)},
      {"cairn_saves", saves},
      {"cairn_skipped", skipped},
      {"cairn_replicated", replicated},
      {"cairn_replicate_failed", replicate_failed},
      {"cairn_replicate_gbps", Round(replicate_gbps, 3)},
      {"cairn_persisted",
       persisted}}.dump();
  char md[2048];
  std::snprintf(
      md, sizeof md,
      "| strategy | stall per iteration (median of %d) | vs cairn |\n"
      "|---|---|---|\n"
      "| sync write + fsync every iteration | %.1f ms | %.0fx |\n"
      "| snapshot to host, then background write | %.1f ms | %.0fx |\n"
      "| cairn (lazy capture, replicated to node 1, every 10th persisted) | %.3f ms | 1x |\n\n"
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
  Write(JoinPath(out, "compare.json"), json + "\n");
  Write(JoinPath(out, "compare.md"), md);
  Write(JoinPath(out, "compare.svg"), svg);
  std::printf("%s", md);
  std::printf("%s\n", json.c_str());
  return 0;
}
