// Replication between processes on loopback, over tcp and over shared memory: 2 nodes x 2
// ranks replicate 20 versions bit-exactly; a partner killed with SIGKILL mid-run never
// stalls the sender, never leaves a replica that reads as complete but is not, and after
// it restarts the next versions replicate again.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "api/channels.h"
#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "redundancy/placement.h"
#include "redundancy/replica_store.h"
#include "redundancy/replicator.h"
#include "tests/crash_state.h"
#include "tests/test_util.h"
#include "tests/tier_util.h"
#include "tiers/host_tier.h"
#include "transport/ucx_comm.h"

namespace cairn {
namespace {

constexpr size_t kStateBytes = 6 << 20;
constexpr size_t kKillStateBytes = 32 << 20;

std::string ReadLog(const std::string& dir, int rank) {
  std::ifstream f(dir + "/rank-" + std::to_string(rank) + ".log");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct StepLine {
  int64_t step;
  double stall_ms;
  uint64_t replicated, failed;
};

std::vector<StepLine> Steps(const std::string& log) {
  std::vector<StepLine> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    StepLine s{};
    unsigned long long r = 0, f = 0;
    long long t = 0;
    if (std::sscanf(line.c_str(), "step %lld stall_ms %lf replicated %llu failed %llu", &t,
                    &s.stall_ms, &r, &f) == 4) {
      s.step = t;
      s.replicated = r;
      s.failed = f;
      out.push_back(s);
    }
  }
  return out;
}

// A rank's log for a failure message that CI shows only in part: every line but the step
// lines, which are kept only from `from` to `to` and every 100th.
std::string Digest(const std::string& log, int64_t from, int64_t to) {
  std::istringstream in(log);
  std::string line, out;
  while (std::getline(in, line)) {
    long long t = 0;
    if (std::sscanf(line.c_str(), "step %lld ", &t) == 1 && (t < from || t > to) && t % 100 != 0)
      continue;
    out += line + "\n";
  }
  return out;
}

// Every complete replica of `source` held on `holder_node` must be bit-exact; returns the
// steps found.
std::vector<int64_t> CheckReplicas(const std::string& host_root, const std::string& job,
                                   int holder_node, int source, size_t state_bytes = kStateBytes) {
  const std::string dir = ReplicaStore::SourceDir(
      host_root + "/" + job + "/node-" + std::to_string(holder_node), source);
  Logger log("test", LogLevel::kError);
  HostTierConfig c;
  c.dir = dir;
  auto tier = HostTier::Open(c, DefaultFileSystem(), &log);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  std::vector<int64_t> steps;
  if (!tier.ok()) return steps;
  for (const VersionInfo& v : (*tier)->Versions()) {
    auto view = (*tier)->Pin(v.step);
    EXPECT_TRUE(view.ok());
    const SlotHeader& h = (*view)->header();
    EXPECT_TRUE(ReplicaStore::Verify(h, (*view)->data()).ok()) << "step " << v.step;
    testing::CrashState want(state_bytes);
    want.Fill(v.step * 64 + source);
    auto shards = want.Shards();
    EXPECT_EQ(h.shards.size(), shards.size());
    for (size_t i = 0; i < std::min(h.shards.size(), shards.size()); ++i)
      EXPECT_EQ(
          std::memcmp((*view)->data() + h.shards[i].offset, shards[i].data, h.shards[i].nbytes), 0)
          << "replica of rank " << source << " step " << v.step << " tensor " << h.shards[i].name;
    steps.push_back(v.step);
  }
  return steps;
}

LaunchSpec Spec(const testing::TempDir& root, const std::string& job, const std::string& tls,
                int nodes, int rpn, const std::vector<std::string>& args) {
  LaunchSpec spec;
  spec.nodes = nodes;
  spec.ranks_per_node = rpn;
  spec.argv = {CAIRN_REPLICATE_CHILD};
  for (const auto& a : args) spec.argv.push_back(a);
  spec.output_dir = root.path();
  spec.env = {{"CAIRN_JOB_ID", job},
              {"CAIRN_HOST_ROOT", root.path() + "/host"},
              {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
              {"CAIRN_CONNECT_TIMEOUT_S", "60"},
              {"CAIRN_REPLICATE_TIMEOUT_S", "3"},
              {"CAIRN_PERSIST_EVERY", "0"},
              // Unpaced: these tests count the versions the protocol carries (pacing has
              // its own, Replicator.PacedPushesStayWithinTheirShareOfTheTime).
              {"CAIRN_REPLICATE_SHARE", "1"},
              {"CAIRN_LOG_LEVEL", "2"},
              {"UCX_TLS", tls}};
  return spec;
}

class ReplicationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicationTest, TwoNodesReplicateTwentyVersionsBitExact) {
  testing::TempDir root("repl");
  const std::string job = testing::UniqueJobId("repl");
  // Block policy with the smallest ring (2 slots): no version may be skipped, and a save
  // waits while a push holds the other slot, so the loop is paced by replication.
  LaunchSpec spec = Spec(root, job, GetParam(), 2, 2, {"20", std::to_string(kStateBytes), "15"});
  spec.env.push_back({"CAIRN_FULL_POLICY", "block"});
  spec.env.push_back({"CAIRN_SLOTS", "2"});
  // cairn's default replicate timeout, not Spec's 3 s: this test asserts that no push fails,
  // and stop 52's CI (2 vCPUs, ctest -j2) had the first push of 6 MiB over tcp take more
  // than 3 s (the receiver gave it up), so a short timeout measured the machine.
  for (auto& [k, v] : spec.env)
    if (k == "CAIRN_REPLICATE_TIMEOUT_S") v = "30";
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const bool ok = (*l)->WaitAll(180);
  for (int r = 0; r < 4; ++r) {
    const std::string log = ReadLog(root.path(), r);
    EXPECT_EQ((*l)->ranks()[static_cast<size_t>(r)].exit_code, 0) << "rank " << r << ":\n" << log;
    // Newest first: a version captured while an older push ran may be superseded before it
    // is sent, so not all 20 need a push of their own; the newest must arrive and no push
    // may fail. The first push also wires the endpoint up, which took a second on a loaded
    // CI machine while twelve versions were passed over; from then on the block policy
    // paces the loop by replication, so at least every other later save is pushed.
    unsigned long long replicated = 0, failed = 0;
    long long newest = 0;
    const size_t fin = log.find("final replicated");
    ASSERT_NE(fin, std::string::npos) << log;
    ASSERT_EQ(std::sscanf(log.c_str() + fin, "final replicated %llu failed %llu newest %lld",
                          &replicated, &failed, &newest),
              3);
    EXPECT_EQ(newest, 20) << log;
    EXPECT_EQ(failed, 0u) << log;
    const auto lines = Steps(log);
    const auto first = std::find_if(lines.begin(), lines.end(),
                                    [](const StepLine& s) { return s.replicated > 0; });
    if (first != lines.end()) {
      EXPECT_GE(2 * (replicated - first->replicated), static_cast<uint64_t>(20 - first->step))
          << "first push done by step " << first->step << "\n"
          << log;
    }
  }
  ASSERT_TRUE(ok);
  // Ring placement: rank r's replicas live on rank (r + 2) % 4, i.e. the other node.
  for (int r = 0; r < 4; ++r) {
    auto steps = CheckReplicas(root.path() + "/host", job, 1 - r / 2, r);
    ASSERT_FALSE(steps.empty()) << "no replica of rank " << r;
    EXPECT_EQ(steps.front(), 20) << "newest replica of rank " << r;
    // The source recorded its newest version as REPLICATED.
    auto own = HostTier::Scan(DefaultFileSystem(),
                              HostTier::RankDir(root.path() + "/host", job, r / 2, r), nullptr);
    ASSERT_TRUE(own.ok());
    ASSERT_FALSE(own->empty());
    EXPECT_EQ(own->front().step, 20);
    EXPECT_EQ(own->front().state, VersionState::kReplicated);
  }
}

TEST_P(ReplicationTest, KilledPartnerNeverStallsAndReplicationResumesAfterRestart) {
  testing::TempDir root("replkill");
  const std::string job = testing::UniqueJobId("replkill");
  // Rank 0 (node 0) saves 600 versions of 32 MiB, one every ~15 ms, so a transfer to rank 1
  // is in flight nearly all the time; rank 1 (node 1) is killed after rank 0's 40th version
  // (in the middle of a transfer, most likely), stays dead for a second, and comes back. Over
  // shared memory the death shows only as the 3 s replication timeout, so rank 0 runs long enough
  // to see replication resume after that.
  LaunchSpec spec = Spec(root, job, GetParam(), 2, 1, {});
  spec.env.push_back({"CAIRN_SLOT_BYTES", "40M"});  // slots sized and pre-faulted at open
  spec.rank_args = {{"600", std::to_string(kKillStateBytes), "10"},
                    {"60", std::to_string(kKillStateBytes), "10"}};
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok());
  // Kill once rank 0 is well under way (by its log, not by the clock: sanitizer builds
  // are many times slower) and rank 1 has acknowledged a replica: the check right after the
  // kill needs a complete one, and 40 steps do not always take a first push to its end on a
  // slow machine (a slot's first use there costs about 2.5 s per GiB).
  size_t steps_before_kill = 0;
  uint64_t replicated_before_kill = 0;
  for (int i = 0; i < 2400 && (steps_before_kill < 40 || replicated_before_kill < 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::vector<StepLine> s = Steps(ReadLog(root.path(), 0));
    steps_before_kill = s.size();
    replicated_before_kill = s.empty() ? 0 : s.back().replicated;
  }
  ASSERT_TRUE((*l)->Signal(1, SIGKILL).ok());
  EXPECT_EQ((*l)->WaitRank(1), 128 + SIGKILL);
  // Right after the kill: a replica that was being received reads as CAPTURING (never
  // restorable), and every replica that reads as complete is bit-exact.
  const std::string replica_dir =
      ReplicaStore::SourceDir(root.path() + "/host/" + job + "/node-1", 0);
  auto left = HostTier::Scan(DefaultFileSystem(), replica_dir, nullptr);
  ASSERT_TRUE(left.ok());
  bool torn = false;
  for (const VersionInfo& v : *left) torn = torn || !IsRestorable(v.state);
  std::printf("the kill left a half-received replica behind: %s\n", torn ? "yes" : "no");
  EXPECT_FALSE(CheckReplicas(root.path() + "/host", job, 1, 0, kKillStateBytes).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_TRUE((*l)->Restart(1).ok());
#if defined(__SANITIZE_THREAD__)
  const bool ok = (*l)->WaitAll(900);  // ThreadSanitizer copies 32 MiB about 5x slower
#else
  const bool ok = (*l)->WaitAll(180);
#endif
  const std::string log0 = ReadLog(root.path(), 0), log1 = ReadLog(root.path(), 1);
  EXPECT_TRUE(ok) << "rank 0:\n" << log0 << "\nrank 1:\n" << log1;
  // UCX 1.18 aborted at exit here (ucp_cleanup) after a send to the killed rank was
  // abandoned in flight; UcxComm now leaves its worker to process exit then.
  std::printf("rank 0 abandoned UCX sends at exit: %s\n",
              log0.find("never completed") != std::string::npos ? "yes" : "no");
  auto steps = Steps(log0);
  ASSERT_GE(steps.size(), 600u) << log0;
  ASSERT_GT(steps_before_kill, 5u);
  // The training loop kept its pace: no iteration of rank 0 waited on the dead partner.
  // Against the loop's own pace before the kill (sanitizer builds copy far slower), with a
  // floor of 250 ms that leaves room for what the restarted partner's start costs this loop
  // on a 2-core machine (its 3 x 40 MiB slots pre-faulted while the fence copies 32 MiB):
  // under ctest -j2 in the Debian 13 root, stalls of 103 to 157 ms after the restart failed
  // a floor of 100 ms on the code before and after issue 31 alike (tests/RELIABILITY.md).
  // A wait on the dead partner lasts up to the 3 s replication timeout, or repeats on every
  // save while the partner is gone (about 70 of them over the dead second); a machine that
  // is busy with other tests stalls one iteration now and then: CI saw single stalls of 524
  // and 457 ms hundreds of steps after the restart, replication long since resumed. So: no
  // stall reaches a third of the timeout (or twice the bound), and at most two pass the bound.
  double before = 0;
  for (size_t i = 5; i < steps_before_kill; ++i) before = std::max(before, steps[i].stall_ms);
  const double bound = std::max(250.0, 3 * before + 20);
  double worst = 0;
  int64_t worst_step = 0;
  std::string over;
  int over_bound = 0;
  for (size_t i = steps_before_kill; i < steps.size(); ++i) {
    if (steps[i].stall_ms > worst) {
      worst = steps[i].stall_ms;
      worst_step = steps[i].step;
    }
    if (steps[i].stall_ms >= bound) {
      ++over_bound;
      over += " step " + std::to_string(steps[i].step) + ": " + std::to_string(steps[i].stall_ms) +
              " ms;";
    }
  }
  // On a failure, printed: what both ranks logged around the worst stall (its steps, and
  // every line that is no step's: warnings, the partner's restart), to tell a wait on the
  // partner from a machine that descheduled the loop (a 3.06 s stall hundreds of steps
  // after the restart, under the whole ASan suite, 2026-11-29).
  auto around = [&] {
    // Rank 0's lines from its step worst - 5 to worst + 3 (warnings in between included),
    // and rank 1's last 15 (it saved its 60 steps long before and waits for the end).
    auto lines = [](const std::string& log) {
      std::vector<std::string> out;
      std::istringstream in(log);
      for (std::string l; std::getline(in, l);) out.push_back(l);
      return out;
    };
    std::string out = "\nrank 0 around it:\n";
    bool in_window = false;
    for (const std::string& l : lines(log0)) {
      long long t = 0;
      if (std::sscanf(l.c_str(), "step %lld ", &t) == 1) {
        if (t > worst_step + 3) break;
        in_window = t >= worst_step - 5;
      }
      if (in_window) out += l.substr(0, 300) + "\n";
    }
    const std::vector<std::string> one = lines(log1);
    out += "rank 1's last lines:\n";
    for (size_t i = one.size() > 15 ? one.size() - 15 : 0; i < one.size(); ++i)
      out += one[i].substr(0, 300) + "\n";
    return out;
  };
  const double stall_limit = std::max(1000.0, 2 * bound);
  EXPECT_LT(worst, stall_limit) << "rank 0 stalled at step " << worst_step
                                << " while its partner was dead or restarting";
  EXPECT_LE(over_bound, 2) << "rank 0 stalled past " << bound << " ms (worst stall before "
                           << "the kill: " << before << " ms) at" << over;
  if (worst >= stall_limit || over_bound > 2) std::printf("%s", around().c_str());
  // Failures were counted, and versions replicated again after the restart.
  const StepLine at_kill = steps[steps_before_kill - 1];
  // What the kill and the restart looked like from both ranks, short enough to be read whole.
  const std::string seen = "rank 0 (killed its partner after step " + std::to_string(at_kill.step) +
                           "):\n" + Digest(log0, at_kill.step - 3, at_kill.step + 40) +
                           "rank 1:\n" + Digest(log1, at_kill.step - 3, at_kill.step + 3);
  unsigned long long replicated = 0, failed = 0;
  const size_t fin = log0.find("final replicated");
  ASSERT_NE(fin, std::string::npos) << seen;
  ASSERT_EQ(
      std::sscanf(log0.c_str() + fin, "final replicated %llu failed %llu", &replicated, &failed),
      2);
  EXPECT_GT(failed, 0u) << seen;
  EXPECT_GT(replicated, at_kill.replicated + 5) << seen;
  EXPECT_NE(log0.find("status OK"), std::string::npos) << seen;
  // Whatever the kill left on node 1, nothing that reads as complete is torn.
  auto held = CheckReplicas(root.path() + "/host", job, 1, 0, kKillStateBytes);
  ASSERT_FALSE(held.empty());
  // ... and the newest replica is rank 0's newest version (the last saves may have been
  // skipped while a push held a slot).
  auto own = HostTier::Scan(DefaultFileSystem(),
                            HostTier::RankDir(root.path() + "/host", job, 0, 0), nullptr);
  ASSERT_TRUE(own.ok());
  ASSERT_FALSE(own->empty());
  EXPECT_EQ(held.front(), own->front().step) << seen;
  EXPECT_GT(held.front(), 500) << seen;
}

INSTANTIATE_TEST_SUITE_P(Transports, ReplicationTest, ::testing::Values("tcp", "sm,self"),
                         [](const auto& info) { return info.param == "tcp" ? "tcp" : "shm"; });

// Ranks that fall behind pick the same steps: by step number, not by when their own push
// happened to finish.
// CAIRN_REPLICATE_PRIORITY=low: every thread of replication (sender, service, verifier)
// runs at nice 10 on both sides, so training comes first where no core is spare
// (docs/performance.md, "Training time lost per failure").
TEST(ReplicatePriority, LowRunsEveryReplicationThreadAtNice10) {
  testing::TempDir root("repl-prio");
  const std::string job = testing::UniqueJobId("repl-prio");
  LaunchSpec spec = Spec(root, job, "tcp", 2, 1, {"3", std::to_string(1 << 20), "10"});
  spec.env.push_back({"CAIRN_REPLICATE_PRIORITY", "low"});
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->WaitAll(120));
  for (int r = 0; r < 2; ++r) {
    const std::string log = ReadLog(root.path(), r);
    EXPECT_EQ((*l)->ranks()[static_cast<size_t>(r)].exit_code, 0) << log;
    const size_t at = log.find("\nthreads ") + 1;
    ASSERT_NE(at, 0u) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at) + " ";
    for (const char* t : {" cairn-repl-send:10 ", " cairn-repl-serv:10 ", " cairn-verify:10 "})
      EXPECT_NE(line.find(t), std::string::npos) << t << " in: " << line;
  }
}

// One rank of a two-rank job in this process (each a node of one rank), rank 1 holding
// rank 0's replicas over UCX: its own tier, its replica store and its replicator.
struct InProcessRank {
  std::unique_ptr<UcxComm> comm;
  std::unique_ptr<HostTier> tier;
  std::unique_ptr<ReplicaStore> store;
  std::unique_ptr<Replicator> replicator;
};

// Connects two InProcessRanks (3 slots each) of job `job` under `root` (host tier at
// `host`), rank 1 holding rank 0's replicas; `share`: CAIRN_REPLICATE_SHARE.
void OpenTwoRanks(const testing::TempDir& root, const std::string& job, const std::string& host,
                  const Logger& log, InProcessRank (&ranks)[2], double share = 1.0) {
  {
    std::vector<std::thread> joining;
    Status connected[2];
    for (int r = 0; r < 2; ++r)
      joining.emplace_back([&, r] {
        Options o;
        o.job_id = job;
        o.pfs_root = root.path() + "/pfs";
        o.rank = r;
        o.world_size = 2;
        o.local_world_size = 1;
        o.node = r;
        auto c = UcxComm::Connect(o, &log);
        connected[r] = c.status();
        if (c.ok()) ranks[r].comm = std::move(*c);
      });
    for (std::thread& t : joining) t.join();
    for (const Status& st : connected) ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (int r = 0; r < 2; ++r) {
    HostTierConfig c;
    c.dir = HostTier::RankDir(host, job, r, r);
    c.trust_top = host;
    c.slots = 3;
    auto tier = HostTier::Open(std::move(c), DefaultFileSystem(), &log);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    ranks[r].tier = std::move(*tier);
    ranks[r].store = std::make_unique<ReplicaStore>(host + "/" + job + "/node-" + std::to_string(r),
                                                    DefaultFileSystem(), &log, 3, host);
    auto placement = Placement::Make(2, 1, 1, PlacementStrategy::kRing);
    ASSERT_TRUE(placement.ok()) << placement.status().ToString();
    ranks[r].replicator = std::make_unique<Replicator>(
        ranks[r].comm.get(), JobChannels{}.replication, std::move(*placement), ranks[r].tier.get(),
        ranks[r].store.get(), &log, 20.0, std::nullopt, ThreadPriority::kNormal, share);
  }
}

// The ranks leave together, as processes would (a closing rank waits for its peers' last
// words a while).
void CloseTwoRanks(InProcessRank (&ranks)[2]) {
  for (InProcessRank& r : ranks) r.replicator.reset();
  std::vector<std::thread> leaving;
  for (InProcessRank& r : ranks) leaving.emplace_back([&r] { r.comm.reset(); });
  for (std::thread& t : leaving) t.join();
}

// A holder keeps the replica of the step its source keeps (the agreed one) however many
// newer versions come after it, in place of only the newest ones: while a rank on another
// node skipped its saves, the agreement stayed on a step the other ranks' holders had already
// reused, and a lost node had no step every rank held (the crash matrices under ASan,
// tests/RELIABILITY.md). Rank 0 keeps step 2, then captures and replicates 3-9 (3 slots).
TEST(ReplicaHolder, KeepsTheReplicaOfTheStepItsSourceKeepsWhileNewerOnesCome) {
  testing::TempDir root("repl-keep");
  const std::string job = testing::UniqueJobId("repl-keep");
  const std::string host = root.path() + "/host";
  ASSERT_TRUE(DefaultFileSystem()->MakeDirs(host, 0700).ok());
  Logger log("test", LogLevel::kError);
  InProcessRank ranks[2];
  OpenTwoRanks(root, job, host, log, ranks);
  if (::testing::Test::HasFatalFailure()) return;
  HostTier& own = *ranks[0].tier;
  for (int64_t step = 1; step <= 9; ++step) {
    ASSERT_TRUE(testing::CaptureInto(own, step)) << step;
    // The job agreed on step 2: rank 0's tier keeps it (StepAgreement does this).
    if (step == 2) {
      ASSERT_EQ(own.Keep({2}, {}), std::vector<int64_t>{2});
    }
    ranks[0].replicator->Notify(step);
    Status st = ranks[0].replicator->WaitReplicated(step, 20);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.ToString();
  }
  auto held = ranks[1].store->TierFor(0);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::vector<int64_t> steps;
  for (const VersionInfo& v : (*held)->Versions()) steps.push_back(v.step);
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 8, 9}));
  CloseTwoRanks(ranks);
}

