// LocalLauncher: runs N nodes x M ranks of a program as processes on this machine, with the
// environment torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK) plus CAIRN_NODE, so the same binaries run under torchrun or Slurm elsewhere.
// Used by `cairn launch`, the tests and the demo.
// Thread-safety: one thread drives a launcher.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cairn/status.h"

namespace cairn {

struct LaunchSpec {
  int nodes = 1;
  int ranks_per_node = 1;
  std::vector<std::string> argv;                         // program and its arguments
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every rank
  // Per-rank extra arguments appended to argv (indexed by rank; may be shorter).
  std::vector<std::vector<std::string>> rank_args;
  // Per-rank extra variables, set after `env` (indexed by rank; may be shorter).
  std::vector<std::vector<std::pair<std::string, std::string>>> rank_env;
  // Per-node words put in front of argv (indexed by node; may be shorter): a rank of node n
  // runs `node_prefix[n]... argv...`, e.g. `ip netns exec <namespace>` to run a node in a
  // network namespace of its own (scripts/netns_cluster.sh). The prefix must exec argv, so
  // that signals to the rank reach the program.
  std::vector<std::vector<std::string>> node_prefix;
  // If set, each rank's stdout and stderr are appended to <output_dir>/rank-<r>.log.
  std::string output_dir;
};

struct LaunchedRank {
  int rank = -1;
  int node = -1;
  int local_rank = -1;
  pid_t pid = -1;
  int exit_code = -1;  // after Wait: the exit status, or 128 + signal
};

class LocalLauncher {
 public:
  static Result<std::unique_ptr<LocalLauncher>> Start(const LaunchSpec& spec);
  // Kills (SIGKILL) and reaps every rank still running.
  ~LocalLauncher();

  std::vector<LaunchedRank>& ranks() { return ranks_; }
  // Starts `rank` again (after it exited or was killed), with the same environment.
  Status Restart(int rank);
  // Sends `sig` to `rank`'s process.
  Status Signal(int rank, int sig);
  // Reaps `rank` (blocking); returns its exit code (128 + signal if killed).
  int WaitRank(int rank);
  // Reaps the ranks that exited (never blocks); returns how many still run.
  int Running();
  // Waits for every rank up to `timeout_s`, then SIGKILLs the rest. Returns true when all
  // exited with 0.
  bool WaitAll(double timeout_s);

 private:
  Status Spawn(LaunchedRank& r);
  LaunchSpec spec_;
  std::vector<LaunchedRank> ranks_;
};

}  // namespace cairn
