// Persistence to the parallel filesystem, in one process: the MANIFEST format, the save
// planner (dedup, balance, slabs), box-region copies, and the Checkpointer's flush /
// cadence / garbage collection / I/O-fault behaviour (the multi-process cases are in
// persist_process_test.cc).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>

#include "api/open_with.h"
#include "cairn/checkpointer.h"
#include "core/arith.h"
#include "core/box_copy.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "layout/save_planner.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/persister.h"
#include "persist/pfs_reader.h"
#include "persist/writer.h"
#include "testing/controlled_filesystems.h"
#include "testing/fault_injection_filesystem.h"
#include "testing/power_loss_filesystem.h"
#include "tests/persist_state.h"
#include "tests/plan_check.h"
#include "tests/test_util.h"
#include "tests/tier_util.h"

namespace cairn {
namespace {

using testing::ExpectCoveredOnce;
using testing::PersistState;
using testing::TempDir;

std::string LayoutOf(const PersistState& s) {
  RankLayout l;
  for (size_t i = 0; i < s.metas.size(); ++i) {
    l.tensors.push_back(s.metas[i]);
    l.shards.push_back({static_cast<uint32_t>(i), Box::Whole(s.metas[i].global_shape)});
  }
  return EncodeRankLayout(l);
}

TEST(Manifest, RoundTripAndEveryCorruptionIsAnError) {
  pb::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_job("j");
  m.set_step(12);
  m.set_world_size(1);
  m.set_chunk_bytes(4);
  auto* t = m.add_tensors();
  t->set_name("w");
  t->set_dtype(static_cast<uint32_t>(DType::kF32));
  t->add_shape(2);
  t->add_shape(3);
  auto* sh = m.add_shards();
  sh->set_tensor(0);
  sh->add_offsets(0);
  sh->add_offsets(0);
  sh->add_lengths(2);
  sh->add_lengths(3);
  m.add_lists()->add_shards(0);
  m.add_rank_list(0);
  m.add_files("data/0.bin");
  auto* b = m.add_boxes();
  b->set_tensor(0);
  b->add_offsets(0);
  b->add_offsets(0);
  b->add_lengths(2);
  b->add_lengths(3);
  b->set_length(24);
  for (int i = 0; i < 6; ++i) b->add_chunk_checksums(i);
  const std::string bytes = EncodeManifest(m);
  auto back = DecodeManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->SerializeAsString(), m.SerializeAsString());
  // Every truncation and every single bit flip is refused.
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(DecodeManifest(std::string_view(bytes).substr(0, n)).ok()) << n;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_FALSE(DecodeManifest(bad).ok()) << "flip at " << i;
  }
  // Well-framed but inconsistent manifests are refused with the reason.
  auto refuse = [&](auto mutate, const std::string& why) {
    pb::Manifest x = m;
    mutate(x);
    auto r = DecodeManifest(EncodeManifest(x));
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  };
  refuse([](pb::Manifest& x) { x.set_format_version(99); }, "format version");
  refuse([](pb::Manifest& x) { x.set_files(0, "../../etc/passwd"); }, "is not data/<rank>.bin");
  refuse([](pb::Manifest& x) { x.set_files(0, "data/1/.bin"); }, "is not data/<rank>.bin");
  refuse([](pb::Manifest& x) { x.mutable_boxes(0)->set_lengths(1, 4); }, "outside");
  refuse([](pb::Manifest& x) { x.mutable_boxes(0)->set_length(20); }, "its box needs 24");
  refuse([](pb::Manifest& x) { x.mutable_boxes(0)->add_chunk_checksums(1); }, "chunk checksums");
  refuse([](pb::Manifest& x) { x.mutable_boxes(0)->set_file(3); }, "missing data file");
  refuse([](pb::Manifest& x) { x.mutable_tensors(0)->set_dtype(200); }, "unknown dtype");
  refuse([](pb::Manifest& x) { x.set_world_size(2); }, "world size is 2");
}

TEST(StepDirName, RoundTrips) {
  for (int64_t s : {0ll, 7ll, 123456ll, 1234567ll, 999999999999ll})
    EXPECT_EQ(ParseStepDirName(StepDirName(s)), s);
  EXPECT_EQ(StepDirName(42), "step-000042");
  for (const char* bad : {"step-42", "step-00004a", "step-0000042", "xstep-000042", "step-"})
    EXPECT_FALSE(ParseStepDirName(bad).has_value()) << bad;
}

