// bench/persist: cairn's persistence to the PFS against raw sequential writes of the same
// bytes to the same directory, and the training loop's stall while drains run.
//
//   raw      4 MiB write(2)s of --bytes into one file, then fsync; buffered and O_DIRECT
//            alternated, median of --rounds each, picks the faster mode; cairn runs in that
//            mode, and inside each cairn job rank 0 writes the same state the same raw way
//            before every flush (raw, cairn, raw, cairn, ...): the median of those is that
//            job's reference (raw_write_gbps: the largest job's)
//   persist  N ranks (processes, UCX over tcp) that all hold the same --bytes of tensors
//            (data parallel): save, wait until captured, barrier, then flush() (plan, every
//            rank writes its share, fsync, MANIFEST + LATEST commit) timed on rank 0;
//            median of --rounds; persist_gbps = bytes / flush time
//   stall    one rank trains (compute calibrated to 1.5x the state memcpy, fence, save)
//            with draining off and with CAIRN_PERSIST_EVERY=1 (a drain always running),
//            alternated; stall = time in fence() + save() per iteration
//
//   persist [--bytes 1G] [--ranks 1,2,4] [--rounds 3] [--dir /var/tmp] [--threads 4]
//           [--stall-iters 48]
//
// Last line: one JSON object with raw_write_gbps, persist_gbps and persist_vs_raw (the
// largest rank count), max_writer_share, stall_ms_during_drain and stall_ms_no_drain.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"

using namespace cairn;
using cairn::bench::Buffer;
using cairn::bench::Median;
using cairn::bench::RawWrite;

namespace {

constexpr int kTensors = 8;

struct Args {
  uint64_t bytes = 1ull << 30;
  std::string ranks = "1,2,4";
  int rounds = 3;
  std::string dir = "/var/tmp";
  int threads = 4;
  int stall_iters = 48;
  // Child only.
  bool child = false;
  bool stall = false;
  bool direct = false;  // the raw reference's mode
};

// Tensors of the data-parallel state (every rank holds all of them).
struct State : cairn::bench::TensorState {
  explicit State(uint64_t bytes) : TensorState(bytes, kTensors) {}
  void Touch(int64_t step) { TensorState::Touch(step, 64 << 10); }
};

void Die(const char* what, const Status& st) {
  std::fprintf(stderr, "persist: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// A rank of the persist measurement. Rank 0 prints "FLUSH <seconds> <share>" per round.
int PersistChild(const Args& a) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) Die("options", o.status());
  o->copy_engine = CopyEngineKind::kHost;
  o->slot_bytes = a.bytes + (4 << 20);
  State s(a.bytes);
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) Die("open", ck.status());
  Checkpointer& c = **ck;
  for (int r = 0; r < a.rounds + 1; ++r) {  // the first round warms up (plan, directories)
    s.Touch(r);
    auto out = c.save(r + 1, s.shards);
    if (!out.ok() || *out != SaveOutcome::kQueued)
      Die("save", out.ok() ? Status::Internal("skipped") : out.status());
    Status st = c.wait_captured();
    if (!st.ok()) Die("capture", st);
    auto barrier = [&] {
      if (!c.group()) return;
      Status b = c.group()->Barrier();
      if (!b.ok()) Die("barrier", b);
    };
    // The raw reference, alternated with cairn's rounds: rank 0 writes the same bytes
    // into the same directory while the other ranks wait.
    barrier();
    double raw_sec = 0;
    if (o->rank == 0) {
      raw_sec = RawWrite(JoinPath(o->pfs_root, "raw-" + o->job_id + ".bin"), s.Parts(), a.direct);
    }
    barrier();
    const int64_t t0 = NowNanos();
    auto f = c.flush();
    const double sec = NanosToSeconds(NowNanos() - t0);
    if (!f.ok()) Die("flush", f.status());
    if (o->rank == 0 && r > 0)
      std::printf("FLUSH %.6f %.4f %llu %.6f\n", sec, c.stats().persist.max_writer_share,
                  static_cast<unsigned long long>(c.stats().persist.bytes), raw_sec);
    std::fflush(stdout);
  }
  return 0;
}

