#include "redundancy/placement.h"

#include <algorithm>

namespace cairn {
namespace {

// C(n, k) as a long double.
long double Choose(int n, int k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  long double c = 1;
  for (int i = 1; i <= k; ++i) c = c * static_cast<long double>(n - k + i) / i;
  return c;
}

// Binary strings of length n with exactly k ones and no run of more than `run` ones:
// k ones spread over the n-k+1 gaps between zeros, at most `run` per gap, i.e. the
// coefficient of x^k in (1 + x + ... + x^run)^(n-k+1), built one gap at a time.
long double LinearWithoutLongRuns(int n, int k, int run) {
  if (n < 0 || k < 0 || k > n) return 0;
  std::vector<long double> c(static_cast<size_t>(k) + 1, 0), next(c.size());
  c[0] = 1;
  for (int gap = 0; gap < n - k + 1; ++gap) {
    long double window = 0;  // c[j - run] + ... + c[j]
    for (int j = 0; j <= k; ++j) {
      window += c[static_cast<size_t>(j)];
      if (j - run - 1 >= 0) window -= c[static_cast<size_t>(j - run - 1)];
      next[static_cast<size_t>(j)] = window;
    }
    c.swap(next);
  }
  return c[static_cast<size_t>(k)];
}

// The same around a ring of n positions (a run may wrap from the end to the start).
long double CircularWithoutLongRuns(int n, int k, int run) {
  if (k == 0) return 1;
  if (k == n) return run >= n ? 1 : 0;
  // Position 0 survives: the other n-1 positions form a line.
  long double total = LinearWithoutLongRuns(n - 1, k, run);
  // Position 0 lost, in a run of t lost positions (t ways to place it over position 0),
  // with a survivor at each end; the rest, n-t-2 positions, form a line. When the run
  // leaves one position only, both ends are that survivor.
  for (int t = 1; t <= std::min(run, k); ++t) {
    if (t == n - 1)
      total += t * (k == t ? 1.0L : 0.0L);
    else if (t <= n - 2)
      total += t * LinearWithoutLongRuns(n - t - 2, k - t, run);
  }
  return total;
}

}  // namespace

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
  p.replicas_ = replicas;
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
      for (int grp = 0; grp < groups; ++grp)
        p.group_sizes_.push_back(grp == groups - 1 ? nodes - grp * g : g);
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

LossOdds ErasureMemoryOdds(int nodes, const ErasureScheme& scheme, int lost) {
  LossOdds o;
  o.lost = lost;
  o.patterns = Choose(nodes, lost);
  if (lost < 0 || lost > nodes || scheme.k <= 0 || nodes % scheme.k != 0) return o;
  // The coefficient of x^lost in (sum over j <= m of C(k, j) x^j) ^ (nodes / k).
  std::vector<long double> c(static_cast<size_t>(lost) + 1, 0);
  c[0] = 1;
  for (int set = 0; set < nodes / scheme.k; ++set) {
    std::vector<long double> next(c.size(), 0);
    for (int have = 0; have <= lost; ++have)
      for (int j = 0; j <= scheme.m && have + j <= lost; ++j)
        next[static_cast<size_t>(have + j)] += c[static_cast<size_t>(have)] * Choose(scheme.k, j);
    c.swap(next);
  }
  o.from_memory = c[static_cast<size_t>(lost)];
  return o;
}

LossOdds Placement::MemoryOdds(int lost) const {
  const int n = nodes();
  LossOdds o;
  o.lost = lost;
  o.patterns = Choose(n, lost);
  if (lost < 0 || lost > n) return o;
  if (replicas_ == 0) {
    o.from_memory = lost == 0 ? 1 : 0;  // every node holds only its own versions
  } else if (strategy_ == PlacementStrategy::kRing) {
    // Node m's versions are on m .. m+R: lost with R+1 consecutive nodes.
    o.from_memory = CircularWithoutLongRuns(n, lost, replicas_);
  } else {
    // A group's versions are on its own nodes: lost with the whole group. Ways to lose
    // `lost` nodes leaving a survivor in every group: the coefficient of x^lost in the
    // product over groups of (sum over j < size of C(size, j) x^j).
    std::vector<long double> c(static_cast<size_t>(lost) + 1, 0);
    c[0] = 1;
    for (int size : group_sizes_) {
      std::vector<long double> next(c.size(), 0);
      for (int have = 0; have <= lost; ++have)
        for (int j = 0; j < size && have + j <= lost; ++j)
          next[static_cast<size_t>(have + j)] += c[static_cast<size_t>(have)] * Choose(size, j);
      c.swap(next);
    }
    o.from_memory = c[static_cast<size_t>(lost)];
  }
  return o;
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

bool Placement::KeepsEveryRank(const std::set<int>& lost) const {
  for (int r = 0; r < world_size(); ++r) {
    bool kept = !lost.count(node_of(r));
    for (int h : holders_of(r)) kept = kept || !lost.count(node_of(h));
    if (!kept) return false;
  }
  return true;
}

}  // namespace cairn