TEST(CopyBoxRegion, MatchesElementByElementCopy) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t nd = 1 + rng() % 4;
    Shape shape(nd);
    for (auto& e : shape) e = 1 + static_cast<int64_t>(rng() % 6);
    auto rand_box = [&] {
      Box b;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t o = static_cast<int64_t>(rng() % static_cast<uint64_t>(shape[d]));
        b.offsets.push_back(o);
        b.lengths.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(shape[d] - o)));
      }
      return b;
    };
    const Box a = rand_box(), b = rand_box();
    auto r = Intersect(a, b);
    if (!r) continue;
    std::vector<uint16_t> src(static_cast<size_t>(a.numel())),
        dst(static_cast<size_t>(b.numel()), 0);
    // Element value = its global flat index.
    auto flat = [&](const std::vector<int64_t>& idx) {
      int64_t f = 0;
      for (size_t d = 0; d < nd; ++d) f = f * shape[d] + idx[d];
      return static_cast<uint16_t>(f + 1);
    };
    auto each = [&](const Box& box, auto fn) {
      std::vector<int64_t> idx(box.offsets);
      for (int64_t k = 0; k < box.numel(); ++k) {
        fn(idx, k);
        for (size_t d = nd; d-- > 0;) {
          if (++idx[d] < box.offsets[d] + box.lengths[d]) break;
          idx[d] = box.offsets[d];
        }
      }
    };
    each(a, [&](auto& idx, int64_t k) { src[static_cast<size_t>(k)] = flat(idx); });
    CopyBoxRegion(src.data(), a, dst.data(), b, *r, sizeof(uint16_t));
    each(b, [&](auto& idx, int64_t k) {
      bool in = true;
      for (size_t d = 0; d < nd; ++d)
        in = in && idx[d] >= r->offsets[d] && idx[d] < r->offsets[d] + r->lengths[d];
      EXPECT_EQ(dst[static_cast<size_t>(k)], in ? flat(idx) : 0) << "trial " << trial;
    });
  }
}

TEST(SavePlanner, DataParallelReplicasWriteEachBoxOnceAndEvenly) {
  PersistState s(4096);  // 68 MiB of tensors (metadata only here)
  for (int world : {1, 2, 4, 8}) {
    std::vector<std::string> layouts(static_cast<size_t>(world), LayoutOf(s));
    auto plan = MakeSavePlan(layouts);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->unique_bytes, s.bytes());
    EXPECT_EQ(plan->lists.size(), 1u);
    EXPECT_EQ(plan->shards.size(), s.metas.size());
    ExpectCoveredOnce(*plan);
    EXPECT_LE(plan->max_writer_share(), 1.1) << world << " ranks";
    for (int r = 0; r < world; ++r) EXPECT_GT(plan->writer_bytes[static_cast<size_t>(r)], 0u);
    // Pieces are grouped by writer in its slot order.
    for (size_t i = 1; i < plan->pieces.size(); ++i)
      EXPECT_LE(plan->pieces[i - 1].writer, plan->pieces[i].writer);
    // The same layouts give the same plan on every rank.
    auto again = MakeSavePlan(layouts);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->pieces.size(), plan->pieces.size());
    for (size_t i = 0; i < plan->pieces.size(); ++i) {
      EXPECT_EQ(again->pieces[i].writer, plan->pieces[i].writer);
      EXPECT_EQ(again->pieces[i].box, plan->pieces[i].box);
    }
  }
}

TEST(SavePlanner, TensorParallelShardsAndReplicatedNormsAreDeduplicated) {
  // TP=2 x DP=3: rank = dp * 2 + tp. Each TP rank holds half of "w" (columns) and all of
  // the norm, which is therefore held by all 6 ranks.
  const Shape wshape{4096, 8192};
  std::vector<std::string> layouts;
  for (int r = 0; r < 6; ++r) {
    const int tp = r % 2;
    RankLayout l;
    l.tensors.push_back({"w", DType::kF32, wshape});
    l.tensors.push_back({"norm", DType::kF32, {8192}});
    l.shards.push_back({0, Box{{0, 4096 * tp}, {4096, 4096}}});
    l.shards.push_back({1, Box::Whole({8192})});
    layouts.push_back(EncodeRankLayout(l));
  }
  auto plan = MakeSavePlan(layouts);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->lists.size(), 2u);
  EXPECT_EQ(plan->shards.size(), 3u);  // two halves of w, one norm
  EXPECT_EQ(plan->unique_bytes, 4096u * 8192 * 4 + 8192 * 4);
  ExpectCoveredOnce(*plan);
  EXPECT_LE(plan->max_writer_share(), 1.1);
}

