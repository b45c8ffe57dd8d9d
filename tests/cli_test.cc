// The cairn executable: --help, bad commands, the demo end to end (a node killed with SIGKILL
// comes back from peer memory, the PFS version is resharded onto 3 ranks) and the tools.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "cairn/checkpointer.h"
#include "core/filesystem.h"
#include "persist/manifest.h"
#include "tests/test_util.h"
#include "tiers/host_tier.h"

namespace cairn {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
};

// Runs a shell command line; its exit code and its stdout and stderr together.
CliRun RunShell(const std::string& line) {
  CliRun r;
  const std::string cmd = line + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliRun RunCli(const std::string& args) {
  return RunShell(std::string(CAIRN_CLI) + " " + args);
}

TEST(Cli, HelpExplainsCommandsAndSettings) {
  CliRun r = RunCli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("demo"), std::string::npos);
  EXPECT_NE(r.out.find("CAIRN_HOST_ROOT"), std::string::npos);
  EXPECT_NE(r.out.find("CAIRN_FULL_POLICY"), std::string::npos);
  CliRun d = RunCli("demo --help");
  EXPECT_EQ(d.code, 0);
  EXPECT_NE(d.out.find("SIGKILL"), std::string::npos);
}

TEST(Cli, UnknownCommandsAndOptionsFail) {
  EXPECT_EQ(RunCli("frobnicate").code, 2);
  EXPECT_EQ(RunCli("demo --steps").code, 2);
  EXPECT_EQ(RunCli("demo --bogus").code, 2);
  // Numbers are numbers: garbage, trailing characters and negative counts are refused
  // (they were read with atoi: "2x" was 2, "abc" was 0).
  for (const char* bad :
       {"gc /nonexistent --keep 2x", "gc /nonexistent --keep 0", "gc /nonexistent --keep -1",
        "verify /nonexistent --step abc", "verify /nonexistent --step 12abc",
        "export /nonexistent out --step -3", "inspect /nonexistent --step 1e3",
        "placement --nodes two", "launch --nodes 2x -- true"}) {
    CliRun r = RunCli(bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("try --help"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(Cli, SettingsDocumentIsTheSettingsTable) {
  // docs/settings.md holds `cairn settings --markdown` verbatim between its markers, so the
  // parser, --help and the document cannot drift apart.
  CliRun r = RunCli("settings --markdown");
  ASSERT_EQ(r.code, 0) << r.out;
  auto doc = ReadWholeFile(DefaultFileSystem(), std::string(CAIRN_SOURCE_DIR) + "/docs/settings.md",
                           1 << 20);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  const std::string begin = "<!-- settings: begin (cairn settings --markdown) -->\n";
  const std::string end = "<!-- settings: end -->";
  const size_t b = doc->find(begin), e = doc->find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(doc->substr(b + begin.size(), e - b - begin.size()), r.out)
      << "regenerate the table in docs/settings.md with `cairn settings --markdown`";
  // The documented default of the drain priority is the one Options has.
  EXPECT_NE(r.out.find("| `CAIRN_PERSIST_PRIORITY` | `low` |"), std::string::npos) << r.out;
}

TEST(Cli, PlacementTable) {
  CliRun r = RunCli("placement --nodes 3 --ranks-per-node 2");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("rank 4 (node 2)  replicas on: 0 (node 0)"), std::string::npos) << r.out;
  EXPECT_EQ(RunCli("placement --nodes 2 --replicas 2").code, 2);
  // 4 nodes in a ring, 1 replica: 2 lost nodes are fatal when they are neighbours (4 of
  // the 6 pairs); in groups {0,1} {2,3}, when they are a group (2 of 6).
  CliRun ring = RunCli("placement --nodes 4 --replicas 1 --odds-only --lost 2");
  EXPECT_EQ(ring.code, 0);
  EXPECT_EQ(ring.out.find("replicas on"), std::string::npos) << ring.out;
  EXPECT_NE(ring.out.find("0.333333333"), std::string::npos) << ring.out;
  CliRun group = RunCli("placement --nodes 4 --replicas 1 --strategy group --odds-only --lost 2");
  EXPECT_NE(group.out.find("0.666666667"), std::string::npos) << group.out;
}

TEST(Cli, LaunchSetsTheTorchrunVariables) {
  CliRun r = RunCli(
      "launch --nodes 2 --ranks-per-node 2 -- sh -c "
      "'test \"$WORLD_SIZE\" = 4 && test \"$LOCAL_WORLD_SIZE\" = 2 && "
      "test \"$CAIRN_NODE\" = $((RANK / 2)) && test \"$LOCAL_RANK\" = $((RANK % 2))'");
  EXPECT_EQ(r.code, 0) << r.out;
  CliRun f = RunCli("launch --nodes 2 -- sh -c 'exit $RANK'");
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.out.find("rank 1 (node 1"), std::string::npos) << f.out;
}

// A small demo: 2 nodes x 2 ranks, 16 steps, node 1 killed once step 8 is replicated.
CliRun RunDemo(const testing::TempDir& root, const std::string& job, const std::string& extra) {
  // Over tcp, as the other process tests: UCX's shared-memory transport trips on the
  // segments of killed processes under the sanitizers.
  return RunShell(
      "UCX_TLS=tcp " + std::string(CAIRN_CLI) +
      " demo --steps 16 --layers 1 --dim 128 --vocab 1024 --persist-every 4 --kill-at 8 "
      "--host-root " +
      root.path() + "/host --pfs-root " + root.path() + "/pfs --job " + job + " " + extra);
}

TEST(Cli, DemoBringsANodeBackFromPeerMemoryAndReshardsThePfsOntoThreeRanks) {
  testing::TempDir root("clidemo");
  const std::string job = testing::UniqueJobId("clidemo");
  CliRun r = RunDemo(root, job, "");
  EXPECT_EQ(r.code, 0) << r.out;
  // The resumed job trains to step 16, or 3 steps past the one it restored where the kill
  // landed late (node 1 is killed once step 8 is replicated, and training runs on while the
  // replicas catch up): the new job of 3 ranks restores that last step from the PFS.
  const std::string resumed = "train to step ";
  const size_t at = r.out.find(resumed);
  ASSERT_NE(at, std::string::npos) << r.out;
  const long long last = std::stoll(r.out.substr(at + resumed.size()));
  EXPECT_GE(last, 16);
  const std::string from_pfs = "rank 2 restored step " + std::to_string(last) + " from pfs";
  for (const std::string& want :
       {std::string("killed with SIGKILL"), std::string("rank 2 restored step"),
        std::string("from node 0's memory"), from_pfs, std::string("recovery time by tier"),
        std::string("peer (ranks 2, 3)"), std::string("checkpoint stall"),
        std::string("persisted to the PFS"), std::string("demo passed")})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
  for (const char* dir : {"/host/", "/pfs/"})
    EXPECT_FALSE(DefaultFileSystem()->Exists(root.path() + dir + job)) << "demo left " << dir;
  EXPECT_FALSE(DefaultFileSystem()->Exists(root.path() + "/pfs/" + job + ".logs"));
}

// The demo's checks are real: a replica damaged before the restart makes it fail, whether
// cairn's checksums see the damage (it falls back past that version) or not (the replay
// check of the values does).
TEST(Cli, DemoFailsWhenAReplicaIsCorrupted) {
  testing::TempDir root("clidemobad");
  const std::string job = testing::UniqueJobId("clidemobad");
  CliRun flip = RunDemo(root, job + "-flip", "--corrupt-replica flip");
  EXPECT_EQ(flip.code, 1) << flip.out;
  EXPECT_NE(flip.out.find("checksum mismatch"), std::string::npos) << flip.out;
  EXPECT_NE(flip.out.find("demo FAILED"), std::string::npos) << flip.out;

  CliRun sealed = RunDemo(root, job + "-sealed", "--corrupt-replica resealed");
  EXPECT_EQ(sealed.code, 1) << sealed.out;
  EXPECT_EQ(sealed.out.find("checksum mismatch"), std::string::npos) << sealed.out;
  EXPECT_NE(sealed.out.find("every value: FAILED optimizer."), std::string::npos) << sealed.out;
  EXPECT_NE(sealed.out.find("demo FAILED"), std::string::npos) << sealed.out;
}

TEST(Cli, LsInspectVerifyAndGcOnThePfsAndHostTiers) {
  testing::TempDir root("cliverify");
  Options o = testing::TestOptions(root, "verify");
  o.persist_every = 0;
  o.slots = 3;
  std::vector<float> w(300000);  // 1.2 MB: several 256 KiB chunks
  std::vector<int64_t> step_count(1);
  o.chunk_bytes = 256 << 10;
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (int64_t step = 1; step <= 2; ++step) {
      testing::FillPattern(w.data(), w.size() * 4, step);
      step_count[0] = step;
      std::vector<ShardSpec> shards = {
          ShardSpec::Whole({"layers.0.w", DType::kF32, {600, 500}}, w.data()),
          ShardSpec::Whole({"step_count", DType::kI64, {}}, step_count.data())};
      ASSERT_TRUE((*c)->save(step, shards, {{"rng", "abc"}}).ok());
      auto f = (*c)->flush();
      ASSERT_TRUE(f.ok()) << f.status().ToString();
    }
  }
  const std::string pfs = PfsJobDir(o.pfs_root, o.job_id);
  const std::string host = JoinPath(o.host_root, o.job_id);

  CliRun ls = RunCli("ls " + pfs);
  EXPECT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("committed, LATEST"), std::string::npos) << ls.out;
  ls = RunCli("ls " + host);
  EXPECT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("rank-0"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("step 2"), std::string::npos) << ls.out;
  // With a trailing slash (a shell's completion adds one) the names stay whole.
  ls = RunCli("ls " + host + "/");
  EXPECT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("  node-0/rank-0\n"), std::string::npos) << ls.out;

  CliRun in = RunCli("inspect " + pfs);
  EXPECT_EQ(in.code, 0) << in.out;
  for (const char* want : {"step 2 of job", "layers.0.w", "float32", "[600, 500]", "data/0.bin",
                           "chunk checksum(s): ", "blob 'rng' of rank 0"})
    EXPECT_NE(in.out.find(want), std::string::npos) << want << "\n" << in.out;
  in = RunCli("inspect " + host + " --step 1");
  EXPECT_EQ(in.code, 0) << in.out;
  EXPECT_NE(in.out.find("step 1 in"), std::string::npos) << in.out;
  EXPECT_NE(in.out.find("[0:600, 0:500]"), std::string::npos) << in.out;
  EXPECT_EQ(RunCli("inspect " + host + " --step 99").code, 1);

  CliRun v = RunCli("verify " + pfs);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("2 version(s) verified, 0 corrupt"), std::string::npos) << v.out;
  v = RunCli("verify " + host);
  EXPECT_EQ(v.code, 0) << v.out;

  // A byte flipped in each data file of step 2 (then put back), and in its MANIFEST.
  FileSystem* fs = DefaultFileSystem();
  const std::string step2 = JoinPath(pfs, StepDirName(2));
  auto m = ReadManifest(fs, step2);
  ASSERT_TRUE(m.ok());
  for (const std::string& f : m->files()) {
    const std::string path = JoinPath(step2, f);
    for (const auto& b : m->boxes()) {
      if (m->files(static_cast<int>(b.file())) != f) continue;
      testing::CorruptByte(path, b.offset() + b.length() / 2);
      v = RunCli("verify " + pfs + " --step 2");
      EXPECT_EQ(v.code, 1) << v.out;
      EXPECT_NE(v.out.find(path), std::string::npos) << v.out;
      EXPECT_NE(v.out.find("'" + m->tensors(static_cast<int>(b.tensor())).name() + "'"),
                std::string::npos)
          << v.out;
      testing::CorruptByte(path, b.offset() + b.length() / 2);  // flips it back
    }
  }
  ASSERT_EQ(RunCli("verify " + pfs).code, 0);
  const std::string manifest = JoinPath(step2, "MANIFEST");
  testing::CorruptByte(manifest, 20);
  v = RunCli("verify " + pfs);
  EXPECT_EQ(v.code, 1) << v.out;
  EXPECT_NE(v.out.find(manifest), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("step 1: OK"), std::string::npos) << v.out;  // the others still verify

  // A byte flipped in a host slot.
  auto versions = HostTier::Scan(fs, JoinPath(host, "node-0/rank-0"), nullptr);
  ASSERT_TRUE(versions.ok());
  ASSERT_FALSE(versions->empty());
  const std::string slot =
      JoinPath(host, "node-0/rank-0/slot-" + std::to_string(versions->front().slot));
  testing::CorruptByte(slot, 1000);
  v = RunCli("verify " + host);
  EXPECT_EQ(v.code, 1) << v.out;
  EXPECT_NE(v.out.find(slot), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("'layers.0.w'"), std::string::npos) << v.out;
  EXPECT_EQ(RunCli("verify").code, 2);

  // gc keeps the newest step (and the one LATEST names).
  EXPECT_EQ(RunCli("gc " + pfs).code, 2);
  CliRun gc = RunCli("gc " + pfs + " --keep 1");
  EXPECT_EQ(gc.code, 0) << gc.out;
  EXPECT_NE(gc.out.find("kept: 2"), std::string::npos) << gc.out;
  EXPECT_FALSE(fs->Exists(JoinPath(pfs, StepDirName(1))));
  EXPECT_TRUE(fs->Exists(JoinPath(pfs, StepDirName(2))));
}

