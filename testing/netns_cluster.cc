#include "testing/netns_cluster.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/filesystem.h"

namespace cairn::testing {
namespace {

// Runs argv, collecting stdout and stderr; the exit status as a Status naming the command.
Status RunCommand(const std::vector<std::string>& argv, std::string* out) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return Status::FromErrno(errno, "pipe");
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::_Exit(127);
  }
  ::close(pipefd[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out) *out = text;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  return Status::Unavailable(cmd + " failed (status " + std::to_string(status) + "): " + text);
}

}  // namespace

std::string NetnsCluster::Unavailable(const std::string& script) {
  std::string out;
  Status st = RunCommand({"bash", script, "check"}, &out);
  if (st.ok()) return "";
  return out.empty() ? st.message() : out;
}

Result<std::unique_ptr<NetnsCluster>> NetnsCluster::Up(const std::string& script,
                                                       const std::string& name, int nodes,
                                                       const std::string& rate) {
  std::unique_ptr<NetnsCluster> c(new NetnsCluster(script, name, nodes));
  // The owner is this process, so that a cluster whose test was killed is swept later.
  ::setenv("CAIRN_NETNS_OWNER", std::to_string(::getpid()).c_str(), 1);
  std::vector<std::string> args = {"up", name, std::to_string(nodes)};
  if (!rate.empty()) args.push_back(rate);
  CAIRN_RETURN_IF_ERROR(c->Run(args));
  return c;
}

NetnsCluster::~NetnsCluster() {
  Status st = Run({"down", name_});
  if (!st.ok()) std::fprintf(stderr, "NetnsCluster: %s\n", st.ToString().c_str());
}

Status NetnsCluster::Run(const std::vector<std::string>& args, std::string* out) const {
  std::vector<std::string> argv = {"bash", script_};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, out);
}

std::vector<std::string> NetnsCluster::node_prefix(int node) const {
  return {"ip", "netns", "exec", name_ + "-n" + std::to_string(node)};
}

std::string NetnsCluster::address(int node) const {
  return "10.77.0." + std::to_string(node + 1);
}

Status NetnsCluster::CheckNode(int node) const {
  if (node < 0 || node >= nodes_)
    return Status::InvalidArgument("netns cluster " + name_ + ": no node " + std::to_string(node) +
                                   " (it has " + std::to_string(nodes_) + ")");
  return Status::OK();
}

Status NetnsCluster::Cut(int node) {
  CAIRN_RETURN_IF_ERROR(CheckNode(node));
  return Run({"cut", name_, std::to_string(node)});
}

Status NetnsCluster::Heal(int node) {
  CAIRN_RETURN_IF_ERROR(CheckNode(node));
  return Run({"heal", name_, std::to_string(node)});
}

Status NetnsCluster::SetRate(int node, const std::string& rate) {
  CAIRN_RETURN_IF_ERROR(CheckNode(node));
  return Run({"rate", name_, std::to_string(node), rate});
}

std::string NetnsCluster::PfsUnavailable() {
  for (const char* tool : {"glusterd", "glusterfs", "gluster", "nsenter"}) {
    if (!RunCommand({"sh", "-c", std::string("command -v ") + tool}, nullptr).ok())
      return std::string("no ") + tool +
             " here (Debian packages glusterfs-server, glusterfs-client, util-linux)";
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0) return "no usable /dev/fuse";
  return "";
}

Status NetnsCluster::Pfs(int servers, const std::string& dir) {
  CAIRN_RETURN_IF_ERROR(Run({"pfs", name_, std::to_string(servers), dir}));
  servers_ = servers;
  return Status::OK();
}

Status NetnsCluster::Mount(int node, const std::string& mnt) {
  CAIRN_RETURN_IF_ERROR(CheckNode(node));
  return Run({"mount", name_, std::to_string(node), mnt});
}

Status NetnsCluster::Storage(int s, const std::string& what) {
  if (s < 0 || s >= servers_)
    return Status::InvalidArgument("netns cluster " + name_ + ": no storage server " +
                                   std::to_string(s) + " (it has " + std::to_string(servers_) +
                                   ")");
  return Run({"storage", name_, std::to_string(s), what});
}

bool NetnsCluster::Writable(const std::string& dir, double timeout_s) {
  const std::string probe = dir + "/.probe-" + std::to_string(::getpid());
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  for (;;) {
    bool ok = true;
    for (int f = 0; f < 16 && ok; ++f) {  // names that hash onto both bricks
      const std::string p = probe + "-" + std::to_string(f);
      ok = WriteFileAtomic(DefaultFileSystem(), p, "x").ok() && DefaultFileSystem()->Unlink(p).ok();
    }
    if (ok) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace cairn::testing