TEST(SavePlanner, RanksDisagreeingOnATensorAreAnError) {
  RankLayout a, b;
  a.tensors.push_back({"w", DType::kF32, {4, 4}});
  a.shards.push_back({0, Box::Whole({4, 4})});
  b.tensors.push_back({"w", DType::kF16, {4, 4}});
  b.shards.push_back({0, Box::Whole({4, 4})});
  auto plan = MakeSavePlan({EncodeRankLayout(a), EncodeRankLayout(b)});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("tensor 'w' is float32 [4, 4] on rank 0 but float16"),
            std::string::npos)
      << plan.status().message();
  // A corrupt layout names the rank it came from.
  auto bad = MakeSavePlan({EncodeRankLayout(a), "garbage"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 1"), std::string::npos) << bad.status().message();
}

TEST(LocationTable, RoundTripsAndRejectsGarbage) {
  LocationTable t;
  t.pieces.push_back({4096, {1, 2, 3}});
  t.blobs.push_back({"rng", 8192, 10, 99});
  auto back = DecodeLocationTable(EncodeLocationTable(t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->pieces[0].chunk_checksums, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(back->blobs[0].name, "rng");
  LocationTable f;
  f.status = Status::NoSpace("rank 3: write x: No space left on device");
  auto fb = DecodeLocationTable(EncodeLocationTable(f));
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(fb->status.code(), StatusCode::kNoSpace);
  const std::string enc = EncodeLocationTable(t);
  for (size_t n = 0; n < enc.size(); ++n)
    EXPECT_FALSE(DecodeLocationTable(std::string_view(enc).substr(0, n)).ok()) << n;
}

TEST(Writer, WritesEveryItemAlignedWithChecksumsDirectOrNot) {
  // /var/tmp is a disk filesystem here (O_DIRECT works); /dev/shm refuses O_DIRECT and
  // the writer falls back to buffered writes. Both must give the same bytes.
  std::vector<std::byte> src(((9ull << 20) + 123) + 4096);
  testing::FillPattern(src.data(), src.size(), 77);
  for (const char* base : {"/var/tmp", "/dev/shm"}) {
    if (!DefaultFileSystem()->Exists(base)) continue;
    std::string dir = std::string(base) + "/cairn-writer-XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    for (bool direct : {false, true}) {
      // One large item starting mid-page (goes through the bounce buffer), one aligned.
      std::vector<WriteItem> items = {{src.data() + 1, (5ull << 20) + 123, 0},
                                      {src.data() + 8192, 4ull << 20, 0}};
      const uint64_t size = LayOutItems(items, kPfsAlign);
      EXPECT_EQ(items[1].file_offset % kPfsAlign, 0u);
      WriterOptions wo;
      wo.threads = 3;
      wo.direct = direct;
      wo.chunk_bytes = 1 << 20;
      const std::string path = dir + "/f.bin";
      auto rep = WriteDataFile(DefaultFileSystem(), path, items, wo, nullptr, nullptr);
      ASSERT_TRUE(rep.ok()) << rep.status().ToString();
      if (!direct) {
        EXPECT_FALSE(rep->direct);
      }
      auto bytes = ReadWholeFile(DefaultFileSystem(), path, 1ull << 30);
      ASSERT_TRUE(bytes.ok());
      EXPECT_GE(bytes->size(), items[1].file_offset + items[1].nbytes);
      EXPECT_LE(bytes->size(), size);
      for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(std::memcmp(bytes->data() + items[i].file_offset, items[i].src, items[i].nbytes),
                  0);
        ASSERT_EQ(rep->chunk_checksums[i].size(), CeilDiv(items[i].nbytes, wo.chunk_bytes));
        for (size_t c = 0; c < rep->chunk_checksums[i].size(); ++c) {
          const uint64_t b = c * wo.chunk_bytes,
                         n = std::min<uint64_t>(wo.chunk_bytes, items[i].nbytes - b);
          EXPECT_EQ(rep->chunk_checksums[i][c], Checksum(items[i].src + b, n));
        }
      }
    }
    (void)DefaultFileSystem()->RemoveAll(dir);
  }
}

// Whichever call of a data-file write fails, the error names the file and no descriptor
// stays open.
TEST(Writer, NoDescriptorOutlivesAFailedWrite) {
  TempDir root("writerfault");
  std::vector<std::byte> src(3ull << 20);
  testing::FillPattern(src.data(), src.size(), 5);
  std::vector<WriteItem> items = {{src.data(), src.size(), 0}};
  LayOutItems(items, kPfsAlign);
  CountingFileSystem counting(DefaultFileSystem());
  FaultInjectionFileSystem fs(&counting);
  WriterOptions wo;
  wo.threads = 2;
  wo.chunk_bytes = 1 << 20;
  const std::string path = root.path() + "/f.bin";
  for (uint64_t n = 1;; ++n) {
    fs.FailNth(n, EIO, false, kFsAll);
    auto rep = WriteDataFile(&fs, path, items, wo, nullptr, nullptr);
    fs.Disarm();
    EXPECT_EQ(counting.open(), 0) << "after failing call " << n;
    if (rep.ok()) break;
    EXPECT_NE(rep.status().message().find(path), std::string::npos) << rep.status().ToString();
    EXPECT_FALSE(DefaultFileSystem()->Exists(path)) << "a failed write left its file";
    ASSERT_LT(n, 20u) << "never succeeded";
  }
}

TEST(Writer, RateLimitHoldsThroughputDown) {
  TempDir root("ratelimit");
  std::vector<std::byte> src(16ull << 20);
  std::vector<WriteItem> items = {{src.data(), src.size(), 0}};
  // 64 MiB/s: the 4 chunks of 4 MiB start at least 62.5 ms apart (the first at once).
  RateLimiter limiter(64ull << 20);
  WriterOptions wo;
  wo.threads = 4;
  const int64_t t0 = NowNanos();
  auto rep =
      WriteDataFile(DefaultFileSystem(), root.path() + "/f.bin", items, wo, &limiter, nullptr);
  const double s = NanosToSeconds(NowNanos() - t0);
  ASSERT_TRUE(rep.ok());
  EXPECT_GE(s, 0.18);
}

Options PersistOptions(const TempDir& root, const std::string& tag) {
  Options o = testing::TestOptions(root, tag);
  o.persist_every = 0;
  o.slots = 3;
  o.chunk_bytes = 64 << 10;
  return o;
}

std::string JobDir(const Options& o) {
  return PfsJobDir(o.pfs_root, o.job_id);
}

// Files under `dir` whose name marks an unfinished write.
std::vector<std::string> TempFiles(const std::string& dir) {
  std::vector<std::string> out;
  auto names = DefaultFileSystem()->ListDir(dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    const std::string p = JoinPath(dir, n);
    if (n.find(".tmp.") != std::string::npos) out.push_back(p);
    for (const std::string& q : TempFiles(p)) out.push_back(q);
  }
  return out;
}

std::vector<int64_t> StepDirs(const std::string& job_dir) {
  std::vector<int64_t> out;
  auto names = DefaultFileSystem()->ListDir(job_dir);
  if (names.ok())
    for (const std::string& n : *names)
      if (auto s = ParseStepDirName(n)) out.push_back(*s);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Persist, FlushCommitsAStepThatReadsBackBitExactInAnyLayout) {
  TempDir root("persist");
  Options o = PersistOptions(root, "flush");
  PersistState s(64);
  auto ck = Checkpointer::Open(o);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  s.Fill(5);
  ASSERT_TRUE((*ck)->save(5, s.Shards(), {{"who", PersistState::Blob(0, 5)}}).ok());
  ASSERT_TRUE((*ck)->fence().ok());
  auto r = (*ck)->flush();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 5);
  FileSystem* fs = DefaultFileSystem();
  EXPECT_EQ(*ReadLatest(fs, JobDir(o)), 5);
  const std::string step_dir = JoinPath(JobDir(o), StepDirName(5));
  EXPECT_EQ(s.Check(fs, step_dir, 5, 0), "");
  Stats st = (*ck)->stats();
  EXPECT_EQ(st.persist.persisted, 1u);
  EXPECT_EQ(st.persist.newest_persisted_step, 5);
  EXPECT_GE(st.persist.bytes, s.bytes());
  EXPECT_EQ((*ck)->versions().front().state, VersionState::kPersisted);

  // Resharded read: "embed.weight" as 3 uneven row blocks and a column block.
  auto m = ReadManifest(fs, step_dir);
  ASSERT_TRUE(m.ok());
  const TensorMeta& em = s.metas[0];
  const int64_t rows = em.global_shape[0], cols = em.global_shape[1];
  std::vector<Box> boxes = {Box{{0, 0}, {7, cols}}, Box{{7, 0}, {rows - 100, cols}},
                            Box{{rows - 93, 0}, {93, cols}}, Box{{3, 5}, {rows - 10, 17}}};
  for (const Box& b : boxes) {
    std::vector<float> got(static_cast<size_t>(b.numel()));
    ShardSpec t{em, b, got.data()};
    ASSERT_TRUE(ReadShards(fs, step_dir, *m, {&t, 1}).ok());
    std::vector<float> want(static_cast<size_t>(b.numel()));
    CopyBoxRegion(s.data[0].data(), Box::Whole(em.global_shape), want.data(), b, b, 4);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << b.ToString();
  }
  // VerifyStep reads every byte; a flipped byte is found and named.
  EXPECT_TRUE(VerifyStep(fs, step_dir, *m).ok());
  testing::CorruptByte(JoinPath(step_dir, "data/0.bin"), m->boxes(1).offset() + 3);
  Status v = VerifyStep(fs, step_dir, *m);
  EXPECT_EQ(v.code(), StatusCode::kCorruption);
  EXPECT_NE(v.message().find("data/0.bin"), std::string::npos) << v.message();
}

