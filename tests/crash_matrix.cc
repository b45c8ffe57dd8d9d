// crash_matrix: kills a rank of a NODES x 2 ranks job (2 x 2 by default) at a named kill
// point of capture, replication, persist or commit (core/kill_point.h; built only with
// CAIRN_KILL_POINTS=ON) and checks that a new job restores the newest version reported
// complete, bit-exact.
//
//   crash_matrix [--trials 200] [--seed S] [--steps 24] [--every 3] [--rows 128]
//                [--nodes 2] [--replicas 1] [--placement ring|group]
//                [--layout tp2|flat|fsdp2tp|tpdrop]
//                [--redundancy replica|xor|rs] [--erasure-k 2] [--erasure-m 1] [--keep]
//                [--netns] [--volume] [--cuts PERCENT]
//
// The job is tests/recovery_child.cc's `matrix` mode: tensor parallel 2 x data parallel
// NODES (or, --layout flat, fully sharded: every rank a flat range of every tensor, so the
// persister plans from layout templates and commits MANIFEST format 2; or --layout fsdp2tp,
// FSDP2 over 2-way tensor parallelism, planned from templates with cuts; or --layout tpdrop,
// dimension 0 split over every rank dropping the remainder, planned from templates with
// truncated chunks: with --nodes 3, 6 ranks leave rows of two tensors to no rank), a version every
// iteration, replication to REPLICAS other nodes,
// CAIRN_PERSIST_EVERY=4, a flush at the end. Every `every` steps each rank waits for the version to
// be captured and replicated and prints "complete <step>"; each rank prints the newest persisted
// step it has seen.
//
// First a census run (nothing killed) counts how often each rank reaches each point; every
// point must be reached. Then each trial picks a point (cycling through all of them in a
// shuffled order), a rank that reaches it, and n in [1, times that rank reached it in the
// census]; that rank SIGKILLs itself the n-th time it reaches the point, the other ranks
// are SIGKILLed 0-20 ms later (the scheduler ends the job), and then nothing, one node's,
// two nodes' (with more than 2 nodes: any two, adjacent or not) or every node's host memory
// is wiped (lost nodes). A new job of the same shape restores and every rank checks every
// byte and blob against the step it got. A trial passes when
//   - every rank restored the same step and every byte of it is what was saved at that step
//     (a torn version would differ), and
//   - that step is at least the newest one reported complete that survives the failure:
//     the newest step every rank printed "complete" for (captured and in the memory of
//     every replica holder), when the placement keeps a copy of every rank on a node not
//     wiped; and the newest step any rank saw persisted;
//   - when nothing reported complete survives, a restore that fails with an error (exit 1,
//     no crash) also passes.
// Over a cluster (--netns; root): each node's ranks run in a network namespace of their own
// (scripts/netns_cluster.sh), UCX over tcp between them; with --volume the PFS is a
// GlusterFS volume on two storage servers, each node persisting and restoring through its
// own mount. --cuts P adds link cuts as a fault kind: in P% of the trials a random node's
// switch port also goes down, 0.05-1 s into the run (of about 2 s), for 1-6 s (no reset
// reaches anyone),
// and comes back before the restore; the kill point still fires when its rank reaches it.
// Prints a line per trial, a table per point, and one JSON line last. Exit 0 when every
// trial passed and the census reached every point.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "core/kill_point.h"
#include "redundancy/placement.h"
#include "testing/netns_cluster.h"
#include "tests/matrix_log.h"
#include "tests/test_util.h"

using namespace cairn;

