#include "cli/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "core/clock.h"

namespace cairn {
namespace {

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

Result<std::unique_ptr<LocalLauncher>> LocalLauncher::Start(const LaunchSpec& spec) {
  if (spec.nodes < 1 || spec.ranks_per_node < 1 || spec.argv.empty())
    return Status::InvalidArgument("launch needs nodes >= 1, ranks per node >= 1 and a program");
  std::unique_ptr<LocalLauncher> l(new LocalLauncher());
  l->spec_ = spec;
  const int world = spec.nodes * spec.ranks_per_node;
  for (int rank = 0; rank < world; ++rank) {
    LaunchedRank r;
    r.rank = rank;
    r.node = rank / spec.ranks_per_node;
    r.local_rank = rank % spec.ranks_per_node;
    CAIRN_RETURN_IF_ERROR(l->Spawn(r));
    l->ranks_.push_back(r);
  }
  return l;
}

Status LocalLauncher::Spawn(LaunchedRank& r) {
  const LaunchSpec& spec = spec_;
  const int world = spec.nodes * spec.ranks_per_node;
  std::vector<std::string> args;
  if (static_cast<size_t>(r.node) < spec.node_prefix.size())
    args = spec.node_prefix[static_cast<size_t>(r.node)];
  args.insert(args.end(), spec.argv.begin(), spec.argv.end());
  if (static_cast<size_t>(r.rank) < spec.rank_args.size())
    for (const auto& a : spec.rank_args[static_cast<size_t>(r.rank)]) args.push_back(a);
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(r.rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(r.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(spec.ranks_per_node)},
      {"GROUP_RANK", std::to_string(r.node)},
      {"CAIRN_NODE", std::to_string(r.node)}};
  for (const auto& kv : spec.env) env.push_back(kv);
  if (static_cast<size_t>(r.rank) < spec.rank_env.size())
    for (const auto& kv : spec.rank_env[static_cast<size_t>(r.rank)]) env.push_back(kv);
  const std::string log =
      spec.output_dir.empty() ? "" : spec.output_dir + "/rank-" + std::to_string(r.rank) + ".log";
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    // A rank never outlives the launcher (a killed `cairn demo` or test takes its ranks).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) std::_Exit(127);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    if (!log.empty()) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        ::close(fd);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::_Exit(127);
  }
  r.pid = pid;
  r.exit_code = -1;
  return Status::OK();
}

Status LocalLauncher::Restart(int rank) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()))
    return Status::InvalidArgument("no rank " + std::to_string(rank));
  LaunchedRank& r = ranks_[static_cast<size_t>(rank)];
  if (r.exit_code < 0)
    return Status::FailedPrecondition("rank " + std::to_string(rank) + " is still running");
  return Spawn(r);
}

LocalLauncher::~LocalLauncher() {
  for (auto& r : ranks_) {
    if (r.exit_code >= 0 || r.pid <= 0) continue;
    ::kill(r.pid, SIGKILL);
    WaitRank(r.rank);
  }
}

Status LocalLauncher::Signal(int rank, int sig) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()))
    return Status::InvalidArgument("no rank " + std::to_string(rank));
  if (::kill(ranks_[static_cast<size_t>(rank)].pid, sig) != 0)
    return Status::FromErrno(errno, "kill rank " + std::to_string(rank));
  return Status::OK();
}

int LocalLauncher::WaitRank(int rank) {
  LaunchedRank& r = ranks_.at(static_cast<size_t>(rank));
  if (r.exit_code >= 0) return r.exit_code;
  int status = 0;
  while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = ExitCodeOf(status);
  return r.exit_code;
}

int LocalLauncher::Running() {
  int running = 0;
  for (auto& r : ranks_) {
    if (r.exit_code >= 0) continue;
    int status = 0;
    if (::waitpid(r.pid, &status, WNOHANG) == r.pid)
      r.exit_code = ExitCodeOf(status);
    else
      ++running;
  }
  return running;
}

bool LocalLauncher::WaitAll(double timeout_s) {
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s * 1e9);
  for (;;) {
    if (Running() == 0) break;
    if (NowNanos() > deadline) {
      for (auto& r : ranks_)
        if (r.exit_code < 0) ::kill(r.pid, SIGKILL);
      for (auto& r : ranks_) WaitRank(r.rank);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const auto& r : ranks_)
    if (r.exit_code != 0) return false;
  return true;
}

}  // namespace cairn
