// A link that goes down and comes back: two one-rank nodes, each in a network namespace of
// its own on a switch (scripts/netns_cluster.sh), UCX over tcp between them, a save every
// 100 ms. Node 1's switch port is taken down (no reset reaches anyone) for half the
// replicate timeout and for twice it, once between pushes and once while a push is on the
// wire (a rate-limited link keeps one there all the time). After each cut, both directions
// must replicate a new version within a bound of the link's return that does not depend on
// the timeout (kBoundS), Stats and `cairn ls` must say while a cut lasts that the newest
// steps live on one node only, and training never waits for the network. Every 10th
// version drains to the PFS, a GlusterFS volume on two storage servers on the same switch
// (so a cut node's drains hang in its filesystem client too): training must not wait for
// them either, and once the link is back the drains commit again. At the end node 1's
// memory is wiped and the job restores: node 1's rank from its partner's replica (not
// from the volume), of the step `cairn ls` predicted, at most the bound behind the newest
// it saved.
// CI runs it with a 3 s timeout; scripts/link_flap.sh runs the full form (30 s).
// A second test cuts the link in the middle of a restore; a third slows it to 100 Mbit/s.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "testing/netns_cluster.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

// CAIRN_REPLICATE_TIMEOUT_S: 3 s in CI; scripts/link_flap.sh runs the full form at the
// default of 30 s (CAIRN_FLAP_TIMEOUT_S=30).
const double kTimeoutS = [] {
  const char* e = std::getenv("CAIRN_FLAP_TIMEOUT_S");
  return e ? std::atof(e) : 3.0;
}();
// Replication resumes within this of the link's return, whatever the timeout: 5 s
// (docs/guarantees.md) and 1 s for the push itself (12 MiB at 200 Mbit/s) and the 100 ms
// between the lines that show it. CAIRN_FLAP_BOUND_S overrides it (a slower machine).
// Under a sanitizer every link of that chain (the cut push's failure, the redial, the
// holder giving the cut transfer up, the next push) runs slower: twice the bound there.
// CI's ASan run once took 9.8 s (6.7 s the other way) after a cut that caught a push on
// the wire, where 8 local ASan runs took at most 3.9 s; the plain build keeps 6 s.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSanitizerFactor = 2;
#else
constexpr double kSanitizerFactor = 1;
#endif
const double kBoundS = [] {
  const char* e = std::getenv("CAIRN_FLAP_BOUND_S");
  return e ? std::atof(e) : 6.0 * kSanitizerFactor;
}();
constexpr int kSleepMs = 100;            // between saves
constexpr size_t kStateBytes = 8 << 20;  // replicate_child's STATE_BYTES (12 MiB saved)

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Line {
  int64_t step = 0;
  double stall_ms = 0;
  int64_t newest = -1;  // newest replicated step
  double wall = 0;
  double unreplicated_s = 0;  // Stats
  int64_t persisted = -1;     // newest step committed to the PFS
};

std::vector<Line> Lines(const std::string& log) {
  std::vector<Line> out;
  std::istringstream in(log);
  std::string s;
  while (std::getline(in, s)) {
    Line l;
    long long t = 0, n = 0;
    unsigned long long r = 0, f = 0;
    if (std::sscanf(s.c_str(),
                    "step %lld stall_ms %lf replicated %llu failed %llu newest %lld wall %lf "
                    "unreplicated_s %lf",
                    &t, &l.stall_ms, &r, &f, &n, &l.wall, &l.unreplicated_s) == 7) {
      l.step = t;
      l.newest = n;
      const size_t p = s.rfind(" persisted ");
      if (p != std::string::npos) l.persisted = std::atoll(s.c_str() + p + 11);
      out.push_back(l);
    }
  }
  return out;
}

