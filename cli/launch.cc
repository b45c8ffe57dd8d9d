// `cairn launch`: N nodes x M ranks of a program as local processes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <map>

#include "cli/args.h"
#include "cli/launcher.h"
#include "redundancy/placement.h"

namespace cairn::cli {

int LaunchMain(int argc, char** argv) {
  LaunchSpec spec;
  double timeout_s = 24 * 3600;
  CLI::App app(
      "Runs N x M copies of PROGRAM on this machine as ranks of one job, each with RANK, "
      "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK set as torchrun sets them, and "
      "CAIRN_NODE (node n = ranks n*M .. n*M+M-1; each node gets its own host-tier tree). "
      "Waits for all of them; after --timeout seconds kills the rest. Exit code 0 when every "
      "rank exits with 0.\nusage: cairn launch [options] -- PROGRAM ARGS...",
      "cairn launch");
  app.add_option("--nodes", spec.nodes, "nodes")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--ranks-per-node", spec.ranks_per_node, "ranks per node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds before the ranks still running are killed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.prefix_command();  // the first argument that is not an option starts PROGRAM ARGS
  if (auto rc = Parse(app, argc, argv)) return *rc;
  spec.argv = app.remaining();
  if (!spec.argv.empty() && spec.argv.front() == "--") spec.argv.erase(spec.argv.begin());
  if (spec.argv.empty()) {
    std::fprintf(stderr, "cairn launch: no program given (cairn launch ... -- PROGRAM ARGS)\n");
    return 2;
  }
  auto l = LocalLauncher::Start(spec);
  if (!l.ok()) {
    std::fprintf(stderr, "cairn launch: %s\n", l.status().ToString().c_str());
    return 1;
  }
  const bool ok = (*l)->WaitAll(timeout_s);
  for (const auto& r : (*l)->ranks())
    if (r.exit_code != 0)
      std::fprintf(stderr, "cairn launch: rank %d (node %d, pid %d) exited with %d\n", r.rank,
                   r.node, r.pid, r.exit_code);
  return ok ? 0 : 1;
}

namespace {

std::string Count(long double c) {
  char buf[64];
  if (c < 1e15L)
    std::snprintf(buf, sizeof buf, "%.0Lf", c);
  else
    std::snprintf(buf, sizeof buf, "%.4Le", c);
  return buf;
}

}  // namespace

namespace {

void PrintOdds(int max_lost, const std::function<LossOdds(int)>& odds) {
  if (max_lost <= 0) return;
  std::printf(
      "losing whole nodes at once (every pattern counted): does every rank's version survive "
      "in memory?\n  %-6s %-18s %-22s %-14s %s\n",
      "lost", "patterns", "survived from memory", "probability", "otherwise (PFS)");
  for (int lost = 1; lost <= max_lost; ++lost) {
    const LossOdds o = odds(lost);
    const double pfs =
        o.patterns > 0 ? static_cast<double>((o.patterns - o.from_memory) / o.patterns) : 0;
    std::printf("  %-6d %-18s %-22s %-14.9g %.3g\n", lost, Count(o.patterns).c_str(),
                Count(o.from_memory).c_str(), o.probability(), pfs);
  }
}

// `cairn placement --redundancy xor|rs`: the sets, the parity each node holds, the odds.
int ErasurePlacement(int nodes, int rpn, const std::string& kind, int k, int m, int max_lost,
                     bool odds_only) {
  const ErasureScheme scheme{k, kind == "xor" ? 1 : m};
  if (Status st = ValidateErasureScheme(scheme); !st.ok()) {
    std::fprintf(stderr, "cairn placement: %s\n", st.message().c_str());
    return 2;
  }
  if (nodes % k != 0) {
    std::fprintf(stderr,
                 "cairn placement: %d nodes cannot be cut into sets of %d (a job refuses it "
                 "at open)\n",
                 nodes, k);
    return 2;
  }
  if (!odds_only) {
    std::printf("erasure-coded sets: %s, %d nodes x %d ranks per node\n", scheme.Describe().c_str(),
                nodes, rpn);
    for (int set = 0; set < nodes / k; ++set)
      std::printf("  set %d: nodes %d .. %d (the ranks of each local rank on them)\n", set, set * k,
                  set * k + k - 1);
    std::printf(
        "each node holds, per version, parity worth %d/%d = %.3g x its own state, and any %d "
        "node(s) of a set may be lost\n",
        scheme.m, scheme.data(), static_cast<double>(scheme.m) / scheme.data(), scheme.m);
  }
  if (max_lost < 0) max_lost = scheme.m + 2;
  PrintOdds(std::min(max_lost, nodes),
            [&](int lost) { return ErasureMemoryOdds(nodes, scheme, lost); });
  return 0;
}

}  // namespace

int PlacementMain(int argc, char** argv) {
  int nodes = 2, rpn = 1, replicas = 1, max_lost = -1, k = 4, m = 2;
  PlacementStrategy strategy = PlacementStrategy::kRing;
  std::string redundancy = "replica";
  CLI::App app(
      "Prints which ranks hold the in-memory replicas of which (the defaults of a job are "
      "CAIRN_REDUNDANCY=replica, CAIRN_REPLICAS=1 and CAIRN_PLACEMENT=ring) or, with "
      "--redundancy xor|rs, the erasure-coded sets, and what each node holds for the others "
      "per version; then, for 1 to K whole nodes lost at once, how many of the loss patterns "
      "leave every rank's versions in memory or decodable from parity (counted exactly); the "
      "others restore from the PFS.",
      "cairn placement");
  app.add_option("--nodes", nodes, "nodes")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--ranks-per-node", rpn, "ranks per node")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--replicas", replicas, "copies of each version on other nodes")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--strategy", strategy, "ring or group")
      ->transform(CLI::CheckedTransformer(std::map<std::string, PlacementStrategy>{
          {"ring", PlacementStrategy::kRing}, {"group", PlacementStrategy::kGroup}}));
  app.add_option("--lost", max_lost,
                 "print the odds of coming back from memory when 1 .. this many whole nodes "
                 "are lost at once (default: replicas + 2; at most 64 and the nodes)")
      ->check(CLI::Range(0, 64));
  app.add_option("--redundancy", redundancy, "replica, xor or rs (CAIRN_REDUNDANCY)")
      ->check(CLI::IsMember({"replica", "xor", "rs"}))
      ->capture_default_str();
  app.add_option("--k", k, "xor and rs: nodes per set, parity included (CAIRN_ERASURE_K)")
      ->check(CLI::Range(2, kMaxErasureMembers))
      ->capture_default_str();
  app.add_option("--m", m, "rs: the nodes of a set that may be lost (CAIRN_ERASURE_M)")
      ->check(CLI::Range(1, kMaxErasureMembers - 1))
      ->capture_default_str();
  bool odds_only = false;
  app.add_flag("--odds-only", odds_only, "print the odds, not the table of replica holders");
  if (auto rc = Parse(app, argc, argv)) return *rc;
  if (redundancy != "replica")
    return ErasurePlacement(nodes, rpn, redundancy, k, m, max_lost, odds_only);
  auto p = Placement::Make(nodes, rpn, replicas, strategy);
  if (!p.ok()) {
    std::fprintf(stderr, "cairn placement: %s\n", p.status().message().c_str());
    return 2;
  }
  if (!odds_only) {
    std::fputs(p->Describe().c_str(), stdout);
    std::printf("each node holds, per version, %d x its own state for other nodes (replicas)\n",
                replicas);
  }
  if (max_lost < 0) max_lost = replicas + 2;
  PrintOdds(std::min(max_lost, nodes), [&](int lost) { return p->MemoryOdds(lost); });
  return 0;
}

}  // namespace cairn::cli