// CAIRN_REPLICATE_SHARE: pushes take at most about that share of the wall clock. Rank 0
// saves a step every 4 ms for 150 steps with a share of 2%: the replicator measures the
// push and the step and pushes one step in every 2^k, the first of each block, so that its
// pushes' time stays near 2% of the run (unpaced, 64 KiB pushes over loopback take a
// quarter or more). Waiting for replication lifts the pacing: the last step is then pushed.
TEST(Replicator, PacedPushesStayWithinTheirShareOfTheTime) {
  testing::TempDir root("repl-pace");
  const std::string job = testing::UniqueJobId("repl-pace");
  const std::string host = root.path() + "/host";
  ASSERT_TRUE(DefaultFileSystem()->MakeDirs(host, 0700).ok());
  Logger log("test", LogLevel::kError);
  InProcessRank ranks[2];
  constexpr double kShare = 0.02;
  OpenTwoRanks(root, job, host, log, ranks, kShare);
  if (::testing::Test::HasFatalFailure()) return;
  Replicator& repl = *ranks[0].replicator;
  const int64_t t0 = NowNanos();
  constexpr int64_t kSteps = 150;
  for (int64_t step = 1; step <= kSteps; ++step) {
    if (testing::CaptureInto(*ranks[0].tier, step)) repl.Notify(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(4));
  }
  const double wall = NanosToSeconds(NowNanos() - t0);
  const ReplicatorStats paced = repl.stats();
  EXPECT_GT(paced.every, 1) << "push " << paced.push_s << " s, step " << paced.step_s << " s";
  EXPECT_GT(paced.replicated, 1u);
  EXPECT_GT(paced.passed_over, 0u);
  // Pushes' time within the share, with room for the first ones (before the measure) and a
  // block that comes early after a late push.
  EXPECT_LT(paced.seconds / wall, 3 * kShare) << paced.replicated << " pushes of " << paced.seconds
                                              << " s in " << wall << " s, one in " << paced.every;
  EXPECT_EQ(paced.behind_steps, kSteps - paced.newest_replicated);
  EXPECT_LE(paced.behind_steps, 2 * paced.every + 1);
  Status st = repl.WaitReplicated(kSteps, 20);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(repl.stats().newest_replicated, kSteps);
  EXPECT_EQ(repl.stats().behind_steps, 0);
  CloseTwoRanks(ranks);
}