// The PFS tier writes only into directories no one outside their owner and group can
// change: a job directory another user made writable by all is refused, naming it, and
// the step already committed stays LATEST (another user is played by chown).
TEST(Persist, AJobDirectoryAnyUserCanWriteIsRefusedAndLatestStays) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by chown";
  TempDir root("persisttrust");
  Options o = PersistOptions(root, "trust");
  PersistState s(16);
  auto ck = Checkpointer::Open(o);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  s.Fill(1);
  ASSERT_TRUE((*ck)->save(1, s.Shards()).ok());
  ASSERT_TRUE((*ck)->fence().ok());
  ASSERT_TRUE((*ck)->flush().ok());
  const std::string job = JobDir(o);
  ASSERT_EQ(::chown(job.c_str(), 61234, 61234), 0);
  ASSERT_EQ(::chmod(job.c_str(), 0777), 0);
  s.Fill(2);
  ASSERT_TRUE((*ck)->save(2, s.Shards()).ok());
  ASSERT_TRUE((*ck)->fence().ok());
  auto r = (*ck)->flush();
  ASSERT_FALSE(r.ok()) << "wrote step 2 into a job directory anyone can write";
  EXPECT_NE(r.status().message().find(job + " (uid 61234"), std::string::npos)
      << r.status().ToString();
  EXPECT_FALSE(DefaultFileSystem()->Exists(JoinPath(job, StepDirName(2))));
  EXPECT_EQ(*ReadLatest(DefaultFileSystem(), job), 1);
}

