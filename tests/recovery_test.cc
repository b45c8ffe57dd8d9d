// Recovery: the load planner, and restore across layouts, world sizes and replicas.
//
// The property test runs every rank of a job as a thread of this process: the collectives
// go through an in-process Group and the bytes between ranks through an in-process
// transport (the UCX path of the same code is tested by recovery_process_test). Memory
// versions are real slot headers with real chunk checksums over the saved bytes; PFS
// steps are real files written and committed with the persister's own plan, writer and
// commit.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/arith.h"
#include "core/box_copy.h"
#include "core/checksum.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "layout/layout_template.h"
#include "layout/load_planner.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/writer.h"
#include "recovery/restore.h"
#include "recovery/restore_wire.h"
#include "snapshot/copy_engine.h"
#include "testing/in_process_job.h"
#include "tests/test_util.h"
#include "wire/codec.h"

namespace cairn {
namespace {

using testing::InProcessJob;
using testing::MailTransport;
using testing::SavedVersion;
using testing::ThreadGroup;
using testing::VecMemory;

// ---- random tensors and layouts -------------------------------------------------------------

struct Tensor {
  TensorMeta meta;
  std::vector<std::byte> bytes;  // the global tensor, row-major
};

// The boxes each of `world` ranks holds of tensor `t` under a random layout.
std::vector<std::vector<Box>> RandomLayout(std::mt19937_64& rng, const Shape& shape, int world) {
  std::vector<std::vector<Box>> out(static_cast<size_t>(world));
  const int64_t n = NumElements(shape);
  switch (rng() % 4) {
    case 0:  // replicated on every rank
      for (auto& l : out) l.push_back(Box::Whole(shape));
      break;
    case 1: {  // split along one dim into k parts; ranks r and r+k hold the same part
      if (shape.empty()) {
        for (auto& l : out) l.push_back(Box::Whole(shape));
        break;
      }
      const size_t d = rng() % shape.size();
      const int64_t k = std::min<int64_t>(shape[d], 1 + static_cast<int64_t>(rng() % world));
      for (int r = 0; r < world; ++r) {
        const int64_t part = r % k;
        Box b = Box::Whole(shape);
        b.offsets[d] = shape[d] * part / k;
        b.lengths[d] = shape[d] * (part + 1) / k - b.offsets[d];
        out[static_cast<size_t>(r)].push_back(b);
      }
      break;
    }
    case 2: {  // two-dimensional grid, a part per rank modulo the grid size
      if (shape.size() < 2) {
        for (auto& l : out) l.push_back(Box::Whole(shape));
        break;
      }
      int64_t a = std::min<int64_t>(shape[0], 1 + static_cast<int64_t>(rng() % 3));
      int64_t b = std::min<int64_t>(shape[1], 1 + static_cast<int64_t>(rng() % 3));
      if (a * b > world) a = b = 1;  // every part held by some rank
      for (int r = 0; r < world; ++r) {
        const int64_t i = (r % (a * b)) / b, j = r % b;
        Box box = Box::Whole(shape);
        box.offsets[0] = shape[0] * i / a;
        box.lengths[0] = shape[0] * (i + 1) / a - box.offsets[0];
        box.offsets[1] = shape[1] * j / b;
        box.lengths[1] = shape[1] * (j + 1) / b - box.offsets[1];
        out[static_cast<size_t>(r)].push_back(box);
      }
      break;
    }
    default: {  // ZeRO-style flat ranges, split at random points
      std::vector<int64_t> cuts = {0, n};
      for (int r = 1; r < world; ++r) cuts.push_back(static_cast<int64_t>(rng() % (n + 1)));
      std::sort(cuts.begin(), cuts.end());
      for (int r = 0; r < world; ++r) {
        auto boxes =
            FlatRangeToBoxes(shape, cuts[static_cast<size_t>(r)], cuts[static_cast<size_t>(r) + 1]);
        if (boxes.ok())
          for (Box& b : *boxes)
            if (!b.empty()) out[static_cast<size_t>(r)].push_back(b);
      }
      break;
    }
  }
  return out;
}

// The boxes each of `world` ranks holds under layout templates (layout/layout_template.h):
// the ranks split into pipeline stages (a random divisor of `world`; tensor i held by the
// ranks of stage i % stages only), every tensor split by a random rule into d parts (d the
// stage's ranks or a divisor of them), a stage's rank r holding part r % d or r / (q / d):
// FSDP, ZeRO-3, DTensor Shard, tensor parallel inside data parallel; and since issue 37
// cuts: a chunk of a chunk, each by a digit of the index (FSDP2 over tensor parallelism),
// or one digit only (the part replicated over the other: a TP-replicated norm).
// *cut_rules counts the tensors split by cuts (their parts > 1). Truncated chunks (the
// remainder held by no rank) only where `held` is given: (*held)[i] is then the box of
// tensor i the ranks hold together (the whole tensor unless truncated).
std::vector<std::vector<std::pair<size_t, Box>>> TemplateLayouts(std::mt19937_64& rng,
                                                                 const std::vector<Tensor>& tensors,
                                                                 int world, int* cut_rules,
                                                                 std::vector<Box>* held = nullptr) {
  auto divisors_of = [](int n, int most) {
    std::vector<int> out;
    for (int d = 1; d <= std::min(n, most); ++d)
      if (n % d == 0) out.push_back(d);
    return out;
  };
  const auto stage_counts = divisors_of(world, static_cast<int>(tensors.size()));
  const int stages = rng() % 2 ? 1 : stage_counts[rng() % stage_counts.size()];
  const int q = world / stages;  // ranks per stage
  const auto divisors = divisors_of(q, q);
  const int d = rng() % 2 ? q : divisors[rng() % divisors.size()];
  const auto factors = divisors_of(d, d);
  const bool blocked = rng() % 2;
  std::vector<std::vector<std::pair<size_t, Box>>> out(static_cast<size_t>(world));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& shape = tensors[i].meta.global_shape;
    using K = SplitRule::Kind;
    using R = SplitRule::Round;
    auto dim = [&] { return static_cast<uint8_t>(rng() % shape.size()); };
    auto round = [&] { return rng() % 2 ? R::kCeil : R::kFloor; };
    const uint8_t dim0 = dim();
    const SplitRule rules[] = {{K::kWhole, R::kCeil, 0},     {K::kFlat, R::kCeil, 0},
                               {K::kFlat, R::kFloor, 0},     {K::kChunk, R::kCeil, dim0},
                               {K::kChunk, R::kFloor, dim0}, {K::kChunk, R::kTrunc, dim0}};
    SplitRule rule = rules[rng() % (std::size(rules) - (held ? 0 : 1))];
    if (held) {
      held->push_back(Box::Whole(shape));
      if (rule.round == R::kTrunc) held->back().lengths[dim0] = shape[dim0] / d * d;
    }
    if (rng() % 2) {
      // Cuts: the lower digit (count a) and the upper one (count d / a), each on a random
      // dimension (the same one twice is a chunk of a chunk along it), both or one of them.
      const uint32_t a = static_cast<uint32_t>(factors[rng() % factors.size()]);
      const SplitRule::Cut lower{dim(), round(), 1, a},
          upper{dim(), round(), a, static_cast<uint32_t>(d) / a};
      rule = SplitRule{};
      rule.kind = K::kCuts;
      const uint64_t which = rng() % 3;  // both digits, the upper one only, the lower one only
      if (which != 1) rule.cuts.push_back(lower);
      if (which != 2) rule.cuts.push_back(upper);
      EXPECT_TRUE(CheckCuts(rule, shape.size(), static_cast<uint32_t>(d)).ok()) << rule.ToString();
      *cut_rules += d > 1;
    }
    const int stage = static_cast<int>(i) % stages;
    for (int lr = 0; lr < q; ++lr) {
      const auto index = static_cast<uint32_t>(blocked ? lr / (q / d) : lr % d);
      for (Box& b : PartBoxes(shape, rule, index, static_cast<uint32_t>(d)))
        out[static_cast<size_t>(stage * q + lr)].push_back({i, std::move(b)});
    }
  }
  return out;
}

std::vector<std::byte> Extract(const Tensor& t, const Box& box) {
  const size_t elem = DTypeSize(t.meta.dtype);
  std::vector<std::byte> out(static_cast<size_t>(box.numel()) * elem);
  CopyBoxRegion(t.bytes.data(), Box::Whole(t.meta.global_shape), out.data(), box, box, elem);
  return out;
}

SavedVersion MakeVersion(const std::vector<Tensor>& tensors,
                         const std::vector<std::pair<size_t, Box>>& shards, int rank, int world,
                         int64_t step, uint64_t chunk) {
  SavedVersion v;
  SlotHeader& h = v.header;
  h.state = VersionState::kCaptured;
  h.step = step;
  h.rank = static_cast<uint32_t>(rank);
  h.world_size = static_cast<uint32_t>(world);
  h.chunk_bytes = chunk;
  for (const auto& [ti, box] : shards) {
    const Tensor& t = tensors[ti];
    auto bytes = Extract(t, box);
    SlotShard s;
    s.name = t.meta.name;
    s.dtype = t.meta.dtype;
    s.global_shape = t.meta.global_shape;
    s.box = box;
    s.offset = (v.data.size() + 63) / 64 * 64;
    s.nbytes = bytes.size();
    s.first_chunk = static_cast<uint32_t>(h.chunk_checksums.size());
    s.num_chunks = static_cast<uint32_t>(CeilDiv(s.nbytes, chunk));
    v.data.resize(s.offset);
    v.data.insert(v.data.end(), bytes.begin(), bytes.end());
    for (uint32_t c = 0; c < s.num_chunks; ++c) {
      const uint64_t lo = c * chunk, hi = std::min(s.nbytes, lo + chunk);
      h.chunk_checksums.push_back(Checksum(bytes.data() + lo, hi - lo));
    }
    h.shards.push_back(std::move(s));
  }
  const std::string blob = "rank " + std::to_string(rank) + " step " + std::to_string(step);
  SlotBlob b{"who", v.data.size(), blob.size(), Checksum(blob.data(), blob.size())};
  v.data.insert(v.data.end(), reinterpret_cast<const std::byte*>(blob.data()),
                reinterpret_cast<const std::byte*>(blob.data() + blob.size()));
  h.blobs.push_back(b);
  h.data_bytes = v.data.size();
  v.path = "memory of rank " + std::to_string(rank) + " step " + std::to_string(step);
  return v;
}

// Writes `step` of `tensors` saved under `saved` (one layout per rank) to the PFS under
// `job_dir` the way the persister does: the save plan (slabs cut small), one data file per
// writer with real chunk checksums, the MANIFEST and LATEST committed.
void WritePfsStep(const std::string& job_dir, int64_t step, const std::vector<Tensor>& tensors,
                  const std::vector<std::vector<std::pair<size_t, Box>>>& saved, uint64_t chunk) {
  std::vector<std::string> layouts;
  for (const auto& boxes : saved) {
    RankLayout l;
    std::map<size_t, uint32_t> ids;
    for (const auto& [ti, box] : boxes) {
      auto [it, fresh] = ids.emplace(ti, static_cast<uint32_t>(l.tensors.size()));
      if (fresh) l.tensors.push_back(tensors[ti].meta);
      l.shards.push_back({it->second, box});
    }
    layouts.push_back(EncodeRankLayout(l));
  }
  PlannerConfig pc;
  pc.min_piece_bytes = 64;  // slabs even of these small tensors
  pc.align_bytes = chunk;
  auto plan = MakeSavePlan(layouts, pc);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < tensors.size(); ++i) by_name[tensors[i].meta.name] = i;
  FileSystem* fs = DefaultFileSystem();
  const std::string step_dir = JoinPath(job_dir, StepDirName(step));
  ASSERT_TRUE(fs->MakeDirs(JoinPath(step_dir, "data"), 0700).ok());
  std::vector<LocationTable> tables(saved.size());
  for (size_t w = 0; w < saved.size(); ++w) {
    std::vector<std::vector<std::byte>> bytes;
    std::vector<WriteItem> items;
    for (size_t pi : plan->PiecesOf(static_cast<int>(w))) {
      const PlannedPiece& pc2 = plan->pieces[pi];
      const TensorMeta& meta = plan->tensors[plan->shards[pc2.shard].tensor];
      bytes.push_back(Extract(tensors[by_name.at(meta.name)], pc2.box));
      items.push_back({bytes.back().data(), bytes.back().size(), 0});
    }
    const std::string blob = "rank " + std::to_string(w) + " step " + std::to_string(step);
    items.push_back({reinterpret_cast<const std::byte*>(blob.data()), blob.size(), 0});
    LayOutItems(items, kPfsAlign);
    WriterOptions wo;
    wo.chunk_bytes = chunk;
    auto rep = WriteDataFile(fs, JoinPath(step_dir, DataFileName(static_cast<int>(w))), items, wo,
                             nullptr, nullptr);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    for (size_t i = 0; i + 1 < items.size(); ++i)
      tables[w].pieces.push_back({items[i].file_offset, rep->chunk_checksums[i]});
    tables[w].blobs.push_back(
        {"who", items.back().file_offset, blob.size(), Checksum(blob.data(), blob.size())});
  }
  auto m = BuildManifest(*plan, tables, "test", step, chunk);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  bool left = false;
  ASSERT_TRUE(CommitStep(fs, job_dir, step, *m, &left).ok());
}

