// Persistence with real processes: four data-parallel ranks over UCX write each unique box
// once and evenly; ranks killed with SIGKILL at random moments of a persist never leave a
// LATEST that names a step failing verification.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <thread>

#include "cli/launcher.h"
#include "core/filesystem.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"
#include "tests/persist_state.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

using testing::PersistState;
using testing::TempDir;

// The ranks' logs, for failure messages (the directory goes with the test).
std::string Logs(const TempDir& root, int ranks) {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    auto text = ReadWholeFile(DefaultFileSystem(),
                              root.path() + "/rank-" + std::to_string(r) + ".log", 256 << 20);
    out += "--- rank " + std::to_string(r) + ":\n";
    if (!text.ok()) {
      out += text.status().ToString() + "\n";
      continue;
    }
    // Without the per-step progress lines of the loop mode.
    size_t at = 0;
    while (at < text->size()) {
      size_t e = text->find('\n', at);
      if (e == std::string::npos) e = text->size();
      if (text->compare(at, 6, "saved ") != 0) out += text->substr(at, e - at) + "\n";
      at = e + 1;
    }
  }
  return out;
}

LaunchSpec Spec(const TempDir& root, const std::string& job, int ranks,
                std::vector<std::string> args,
                std::vector<std::pair<std::string, std::string>> env) {
  LaunchSpec spec;
  spec.nodes = ranks;
  spec.ranks_per_node = 1;
  spec.argv = {CAIRN_PERSIST_CHILD};
  for (auto& a : args) spec.argv.push_back(a);
  spec.output_dir = root.path();
  spec.env = {{"CAIRN_JOB_ID", job},
              {"CAIRN_HOST_ROOT", root.path() + "/host"},
              {"CAIRN_PFS_ROOT", root.path() + "/pfs"},
              {"CAIRN_REPLICAS", "0"},
              {"CAIRN_CONNECT_TIMEOUT_S", "60"},
              {"CAIRN_OP_TIMEOUT_S", "60"},
              {"CAIRN_CHUNK_BYTES", "256K"},
              {"CAIRN_LOG_LEVEL", "1"},
              {"UCX_TLS", "tcp"}};
  for (auto& e : env) spec.env.push_back(e);
  return spec;
}

TEST(PersistProcesses, FourDataParallelRanksWriteEachBoxOnceAndEvenly) {
  TempDir root("pfs4");
  const std::string job = testing::UniqueJobId("dp4");
  PersistState s(4096);  // 68 MiB held by each rank
  auto l = LocalLauncher::Start(
      Spec(root, job, 4, {"once", "4096", "7"}, {{"CAIRN_PERSIST_EVERY", "0"}}));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->WaitAll(240)) << Logs(root, 4);
  FileSystem* fs = DefaultFileSystem();
  const std::string job_dir = PfsJobDir(root.path() + "/pfs", job);
  ASSERT_EQ(*ReadLatest(fs, job_dir), 7);
  const std::string step_dir = JoinPath(job_dir, StepDirName(7));
  auto m = ReadManifest(fs, step_dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world_size(), 4u);
  EXPECT_EQ(m->lists_size(), 1);  // identical layouts are stored once
  // Each tensor is covered by disjoint saved boxes whose sizes add up to it: every unique
  // byte was written exactly once.
  std::vector<uint64_t> writer(4, 0);
  for (int t = 0; t < m->tensors_size(); ++t) {
    std::vector<Box> boxes;
    int64_t numel = 0;
    for (const auto& b : m->boxes()) {
      if (b.tensor() != static_cast<uint32_t>(t)) continue;
      boxes.push_back(
          Box{{b.offsets().begin(), b.offsets().end()}, {b.lengths().begin(), b.lengths().end()}});
      numel += boxes.back().numel();
    }
    EXPECT_EQ(numel, NumElements(Shape(m->tensors(t).shape().begin(), m->tensors(t).shape().end())))
        << m->tensors(t).name();
    for (size_t i = 0; i < boxes.size(); ++i)
      for (size_t j = i + 1; j < boxes.size(); ++j)
        EXPECT_FALSE(Intersect(boxes[i], boxes[j]).has_value()) << m->tensors(t).name();
  }
  uint64_t total = 0;
  for (const auto& b : m->boxes()) {
    writer[b.writer()] += b.length();
    total += b.length();
  }
  EXPECT_EQ(total, s.bytes());
  const double mean = static_cast<double>(total) / 4;
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(static_cast<double>(writer[static_cast<size_t>(r)]), 1.1 * mean) << "rank " << r;
    EXPECT_GT(writer[static_cast<size_t>(r)], 0u) << "rank " << r;
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(s.Check(fs, step_dir, 7, r), "") << "rank " << r;
}