TEST(Persist, EveryKthSaveIsDrainedAndTheDestructorFinishesTheDueOnes) {
  TempDir root("persist");
  Options o = PersistOptions(root, "cadence");
  o.persist_every = 3;
  o.full_policy = FullPolicy::kBlock;
  PersistState s(16);
  std::optional<Stats> ck_stats;
  {
    auto ck = Checkpointer::Open(o);
    ASSERT_TRUE(ck.ok());
    for (int64_t t = 1; t <= 12; ++t) {
      s.Fill(t);
      ASSERT_TRUE((*ck)->save(t, s.Shards(), {{"who", PersistState::Blob(0, t)}}).ok());
      ASSERT_TRUE((*ck)->fence().ok());
    }
    // Rounds for the marks at saves 3, 6, 9, 12 may coalesce while a drain runs; the
    // destructor runs the ones still due, so the newest (12) is committed.
    ASSERT_TRUE((*ck)->wait_captured().ok());
    ck_stats = (*ck)->stats();
  }
  FileSystem* fs = DefaultFileSystem();
  EXPECT_EQ(*ReadLatest(fs, JobDir(o)), 12);
  const auto dirs = StepDirs(JobDir(o));
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.back(), 12);
  // A marked version that a fast loop pushed out of the ring before its drain started is
  // replaced by the newest one held, so the steps need not be multiples of 3.
  for (int64_t d : dirs) EXPECT_EQ(s.Check(fs, JoinPath(JobDir(o), StepDirName(d)), d, 0), "");
  EXPECT_EQ(ck_stats->persist.failed, 0u) << ck_stats->persist.last_error;
  EXPECT_TRUE(TempFiles(JobDir(o)).empty());
}

// A one-rank group whose first allgather first runs `during` (what the training thread
// does while the ranks agree on a round), and whose first broadcast (a round's outcome,
// after the commit) runs `committing` (what it does while the other ranks commit).
class AgreeingSlowly final : public Group {
 public:
  explicit AgreeingSlowly(std::function<void()> during, std::function<void()> committing = {})
      : during_(std::move(during)), committing_(std::move(committing)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Barrier() override { return Status::OK(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    if (during_) std::exchange(during_, nullptr)();
    return std::vector<std::string>{std::string(mine)};
  }
  Result<std::string> Broadcast(int, std::string_view data) override {
    if (committing_) std::exchange(committing_, nullptr)();
    return std::string(data);
  }

 private:
  std::function<void()> during_;
  std::function<void()> committing_;
};

// A one-rank host tier of `slots` slots holding steps 1-3 (64 KiB each, CaptureInto), and
// the config of a drain of it every `every` saves.
struct OneRankDrain {
  OneRankDrain(const std::string& tag, int slots, int every) : job(testing::UniqueJobId(tag)) {
    HostTierConfig tc;
    tc.dir = HostTier::RankDir(root.path() + "/host", job, 0, 0);
    tc.slots = slots;
    auto t = HostTier::Open(tc, DefaultFileSystem(), &log);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) tier = std::move(*t);
    for (int64_t s = 1; s <= 3 && tier; ++s)
      if (!testing::CaptureInto(*tier, s)) tier.reset();
    pc.job = job;
    pc.job_dir = PfsJobDir(root.path() + "/pfs", job);
    pc.every = every;
    pc.writer.chunk_bytes = 64 << 10;
  }
  TempDir root{"persist"};
  std::string job;
  Logger log{"test", LogLevel::kError};
  std::unique_ptr<HostTier> tier;  // null if it could not be opened and filled
  PersistConfig pc;
};

// The stats once `p`'s first round has run (or after a minute).
PersisterStats AfterFirstRound(const Persister& p) {
  const int64_t deadline = NowNanos() + int64_t{60} * 1000 * 1000 * 1000;
  while (p.stats().rounds == 0 && NowNanos() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return p.stats();
}

// The version a mark asks for is pinned from the offer on: a training loop that captures
// two more versions while the ranks agree cannot take its slot, so the round writes it
// instead of failing (this failed a CI run under ASan: "step 2 was replaced in the host
// tier by a newer capture before it could be written").
TEST(Persist, TheMarkedVersionIsHeldFromTheOfferUntilItIsWritten) {
  OneRankDrain d("pin", 3, 2);
  ASSERT_TRUE(d.tier);
  // While the ranks agree on the round for the mark at step 2, the loop captures steps 4
  // and 5: step 4 takes step 1's slot, step 5 would take step 2's (3 is the pinned newest).
  std::vector<int64_t> captured;
  AgreeingSlowly group([&] {
    for (int64_t t = 4; t <= 5; ++t)
      if (testing::CaptureInto(*d.tier, t)) captured.push_back(t);
  });
  PersisterStats st;
  {
    Persister p(d.pc, d.tier.get(), &group, DefaultFileSystem(), &d.log, [](uint64_t) {});
    p.OnSave(1, 1);
    p.OnSave(2, 2);  // the mark
    st = AfterFirstRound(p);
  }
  EXPECT_EQ(captured, std::vector<int64_t>{4}) << "step 5 took the marked version's slot";
  EXPECT_EQ(st.failed, 0u) << st.last_error;
  EXPECT_GE(st.persisted, 1u);
  auto steps = StepDirs(d.pc.job_dir);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), 2);
}