struct RankResult {
  Result<RestoreReport> report = Status::Internal("not run");
  std::vector<std::vector<std::byte>> targets;
};

// A rank's Group that counts the bytes it contributes to the collectives.
class CountingGroup final : public Group {
 public:
  CountingGroup(InProcessJob* job, int rank, uint64_t* sent) : g_(job, rank), sent_(sent) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  Status Barrier() override { return g_.Barrier(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    if (sent_) *sent_ += mine.size();
    return g_.AllGather(mine);
  }
  Result<std::string> Broadcast(int root, std::string_view data) override {
    if (sent_ && root == g_.rank()) *sent_ += data.size();
    return g_.Broadcast(root, data);
  }

 private:
  ThreadGroup g_;
  uint64_t* sent_;
};

// Restores on `world` threads; ranks[r] holds memory[r]; targets[r] are (tensor, box).
// `sent`: per rank, the bytes it contributed to the collectives.
std::vector<RankResult> RunRestore(int world, const std::vector<Tensor>& tensors,
                                   std::vector<VecMemory>& memory,
                                   const std::vector<std::vector<std::pair<size_t, Box>>>& targets,
                                   const RestoreOptions& options,
                                   const std::string& pfs_job_dir = "",
                                   std::vector<uint64_t>* sent = nullptr) {
  InProcessJob job(world);
  std::vector<RankResult> out(static_cast<size_t>(world));
  if (sent) sent->assign(static_cast<size_t>(world), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      CountingGroup g(&job, r, sent ? &(*sent)[static_cast<size_t>(r)] : nullptr);
      MailTransport tr(&job, r);
      auto engine = MakeHostCopyEngine(1);
      Logger log("rank " + std::to_string(r), LogLevel::kError);
      RankResult& res = out[static_cast<size_t>(r)];
      std::vector<ShardSpec> specs;
      for (const auto& [ti, box] : targets[static_cast<size_t>(r)]) {
        const Tensor& t = tensors[ti];
        res.targets.emplace_back(static_cast<size_t>(box.numel()) * DTypeSize(t.meta.dtype),
                                 std::byte{0xcd});
      }
      for (size_t i = 0; i < res.targets.size(); ++i) {
        ShardSpec s;
        s.meta = tensors[targets[static_cast<size_t>(r)][i].first].meta;
        s.box = targets[static_cast<size_t>(r)][i].second;
        s.data = res.targets[i].data();
        specs.push_back(s);
      }
      RestoreEnv env;
      env.rank = r;
      env.group = &g;
      env.transport = &tr;
      env.memory = &memory[static_cast<size_t>(r)];
      env.pfs_fs = DefaultFileSystem();
      env.pfs_job_dir = pfs_job_dir;
      env.read_threads = 1 + r % 3;
      env.engine = engine.get();
      env.log = &log;
      env.who = "rank " + std::to_string(r);
      env.timeout_s = 30;
      res.report = Restore(env, specs, options);
    });
  for (auto& t : threads) t.join();
  return out;
}

