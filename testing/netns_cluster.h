// NetnsCluster: a small cluster on this machine for tests, made and removed by
// scripts/netns_cluster.sh: N nodes, each a network namespace with one link to a switch,
// node i at 10.77.0.(i+1) on its eth0. A test runs its ranks inside with node_prefix()
// (LaunchSpec::node_prefix) and partitions a node with Cut(). Pfs() adds a GlusterFS
// volume on storage servers of its own, mounted by Mount() as the ranks' PFS.
// The cluster is removed when the object goes, and by the next Up() when the process that
// made it was killed before that.
// Thread-safety: one thread drives a cluster.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cairn/status.h"

namespace cairn::testing {

class NetnsCluster {
 public:
  // Why namespaces cannot be made on this machine ("" when they can): a test skips with it.
  static std::string Unavailable(const std::string& script);
  // Makes cluster `name` (unique per test: letters, digits, '-', at most 24) of `nodes`
  // nodes; `rate` ("200mbit") limits every node link both ways, "" for none.
  static Result<std::unique_ptr<NetnsCluster>> Up(const std::string& script,
                                                  const std::string& name, int nodes,
                                                  const std::string& rate = "");
  ~NetnsCluster();  // kills what still runs inside and deletes the namespaces
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // The words that run a program inside node `node`.
  std::vector<std::string> node_prefix(int node) const;
  std::string address(int node) const;
  // Takes node `node`'s switch port down (a partition: no reset reaches anyone) / up.
  Status Cut(int node);
  Status Heal(int node);
  // Sets (or, with "", removes) the rate limit of node `node`'s link, both ways.
  Status SetRate(int node, const std::string& rate);

  // Why a networked PFS cannot be made here ("" when it can): GlusterFS's server and
  // client and /dev/fuse are needed. A test skips with it.
  static std::string PfsUnavailable();
  // Adds `servers` storage servers serving a GlusterFS distributed volume, one brick each
  // (state, bricks and logs under `dir`, removed with the cluster).
  Status Pfs(int servers, const std::string& dir);
  // Mounts the volume on `mnt` (seen by every node's ranks), its client in node `node`.
  Status Mount(int node, const std::string& mnt);
  // Waits (at most `timeout_s`) until files can be made and removed in `dir` through a
  // mount of the volume, under names that hash onto every storage server: the client
  // reaches them all again (after a cut, or a server's return, it answers ENOTCONN, EIO or
  // a false ENOENT for seconds). False when it never did.
  static bool Writable(const std::string& dir, double timeout_s = 60);
  // Storage server `s`: "stop" (frozen), "cont", "kill" (every process of it), "start".
  Status Storage(int s, const std::string& what);

 private:
  NetnsCluster(std::string script, std::string name, int nodes)
      : script_(std::move(script)), name_(std::move(name)), nodes_(nodes) {}
  Status Run(const std::vector<std::string>& args, std::string* out = nullptr) const;
  // InvalidArgument unless 0 <= node < nodes_.
  Status CheckNode(int node) const;
  std::string script_, name_;
  int nodes_;
  int servers_ = 0;
};

}  // namespace cairn::testing