namespace {

struct Config {
  int trials = 200;
  uint64_t seed = 0;
  int steps = 24;
  int every = 3;
  int rows = 128;
  int nodes = 2;
  int replicas = 1;
  bool group = false;
  std::string redundancy = "replica";  // or xor, rs (over sets of erasure_k nodes)
  int erasure_k = 2;
  int erasure_m = 1;
  bool keep = false;
  std::string layout = "tp2";
  bool netns = false;   // nodes in network namespaces
  bool volume = false;  // the PFS a GlusterFS volume (with netns)
  int cuts = 0;         // percent of the trials that also cut a node's link
};

constexpr int kPerNode = 2;

std::string ReadText(const std::string& path) {
  auto t = ReadWholeFile(DefaultFileSystem(), path, 64 << 20);
  return t.ok() ? *t : std::string();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The lines of a log that are not per-step progress (for failure reports).
// The start of a crash's report in a rank's log (a sanitizer's, UCX's fatal error, an
// uncaught exception), at most 40 lines: printed first, where a shortened CI log keeps it.
std::string CrashReport(const std::string& log) {
  static constexpr const char* kMarks[] = {"==ERROR:",  "runtime error:",   "Sanitizer",
                                           "Assertion", "terminate called", "Fatal",
                                           "FATAL",     "SUMMARY:"};
  std::string out;
  int taken = -1;
  for (const std::string& line : Lines(log)) {
    if (taken < 0)
      for (const char* m : kMarks)
        if (line.find(m) != std::string::npos) taken = 0;
    if (taken >= 0 && taken++ < 40) out += "    | " + line + "\n";
  }
  return out;
}

std::string Interesting(const std::string& log) {
  std::string out;
  for (const std::string& line : Lines(log))
    if (line.rfind("saved ", 0) != 0 && line.rfind("complete ", 0) != 0)
      out += "    " + line + "\n";
  return out;
}

class Matrix {
 public:
  explicit Matrix(const Config& c, Placement placement)
      : cfg_(c),
        world_(c.nodes * kPerNode),
        placement_(std::move(placement)),
        root_("cmatrix"),
        rng_(c.seed) {}

  int Run();

 private:
  LaunchSpec Spec(const std::string& job, std::vector<std::string> args, const std::string& out) {
    LaunchSpec s;
    s.nodes = cfg_.nodes;
    s.ranks_per_node = kPerNode;
    s.argv = {CAIRN_RECOVERY_CHILD};
    for (auto& a : args) s.argv.push_back(a);
    s.output_dir = out;
    for (int n = 0; cluster_ && n < cfg_.nodes; ++n) {
      s.node_prefix.push_back(cluster_->node_prefix(n));
      if (cfg_.volume)
        s.node_prefix.back().insert(s.node_prefix.back().end(),
                                    {"env", "CAIRN_PFS_ROOT=" + Mount(n)});
    }
    s.env = {{"CAIRN_JOB_ID", job},
             {"CAIRN_HOST_ROOT", root_.path() + "/host"},
             {"CAIRN_PFS_ROOT", root_.path() + "/pfs"},
             {"UCX_NET_DEVICES", cluster_ ? "eth0" : "all"},
             {"CAIRN_REPLICAS", std::to_string(cfg_.replicas)},
             {"CAIRN_PLACEMENT", cfg_.group ? "group" : "ring"},
             {"CAIRN_REDUNDANCY", cfg_.redundancy},
             {"CAIRN_ERASURE_K", std::to_string(cfg_.erasure_k)},
             {"CAIRN_ERASURE_M", std::to_string(cfg_.erasure_m)},
             {"CAIRN_SLOTS", "4"},
             {"CAIRN_PERSIST_EVERY", "4"},
             {"CAIRN_KEEP_ON_PFS", "2"},
             {"CAIRN_CONNECT_TIMEOUT_S", "60"},
             {"CAIRN_OP_TIMEOUT_S", "30"},
             {"CAIRN_REPLICATE_TIMEOUT_S", "10"},
             {"CAIRN_CHUNK_BYTES", "64K"},
             {"CAIRN_LOG_LEVEL", "1"},
             {"UCX_TLS", "tcp"}};
    // fsdp2tp: a layout per rank, far fewer than the 64 from which a drain plans from
    // templates with cuts by default.
    if (cfg_.layout == "fsdp2tp") s.env.push_back({"CAIRN_CUT_TEMPLATE_MIN_LAYOUTS", "0"});
    return s;
  }
  std::string Mount(int node) const { return root_.path() + "/m" + std::to_string(node); }
  // The job's PFS directory as this process sees it.
  std::string PfsJob(const std::string& job) const {
    return (cfg_.volume ? Mount(0) : root_.path() + "/pfs") + "/" + job;
  }
  // The namespace cluster and its volume (--netns, --volume); false, saying why, when they
  // cannot be made here.
  bool MakeCluster();
  std::vector<std::string> TrainArgs() const {
    return {"matrix", cfg_.layout, std::to_string(cfg_.rows), std::to_string(cfg_.steps),
            std::to_string(cfg_.every)};
  }

  struct Restore {
    bool all_ok = true;         // every rank exited 0
    bool crashed = false;       // a rank died by a signal or timed out
    std::vector<int64_t> step;  // per rank, -1 when it printed none
    std::vector<std::string> tier;
    std::string logs;
  };
  Restore RunRestore(const std::string& job, const std::string& out);
  bool Census();
  bool Trial(int i, const std::string& point, int rank, long nth, const std::set<int>& wiped);
  // Nothing, one node, two nodes (any two when there are more than 2) or every node.
  std::set<int> PickWipe();

  Config cfg_;
  int world_;
  Placement placement_;
  testing::TempDir root_;
  std::mt19937_64 rng_;
  std::map<std::string, std::vector<long>> census_;  // point -> times reached, per rank
  struct PointStats {
    int trials = 0, fired = 0, failed = 0;
    std::map<std::string, int> tiers;
  };
  std::map<std::string, PointStats> per_point_;
  std::map<std::string, int> tiers_;
  int failures_ = 0, fired_ = 0, cut_trials_ = 0;
  std::unique_ptr<testing::NetnsCluster> cluster_;
};

bool Matrix::MakeCluster() {
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/scripts/netns_cluster.sh";
  std::string why = testing::NetnsCluster::Unavailable(script);
  if (why.empty() && cfg_.volume) why = testing::NetnsCluster::PfsUnavailable();
  if (!why.empty()) {
    std::printf("crash matrix: no cluster here: %s\n", why.c_str());
    return false;
  }
  auto c =
      testing::NetnsCluster::Up(script, "cm-" + std::to_string(::getpid() % 100000), cfg_.nodes);
  if (!c.ok()) {
    std::printf("crash matrix: %s\n", c.status().ToString().c_str());
    return false;
  }
  cluster_ = std::move(*c);
  if (!cfg_.volume) return true;
  std::string bricks = "/var/tmp/cairn-cm-bricks-XXXXXX";
  if (::mkdtemp(bricks.data()) == nullptr) return false;
  Status st = cluster_->Pfs(2, bricks);
  for (int n = 0; n < cfg_.nodes && st.ok(); ++n) st = cluster_->Mount(n, Mount(n));
  if (!st.ok()) std::printf("crash matrix: %s\n", st.ToString().c_str());
  return st.ok();
}

Matrix::Restore Matrix::RunRestore(const std::string& job, const std::string& out) {
  Restore r;
  r.step.assign(world_, -1);
  r.tier.assign(world_, "");
  (void)DefaultFileSystem()->MakeDirs(out, 0700);
  auto l = LocalLauncher::Start(
      Spec(job, {"restore", cfg_.layout, std::to_string(cfg_.rows), "0"}, out));
  if (!l.ok()) {
    r.all_ok = false;
    r.crashed = true;
    r.logs = l.status().ToString();
    return r;
  }
  r.all_ok = (*l)->WaitAll(180);
  for (int k = 0; k < world_; ++k) {
    const int code = (*l)->ranks()[static_cast<size_t>(k)].exit_code;
    if (code != 0 && code != 1) r.crashed = true;
    const std::string log = ReadText(out + "/rank-" + std::to_string(k) + ".log");
    for (const std::string& line : Lines(log)) {
      std::istringstream in(line);
      std::string w;
      in >> w;
      if (w == "restored")
        in >> r.step[static_cast<size_t>(k)] >> w >> r.tier[static_cast<size_t>(k)];
    }
    r.logs += "  restore rank " + std::to_string(k) + " (exit " + std::to_string(code) + "):\n" +
              Interesting(log);
  }
  return r;
}

bool Matrix::Census() {
  const std::string job = testing::UniqueJobId("census");
  const std::string out = root_.path() + "/census";
  (void)DefaultFileSystem()->MakeDirs(out, 0700);
  LaunchSpec spec = Spec(job, TrainArgs(), out);
  spec.rank_env.resize(world_);
  for (int k = 0; k < world_; ++k)
    spec.rank_env[static_cast<size_t>(k)] = {
        {"CAIRN_KILL_CENSUS", out + "/census-" + std::to_string(k)}};
  auto l = LocalLauncher::Start(spec);
  if (!l.ok() || !(*l)->WaitAll(300)) {
    std::printf("census: the training run without a kill failed\n");
    for (int k = 0; k < world_; ++k)
      std::printf("  rank %d:\n%s", k,
                  Interesting(ReadText(out + "/rank-" + std::to_string(k) + ".log")).c_str());
    return false;
  }
  for (const std::string& p : KillPointNames()) census_[p].assign(world_, 0);
  for (int k = 0; k < world_; ++k)
    for (const std::string& line : Lines(ReadText(out + "/census-" + std::to_string(k)))) {
      std::istringstream in(line);
      std::string name;
      long n = 0;
      if (in >> name >> n && census_.count(name)) census_[name][static_cast<size_t>(k)] = n;
    }
  bool ok = true;
  std::printf("census (times each rank reached each point in a %d-step run):\n", cfg_.steps);
  for (const std::string& p : KillPointNames()) {
    const auto& c = census_[p];
    std::printf("  %-26s", p.c_str());
    for (long n : c) std::printf(" %5ld", n);
    std::printf("\n");
    if (std::all_of(c.begin(), c.end(), [](long n) { return n == 0; })) {
      std::printf("  ^ never reached: the run does not exercise this point\n");
      ok = false;
    }
  }
  // The run without a kill restores its flushed last step from memory.
  Restore r = RunRestore(job, out + "/restore");
  for (int k = 0; k < world_; ++k)
    if (!r.all_ok || r.step[static_cast<size_t>(k)] != cfg_.steps) {
      std::printf("census: restoring the run without a kill did not give step %d:\n%s", cfg_.steps,
                  r.logs.c_str());
      ok = false;
      break;
    }
  (void)DefaultFileSystem()->RemoveAll(root_.path() + "/host/" + job);
  (void)DefaultFileSystem()->RemoveAll(PfsJob(job));
  std::fflush(stdout);
  return ok;
}

std::set<int> Matrix::PickWipe() {
  std::set<int> out;
  switch (rng_() % 4) {
    case 0:
      break;
    case 1:
      out.insert(static_cast<int>(rng_() % static_cast<uint64_t>(cfg_.nodes)));
      break;
    case 2:  // two nodes; of two, one (as before 4-node jobs: wiping both is "all")
      while (out.size() < (cfg_.nodes > 2 ? 2u : 1u))
        out.insert(static_cast<int>(rng_() % static_cast<uint64_t>(cfg_.nodes)));
      break;
    default:
      for (int n = 0; n < cfg_.nodes; ++n) out.insert(n);
  }
  return out;
}

bool Matrix::Trial(int i, const std::string& point, int rank, long nth,
                   const std::set<int>& wiped) {
  const std::string job = testing::UniqueJobId("cm" + std::to_string(i));
  const std::string dir = root_.path() + "/trial-" + std::to_string(i);
  const std::string train = dir + "/train";
  (void)DefaultFileSystem()->MakeDirs(train, 0700);
  LaunchSpec spec = Spec(job, TrainArgs(), train);
  spec.rank_env.resize(world_);
  spec.rank_env[static_cast<size_t>(rank)] = {{"CAIRN_KILL_AT", point + ":" + std::to_string(nth)}};
  PointStats& ps = per_point_[point];
  ++ps.trials;
  std::string problem;
  // A link cut as well (--cuts): node `cut_node`'s port down from cut_at to cut_end.
  int cut_node = -1;
  double cut_at = 0, cut_end = 0;
  if (cluster_ && static_cast<int>(rng_() % 100) < cfg_.cuts) {
    cut_node = static_cast<int>(rng_() % static_cast<uint64_t>(cfg_.nodes));
    cut_at = 0.05 + 0.95 * static_cast<double>(rng_() % 1000) / 1000;
    cut_end = cut_at + 1 + 5 * static_cast<double>(rng_() % 1000) / 1000;
    ++cut_trials_;
  }
  bool down = false, cut_done = false;
  auto l = LocalLauncher::Start(spec);
  if (!l.ok()) {
    problem = "launch: " + l.status().ToString();
  } else {
    // Until the armed rank exits (killed at its point, or done).
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::seconds(240);
    while ((*l)->Running() > 0 && (*l)->ranks()[static_cast<size_t>(rank)].exit_code < 0 &&
           std::chrono::steady_clock::now() < deadline) {
      const double t =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (cut_node >= 0 && !down && !cut_done && t >= cut_at) {
        down = cluster_->Cut(cut_node).ok();
        cut_done = !down;
      }
      if (down && t >= cut_end) {
        (void)cluster_->Heal(cut_node);
        down = false;
        cut_done = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng_() % 21));
    for (int k = 0; k < world_; ++k) (void)(*l)->Signal(k, SIGKILL);
    for (int k = 0; k < world_; ++k) (*l)->WaitRank(k);
    // The armed rank dies by SIGKILL or finishes; the others finish, stop at a failed
    // collective (1) or are killed. Anything else is a crash (a sanitizer's report, too).
    for (int k = 0; k < world_ && problem.empty(); ++k) {
      const int code = (*l)->ranks()[static_cast<size_t>(k)].exit_code;
      if (code != 128 + SIGKILL && code != 0 && (code != 1 || k == rank))
        problem = "training rank " + std::to_string(k) + " exited with " + std::to_string(code);
    }
  }
  if (l.ok()) l->reset();
  if (down) (void)cluster_->Heal(cut_node);  // before the restore
  std::vector<testing::MatrixLog> rep;
  std::string train_logs, crashes;
  for (int k = 0; k < world_; ++k) {
    const std::string log = ReadText(train + "/rank-" + std::to_string(k) + ".log");
    rep.push_back(testing::ParseMatrixLog(log));
    train_logs += "  train rank " + std::to_string(k) + ":\n" + Interesting(log);
    const std::string report = CrashReport(log);
    if (!report.empty())
      crashes += "  crash report of train rank " + std::to_string(k) + ":\n" + report;
  }
  const bool fired = rep[static_cast<size_t>(rank)].killed_at_point;
  if (fired) ++ps.fired, ++fired_;

  // The failure: which host memory is lost.
  const std::string host = root_.path() + "/host/" + job;
  for (int n : wiped) (void)DefaultFileSystem()->RemoveAll(host + "/node-" + std::to_string(n));
  std::string wipe_name = wiped.empty() ? "none" : "";
  for (int n : wiped) wipe_name += (wipe_name.empty() ? "node " : "+") + std::to_string(n);
  if (static_cast<int>(wiped.size()) == cfg_.nodes) wipe_name = "all";
  // Whether a copy of every rank is left in the memory of a node not wiped (a "complete"
  // step is in every holder's memory).
  bool survives = placement_.KeepsEveryRank(wiped);
  if (cfg_.redundancy != "replica") {
    // Parity: no set of erasure_k consecutive nodes lost more than it covers.
    const int m = cfg_.redundancy == "xor" ? 1 : cfg_.erasure_m;
    std::map<int, int> per_set;
    for (int n : wiped) ++per_set[n / cfg_.erasure_k];
    survives =
        std::all_of(per_set.begin(), per_set.end(), [&](const auto& kv) { return kv.second <= m; });
  }

  // The newest step reported complete that survives it.
  int64_t persisted = -1;
  for (const testing::MatrixLog& r : rep) persisted = std::max(persisted, r.persisted);
  const int64_t complete = testing::NewestCompleteOnEveryRank(rep);
  const int64_t bound = std::max(persisted, survives ? complete : -1);

  Restore r = RunRestore(job, dir + "/restore");
  // Where the restored step came from: "host", "host+peer", "pfs", ... or "none".
  std::string tiers = "none";
  if (r.all_ok) {
    tiers.clear();
    for (const std::string& t : std::set<std::string>(r.tier.begin(), r.tier.end()))
      tiers += (tiers.empty() ? "" : "+") + t;
  }
  std::string outcome;
  if (problem.empty()) {
    if (r.crashed) {
      problem = "a restoring rank crashed or hung";
    } else if (r.all_ok) {
      for (int k = 1; k < world_; ++k)
        if (r.step[static_cast<size_t>(k)] != r.step[0]) problem = "ranks restored different steps";
      if (problem.empty() && r.step[0] < bound)
        problem = "restored step " + std::to_string(r.step[0]) + " is older than step " +
                  std::to_string(bound) + ", reported complete";
      outcome = "step " + std::to_string(r.step[0]) + " from " + tiers;
    } else if (bound >= 0) {
      problem = "restore failed although step " + std::to_string(bound) +
                " was reported complete and survives";
    } else {
      outcome = "nothing restorable (clean error)";
    }
  }
  if (problem.empty()) {
    ++tiers_[tiers];
    ++ps.tiers[tiers];
  }
  char cut_name[80] = "";
  if (cut_node >= 0)
    std::snprintf(cut_name, sizeof cut_name, "  cut node %d %.1f-%.1f s%s", cut_node, cut_at,
                  cut_end, cut_done ? "" : " (the run ended first)");
  std::printf("trial %3d  %-24s rank %d #%-4ld %-6s wipe %-10s bound %3lld  %s%s\n", i,
              point.c_str(), rank, nth, fired ? "killed" : "(done)", wipe_name.c_str(),
              static_cast<long long>(bound), problem.empty() ? outcome.c_str() : "FAILED",
              cut_name);
  if (!problem.empty()) {
    ++failures_;
    ++ps.failed;
    std::printf("  FAILED: %s\n%s%s%s  kept in %s\n", problem.c_str(), crashes.c_str(),
                train_logs.c_str(), r.logs.c_str(), cfg_.keep ? dir.c_str() : "(not kept: --keep)");
  }
  std::fflush(stdout);
  if (problem.empty() || !cfg_.keep) {
    (void)DefaultFileSystem()->RemoveAll(dir);
    (void)DefaultFileSystem()->RemoveAll(host);
    (void)DefaultFileSystem()->RemoveAll(PfsJob(job));
  }
  return problem.empty();
}

int Matrix::Run() {
  const int64_t t0 = NowNanos();
  std::printf(
      "crash matrix: %d nodes x %d ranks, %d replicas (%s), %d steps, seed %llu, under %s\n",
      cfg_.nodes, kPerNode, cfg_.replicas, cfg_.group ? "group" : "ring", cfg_.steps,
      static_cast<unsigned long long>(cfg_.seed), root_.path().c_str());
  if ((cfg_.netns || cfg_.volume || cfg_.cuts > 0) && !MakeCluster()) return 2;
  if (cluster_)
    std::printf("over a cluster of network namespaces%s%s\n",
                cfg_.volume ? ", the PFS a GlusterFS volume on 2 servers" : "",
                cfg_.cuts > 0
                    ? (", link cuts in " + std::to_string(cfg_.cuts) + "% of the trials").c_str()
                    : "");
  const bool census_ok = Census();
  if (census_.empty()) return 1;
  std::vector<std::string> points = KillPointNames();
  std::vector<std::string> order;
  for (int i = 0; i < cfg_.trials; ++i) {
    if (order.empty()) {
      order = points;
      std::shuffle(order.begin(), order.end(), rng_);
    }
    const std::string point = order.back();
    order.pop_back();
    std::vector<int> ranks;
    for (int k = 0; k < world_; ++k)
      if (census_[point][static_cast<size_t>(k)] > 0) ranks.push_back(k);
    if (ranks.empty()) continue;
    const int rank = ranks[rng_() % ranks.size()];
    const long nth = 1 + static_cast<long>(rng_() % census_[point][static_cast<size_t>(rank)]);
    Trial(i, point, rank, nth, PickWipe());
  }
  std::printf("\n%-26s %6s %6s %6s  restored from\n", "kill point", "trials", "killed", "failed");
  for (const std::string& p : points) {
    const PointStats& s = per_point_[p];
    std::string from;
    for (const auto& [t, n] : s.tiers) from += t + " " + std::to_string(n) + "  ";
    std::printf("%-26s %6d %6d %6d  %s\n", p.c_str(), s.trials, s.fired, s.failed, from.c_str());
  }
  const double secs = NanosToSeconds(NowNanos() - t0);
  std::string tiers;
  for (const auto& [t, n] : tiers_)
    tiers += std::string(tiers.empty() ? "" : ",") + "\"" + t + "\":" + std::to_string(n);
  std::printf(
      "{\"bench\":\"crash_matrix\",\"nodes\":%d,\"replicas\":%d,\"placement\":\"%s\","
      "\"redundancy\":\"%s\","
      "\"layout\":\"%s\",\"trials\":%d,\"killed_at_point\":%d,\"failures\":%d,"
      "\"points\":%zu,\"census_ok\":%s,\"nothing_restorable\":%d,\"restored_from\":{%s},"
      "\"netns\":%s,\"volume\":%s,\"link_cut_trials\":%d,"
      "\"seed\":%llu,\"seconds\":%.0f}\n",
      cfg_.nodes, cfg_.replicas, cfg_.group ? "group" : "ring",
      (cfg_.redundancy == "replica" ? cfg_.redundancy
                                    : cfg_.redundancy + " k=" + std::to_string(cfg_.erasure_k) +
                                          " m=" + std::to_string(cfg_.erasure_m))
          .c_str(),
      cfg_.layout.c_str(), cfg_.trials, fired_, failures_, points.size(),
      census_ok ? "true" : "false", tiers_["none"], tiers.c_str(), cluster_ ? "true" : "false",
      cfg_.volume ? "true" : "false", cut_trials_, static_cast<unsigned long long>(cfg_.seed),
      secs);
  if (cfg_.keep && failures_ > 0) root_.Keep();
  return failures_ == 0 && census_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.seed = static_cast<uint64_t>(WallNanos());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "crash_matrix: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--trials") {
      c.trials = std::atoi(next());
    } else if (a == "--seed") {
      c.seed = std::strtoull(next(), nullptr, 10);
    } else if (a == "--steps") {
      c.steps = std::atoi(next());
    } else if (a == "--every") {
      c.every = std::atoi(next());
    } else if (a == "--rows") {
      c.rows = std::atoi(next());
    } else if (a == "--nodes") {
      c.nodes = std::atoi(next());
    } else if (a == "--replicas") {
      c.replicas = std::atoi(next());
    } else if (a == "--placement") {
      const std::string v = next();
      if (v != "ring" && v != "group") {
        std::fprintf(stderr, "crash_matrix: --placement is ring or group, not %s\n", v.c_str());
        return 2;
      }
      c.group = v == "group";
    } else if (a == "--redundancy") {
      c.redundancy = next();
      if (c.redundancy != "replica" && c.redundancy != "xor" && c.redundancy != "rs") {
        std::fprintf(stderr, "crash_matrix: --redundancy is replica, xor or rs, not %s\n",
                     c.redundancy.c_str());
        return 2;
      }
    } else if (a == "--erasure-k") {
      c.erasure_k = std::atoi(next());
    } else if (a == "--erasure-m") {
      c.erasure_m = std::atoi(next());
    } else if (a == "--layout") {
      c.layout = next();
      if (c.layout != "tp2" && c.layout != "flat" && c.layout != "fsdp2tp" &&
          c.layout != "tpdrop") {
        std::fprintf(stderr, "crash_matrix: --layout is tp2, flat, fsdp2tp or tpdrop, not %s\n",
                     c.layout.c_str());
        return 2;
      }
    } else if (a == "--keep") {
      c.keep = true;
    } else if (a == "--netns") {
      c.netns = true;
    } else if (a == "--volume") {
      c.volume = true;
    } else if (a == "--cuts") {
      c.cuts = std::atoi(next());
    } else {
      std::fprintf(stderr,
                   "usage: crash_matrix [--trials 200] [--seed S] [--steps 24] [--every 3] "
                   "[--rows 128] [--nodes 2] [--replicas 1] [--placement ring|group] "
                   "[--redundancy replica|xor|rs] [--erasure-k 2] [--erasure-m 1] "
                   "[--layout tp2|flat|fsdp2tp|tpdrop] [--keep] [--netns] [--volume] [--cuts "
                   "PERCENT]\n(see the "
                   "comment at the top of "
                   "tests/crash_matrix.cc)\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (c.trials < 0 || c.steps < 4 || c.every < 1 || c.rows < 8 || c.cuts < 0 || c.cuts > 100) {
    std::fprintf(stderr,
                 "crash_matrix: --trials >= 0, --steps >= 4, --every >= 1, --rows >= 8, --cuts "
                 "0..100\n");
    return 2;
  }
  auto placement = Placement::Make(c.nodes, kPerNode, c.replicas,
                                   c.group ? PlacementStrategy::kGroup : PlacementStrategy::kRing);
  if (!placement.ok() || c.nodes > 64) {
    std::fprintf(stderr, "crash_matrix: --nodes 2..64 and --replicas 0..nodes-1: %s\n",
                 placement.status().ToString().c_str());
    return 2;
  }
  if (c.redundancy != "replica" && (c.erasure_k < 2 || c.nodes % c.erasure_k != 0)) {
    std::fprintf(stderr, "crash_matrix: --erasure-k must be 2 or more and divide --nodes\n");
    return 2;
  }
  Matrix m(c, std::move(*placement));
  return m.Run();
}