TEST(Recovery, PropertyRandomLayoutsRestoreBitExactFromMemoryReplicasAndThePfs) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const DType dtypes[] = {DType::kF64, DType::kF32, DType::kBF16,  DType::kI64,
                          DType::kI16, DType::kU8,  DType::kF8E4M3};
  int resharded = 0, with_peers = 0, fallbacks = 0, pfs_cases = 0, alone = 0, alone_with_peers = 0,
      cut_rules = 0, alone_with_cuts = 0, truncated = 0, alone_truncated = 0;
  constexpr int kCases = 220;
  for (int c = 0; c < kCases; ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    // Tensors.
    std::vector<Tensor> tensors(1 + rng() % 4);
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor& t = tensors[i];
      t.meta.name = "t" + std::to_string(i);
      t.meta.dtype = dtypes[rng() % std::size(dtypes)];
      const size_t nd = 1 + rng() % 4;
      for (size_t d = 0; d < nd; ++d) t.meta.global_shape.push_back(1 + rng() % (nd > 2 ? 6 : 24));
      t.bytes.resize(static_cast<size_t>(NumElements(t.meta.global_shape)) *
                     DTypeSize(t.meta.dtype));
      for (auto& b : t.bytes) b = static_cast<std::byte>(rng());
    }
    // Saved under one layout, two steps; restored under another on another world size.
    const int saved_world = 1 + static_cast<int>(rng() % 8);
    const int world = 1 + static_cast<int>(rng() % 8);
    const uint64_t chunk = uint64_t{8} << (rng() % 8);
    std::vector<std::vector<std::pair<size_t, Box>>> saved(static_cast<size_t>(saved_world)),
        wanted(static_cast<size_t>(world));
    // Every other case saves and restores layout templates (fully sharded jobs): memory
    // restores of those are planned by each rank alone (layout/memory_plan.h).
    const bool templates = c % 2 == 1;
    const int cut_rules_before = cut_rules;
    bool dropped = false;  // the saving job held no part of some tensor's last rows
    if (templates) {
      std::vector<Box> held;
      saved = TemplateLayouts(rng, tensors, saved_world, &cut_rules, &held);
      wanted = TemplateLayouts(rng, tensors, world, &cut_rules);
      // Where the saving job dropped a remainder (truncated chunks), the targets take only
      // what it held.
      for (auto& rank_targets : wanted) {
        std::vector<std::pair<size_t, Box>> kept;
        for (auto& [ti, box] : rank_targets)
          if (auto in = Intersect(box, held[ti])) kept.push_back({ti, *in});
        rank_targets = std::move(kept);
      }
      for (size_t i = 0; i < tensors.size(); ++i)
        dropped = dropped || !(held[i] == Box::Whole(tensors[i].meta.global_shape));
    }
    for (size_t i = 0; i < tensors.size() && !templates; ++i) {
      auto s = RandomLayout(rng, tensors[i].meta.global_shape, saved_world);
      for (int r = 0; r < saved_world; ++r)
        for (Box& b : s[static_cast<size_t>(r)]) saved[static_cast<size_t>(r)].push_back({i, b});
      auto w = RandomLayout(rng, tensors[i].meta.global_shape, world);
      for (int r = 0; r < world; ++r)
        for (Box& b : w[static_cast<size_t>(r)]) wanted[static_cast<size_t>(r)].push_back({i, b});
    }
    // Step 1 of the same tensors with every byte flipped: what a fallback restores.
    std::vector<Tensor> older = tensors;
    for (auto& t : older)
      for (auto& b : t.bytes) b = ~b;
    std::vector<SavedVersion> v1, v2;
    for (int r = 0; r < saved_world; ++r) {
      v1.push_back(MakeVersion(older, saved[static_cast<size_t>(r)], r, saved_world, 1, chunk));
      v2.push_back(MakeVersion(tensors, saved[static_cast<size_t>(r)], r, saved_world, 2, chunk));
    }
    // A third of the cases keep step 2 only on the PFS (step 1 stays in memory): restored
    // from the PFS, each byte read once by the job; a damaged byte there falls back to
    // step 1 in memory.
    const bool on_pfs = rng() % 3 == 0;
    std::unique_ptr<testing::TempDir> pfs;
    std::string job_dir;
    if (on_pfs) {
      pfs = std::make_unique<testing::TempDir>("recpfs");
      job_dir = JoinPath(pfs->path(), "job");
      WritePfsStep(job_dir, 2, tensors, saved, chunk);
      ++pfs_cases;
    }
    // Who holds what: every saved rank's versions on 1-3 random restoring ranks (its own
    // host tier when it restores too, plus replicas).
    std::vector<VecMemory> memory(static_cast<size_t>(world));
    for (int s = 0; s < saved_world; ++s) {
      std::vector<int> holders;
      if (s < world) holders.push_back(s);
      const int extra = static_cast<int>(rng() % 3) + (holders.empty() ? 1 : 0);
      for (int k = 0; k < extra; ++k) holders.push_back(static_cast<int>(rng() % world));
      std::sort(holders.begin(), holders.end());
      holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
      for (int h : holders) {
        memory[static_cast<size_t>(h)].held.push_back(&v1[static_cast<size_t>(s)]);
        if (!on_pfs) memory[static_cast<size_t>(h)].held.push_back(&v2[static_cast<size_t>(s)]);
      }
    }
    // Sometimes step 2 of one rank is damaged (in the copy every holder reads). If a target
    // needs the damaged chunk, every rank falls back to step 1; if none does, step 2 is
    // restored and must still be exact.
    bool damaged = false;
    if (on_pfs && rng() % 6 == 0) {
      // A byte of a random saved box in its data file.
      auto m = ReadManifest(DefaultFileSystem(), JoinPath(job_dir, StepDirName(2)));
      ASSERT_TRUE(m.ok());
      if (m->boxes_size() > 0) {
        const auto& b = m->boxes(static_cast<int>(rng() % static_cast<uint64_t>(m->boxes_size())));
        if (b.length() > 0) {
          testing::CorruptByte(
              JoinPath(JoinPath(job_dir, StepDirName(2)), m->files(static_cast<int>(b.file()))),
              b.offset() + rng() % b.length());
          damaged = true;
        }
      }
    } else if (!on_pfs && rng() % 8 == 0) {
      const size_t s = rng() % static_cast<size_t>(saved_world);
      SavedVersion& v = v2[s];
      if (!v.header.shards.empty() && v.header.shards[0].nbytes > 0) {
        v.data[v.header.shards[0].offset + rng() % v.header.shards[0].nbytes] ^= std::byte{1};
        damaged = true;
      }
    }
    RestoreOptions opts;
    opts.partial = true;  // a random layout may leave a tensor to no rank of the target
    auto results = RunRestore(world, tensors, memory, wanted, opts, job_dir);
    const int with_peers_before = with_peers;
    const int64_t expect_step = results[0].report.ok() && results[0].report->step == 1 ? 1 : 2;
    const std::vector<Tensor>* expect = expect_step == 1 ? &older : &tensors;
    for (int r = 0; r < world; ++r) {
      const RankResult& res = results[static_cast<size_t>(r)];
      ASSERT_TRUE(res.report.ok()) << "rank " << r << ": " << res.report.status().ToString();
      ASSERT_EQ(res.report->step, expect_step);
      if (expect_step == 1) {
        ASSERT_TRUE(damaged);
        ASSERT_EQ(res.report->skipped.size(), 1u);
        EXPECT_NE(res.report->skipped[0].find("checksum mismatch"), std::string::npos);
        fallbacks += r == 0;
      }
      for (size_t i = 0; i < res.targets.size(); ++i) {
        const auto& [ti, box] = wanted[static_cast<size_t>(r)][i];
        ASSERT_EQ(res.targets[i], Extract((*expect)[ti], box))
            << "rank " << r << " tensor " << tensors[ti].meta.name << " box " << box.ToString();
      }
      // Its own blobs, or where the saved job had no rank of this number (it grew), rank 0's.
      const int owner = r < saved_world ? r : 0;
      ASSERT_EQ(res.report->blobs_rank, owner) << "rank " << r;
      ASSERT_EQ(res.report->blobs.at("who"),
                "rank " + std::to_string(owner) + " step " + std::to_string(expect_step));
      resharded += res.report->resharded;
      with_peers += res.report->bytes_received > 0;
      if (on_pfs && expect_step == 2) {
        EXPECT_TRUE(res.report->plan.starts_with("general")) << res.report->plan;  // format 1
      }
      // Every rank plans alike: alone, or all from the job-wide catalog.
      EXPECT_EQ(res.report->plan, results[0].report->plan);
      if (on_pfs && expect_step == 2) {
        ASSERT_EQ(res.report->tier, "pfs");
        // Every byte some target needs read once by the job, in whole checksum chunks.
        ASSERT_GE(res.report->job_pfs_bytes_read, res.report->job_unique_bytes_needed);
        ASSERT_LE(res.report->job_pfs_bytes_read,
                  res.report->job_unique_bytes_needed + 2 * chunk * 64 * tensors.size());
      }
    }
    if (!on_pfs && results[0].report->plan.starts_with("templated")) {
      ++alone;
      alone_with_peers += with_peers > with_peers_before;
      alone_with_cuts += cut_rules > cut_rules_before;
      alone_truncated += dropped;
    }
    truncated += dropped;
  }
  std::printf(
      "%d cases (%d from the PFS): %d rank restores resharded, %d received from peers, "
      "%d fell back; %d memory cases planned alone from templates (%d with peers, %d with "
      "cuts; %d tensors split by cuts in all); %d saved with a remainder held by no rank (%d "
      "planned alone)\n",
      kCases, pfs_cases, resharded, with_peers, fallbacks, alone, alone_with_peers, alone_with_cuts,
      cut_rules, truncated, alone_truncated);
  // The cases really exercised what they claim to.
  EXPECT_GT(resharded, kCases / 2);
  EXPECT_GT(with_peers, kCases / 2);
  EXPECT_GT(fallbacks, 0);
  EXPECT_GT(pfs_cases, kCases / 5);
  EXPECT_GT(alone, kCases / 5);
  EXPECT_GT(alone_with_peers, kCases / 10);
  EXPECT_GT(alone_with_cuts, kCases / 20);
  EXPECT_GT(truncated, kCases / 40);
}

