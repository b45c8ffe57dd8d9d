// Memory restores planned by each rank alone from layout templates (layout/memory_plan.h):
// every rank's part of the plan must be the part the general load planner gives it when it
// plans the whole job from every shard table and target layout — the same gets from the
// same holders, the same fills, the same sends — and two ranks must number the pieces they
// exchange alike (the message tags).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "layout/layout_template.h"
#include "layout/load_planner.h"
#include "layout/memory_plan.h"
#include "layout/templated_plan.h"
#include "tests/plan_check.h"

namespace cairn {
namespace {

using K = SplitRule::Kind;
using R = SplitRule::Round;

// Every tensor of the small model split by `rule` in `parts` (scalars and the tensors in
// `whole` whole).
LayoutTemplate Uniform(SplitRule rule, uint32_t parts, std::set<std::string> whole = {}) {
  return testing::UniformTemplate(testing::SmallModel(), rule, parts, whole);
}

// world ranks, rank r holding part index(r) of `t`.
std::vector<RankLayout> Layouts(const LayoutTemplate& t, int world,
                                uint32_t (*index)(int rank) = nullptr) {
  std::vector<RankLayout> out;
  for (int r = 0; r < world; ++r)
    out.push_back(ExpandTemplate(t, index ? index(r) : static_cast<uint32_t>(r)));
  return out;
}

// The templated plan of `layouts` as a restoring rank rebuilds it (each layout recognised).
TemplatedPlan PlanOf(const std::vector<RankLayout>& layouts) {
  const int world = static_cast<int>(layouts.size());
  std::vector<LayoutTemplate> templates;
  std::map<uint64_t, uint32_t> ids;
  std::vector<uint32_t> rank_template, rank_index;
  std::vector<uint64_t> hashes;
  for (int r = 0; r < world; ++r) {
    auto rec = RecognizeLayout(layouts[static_cast<size_t>(r)], r, world);
    EXPECT_TRUE(rec.has_value()) << "rank " << r << " of " << world;
    if (!rec) return {};
    const uint64_t h = TemplateHash(EncodeTemplate(rec->layout_template));
    auto [it, fresh] = ids.emplace(h, static_cast<uint32_t>(templates.size()));
    if (fresh) templates.push_back(rec->layout_template);
    rank_template.push_back(it->second);
    rank_index.push_back(rec->index);
    hashes.push_back(TemplatedLayoutHash(h, rec->index));
  }
  std::string why;
  auto p = MakeTemplatedPlan(templates, rank_template, rank_index, hashes, nullptr, &why);
  EXPECT_TRUE(p.has_value()) << why;
  return p ? std::move(*p) : TemplatedPlan{};
}

struct Job {
  std::vector<RankLayout> saved;    // per source rank
  std::vector<RankLayout> targets;  // per restoring rank
  std::vector<std::vector<int>> holders;
};

constexpr uint64_t kChunk = 64;

// The general plan: every source's table and every target layout, as Restorer::Catalog
// and Plan make it.
struct General {
  LoadCatalog cat;
  LoadTargets lt;
  LoadPlan plan;
};
General GeneralPlan(const Job& job) {
  General g;
  g.cat.step = 7;
  g.cat.chunk_bytes = kChunk;
  g.cat.where = "host memory";
  std::map<std::string, uint32_t> tids;
  std::map<std::pair<uint32_t, std::string>, uint32_t> pids;
  for (size_t s = 0; s < job.saved.size(); ++s)
    for (const auto& e : job.saved[s].shards) {
      const TensorMeta& m = job.saved[s].tensors[e.tensor];
      auto [t, tf] = tids.emplace(m.name, static_cast<uint32_t>(g.cat.tensors.size()));
      if (tf) g.cat.tensors.push_back(m);
      auto [p, pf] = pids.emplace(std::make_pair(t->second, e.box.ToString()),
                                  static_cast<uint32_t>(g.cat.pieces.size()));
      if (pf)
        g.cat.pieces.push_back(
            {t->second, e.box, static_cast<uint64_t>(e.box.numel()) * DTypeSize(m.dtype), {}});
      auto& h = g.cat.pieces[p->second].holders;
      h.insert(h.end(), job.holders[s].begin(), job.holders[s].end());
    }
  for (LoadPiece& p : g.cat.pieces) {
    std::sort(p.holders.begin(), p.holders.end());
    p.holders.erase(std::unique(p.holders.begin(), p.holders.end()), p.holders.end());
  }
  std::vector<std::string> enc;
  std::vector<uint64_t> hashes;
  for (const RankLayout& l : job.targets) {
    enc.push_back(EncodeRankLayout(l));
    hashes.push_back(LayoutHash(enc.back()));
  }
  auto lt = GroupTargets(enc, hashes);
  EXPECT_TRUE(lt.ok());
  g.lt = std::move(*lt);
  auto plan = MakeLoadPlan(g.cat, g.lt);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (plan.ok()) g.plan = std::move(*plan);
  return g;
}

TemplatedMemoryStep StepOf(const Job& job) {
  TemplatedMemoryStep s;
  s.step = 7;
  s.chunk_bytes = kChunk;
  s.saved = PlanOf(job.saved);
  s.targets = PlanOf(job.targets);
  s.holders = job.holders;
  return s;
}

// A rank's part of a plan in terms that do not depend on piece numbering.
using GetRow = std::tuple<std::string, std::string, int, int, uint64_t, uint64_t>;
using PutRow = std::tuple<int, std::string, std::string, uint64_t, uint64_t>;
using FillRow = std::tuple<uint32_t, std::string, std::string>;
struct Part {
  std::vector<GetRow> gets;    // tensor, box, how, from, lo, hi
  std::vector<PutRow> puts;    // to, tensor, box, lo, hi
  std::vector<FillRow> fills;  // target, region, piece box
  // Per peer, in message number order: (tensor, box, lo, hi) received / sent.
  std::map<int, std::vector<std::tuple<std::string, std::string, uint64_t, uint64_t>>> in, out;
};
Part PartOf(const LoadCatalog& cat, const LoadTargets& lt, const LoadPlan& plan, int rank) {
  Part p;
  const RankLoad load = ForRank(plan, cat, rank);
  auto name = [&](uint32_t s) { return cat.tensors[cat.pieces[plan.spans[s].piece].tensor].name; };
  auto box = [&](uint32_t s) { return cat.pieces[plan.spans[s].piece].box.ToString(); };
  std::map<int, std::map<uint32_t, std::tuple<std::string, std::string, uint64_t, uint64_t>>> in,
      out;
  for (const RankLoad::Get& g : load.gets) {
    const LoadPlan::Span& sp = plan.spans[g.span];
    p.gets.emplace_back(name(g.span), box(g.span), static_cast<int>(g.how), g.from, sp.lo, sp.hi);
    if (g.how == RankLoad::How::kRecv) {
      EXPECT_TRUE(
          in[g.from].emplace(g.seq, std::tuple{name(g.span), box(g.span), sp.lo, sp.hi}).second)
          << "rank " << rank << " numbers two pieces from rank " << g.from << " alike";
    }
  }
  for (const RankLoad::Put& q : load.puts) {
    const LoadPlan::Span& sp = plan.spans[q.span];
    p.puts.emplace_back(q.to, name(q.span), box(q.span), sp.lo, sp.hi);
    EXPECT_TRUE(
        out[q.to].emplace(q.seq, std::tuple{name(q.span), box(q.span), sp.lo, sp.hi}).second)
        << "rank " << rank << " numbers two pieces to rank " << q.to << " alike";
  }
  for (const LoadPlan::Fill& f : plan.fills[lt.class_of_rank[static_cast<size_t>(rank)]])
    p.fills.emplace_back(f.target, f.region.ToString(), box(f.span));
  for (auto& [peer, m] : in) {
    for (auto& [seq, row] : m) {
      EXPECT_EQ(seq, p.in[peer].size()) << "message numbers from rank " << peer << " have a gap";
      p.in[peer].push_back(row);
    }
  }
  for (auto& [peer, m] : out) {
    for (auto& [seq, row] : m) {
      EXPECT_EQ(seq, p.out[peer].size()) << "message numbers to rank " << peer << " have a gap";
      p.out[peer].push_back(row);
    }
  }
  std::sort(p.gets.begin(), p.gets.end());
  std::sort(p.puts.begin(), p.puts.end());
  std::sort(p.fills.begin(), p.fills.end());
  return p;
}

// Every rank's plan alone against its part of the general plan, and the pairs' numbering.
void ExpectSameAsGeneral(const Job& job, const std::string& what) {
  SCOPED_TRACE(what);
  const General g = GeneralPlan(job);
  const TemplatedMemoryStep step = StepOf(job);
  const int world = static_cast<int>(job.targets.size());
  std::vector<Part> alone;
  uint64_t needed = 0;
  for (int r = 0; r < world; ++r) {
    auto mp = PlanMemoryAlone(step, r);
    ASSERT_TRUE(mp.ok()) << "rank " << r << ": " << mp.status().ToString();
    alone.push_back(PartOf(mp->cat, mp->lt, mp->plan, r));
    const Part expected = PartOf(g.cat, g.lt, g.plan, r);
    EXPECT_EQ(alone.back().gets, expected.gets) << "rank " << r;
    EXPECT_EQ(alone.back().puts, expected.puts) << "rank " << r;
    EXPECT_EQ(alone.back().fills, expected.fills) << "rank " << r;
    // A rank's plan holds only what it needs or sends, not the job's pieces.
    EXPECT_LE(mp->cat.pieces.size(), g.cat.pieces.size());
    needed += mp->plan.unique_bytes_needed;
  }
  EXPECT_GE(needed, g.plan.unique_bytes_needed);
  for (int h = 0; h < world; ++h)
    for (const auto& [t, sent] : alone[static_cast<size_t>(h)].out)
      EXPECT_EQ(sent, alone[static_cast<size_t>(t)].in[h])
          << "rank " << h << " sends rank " << t << " other pieces, or in another order, than it "
          << "expects";
}

uint32_t Mod3(int r) {
  return static_cast<uint32_t>(r % 3);
}
uint32_t Mod2(int r) {
  return static_cast<uint32_t>(r % 2);
}

const SplitRule kFlatCeil{K::kFlat, R::kCeil, 0};
const SplitRule kFlatFloor{K::kFlat, R::kFloor, 0};
const SplitRule kChunk0{K::kChunk, R::kFloor, 0};
const SplitRule kChunk1{K::kChunk, R::kCeil, 1};

// Each source held by itself and the rank `shift` further on (ring replicas).
std::vector<std::vector<int>> Ring(int world, int shift) {
  std::vector<std::vector<int>> h(static_cast<size_t>(world));
  for (int s = 0; s < world; ++s) {
    h[static_cast<size_t>(s)] = {s, (s + shift) % world};
    std::sort(h[static_cast<size_t>(s)].begin(), h[static_cast<size_t>(s)].end());
  }
  return h;
}

TEST(MemoryPlanAlone, SameLayoutEveryRankReadsItsOwnMemory) {
  for (int world : {1, 2, 6}) {
    Job job{Layouts(Uniform(kFlatCeil, world), world), Layouts(Uniform(kFlatCeil, world), world),
            Ring(world, 2 % world)};
    ExpectSameAsGeneral(job, "fsdp " + std::to_string(world));
    const TemplatedMemoryStep step = StepOf(job);
    for (int r = 0; r < world; ++r) {
      auto mp = PlanMemoryAlone(step, r);
      ASSERT_TRUE(mp.ok());
      const RankLoad load = ForRank(mp->plan, mp->cat, r);
      EXPECT_TRUE(load.puts.empty());
      for (const RankLoad::Get& g : load.gets) EXPECT_EQ(g.how, RankLoad::How::kLocal);
    }
  }
}

TEST(MemoryPlanAlone, ALostNodeGetsItsBytesFromItsPartnersOnly) {
  // 6 ranks, nodes of 2, each rank's version also on the rank two further on; node 1
  // (ranks 2, 3) lost its memory: only ranks 4 and 5 hold sources 2 and 3.
  Job job{Layouts(Uniform(kFlatFloor, 6), 6), Layouts(Uniform(kFlatFloor, 6), 6), Ring(6, 2)};
  job.holders[2] = {4};
  job.holders[3] = {5};
  job.holders[0] = {0};  // rank 2 held the replica of 0 and 1
  job.holders[1] = {1};
  ExpectSameAsGeneral(job, "lost node");
  const TemplatedMemoryStep step = StepOf(job);
  for (int r = 0; r < 6; ++r) {
    auto mp = PlanMemoryAlone(step, r);
    ASSERT_TRUE(mp.ok());
    const RankLoad load = ForRank(mp->plan, mp->cat, r);
    std::set<int> to;
    for (const auto& p : load.puts) to.insert(p.to);
    EXPECT_EQ(to, r == 4   ? std::set<int>{2}
                  : r == 5 ? std::set<int>{3}
                           : std::set<int>{})
        << "rank " << r;
  }
}

TEST(MemoryPlanAlone, ReshardedOntoOtherLayoutsAndWorlds) {
  // Saved by 6 ranks as flat ranges, held by the 4 ranks restoring (two copies each).
  std::vector<std::vector<int>> held(6);
  for (int s = 0; s < 6; ++s) {
    auto& h = held[static_cast<size_t>(s)];
    h = {s % 4, (s + 1) % 4};
    std::sort(h.begin(), h.end());
  }
  const auto saved = Layouts(Uniform(kFlatCeil, 6), 6);
  ExpectSameAsGeneral({saved, Layouts(Uniform(kFlatFloor, 4), 4), held}, "flat 6 -> flat 4");
  ExpectSameAsGeneral({saved, Layouts(Uniform(kChunk1, 4), 4), held}, "flat 6 -> chunk dim 1");
  // Tensor parallel 2 inside data parallel 2: replicas share a class; "bias" whole, so
  // every rank wants all of it.
  ExpectSameAsGeneral({saved, Layouts(Uniform(kChunk0, 2, {"bias"}), 4, Mod2), held},
                      "flat 6 -> tp2 x dp2");
  // Data parallel: every rank wants every tensor whole, from wherever it is held.
  ExpectSameAsGeneral({saved, Layouts(Uniform(kFlatCeil, 1), 4, [](int) { return 0u; }), held},
                      "flat 6 -> dp 4");
  // And from those onto flat ranges of 6 (every boundary moves).
  std::vector<std::vector<int>> ring6 = Ring(6, 3);
  ExpectSameAsGeneral(
      {Layouts(Uniform(kChunk0, 2, {"bias"}), 6, Mod2), Layouts(Uniform(kFlatCeil, 6), 6), ring6},
      "tp2 x dp3 -> flat 6");
}

TEST(MemoryPlanAlone, Fsdp2OverTensorParallelismPlansAsTheGeneralPlanner) {
  // Saved by 3 x 2 ranks (FSDP2 over TP: parts cut in two dimensions, chunks of chunks,
  // TP-replicated parts each held by 2 ranks), each also held two ranks further on.
  const auto saved = testing::Fsdp2OverTpJob(3, 2);
  ExpectSameAsGeneral({saved, saved, Ring(6, 2)}, "3 x 2 -> the same");
  ExpectSameAsGeneral({saved, testing::Fsdp2OverTpJob(2, 3), Ring(6, 2)}, "3 x 2 -> 2 x 3");
  std::vector<std::vector<int>> lost = Ring(6, 2);
  lost[2] = {4};  // node 1 (ranks 2, 3) lost its memory
  lost[3] = {5};
  lost[0] = {0};
  lost[1] = {1};
  ExpectSameAsGeneral({saved, saved, lost}, "3 x 2, a node lost");
  // Onto one rank of a 1 x 1 mesh (everything) and back onto 4 x 2 ranks.
  std::vector<std::vector<int>> all(6);
  for (std::vector<int>& h : all) h.push_back(0);  // (GCC 14 misreads a {0} fill as out of bounds)
  ExpectSameAsGeneral({saved, testing::Fsdp2OverTpJob(1, 1), all}, "3 x 2 -> 1");
  std::vector<std::vector<int>> onto8(6);
  for (int s = 0; s < 6; ++s) onto8[static_cast<size_t>(s)] = {s, s + 2};
  ExpectSameAsGeneral({saved, testing::Fsdp2OverTpJob(4, 2), onto8}, "3 x 2 -> 4 x 2");
}

TEST(MemoryPlanAlone, ReplicatedPartsAreHeldByEveryReplicasHolders) {
  // HSDP: 2 replicas of a 3-way flat sharding; part i is held by sources i and i + 3 and so
  // by their holders; restored onto 6 flat ranges and onto the same layout.
  const auto saved = Layouts(Uniform(kFlatCeil, 3), 6, Mod3);
  ExpectSameAsGeneral({saved, Layouts(Uniform(kFlatCeil, 6), 6), Ring(6, 1)}, "hsdp -> flat 6");
  ExpectSameAsGeneral({saved, saved, Ring(6, 1)}, "hsdp -> hsdp");
}

TEST(MemoryPlanAlone, TruncatedChunksPlanAsTheGeneralPlanner) {
  // Rows split 4 ways dropping the remainder (embed's 37 rows: 36 held), a node lost, and
  // onto 2 ways (the same 36 rows, in halves); the cube is whole.
  const SplitRule trunc{K::kChunk, R::kTrunc, 0};
  const auto saved = Layouts(Uniform(trunc, 4, {"cube"}), 4);
  Job lost{saved, saved, Ring(4, 2)};
  lost.holders[1] = {3};
  ExpectSameAsGeneral(lost, "trunc 4 -> the same, rank 1's memory lost");
  ExpectSameAsGeneral({saved, Layouts(Uniform(trunc, 2, {"cube"}), 2), {{0}, {1}, {0}, {1}}},
                      "trunc 4 -> trunc 2");
  // A target of embed's last row, which no rank held: an error naming the tensor.
  Job whole{saved, Layouts(Uniform(kFlatCeil, 1), 1, [](int) { return 0u; }), {{0}, {0}, {0}, {0}}};
  auto mp = PlanMemoryAlone(StepOf(whole), 0);
  ASSERT_FALSE(mp.ok());
  EXPECT_NE(mp.status().message().find("'embed'"), std::string::npos) << mp.status().ToString();
  EXPECT_NE(mp.status().message().find("not fully covered"), std::string::npos)
      << mp.status().ToString();
}

TEST(MemoryPlanAlone, ErrorsNameTheTensorAndTheUncoveredBox) {
  Job job{Layouts(Uniform(kFlatCeil, 4), 4), Layouts(Uniform(kFlatCeil, 4), 4), Ring(4, 1)};
  job.holders[2] = {};  // nobody holds source 2 any more
  const TemplatedMemoryStep step = StepOf(job);
  auto mp = PlanMemoryAlone(step, 2);
  ASSERT_FALSE(mp.ok());
  EXPECT_NE(mp.status().message().find("not fully covered"), std::string::npos)
      << mp.status().ToString();
  EXPECT_NE(mp.status().message().find("rank 2"), std::string::npos) << mp.status().ToString();
  // Ranks whose targets do not meet source 2's part plan fine.
  EXPECT_TRUE(PlanMemoryAlone(step, 0).ok());
  // A target of another shape than saved.
  LayoutTemplate other = Uniform(kFlatCeil, 4);
  other.tensors[1].global_shape = {12, 17};
  Job bad{job.saved, Layouts(other, 4), Ring(4, 1)};
  auto mb = PlanMemoryAlone(StepOf(bad), 1);
  ASSERT_FALSE(mb.ok());
  EXPECT_NE(mb.status().message().find("'w'"), std::string::npos) << mb.status().ToString();
  EXPECT_NE(mb.status().message().find("[12, 17]"), std::string::npos) << mb.status().ToString();
  EXPECT_FALSE(PlanMemoryAlone(step, 4).ok());  // not a rank of the job
}

}  // namespace
}  // namespace cairn
