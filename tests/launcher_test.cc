// Jobs started by real launchers: Open MPI's mpirun (the ranks find each other through
// PMIx, transport/pmix_book.h; rank, world size and local rank come from OMPI_COMM_WORLD_*),
// `cairn launch` (address files in the rendezvous directory), and `cairn launch` started by
// `mpirun -n 1` (a launcher inside a PMIx one, as torchrun under srun: address files). Under each,
// 2 nodes x 2 ranks train with replication and a flush to the PFS, node 1's host tier is wiped, and
// the job restarts under the same launcher: every rank restores the newest step bit-exact, node 1
// from node 0's memory, nothing from the PFS. Skipped when this build has no PMIx or mpirun is not
// installed (the mpirun cases).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "persist/manifest.h"
#include "tests/recovery_process_util.h"
#include "tests/test_util.h"
#include "transport/pmix_book.h"

namespace cairn {
namespace {

using testing::TempDir;
using namespace testing::recovery;

constexpr int kNodes = 2, kPerNode = 2, kWorld = kNodes * kPerNode;
constexpr int64_t kLast = 3;
constexpr const char* kLauncherRows = "512";

enum class Launcher {
  kMpirun,            // mpirun starts the ranks: PMIx
  kCairnLaunch,       // cairn launch starts them: address files
  kCairnLaunchInside  // mpirun -n 1 starts cairn launch, which starts them (as torchrun
                      // under srun): the PMIx job is not cairn's, so address files
};

struct Case {
  const char* name;
  Launcher launcher;
  bool lazy;  // CAIRN_CONNECT_ALL_MAX below the world size
  bool mpirun() const { return launcher != Launcher::kCairnLaunch; }
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The shell command that runs `argv` as `nodes` x `per_node` ranks under the case's
// launcher, each rank's output in <out>/rank-<r>.log.
std::string Command(const Case& c, const std::vector<std::pair<std::string, std::string>>& env,
                    const std::vector<std::string>& argv, const std::string& out,
                    int nodes = kNodes, int per_node = kPerNode) {
  std::string child;
  for (const std::string& a : argv) child += (child.empty() ? "" : " ") + Quote(a);
  std::string cmd = "timeout -k 10 240 env";
  for (const auto& [k, v] : env) cmd += " " + k + "=" + Quote(v);
  std::string rank_var;
  auto mpirun = [&](int n) {
    cmd += " mpirun -n " + std::to_string(n) + " --oversubscribe --bind-to none";
    if (geteuid() == 0) cmd += " --allow-run-as-root";
    for (const auto& e : env) cmd += " -x " + e.first;
  };
  if (c.launcher == Launcher::kMpirun) {
    // mpirun puts every rank on this one host; "nodes" of per_node ranks are made by
    // overriding only the local layout: the rank and world size come from the launcher.
    mpirun(nodes * per_node);
    rank_var = "$OMPI_COMM_WORLD_RANK";
    child = "CAIRN_LOCAL_WORLD_SIZE=" + std::to_string(per_node) +
            " CAIRN_LOCAL_RANK=$((OMPI_COMM_WORLD_RANK % " + std::to_string(per_node) + ")) " +
            child;
  } else {
    if (c.launcher == Launcher::kCairnLaunchInside) mpirun(1);
    cmd += " " + Quote(CAIRN_CLI) + " launch --nodes " + std::to_string(nodes) +
           " --ranks-per-node " + std::to_string(per_node) + " --timeout 200 --";
    rank_var = "$RANK";
  }
  cmd += " sh -c " +
         Quote("exec env " + child + " > " + Quote(out) + "/rank-" + rank_var + ".log 2>&1");
  return cmd;
}

// Why the mpirun cases cannot run here ("" when they can).
std::string MpirunMissing() {
  if (!PmixAvailable()) return "this cairn was built without PMIx";
  if (std::system("command -v mpirun > /dev/null") != 0)
    return "mpirun is not installed (Debian: openmpi-bin)";
  return "";
}

// <root>/<name>, made: where a run's rank logs go.
std::string OutDir(const TempDir& root, const std::string& name) {
  const std::string out = root.path() + "/" + name;
  EXPECT_TRUE(DefaultFileSystem()->MakeDirs(out, 0700).ok()) << out;
  return out;
}

class UnderLauncher : public ::testing::TestWithParam<Case> {};

TEST_P(UnderLauncher, TrainsLosesANodeAndRestoresItFromItsPeer) {
  const Case c = GetParam();
  if (const std::string why = c.mpirun() ? MpirunMissing() : ""; !why.empty()) GTEST_SKIP() << why;
  TempDir root("launch");
  const std::string job = testing::UniqueJobId(std::string("launch-") + c.name);
  // The environment both launchers pass on. No CAIRN_RANK or CAIRN_WORLD_SIZE: the
  // launcher's own variables must do.
  const std::vector<std::pair<std::string, std::string>> env = {
      {"CAIRN_JOB_ID", job},
      {"CAIRN_HOST_ROOT", root.path() + "/host"},
      {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
      {"CAIRN_REPLICAS", "1"},
      {"CAIRN_PERSIST_EVERY", "0"},
      {"CAIRN_SLOTS", "3"},
      {"CAIRN_CONNECT_TIMEOUT_S", "60"},
      {"CAIRN_OP_TIMEOUT_S", "60"},
      {"CAIRN_CHUNK_BYTES", "64K"},
      {"CAIRN_LOG_LEVEL", "2"},
      {"CAIRN_CONNECT_ALL_MAX", c.lazy ? "2" : "64"},
      {"UCX_TLS", "tcp"}};
  auto run = [&](const std::vector<std::string>& args, const std::string& tag) {
    const std::string out = OutDir(root, tag);
    std::vector<std::string> argv = {CAIRN_RECOVERY_CHILD};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string cmd = Command(c, env, argv, out);
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd << "\n" << Logs(out, kWorld);
    return out;
  };

  const std::string train =
      run({"train", "flat", kLauncherRows, "1", std::to_string(kLast)}, "train");
  auto latest = ReadLatest(DefaultFileSystem(), PfsJobDir(root.path() + "/pfs", job));
  ASSERT_TRUE(latest.ok()) << latest.status().ToString() << "\n" << Logs(train, kWorld);
  ASSERT_EQ(*latest, kLast);
  // How the ranks found each other.
  namespace fs = std::filesystem;
  const fs::path rdv = fs::path(root.path()) / "pfs" / job / "rendezvous";
  const std::string logs = Logs(train, kWorld);
  if (c.launcher == Launcher::kMpirun) {
    EXPECT_NE(logs.find("PMIx namespace"), std::string::npos) << logs;
    EXPECT_FALSE(fs::exists(rdv)) << "a PMIx job wrote a rendezvous directory";
  } else {
    EXPECT_TRUE(fs::exists(rdv / "token"));
    EXPECT_EQ(logs.find("PMIx namespace"), std::string::npos) << logs;
  }
  if (c.launcher == Launcher::kCairnLaunchInside) {
    EXPECT_NE(logs.find("rank 0 of 1, but cairn's job has 4 ranks: finding the ranks through "
                        "address files"),
              std::string::npos)
        << logs;
  }

  fs::remove_all(fs::path(root.path()) / "host" / job / "node-1");
  const std::string out = run({"restore", "flat", kLauncherRows, std::to_string(kLast)}, "restore");
  for (int r = 0; r < kWorld; ++r) {
    const Restored x = ParseRestored(LastLine(out, r, "restored "));
    EXPECT_EQ(x.step, kLast) << "rank " << r << "\n" << Logs(out, kWorld);
    EXPECT_EQ(x.tier, r / kPerNode == 1 ? "peer" : "host") << "rank " << r;
    EXPECT_EQ(x.pfs, 0u) << "rank " << r << " read the PFS";
  }
}

INSTANTIATE_TEST_SUITE_P(Launchers, UnderLauncher,
                         ::testing::Values(Case{"mpirun", Launcher::kMpirun, false},
                                           Case{"mpirun_lazy", Launcher::kMpirun, true},
                                           Case{"cairn_launch", Launcher::kCairnLaunch, false},
                                           Case{"cairn_launch_lazy", Launcher::kCairnLaunch, true},
                                           Case{"cairn_launch_inside_mpirun",
                                                Launcher::kCairnLaunchInside, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// A lazy job of 16 ranks under mpirun: after barriers, allgathers and a broadcast from
// every root (every byte checked), each rank holds endpoints to, and has looked up in PMIx
// the addresses of, at most its 2 x log2(16) = 8 collective neighbours (group_child checks
// both and fails above), and no rendezvous directory was made.
TEST(UnderLauncher, LazyJobUnderMpirunLooksUpOnlyItsNeighbours) {
  if (const std::string why = MpirunMissing(); !why.empty()) GTEST_SKIP() << why;
  TempDir root("launch");
  const std::string out = OutDir(root, "out");
  const std::string job = testing::UniqueJobId("launch-lazy16");
  const std::string cmd = Command(Case{"mpirun", Launcher::kMpirun, true},
                                  {{"CAIRN_JOB_ID", job},
                                   {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
                                   {"CAIRN_CONNECT_ALL_MAX", "8"},
                                   {"CAIRN_CONNECT_TIMEOUT_S", "60"},
                                   {"CAIRN_OP_TIMEOUT_S", "60"},
                                   {"UCX_TLS", "tcp"}},
                                  {CAIRN_GROUP_CHILD, "collectives"}, out, 8, 2);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << Logs(out, 16);
  for (int r = 0; r < 16; ++r) {
    const std::string line = LastLine(out, r, "rank ");
    EXPECT_NE(line.find("lazy"), std::string::npos) << "rank " << r << ": " << line;
    std::printf("%s\n", line.c_str());
  }
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root.path()) / "pfs" / job))
      << "a PMIx job wrote to the shared filesystem";
}

// With CAIRN_BOOTSTRAP=pmix, a job whose settings disagree with the launcher's numbering
// fails at start-up naming both, instead of waiting for ranks that will never come.
TEST(UnderLauncher, RankThatDisagreesWithPmixFailsNamingBoth) {
  if (const std::string why = MpirunMissing(); !why.empty()) GTEST_SKIP() << why;
  TempDir root("launch");
  const std::string out = OutDir(root, "out");
  const Case c{"mpirun", Launcher::kMpirun, false};
  const std::string cmd =
      Command(c,
              {{"CAIRN_JOB_ID", testing::UniqueJobId("launch-bad")},
               {"CAIRN_HOST_ROOT", root.path() + "/host"},
               {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
               {"CAIRN_WORLD_SIZE", "8"},
               {"CAIRN_BOOTSTRAP", "pmix"},  // auto would take address files instead
               {"CAIRN_CONNECT_TIMEOUT_S", "5"},
               {"UCX_TLS", "tcp"}},
              {CAIRN_RECOVERY_CHILD, "restore", "flat", kLauncherRows, "1"}, out);
  EXPECT_NE(std::system(cmd.c_str()), 0);
  // mpirun kills the other ranks when the first one fails (one killed inside PMIx_Init
  // may leave PMIx's own complaint in its log): every rank that got to report an error
  // names both numberings, and one did.
  int explained = 0;
  for (int r = 0; r < kWorld; ++r) {
    const std::string line = LastLine(out, r, "recovery_child: ");
    if (line.empty()) continue;
    EXPECT_NE(line.find("PMIx says this process is rank " + std::to_string(r) +
                        " of 4, but cairn was configured as rank " + std::to_string(r) + " of 8"),
              std::string::npos)
        << line;
    ++explained;
  }
  EXPECT_GT(explained, 0);
}

}  // namespace
}  // namespace cairn