TEST(Recovery, ErrorsNameTheTensorStepAndRankBeforeWritingAnyTarget) {
  std::vector<Tensor> tensors(1);
  tensors[0].meta = {"layers.0.w", DType::kF32, {8, 4}};
  tensors[0].bytes.assign(8 * 4 * 4, std::byte{7});
  SavedVersion v = MakeVersion(tensors, {{0, Box{{0, 0}, {4, 4}}}}, 0, 1, 3, 64);
  std::vector<VecMemory> memory(1);
  memory[0].held.push_back(&v);
  // Asks for rows 4..8, which nobody saved.
  auto res = RunRestore(1, tensors, memory, {{{0, Box{{4, 0}, {4, 4}}}}}, {});
  ASSERT_FALSE(res[0].report.ok());
  const std::string m = res[0].report.status().message();
  EXPECT_NE(m.find("layers.0.w"), std::string::npos) << m;
  EXPECT_NE(m.find("step 3"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("[0:4, 0:4]"), std::string::npos) << m;
  for (std::byte b : res[0].targets[0]) ASSERT_EQ(b, std::byte{0xcd});
  // A dtype mismatch.
  std::vector<Tensor> other = tensors;
  other[0].meta.dtype = DType::kI32;
  res = RunRestore(1, other, memory, {{{0, Box{{0, 0}, {4, 4}}}}}, {});
  ASSERT_FALSE(res[0].report.ok());
  EXPECT_NE(res[0].report.status().message().find("int32"), std::string::npos)
      << res[0].report.status().message();
  // A saved tensor nobody asks for, without RestoreOptions::partial.
  tensors.push_back(tensors[0]);
  tensors[1].meta.name = "layers.0.extra";
  SavedVersion v2 =
      MakeVersion(tensors, {{0, Box{{0, 0}, {8, 4}}}, {1, Box{{0, 0}, {8, 4}}}}, 0, 1, 4, 64);
  memory[0].held = {&v2};
  res = RunRestore(1, tensors, memory, {{{0, Box{{0, 0}, {8, 4}}}}}, {});
  ASSERT_FALSE(res[0].report.ok());
  EXPECT_NE(res[0].report.status().message().find("layers.0.extra"), std::string::npos);
  RestoreOptions partial;
  partial.partial = true;
  res = RunRestore(1, tensors, memory, {{{0, Box{{0, 0}, {8, 4}}}}}, partial);
  ASSERT_TRUE(res[0].report.ok()) << res[0].report.status().ToString();
}

// A memory restore planned from templates checks that every saved tensor is some rank's
// target from the targets' templates, which every rank has: its last gather carries each
// rank's status, not a bit per saved tensor from every rank (12.5 MB into every rank of a
// job of 10,000 ranks and 10,000 tensors). A tensor no rank asks for is still an error
// naming it.
TEST(Recovery, ATemplatedMemoryRestoreKnowsEveryTensorIsTargetedWithoutABitPerTensorPerRank) {
  constexpr int kWorld = 4, kTensors = 4000;
  std::vector<Tensor> tensors(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    tensors[static_cast<size_t>(i)].meta = {
        "layers." + std::to_string(i) + ".w", DType::kF32, {8, 4}};
    auto& b = tensors[static_cast<size_t>(i)].bytes;
    b.resize(8 * 4 * 4);
    for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<std::byte>(k * 31 + i);
  }
  // Fully sharded: rank r holds rows [2r, 2r + 2) of every tensor.
  std::vector<std::vector<std::pair<size_t, Box>>> shards(kWorld);
  for (int r = 0; r < kWorld; ++r)
    for (size_t t = 0; t < tensors.size(); ++t)
      shards[static_cast<size_t>(r)].push_back({t, Box{{2 * r, 0}, {2, 4}}});
  std::vector<SavedVersion> versions;
  for (int r = 0; r < kWorld; ++r)
    versions.push_back(MakeVersion(tensors, shards[static_cast<size_t>(r)], r, kWorld, 5, 64));
  std::vector<VecMemory> memory(kWorld);
  for (int r = 0; r < kWorld; ++r) memory[static_cast<size_t>(r)].held.push_back(&versions[r]);
  std::vector<uint64_t> sent;
  auto res = RunRestore(kWorld, tensors, memory, shards, {}, "", &sent);
  for (int r = 0; r < kWorld; ++r) {
    const RankResult& x = res[static_cast<size_t>(r)];
    ASSERT_TRUE(x.report.ok()) << x.report.status().ToString();
    EXPECT_TRUE(x.report->plan.starts_with("templated")) << x.report->plan;
    for (size_t i = 0; i < x.targets.size(); ++i)
      ASSERT_EQ(x.targets[i], Extract(tensors[i], shards[static_cast<size_t>(r)][i].second))
          << "rank " << r << " tensor " << i;
  }
  // Rank 0 sends the one template; the others their inventories, references and statuses.
  for (int r = 1; r < kWorld; ++r)
    EXPECT_LT(sent[static_cast<size_t>(r)], kTensors / 8) << "rank " << r;
  // No rank asks for the last tensor.
  auto fewer = shards;
  for (auto& s : fewer) s.pop_back();
  res = RunRestore(kWorld, tensors, memory, fewer, {});
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(res[static_cast<size_t>(r)].report.ok()) << "rank " << r;
    const std::string m = res[static_cast<size_t>(r)].report.status().message();
    EXPECT_NE(m.find("'layers." + std::to_string(kTensors - 1) + ".w'"), std::string::npos) << m;
    EXPECT_NE(m.find("in no rank's targets"), std::string::npos) << m;
  }
  RestoreOptions partial;
  partial.partial = true;
  res = RunRestore(kWorld, tensors, memory, fewer, partial);
  for (int r = 0; r < kWorld; ++r)
    ASSERT_TRUE(res[static_cast<size_t>(r)].report.ok())
        << res[static_cast<size_t>(r)].report.status().ToString();
}

