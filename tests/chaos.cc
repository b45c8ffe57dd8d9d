// chaos: a real training job on a small cluster, hit by a random fault every 30-90 s
// (issue 35). Two nodes in network namespaces of their own (scripts/netns_cluster.sh), each
// with two ranks of `cairn demo-worker` (the demo's sharded GPT-like model: tensor parallel
// in a node, data parallel across nodes, a version every iteration in host memory,
// replicated to the other node over UCX/tcp, every 10th drained to the PFS), the PFS a
// GlusterFS volume on two storage servers of their own, mounted by each node.
//
//   chaos [--seconds 600] [--seed S] [--min-gap 30] [--max-gap 90] [--layers 4] [--dim 256]
//         [--kinds kill,wipe,cut,storage] [--keep]
//
// Fault kinds, one at a time, each in turn in a shuffled order, on a random node or server:
//   kill     the node's ranks are SIGKILLed; the scheduler (this program) ends the job and
//            starts it again (`--mode resume`); the node's host memory survives
//   wipe     the same, and the node's host memory is lost too (its replicas on the other
//            node bring it back)
//   cut      the node's switch port goes down for 5-20 s (no reset reaches anyone), then up;
//            the job is expected to ride it out (its collectives wait; restarted if not)
//   storage  a storage server is killed for 10-20 s, then restarted; training goes on
// Every restart restores and checks every value against a replay of the training (the
// demo worker's `check`): a value that differs is a torn version, a restore that fails is a
// lost one (both must be 0). Reports, per fault, the recovery time (for a restart, the
// fault to every rank of the new run restored; the demo's replay check after it recomputes
// every step from 0, seconds that grow with the step, and is reported apart as the test's
// own; for a cut or a storage server, the link's or server's return to the first step every
// rank trained after it) and the steps lost (the newest step saved before the fault minus
// the step restored), and goodput: the wall time of the steps the final run of training
// kept (the iteration times of the steps no restore rolled back, a step that waited on a
// cut link included) over the whole wall time, and over the wall time less the checks.
// Prints a line per fault, a table per kind, and one JSON line last. Exit 0 when no version
// was torn or lost. Needs root (namespaces), GlusterFS and /dev/fuse: scripts/chaos.sh.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "testing/netns_cluster.h"
#include "tests/test_util.h"

using namespace cairn;

namespace {

struct Config {
  double seconds = 600;
  uint64_t seed = 0;
  double min_gap = 30, max_gap = 90;
  int layers = 4;
  int dim = 256;
  std::vector<std::string> kinds = {"kill", "wipe", "cut", "storage"};
  bool keep = false;
};

constexpr int kNodes = 2, kPerNode = 2, kWorld = kNodes * kPerNode;

double Now() {
  return NanosToSeconds(NowNanos());
}

// What one rank of one run printed (cli/demo.cc's worker lines).
struct RankLog {
  std::map<int64_t, double> iter_ms;  // step -> its iteration time
  int64_t restored = -1;
  std::string tier;
  std::string check;  // "ok", "FAILED ..." or ""
  int64_t persisted = -1;
  std::vector<std::string> other;
};

RankLog ReadRank(const std::string& path) {
  RankLog r;
  auto text = ReadWholeFile(DefaultFileSystem(), path, 256 << 20);
  if (!text.ok()) return r;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string w;
    f >> w;
    if (w == "step") {
      int64_t t = 0;
      f >> t;
      std::string k, v;
      while (f >> k >> v) {
        if (k == "iter_ms") r.iter_ms[t] = std::atof(v.c_str());
        if (k == "pers_step") r.persisted = std::atoll(v.c_str());
      }
    } else if (w == "restored") {
      std::string k;
      f >> r.restored >> k >> r.tier;
    } else if (w == "check") {
      r.check = line.substr(6);
    } else if (!line.empty() && w != "job-check" && w != "flushed") {
      r.other.push_back(line);
    }
  }
  return r;
}

struct Fault {
  std::string kind;
  int target = 0;          // node, or storage server
  double at = 0;           // when it was injected
  double outage_s = 0;     // cut / storage: how long
  int64_t newest = -1;     // newest step saved before it (any rank)
  int64_t restored = -1;   // restarts: the step restored
  double recovery_s = -1;  // fault -> the first step trained after it
  double ended_s = -1;     // restarts: fault -> every rank of the run gone
  double restored_s = -1;  // restarts: fault -> every rank of the new run restored
  double check_s = 0;      // restarts: the replay check after the restore (the test's own)
  bool restarted = false;
  std::string problem;  // a torn or lost version, or a job that never came back
};