TEST(PersistProcesses, BackgroundDrainsRunBesideReplication) {
  // 2 nodes x 2 ranks replicating to each other while every 3rd version drains to the PFS,
  // then a flush: every rank counts the same marks, so the rounds line up. With the block
  // policy no version is skipped, so the flush must commit the last step.
  TempDir root("pfsrepl");
  const std::string job = testing::UniqueJobId("repl");
  LaunchSpec spec =
      Spec(root, job, 2, {"many", "64", "1"},
           {{"CAIRN_PERSIST_EVERY", "3"}, {"CAIRN_SLOTS", "4"}, {"CAIRN_FULL_POLICY", "block"}});
  spec.ranks_per_node = 2;
  for (auto& [k, v] : spec.env) {
    if (k == "CAIRN_REPLICAS") v = "1";
    if (k == "CAIRN_LOG_LEVEL") v = "2";
  }
  auto l = LocalLauncher::Start(spec);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->WaitAll(240)) << Logs(root, 4);
  FileSystem* fs = DefaultFileSystem();
  const std::string job_dir = PfsJobDir(root.path() + "/pfs", job);
  ASSERT_EQ(*ReadLatest(fs, job_dir), 20);
  PersistState s(64);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(s.Check(fs, JoinPath(job_dir, StepDirName(20)), 20, r), "") << "rank " << r;
}

// Kills a persisting job at a random moment, `trials` times, and checks after each kill
// that LATEST (if any) names a step whose every checksum verifies and whose bytes are the
// ones saved at that step; every committed step must verify too.
void KillWhilePersisting(int ranks, int trials, uint64_t seed) {
  TempDir root("pfskill");
  const std::string job = testing::UniqueJobId("kill");
  const std::string job_dir = PfsJobDir(root.path() + "/pfs", job);
  FileSystem* fs = DefaultFileSystem();
  PersistState s(64);
  std::mt19937_64 rng(seed);
  int with_latest = 0;
  int64_t last_latest = -1;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    auto l = LocalLauncher::Start(Spec(root, job, ranks,
                                       {"loop", "64", std::to_string((trial + 1) * 100000)},
                                       {{"CAIRN_PERSIST_EVERY", "1"}, {"CAIRN_KEEP_ON_PFS", "2"}}));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    // Once the job trains (rank 0 has saved twice in this life, however long start-up
    // took on a loaded machine) and, in every other trial, has committed a step in this
    // life (so the kill lands in the drains that follow one), kill at a random moment.
    const auto before = ReadLatest(fs, job_dir);
    const std::string log0 = root.path() + "/rank-0.log";
    const std::string mark = "saved " + std::to_string((trial + 1) * 100000 + 1) + "\n";
    bool ready = false;
    for (int i = 0; i < 6000 && !ready; ++i) {
      auto text = ReadWholeFile(fs, log0, 256 << 20);
      ready = text.ok() && text->find(mark) != std::string::npos;
      if (ready && trial % 2 == 0) {
        auto now = ReadLatest(fs, job_dir);
        ready = now.ok() && (!before.ok() || *now != *before);
      }
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(ready) << "trial " << trial << " never trained or committed\n" << Logs(root, ranks);
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    const int victim = static_cast<int>(rng() % static_cast<uint64_t>(ranks));
    ASSERT_TRUE((*l)->Signal(victim, SIGKILL).ok());
    (*l)->WaitRank(victim);
    l->reset();  // the rest of the job is killed too
    auto latest = ReadLatest(fs, job_dir);
    if (!latest.ok()) {
      ASSERT_EQ(latest.status().code(), StatusCode::kNotFound) << latest.status().ToString();
      ASSERT_EQ(last_latest, -1) << "LATEST disappeared";
      continue;
    }
    ++with_latest;
    EXPECT_GE(*latest, last_latest);
    last_latest = *latest;
    const std::string step_dir = JoinPath(job_dir, StepDirName(*latest));
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(s.Check(fs, step_dir, *latest, r), "");
    auto names = fs->ListDir(job_dir);
    ASSERT_TRUE(names.ok());
    for (const std::string& n : *names) {
      auto step = ParseStepDirName(n);
      if (!step || !fs->Exists(JoinPath(JoinPath(job_dir, n), "MANIFEST"))) continue;
      auto m = ReadManifest(fs, JoinPath(job_dir, n));
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_TRUE(VerifyStep(fs, JoinPath(job_dir, n), *m).ok()) << n;
    }
  }
  EXPECT_GT(with_latest, trials / 2) << "too few trials got as far as a commit";
}

TEST(PersistProcesses, SigkillOfASingleRankAtRandomMomentsNeverTearsLatest) {
  KillWhilePersisting(1, 50, 11);
}

TEST(PersistProcesses, SigkillOfOneOfTwoRanksNeverTearsLatest) {
  KillWhilePersisting(2, 8, 12);
}

}  // namespace
}  // namespace cairn