// ---- the planner alone ------------------------------------------------------------------------

TEST(LoadPlanner, DataParallelReplicasReadEveryPfsByteOnceAndSpreadTheReads) {
  // 8 ranks, 2-way split of a [1024, 256] f32 tensor, 4 data-parallel replicas each; saved
  // on the PFS in 16 slabs of 64 rows.
  LoadCatalog cat;
  cat.step = 7;
  cat.chunk_bytes = 64 << 10;
  cat.from_pfs = true;
  cat.where = "test";
  cat.tensors.push_back({"w", DType::kF32, {1024, 256}});
  for (int i = 0; i < 16; ++i)
    cat.pieces.push_back({0, Box{{64 * i, 0}, {64, 256}}, 64 * 256 * 4, {}, i});
  LoadTargets t;
  for (int part = 0; part < 2; ++part) {
    RankLayout l;
    l.tensors.push_back(cat.tensors[0]);
    l.shards.push_back({0, Box{{512 * part, 0}, {512, 256}}});
    t.classes.push_back(l);
  }
  for (int r = 0; r < 8; ++r) t.class_of_rank.push_back(static_cast<uint32_t>(r % 2));
  auto plan = MakeLoadPlan(cat, t);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->pfs_bytes_to_read, plan->unique_bytes_needed);
  EXPECT_EQ(plan->unique_bytes_needed, 1024u * 256 * 4);
  std::map<int, uint64_t> read_by;
  uint64_t received = 0;
  for (int r = 0; r < 8; ++r) {
    RankLoad l = ForRank(*plan, cat, r);
    for (uint32_t run : l.my_runs) read_by[r] += plan->runs[run].hi - plan->runs[run].lo;
    for (const auto& g : l.gets)
      if (g.how == RankLoad::How::kRecv)
        received += plan->spans[g.span].hi - plan->spans[g.span].lo;
  }
  EXPECT_EQ(read_by.size(), 8u);  // all ranks share the reading: 2 slabs each
  for (auto [r, n] : read_by) EXPECT_EQ(n, 2u * 64 * 256 * 4) << "rank " << r;
  EXPECT_EQ(received, 3u * 1024 * 256 * 4);  // each half to its 3 other replicas
}