class Chaos {
 public:
  explicit Chaos(const Config& c) : cfg_(c), rng_(c.seed), root_("chaos") {}
  int Run();

 private:
  bool Start(const std::string& mode);
  std::vector<RankLog> Read(int run) const {
    std::vector<RankLog> out;
    for (int r = 0; r < kWorld; ++r)
      out.push_back(ReadRank(RunDir(run) + "/rank-" + std::to_string(r) + ".log"));
    return out;
  }
  std::string RunDir(int run) const { return root_.path() + "/run-" + std::to_string(run); }
  // The newest step every rank of the current run has trained (-1: none yet).
  int64_t Trained() const {
    int64_t m = INT64_MAX;
    for (const RankLog& r : Read(run_))
      m = std::min(m, r.iter_ms.empty() ? -1 : r.iter_ms.rbegin()->first);
    return m;
  }
  int64_t Newest() const {
    int64_t m = -1;
    for (const RankLog& r : Read(run_))
      if (!r.iter_ms.empty()) m = std::max(m, r.iter_ms.rbegin()->first);
    return m;
  }
  // Ends the current run (SIGKILL; `first` ranks first, the rest `lag_ms` later).
  void EndRun(const std::vector<int>& first, int lag_ms);
  // Starts a resumed run and waits until every rank trained a step past its restore, or
  // failed; fills f.restored, f.recovery_s, f.problem.
  void Restart(Fault& f);
  // Waits until every rank trained a step past `step` (at most `limit_s`): the time it did.
  double WaitPast(int64_t step, double limit_s);

  Config cfg_;
  std::mt19937_64 rng_;
  testing::TempDir root_;
  std::unique_ptr<testing::NetnsCluster> cluster_;
  std::string mnt_[kNodes];
  std::string job_;
  std::unique_ptr<LocalLauncher> run_l_;
  int run_ = -1;
  std::vector<int64_t> run_start_;  // per run: the step it restored (0: the first)
  std::vector<Fault> faults_;
};

bool Chaos::Start(const std::string& mode) {
  ++run_;
  (void)DefaultFileSystem()->MakeDirs(RunDir(run_), 0700);
  LaunchSpec s;
  s.nodes = kNodes;
  s.ranks_per_node = kPerNode;
  s.argv = {CAIRN_CLI,  "demo-worker",
            "--mode",   mode,
            "--steps",  "1000000",
            "--layers", std::to_string(cfg_.layers),
            "--dim",    std::to_string(cfg_.dim)};
  s.output_dir = RunDir(run_);
  s.env = {{"CAIRN_JOB_ID", job_},        {"CAIRN_HOST_ROOT", root_.path() + "/host"},
           {"CAIRN_REPLICAS", "1"},       {"CAIRN_SLOTS", "4"},
           {"CAIRN_PERSIST_EVERY", "10"}, {"CAIRN_CONNECT_TIMEOUT_S", "60"},
           {"CAIRN_OP_TIMEOUT_S", "60"},  {"CAIRN_REPLICATE_TIMEOUT_S", "10"},
           {"CAIRN_LOG_LEVEL", "2"},      {"UCX_TLS", "tcp"},
           {"UCX_NET_DEVICES", "eth0"}};
  for (int n = 0; n < kNodes; ++n) {
    s.node_prefix.push_back(cluster_->node_prefix(n));
    s.node_prefix.back().insert(s.node_prefix.back().end(), {"env", "CAIRN_PFS_ROOT=" + mnt_[n]});
  }
  auto l = LocalLauncher::Start(s);
  if (!l.ok()) {
    std::printf("chaos: cannot start run %d: %s\n", run_, l.status().ToString().c_str());
    return false;
  }
  run_l_ = std::move(*l);
  run_start_.push_back(0);
  return true;
}

void Chaos::EndRun(const std::vector<int>& first, int lag_ms) {
  if (!run_l_) return;
  for (int r : first) (void)run_l_->Signal(r, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(lag_ms));
  for (int r = 0; r < kWorld; ++r) (void)run_l_->Signal(r, SIGKILL);
  for (int r = 0; r < kWorld; ++r) run_l_->WaitRank(r);
  run_l_.reset();
}