// Once this rank's share of the drained version is written and fsynced, its slot is free:
// the rest of the round (the gather, rank 0's manifest and LATEST, each with an fsync,
// waiting for the slowest rank) must not hold a slot a capture needs. With 2 slots a drain
// that pinned its version to the end of the round made every save during the commit skip
// (found by bench/memory: saves skipped one step after each drain on a machine whose
// fsyncs take an iteration).
TEST(Persist, TheDrainedVersionsSlotIsFreeOnceItsShareIsWritten) {
  OneRankDrain d("unpin", 2, 3);
  ASSERT_TRUE(d.tier);
  // While the round for the mark at step 3 commits, the loop captures steps 4 and 5: 4 takes
  // step 2's slot, 5 needs step 3's (4 is the newest).
  std::vector<int64_t> captured;
  AgreeingSlowly group({}, [&] {
    for (int64_t t = 4; t <= 5; ++t)
      if (testing::CaptureInto(*d.tier, t)) captured.push_back(t);
  });
  PersisterStats st;
  {
    Persister p(d.pc, d.tier.get(), &group, DefaultFileSystem(), &d.log, [](uint64_t) {});
    for (int64_t t = 1; t <= 3; ++t) p.OnSave(static_cast<uint64_t>(t), t);
    st = AfterFirstRound(p);
  }
  EXPECT_EQ(captured, (std::vector<int64_t>{4, 5})) << "the drain held step 3's slot to the end";
  EXPECT_EQ(st.failed, 0u) << st.last_error;
  EXPECT_EQ(st.persisted, 1u);
  auto steps = StepDirs(d.pc.job_dir);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps.front(), 3);
  // What was written is step 3's bytes, though its slot now holds step 5's.
  auto data =
      ReadWholeFile(DefaultFileSystem(),
                    JoinPath(JoinPath(d.pc.job_dir, StepDirName(3)), DataFileName(0)), 1 << 20);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_GE(data->size(), size_t{64} << 10);
  EXPECT_EQ(std::count(data->begin(), data->begin() + (64 << 10), static_cast<char>(3)), 64 << 10);
}