// One rank trains with and without drains. Prints "STALL <no_drain_ms> <drain_ms>
// <iter_no_drain_ms> <iter_drain_ms> <drains> <skipped>".
int StallChild(const Args& a) {
  auto base = Options::FromEnvironment();
  if (!base.ok()) Die("options", base.status());
  base->copy_engine = CopyEngineKind::kHost;
  base->slot_bytes = a.bytes + (4 << 20);
  base->slots = 3;
  State s(a.bytes);
  Buffer ref(a.bytes);
  std::vector<double> mc;
  for (int i = 0; i < 3; ++i) {
    double sec = 0;
    for (int k = 0; k < kTensors; ++k)
      sec += cairn::bench::TimedMemcpy(ref.p + k * (a.bytes / kTensors),
                                       s.bufs[static_cast<size_t>(k)]->p, a.bytes / kTensors, 1);
    mc.push_back(sec);
  }
  std::vector<float> work(64 << 10, 1.0f);
  const int64_t reps = cairn::bench::CalibrateCompute(work, 1.5 * Median(mc));
  {
    const int64_t t0 = NowNanos();
    cairn::bench::Compute(work, reps);
    std::fprintf(stderr, "stall: memcpy of the state %.1f ms, compute %.1f ms\n", Median(mc) * 1e3,
                 NanosToSeconds(NowNanos() - t0) * 1e3);
  }
  std::map<bool, std::vector<double>> stall, iter;
  uint64_t drains = 0, skipped = 0;
  int64_t step = 0;
  for (int phase = 0; phase < 4; ++phase) {
    const bool drain = phase % 2 == 1;
    Options o = *base;
    o.persist_every = drain ? 1 : 0;
    auto ck = Checkpointer::Open(o);
    if (!ck.ok()) Die("open", ck.status());
    Checkpointer& c = **ck;
    for (int i = 0; i < a.stall_iters / 2 + 2; ++i) {
      const int64_t t0 = NowNanos();
      cairn::bench::Compute(work, reps);
      const int64_t f0 = NowNanos();
      Status st = c.fence();
      const int64_t f1 = NowNanos();
      if (!st.ok()) Die("fence", st);
      s.Touch(++step);  // the optimizer step
      const int64_t s0 = NowNanos();
      auto out = c.save(step, s.shards);
      const int64_t s1 = NowNanos();
      if (!out.ok()) Die("save", out.status());
      if (i >= 2) {  // the first iterations of a phase warm up
        stall[drain].push_back(NanosToSeconds((f1 - f0) + (s1 - s0)));
        iter[drain].push_back(NanosToSeconds(s1 - t0));
      }
    }
    Stats st = c.stats();
    if (drain) {
      drains += st.persist.persisted;
      skipped += st.save.skipped;
    }
  }
  for (bool d : {false, true}) {
    std::vector<double> v = stall[d];
    std::sort(v.begin(), v.end());
    std::fprintf(stderr, "stall %s drains: median %.3f ms, p90 %.3f ms, max %.3f ms over %zu\n",
                 d ? "with" : "without", v[v.size() / 2] * 1e3, v[v.size() * 9 / 10] * 1e3,
                 v.back() * 1e3, v.size());
  }
  std::printf("STALL %.4f %.4f %.3f %.3f %llu %llu\n", cairn::bench::Mean(stall[false]) * 1e3,
              cairn::bench::Mean(stall[true]) * 1e3, Median(iter[false]) * 1e3,
              Median(iter[true]) * 1e3, static_cast<unsigned long long>(drains),
              static_cast<unsigned long long>(skipped));
  return 0;
}

