// Helpers of the tests that run recovery_child ranks as real processes (LocalLauncher):
// their logs, the restore report line, the launch settings, a whole restore run.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/launcher.h"
#include "core/filesystem.h"
#include "tests/matrix_log.h"
#include "tests/test_util.h"

namespace cairn::testing::recovery {

inline constexpr const char* kRows = "8192";  // about 28 MiB of state: dozens of 1 MiB PFS pieces

// Every line of a rank's log, minus the per-step progress lines.
inline std::string Logs(const std::string& dir, int ranks) {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    auto text =
        ReadWholeFile(DefaultFileSystem(), dir + "/rank-" + std::to_string(r) + ".log", 64 << 20);
    out += "--- rank " + std::to_string(r) + ":\n";
    if (!text.ok()) continue;
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("saved ", 0) != 0 && line.rfind("complete ", 0) != 0) out += line + "\n";
  }
  return out;
}

// The last line of rank `r`'s log that starts with `prefix` ("" when none).
inline std::string LastLine(const std::string& dir, int r, const std::string& prefix) {
  auto text =
      ReadWholeFile(DefaultFileSystem(), dir + "/rank-" + std::to_string(r) + ".log", 64 << 20);
  std::string last;
  if (!text.ok()) return last;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) last = line;
  return last;
}

// "restored <step> tier <t> received <n> pfs <n> needed <n> resharded <0|1> skipped <n>
// plan <alone|job> blobs <rank> rebuilt <step>" (alone: every rank planned its own part from
// layout templates; rebuilt: the step decoded from parity for this rank, or -1)
struct Restored {
  int64_t step = -1;
  std::string tier;
  uint64_t received = 0, pfs = 0, needed = 0;
  int resharded = -1;
  size_t skipped = 0;
  std::string plan;
  int blobs = -1;        // whose blobs the rank got
  int64_t rebuilt = -1;  // the step rebuilt from parity for this rank before the restore
};
inline Restored ParseRestored(const std::string& line) {
  Restored r;
  std::istringstream in(line);
  std::string w;
  in >> w >> r.step >> w >> r.tier >> w >> r.received >> w >> r.pfs >> w >> r.needed >> w >>
      r.resharded >> w >> r.skipped >> w >> r.plan >> w >> r.blobs >> w >> r.rebuilt;
  return r;
}

inline LaunchSpec Spec(const TempDir& root, const std::string& job, int nodes, int per_node,
                       std::vector<std::string> args, const std::string& out_dir,
                       std::vector<std::pair<std::string, std::string>> env = {}) {
  LaunchSpec spec;
  spec.nodes = nodes;
  spec.ranks_per_node = per_node;
  spec.argv = {CAIRN_RECOVERY_CHILD};
  for (auto& a : args) spec.argv.push_back(a);
  spec.output_dir = out_dir;
  spec.env = {{"CAIRN_JOB_ID", job},
              {"CAIRN_HOST_ROOT", root.path() + "/host"},
              {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
              {"CAIRN_REPLICAS", "1"},
              {"CAIRN_SLOTS", "5"},
              {"CAIRN_CONNECT_TIMEOUT_S", "60"},
              {"CAIRN_OP_TIMEOUT_S", "60"},
              {"CAIRN_REPLICATE_TIMEOUT_S", "10"},
              {"CAIRN_CHUNK_BYTES", "64K"},
              {"CAIRN_LOG_LEVEL", "1"},
              {"UCX_TLS", "tcp"}};
  for (auto& e : env) {
    bool replaced = false;
    for (auto& [k, v] : spec.env)
      if (k == e.first) v = e.second, replaced = true;
    if (!replaced) spec.env.push_back(e);
  }
  return spec;
}

// Runs `train LAYOUT` of steps first..last on nodes x per_node ranks, their logs in `dir`
// (made here), and waits for every rank (a fatal failure naming the logs otherwise: call
// it under ASSERT_NO_FATAL_FAILURE).
inline void RunTrain(const TempDir& root, const std::string& job, int nodes, int per_node,
                     const std::string& layout, int64_t first, int64_t last, const std::string& dir,
                     std::vector<std::pair<std::string, std::string>> env = {}) {
  ASSERT_TRUE(DefaultFileSystem()->MakeDirs(dir, 0700).ok());
  auto l = LocalLauncher::Start(Spec(
      root, job, nodes, per_node,
      {"train", layout, kRows, std::to_string(first), std::to_string(last)}, dir, std::move(env)));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->WaitAll(240)) << Logs(dir, nodes * per_node);
}

// Runs `restore LAYOUT` on nodes x per_node ranks (a state of `rows`, as saved); every
// rank's report.
inline std::vector<Restored> RunRestore(const TempDir& root, const std::string& job, int nodes,
                                        int per_node, const std::string& layout, int64_t min_step,
                                        const std::string& tag,
                                        std::vector<std::pair<std::string, std::string>> env = {},
                                        const std::string& rows = kRows) {
  const std::string out = root.path() + "/" + tag;
  EXPECT_TRUE(DefaultFileSystem()->MakeDirs(out, 0700).ok());
  auto l = LocalLauncher::Start(Spec(root, job, nodes, per_node,
                                     {"restore", layout, rows, std::to_string(min_step)}, out,
                                     std::move(env)));
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return {};
  const int world = nodes * per_node;
  EXPECT_TRUE((*l)->WaitAll(240)) << tag << ":\n" << Logs(out, world);
  std::vector<Restored> got;
  for (int r = 0; r < world; ++r) {
    const std::string line = LastLine(out, r, "restored ");
    std::printf("%s rank %d: %s\n", tag.c_str(), r, line.c_str());
    got.push_back(ParseRestored(line));
  }
  return got;
}

// The newest step every rank printed "complete <step>" for (recovery_child's matrix mode:
// captured and replicated, as wait_replicated() reported); -1 when none.
inline int64_t NewestCompleteOnEveryRankOf(const std::string& dir, int ranks) {
  std::vector<testing::MatrixLog> logs;
  for (int r = 0; r < ranks; ++r) {
    auto text =
        ReadWholeFile(DefaultFileSystem(), dir + "/rank-" + std::to_string(r) + ".log", 64 << 20);
    if (!text.ok()) return -1;
    logs.push_back(testing::ParseMatrixLog(*text));
  }
  return testing::NewestCompleteOnEveryRank(logs);
}

}  // namespace cairn::testing::recovery