// In a job of several ranks the step agreement keeps two versions (the agreed one, the one
// being made redundant) and the third slot takes the captures. A periodic drain of another
// version pinned that third slot, and every save during the drain skipped (bench/memory:
// a skip one step after each drain where a drain outlasts an iteration). A periodic drain
// takes the newest version the job keeps instead; flush() still persists the last save.
TEST(Persist, APeriodicDrainTakesAKeptVersionAndFlushTheLastSaved) {
  OneRankDrain d("kept", 2, 3);
  ASSERT_TRUE(d.tier);
  d.tier->Keep({2}, {});  // the job keeps step 2; step 3's slot takes the next capture
  testing::StuckFileSystem stuck(DefaultFileSystem());
  AgreeingSlowly group({});
  Persister p(d.pc, d.tier.get(), &group, &stuck, &d.log, [](uint64_t) {});
  for (int64_t t = 1; t <= 3; ++t) p.OnSave(static_cast<uint64_t>(t), t);
  while (!stuck.entered()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The drain is stuck inside its write: a capture still finds a slot.
  EXPECT_TRUE(testing::CaptureInto(*d.tier, 4)) << "the drain pinned the slot captures take";
  stuck.Release();
  auto flushed = p.Flush(4, 4);
  ASSERT_TRUE(flushed.ok()) << flushed.status().ToString();
  EXPECT_EQ(*flushed, 4);
  EXPECT_EQ(StepDirs(d.pc.job_dir), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(p.stats().failed, 0u) << p.stats().last_error;
}

// A periodic drain that will take a kept version pins only the kept ones while the ranks
// gather their offers: pinning the newest too held a third slot until the slowest rank had
// offered, and the save in between skipped (bench/memory, rs over 6 ranks on 2 vCPUs: "step
// 80 pinned; step 78 pinned kept; step 75 pinned kept").
TEST(Persist, APeriodicOfferPinsOnlyTheKeptVersionsItWillTake) {
  OneRankDrain d("offer", 3, 3);
  ASSERT_TRUE(d.tier);
  // The job keeps steps 1 and 2 (the agreed one, the one being made redundant): step 3's
  // slot takes the next capture.
  d.tier->Keep({1, 2}, {});
  std::vector<int64_t> captured;
  AgreeingSlowly group([&] {
    if (testing::CaptureInto(*d.tier, 4)) captured.push_back(4);
  });
  PersisterStats st;
  {
    Persister p(d.pc, d.tier.get(), &group, DefaultFileSystem(), &d.log, [](uint64_t) {});
    for (int64_t t = 1; t <= 3; ++t) p.OnSave(static_cast<uint64_t>(t), t);
    st = AfterFirstRound(p);
  }
  EXPECT_EQ(captured, (std::vector<int64_t>{4})) << "the offer pinned the newest version";
  EXPECT_EQ(st.failed, 0u) << st.last_error;
  EXPECT_EQ(StepDirs(d.pc.job_dir), (std::vector<int64_t>{2}));
}

TEST(Persist, OnlyTheNewestKeepStepsStayAndLeftoversAreCollected) {
  TempDir root("persist");
  Options o = PersistOptions(root, "keep");
  o.keep_on_pfs = 2;
  PersistState s(16);
  FileSystem* fs = DefaultFileSystem();
  auto ck = Checkpointer::Open(o);
  ASSERT_TRUE(ck.ok());
  for (int64_t t = 1; t <= 4; ++t) {
    if (t == 4) {
      // What a killed drain leaves: a step directory without MANIFEST, temporary files.
      ASSERT_TRUE(fs->MakeDirs(JoinPath(JobDir(o), StepDirName(10) + "/data"), 0700).ok());
      ASSERT_TRUE(
          WriteFileAtomic(fs, JoinPath(JobDir(o), StepDirName(10) + "/data/0.bin"), "x").ok());
      ASSERT_TRUE(WriteFileAtomic(fs, JoinPath(JobDir(o), "LATEST.tmp.999"), "7").ok());
    }
    s.Fill(t);
    ASSERT_TRUE((*ck)->save(t, s.Shards(), {{"who", PersistState::Blob(0, t)}}).ok());
    auto r = (*ck)->flush();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, t);
  }
  EXPECT_EQ(StepDirs(JobDir(o)), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(TempFiles(JobDir(o)).empty());
  EXPECT_EQ(*ReadLatest(fs, JobDir(o)), 4);
  EXPECT_EQ((*ck)->stats().persist.persisted, 4u);
}

TEST(Persist, FailedFilesystemCallsNeverLoseTheCommittedStep) {
  // Fail the 1st, 2nd, ... filesystem call of a persist, with EIO, ENOSPC and EROFS (a
  // read-only filesystem), once and persistently: LATEST keeps naming a step that reads
  // back bit-exact, and the next persist after the fault clears commits and cleans up.
  PersistState s(16);
  int cases = 0;
  for (int err : {EIO, ENOSPC, EROFS}) {
    for (bool persistent : {false, true}) {
      for (uint64_t nth = 1;; ++nth) {
        SCOPED_TRACE("errno " + std::to_string(err) + (persistent ? " persistent" : " once") +
                     ", call " + std::to_string(nth));
        TempDir root("pfsfault");
        FaultInjectionFileSystem fault(DefaultFileSystem());
        Options o = PersistOptions(root, "fault");
        FileSystem* fs = DefaultFileSystem();
        const std::string job = JobDir(o);
        auto ck = OpenCheckpointer(o, {nullptr, &fault});
        ASSERT_TRUE(ck.ok());
        Checkpointer& c = **ck;
        auto save = [&](int64_t t) {
          s.Fill(t);
          ASSERT_TRUE(c.save(t, s.Shards(), {{"who", PersistState::Blob(0, t)}}).ok());
          ASSERT_TRUE(c.fence().ok());
        };
        save(1);
        ASSERT_TRUE(c.flush().ok());
        save(2);
        fault.FailNth(nth, err, persistent);
        auto r = c.flush();
        const bool hit = fault.failures() > 0;
        fault.Disarm();
        auto latest = ReadLatest(fs, job);
        ASSERT_TRUE(latest.ok()) << latest.status().ToString();
        if (r.ok()) {
          EXPECT_EQ(*latest, 2);
        } else {
          ++cases;
          // Only when LATEST was renamed but its directory fsync failed and LATEST could
          // not be put back may it name the (complete, verified) new step.
          if (*latest == 2)
            EXPECT_NE(r.status().message().find("LATEST names step 2"), std::string::npos)
                << r.status().message();
          else
            EXPECT_EQ(*latest, 1) << r.status().ToString();
          EXPECT_NE(r.status().message().find("step 2"), std::string::npos) << r.status().message();
          // ... and the file or directory whose call failed (under the job's directory).
          EXPECT_NE(r.status().message().find(job), std::string::npos) << r.status().message();
          Stats st = c.stats();
          EXPECT_EQ(st.persist.failed, 1u);
          EXPECT_FALSE(st.persist.last_error.empty());
          if (!persistent) {
            EXPECT_TRUE(TempFiles(job).empty());
          }
        }
        EXPECT_EQ(s.Check(fs, JoinPath(job, StepDirName(*latest)), *latest, 0), "");
        // The fault is gone: the next persist commits and collects what the failure left.
        save(3);
        auto again = c.flush();
        ASSERT_TRUE(again.ok()) << again.status().ToString();
        EXPECT_EQ(*ReadLatest(fs, job), 3);
        EXPECT_EQ(s.Check(fs, JoinPath(job, StepDirName(3)), 3, 0), "");
        EXPECT_TRUE(TempFiles(job).empty());
        for (int64_t d : StepDirs(job))
          EXPECT_TRUE(fs->Exists(JoinPath(JoinPath(job, StepDirName(d)), "MANIFEST"))) << d;
        if (!hit) break;  // the persist made fewer than `nth` calls: every call was tried
      }
    }
  }
  EXPECT_GT(cases, 30);
  std::printf("%d failing cases (each call of a persist x EIO, ENOSPC, EROFS x once, for good)\n",
              cases);
}

TEST(Persist, PowerLossAtAnyPointLeavesLatestOnACompleteStep) {
  // The machine stops at the 1st, 2nd, ... filesystem call of a persist, then everything not
  // made durable by an fsync (file data, renames and creations in unsynced directories) is
  // lost. LATEST must name step 1 or 2, and that step must read back bit-exact; after the
  // restart the next persist commits.
  PersistState s(16);
  int crashes = 0;
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("power lost at mutating call " + std::to_string(n));
    TempDir root("pfspower");
    testing::PowerLossFileSystem power(DefaultFileSystem());
    Options o = PersistOptions(root, "power");
    FileSystem* fs = DefaultFileSystem();
    const std::string job = JobDir(o);
    bool crashed = false;
    {
      auto ck = OpenCheckpointer(o, {nullptr, &power});
      ASSERT_TRUE(ck.ok()) << ck.status().ToString();
      Checkpointer& c = **ck;
      for (int64_t t : {1, 2}) {
        s.Fill(t);
        ASSERT_TRUE(c.save(t, s.Shards(), {{"who", PersistState::Blob(0, t)}}).ok());
        ASSERT_TRUE(c.fence().ok());
        if (t == 1) {
          ASSERT_TRUE(c.flush().ok());
          power.CrashAfter(n);
        }
      }
      (void)c.flush();
      crashed = power.crashed();
    }  // the process dies with the machine
    power.DropUnsyncedData();
    auto latest = ReadLatest(fs, job);
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    if (crashed)
      EXPECT_TRUE(*latest == 1 || *latest == 2) << *latest;
    else
      EXPECT_EQ(*latest, 2);
    EXPECT_EQ(s.Check(fs, JoinPath(job, StepDirName(*latest)), *latest, 0), "");
    {
      auto ck = Checkpointer::Open(o);  // power is back
      ASSERT_TRUE(ck.ok()) << ck.status().ToString();
      s.Fill(3);
      ASSERT_TRUE((*ck)->save(3, s.Shards(), {{"who", PersistState::Blob(0, 3)}}).ok());
      auto again = (*ck)->flush();
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_EQ(*ReadLatest(fs, job), 3);
      EXPECT_EQ(s.Check(fs, JoinPath(job, StepDirName(3)), 3, 0), "");
    }
    if (!crashed) break;  // the persist made fewer than n calls: every point was tried
    ++crashes;
  }
  std::printf("power lost at %d different points of a persist\n", crashes);
  EXPECT_GT(crashes, 10);
}

TEST(Persist, TrainingGoesOnWhileThePfsIsStuck) {
  TempDir root("persist");
  testing::StuckFileSystem stuck(DefaultFileSystem());
  Options o = PersistOptions(root, "stuck");
  o.persist_every = 1;
  PersistState s(16);
  auto ck = OpenCheckpointer(o, {nullptr, &stuck});
  ASSERT_TRUE(ck.ok());
  Checkpointer& c = **ck;
  s.Fill(1);
  ASSERT_TRUE(c.save(1, s.Shards(), {{"who", PersistState::Blob(0, 1)}}).ok());
  ASSERT_TRUE(c.fence().ok());
  while (!stuck.entered()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The persist of step 1 is stuck inside a write; training saves and fences on (versions
  // may be skipped while the persisted one is pinned, never stalled).
  int queued = 0;
  for (int64_t t = 2; t <= 30; ++t) {
    s.Fill(t);
    auto out = c.save(t, s.Shards(), {{"who", PersistState::Blob(0, t)}});
    ASSERT_TRUE(out.ok());
    queued += *out == SaveOutcome::kQueued;
    ASSERT_TRUE(c.fence().ok());
  }
  EXPECT_GT(queued, 10);
  EXPECT_EQ(c.stats().persist.persisted, 0u);
  stuck.Release();
  ASSERT_TRUE(c.wait_captured().ok());
  const int64_t newest = c.versions().front().step;
  auto r = c.flush();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, newest);
  EXPECT_EQ(s.Check(DefaultFileSystem(), JoinPath(JobDir(o), StepDirName(newest)), newest, 0), "");
}

}  // namespace
}  // namespace cairn