std::vector<std::string> RunJob(const std::string& root, int n,
                                const std::vector<std::string>& argv,
                                const std::vector<std::pair<std::string, std::string>>& env) {
  LaunchSpec spec;
  spec.nodes = n;
  spec.argv = argv;
  spec.output_dir = root;
  spec.env = env;
  for (int r = 0; r < n; ++r)
    (void)DefaultFileSystem()->RemoveAll(root + "/rank-" + std::to_string(r) + ".log");
  auto l = LocalLauncher::Start(spec);
  const bool ok = l.ok() && (*l)->WaitAll(1800);
  std::ifstream f(root + "/rank-0.log");
  std::stringstream ss;
  ss << f.rdbuf();
  if (!ok) {
    std::fprintf(stderr, "persist: a %d-rank run failed; rank 0 said:\n%s\n", n, ss.str().c_str());
    std::exit(1);
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "Raw sequential writes (buffered+fsync and O_DIRECT) against cairn persisting the same "
      "bytes from N data-parallel ranks into --dir, and the training stall while drains run. "
      "Prints one JSON line last.",
      "bench_persist");
  cairn::cli::AddByteCount(app, "--bytes", &a.bytes, "state per rank (at least 64M; default 1G)");
  app.add_option("--ranks", a.ranks, "rank counts to run, comma-separated")->capture_default_str();
  app.add_option("--rounds", a.rounds, "rounds per rank count")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dir", a.dir, "the filesystem to write to")->capture_default_str();
  app.add_option("--threads", a.threads, "writer threads per rank")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--stall-iters", a.stall_iters, "iterations of the stall measurement")
      ->check(CLI::Range(4, 100000))
      ->capture_default_str();
  app.add_flag("--child", a.child, "internal: a rank")->group("");
  app.add_flag("--stall", a.stall, "internal: the stall rank")->group("");
  app.add_flag("--direct", a.direct, "internal: the raw reference's mode")->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  if (a.bytes < (64ull << 20)) {
    std::fprintf(stderr, "bench_persist: --bytes must be at least 64M (try --help)\n");
    return 2;
  }
  a.bytes = a.bytes / (kTensors * 4096) * (kTensors * 4096);
  if (a.child) return a.stall ? StallChild(a) : PersistChild(a);

  std::string tmpl = a.dir + "/cairn-bench-persist-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    std::perror(("mkdtemp " + tmpl).c_str());
    return 1;
  }
  const std::string pfs = tmpl;
  char htmpl[] = "/dev/shm/cairn-bench-persist-host-XXXXXX";
  if (!::mkdtemp(htmpl)) return 1;
  const std::string host = htmpl;

  // Which raw mode is faster here (both alternated); cairn runs in that mode, and each
  // cairn job measures that raw mode itself, alternated with its own rounds.
  std::map<bool, std::vector<double>> raw;
  {
    Buffer src(a.bytes);
    for (int r = 0; r < a.rounds; ++r)
      for (bool direct : {false, true})
        raw[direct].push_back(static_cast<double>(a.bytes) /
                              RawWrite(pfs + "/raw.bin", {{src.p, a.bytes}}, direct) / 1e9);
  }
  const double raw_buffered = Median(raw[false]), raw_direct = Median(raw[true]);
  const bool direct = raw_direct > raw_buffered;
  std::printf("raw sequential write of %.0f MiB: buffered+fsync %.2f GB/s, O_DIRECT %.2f GB/s\n",
              static_cast<double>(a.bytes) / (1 << 20), raw_buffered, raw_direct);
  double raw_gbps = std::max(raw_buffered, raw_direct);

  const std::string self = "/proc/self/exe";
  std::vector<std::string> common = {
      self, "--child", "--bytes", std::to_string(a.bytes), "--rounds", std::to_string(a.rounds)};
  nlohmann::ordered_json per_ranks = nlohmann::ordered_json::object();
  double persist_gbps = 0, share = 0;
  int last_n = 0;
  for (const std::string& item : cairn::bench::SplitList(a.ranks)) {
    const int n = std::max(1, std::atoi(item.c_str()));
    const std::string job = "bench-persist-" + std::to_string(n) + "-" + std::to_string(::getpid());
    std::vector<std::string> argv = common;
    if (direct) argv.push_back("--direct");
    auto lines = RunJob(pfs, n, argv,
                        {{"CAIRN_JOB_ID", job},
                         {"CAIRN_HOST_ROOT", host},
                         {"CAIRN_PFS_ROOT", pfs},
                         {"CAIRN_PERSIST_EVERY", "0"},
                         {"CAIRN_PERSIST_DIRECT", direct ? "1" : "0"},
                         {"CAIRN_PERSIST_THREADS", std::to_string(a.threads)},
                         {"CAIRN_REPLICAS", "0"},
                         {"UCX_TLS", "tcp"}});
    std::vector<double> secs, raw_secs;
    double sh = 0;
    for (const auto& l : lines) {
      double sec = 0, x = 0, rs = 0;
      unsigned long long b = 0;
      if (std::sscanf(l.c_str(), "FLUSH %lf %lf %llu %lf", &sec, &x, &b, &rs) == 4) {
        secs.push_back(sec);
        raw_secs.push_back(rs);
        sh = x;
      }
    }
    if (secs.empty()) {
      std::fprintf(stderr, "persist: no result from the %d-rank run\n", n);
      return 1;
    }
    raw_gbps = static_cast<double>(a.bytes) / Median(raw_secs) / 1e9;
    const double gbps = static_cast<double>(a.bytes) / Median(secs) / 1e9;
    std::printf(
        "cairn persist, %d rank(s): %.2f GB/s (%.2f of raw %.2f GB/s alternated with it), "
        "busiest writer %.3f x mean\n",
        n, gbps, gbps / raw_gbps, raw_gbps, sh);
    per_ranks[std::to_string(n)] = {{"raw_gbps", cairn::bench::Round(raw_gbps, 3)},
                                    {"persist_gbps", cairn::bench::Round(gbps, 3)},
                                    {"max_writer_share", cairn::bench::Round(sh, 4)}};
    persist_gbps = gbps;
    share = sh;
    last_n = n;
    (void)DefaultFileSystem()->RemoveAll(JoinPath(pfs, job));
    (void)DefaultFileSystem()->RemoveAll(JoinPath(host, job));
  }

  // Training stall with and without drains (one rank).
  std::vector<std::string> stall_argv = common;
  stall_argv.push_back("--stall");
  stall_argv.push_back("--stall-iters");
  stall_argv.push_back(std::to_string(a.stall_iters));
  const std::string sjob = "bench-persist-stall-" + std::to_string(::getpid());
  auto lines = RunJob(pfs, 1, stall_argv,
                      {{"CAIRN_JOB_ID", sjob},
                       {"CAIRN_HOST_ROOT", host},
                       {"CAIRN_PFS_ROOT", pfs},
                       {"CAIRN_PERSIST_DIRECT", direct ? "1" : "0"},
                       {"CAIRN_PERSIST_THREADS", std::to_string(a.threads)},
                       {"CAIRN_KEEP_ON_PFS", "1"}});
  double st_none = -1, st_drain = -1, it_none = 0, it_drain = 0;
  unsigned long long drains = 0, skipped = 0;
  for (const auto& l : lines)
    std::sscanf(l.c_str(), "STALL %lf %lf %lf %lf %llu %llu", &st_none, &st_drain, &it_none,
                &it_drain, &drains, &skipped);
  std::printf(
      "training, 1 rank: stall %.3f ms/iter without drains, %.3f ms/iter while draining "
      "(%llu drains, %llu versions skipped); iteration %.1f vs %.1f ms\n",
      st_none, st_drain, drains, skipped, it_none, it_drain);
  (void)DefaultFileSystem()->RemoveAll(pfs);
  (void)DefaultFileSystem()->RemoveAll(host);

  using cairn::bench::Round;
  const nlohmann::ordered_json j = {{"bench", "persist"},
                                    {"bytes", a.bytes},
                                    {"ranks", last_n},
                                    {"persist_direct", direct},
                                    {"threads", a.threads},
                                    {"raw_buffered_gbps", Round(raw_buffered, 3)},
                                    {"raw_direct_gbps", Round(raw_direct, 3)},
                                    {"raw_write_gbps", Round(raw_gbps, 3)},
                                    {"persist_gbps", Round(persist_gbps, 3)},
                                    {"persist_vs_raw", Round(persist_gbps / raw_gbps, 3)},
                                    {"max_writer_share", Round(share, 4)},
                                    {"by_ranks", per_ranks},
                                    {"stall_ms_no_drain", Round(st_none, 4)},
                                    {"stall_ms_during_drain", Round(st_drain, 4)},
                                    {"iter_ms_no_drain", Round(it_none, 2)},
                                    {"iter_ms_during_drain", Round(it_drain, 2)},
                                    {"drains", drains},
                                    {"skipped_during_drain", skipped}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
