// The --netns mode the benchmarks that launch ranks share: a cluster of node namespaces on
// this machine (testing/netns_cluster.h, scripts/netns_cluster.sh) and ranks placed in it.
// For programs built with CAIRN_SOURCE_DIR and linked with cairn_testing.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/launcher.h"
#include "testing/netns_cluster.h"

namespace cairn::bench {

// Cluster `name`-<pid> of `nodes` nodes, every link limited to `rate` both ways ("" for
// none). Null after saying why on stderr ("<bench>: --netns: ..."), *exit_code then 2 where
// namespaces cannot be made on this machine and 1 where making them failed.
inline std::unique_ptr<testing::NetnsCluster> UpCluster(const char* bench, const std::string& name,
                                                        int nodes, const std::string& rate,
                                                        int* exit_code) {
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/scripts/netns_cluster.sh";
  const std::string why = testing::NetnsCluster::Unavailable(script);
  if (!why.empty()) {
    std::fprintf(stderr, "%s: --netns: %s\n", bench, why.c_str());
    *exit_code = 2;
    return nullptr;
  }
  auto c = testing::NetnsCluster::Up(script, name + "-" + std::to_string(::getpid()), nodes, rate);
  if (!c.ok()) {
    std::fprintf(stderr, "%s: --netns: %s\n", bench, c.status().ToString().c_str());
    *exit_code = 1;
    return nullptr;
  }
  return std::move(*c);
}

// Runs the spec's node n inside the cluster's node n, UCX on that node's own link (the
// caller picks UCX_TLS: tcp is the one transport between namespaces).
inline void PlaceInCluster(const testing::NetnsCluster& cluster, LaunchSpec* spec) {
  spec->node_prefix.clear();
  for (int n = 0; n < spec->nodes; ++n) spec->node_prefix.push_back(cluster.node_prefix(n));
  spec->env.push_back({"UCX_NET_DEVICES", "eth0"});
}

}  // namespace cairn::bench
