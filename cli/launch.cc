// `cairn launch`: N nodes x M ranks of a program as local processes.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/launcher.h"
#include "transport/placement.h"

namespace cairn::cli {

int LaunchMain(int argc, char** argv) {
  LaunchSpec spec;
  double timeout_s = 24 * 3600;
  int i = 1;
  for (; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--") {
      ++i;
      break;
    }
    if (k == "--help" || k == "-h") {
      std::printf(
          "usage: cairn launch [--nodes N] [--ranks-per-node M] [--timeout S] -- PROGRAM "
          "ARGS...\n\n"
          "Runs N x M copies of PROGRAM on this machine as ranks of one job, each with RANK,\n"
          "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK set as torchrun sets them,\n"
          "and CAIRN_NODE (node n = ranks n*M .. n*M+M-1; each node gets its own host-tier\n"
          "tree). Waits for all of them; after --timeout seconds kills the rest. Exit code 0\n"
          "when every rank exits with 0.\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cairn launch: %s needs a value\n", k.c_str());
      return 2;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    double d = std::strtod(v, &end);
    if (*end || d <= 0) {
      std::fprintf(stderr, "cairn launch: %s '%s' must be a positive number\n", k.c_str(), v);
      return 2;
    }
    if (k == "--nodes")
      spec.nodes = static_cast<int>(d);
    else if (k == "--ranks-per-node")
      spec.ranks_per_node = static_cast<int>(d);
    else if (k == "--timeout")
      timeout_s = d;
    else {
      std::fprintf(stderr, "cairn launch: unknown option '%s' (try --help)\n", k.c_str());
      return 2;
    }
  }
  for (; i < argc; ++i) spec.argv.push_back(argv[i]);
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

int PlacementMain(int argc, char** argv) {
  int nodes = 2, rpn = 1, replicas = 1;
  PlacementStrategy strategy = PlacementStrategy::kRing;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "usage: cairn placement [--nodes N] [--ranks-per-node M] [--replicas R]\n"
          "                       [--strategy ring|group]\n\n"
          "Prints which ranks hold the in-memory replicas of which (the defaults of a job are\n"
          "CAIRN_REPLICAS=1 and CAIRN_PLACEMENT=ring).\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cairn placement: %s needs a value\n", k.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (k == "--strategy") {
      if (v == "ring")
        strategy = PlacementStrategy::kRing;
      else if (v == "group")
        strategy = PlacementStrategy::kGroup;
      else {
        std::fprintf(stderr, "cairn placement: --strategy is ring or group\n");
        return 2;
      }
      continue;
    }
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (*end || n < 0) {
      std::fprintf(stderr, "cairn placement: %s '%s' is not a count\n", k.c_str(), v.c_str());
      return 2;
    }
    if (k == "--nodes")
      nodes = static_cast<int>(n);
    else if (k == "--ranks-per-node")
      rpn = static_cast<int>(n);
    else if (k == "--replicas")
      replicas = static_cast<int>(n);
    else {
      std::fprintf(stderr, "cairn placement: unknown option '%s'\n", k.c_str());
      return 2;
    }
  }
  auto p = Placement::Make(nodes, rpn, replicas, strategy);
  if (!p.ok()) {
    std::fprintf(stderr, "cairn placement: %s\n", p.status().message().c_str());
    return 2;
  }
  std::fputs(p->Describe().c_str(), stdout);
  return 0;
}

}  // namespace cairn::cli