double Chaos::WaitPast(int64_t step, double limit_s) {
  const double t0 = Now();
  while (Now() - t0 < limit_s) {
    if (Trained() > step) return Now();
    if (run_l_ && run_l_->Running() < kWorld) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return -1;
}

void Chaos::Restart(Fault& f) {
  f.restarted = true;
  f.ended_s = Now() - f.at;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (!Start("resume")) {
      f.problem = "the job could not be started again";
      return;
    }
    // Every rank restores, checks its values against a replay, and trains on.
    const double t0 = Now();
    while (Now() - t0 < 180) {
      const auto logs = Read(run_);
      bool all = true, restored = true;
      for (const RankLog& r : logs) {
        all = all && !r.iter_ms.empty();
        restored = restored && r.restored >= 0;
      }
      if (restored && f.restored_s < 0) f.restored_s = Now() - f.at;
      if (all || run_l_->Running() < kWorld) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const auto logs = Read(run_);
    bool trained = true;
    for (int r = 0; r < kWorld; ++r) {
      const RankLog& x = logs[static_cast<size_t>(r)];
      if (x.check.rfind("FAILED", 0) == 0)
        f.problem = "rank " + std::to_string(r) +
                    " restored values that differ from the replay: " + x.check;
      trained = trained && !x.iter_ms.empty();
    }
    f.restored = logs[0].restored;
    run_start_.back() = std::max<int64_t>(f.restored, 0);
    if (!f.problem.empty()) return;
    if (trained) {
      // cairn's part ends once every rank restored; the demo's replay check that follows
      // recomputes every step from 0 (seconds, growing with the step) and is the test's.
      f.recovery_s = f.restored_s;
      f.check_s = Now() - f.at - f.restored_s;
      return;
    }
    // A rank failed (its restore or its first steps): say why, end the run, try again.
    std::string why;
    for (int r = 0; r < kWorld; ++r)
      for (const std::string& l : logs[static_cast<size_t>(r)].other)
        if (l.find("demo worker:") != std::string::npos)
          why += "\n    rank " + std::to_string(r) + ": " + l;
    std::printf("  restart %d did not train%s\n", attempt + 1, why.c_str());
    EndRun({}, 0);
  }
  f.problem = "the job did not come back in 3 restarts";
}

int Chaos::Run() {
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/scripts/netns_cluster.sh";
  std::string why = testing::NetnsCluster::Unavailable(script);
  if (why.empty()) why = testing::NetnsCluster::PfsUnavailable();
  if (!why.empty()) {
    std::printf("chaos: no cluster here: %s\n", why.c_str());
    return 2;
  }
  std::string bricks = "/var/tmp/cairn-chaos-bricks-XXXXXX";
  if (::mkdtemp(bricks.data()) == nullptr) return 2;
  auto c =
      testing::NetnsCluster::Up(script, "chaos-" + std::to_string(::getpid() % 100000), kNodes);
  if (!c.ok()) {
    std::printf("chaos: %s\n", c.status().ToString().c_str());
    return 2;
  }
  cluster_ = std::move(*c);
  if (Status st = cluster_->Pfs(2, bricks); !st.ok()) {
    std::printf("chaos: %s\n", st.ToString().c_str());
    return 2;
  }
  for (int n = 0; n < kNodes; ++n) {
    mnt_[n] = root_.path() + "/m" + std::to_string(n);
    if (Status st = cluster_->Mount(n, mnt_[n]); !st.ok()) {
      std::printf("chaos: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  job_ = testing::UniqueJobId("chaos");
  std::printf(
      "chaos: %d nodes x %d ranks (demo model, %d layers, width %d), a GlusterFS volume on "
      "2 servers, %.0f s, a fault every %.0f-%.0f s, seed %llu, under %s\n",
      kNodes, kPerNode, cfg_.layers, cfg_.dim, cfg_.seconds, cfg_.min_gap, cfg_.max_gap,
      static_cast<unsigned long long>(cfg_.seed), root_.path().c_str());
  std::fflush(stdout);
  auto uniform = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng_);
  };
  const double t_begin = Now();
  if (!Start("train")) return 2;
  if (WaitPast(5, 120) < 0) {
    std::printf("chaos: the job never trained\n");
    EndRun({}, 0);
    return 2;
  }
  double next = Now() + uniform(cfg_.min_gap, cfg_.max_gap);
  std::vector<std::string> order;  // the kinds still to come this round
  while (Now() - t_begin < cfg_.seconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (run_l_ && run_l_->Running() < kWorld) {
      // A run ended without a fault of ours: count it, as a restart.
      Fault f;
      f.kind = "unplanned";
      f.target = -1;
      f.at = Now();
      f.newest = Newest();
      EndRun({}, 0);
      Restart(f);
      faults_.push_back(f);
      continue;
    }
    if (Now() < next) continue;
    Fault f;
    // Each kind in turn, in a shuffled order (as the crash matrix takes its points).
    if (order.empty()) {
      order = cfg_.kinds;
      std::shuffle(order.begin(), order.end(), rng_);
    }
    f.kind = order.back();
    order.pop_back();
    f.target = static_cast<int>(rng_() % 2);
    f.newest = Newest();
    f.at = Now();
    if (f.kind == "kill" || f.kind == "wipe") {
      EndRun({f.target * kPerNode, f.target * kPerNode + 1}, static_cast<int>(rng_() % 50));
      if (f.kind == "wipe")
        (void)DefaultFileSystem()->RemoveAll(root_.path() + "/host/" + job_ + "/node-" +
                                             std::to_string(f.target));
      Restart(f);
    } else if (f.kind == "cut") {
      f.outage_s = uniform(5, 20);
      (void)cluster_->Cut(f.target);
      std::this_thread::sleep_for(std::chrono::duration<double>(f.outage_s));
      (void)cluster_->Heal(f.target);
    } else {  // storage
      f.outage_s = uniform(10, 20);
      (void)cluster_->Storage(f.target, "kill");
      std::this_thread::sleep_for(std::chrono::duration<double>(f.outage_s));
      (void)cluster_->Storage(f.target, "start");
    }
    if (!f.restarted) {
      // The job rides it out: the first step every rank trains once the link or server is
      // back. A run that ends meanwhile is restarted, and counted so.
      const int64_t at_return = Trained();
      const double t = WaitPast(at_return, 120);
      if (t >= 0) {
        f.recovery_s = t - (f.at + f.outage_s);  // from the link's or server's return
      } else {
        EndRun({}, 0);
        Restart(f);
      }
    }
    char times[96] = "";
    if (f.restarted)
      std::snprintf(times, sizeof times,
                    " (the job had ended after %.1f s; then the replay check, %.1f s)", f.ended_s,
                    f.check_s);
    std::printf(
        "fault %2zu at %6.1f s: %-8s %s %d%s: newest step %lld, %s, recovered in %.1f s%s%s%s\n",
        faults_.size() + 1, f.at - t_begin, f.kind.c_str(), f.kind == "storage" ? "server" : "node",
        f.target,
        f.outage_s > 0 ? (" for " + std::to_string(static_cast<int>(f.outage_s)) + " s").c_str()
                       : "",
        static_cast<long long>(f.newest),
        f.restarted ? ("restarted at step " + std::to_string(f.restored) + " (" +
                       std::to_string(f.newest - f.restored) + " lost)")
                          .c_str()
                    : "rode it out",
        f.recovery_s, times, f.problem.empty() ? "" : ": ", f.problem.c_str());
    std::fflush(stdout);
    faults_.push_back(f);
    next = Now() + uniform(cfg_.min_gap, cfg_.max_gap);
  }
  const int64_t final_step = Newest();
  EndRun({}, 0);
  const double wall = Now() - t_begin;

  // Goodput: the iteration times of the steps each run trained that the next run did not
  // roll back, over the wall time.
  double kept_ms = 0;
  int64_t kept_steps = 0;
  for (int run = 0; run <= run_; ++run) {
    const RankLog r0 = ReadRank(RunDir(run) + "/rank-0.log");
    const int64_t from = run_start_[static_cast<size_t>(run)];
    const int64_t to = run < run_ ? run_start_[static_cast<size_t>(run + 1)] : INT64_MAX;
    for (const auto& [t, ms] : r0.iter_ms)
      if (t > from && t <= to) kept_ms += ms, ++kept_steps;
  }
  std::printf("\n%-10s %6s %10s %22s %18s\n", "kind", "faults", "restarts",
              "recovery s (min/med/max)", "steps lost (max)");
  int torn = 0, lost = 0;
  std::string per_kind;
  for (const std::string& k : {std::string("kill"), std::string("wipe"), std::string("cut"),
                               std::string("storage"), std::string("unplanned")}) {
    std::vector<double> rec;
    int n = 0, restarts = 0;
    int64_t steps_lost = 0;
    for (const Fault& f : faults_) {
      if (f.kind != k) continue;
      ++n;
      restarts += f.restarted;
      if (f.recovery_s >= 0) rec.push_back(f.recovery_s);
      if (f.restarted && f.restored >= 0) steps_lost = std::max(steps_lost, f.newest - f.restored);
      if (f.problem.find("differ") != std::string::npos)
        ++torn;
      else if (!f.problem.empty())
        ++lost;
    }
    if (n == 0) continue;
    std::sort(rec.begin(), rec.end());
    std::printf("%-10s %6d %10d %8.1f / %5.1f / %5.1f %18lld\n", k.c_str(), n, restarts,
                rec.empty() ? -1 : rec.front(), rec.empty() ? -1 : rec[rec.size() / 2],
                rec.empty() ? -1 : rec.back(), static_cast<long long>(steps_lost));
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\":{\"faults\":%d,\"restarts\":%d,\"recovery_s_median\":%.1f,"
                  "\"recovery_s_max\":%.1f,\"steps_lost_max\":%lld}",
                  per_kind.empty() ? "" : ",", k.c_str(), n, restarts,
                  rec.empty() ? -1 : rec[rec.size() / 2], rec.empty() ? -1 : rec.back(),
                  static_cast<long long>(steps_lost));
    per_kind += buf;
  }
  const double goodput = kept_ms / 1e3 / wall;
  // The same without the time the demo's replay checks took (the test's, not cairn's).
  double checks_s = 0;
  for (const Fault& f : faults_) checks_s += f.check_s;
  const double goodput_unchecked = kept_ms / 1e3 / (wall - checks_s);
  std::printf(
      "\n%lld steps kept (final step %lld) in %.0f s of wall time: goodput %.3f (%.3f without "
      "the %.0f s of replay checks); versions torn %d, lost %d\n",
      static_cast<long long>(kept_steps), static_cast<long long>(final_step), wall, goodput,
      goodput_unchecked, checks_s, torn, lost);
  std::printf(
      "{\"bench\":\"chaos\",\"seconds\":%.0f,\"faults\":%zu,\"final_step\":%lld,"
      "\"kept_steps\":%lld,\"goodput\":%.3f,\"goodput_without_checks\":%.3f,"
      "\"replay_checks_s\":%.0f,\"torn\":%d,\"lost\":%d,\"by_kind\":{%s},\"seed\":%llu}\n",
      wall, faults_.size(), static_cast<long long>(final_step), static_cast<long long>(kept_steps),
      goodput, goodput_unchecked, checks_s, torn, lost, per_kind.c_str(),
      static_cast<unsigned long long>(cfg_.seed));
  if (cfg_.keep) root_.Keep();
  return torn == 0 && lost == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.seed = static_cast<uint64_t>(WallNanos());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "chaos: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds") {
      c.seconds = std::atof(next());
    } else if (a == "--seed") {
      c.seed = std::strtoull(next(), nullptr, 10);
    } else if (a == "--min-gap") {
      c.min_gap = std::atof(next());
    } else if (a == "--max-gap") {
      c.max_gap = std::atof(next());
    } else if (a == "--layers") {
      c.layers = std::atoi(next());
    } else if (a == "--dim") {
      c.dim = std::atoi(next());
    } else if (a == "--kinds") {
      c.kinds.clear();
      std::istringstream in(next());
      for (std::string k; std::getline(in, k, ',');) {
        if (k != "kill" && k != "wipe" && k != "cut" && k != "storage") {
          std::fprintf(stderr, "chaos: --kinds takes kill, wipe, cut and storage, not %s\n",
                       k.c_str());
          return 2;
        }
        c.kinds.push_back(k);
      }
    } else if (a == "--keep") {
      c.keep = true;
    } else {
      std::fprintf(stderr,
                   "usage: chaos [--seconds 600] [--seed S] [--min-gap 30] [--max-gap 90] "
                   "[--layers 4] [--dim 256] [--kinds kill,wipe,cut,storage] [--keep]\n(see the "
                   "comment at the top of tests/chaos.cc)\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (c.seconds <= 0 || c.min_gap <= 0 || c.max_gap < c.min_gap || c.kinds.empty()) {
    std::fprintf(stderr, "chaos: --seconds > 0, 0 < --min-gap <= --max-gap, --kinds not empty\n");
    return 2;
  }
  Chaos chaos(c);
  return chaos.Run();
}