TEST(LoadPlanner, ReadsOnlyTheChunksATargetOverlaps) {
  LoadCatalog cat;
  cat.step = 1;
  cat.chunk_bytes = 4096;
  cat.from_pfs = true;
  cat.where = "test";
  cat.tensors.push_back({"w", DType::kU8, {1 << 20}});
  cat.pieces.push_back({0, Box{{0}, {1 << 20}}, 1 << 20, {}, 0});
  LoadTargets t;
  RankLayout l;
  l.tensors.push_back(cat.tensors[0]);
  l.shards.push_back({0, Box{{5000}, {3000}}});  // bytes 5000..8000: chunks 1 (4096..8192)
  t.classes.push_back(l);
  t.class_of_rank = {0};
  auto plan = MakeLoadPlan(cat, t);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->runs.size(), 1u);
  EXPECT_EQ(plan->runs[0].lo, 4096u);
  EXPECT_EQ(plan->runs[0].hi, 8192u);
  EXPECT_EQ(plan->unique_bytes_needed, 3000u);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

// A peer's shard table (as Restore exchanges them) with one field changed by `mutate`.
std::string ShardTable(const std::function<void(int32_t&, uint8_t&, std::vector<int64_t>&,
                                                uint64_t&)>& mutate = nullptr) {
  int32_t source = 2;
  uint8_t dtype = static_cast<uint8_t>(DType::kF32);
  std::vector<int64_t> shape_and_box = {8, 16, 4, 4, 0, 16};  // shape, then (offset, length)s
  uint64_t nbytes = 4 * 16 * 4;
  if (mutate) mutate(source, dtype, shape_and_box, nbytes);
  wire::CatalogPart part;
  auto* t = part.mutable_tables()->add_tables();
  t->set_source(source);
  t->set_chunk_bytes(1 << 16);
  t->set_blob_bytes(10);
  auto* tensors = t->mutable_tensors();
  tensors->set_names("layers.0.w");
  tensors->add_name_bytes(10);
  tensors->add_dtype(dtype);
  tensors->add_ndim(2);
  tensors->add_dims(shape_and_box[0]);
  tensors->add_dims(shape_and_box[1]);
  for (size_t i = 2; i < 6; i += 2) t->add_boxes(shape_and_box[i]);  // offsets, then lengths
  for (size_t i = 3; i < 6; i += 2) t->add_boxes(shape_and_box[i]);
  t->add_nbytes(nbytes);
  return wire::Encode(part);
}