TEST(Cli, ExportWritesSafetensorsThatNumpyReadsBack) {
  testing::TempDir root("cliexport");
  Options o = testing::TestOptions(root, "export");
  o.persist_every = 0;
  std::vector<float> w(600 * 500);
  std::vector<uint16_t> bf(64 * 48);
  std::vector<int64_t> count(1, 42);
  std::vector<double> flat(5 * 2 * 6);
  testing::FillPattern(w.data(), w.size() * 4, 1);
  testing::FillPattern(bf.data(), bf.size() * 2, 2);
  testing::FillPattern(flat.data(), flat.size() * 8, 3);
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<ShardSpec> shards = {
        ShardSpec::Whole({"layers.0.w", DType::kF32, {600, 500}}, w.data()),
        ShardSpec::Whole({"step_count", DType::kI64, {}}, count.data())};
    // bf16 [64, 48] held as two row halves; f64 [5, 2, 6] as two flat ranges.
    for (int h = 0; h < 2; ++h) {
      ShardSpec s;
      s.meta = {"layers.1.w", DType::kBF16, {64, 48}};
      s.box = Box{{32 * h, 0}, {32, 48}};
      s.data = bf.data() + 32 * 48 * h;
      shards.push_back(s);
    }
    for (auto [b, e] : {std::pair{0, 23}, std::pair{23, 60}}) {
      auto f =
          ShardSpec::FromFlatRange({"optim.flat", DType::kF64, {5, 2, 6}}, b, e, flat.data() + b);
      ASSERT_TRUE(f.ok());
      for (auto& x : *f) shards.push_back(x);
    }
    ASSERT_TRUE((*c)->save(3, shards).ok());
    auto f = (*c)->flush();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
  }
  // What numpy must find, tensor by tensor.
  FileSystem* fs = DefaultFileSystem();
  auto dump = [&](const std::string& name, const void* p, size_t n) {
    ASSERT_TRUE(WriteFileAtomic(fs, JoinPath(root.path(), name + ".expect"),
                                std::string(static_cast<const char*>(p), n))
                    .ok());
  };
  dump("layers.0.w", w.data(), w.size() * 4);
  dump("layers.1.w", bf.data(), bf.size() * 2);
  dump("step_count", count.data(), 8);
  dump("optim.flat", flat.data(), flat.size() * 8);
  const std::string pfs = PfsJobDir(o.pfs_root, o.job_id);
  const std::string out = JoinPath(root.path(), "model.safetensors");
  CliRun e = RunCli("export " + pfs + " --step 3 " + out);
  ASSERT_EQ(e.code, 0) << e.out;
  // An independent reader: Debian's numpy, not cairn code.
  const std::string script = JoinPath(root.path(), "check.py");
  ASSERT_TRUE(WriteFileAtomic(fs, script, R"(import json, struct, sys, numpy as np
path, expect_dir = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
types = {"F64": np.float64, "F32": np.float32, "BF16": np.uint16, "I64": np.int64}
names = sorted(k for k in header if k != "__metadata__")
for name in names:
    t = header[name]
    b, e = t["data_offsets"]
    got = np.frombuffer(data[b:e], dtype=types[t["dtype"]]).reshape(t["shape"])
    want = np.fromfile(expect_dir + "/" + name + ".expect", dtype=types[t["dtype"]])
    # Bit patterns compared (random bytes make NaNs, which never compare equal).
    assert got.size == want.size and np.array_equal(got.reshape(-1).view(np.uint8), want.view(np.uint8)), name
    assert list(got.shape) == t["shape"], name
print("OK", len(names), " ".join(names))
)")
                  .ok());
  CliRun py = RunShell("/usr/bin/python3 " + script + " " + out + " " + root.path());
  EXPECT_NE(py.out.find("OK 4 layers.0.w layers.1.w optim.flat step_count"), std::string::npos)
      << py.out;
  // A subset by regular expression.
  const std::string sub = JoinPath(root.path(), "layers.safetensors");
  ASSERT_EQ(RunCli("export " + pfs + " --tensors 'layers\\..*' " + sub).code, 0);
  py = RunShell("/usr/bin/python3 " + script + " " + sub + " " + root.path());
  EXPECT_NE(py.out.find("OK 2 layers.0.w layers.1.w"), std::string::npos) << py.out;
  EXPECT_EQ(RunCli("export " + pfs + " --tensors 'nothing' " + sub).code, 1);
  EXPECT_EQ(RunCli("export " + pfs).code, 2);
}