TEST(BlobsOnlyHeader, KeepsTheBlobsAtTheirNewOffsetsAndNoTensor) {
  SlotHeader h;
  h.state = VersionState::kCaptured;
  h.step = 12;
  h.rank = 3;
  h.world_size = 4;
  h.chunk_bytes = 4096;
  h.shards.push_back({"w", DType::kF32, {1024}, Box{{0}, {1024}}, 0, 4096, 0, 1});
  h.chunk_checksums = {77};
  h.blobs = {{"rng", 4096, 16, 5}, {"who", 4160, 3, 6}};
  h.data_bytes = 4163;
  uint64_t from = 0;
  SlotHeader b = BlobsOnlyHeader(h, &from);
  EXPECT_EQ(from, 4096u);
  EXPECT_EQ(b.data_bytes, 67u);
  EXPECT_TRUE(b.shards.empty());
  EXPECT_TRUE(b.chunk_checksums.empty());
  ASSERT_EQ(b.blobs.size(), 2u);
  EXPECT_EQ(b.blobs[0].offset, 0u);
  EXPECT_EQ(b.blobs[1].offset, 64u);
  EXPECT_EQ(b.blobs[1].checksum, 6u);
  EXPECT_EQ(b.step, 12);
  EXPECT_EQ(b.rank, 3u);
  // A header a holder accepts.
  auto back = DecodeSlotHeader(EncodeSlotHeader(b));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, b);
  // No blobs: nothing to send.
  h.blobs.clear();
  h.data_bytes = 4096;
  b = BlobsOnlyHeader(h, &from);
  EXPECT_EQ(b.data_bytes, 0u);
  EXPECT_TRUE(DecodeSlotHeader(EncodeSlotHeader(b)).ok());
}

TEST(ChooseReplicationStep, KeepsUpWithEveryVersionAndAlignsStepsWhenBehind) {
  const std::vector<int64_t> held = {9, 10, 11, 12, 13, 14, 15, 16, 17};
  EXPECT_EQ(ChooseReplicationStep(-1, 5, held), 5);    // first push: the newest
  EXPECT_EQ(ChooseReplicationStep(12, 13, held), 13);  // keeping up: every version
  // Two ranks behind by 3 and 2 from different places both pick an even step.
  EXPECT_EQ(ChooseReplicationStep(10, 13, held), 12);
  EXPECT_EQ(ChooseReplicationStep(11, 13, held), 12);
  // Behind by 4..7: a multiple of 4; by 8 or more: of 8.
  EXPECT_EQ(ChooseReplicationStep(9, 15, held), 12);
  EXPECT_EQ(ChooseReplicationStep(8, 17, held), 16);
  // Nothing aligned is held: the newest.
  EXPECT_EQ(ChooseReplicationStep(12, 15, {13, 15}), 15);
  // Never an already tried step, never one newer than captured.
  EXPECT_EQ(ChooseReplicationStep(16, 19, {16, 17, 18, 19, 20}), 18);
}

}  // namespace
}  // namespace cairn