// Shard tables come from peers: a garbled one is refused before anything is sized from it.
TEST(Recovery, GarbledShardTablesFromPeersAreRefused) {
  EXPECT_TRUE(DecodeRestoreMessageForFuzzing(1, ShardTable(), 4).ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"source past the saved world", ShardTable([](auto& s, auto&, auto&, auto&) { s = 4; })},
      {"huge source", ShardTable([](auto& s, auto&, auto&, auto&) { s = (1 << 24) - 1; })},
      {"unknown dtype", ShardTable([](auto&, auto& d, auto&, auto&) { d = 200; })},
      {"box outside its shape", ShardTable([](auto&, auto&, auto& v, auto&) { v[2] = 6; })},
      {"negative extent", ShardTable([](auto&, auto&, auto& v, auto&) { v[1] = -16; })},
      {"byte count off", ShardTable([](auto&, auto&, auto&, auto& n) { n += 4; })},
      {"truncated", ShardTable().substr(0, 40)},
      {"one bit flipped",
       [] {
         std::string b = ShardTable();
         b[b.size() / 2] ^= 4;
         return b;
       }()},
  };
  for (const auto& [what, bytes] : bad) {
    Status st = DecodeRestoreMessageForFuzzing(1, bytes, 4);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << what << ": " << st.ToString();
  }
  EXPECT_FALSE(DecodeRestoreMessageForFuzzing(0, "short", 4).ok());
}

