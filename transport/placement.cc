#include "transport/placement.h"

#include <algorithm>

namespace cairn {

Result<Placement> Placement::Make(int nodes, int ranks_per_node, int replicas,
                                  PlacementStrategy strategy) {
  if (nodes < 1 || ranks_per_node < 1 || replicas < 0)
    return Status::InvalidArgument(
        "placement needs nodes >= 1, ranks per node >= 1, replicas >= 0");
  if (replicas >= nodes && replicas > 0)
    return Status::InvalidArgument("cannot place " + std::to_string(replicas) +
                                   " replicas of each node on other nodes: only " +
                                   std::to_string(nodes) + " nodes");
  Placement p;
  p.ranks_per_node_ = ranks_per_node;
  p.strategy_ = strategy;
  const int world = nodes * ranks_per_node;
  p.holders_.assign(static_cast<size_t>(world), {});
  p.held_.assign(static_cast<size_t>(world), {});
  // Partner nodes of each node.
  std::vector<std::vector<int>> partner_nodes(static_cast<size_t>(nodes));
  if (replicas > 0) {
    if (strategy == PlacementStrategy::kRing) {
      for (int n = 0; n < nodes; ++n)
        for (int k = 1; k <= replicas; ++k)
          partner_nodes[static_cast<size_t>(n)].push_back((n + k) % nodes);
    } else {
      const int g = replicas + 1;
      const int groups = std::max(1, nodes / g);
      for (int n = 0; n < nodes; ++n) {
        const int grp = std::min(n / g, groups - 1);
        const int first = grp * g;
        const int last = grp == groups - 1 ? nodes : first + g;  // exclusive
        for (int m = first; m < last; ++m)
          if (m != n) partner_nodes[static_cast<size_t>(n)].push_back(m);
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    const int node = r / ranks_per_node, local = r % ranks_per_node;
    for (int pn : partner_nodes[static_cast<size_t>(node)]) {
      const int holder = pn * ranks_per_node + local;
      p.holders_[static_cast<size_t>(r)].push_back(holder);
      p.held_[static_cast<size_t>(holder)].push_back(r);
    }
  }
  for (auto& h : p.held_) std::sort(h.begin(), h.end());
  return p;
}

std::string Placement::Describe() const {
  std::string s = std::string("placement: ") +
                  (strategy_ == PlacementStrategy::kRing ? "ring" : "group") + ", " +
                  std::to_string(world_size()) + " ranks, " + std::to_string(ranks_per_node_) +
                  " per node\n";
  for (int r = 0; r < world_size(); ++r) {
    s += "  rank " + std::to_string(r) + " (node " + std::to_string(node_of(r)) + ")  replicas on:";
    if (holders_of(r).empty()) s += " none";
    for (int h : holders_of(r))
      s += " " + std::to_string(h) + " (node " + std::to_string(node_of(h)) + ")";
    s += "\n";
  }
  return s;
}

}  // namespace cairn
