// Placement: which ranks hold the replicas of which.
//
// A replica of a rank always lives on another node, on the rank with the same local rank
// (so every node stores as much as it sends). Two strategies:
//   ring   node n's replicas go to nodes n+1 .. n+R (mod N): R replicas per version.
//   group  Gemini's group placement: nodes are cut into groups of R+1 consecutive nodes
//          (the last group takes the remainder) and every node holds the replicas of every
//          other node of its group. A whole group must fail to lose a version; fewer
//          groups than ring neighbourhoods means fewer failure patterns lose data.
// MemoryOdds(k): of the ways k whole nodes can be lost at once, how many leave a copy of
// every rank's versions in the surviving nodes' memory (its own or a replica), counted
// exactly per strategy (ring: no R+1 consecutive nodes lost around the ring; group: no
// whole group lost).
// Thread-safety: immutable after Make().
#pragma once

#include <set>
#include <string>
#include <vector>

#include "cairn/status.h"
#include "redundancy/erasure.h"

namespace cairn {

enum class PlacementStrategy { kRing, kGroup };

// Loss patterns of `lost` nodes out of `nodes` (C(nodes, lost), as a long double: the
// counts outgrow 64 bits at thousands of nodes) and how many the job survives from memory.
struct LossOdds {
  int lost = 0;
  long double patterns = 0;
  long double from_memory = 0;
  double probability() const {
    return patterns > 0 ? static_cast<double>(from_memory / patterns) : 0;
  }
};

// The same odds for erasure-coded sets (CAIRN_REDUNDANCY=xor|rs): `nodes` cut into sets of
// scheme.k consecutive nodes (nodes a multiple of k), a set coming back from memory when it
// lost at most scheme.m nodes. Exact, like MemoryOdds.
LossOdds ErasureMemoryOdds(int nodes, const ErasureScheme& scheme, int lost);

class Placement {
 public:
  // InvalidArgument when the layout cannot hold `replicas` copies on other nodes
  // (replicas >= nodes) or a count is not positive (replicas may be 0: no replication).
  static Result<Placement> Make(int nodes, int ranks_per_node, int replicas,
                                PlacementStrategy strategy);

  // Ranks that hold replicas of `rank`'s versions.
  const std::vector<int>& holders_of(int rank) const { return holders_[static_cast<size_t>(rank)]; }
  // Ranks whose replicas `rank` holds.
  const std::vector<int>& held_by(int rank) const { return held_[static_cast<size_t>(rank)]; }
  int world_size() const { return static_cast<int>(holders_.size()); }
  int node_of(int rank) const { return rank / ranks_per_node_; }

  // A table for people: one line per rank, "rank 3 (node 1) -> replicas on 5 (node 2)".
  std::string Describe() const;

  int nodes() const { return world_size() / ranks_per_node_; }
  // Exact for 0 <= lost <= nodes(); O(nodes * lost * replicas) at most.
  LossOdds MemoryOdds(int lost) const;
  // Whether, with the nodes in `lost` gone, every rank still has a copy on a live node (its
  // own, or a holder's): what a restore from memory needs.
  bool KeepsEveryRank(const std::set<int>& lost) const;

 private:
  int ranks_per_node_ = 1;
  int replicas_ = 0;
  PlacementStrategy strategy_ = PlacementStrategy::kRing;
  std::vector<int> group_sizes_;  // group placement: consecutive groups of nodes
  std::vector<std::vector<int>> holders_;
  std::vector<std::vector<int>> held_;
};

}  // namespace cairn