// `cairn ls DIR`'s output.
std::string Ls(const std::string& dir) {
  std::string out;
  FILE* p = ::popen((std::string(CAIRN_CLI) + " ls " + dir + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// A wall time as the logs show it (core/log.cc): local HH:MM:SS.mmm.
std::string Clock(double wall_s) {
  const time_t t = static_cast<time_t>(wall_s);
  tm local{};
  localtime_r(&t, &local);
  char out[32];
  std::snprintf(out, sizeof out, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<int>((wall_s - static_cast<double>(t)) * 1000));
  return out;
}

// A rank's log without the step lines that repeat the one before (same newest replicated
// step, same failure count): what a failure message needs, short enough to be read whole.
std::string Digest(const std::string& log) {
  std::string out, s, last;
  std::istringstream in(log);
  while (std::getline(in, s)) {
    if (s.rfind("step ", 0) == 0) {
      const size_t r = s.find(" replicated "), w = s.find(" wall ");
      const std::string key = r == std::string::npos || w == std::string::npos
                                  ? s
                                  : s.substr(r, w - r);  // replicated, failed, newest
      if (key == last) continue;
      last = key;
    }
    out += s + "\n";
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class LinkFlap : public ::testing::Test {
 protected:
  void SetUp() override {
    script_ = std::string(CAIRN_SOURCE_DIR) + "/scripts/netns_cluster.sh";
    const std::string why = testing::NetnsCluster::Unavailable(script_);
    if (!why.empty()) {
      if (std::getenv("CAIRN_REQUIRE_NETNS")) FAIL() << "CAIRN_REQUIRE_NETNS is set, but: " << why;
      GTEST_SKIP() << "network namespaces cannot be made here: " << why;
    }
  }
  std::string log(int rank) const {
    return ReadFile(root_->path() + "/rank-" + std::to_string(rank) + ".log");
  }
  // Waits until both ranks have logged a step after wall time `t`; their lines.
  std::vector<Line> LinesAfter(int rank, double t) const {
    std::vector<Line> out;
    for (const Line& l : Lines(log(rank)))
      if (l.wall >= t) out.push_back(l);
    return out;
  }

  // root_, a two-node cluster (cluster_) and the spec of replicate_child training on it: a
  // version of kStateBytes every kSleepMs, the ranks in step as in training, UCX over tcp
  // on eth0, the replicate timeout kTimeoutS. `env` adds to those variables or replaces
  // them. With `volume`, the PFS is a GlusterFS volume on two storage servers of the
  // cluster, mounted on each node by its own client (volume_; where GlusterFS is missing
  // the PFS stays a local directory, said on stdout, unless CAIRN_REQUIRE_NETNS is set).
  // False (with the failure recorded) when the cluster cannot be made.
  bool Training(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& env,
                std::string* job, LaunchSpec* spec, bool volume = false) {
    root_ = std::make_unique<testing::TempDir>(tag);
    *job = testing::UniqueJobId(tag);
    const std::string name = tag.substr(0, 2) + std::to_string(::getpid() % 100000) + "-" +
                             std::to_string(NowNanos() % 100000);
    auto cluster = testing::NetnsCluster::Up(script_, name, 2);
    EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
    if (!cluster.ok()) return false;
    cluster_ = std::move(*cluster);
    spec->nodes = 2;
    spec->ranks_per_node = 1;
    spec->node_prefix = {cluster_->node_prefix(0), cluster_->node_prefix(1)};
    spec->argv = {CAIRN_REPLICATE_CHILD, "1000000", std::to_string(kStateBytes),
                  std::to_string(kSleepMs)};
    spec->output_dir = root_->path();
    spec->env = {{"CAIRN_JOB_ID", *job},
                 {"CAIRN_HOST_ROOT", root_->path() + "/host"},
                 {"CAIRN_PFS_ROOT", root_->path() + "/pfs"},
                 {"CAIRN_CONNECT_TIMEOUT_S", "60"},
                 {"CAIRN_REPLICATE_TIMEOUT_S", std::to_string(kTimeoutS)},
                 {"CAIRN_PERSIST_EVERY", "0"},
                 {"CAIRN_SLOTS", "8"},
                 // Every version the link keeps up with, unpaced: these tests time the link.
                 {"CAIRN_REPLICATE_SHARE", "1"},
                 {"CAIRN_TEST_LOCKSTEP", root_->path()},  // ranks in step, as in training
                 {"CAIRN_LOG_LEVEL", "2"},
                 {"UCX_TLS", "tcp"},
                 {"UCX_NET_DEVICES", "eth0"}};
    for (const auto& [k, v] : env) {
      auto it = std::find_if(spec->env.begin(), spec->env.end(),
                             [&](const auto& e) { return e.first == k; });
      if (it != spec->env.end())
        it->second = v;
      else
        spec->env.push_back({k, v});
    }
    if (!volume) return true;
    if (const std::string why = testing::NetnsCluster::PfsUnavailable(); !why.empty()) {
      EXPECT_EQ(std::getenv("CAIRN_REQUIRE_NETNS"), nullptr)
          << "CAIRN_REQUIRE_NETNS is set, but no networked volume can be made: " << why;
      std::printf("no networked volume here (%s): the PFS is a local directory\n", why.c_str());
      return !HasFailure();
    }
    // The bricks on a disk, as a storage server's are (removed with the cluster).
    std::string bricks = "/var/tmp/cairn-test-bricks-XXXXXX";
    if (::mkdtemp(bricks.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << bricks;
      return false;
    }
    Status st = cluster_->Pfs(2, bricks);
    for (int n = 0; n < 2 && st.ok(); ++n) {
      const std::string mnt = root_->path() + "/m" + std::to_string(n);
      st = cluster_->Mount(n, mnt);
      spec->node_prefix[n].insert(spec->node_prefix[n].end(), {"env", "CAIRN_PFS_ROOT=" + mnt});
    }
    EXPECT_TRUE(st.ok()) << st.ToString();
    volume_ = st.ok();
    return st.ok();
  }

  std::string script_;
  std::unique_ptr<testing::TempDir> root_;
  std::unique_ptr<testing::NetnsCluster> cluster_;  // after root_: goes first
  bool volume_ = false;                             // the PFS is the cluster's GlusterFS volume
};

struct CutResult {
  double resume_s[2] = {-1, -1};  // link's return -> first newly replicated version, per rank
  std::vector<double> stalls_ms;  // training stalls while the link was down
  std::vector<double> before_ms;  // ... and as long before the cut (the reference)
  double cut_at = 0, healed = 0;
  int64_t persisted[2] = {-1, -1};  // newest step committed to the PFS at the cut, at its end
};

TEST_F(LinkFlap, ReplicationComesBackInBothDirectionsAfterCutsShorterAndLongerThanTheTimeout) {
  std::string job;
  LaunchSpec spec;
  ASSERT_TRUE(Training("flap", {{"CAIRN_LOG_LEVEL", "3"}, {"CAIRN_PERSIST_EVERY", "10"}}, &job,
                       &spec, /*volume=*/true));
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto running = [&] { return (*l)->Running() == 2; };
  auto dump = [&] {
    return "\n--- rank 0 (step lines that repeat the one before left out):\n" + Digest(log(0)) +
           "\n--- rank 1:\n" + Digest(log(1));
  };

  // Both directions replicate, and a drain has committed, before anything is cut.
  const double start = NanosToSeconds(WallNanos());
  for (;;) {
    ASSERT_TRUE(running()) << dump();
    auto a = Lines(log(0)), b = Lines(log(1));
    if (!a.empty() && !b.empty() && a.back().newest >= 5 && b.back().newest >= 5 &&
        a.back().persisted >= 0 && b.back().persisted >= 0)
      break;
    ASSERT_LT(NanosToSeconds(WallNanos()) - start, 60) << "replication never started" << dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  // Cuts node 1 off for `cut_s`; returns when both ranks replicated again (or the wait ran
  // out: the resume time stays -1).
  auto flap = [&](double cut_s, bool during_push) {
    CutResult res;
    if (!during_push) {
      // Right after a version reached the partner: no push is on the wire.
      const int64_t seen = Lines(log(1)).back().newest;
      const double t0 = NanosToSeconds(WallNanos());
      while (Lines(log(1)).back().newest == seen && NanosToSeconds(WallNanos()) - t0 < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const double cut_at = NanosToSeconds(WallNanos());
    res.persisted[0] = Lines(log(0)).back().persisted;
    EXPECT_TRUE(cluster_->Cut(1).ok());
    std::this_thread::sleep_for(std::chrono::duration<double>(cut_s));
    if (cut_s > kTimeoutS) {
      // A cut past the timeout is visible: in Stats and in `cairn ls`.
      for (int r = 0; r < 2; ++r)
        EXPECT_GT(Lines(log(r)).back().unreplicated_s, 0) << "rank " << r << "'s Stats" << dump();
      const std::string ls = Ls(root_->path() + "/host/" + job);
      for (const char* want : {"live on node-0 only", "live on node-1 only"})
        EXPECT_NE(ls.find(want), std::string::npos) << want << "\n" << ls;
      // ... and in a warning that names the step losing the node would take it back to.
      for (int r = 0; r < 2; ++r)
        EXPECT_NE(log(r).find("losing this node now would take this rank back to step"),
                  std::string::npos)
            << "rank " << r << dump();
    }
    res.persisted[1] = Lines(log(0)).back().persisted;
    EXPECT_TRUE(cluster_->Heal(1).ok());
    const double healed = NanosToSeconds(WallNanos());
    res.cut_at = cut_at;
    res.healed = healed;
    int64_t before[2];
    for (int r = 0; r < 2; ++r) {
      before[r] = -1;
      for (const Line& x : Lines(log(r)))
        if (x.wall <= healed) before[r] = std::max(before[r], x.newest);
    }
    while (NanosToSeconds(WallNanos()) - healed < 3 * kBoundS &&
           (res.resume_s[0] < 0 || res.resume_s[1] < 0) && running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int r = 0; r < 2; ++r)
        for (const Line& x : LinesAfter(r, healed))
          if (res.resume_s[r] < 0 && x.newest > before[r]) res.resume_s[r] = x.wall - healed;
    }
    for (int r = 0; r < 2; ++r)
      for (const Line& x : Lines(log(r))) {
        if (x.wall >= cut_at && x.wall <= healed) res.stalls_ms.push_back(x.stall_ms);
        if (x.wall < cut_at && x.wall >= cut_at - (healed - cut_at))
          res.before_ms.push_back(x.stall_ms);
      }
    return res;
  };

  struct Case {
    const char* what;
    double cut_s;
    bool during_push;
  };
  const Case cases[] = {{"0.5 x timeout, between pushes", 0.5 * kTimeoutS, false},
                        {"2 x timeout, between pushes", 2 * kTimeoutS, false},
                        {"0.5 x timeout, during a push", 0.5 * kTimeoutS, true},
                        {"2 x timeout, during a push", 2 * kTimeoutS, true}};
  for (const Case& c : cases) {
    if (c.during_push) {
      // 12 MiB at 200 Mbit/s: every push takes half a second, so one is always on the wire.
      ASSERT_TRUE(cluster_->SetRate(1, "200mbit").ok());
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    CutResult r = flap(c.cut_s, c.during_push);
    if (c.during_push) {
      ASSERT_TRUE(cluster_->SetRate(1, "").ok());
    }
    const auto max_of = [](const std::vector<double>& v) {
      return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
    };
    const double stall_max = max_of(r.stalls_ms);
    std::printf(
        "cut %s (%.1f s): replication resumed rank 0 -> 1 after %.2f s, rank 1 -> 0 after "
        "%.2f s; stall during the cut median %.2f ms, max %.2f ms (as long before it: median "
        "%.2f ms, max %.2f ms); drains had committed up to step %lld at the cut, %lld at its "
        "end; link down %s - %s\n",
        c.what, c.cut_s, r.resume_s[0], r.resume_s[1], Median(r.stalls_ms), stall_max,
        Median(r.before_ms), max_of(r.before_ms), static_cast<long long>(r.persisted[0]),
        static_cast<long long>(r.persisted[1]), Clock(r.cut_at).c_str(), Clock(r.healed).c_str());
    ASSERT_TRUE(running()) << dump();
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_GE(r.resume_s[rank], 0)
          << "cut " << c.what << ": rank " << rank << " never replicated again within "
          << 3 * kBoundS << " s of the link's return" << dump();
      EXPECT_LE(r.resume_s[rank], kBoundS) << "cut " << c.what << ": rank " << rank << dump();
    }
    // Training never waits for the network: not even once for the timeout, and its typical
    // stall stays where it was just before the cut (2x that median, and 2 ms more: on a
    // shared 2-core VM the medians of the windows before the cuts of one run ranged from
    // 0.23 to 2.19 ms, and a fresh-clone CI run failed at 1.60 against 0.23 + 0.5).
    EXPECT_LT(stall_max, 1e3 * kTimeoutS / 2) << "cut " << c.what;
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
    // (The sanitizers' builds copy several times slower and their checks compete for the two
    // cores: the medians there say nothing about cairn.)
    EXPECT_LE(Median(r.stalls_ms), 2 * Median(r.before_ms) + 2.0) << "cut " << c.what;
#endif
    if (HasFailure()) return;
  }

  // The drains commit again once the link is back (a round is job-wide: while node 1 was
  // cut off, every round failed or waited, on both nodes).
  int64_t persisted_at_heal = -1;
  for (int r = 0; r < 2; ++r)
    persisted_at_heal = std::max(persisted_at_heal, Lines(log(r)).back().persisted);
  const double drains_from = NanosToSeconds(WallNanos());
  double drains_back_s = -1;
  while (running() && NanosToSeconds(WallNanos()) - drains_from < 90) {
    if (Lines(log(0)).back().persisted > persisted_at_heal &&
        Lines(log(1)).back().persisted > persisted_at_heal) {
      drains_back_s = NanosToSeconds(WallNanos()) - drains_from;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf(
      "drains to the %s: newest committed step %lld at the last cut's end; a newer one "
      "committed on both ranks %.2f s later\n",
      volume_ ? "GlusterFS volume" : "local PFS directory",
      static_cast<long long>(persisted_at_heal), drains_back_s);
  ASSERT_GE(drains_back_s, 0) << "no drain committed within 90 s of the link's return" << dump();

  // Node 1 is lost (its memory wiped): the job comes back, node 1's rank from the replica
  // its partner holds, at most the bound behind the newest step it saved. The loss comes
  // once the pushes keep up again (unlimited link), so that a step of rank 1's replicas
  // is still in rank 0's own ring (a job-wide consistent step is not yet guaranteed).
  const double calm = NanosToSeconds(WallNanos());
  while (NanosToSeconds(WallNanos()) - calm < 10) {
    const auto a = Lines(log(0)), b = Lines(log(1));
    if (b.back().newest >= b.back().step - 1 && a.back().newest >= a.back().step - 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t last_saved = Lines(log(1)).back().step;
  std::printf("killed at rank 0's step %lld, rank 1's step %lld\n",
              static_cast<long long>(Lines(log(0)).back().step),
              static_cast<long long>(last_saved));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE((*l)->Signal(r, SIGKILL).ok());
  for (int r = 0; r < 2; ++r) (*l)->WaitRank(r);
  // `cairn ls` tells which step the job would come back to from memory.
  const std::string ls = Ls(root_->path() + "/host/" + job);
  long long predicted = -1;
  const size_t lose1 = ls.find("losing node-1: every rank can restore step ");
  ASSERT_NE(lose1, std::string::npos) << ls;
  ASSERT_EQ(std::sscanf(ls.c_str() + lose1, "losing node-1: every rank can restore step %lld",
                        &predicted),
            1)
      << ls;
  ASSERT_TRUE(DefaultFileSystem()->RemoveAll(root_->path() + "/host/" + job + "/node-1").ok());
  // With one node's tree only (as on a node of a real cluster), it says what that tree holds.
  long long replica = -1;
  const size_t r1 = ls.find("rank 1 (node-1): newest step ");
  ASSERT_NE(r1, std::string::npos) << ls;
  ASSERT_EQ(
      std::sscanf(ls.c_str() + r1,
                  "rank 1 (node-1): newest step %*d, newest held by another node: %lld", &replica),
      1)
      << ls;
  const std::string part = Ls(root_->path() + "/host/" + job);
  EXPECT_NE(part.find("this tree holds 1 of 2 ranks' own tiers"), std::string::npos) << part;
  EXPECT_NE(part.find("node-0 holds replicas of rank 1 up to step " + std::to_string(replica)),
            std::string::npos)
      << part;
  EXPECT_EQ(part.find("losing node-"), std::string::npos) << part;
  // As a scheduler's health check would: the restarted job's ranks start once node 1's
  // filesystem client reaches the volume again (right after a cut it answers a false
  // ENOENT, then EIO, for the rendezvous token: the restart failed so under ASan in CI).
  if (volume_) {
    ASSERT_TRUE(testing::NetnsCluster::Writable(root_->path() + "/m1")) << "node 1's mount";
  }
  LaunchSpec restore = spec;
  restore.argv = {CAIRN_REPLICATE_CHILD, "restore", std::to_string(kStateBytes)};
  restore.output_dir = root_->path() + "/restore";
  ASSERT_TRUE(DefaultFileSystem()->MakeDirs(restore.output_dir, 0700).ok());
  auto rl = LocalLauncher::Start(restore);
  ASSERT_TRUE(rl.ok()) << rl.status().ToString();
  const bool ok = (*rl)->WaitAll(120);
  const std::string out1 = ReadFile(restore.output_dir + "/rank-1.log");
  const std::string out0 = ReadFile(restore.output_dir + "/rank-0.log");
  ASSERT_TRUE(ok) << "rank 0:\n" << out0 << "\nrank 1:\n" << out1;
  long long step = -1;
  char tier[16] = {};
  const size_t at = out1.find("restored ");
  ASSERT_NE(at, std::string::npos) << out1;
  ASSERT_EQ(std::sscanf(out1.c_str() + at, "restored %lld tier %15s", &step, tier), 2) << out1;
  EXPECT_STREQ(tier, "peer") << out1;
  EXPECT_EQ(step, predicted) << "cairn ls said:\n" << ls;
  const int64_t bound_steps = static_cast<int64_t>(kBoundS * 1000 / kSleepMs);
  EXPECT_GE(step, last_saved - bound_steps)
      << "restored step " << step << ", newest saved " << last_saved << "\n"
      << out1;
  std::printf("node 1 lost after step %lld: restored step %lld from its partner's memory\n",
              static_cast<long long>(last_saved), step);
  if (std::getenv("CAIRN_FLAP_VERBOSE")) std::printf("%s\n", dump().c_str());
}

// A link cut in the middle of a restore (issue 35): node 1's memory is gone and its rank
// restores from the replica its partner holds, over a link slowed to 10 Mbit/s so that
// the 12 MiB are still on the wire when node 1's port goes down, and stays down. Every rank
// must give up with an error of its own (an exit code, not a signal, nor a hang) within
// a bound set by the collectives' timeout, and once the link is back a second restore
// brings node 1's rank back from its partner's memory, byte for byte.
TEST_F(LinkFlap, ARestoreCutMidTransferFailsOnEveryRankWithinTheBoundAndARetryComesBack) {
  constexpr double kOpTimeoutS = 5;
  std::string job;
  LaunchSpec spec;
  ASSERT_TRUE(Training("rcut", {{"CAIRN_OP_TIMEOUT_S", std::to_string(kOpTimeoutS)}}, &job, &spec));
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const double start = NanosToSeconds(WallNanos());
  for (;;) {  // both directions replicate and keep up
    ASSERT_EQ((*l)->Running(), 2) << Digest(log(0)) << Digest(log(1));
    auto a = Lines(log(0)), b = Lines(log(1));
    if (!a.empty() && !b.empty() && a.back().newest >= 5 && b.back().newest >= 5 &&
        a.back().newest >= a.back().step - 1 && b.back().newest >= b.back().step - 1)
      break;
    ASSERT_LT(NanosToSeconds(WallNanos()) - start, 60) << "replication never started";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE((*l)->Signal(r, SIGKILL).ok());
  for (int r = 0; r < 2; ++r) (*l)->WaitRank(r);
  l->reset();
  ASSERT_TRUE(DefaultFileSystem()->RemoveAll(root_->path() + "/host/" + job + "/node-1").ok());

  auto restore = [&](const std::string& tag) {
    LaunchSpec rs = spec;
    rs.argv = {CAIRN_REPLICATE_CHILD, "restore", std::to_string(kStateBytes)};
    rs.output_dir = root_->path() + "/" + tag;
    EXPECT_TRUE(DefaultFileSystem()->MakeDirs(rs.output_dir, 0700).ok());
    return LocalLauncher::Start(rs);
  };
  auto logs = [&](const std::string& tag) {
    std::string t;
    for (int r = 0; r < 2; ++r)
      t += "\n--- " + tag + " rank " + std::to_string(r) + ":\n" +
           ReadFile(root_->path() + "/" + tag + "/rank-" + std::to_string(r) + ".log");
    return t;
  };
  // 12 MiB at 10 Mbit/s: about 10 s on the wire; the port goes down 3 s into the restore.
  ASSERT_TRUE(cluster_->SetRate(1, "10mbit").ok());
  auto cut = restore("cut");
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_EQ((*cut)->Running(), 2) << "the restore ended before the cut" << logs("cut");
  ASSERT_TRUE(cluster_->Cut(1).ok());
  const double cut_at = NanosToSeconds(WallNanos());
  // The bound: the transfer under way when the link went and the collective after it, each
  // up to the collectives' timeout, a second each to cancel what is left, and 5 s to say
  // so and exit (12.3-12.6 s in all beside a CI run, 11.0 s alone). (Before the fix: 39.6 s, each
  // piece on the wire waiting out the timeout and a second of cancelling, then the collective's
  // send, then 5 s of closing.)
  const double bound_s = (2 * kOpTimeoutS + 2 + 5) * kSanitizerFactor;
  double all_ended_s = -1;
  while (NanosToSeconds(WallNanos()) - cut_at < 4 * bound_s) {
    if ((*cut)->Running() == 0) {
      all_ended_s = NanosToSeconds(WallNanos()) - cut_at;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const bool hung = all_ended_s < 0;
  if (hung) (void)(*cut)->WaitAll(0);  // SIGKILLs what is left, for the retry
  ASSERT_FALSE(hung) << "a rank still ran " << 4 * bound_s << " s after the cut" << logs("cut");
  std::printf("link cut 3 s into the restore: every rank had ended %.2f s later (bound %.0f s)\n",
              all_ended_s, bound_s);
  EXPECT_LE(all_ended_s, bound_s) << logs("cut");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*cut)->WaitRank(r), 1) << "rank " << r << " (1: the restore's error)" << logs("cut");
    const std::string text = ReadFile(root_->path() + "/cut/rank-" + std::to_string(r) + ".log");
    const size_t at = text.find("replicate_child: ");
    EXPECT_NE(at, std::string::npos) << logs("cut");
    if (at != std::string::npos)
      std::printf("rank %d: %s\n", r, text.substr(at, text.find('\n', at) - at).c_str());
  }
  cut->reset();

  // The link comes back: the retry restores node 1's rank from its partner's memory.
  ASSERT_TRUE(cluster_->Heal(1).ok());
  ASSERT_TRUE(cluster_->SetRate(1, "").ok());
  auto again = restore("again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE((*again)->WaitAll(120)) << logs("again");
  const std::string out1 = ReadFile(root_->path() + "/again/rank-1.log");
  long long step = -1;
  char tier[16] = {};
  const size_t at = out1.find("restored ");
  ASSERT_NE(at, std::string::npos) << logs("again");
  ASSERT_EQ(std::sscanf(out1.c_str() + at, "restored %lld tier %15s", &step, tier), 2) << out1;
  EXPECT_STREQ(tier, "peer") << logs("again");
  std::printf("after the link came back: rank 1 restored step %lld from its partner\n", step);
}

// A node's link slowed to 100 Mbit/s (issue 35): a 12 MiB version then takes about a second
// on the wire while a version is saved every 100 ms. Training keeps its pace (median stall
// within 2x the unslowed one, the same allowance as the cuts'), replication goes on but
// lags, the versions it passes over are counted (Stats::replication.passed_over), and once
// the link is fast again it catches up within the bound of the cuts.
TEST_F(LinkFlap, ASlowedLinkKeepsTrainingsPaceWhileReplicationLagsCountsWhatItPassesAndCatchesUp) {
  std::string job;
  LaunchSpec spec;
  ASSERT_TRUE(Training("slow", {}, &job, &spec));
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto dump = [&] {
    return "\n--- rank 0 (step lines that repeat the one before left out):\n" + Digest(log(0)) +
           "\n--- rank 1:\n" + Digest(log(1));
  };
  auto now = [] { return NanosToSeconds(WallNanos()); };
  auto keeping_up = [&] {
    auto a = Lines(log(0)), b = Lines(log(1));
    return !a.empty() && !b.empty() && a.back().newest >= 5 && b.back().newest >= 5 &&
           a.back().newest >= a.back().step - 1 && b.back().newest >= b.back().step - 1;
  };
  // The last "passed_over N" rank `r` printed.
  auto passed_over = [&](int r) -> long long {
    const std::string t = log(r);
    const size_t at = t.rfind("passed_over ");
    return at == std::string::npos ? -1 : std::atoll(t.c_str() + at + 12);
  };
  auto stalls = [&](double from, double to) {
    std::vector<double> v;
    for (int r = 0; r < 2; ++r)
      for (const Line& x : Lines(log(r)))
        if (x.wall >= from && x.wall < to) v.push_back(x.stall_ms);
    return v;
  };
  const double start = now();
  while (!keeping_up()) {
    ASSERT_EQ((*l)->Running(), 2) << dump();
    ASSERT_LT(now() - start, 60) << "replication never started" << dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  constexpr double kWindowS = 8;
  const double fast_from = now();
  std::this_thread::sleep_for(std::chrono::duration<double>(kWindowS));
  const double slow_from = now();
  long long passed_before[2], newest_before[2];
  for (int r = 0; r < 2; ++r) {
    passed_before[r] = passed_over(r);
    newest_before[r] = Lines(log(r)).back().newest;
  }
  ASSERT_TRUE(cluster_->SetRate(1, "100mbit").ok());
  std::this_thread::sleep_for(std::chrono::duration<double>(kWindowS));
  const double slow_to = now();
  long long lag[2], passed[2], pushed[2];
  for (int r = 0; r < 2; ++r) {
    const Line last = Lines(log(r)).back();
    lag[r] = last.step - last.newest;
    passed[r] = passed_over(r) - passed_before[r];
    pushed[r] = last.newest - newest_before[r];
  }
  ASSERT_TRUE(cluster_->SetRate(1, "").ok());
  const double healed = now();
  double caught_up_s = -1;
  while (now() - healed < 3 * kBoundS) {
    if (keeping_up()) {
      caught_up_s = now() - healed;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<double> before = stalls(fast_from, slow_from),
                            during = stalls(slow_from, slow_to);
  std::printf(
      "link of node 1 at 100 Mbit/s for %.0f s: stall median %.2f ms (%.2f ms before), max %.2f "
      "ms; the newest replicated step advanced %lld / %lld, lagged %lld / %lld steps at the end, "
      "%lld / %lld versions passed over (rank 0 / rank 1); caught up %.2f s after the link was "
      "fast again\n",
      kWindowS, Median(during), Median(before),
      during.empty() ? 0 : *std::max_element(during.begin(), during.end()), pushed[0], pushed[1],
      lag[0], lag[1], passed[0], passed[1], caught_up_s);
  ASSERT_EQ((*l)->Running(), 2) << dump();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(pushed[r], 0) << "rank " << r << ": no replica got through the slow link" << dump();
    EXPECT_GT(passed[r], 0) << "rank " << r << ": the slow link passed no version over" << dump();
  }
  EXPECT_GE(caught_up_s, 0) << "replication did not catch up within " << 3 * kBoundS << " s"
                            << dump();
  EXPECT_LE(caught_up_s, kBoundS) << dump();
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LE(Median(during), 2 * Median(before) + 2.0) << dump();
#endif
}

}  // namespace
}  // namespace cairn