// The check that every saved tensor is some rank's target gathers, from every rank, the
// saved tensors its targets name: runs of indices where they are consecutive (a pipeline
// stage's: bytes, where a bitmap of 10,000 tensors from each of 10,000 ranks was 12.5 MB
// into every rank), a bitmap where that is shorter; what a peer sent is checked.
TEST(Recovery, TargetedTensorsTravelAsRunsOrABitmapAndGarbledOnesAreRefused) {
  using restore_internal::DecodeTargeted;
  using restore_internal::EncodeTargeted;
  using Runs = std::vector<std::pair<uint32_t, uint32_t>>;
  auto round_trip = [](const std::vector<uint32_t>& ids, uint32_t count) {
    auto runs = DecodeTargeted(EncodeTargeted(ids, count), count, 3);
    EXPECT_TRUE(runs.ok()) << runs.status().ToString();
    return runs.ok() ? *runs : Runs{};
  };
  std::vector<uint32_t> stage;
  for (uint32_t i = 3000; i < 4000; ++i) stage.push_back(i);
  EXPECT_LT(EncodeTargeted(stage, 10000).size(), 24u);
  EXPECT_EQ(round_trip(stage, 10000), (Runs{{3000, 4000}}));
  EXPECT_EQ(round_trip({0, 1, 2, 9, 20, 21, 29}, 30), (Runs{{0, 3}, {9, 10}, {20, 22}, {29, 30}}));
  EXPECT_EQ(round_trip({}, 30), Runs{});
  std::vector<uint32_t> evens;
  for (uint32_t i = 0; i < 10000; i += 2) evens.push_back(i);
  const std::string bitmap = EncodeTargeted(evens, 10000);
  EXPECT_LT(bitmap.size(), 1250u + 32);
  const Runs got = round_trip(evens, 10000);
  ASSERT_EQ(got.size(), 5000u);
  EXPECT_EQ(got[4999], (std::pair<uint32_t, uint32_t>{9998, 9999}));
  // Garbled: an index past the saved tensors, a bitmap of another count, cut short.
  const std::vector<std::pair<std::string, Status>> bad = {
      {"a run past the end", DecodeTargeted(EncodeTargeted({5, 6, 7}, 1000), 7, 3).status()},
      {"a bit past the end", DecodeTargeted(EncodeTargeted({5, 7}, 8), 7, 3).status()},
      {"bitmap size", DecodeTargeted(bitmap, 20000, 3).status()},
      {"cut short", DecodeTargeted(bitmap.substr(0, 100), 10000, 3).status()},
      {"fuzz entry", DecodeRestoreMessageForFuzzing(5, EncodeTargeted({1, 2, 3}, 1000), 2)}};
  for (const auto& [what, st] : bad) {
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find("rank"), std::string::npos) << what << ": " << st.ToString();
  }
}

}  // namespace
}  // namespace cairn