TEST(Cli, TraceFilesAreChromeTraceEventsAndMerge) {
  testing::TempDir root("clitrace");
  Options o = testing::TestOptions(root, "trace");
  o.persist_every = 0;
  o.trace_path = JoinPath(root.path(), "trace.json");
  std::vector<float> w(100000);
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<ShardSpec> shards = {ShardSpec::Whole({"w", DType::kF32, {100000}}, w.data())};
    for (int64_t step = 1; step <= 3; ++step) {
      ASSERT_TRUE((*c)->fence().ok());
      ASSERT_TRUE((*c)->save(step, shards).ok());
    }
    ASSERT_TRUE((*c)->flush().ok());
    // Into two halves: resharded, so the bytes are verified before they are copied.
    std::vector<ShardSpec> halves = shards;
    halves[0].box = {{0}, {50000}};
    halves.push_back(shards[0]);
    halves[1].box = {{50000}, {50000}};
    halves[1].data = w.data() + 50000;
    ASSERT_TRUE((*c)->restore(halves).ok());
  }
  const std::string merged = JoinPath(root.path(), "merged.json");
  ASSERT_EQ(RunCli("trace-merge " + merged + " " + o.trace_path + " " + o.trace_path).code, 0);
  const std::string script = JoinPath(root.path(), "check.py");
  ASSERT_TRUE(WriteFileAtomic(DefaultFileSystem(), script, R"(import json, sys
one = json.load(open(sys.argv[1]))["traceEvents"]
two = json.load(open(sys.argv[2]))["traceEvents"]
assert len(two) == 2 * len(one), (len(one), len(two))
for e in one:
    assert e["ph"] == "X" and e["dur"] >= 0 and e["ts"] > 0 and "pid" in e and "tid" in e, e
print("OK", " ".join(sorted({e["name"] for e in one})))
)")
                  .ok());
  CliRun py = RunShell("/usr/bin/python3 " + script + " " + o.trace_path + " " + merged);
  EXPECT_EQ(py.code, 0) << py.out;
  for (const char* name : {"capture copy", "fence", "persist round", "restore", "restore plan",
                           "restore transfer", "restore checksum", "save"})
    EXPECT_NE(py.out.find(name), std::string::npos) << name << "\n" << py.out;
  EXPECT_EQ(RunCli("trace-merge " + merged).code, 2);
  EXPECT_EQ(RunCli("trace-merge " + merged + " " + script).code, 1);
}

}  // namespace
}  // namespace cairn
