// The cairn executable: --help, bad commands, and the demo end to end (a training process
// killed with SIGKILL and restored bit-exactly).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "core/filesystem.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun RunCli(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(CAIRN_CLI) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Cli, HelpExplainsCommandsAndSettings) {
  CliRun r = RunCli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("demo"), std::string::npos);
  EXPECT_NE(r.out.find("CAIRN_HOST_ROOT"), std::string::npos);
  EXPECT_NE(r.out.find("CAIRN_FULL_POLICY"), std::string::npos);
  CliRun d = RunCli("demo --help");
  EXPECT_EQ(d.code, 0);
  EXPECT_NE(d.out.find("SIGKILL"), std::string::npos);
}

TEST(Cli, UnknownCommandsAndOptionsFail) {
  EXPECT_EQ(RunCli("frobnicate").code, 2);
  EXPECT_EQ(RunCli("demo --steps").code, 2);
  EXPECT_EQ(RunCli("demo --bogus").code, 2);
}

TEST(Cli, PlacementTable) {
  CliRun r = RunCli("placement --nodes 3 --ranks-per-node 2");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("rank 4 (node 2)  replicas on: 0 (node 0)"), std::string::npos) << r.out;
  EXPECT_EQ(RunCli("placement --nodes 2 --replicas 2").code, 2);
}

TEST(Cli, LaunchSetsTheTorchrunVariables) {
  CliRun r = RunCli(
      "launch --nodes 2 --ranks-per-node 2 -- sh -c "
      "'test \"$WORLD_SIZE\" = 4 && test \"$LOCAL_WORLD_SIZE\" = 2 && "
      "test \"$CAIRN_NODE\" = $((RANK / 2)) && test \"$LOCAL_RANK\" = $((RANK % 2))'");
  EXPECT_EQ(r.code, 0) << r.out;
  CliRun f = RunCli("launch --nodes 2 -- sh -c 'exit $RANK'");
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.out.find("rank 1 (node 1"), std::string::npos) << f.out;
}

TEST(Cli, DemoKillsRestartsAndRestoresBitExactly) {
  testing::TempDir root("clidemo");
  const std::string job = testing::UniqueJobId("clidemo");
  CliRun r =
      RunCli("demo --steps 16 --layers 1 --kill-at 7 --host-root " + root.path() + " --job " + job);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("SIGKILL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bit-exact with a replay of steps 1.."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("demo passed"), std::string::npos) << r.out;
  EXPECT_FALSE(DefaultFileSystem()->Exists(root.path() + "/" + job)) << "demo left its files";
}

}  // namespace
}  // namespace cairn
